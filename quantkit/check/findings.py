"""Findings and the check result: what `quantkit check` reports, and the constants its rules share."""

from quantkit.check.run import DEFAULT_LOAD_TIMEOUT_S, CheckInputError  # house-move stub (issue 19): deleted at S3  # noqa: F401
from quantkit.results.check import CheckResult, Finding  # house-move stub (issue 19): deleted at S3  # noqa: F401
from quantkit.rules.rule import Findings  # house-move stub (issue 19): deleted at S3  # noqa: F401
from quantkit.rules.tensors import (  # house-move stub (issue 19): deleted at S3  # noqa: F401
    FLOAT_DTYPES,
    MXFP4_GROUP,
    NUMERIC_BOUNDS,
    QUANTIZED_DTYPES,
    SCALE_DTYPES,
    WEIGHT_DTYPES,
)
from quantkit.rules.tp import REPLICATED, ROW_PARALLEL  # house-move stub (issue 19): deleted at S3  # noqa: F401
from quantkit.vocab import PLATFORMS, SEVERITIES, VLLM_MODES  # house-move stub (issue 19): deleted at S3  # noqa: F401
