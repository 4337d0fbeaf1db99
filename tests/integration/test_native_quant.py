"""quantkit.schemes (the native quantizers) against Quark 0.13's own file-to-file quantizer, byte for byte, on edge-case tensors.

The reference is `_single_stage_quantize_weight` from quark/torch/quantization/file2file_quantization.py, the function
`direct_quantize_checkpoint` runs per weight, with the scheme's own QLayerConfig (LLMTemplate's MXFP4Scheme /
PTPCFP8Scheme); its config dict is compared with `LLMTemplate.get_config(...)` as `_export_quant_config` writes it.
"""

from __future__ import annotations

import json

import pytest
import torch

from quantkit.errors import NonFiniteWeightError
from quantkit.schemes import expected_layout, quantize_weight
from quantkit.schemes.mxfp4 import quantize_mxfp4
from quantkit.schemes.ptpc_fp8 import quantize_ptpc_fp8
from quantkit.schemes.quark_config import quark_quantization_config

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
ST_DTYPE = {torch.uint8: "U8", torch.float8_e4m3fn: "F8_E4M3", torch.float32: "F32"}


def _bytes_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
    )


def _assert_same(quark_f2f, w: torch.Tensor, scheme: str) -> None:
    ref_w, ref_s = quark_f2f.weight(w, scheme)
    got_w, got_s = quantize_weight(w, scheme)
    assert _bytes_equal(got_s, ref_s), (scheme, w.dtype, "scale", (got_s != ref_s).nonzero()[:5])
    if not _bytes_equal(got_w, ref_w):
        bad = (got_w.view(torch.uint8) != ref_w.view(torch.uint8)).nonzero()[:5].tolist()
        raise AssertionError(f"{scheme} {w.dtype}: weight bytes differ at {bad}")
    layout = expected_layout(tuple(w.shape), scheme)
    assert (ST_DTYPE[got_w.dtype], tuple(got_w.shape)) == layout[""]
    assert (ST_DTYPE[got_s.dtype], tuple(got_s.shape)) == layout["_scale"]


def _grid_ties(dtype: torch.dtype) -> torch.Tensor:
    """Groups whose scale is 2**e (anchor 6 * 2**e) holding every E2M1 rounding threshold times 2**e, its two
    neighbours in `dtype`, grid points and their negatives, for every e the dtype can represent."""
    info = torch.finfo(dtype)
    lo = int(torch.log2(torch.tensor(info.smallest_normal)).item()) - 3
    hi = int(torch.log2(torch.tensor(info.max)).item()) - 3
    rows = []
    ys = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.5, 6.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0]
    for e in range(lo, hi + 1):
        anchor = torch.tensor(6.0 * 2.0**e, dtype=dtype)
        vals = []
        for y in ys:
            t = torch.tensor(y * 2.0**e, dtype=dtype)
            vals += [
                t,
                torch.nextafter(t, torch.tensor(0.0, dtype=dtype)),
                torch.nextafter(t, torch.tensor(float("inf"), dtype=dtype)),
            ]
        row = torch.stack([anchor] + vals[:31]).to(dtype)
        rows.append(row)
        rows.append(-row)
        rest = torch.stack(vals[31:] + [anchor] * (32 - len(vals[31:]))).to(dtype)
        rows.append(torch.where(torch.arange(32) % 2 == 0, rest, -rest))
    return torch.stack(rows)


@pytest.mark.parametrize("dtype", DTYPES)
def test_mxfp4_rounding_ties_every_scale(quark_f2f, dtype):
    _assert_same(quark_f2f, _grid_ties(dtype), "mxfp4")


def test_mxfp4_bf16_fast_path_every_value_every_scale(quark_f2f, monkeypatch):
    """The bf16 table path (no float math) against Quark for every bf16 magnitude that can round to a non-zero code,
    both signs, under every scale exponent the path handles; the exact fallback is disabled to prove it ran."""
    from quantkit.schemes import mxfp4

    def no_fallback(*_args):
        raise AssertionError("the bf16 fast path fell back to the exact path")

    monkeypatch.setattr(mxfp4, "_mxfp4_rows_exact", no_fallback)
    mantissas = torch.arange(128, dtype=torch.float64) / 128 + 1
    rows = []
    for e in range(-123, 126):
        anchor = 6.0 * 2.0**e
        mags = torch.cat([mantissas * 2.0**k for k in range(e - 4, e + 3)] + [torch.tensor([0.0, anchor])])
        vals = torch.cat([mags, -mags]).to(torch.bfloat16)
        vals = vals[vals.float().abs() <= anchor]
        vals = torch.cat([vals, torch.zeros((-vals.numel()) % 62, dtype=torch.bfloat16)]).reshape(-1, 31)
        groups = torch.cat([torch.full((vals.shape[0], 1), anchor, dtype=torch.bfloat16), vals], dim=1)
        rows.append(groups.reshape(-1, 64))
    w = torch.cat(rows)
    assert w.numel() > 400_000
    ref_w, ref_s = quark_f2f.weight(w, "mxfp4")
    got_w, got_s = quantize_mxfp4(w)
    assert _bytes_equal(got_s, ref_s)
    assert _bytes_equal(got_w, ref_w), (got_w != ref_w).nonzero()[:5].tolist()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scheme", ["mxfp4", "ptpc_fp8"])
def test_random_tensors_across_magnitudes(quark_f2f, dtype, scheme):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(96, 512, generator=g) * torch.logspace(-30, 30, 96)[:, None]
    w = w.clamp(-torch.finfo(dtype).max, torch.finfo(dtype).max).to(dtype)
    _assert_same(quark_f2f, w, scheme)


