"""Results of `check`: findings, the real vLLM load, the numeric comparison, and the summary the gate keeps."""

from __future__ import annotations

from typing import Any

from quantkit.results.base import Result
from quantkit.vocab import Severity


class Finding(Result):
    """One result of a check: what is wrong (or worth knowing) about which layer or tensor, and the fix."""

    severity: Severity
    code: str
    layer_or_tensor: str
    message: str
    fix: str = ""


class VllmLoad(Result):
    """The real vLLM load of `check`: status off | skipped | loaded | failed | timeout, and what was loaded."""

    status: str
    reason: str | None = None
    engine: str | None = None
    mode: str | None = None
    error: str | None = None
    seconds: float | None = None
    generated_token_ids: list[int] | None = None
    generated_text: str | None = None
    layers: dict[str, dict[str, Any]] | None = None


class NumericLayer(Result):
    relative_error: float | None = None
    bound: float | None = None
    precision: str | None = None


class LogitsAgreement(Result):
    method: str = ""
    positions: int = 0
    mean_cosine: float | None = None
    min_cosine: float | None = None
    top1_agreement: float | None = None
    error: str | None = None


class NumericResult(Result):
    """`check --numeric`: dequantized weights vs the source's, and logits agreement on built-in prompts."""

    source: str
    method: str = ""
    layers: dict[str, NumericLayer] = {}
    logits: LogitsAgreement | None = None


class CheckSummary(Result):
    """What the gate keeps of a check: counts, every finding, the real load."""

    errors: int
    warnings: int
    quantized_layers: int | None = None
    findings: list[Finding] = []
    vllm_load: VllmLoad | None = None


__all__ = ["CheckSummary", "Finding", "LogitsAgreement", "NumericLayer", "NumericResult", "VllmLoad"]
