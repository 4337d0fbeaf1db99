"""Release checks in the style of ModelOpt's deployment checks: the output's size against its source, tokenizer
drift between them, and one verdict over every check of a release."""

from quantkit.gate.release import (  # house-move stub (issue 19): deleted at S3  # noqa: F401
    TOKENIZER_FILES,
    ReleaseCheckError,
    first_json_difference,
    safetensors_bytes,
    size_ratio,
    size_ratio_check,
    tokenizer_drift,
    tokenizer_drift_check,
    tokenizer_files,
)
from quantkit.gate.verdict import (  # house-move stub (issue 19): deleted at S3  # noqa: F401
    Judgement,
    Verdict,
    acceptance_ratio_check,
    judge,
)
