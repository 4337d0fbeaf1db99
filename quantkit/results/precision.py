"""Results of precision resolution: what vLLM will run each layer as, which rule decided it, and the layers grouped
by decoder-layer number (quantkit.naming.precision fills them)."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field

from quantkit.results.base import Result


class ResolvedScheme(Result):
    """What a matched Quark config entry makes vLLM build for a layer."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)

    precision: str  # "FP8 per-channel (ptpc)", "FP8 per-tensor", "MXFP4", ... (the inspect label)
    family: str  # "fp8" | "mxfp4" | "mx" | "int8" | "int4" | "nvfp4" | "other"
    weight_qscheme: str | None = None
    activations: str = ""
    static_input: bool = False  # the checkpoint needs an input_scale per module
    block_size: tuple[int, ...] | None = None
    problem: str | None = None  # vLLM raises while building the layer (NotImplementedError / ValueError)


class LayerPrecision(Result):
    """One runtime layer: the precision vLLM gives it and which rule decided it.

    `source` is one of: "exclude", "layer_quant_config", "global_quant_config", "never_quantized" (vLLM gives this
    kind of layer no Quark method), "no_quantization_config", "not_quark" (a quantization_config of another method:
    not replayed), and where vLLM refuses to load: "partial_fused_exclusion", "fused_config_mismatch",
    "unsupported_scheme", "invalid_exclude". (layer_type_quant_config never decides: vLLM 0.32 looks it up by the
    module's class, which no JSON key equals.)"""

    name: str
    kind: str
    role: str
    precision: str
    quantized: bool
    source: str
    reason: str
    entry: str | None = None  # the exclude entries / layer_quant_config key that decided it
    activations: str = ""
    checkpoint_modules: list[str] = Field(default_factory=list)
    shards: list[str] = Field(default_factory=list)
    experts: int | None = None
    bytes: int = 0
    layer_index: int | None = Field(default=None, exclude=True)
    problem: str | None = None
    scheme: ResolvedScheme | None = Field(default=None, exclude=True)
    exclude_rule: str | None = None

    def to_dict(self) -> dict[str, Any]:
        # the fields as they are (no JSON mode): callers compare and extend this dict as today's dataclass gave it
        return self.model_dump()


class PrecisionGroup(Result):
    """Layers that differ only in their decoder-layer number: `model.layers.{0-59}.mlp.experts` x60."""

    pattern: str
    count: int
    precision: str
    source: str
    reason: str
    bytes: int
    experts: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()


__all__ = ["LayerPrecision", "PrecisionGroup", "ResolvedScheme"]
