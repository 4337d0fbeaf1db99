"""OCP MXFP4 arithmetic in plain torch (any device): weight dequantization and dynamic activation quantize-dequantize.

vLLM's own OCP-MX emulation calls Quark's compiled kernels for both (vllm/model_executor/layers/quantization/utils/
mxfp4_utils.py `_dequant_mxfp4` -> `quark.torch.kernel.mx.dq_mxfp4`, `_quant_dequant_mxfp4` ->
`quark.torch.kernel.mx.qdq_mxfp4`, scale_calculation_mode "even"); those exist only as CUDA/HIP sources
(quark/torch/kernel/hw_emulation/csrc/mxfp4/{dequantize_kernels,fake_kernels}.cuh), so on CPU they fail. This module
replicates the same math:

- dequantization: two E2M1 codes per byte, low nibble first; value = E2M1(code) * 2**(scale - 127) per block of 32
  along the last dimension (E8M0 scale 255 is NaN per the OCP MX spec);
- activation QDQ: per block of 32 along the last dimension, the block's max |x| is rounded "even" (add half an FP4
  mantissa step, keep sign+exponent: `(bits + 0x200000) & 0x7F800000` on float32 bits), the scale is
  2**clamp(floor(log2(rounded max)) - 2, -127, 127) (2 = E2M1's largest exponent), then x / scale is rounded to the
  nearest E2M1 value, ties to even, saturating at +-6, and multiplied back. Same as Quark's `even_round`
  (quark/torch/quantization/utils.py) and vLLM's Triton `_compute_quant_and_scale` (mxfp4_utils.py).

For bfloat16/float16 inputs every step is exact in float32 (power-of-two scales, 2-bit significands), so computing in
float32 gives the bits Quark's kernel gives in the input dtype.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

BLOCK = 32
# E2M1 magnitudes by 3-bit code (exp 2 bits, mantissa 1 bit; code 1 is the subnormal 0.5).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Midpoints between consecutive E2M1 magnitudes; a value exactly on one rounds to the neighbour with an even code.
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def _check_blocks(x: torch.Tensor, what: str) -> None:
    if x.shape[-1] % BLOCK:
        raise ValueError(f"{what}: last dimension {x.shape[-1]} is not a multiple of the MX block size {BLOCK}")


def dequant_mxfp4(packed: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Unpack uint8 MXFP4 `packed` [..., n/2] with uint8 E8M0 `scales` [..., n/32] into `dtype` [..., n]."""
    import torch

    if packed.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"dequant_mxfp4 expects uint8 weights and scales, got {packed.dtype} and {scales.dtype}")
    n = packed.shape[-1] * 2
    if tuple(scales.shape) != (*packed.shape[:-1], n // BLOCK) or n % BLOCK:
        raise ValueError(
            f"dequant_mxfp4: scales {tuple(scales.shape)} do not match packed weights "
            f"{tuple(packed.shape)} (expected {(*packed.shape[:-1], n // BLOCK)})"
        )
    table = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), dtype=torch.float32, device=packed.device)
    codes = torch.stack((packed & 0x0F, packed >> 4), dim=-1).flatten(-2)  # low nibble is the first element
    values = table[codes.long()].unflatten(-1, (n // BLOCK, BLOCK))
    scale = torch.exp2(scales.float() - 127.0)
    scale = torch.where(scales == 255, torch.full_like(scale, float("nan")), scale)
    return (values * scale.unsqueeze(-1)).flatten(-2).to(dtype)


def round_to_e2m1(q: torch.Tensor) -> torch.Tensor:
    """Round float32 `q` to the nearest E2M1 value (ties to even code, saturating at +-6), keeping NaN."""
    import torch

    magnitude = q.abs()
    mids = torch.tensor(_MIDPOINTS, dtype=q.dtype, device=q.device)
    values = torch.tensor(E2M1_VALUES, dtype=q.dtype, device=q.device)
    # bucketize(right=False): a value equal to a midpoint lands in the lower bucket; odd buckets (0.5, 1.5, 3.0) have
    # an odd mantissa bit, so on a tie there the even neighbour above wins.
    idx = torch.bucketize(magnitude, mids, right=False)
    on_mid = magnitude == mids[idx.clamp(max=len(_MIDPOINTS) - 1)]
    idx = idx + (on_mid & (idx % 2 == 1)).long()
    out = torch.copysign(values[idx.clamp(max=len(E2M1_VALUES) - 1)], q)
    return torch.where(torch.isnan(q), q, out)


def qdq_mxfp4(x: torch.Tensor) -> torch.Tensor:
    """Dynamic MXFP4 quantize-dequantize of `x` in blocks of 32 along the last dimension (Quark's "even" scale)."""
    import torch

    _check_blocks(x, "qdq_mxfp4")
    blocks = x.detach().to(torch.float32).reshape(-1, BLOCK)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    bits = (amax.view(torch.int32) + 0x200000) & 0x7F800000
    rounded = bits.view(torch.float32)
    # An all-zero block has no scale; any finite scale returns zeros, 2**-127 is what the clamp gives.
    exponent = torch.where(rounded > 0, torch.floor(torch.log2(rounded)) - 2.0, torch.full_like(rounded, -127.0))
    scale = torch.exp2(exponent.clamp(-127.0, 127.0))
    out = round_to_e2m1(blocks / scale) * scale
    return out.reshape(x.shape).to(x.dtype)
