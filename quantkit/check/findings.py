"""Findings and the check result: what `quantkit check` reports, and the constants its rules share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from quantkit.errors import QuantkitError
from quantkit.results import CheckSummary, Finding, NumericResult, VllmLoad
from quantkit.results.precision import LayerPrecision
from quantkit.vocab import PLATFORMS as PLATFORMS  # handed on: callers of the old home
from quantkit.vocab import SEVERITIES
from quantkit.vocab import VLLM_MODES as VLLM_MODES  # handed on: callers of the old home

FLOAT_DTYPES = {"BF16", "F16", "F32", "F64"}
QUANTIZED_DTYPES = {"F8_E4M3", "F8_E5M2", "F8_E8M0", "U8", "I8", "F4", "F6_E2M3", "F6_E3M2", "I32"}
# Dtypes vLLM's schemes take for the weight and the weight scale, per scheme family.
WEIGHT_DTYPES = {"fp8": {"F8_E4M3"}, "mxfp4": {"U8", "F4"}, "int8": {"I8"}}
SCALE_DTYPES = {"fp8": {"F32", "BF16", "F16"}, "mxfp4": {"U8", "F8_E8M0"}, "int8": {"F32", "BF16", "F16"}}
MXFP4_GROUP = 32
# Relative Frobenius error of a dequantized weight against its source above which --numeric reports an error.
NUMERIC_BOUNDS = {"fp8": 0.08, "mxfp4": 0.3}
DEFAULT_LOAD_TIMEOUT_S = 900

# Tensor parallelism per runtime layer kind (vllm/model_executor/layers/linear.py and the model files).
ROW_PARALLEL = {"o_proj", "down_proj", "w2", "out_proj"}
REPLICATED = {"fc", "gate", "fused_qkv_a_proj", "kv_a_proj_with_mqa", "q_a_proj", "shared_expert_gate"}


class CheckInputError(QuantkitError):
    """`check` was called with an option value it cannot use."""


@dataclass
class CheckResult:
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
        return CheckSummary(errors=len(self.errors), warnings=len(self.warnings),
                            quantized_layers=sum(1 for lp in self.layers if lp.quantized),
                            findings=list(self.findings), vllm_load=self.vllm_load)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path, "architecture": self.architecture, "model_kind": self.model_kind,
            "target": self.target, "target_num_layers": self.target_num_layers, "tp": self.tp,
            "platform": self.platform, "ok": self.ok,
            "summary": {s: sum(f.severity == s for f in self.findings) for s in SEVERITIES},
            "findings": [f.to_dict() for f in self.findings],
            "layers": [{k: v for k, v in layer.to_dict().items() if k != "checkpoint_modules"} for layer in self.layers],
            "vllm_load": self.vllm_load.to_dict(), "numeric": self.numeric.to_dict() if self.numeric else None,
            "seconds": round(self.seconds, 3),
        }  # fmt: skip


class Findings(list):
    def add(self, severity: str, code: str, where: str, message: str, fix: str = "") -> None:
        self.append(Finding(severity=severity, code=code, layer_or_tensor=where, message=message, fix=fix))


