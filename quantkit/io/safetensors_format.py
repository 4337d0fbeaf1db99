"""The safetensors header rules as safetensors' own loader enforces them: moved to quantkit.io.safetensors."""

from quantkit.io.safetensors import (  # house-move stub (issue 19): deleted at S3
    DTYPE_BITS,
    MAX_HEADER_BYTES,
    METADATA_KEY,
    REFETCH,
    HeaderEntry,
    ParsedHeader,
    header_length,
    parse_header,
    read_parsed_header,
)

__all__ = ["DTYPE_BITS", "MAX_HEADER_BYTES", "METADATA_KEY", "REFETCH", "HeaderEntry", "ParsedHeader", "header_length",
           "parse_header", "read_parsed_header"]
