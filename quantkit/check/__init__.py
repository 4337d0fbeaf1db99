"""`quantkit check` and `quantkit inspect`: what vLLM will load, before any GPU time is spent."""

from quantkit.check.findings import CheckResult, Finding
from quantkit.check.run import check_checkpoint

__all__ = ["CheckResult", "Finding", "check_checkpoint"]
