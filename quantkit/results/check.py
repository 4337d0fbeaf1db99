"""Results of `check` and `inspect`: findings, the real vLLM load, the numeric comparison, the summary the gate
keeps, and the two command results (CheckResult, InspectResult)."""

from __future__ import annotations

from typing import Any

from pydantic import SerializerFunctionWrapHandler, model_serializer

from quantkit.results.base import CommandResult, Result
from quantkit.results.cost import DraftCost
from quantkit.results.kernels import KernelReport
from quantkit.results.precision import LayerPrecision, PrecisionGroup
from quantkit.results.serve import SpecDecodeCounters
from quantkit.vocab import SEVERITIES, Severity


def _as_sentence(text: str) -> str:
    """`text` as a sentence: a capital first letter when its first word is a plain word (never a name such as
    `model.fc` or `unquantized_fused_moe`), and a full stop."""
    text = text.strip()
    if not text:
        return text
    first = text.split(" ", 1)[0]
    if first.isalpha() and first.islower():
        text = text[0].upper() + text[1:]
    return text if text[-1] in ".!?" else text + "."


class Finding(Result):
    """One result of a check or deploy rule: what is wrong (or worth knowing) about which layer or tensor, the fix,
    and the vLLM source of the rule that found it."""

    severity: Severity
    code: str
    layer_or_tensor: str
    message: str
    fix: str = ""
    # The rule's vLLM source (file and function, or PR). deploy's findings carry it; a finding without one (check's,
    # until its rules stamp theirs) is written without the key, so check's JSON keeps its shape.
    source: str = ""

    def sentence(self) -> str:
        """The finding as one line a person reads: `severity code at where: Message. Fix: fix. [source]`.

        The one wording of a finding outside --json (check, deploy, the model card): the message is a sentence and
        the fix its own sentence after it, never glued on."""
        line = f"{self.severity} {self.code} at {self.layer_or_tensor}: {_as_sentence(self.message)}"
        if self.fix:
            line += f" Fix: {_as_sentence(self.fix)}"
        return line + (f" [{self.source}]" if self.source else "")

    @model_serializer(mode="wrap")
    def _without_empty_source(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if not data.get("source"):
            data.pop("source", None)
        return data


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
    # A draft + target pair: vLLM's spec-decode counters over the generation (drafts proposed, tokens accepted)
    spec_decode: SpecDecodeCounters | None = None
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


class CheckResult(CommandResult):
    """Everything `check` found; `ok` when there is no error-severity finding."""

    path: str
    architecture: str
    model_kind: str
    target: str | None
    target_num_layers: int | None
    tp: int
    platform: str
    findings: list[Finding]
    layers: list[LayerPrecision]
    vllm_load: VllmLoad
    numeric: NumericResult | None = None
    seconds: float = 0.0
    vllm_version: str | None = None  # the vLLM the rules held for (--vllm-version)
    kernels: KernelReport | None = None  # the vLLM kernel path of every MoE / linear layer on `platform`
    draft_cost: DraftCost | None = None  # an EAGLE-3 draft: bytes a draft step reads by role (quantkit.rules.cost)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    @property
    def ok(self) -> bool:
        return not self.errors

    def codes(self, severity: str | None = None) -> set[tuple[str, str]]:
        """(code, layer_or_tensor) of every finding, or of those with `severity`."""
        return {(f.code, f.layer_or_tensor) for f in self.findings if severity is None or f.severity == severity}

    def summary(self) -> CheckSummary:
        """What a gate report keeps of this check."""
        return CheckSummary(
            errors=len(self.errors),
            warnings=len(self.warnings),
            quantized_layers=sum(1 for lp in self.layers if lp.quantized),
            findings=list(self.findings),
            vllm_load=self.vllm_load,
        )

    def to_dict(self) -> dict[str, Any]:
        # check's JSON as it has always been, with its schema_version first (every --json has one, plan 1.13): `ok`
        # and the severity counts, layers without their checkpoint modules, seconds rounded
        return {
            "schema_version": self.schema_version, "path": self.path, "architecture": self.architecture, "model_kind": self.model_kind,
            "target": self.target, "target_num_layers": self.target_num_layers, "tp": self.tp,
            "platform": self.platform, "ok": self.ok,
            "summary": {s: sum(f.severity == s for f in self.findings) for s in SEVERITIES},
            "findings": [f.to_dict() for f in self.findings],
            "layers": [{k: v for k, v in layer.to_dict().items() if k != "checkpoint_modules"} for layer in self.layers],
            "vllm_load": self.vllm_load.to_dict(), "numeric": self.numeric.to_dict() if self.numeric else None,
            "seconds": round(self.seconds, 3), "vllm_version": self.vllm_version,
            "kernels": self.kernels.to_dict() if self.kernels else None,
            "draft_cost": self.draft_cost.to_dict() if self.draft_cost else None,
        }  # fmt: skip


class InspectResult(CommandResult):
    """Every runtime layer of a checkpoint with its vLLM precision and why; grouped; sizes per precision."""

    path: str
    architecture: str
    model_kind: str
    target_num_layers: int | None
    quantization: dict[str, Any] | None  # quant_method, exclude and the keys present
    layers: list[LayerPrecision]
    groups: list[PrecisionGroup]
    bytes_by_precision: dict[str, int]
    other_bytes: int  # tensors outside any layer (norms, d2t/t2d, biases of non-linears, ...)
    total_bytes: int
    num_tensors: int
    config_problems: list[str]
    seconds: float = 0.0
    source_format: str = ""  # how the weights are stored, for a source checkpoint (quantkit.io.formats)
    kernels: KernelReport | None = None  # with --platform: the vLLM kernel path of every MoE / linear layer
    draft_cost: DraftCost | None = None  # an EAGLE-3 draft: bytes a draft step reads by role (quantkit.rules.cost)

    def to_dict(self) -> dict[str, Any]:
        # inspect's JSON as it has always been, with its schema_version first (every --json has one, plan 1.13)
        return {
            "schema_version": self.schema_version, "path": self.path, "architecture": self.architecture, "model_kind": self.model_kind,
            "target_num_layers": self.target_num_layers, "quantization": self.quantization,
            "groups": [g.to_dict() for g in self.groups], "layers": [layer.to_dict() for layer in self.layers],
            "bytes_by_precision": self.bytes_by_precision, "other_bytes": self.other_bytes,
            "total_bytes": self.total_bytes, "num_tensors": self.num_tensors, "config_problems": self.config_problems,
            "source_format": self.source_format,
            "seconds": round(self.seconds, 3), "kernels": self.kernels.to_dict() if self.kernels else None,
            "draft_cost": self.draft_cost.to_dict() if self.draft_cost else None,
        }  # fmt: skip


__all__ = [
    "CheckResult",
    "CheckSummary",
    "Finding",
    "InspectResult",
    "LogitsAgreement",
    "NumericLayer",
    "NumericResult",
    "VllmLoad",
]
