"""Pure-torch MXFP4 weight quantizer that gives, byte for byte, what AMD Quark 0.13's file-to-file path
(`ModelQuantizer.direct_quantize_checkpoint`) writes. No Quark import (`import quark.torch` costs 20-30 s).

Every rule below is replayed from quark 0.13 (paths under site-packages/quark/torch/):

MXFP4 (scheme `mxfp4`, template.py `MXFP4Scheme`: OCP_MXFP4Spec, group 32 along the last dim, E8M0 scale,
scale_calculation_mode "even"), as run by file2file_quantization.py `_single_stage_quantize_weight`:
- quantization/observer/observer.py `PerBlockMXObserver.forward`: amax of |w| per group of 32, in the weight's dtype
  (the tensor is zero-padded to a multiple of 32 by quantization/utils.py `reshape_to_blocks`).
- quantization/utils.py `even_round`: amax as float32 bits + 2**21, masked to sign+exponent (so the mantissa rounds
  up from 1.75), then scale = 2 ** clamp(floor(log2(.)) - 2, -127, 127); a zero group gives 2**-127, an Inf amax 2**127.
- kernel/hw_emulation/hw_emulation_interface.py `real_quantize_fp4_fp6_per_group`: y = w.float() / scale, then
  kernel/hw_emulation/csrc/mx/funcs.cuh `fake_quantize_element`: round half to even onto the E2M1 grid
  {0, .5, 1, 1.5, 2, 3, 4, 6}, saturate at 6, a result of zero is +0 (so -0.0 and tiny negatives give +0),
  Inf passes through unchanged.
- utils/pack.py `Pack_fp4.pack`: (y / 2**126) viewed as int32 -> 3 magnitude bits + sign bit; two codes per byte,
  the even index in the low nibble. An Inf element therefore packs as code 6 (4.0), not 7.
- utils/numerics.py `to_e8m0_uint8`: round(log2(max(scale, 2**-126))) + 127, so a scale of 2**-127 is stored as
  byte 1 although the elements were divided by 2**-127.
- Stored: weight uint8 [..., in/2]; weight_scale uint8 [prod(shape[:-1]), ceil(in/32)] (2-D even for a 3-D weight).

No input scale is written: activations are quantized dynamically at run time.
"""

from __future__ import annotations

import functools
import threading
from typing import TYPE_CHECKING

from quantkit.errors import NonFiniteWeightError

if TYPE_CHECKING:
    import torch

MXFP4_GROUP = 32
# Elements handled per step by the MXFP4 kernel on CPU: the step's int32 temporaries (~1 MiB) stay in L2. On a GPU
# steps only bound the temporaries' memory.
_MXFP4_STEP_ELEMENTS = 1 << 18
_MXFP4_GPU_STEP_ELEMENTS = 1 << 26


