"""Pure-torch PTPC-FP8 weight quantizer that gives, byte for byte, what AMD Quark 0.13's file-to-file path
(`ModelQuantizer.direct_quantize_checkpoint`) writes. No Quark import.

Replayed from quark 0.13 (paths under site-packages/quark/torch/):

PTPC-FP8 (scheme `ptpc_fp8`, template.py `PTPCFP8Scheme`: FP8E4M3PerChannelSpec ch_axis 0, dynamic per-token input):
- observer.py `PerChannelMinMaxObserver` + `calculate_fp8_quant_parameters` + `get_scale("float32")`:
  amax per output channel (dim 0), scale = amax.float() / 448 in float32, a zero scale becomes float32 eps (2**-23).
- hw_emulation_interface.py `real_quantize_fp8_per_channel_with_scale`: the float32 scale is cast to the weight's
  dtype, w / scale is computed in the weight's dtype, clamped to +-448 and cast to float8_e4m3fn (-0.0 stays -0.0).
- Stored: weight float8_e4m3fn, same shape; weight_scale float32 [out].

No input scale is written: activations are quantized dynamically at run time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from quantkit.errors import NonFiniteWeightError

if TYPE_CHECKING:
    import torch

FP8_E4M3_MAX = 448.0


def quantize_ptpc_fp8(weight: torch.Tensor, *, finite_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel FP8 E4M3 as Quark 0.13 stores it: (float8_e4m3fn weight, float32 scale [out])."""
    import torch

    if weight.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"ptpc_fp8: weight dtype {weight.dtype} is not bf16, fp16 or fp32")
    if weight.dim() < 2:
        raise ValueError(f"ptpc_fp8: weight shape {tuple(weight.shape)} needs 2+ dims")
    amax = weight.reshape(weight.shape[0], -1).abs().amax(dim=1)
    if bool(torch.isnan(amax).any()):
        raise NonFiniteWeightError("ptpc_fp8: weight contains NaN")
    if finite_only and bool(torch.isinf(amax).any()):
        raise NonFiniteWeightError("ptpc_fp8: weight contains Inf")
    scale = amax.float() / 448  # get_scale("float32"): amax cast to float32 first, then divided
    scale = scale.masked_fill_(scale == 0.0, torch.finfo(torch.float32).eps)
    broadcast = scale.to(weight.dtype).view(-1, *([1] * (weight.dim() - 1)))
    q = torch.clamp(weight / broadcast, min=-FP8_E4M3_MAX, max=FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale


def ptpc_fp8_layout(shape: tuple[int, ...]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """What `quantize_ptpc_fp8` stores for a weight of `shape`: F8_E4M3 of the same shape, F32 scale [out]."""
    return {"": ("F8_E4M3", tuple(shape)), "_scale": ("F32", (shape[0],))}


def ptpc_fp8_bad_scale(scale: torch.Tensor) -> torch.Tensor:
    """A 0-dim bool tensor on the scale's device: some float32 scale is not finite and positive."""
    import torch

    return ~(torch.isfinite(scale) & (scale > 0)).all()
