"""`quantkit check` and `quantkit inspect`: what vLLM will load, before any GPU time is spent."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from quantkit.check.run import run as check_checkpoint
    from quantkit.results.check import CheckResult, Finding

__all__ = ["CheckResult", "Finding", "check_checkpoint"]


def __getattr__(name: str) -> Any:
    # Handed on when first asked for, not at import: quantkit.results imports quantkit.check.inspect (the layer
    # precision types), so importing check.run (which imports results) here would make a circle.
    if name == "check_checkpoint":  # quantkit.check.run.run (issue 19): the old name, until S3
        from quantkit.check.run import run

        return run
    if name in ("CheckResult", "Finding"):
        from quantkit.results import check as results_check

        return getattr(results_check, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
