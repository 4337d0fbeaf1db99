"""Streaming per-shard executor: moved to quantkit.apply.shards (pipeline, f2f, journal, memory, process, errors) and
quantkit.io.safetensors (the format: header reading, dtypes, the writer)."""

from quantkit.apply.shards import (  # house-move stub (issue 19): deleted at S3
    JOURNAL_NAME,
    CorruptShardError,
    ExecutorError,
    ExecutorReport,
    JournalError,
    NonFiniteWeightError,
    ShardEvent,
    ShardVerificationError,
    quantize_checkpoint,
)
from quantkit.apply.shards import ShardSummary as ShardRecord  # house-move stub (issue 19): deleted at S3
from quantkit.apply.shards.f2f import (  # house-move stub (issue 19): deleted at S3
    find_shards,
    is_linear_weight_name,
    model_dtype_name,
    module_of,
    scheme_for,
)
from quantkit.apply.shards.f2f import matcher as _matcher  # house-move stub (issue 19): deleted at S3
from quantkit.apply.shards.f2f import (
    read_shard_header as _read_header_file,  # house-move stub (issue 19): deleted at S3
)
from quantkit.apply.shards.journal import JOURNAL_VERSION  # house-move stub (issue 19): deleted at S3
from quantkit.io.safetensors import serialize_safetensors  # house-move stub (issue 19): deleted at S3

__all__ = ["JOURNAL_NAME", "JOURNAL_VERSION", "CorruptShardError", "ExecutorError", "ExecutorReport", "JournalError",
           "NonFiniteWeightError", "ShardEvent", "ShardRecord", "ShardVerificationError", "_matcher",
           "_read_header_file", "find_shards", "is_linear_weight_name", "model_dtype_name", "module_of",
           "quantize_checkpoint", "scheme_for", "serialize_safetensors"]
