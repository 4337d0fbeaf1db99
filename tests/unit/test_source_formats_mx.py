# tier: unit
"""MX-family sources (issue 38): MXFP8 (MiniMax-M3-MXFP8), DeepSeek-V4's FP8 with E8M0 `.scale` tensors and its
packed-FP4 experts. Every expected value is computed here by hand from the E4M3 / E2M1 / E8M0 definitions (OCP MX
spec), never by the code under test."""

from __future__ import annotations

import pytest
import torch

from quantkit.io import formats as F

MXFP8_CFG = {"quant_method": "mxfp8", "activation_scheme": "dynamic", "weight_block_size": [1, 32],
             "scale_fmt": "ue8m0", "ignored_layers": ["lm_head", "model.embed_tokens"]}  # fmt: skip
DSV4_CFG = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "scale_fmt": "ue8m0",
            "weight_block_size": [128, 128]}  # fmt: skip

# E4M3 codes and their values, by hand: sign | 4-bit exponent (bias 7) | 3-bit mantissa.
E4M3 = {0x38: 1.0, 0x40: 2.0, 0xB8: -1.0, 0x3C: 1.5, 0x30: 0.5, 0x01: 2.0**-9, 0x7E: 448.0, 0x00: 0.0}
# E2M1 codes (low 3 bits magnitude, bit 3 sign) and their values, by hand.
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def _e4m3(codes: list[list[int]]) -> torch.Tensor:
    return torch.tensor(codes, dtype=torch.uint8).view(torch.float8_e4m3fn)


_ST = {torch.float8_e4m3fn: "F8_E4M3", torch.uint8: "U8", torch.int8: "I8", torch.float8_e8m0fnu: "F8_E8M0"}


