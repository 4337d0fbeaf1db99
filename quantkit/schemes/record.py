"""The record every scheme of the registry is, and the errors of the registry: a leaf module, so that the registry
(quantkit.schemes) can import the scheme modules that import these."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from quantkit.errors import QuantkitError

# {suffix: (safetensors dtype, shape)} of one quantized weight; suffix "" is the weight, "_scale" its weight_scale.
Layout = dict[str, tuple[str, tuple[int, ...]]]


@dataclass(frozen=True)
class Scheme:
    """What one Quark 0.13 scheme stores, and how quantkit makes it: torchao's config type -> handler, as data.

    `static_activation_scales` means a calibrated input_scale per layer (so it needs calibration data and Quark's
    in-memory path). A scheme with `quantize` is native: quantkit's shard executor quantizes it itself, byte-identical
    to Quark's file-to-file path, through `layout`, `batching`, `bad_scale` and `quark_layer_config` alone (adding a
    native scheme is one record). The callables import torch when they run, so the registry imports none."""

    name: str  # Quark's scheme name (template.py QuantizationSchemeCollection)
    weights: str  # label, e.g. "MXFP4 (E8M0 scale per 32)"
    activations: str  # label, e.g. "MXFP4, dynamic"
    static_activation_scales: bool = False
    weight_dtype: str | None = None  # safetensors dtype of <m>.weight as Quark exports it (apply's verification)
    scale_dtype: str | None = None  # of <m>.weight_scale
    group_size: int | None = None  # elements per scale along the last dim (MXFP4: 32)
    layout: Callable[[tuple[int, ...]], Layout] | None = None  # what a weight of that shape is stored as
    quantize: Callable[..., tuple[Any, Any]] | None = None  # (weight, *, finite_only) -> (q, scale); None: Quark only
    quark_layer_config: Callable[[], dict[str, Any]] | None = None  # QLayerConfig.to_dict as Quark writes it
    # How the GPU path may stack tensors: "rows" (every row quantized on its own, any rank), "rows-2d" (so for 2-D
    # weights only: a per-output-channel scale), "whole" (one tensor per call).
    batching: Literal["rows", "rows-2d", "whole"] = "whole"
    bad_scale: Callable[[Any], Any] | None = None  # 0-dim bool tensor: some stored scale is not finite and positive

    @property
    def native(self) -> bool:
        """quantkit quantizes it without Quark."""
        return self.quantize is not None

    def output_bytes(self, shape: tuple[int, ...]) -> int | None:
        """Bytes a weight of `shape` takes in the output (weight + scale), from `layout`; None without one."""
        if self.layout is None:
            return None
        from quantkit.io.safetensors import tensor_nbytes

        return sum(tensor_nbytes(dtype, s) for dtype, s in self.layout(tuple(shape)).values())


class UnknownSchemeError(QuantkitError):
    """A scheme name the registry does not hold."""