def test_every_bf16_bit_pattern(quark_f2f):
    """All 65 280 finite bf16 values, shuffled into groups (so each meets many scales), both schemes."""
    bits = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    values = bits.view(torch.bfloat16)
    values = values[torch.isfinite(values)]
    g = torch.Generator().manual_seed(2)
    values = values[torch.randperm(values.numel(), generator=g)]
    values = values[: values.numel() // 256 * 256].reshape(-1, 256)
    for scheme in ("mxfp4", "ptpc_fp8"):
        _assert_same(quark_f2f, values, scheme)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scheme", ["mxfp4", "ptpc_fp8"])
def test_zero_negative_zero_subnormal_and_huge_groups(quark_f2f, dtype, scheme):
    info = torch.finfo(dtype)
    w = torch.zeros(10, 64, dtype=dtype)
    w[1] = -0.0  # all -0.0: Quark writes +0 codes
    w[2, ::3] = -0.0
    w[2, 1::3] = info.smallest_normal / 4  # subnormals in a group with a normal max
    w[2, 7] = 1.0
    w[3] = info.smallest_normal / 8  # a group made only of subnormals
    w[3, ::2] *= -1
    w[4] = info.max  # amax at the top of the range: scale 2**127 (bf16/fp32) or 2**13 (fp16)
    w[4, 1::2] = -info.max / 3
    w[5] = info.smallest_normal  # tiny normals: scale 2**-127, stored as E8M0 byte 1
    w[6, :32] = torch.linspace(-1, 1, 32, dtype=dtype)
    w[6, 32:] = 1e-3
    w[7] = info.max / 1.6  # amax just below the 1.75 round-up point
    w[8] = -(info.max / 1.8)
    w[9, 0] = info.tiny  # one tiny value among zeros
    _assert_same(quark_f2f, w, scheme)


@pytest.mark.parametrize("dtype", DTYPES)
def test_mxfp4_infinity_matches_quark(quark_f2f, dtype):
    """Quark lets Inf through its E2M1 rounding and packs it as code 6 (4.0), with scale 2**127."""
    w = torch.randn(4, 64).to(dtype)
    w[0, 3] = float("inf")
    w[1, 40] = float("-inf")
    w[2, :32] = float("inf")
    _assert_same(quark_f2f, w, "mxfp4")


@pytest.mark.parametrize("shape", [(8, 48), (4, 3, 64), (2, 2, 2, 96), (1, 32), (33, 34)])
@pytest.mark.parametrize("scheme", ["mxfp4", "ptpc_fp8"])
def test_shapes_padding_and_3d(quark_f2f, shape, scheme):
    """Columns not a multiple of 32 (Quark zero-pads the last group), 3-D/4-D weights (one scale row per row of the
    flattened leading dims for MXFP4, one per index of dim 0 for PTPC)."""
    w = torch.randn(*shape, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    _assert_same(quark_f2f, w, scheme)


def test_large_tensor_crosses_step_boundaries(quark_f2f):
    """More rows than one kernel step handles, with an uneven last step."""
    w = torch.randn(1031, 2048, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    _assert_same(quark_f2f, w, "mxfp4")


def test_nan_and_bad_shapes_are_refused():
    w = torch.randn(4, 64, dtype=torch.bfloat16)
    w[1, 2] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        quantize_mxfp4(w)
    with pytest.raises(ValueError, match="NaN"):
        quantize_ptpc_fp8(w)
    with pytest.raises(ValueError, match="even"):
        quantize_mxfp4(torch.randn(4, 33))
    with pytest.raises(ValueError, match="dtype"):
        quantize_mxfp4(torch.randn(4, 32, dtype=torch.float64))
    with pytest.raises(ValueError, match="scheme"):
        quantize_weight(w, "fp8")


@pytest.mark.parametrize("dtype", DTYPES)
def test_finite_only_refuses_inf_that_quark_would_quantize(dtype):
    w = torch.randn(4, 64).to(dtype)
    w[2, 3] = float("-inf")
    quantize_mxfp4(w)
    quantize_ptpc_fp8(w)
    for fn in (quantize_mxfp4, quantize_ptpc_fp8):
        with pytest.raises(NonFiniteWeightError, match="Inf"):
            fn(w, finite_only=True)


@pytest.mark.parametrize(
    "scheme,layer_config",
    [
        ("mxfp4", None),
        ("mxfp4", {"*self_attn*": "ptpc_fp8", "model.layers.0.mlp.experts.0.up_proj": "mxfp4"}),
        ("ptpc_fp8", None),
        ("ptpc_fp8", {"*.down_proj": "mxfp4"}),
    ],
)
def test_quantization_config_matches_quark(quark_f2f, scheme, layer_config):
    """Same dict, same key order, as `_export_quant_config` builds from LLMTemplate.get_config (whose exclude is
    then replaced by the sorted resolved names)."""
    from quark.torch import LLMTemplate

    exclude = ["lm_head", "model.layers.0.mlp.gate", "model.layers.1.mlp.gate"]
    for template in ("qwen3_moe", "deepseek_v3", "llama", "minimax_m2", "mixtral"):
        cfg = LLMTemplate.get(template).get_config(
            scheme=scheme, exclude_layers=["*.mlp.gate", "lm_head"], layer_config=layer_config
        )
        want = cfg.to_dict()
        want["export"] = {
            "kv_cache_group": [],
            "min_kv_scale": 0.0,
            "pack_method": "reorder",
            "weight_format": "real_quantized",
            "weight_merge_groups": None,
        }
        want["exclude"] = sorted(exclude)
        got = quark_quantization_config(scheme, list(reversed(exclude)), layer_config)
        assert json.dumps(got) == json.dumps(want), template