def _headers(tensors: dict[str, torch.Tensor]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """(safetensors dtype, shape) per tensor, as a checkpoint's headers give them to detect_format."""
    return {n: (_ST[t.dtype], tuple(t.shape)) for n, t in tensors.items()}


def _by_hand(codes: list[list[int]], scales: list[list[int]], block: tuple[int, int]) -> list[list[float]]:
    bn, bk = block
    return [
        [E4M3[c] * 2.0 ** (scales[i // bn][j // bk] - 127) for j, c in enumerate(row)] for i, row in enumerate(codes)
    ]


# --- MXFP8 ---------------------------------------------------------------------------------------------------------


def test_mxfp8_is_detected_from_config_and_headers():
    headers = {"model.layers.0.self_attn.q_proj.weight": ("F8_E4M3", (8, 64)),
               "model.layers.0.self_attn.q_proj.weight_scale_inv": ("U8", (8, 2)),
               "model.embed_tokens.weight": ("BF16", (16, 64))}  # fmt: skip
    fmt = F.detect_format({"quantization_config": MXFP8_CFG}, headers)
    assert (fmt.name, fmt.method, fmt.block_size, fmt.e8m0_scales) == ("fp8-block", "mxfp8", (1, 32), True)
    assert fmt.description.startswith("MXFP8: FP8 E4M3 weights with 1x32 E8M0 block scales")
    # a float scale where MXFP8 stores E8M0 bytes, and a block that is not OCP MX, are refused in one line
    with pytest.raises(F.SourceFormatError, match=r"weight_scale_inv is F32 \[8, 2\], expected E8M0"):
        F.detect_format(
            {"quantization_config": MXFP8_CFG},
            {**headers, "model.layers.0.self_attn.q_proj.weight_scale_inv": ("F32", (8, 2))},
        )
    with pytest.raises(F.UnsupportedSourceFormatError, match=r"MXFP8 with weight_block_size \[1, 16\]"):
        F.detect_format({"quantization_config": {**MXFP8_CFG, "weight_block_size": [1, 16]}}, headers)


def test_mxfp8_decodes_exactly_to_hand_computed_values():
    row0 = [0x40, 0xB8, 0x3C, 0x01] + [0x38] * 28 + [0x7E, 0x30] + [0x00] * 30
    row1 = [0x30] * 64
    codes = [row0, row1]
    scales = [[127, 120], [130, 1]]  # 1, 2**-7 | 8, 2**-126 (0.5 * 2**-126 = 2**-127: a BF16 subnormal, exact)
    tensors = {"m.weight": _e4m3(codes), "m.weight_scale_inv": torch.tensor(scales, dtype=torch.uint8)}
    fmt = F.detect_format({"quantization_config": MXFP8_CFG}, _headers(tensors))
    out = F.decode_tensors(fmt, tensors)
    assert list(out) == ["m.weight"] and out["m.weight"].dtype == torch.bfloat16
    assert out["m.weight"].float().tolist() == _by_hand(codes, scales, (1, 32))
    assert out["m.weight"][0, 32].item() == 448.0 * 2**-7 and out["m.weight"][1, 40].item() == 2.0**-127


def test_e8m0_byte_255_is_nan_and_refused():
    tensors = {"m.weight": _e4m3([[0x38] * 32]), "m.weight_scale_inv": torch.tensor([[255]], dtype=torch.uint8)}
    fmt = F.detect_format({"quantization_config": MXFP8_CFG}, _headers(tensors))
    with pytest.raises(F.NonFiniteWeightError, match=r"m.weight: decoded value at index \[0, 0\] is nan"):
        F.decode_tensors(fmt, tensors)


# --- DeepSeek-V4 ---------------------------------------------------------------------------------------------------

DSV4_HEADERS = {
    "embed.weight": ("BF16", (64, 256)),
    "layers.0.attn.wkv.weight": ("F8_E4M3", (130, 256)),
    "layers.0.attn.wkv.scale": ("F8_E8M0", (2, 2)),
    "layers.0.ffn.gate.weight": ("BF16", (4, 256)),
    "layers.0.ffn.gate.bias": ("F32", (4,)),
    "layers.0.ffn.shared_experts.w1.weight": ("F8_E4M3", (128, 256)),
    "layers.0.ffn.shared_experts.w1.scale": ("F8_E8M0", (1, 2)),
    "layers.0.ffn.experts.0.w1.weight": ("I8", (128, 128)),
    "layers.0.ffn.experts.0.w1.scale": ("F8_E8M0", (128, 8)),
    "head.weight": ("BF16", (64, 256)),
}


def test_deepseek_v4_scales_are_scales_not_weights():
    # The release's own config and names: apply used to say `layers.0.attn.wkv.scale is F8_E8M0; fp8-block decodes
    # F8_E4M3 weights only`, calling a scale a weight.
    config = {"architectures": ["DeepseekV4ForCausalLM"], "expert_dtype": "fp4", "quantization_config": DSV4_CFG}
    fmt = F.detect_format(config, DSV4_HEADERS)
    assert (fmt.scale_suffix, fmt.e8m0_scales, fmt.block_size, fmt.fp4_experts) == (".scale", True, (128, 128), 1)
    assert "already OCP MXFP4" in fmt.description and "bytes unchanged" in fmt.description
    # a lone E8M0 tensor is named for what it is: neither a weight nor a scale beside one
    with pytest.raises(F.SourceFormatError) as e:
        F.detect_format(config, {**DSV4_HEADERS, "layers.0.attn.stray": ("F8_E8M0", (2, 2))})
    assert "neither an F8_E4M3 weight nor a block scale named *.scale" in str(e.value)
    with pytest.raises(
        F.SourceFormatError, match=r"layers.0.attn.wo.scale has no F8_E4M3 weight .*layers.0.attn.wo.weight"
    ):
        F.detect_format(config, {**DSV4_HEADERS, "layers.0.attn.wo.scale": ("F8_E8M0", (1, 1))})


def test_deepseek_v4_fp8_with_e8m0_scales_decodes_exactly():
    # a partial edge block: 130 rows = one full 128-row block and a 2-row one, each with its own scale
    codes = [[0x38, 0xB8, 0x3C] for _ in range(130)]
    scales = [[124], [129]]  # 2**-3 for rows 0..127, 2**2 for rows 128..129
    tensors = {
        "layers.0.attn.wkv.weight": _e4m3(codes),
        "layers.0.attn.wkv.scale": torch.tensor(scales, dtype=torch.uint8).view(torch.float8_e8m0fnu),
    }
    fmt = F.detect_format({"quantization_config": DSV4_CFG}, _headers(tensors))
    out = F.decode_tensors(fmt, tensors)
    assert list(out) == ["layers.0.attn.wkv.weight"]
    assert out["layers.0.attn.wkv.weight"].float().tolist() == _by_hand(codes, scales, (128, 128))
    assert out["layers.0.attn.wkv.weight"][129].tolist() == [4.0, -4.0, 6.0]
    assert F.decoded_tensor_names(fmt, tensors) == {"layers.0.attn.wkv.weight": list(tensors)}


def _packed_fp4(codes: list[list[int]]) -> torch.Tensor:
    """Two E2M1 codes per byte, the first in the low nibble (torch.float4_e2m1fn_x2), stored as I8 like the release."""
    rows = [[lo | (hi << 4) for lo, hi in zip(r[0::2], r[1::2], strict=True)] for r in codes]
    return torch.tensor(rows, dtype=torch.uint8).view(torch.int8)


def test_deepseek_v4_fp4_experts_are_relaid_out_bit_identical():
    from quantkit.vllm_plugin.mx_math import dequant_mxfp4

    codes = [[(i * 7 + j) % 16 for j in range(64)] for i in range(3)]
    scale_bytes = [[127, 130], [100, 127], [1, 200]]
    weight = _packed_fp4(codes)
    scale = torch.tensor(scale_bytes, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    tensors = {"layers.0.ffn.experts.0.w2.weight": weight, "layers.0.ffn.experts.0.w2.scale": scale}
    config = {"expert_dtype": "fp4", "quantization_config": DSV4_CFG}
    fmt = F.detect_format(
        config,
        _headers(
            {
                **tensors,
                "layers.0.attn.wo.weight": _e4m3([[0x38]]),
                "layers.0.attn.wo.scale": torch.tensor([[127]], dtype=torch.uint8),
            }
        ),
    )
    out = F.decode_tensors(fmt, tensors)
    # Quark 0.13's MXFP4 names and dtypes, the very bytes of the source: no arithmetic, no second rounding
    assert list(out) == ["layers.0.ffn.experts.0.w2.weight", "layers.0.ffn.experts.0.w2.weight_scale"]
    packed, scales = out.values()
    assert packed.dtype == scales.dtype == torch.uint8
    assert packed.numpy().tobytes() == weight.numpy().tobytes()
    assert scales.numpy().tobytes() == bytes(b for row in scale_bytes for b in row)
    # decoded, the values are E2M1(code) * 2**(scale - 127), computed here by hand
    hand = [[E2M1[c] * 2.0 ** (scale_bytes[i][j // 32] - 127) for j, c in enumerate(r)] for i, r in enumerate(codes)]
    assert dequant_mxfp4(packed, scales, torch.float32).tolist() == hand


@pytest.mark.parametrize(("scale", "why"), [
    (("F8_E8M0", (128, 16)), "one scale per 16"),  # a 16-element block: not OCP MXFP4
    (("F8_E4M3", (128, 16)), "E4M3 scales (NVFP4)"),
])  # fmt: skip
def test_fp4_experts_in_another_layout_are_refused_as_already_fp4(scale, why):
    headers = {**DSV4_HEADERS, "layers.0.ffn.experts.0.w1.scale": scale}
    config = {"architectures": ["DeepseekV4ForCausalLM"], "expert_dtype": "fp4", "quantization_config": DSV4_CFG}
    with pytest.raises(F.AlreadyFp4Error) as e:
        F.detect_format(config, headers)
    message = str(e.value)
    assert "layers.0.ffn.experts.0.w1.weight is packed FP4" in message, why
    assert "already FP4: serve it as it is" in message and "\n" not in message
