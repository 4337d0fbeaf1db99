"""vLLM backend for acceptance: target + EAGLE-3 draft in vLLM, per-request spec-decode counters."""

from quantkit.engines.platform import is_vllm_cpu  # house-move stub (issue 19): deleted at S3
from quantkit.engines.vllm_engine import (
    VllmRunError as VllmAcceptanceError,  # house-move stub (issue 19): deleted at S3
)
from quantkit.engines.vllm_engine import run_spec_decode as run_vllm  # house-move stub (issue 19): deleted at S3

__all__ = ["VllmAcceptanceError", "is_vllm_cpu", "run_vllm"]
