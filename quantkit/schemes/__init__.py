"""The scheme registry: what each Quark 0.13 scheme stores (quark.py), and the native quantizers that give Quark's
file-to-file bytes without importing Quark (mxfp4.py, ptpc_fp8.py) with the config.json they write
(quark_config.py). No torch at import: the quantizers import it when they run."""

from __future__ import annotations

from typing import TYPE_CHECKING

from quantkit.schemes.mxfp4 import MXFP4_GROUP, quantize_mxfp4
from quantkit.schemes.ptpc_fp8 import quantize_ptpc_fp8
from quantkit.schemes.quark import QUARK_SCHEME_ALIASES as ALIASES
from quantkit.schemes.quark import QUARK_SCHEMES as SCHEMES
from quantkit.schemes.record import NonFiniteWeight, Scheme

if TYPE_CHECKING:
    import torch

__all__ = ["ALIASES", "SCHEMES", "NonFiniteWeight", "Scheme", "expected_layout", "native_schemes", "quantize_weight"]

# The schemes the native executor quantizes itself (byte-identical to Quark's file-to-file path); the rest need Quark.
_NATIVE = ("mxfp4", "ptpc_fp8")


def native_schemes() -> tuple[str, ...]:
    """The schemes quantkit quantizes without Quark."""
    return _NATIVE


def quantize_weight(weight: torch.Tensor, scheme: str, *, finite_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(quantized weight, weight_scale) for `scheme` exactly as Quark 0.13's file-to-file path stores them.

    finite_only=True refuses Inf as well as NaN (found from the per-group/per-channel amax, at no extra pass);
    otherwise Inf is quantized as Quark does it.
    """
    if scheme == "mxfp4":
        return quantize_mxfp4(weight, finite_only=finite_only)
    if scheme == "ptpc_fp8":
        return quantize_ptpc_fp8(weight, finite_only=finite_only)
    raise ValueError(f"scheme {scheme!r}: the native quantizer supports {', '.join(_NATIVE)}")


def expected_layout(shape: tuple[int, ...], scheme: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """What a quantized weight of `shape` is stored as: {suffix: (safetensors dtype, shape)}, suffix "" = weight."""
    if scheme == "mxfp4":
        rows = 1
        for d in shape[:-1]:
            rows *= d
        return {"": ("U8", (*shape[:-1], shape[-1] // 2)),
                "_scale": ("U8", (rows, -(-shape[-1] // MXFP4_GROUP)))}
    if scheme == "ptpc_fp8":
        return {"": ("F8_E4M3", tuple(shape)), "_scale": ("F32", (shape[0],))}
    raise ValueError(f"scheme {scheme!r}: the native quantizer supports {', '.join(_NATIVE)}")