@functools.lru_cache(maxsize=8)
def _mxfp4_tables(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Boundaries for torch.bucketize that reproduce `fake_quantize_element`'s round-half-to-even on the E2M1 grid,
    and the table from bucket index to the 4-bit code (sign << 3 | magnitude index).

    A magnitude crosses threshold t to the next grid point when |y| > t for thresholds whose tie rounds down
    (0.25, 1.25, 2.5, 5: the lower neighbour is even) and when |y| >= t where the tie rounds up (0.75, 1.75, 3.5).
    bucketize counts boundaries strictly below y, so `>= t` becomes `> nextafter(t, -inf)` on the positive side and
    the negative side mirrors it. Bucket 7 holds every y that rounds to zero, of either sign: Quark writes +0.
    """
    import torch

    f32 = torch.float32
    neg_inf, pos_inf = torch.tensor(float("-inf"), dtype=f32), torch.tensor(float("inf"), dtype=f32)
    thresholds = [(0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False)]
    pos = []
    neg = []
    for t, tie_up in thresholds:
        tt = torch.tensor(t, dtype=f32)
        pos.append(torch.nextafter(tt, neg_inf) if tie_up else tt)
        neg.append(-tt if tie_up else -torch.nextafter(tt, pos_inf))
    boundaries = torch.stack(list(reversed(neg)) + pos).to(device)
    lut = torch.tensor([8 | (7 - i) for i in range(7)] + [0] + list(range(1, 8)), dtype=torch.uint8, device=device)
    return boundaries, lut


# The bf16 fast path indexes a table with (bf16 bits of w) - 128 * e + _BF16_INDEX_BIAS: for a positive w that is the
# bf16 bit pattern of |y| = |w| / 2**e, for a negative one the same minus 32768, so one gather gives sign and
# magnitude code together. It is exact while w is normal or its group's e > -124 (a subnormal w only matters when
# e <= -124) and e < 127 (then the sign and magnitude ranges cannot overlap); other groups take the exact path.
_BF16_INDEX_BIAS = 49152
_BF16_TABLE_SIZE = _BF16_INDEX_BIAS + 130 * 128  # up to |y| < 8 (exponent 129), the largest a finite group gives
_BF16_FAST_MIN_EXPONENT = -123


@functools.lru_cache(maxsize=8)
def _mxfp4_bf16_table(device: str) -> torch.Tensor:
    """Code (sign << 3 | magnitude) for every index of the bf16 fast path, computed with the exact rule above."""
    import torch

    index = torch.arange(_BF16_TABLE_SIZE, dtype=torch.int32) - _BF16_INDEX_BIAS
    negative = index < -126 * 128
    bits = torch.where(negative, index + 32768, index)  # bf16 bits of |y|; <= 0 means below the smallest normal
    magnitude = torch.where(bits > 0, bits, 0).to(torch.int16).view(torch.bfloat16).float()
    y = torch.where(negative, -magnitude, magnitude)
    boundaries, lut = _mxfp4_tables("cpu")
    return lut[torch.bucketize(y, boundaries)].to(device)


class _Workspace:
    """Reusable per-thread buffers for the CPU bf16 path: fresh multi-MiB allocations page-fault on every step."""

    def __init__(self, n: int) -> None:
        import torch

        self.n = n
        self.magnitude = torch.empty(n, dtype=torch.int32)
        self.index = torch.empty(n, dtype=torch.int32)
        self.codes = torch.empty(n, dtype=torch.uint8)


_workspaces = threading.local()


def quantize_mxfp4(weight: torch.Tensor, *, finite_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """OCP MXFP4 as Quark 0.13 stores it: (uint8 [..., in/2] low nibble first, uint8 E8M0 [rows, ceil(in/32)]).

    Runs on the weight's device. On CPU it works in steps of a few hundred KiB that stay in cache, with torch's
    intra-op threads as they are set (the executor runs one tensor per thread with 1 intra-op thread each).
    Raises ValueError for a NaN (Quark's result then depends on undefined float-to-int casts), a non-float dtype
    or an odd last dimension (Quark cannot pack it).
    """
    import torch

    if weight.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"mxfp4: weight dtype {weight.dtype} is not bf16, fp16 or fp32")
    if weight.dim() < 2 or weight.shape[-1] % 2:
        raise ValueError(f"mxfp4: weight shape {tuple(weight.shape)} needs 2+ dims and an even last dimension")
    shape = tuple(weight.shape)
    cols = shape[-1]
    x = weight.reshape(-1, cols)
    rows = x.shape[0]
    groups = -(-cols // MXFP4_GROUP)
    if groups * MXFP4_GROUP != cols:  # reshape_to_blocks pads with zeros, which never raise a group's amax
        x = torch.nn.functional.pad(x, (0, groups * MXFP4_GROUP - cols))
    x = x.contiguous()
    packed = torch.empty(rows, groups * MXFP4_GROUP // 2, dtype=torch.uint8, device=x.device)
    scale = torch.empty(rows, groups, dtype=torch.uint8, device=x.device)
    row_elements = groups * MXFP4_GROUP
    step_elements = _MXFP4_STEP_ELEMENTS if x.device.type == "cpu" else _MXFP4_GPU_STEP_ELEMENTS
    step = max(1, step_elements // row_elements)
    workspace = None
    if x.dtype == torch.bfloat16 and x.device.type == "cpu":
        workspace = getattr(_workspaces, "cpu", None)
        if workspace is None or workspace.n < step * row_elements:
            workspace = _Workspace(max(step * row_elements, _MXFP4_STEP_ELEMENTS))
            _workspaces.cpu = workspace
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        if x.dtype == torch.bfloat16:
            _mxfp4_rows_bf16(x[r0:r1], packed[r0:r1], scale[r0:r1], workspace, finite_only)
        else:
            _mxfp4_rows_exact(x[r0:r1], packed[r0:r1], scale[r0:r1], finite_only)
    if packed.shape[1] != cols // 2:
        packed = packed[:, : cols // 2].contiguous()
    return packed.reshape(*shape[:-1], cols // 2), scale


def _group_exponents(amax_f32_bits: torch.Tensor) -> torch.Tensor:
    """even_round's exponent e (scale = 2**e) from each group's amax as float32 bits (int32, amax >= 0, no NaN)."""
    import torch

    biased = (amax_f32_bits + (1 << 21)) >> 23  # adding 2**21 carries a mantissa >= 1.75 into the exponent
    return torch.where(biased >= 255, 127, (biased - 129).clamp_(min=-127))  # 0 -> log2(0) = -inf -> -127


def _e8m0_bytes(exponent: torch.Tensor) -> torch.Tensor:
    """to_e8m0_uint8(2**e): log2 is taken of max(scale, 2**-126), so e = -127 is stored as 1."""
    import torch

    return (exponent.clamp(min=-126) + 127).to(torch.uint8)


def _mxfp4_rows_bf16(
    x: torch.Tensor, packed_out: torch.Tensor, scale_out: torch.Tensor, workspace: _Workspace | None, finite_only: bool
) -> None:
    import torch

    rows, cols = x.shape
    n = rows * cols
    bits = x.view(torch.int16).view(-1, MXFP4_GROUP)
    if workspace is None:
        magnitude = torch.empty(n, dtype=torch.int32, device=x.device)
        index = torch.empty(n, dtype=torch.int32, device=x.device)
        codes = torch.empty(n, dtype=torch.uint8, device=x.device)
    else:
        magnitude, index, codes = workspace.magnitude[:n], workspace.index[:n], workspace.codes[:n]
    torch.bitwise_and(bits, 0x7FFF, out=magnitude.view(-1, MXFP4_GROUP))  # int32: its reductions vectorize
    amax = magnitude.view(-1, MXFP4_GROUP).amax(dim=-1)  # bf16 bits of max |w|; bits order like values
    if bool((amax >= (0x7F80 if finite_only else 0x7F81)).any()):  # 0x7F80 is Inf, above it NaN
        kind = "NaN" if bool((amax > 0x7F80).any()) else "Inf"
        raise NonFiniteWeightError(f"mxfp4: weight contains {kind}")
    exponent = _group_exponents(amax << 16)
    fast = (amax == 0) | ((exponent >= _BF16_FAST_MIN_EXPONENT) & (exponent < 127))
    if not bool(fast.all()):
        _mxfp4_rows_exact(x, packed_out, scale_out, finite_only)
        return
    scale_out.view(-1).copy_(_e8m0_bytes(exponent))
    # A zero group (e = -127) gets offset 0: its +-0 elements then index |y| = 0 -> code 0.
    offset = torch.where(amax == 0, 0, exponent * 128) - _BF16_INDEX_BIAS
    torch.sub(bits, offset.to(torch.int32).unsqueeze(-1), out=index.view(-1, MXFP4_GROUP))
    torch.index_select(_mxfp4_bf16_table(str(x.device)), 0, index, out=codes)
    pairs = codes.view(torch.int16)  # (even code) | (odd code) << 8, little endian
    packed_out.view(-1).copy_(torch.bitwise_or(pairs, pairs >> 4))  # low byte: even | odd << 4


def _mxfp4_rows_exact(x: torch.Tensor, packed_out: torch.Tensor, scale_out: torch.Tensor, finite_only: bool) -> None:
    """Any float dtype, any group: y = w.float() * 2**-e, then the E2M1 rounding by bucketize (slower)."""
    import torch

    rows = x.shape[0]
    xv = x.reshape(rows, -1, MXFP4_GROUP)
    amax = xv.abs().amax(dim=-1)  # in the weight's dtype, as PerBlockMXObserver
    if bool(torch.isnan(amax).any()):
        raise NonFiniteWeightError("mxfp4: weight contains NaN")
    if finite_only and bool(torch.isinf(amax).any()):
        raise NonFiniteWeightError("mxfp4: weight contains Inf")
    exponent = _group_exponents(amax.float().view(torch.int32))
    scale_out.copy_(_e8m0_bytes(exponent))
    # 1 / 2**e, exactly: x * 2**-e and x / 2**e are the same correctly rounded number.
    inverse = torch.where(
        exponent == 127, torch.tensor(2.0**-127, device=x.device), ((127 - exponent) << 23).view(torch.float32)
    )
    y = xv * inverse.unsqueeze(-1)  # float32 (type promotion), as `input_tensor.to(float32) / scale`
    boundaries, lut = _mxfp4_tables(str(x.device))
    codes = lut[torch.bucketize(y, boundaries, out_int32=True).long()]
    if bool(torch.isinf(amax).any()):  # fake_quantize_element passes Inf through; Pack_fp4 turns it into code 6
        codes = torch.where(torch.isinf(y), torch.where(y > 0, 6, 14).to(torch.uint8), codes)
    pairs = codes.view(rows, -1, 2)
    torch.bitwise_or(pairs[..., 0], pairs[..., 1] << 4, out=packed_out.view(rows, -1))


def mxfp4_layout(shape: tuple[int, ...]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """What `quantize_mxfp4` stores for a weight of `shape`: U8 [..., in/2] and a 2-D U8 scale [rows, ceil(in/32)]."""
    rows = 1
    for d in shape[:-1]:
        rows *= d
    return {"": ("U8", (*shape[:-1], shape[-1] // 2)), "_scale": ("U8", (rows, -(-shape[-1] // MXFP4_GROUP)))}


def mxfp4_bad_scale(scale: torch.Tensor) -> torch.Tensor:
    """A 0-dim bool tensor on the scale's device: some E8M0 scale is 0xFF (NaN)."""
    return (scale == 0xFF).any()
