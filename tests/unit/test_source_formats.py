"""Source formats (quantkit.io.formats): detection from config.json + headers, refusal of what cannot be decoded
exactly, and decoding checked bit for bit against independent references: a NumPy block dequantizer and NumPy INT4
unpacker written here, and, on real tiny checkpoints (slow), compressed-tensors' own decompressors."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest

from quantkit.errors import QuantkitError
from quantkit.io import formats as F
from quantkit.naming import archs

FP8_CFG = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}
INT4_WEIGHTS = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32,
                "actorder": None, "dynamic": False}  # fmt: skip
INT4_CFG = {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": INT4_WEIGHTS, "input_activations": None}},
            "ignore": ["lm_head", "re:.*self_attn.*"]}  # fmt: skip
FIX = "start from the model's BF16, FP8-block or INT4 pack-quantized release"

# Header views: name -> (safetensors dtype, shape).
FP8_HEADERS = {
    "model.embed_tokens.weight": ("BF16", (64, 256)),
    "model.layers.0.self_attn.o_proj.weight": ("F8_E4M3", (256, 200)),
    "model.layers.0.self_attn.o_proj.weight_scale_inv": ("F32", (2, 2)),
    "model.layers.0.mlp.gate.weight": ("BF16", (4, 256)),
    "model.layers.0.mlp.gate.e_score_correction_bias": ("F32", (4,)),
    "lm_head.weight": ("BF16", (64, 256)),
}
INT4_HEADERS = {
    "model.layers.1.mlp.experts.0.down_proj.weight_packed": ("I32", (256, 24)),
    "model.layers.1.mlp.experts.0.down_proj.weight_scale": ("BF16", (256, 6)),
    "model.layers.1.mlp.experts.0.down_proj.weight_shape": ("I64", (2,)),
    "model.layers.1.self_attn.o_proj.weight": ("BF16", (256, 64)),
}


def _with(base: dict, **changes) -> dict:
    out = copy.deepcopy(base)
    out.update(changes)
    return out


def _ct(format: str = "pack-quantized", **weights) -> dict:
    cfg = copy.deepcopy(INT4_CFG)
    cfg["format"] = format
    cfg["config_groups"]["group_0"]["weights"].update(weights)
    return cfg


# --- detection ----------------------------------------------------------------------------------------------------


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 (nearest, ties to even) and return the 16-bit patterns."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _e4m3fn_values() -> np.ndarray:
    """float32 value of each float8_e4m3fn byte (OCP FP8: bias 7, no infinities, S.1111.111 is NaN)."""
    out = np.empty(256, np.float32)
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        exp, mant = (b >> 3) & 0xF, b & 0x7
        if exp == 15 and mant == 7:
            out[b] = np.nan
        elif exp == 0:
            out[b] = sign * mant / 8 * 2.0**-6
        else:
            out[b] = sign * (1 + mant / 8) * 2.0 ** (exp - 7)
    return out


def _bits(t) -> np.ndarray:
    import torch

    assert t.dtype == torch.bfloat16
    return t.contiguous().view(torch.int16).numpy().view(np.uint16)


def numpy_fp8_block_dequant(weight_bytes: np.ndarray, scale_inv: np.ndarray, block=(128, 128)) -> np.ndarray:
    """float32 product of each E4M3 value and its block's scale (partial edge blocks included)."""
    rows, cols = weight_bytes.shape
    w = _e4m3fn_values()[weight_bytes]
    s = np.repeat(np.repeat(scale_inv.astype(np.float32), block[0], axis=0), block[1], axis=1)[:rows, :cols]
    return (w * s).astype(np.float32)


def test_detects_plain_fp8_block_and_int4():
    plain = F.detect_format({"architectures": ["LlamaForCausalLM"]}, {"a.weight": ("BF16", (2, 2)), "b": ("F32", (2,))})
    assert (plain.name, plain.config_key, plain.stored_dtypes) == ("bf16", None, ("BF16", "F32"))

    minimax = _with(FP8_CFG, modules_to_not_convert=["gate", "e_score_correction_bias", "lm_head"])
    fp8 = F.detect_format({"quantization_config": minimax}, FP8_HEADERS)
    assert (fp8.name, fp8.block_size) == ("fp8-block", (128, 128))
    assert fp8.ignore == ("gate", "e_score_correction_bias", "lm_head")
    assert "128x128 block scales" in fp8.description

    odd_scale = {"model.layers.0.self_attn.o_proj.weight_scale_inv": ("F32", (4, 2))}
    odd_block = F.detect_format(
        {"quantization_config": _with(FP8_CFG, weight_block_size=[64, 100])}, _with(FP8_HEADERS, **odd_scale)
    )
    assert odd_block.block_size == (64, 100)

    top = F.detect_format({"quantization_config": INT4_CFG}, INT4_HEADERS)
    assert (top.name, top.group_size, top.num_bits) == ("int4-pack-quantized", 32, 4)
    assert top.config_key == "quantization_config"
    # Kimi-K2.5 keeps it in text_config; vLLM and compressed-tensors look there second.
    kimi = F.detect_format({"model_type": "kimi_k25", "text_config": {"quantization_config": INT4_CFG}}, INT4_HEADERS)
    assert (kimi.name, kimi.config_key, kimi.ignore) == ("int4-pack-quantized", "text_config.quantization_config",
                                                         ("lm_head", "re:.*self_attn.*"))  # fmt: skip
    assert json.dumps(kimi.to_dict())  # serialisable for provenance


def test_any_mxfp4_release_is_already_mxfp4():
    """quant_method mxfp4 is what vLLM's Mxfp4Config serves as it is, whatever the family: refused as already MXFP4
    (the refusal depends on no model_type)."""
    with pytest.raises(F.AlreadyMxfp4Error, match="already MXFP4"):
        F.detect_format({"quantization_config": {"quant_method": "mxfp4"}}, {})


@pytest.mark.parametrize(
    ("qcfg", "what"),
    [
        (_ct(symmetric=False), "asymmetric INT4 (symmetric: false, weight_zero_point)"),
        (_ct(num_bits=8), "INT8 pack-quantized weights"),
        (_ct(num_bits=2), "INT2 pack-quantized weights"),
        (_ct(strategy="channel", group_size=None), "INT4 with strategy 'channel' (only 'group' is supported)"),
        (_ct(actorder="group"), "INT4 with actorder 'group' (weight_g_idx)"),
        (
            _ct("nvfp4-pack-quantized", type="float", group_size=16),
            "compressed-tensors format 'nvfp4-pack-quantized' (NVFP4)",
        ),
        (_ct("mxfp4-pack-quantized", type="float"), "compressed-tensors format 'mxfp4-pack-quantized' (MXFP4)"),
        (
            _ct("float-quantized", num_bits=8, type="float"),
            "compressed-tensors format 'float-quantized' (FP8 (float-quantized))",
        ),
        (_ct("int-quantized", num_bits=8), "compressed-tensors format 'int-quantized' (INT8 (int-quantized))"),
        (_ct("naive-quantized"), "compressed-tensors format 'naive-quantized'"),
        (_ct("marlin-24"), "compressed-tensors format 'marlin-24' (2:4-sparse Marlin (marlin-24))"),
        (
            _with(INT4_CFG, transform_config={"config_groups": {"u": {}}}),
            "compressed-tensors with transform_config (rotated weights)",
        ),
        (
            _with(INT4_CFG, sparsity_config={"format": "sparse-24-bitmask"}),
            "sparse compressed-tensors (sparsity_config)",
        ),
        ({"quant_method": "gptq", "bits": 4, "group_size": 128}, "quant_method 'gptq'"),
        ({"quant_method": "awq", "bits": 4}, "quant_method 'awq'"),
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "quant_method 'bitsandbytes'"),
        ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "quant_method 'modelopt'"),
        (_with(FP8_CFG, weight_block_size=None), "per-tensor FP8 (quant_method fp8 without weight_block_size)"),
        (_with(FP8_CFG, fmt="e5m2"), "FP8 fmt 'e5m2'"),
        (_with(FP8_CFG, weight_block_size=[128, 0]), "FP8 weight_block_size [128, 0] (expected two positive integers)"),
    ],
)
def test_unsupported_formats_are_refused_before_reading_tensors(qcfg, what):
    # No tensors at all: the refusal comes from config.json alone.
    with pytest.raises(F.UnsupportedSourceFormatError) as e:
        F.detect_format({"quantization_config": qcfg}, {})
    assert str(e.value) == (f"config.json quantization_config: {what} is not a supported source format; "
                            f"supported: {F.SUPPORTED_FORMATS}; {FIX}")  # fmt: skip
    assert isinstance(e.value, QuantkitError) and "\n" not in str(e.value)


def test_quark_checkpoint_is_refused_as_already_quantized():
    message = (
        r"^config.json text_config.quantization_config: quant_method 'quark': the checkpoint is already "
        r"quantized by Quark; quantize from"
    )
    with pytest.raises(F.UnsupportedSourceFormatError, match=message):
        F.detect_format({"text_config": {"quantization_config": {"quant_method": "quark", "export": {}}}}, {})


@pytest.mark.parametrize(
    ("config", "headers", "message"),
    [
        (
            {"quantization_config": FP8_CFG},
            _with(FP8_HEADERS, **{"model.layers.0.self_attn.o_proj.weight_scale_inv": None}),
            (
                "model.layers.0.self_attn.o_proj.weight is F8_E4M3 but model.layers.0.self_attn.o_proj.weight_scale_inv is "
                "missing"
            ),
        ),
        (
            {"quantization_config": FP8_CFG},
            _with(FP8_HEADERS, **{"model.layers.0.self_attn.o_proj.weight_scale_inv": ("F32", (2, 1))}),
            (
                "o_proj.weight_scale_inv is F32 [2, 1], expected F32 [2, 2] for model.layers.0.self_attn.o_proj.weight "
                "[256, 200] with weight_block_size [128, 128]"
            ),
        ),
        (
            {"quantization_config": FP8_CFG},
            {"model.embed_tokens.weight": ("BF16", (64, 256)), "lm_head.weight": ("BF16", (64, 256))},
            "says fp8, but no F8_E4M3 weight with weight_scale_inv is in the checkpoint",
        ),
        (
            {"quantization_config": FP8_CFG},
            _with(FP8_HEADERS, **{"model.layers.0.mlp.up_proj.weight_scale_inv": ("F32", (1, 2))}),
            "model.layers.0.mlp.up_proj.weight_scale_inv has no F8_E4M3 weight model.layers.0.mlp.up_proj.weight",
        ),
        (
            {"quantization_config": FP8_CFG},
            _with(FP8_HEADERS, **{"model.layers.0.self_attn.o_proj.input_scale": ("F32", ())}),
            "tensor model.layers.0.self_attn.o_proj.input_scale is a static activation scale",
        ),
        (
            {},
            FP8_HEADERS,
            "config.json has no quantization_config, but tensor model.layers.0.self_attn.o_proj.weight is F8_E4M3",
        ),
        (
            {"quantization_config": INT4_CFG},
            _with(INT4_HEADERS, **{"model.layers.1.mlp.experts.0.down_proj.weight_scale": None}),
            (
                "model.layers.1.mlp.experts.0.down_proj.weight_packed has no "
                "model.layers.1.mlp.experts.0.down_proj.weight_scale"
            ),
        ),
        (
            {"quantization_config": INT4_CFG},
            _with(INT4_HEADERS, **{"model.layers.1.mlp.experts.0.down_proj.weight_zero_point": ("I32", (32, 6))}),
            "down_proj.weight_zero_point (weight_zero_point) is not part of symmetric",
        ),
        (
            {"quantization_config": INT4_CFG},
            _with(INT4_HEADERS, **{"model.layers.1.mlp.experts.0.down_proj.weight_scale": ("BF16", (256, 3))}),
            "down_proj.weight_scale is BF16 [256, 3], expected [256, 6]",
        ),
        (
            {"quantization_config": INT4_CFG},
            {"model.layers.1.self_attn.o_proj.weight": ("BF16", (256, 64))},
            "says pack-quantized, but no .weight_packed tensor is in the checkpoint",
        ),
    ],
)
def test_config_and_tensors_that_disagree_name_the_first_offending_tensor(config, headers, message):
    headers = {k: v for k, v in headers.items() if v is not None}
    with pytest.raises(F.SourceFormatError) as e:
        F.detect_format(config, headers)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_headers_accept_quantkit_tensorinfo():
    from quantkit.io.headers import TensorInfo

    infos = {n: TensorInfo("model-00001-of-00001.safetensors", d, s) for n, (d, s) in FP8_HEADERS.items()}
    assert F.detect_format({"quantization_config": FP8_CFG}, infos).name == "fp8-block"


# --- names --------------------------------------------------------------------------------------------------------


def test_decoded_tensor_names_and_origins():
    fp8 = F.detect_format({"quantization_config": FP8_CFG}, FP8_HEADERS)
    names = F.decoded_tensor_names(fp8, FP8_HEADERS)
    assert names == {
        "model.embed_tokens.weight": ["model.embed_tokens.weight"],
        "model.layers.0.self_attn.o_proj.weight": ["model.layers.0.self_attn.o_proj.weight",
                                                   "model.layers.0.self_attn.o_proj.weight_scale_inv"],
        "model.layers.0.mlp.gate.weight": ["model.layers.0.mlp.gate.weight"],
        "model.layers.0.mlp.gate.e_score_correction_bias": ["model.layers.0.mlp.gate.e_score_correction_bias"],
        "lm_head.weight": ["lm_head.weight"],
    }  # fmt: skip
    assert F.decoded_origins(fp8, FP8_HEADERS)["model.layers.0.self_attn.o_proj.weight"] == "fp8-block"
    assert F.decoded_origins(fp8, FP8_HEADERS)["lm_head.weight"] == "stored"

    int4 = F.detect_format({"quantization_config": INT4_CFG}, INT4_HEADERS)
    m = "model.layers.1.mlp.experts.0.down_proj"
    assert F.decoded_tensor_names(int4, INT4_HEADERS) == {
        f"{m}.weight": [f"{m}.weight_packed", f"{m}.weight_scale", f"{m}.weight_shape"],
        "model.layers.1.self_attn.o_proj.weight": ["model.layers.1.self_attn.o_proj.weight"],
    }
    with pytest.raises(F.SourceFormatError, match=f"{m}.weight_packed has no {m}.weight_shape"):
        F.decoded_tensor_names(int4, [f"{m}.weight_packed", f"{m}.weight_scale"])
    with pytest.raises(F.SourceFormatError, match=f"{m}.weight_scale has no {m}.weight_packed"):
        F.decoded_tensor_names(int4, [f"{m}.weight_scale"])


KIMI_CONFIG = {
    "architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
    "text_config": {"model_type": "kimi_k2", "num_hidden_layers": 2, "num_nextn_predict_layers": 1},
}  # fmt: skip


def test_text_model_view_and_mtp_names():
    """MTP names where the records put them: a wrapper's text family under its prefix (Kimi-K2.5 -> DeepSeek-V3 under
    language_model.), the family's count keys (num_nextn_predict_layers, MiniMax-M2's num_mtp_modules)."""
    names = [
        "language_model.model.layers.0.mlp.down_proj.weight",
        "language_model.model.layers.2.eh_proj.weight",
        "language_model.lm_head.weight",
        "vision_tower.patch_embed.proj.weight",
        "mm_projector.proj.0.weight",
    ]
    family, text, prefix = archs.text_family(KIMI_CONFIG)
    assert family is not None and family.name == "deepseek_v3"
    assert prefix == "language_model." and text["architectures"] == ["DeepseekV3ForCausalLM"]
    assert archs.mtp_tensor_names(KIMI_CONFIG, names) == ["language_model.model.layers.2.eh_proj.weight"]

    ds = {"architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 61, "num_nextn_predict_layers": 1}
    ds_names = [
        "model.layers.60.mlp.gate.weight",
        "model.layers.61.enorm.weight",
        "model.layers.610.x.weight",
        "model.layers.61.mlp.experts.0.up_proj.weight_scale_inv",
    ]
    assert archs.text_family(ds)[1:] == (ds, "")
    assert archs.mtp_tensor_names(ds, ds_names) == [
        "model.layers.61.enorm.weight",
        "model.layers.61.mlp.experts.0.up_proj.weight_scale_inv",
    ]
    minimax = {"architectures": ["MiniMaxM2ForCausalLM"], "num_hidden_layers": 2, "num_mtp_modules": 1}
    assert archs.mtp_tensor_names(minimax, ["model.layers.1.a", "model.layers.2.a"]) == ["model.layers.2.a"]
    # num_mtp_modules is not a DeepSeek-V3 key: its record counts by num_nextn_predict_layers only
    assert (
        archs.mtp_tensor_names({**ds, "num_nextn_predict_layers": 0, "num_mtp_modules": 1}, ["model.layers.61.a"]) == []
    )
    assert archs.mtp_tensor_names({"num_hidden_layers": 2}, ["model.layers.2.a"]) == []


# --- independent NumPy references ---------------------------------------------------------------------------------


def numpy_int4_dequant(packed: np.ndarray, scale_f32: np.ndarray, cols: int, group: int) -> np.ndarray:
    """float32 value of each packed INT4 (8 per int32, lowest nibble first, stored as q + 8) times its group scale."""
    u = packed.astype(np.int64) & 0xFFFFFFFF
    nibbles = np.stack([(u >> (4 * i)) & 0xF for i in range(8)], axis=-1).reshape(packed.shape[0], -1)[:, :cols]
    return ((nibbles - 8).astype(np.float32) * np.repeat(scale_f32, group, axis=1)).astype(np.float32)


def _fp8_fmt(block=(128, 128)) -> F.SourceFormat:
    return F.SourceFormat("fp8-block", "quantization_config", block_size=block)


def _int4_fmt() -> F.SourceFormat:
    return F.SourceFormat("int4-pack-quantized", "quantization_config", group_size=32, num_bits=4)


def _random_fp8(rows: int, cols: int, seed: int):
    """Every finite E4M3 code appears; scales differ per block (so a wrong block mapping cannot pass)."""
    import torch

    rng = np.random.default_rng(seed)
    codes = np.array([b for b in range(256) if b & 0x7F != 0x7F], np.uint8)
    raw = rng.choice(codes, size=(rows, cols)).astype(np.uint8)
    scale = rng.uniform(1e-4, 3e-2, size=(math.ceil(rows / 128), math.ceil(cols / 128))).astype(np.float32)
    weight = torch.from_numpy(raw).view(torch.float8_e4m3fn)
    return weight, torch.from_numpy(scale), raw, scale


# --- decoding -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(256, 256), (300, 200), (96, 64), (129, 385)])
def test_fp8_block_decode_matches_numpy_reference_bit_for_bit(shape):
    import torch

    weight, scale, raw, scale_np = _random_fp8(*shape, seed=shape[0])
    kept = torch.randn(8, 8).to(torch.bfloat16)
    shard = {"m.weight": weight, "m.weight_scale_inv": scale, "norm.weight": kept}
    out = F.decode_tensors(_fp8_fmt(), shard)
    assert list(shard) == ["m.weight", "m.weight_scale_inv", "norm.weight"]  # the input is left as it was
    assert list(out) == ["m.weight", "norm.weight"]
    assert out["norm.weight"] is kept
    ref = numpy_fp8_block_dequant(raw, scale_np)
    assert out["m.weight"].dtype == torch.bfloat16 and tuple(out["m.weight"].shape) == shape
    np.testing.assert_array_equal(_bits(out["m.weight"]), _bf16_bits(ref))
    # float32 on request: the unrounded products (what Quark's file-to-file path quantizes from).
    f32 = F.decode_tensors(_fp8_fmt(), shard, dtype=torch.float32)["m.weight"]
    np.testing.assert_array_equal(f32.numpy(), ref)


def test_fp8_partial_edge_blocks_use_their_own_scale():
    import torch

    rows, cols = 130, 129  # last row block holds 2 rows, last column block 1 column
    weight = torch.full((rows, cols), 1.0).to(torch.float8_e4m3fn)
    scale = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    out = F.decode_tensors(_fp8_fmt(), {"w.weight": weight, "w.weight_scale_inv": scale})["w.weight"].float()
    assert out[:128, :128].unique().tolist() == [1.0] and out[:128, 128:].unique().tolist() == [2.0]
    assert out[128:, :128].unique().tolist() == [3.0] and out[128:, 128:].unique().tolist() == [4.0]
    # Any positive block size decodes the same way.
    other = F.decode_tensors(_fp8_fmt((64, 100)), {"w.weight": weight, "w.weight_scale_inv": torch.ones(3, 2)})
    assert other["w.weight"].float().unique().tolist() == [1.0]


def _pack_int4(q: np.ndarray) -> np.ndarray:
    """Independent packer: q in [-8, 7] -> int32 words, value i in bits [4i, 4i+4), stored as q + 8."""
    rows, cols = q.shape
    padded = np.zeros((rows, math.ceil(cols / 8) * 8), np.int64)
    padded[:, :cols] = q + 8
    words = sum(padded[:, i::8] << (4 * i) for i in range(8))
    return words.astype(np.uint32).view(np.int32)


@pytest.mark.parametrize("shape", [(64, 256), (48, 96), (8, 32)])
def test_int4_decode_matches_numpy_reference_bit_for_bit(shape):
    import torch

    rows, cols = shape
    rng = np.random.default_rng(cols)
    q = rng.integers(-8, 8, size=shape)
    scale = torch.from_numpy(rng.uniform(1e-3, 5e-2, size=(rows, cols // 32)).astype(np.float32)).to(torch.bfloat16)
    shard = {"e.weight_packed": torch.from_numpy(_pack_int4(q)), "e.weight_scale": scale,
             "e.weight_shape": torch.tensor(shape), "e.bias": torch.zeros(rows, dtype=torch.bfloat16)}  # fmt: skip
    out = F.decode_tensors(_int4_fmt(), shard)
    assert list(out) == ["e.weight", "e.bias"] and out["e.bias"] is shard["e.bias"]
    ref = numpy_int4_dequant(shard["e.weight_packed"].numpy(), scale.float().numpy(), cols, 32)
    np.testing.assert_array_equal(_bits(out["e.weight"]), _bf16_bits(ref))
    np.testing.assert_array_equal(F.decode_tensors(_int4_fmt(), shard, dtype=torch.float32)["e.weight"].numpy(), ref)


def test_nonfinite_decoded_values_are_refused_with_tensor_and_index():
    import torch

    weight, scale, _, _ = _random_fp8(256, 256, seed=1)
    scale[1, 0] = float("inf")
    with pytest.raises(F.NonFiniteWeightError, match=r"^m\.weight: decoded value at index \[128, 0\] is "):
        F.decode_tensors(_fp8_fmt(), {"m.weight": weight, "m.weight_scale_inv": scale})

    weight, scale, _, _ = _random_fp8(256, 256, seed=2)
    raw = weight.view(torch.uint8).clone()
    raw[3, 7] = 0x7F  # E4M3 NaN
    with pytest.raises(F.NonFiniteWeightError, match=r"index \[3, 7\] is nan"):
        F.decode_tensors(_fp8_fmt(), {"m.weight": raw.view(torch.float8_e4m3fn), "m.weight_scale_inv": scale})

    scale4 = torch.full((8, 1), 0.01, dtype=torch.bfloat16)
    scale4[5, 0] = float("inf")
    shard = {"e.weight_packed": torch.from_numpy(_pack_int4(np.ones((8, 32), np.int64))), "e.weight_scale": scale4,
             "e.weight_shape": torch.tensor([8, 32])}  # fmt: skip
    with pytest.raises(F.NonFiniteWeightError, match=r"^e\.weight: decoded value at index \[5, 0\] is inf"):
        F.decode_tensors(_int4_fmt(), shard)


def test_modules_split_across_shards_need_a_lookup():
    import torch

    weight, scale, raw, scale_np = _random_fp8(200, 300, seed=3)
    first = {"a.weight": weight, "b.weight": torch.zeros(2, 2, dtype=torch.bfloat16)}
    second = {"a.weight_scale_inv": scale, "c.weight": torch.zeros(2, 2, dtype=torch.bfloat16)}
    with pytest.raises(F.SplitModuleError, match=r"^a\.weight: a\.weight_scale_inv is not in this shard"):
        F.decode_tensors(_fp8_fmt(), first)
    with pytest.raises(F.SplitModuleError, match=r"^a\.weight_scale_inv is in this shard but a\.weight is not"):
        F.decode_tensors(_fp8_fmt(), second)
    everything = {**first, **second}
    one = F.decode_tensors(_fp8_fmt(), first, lookup=everything.__getitem__)
    np.testing.assert_array_equal(_bits(one["a.weight"]), _bf16_bits(numpy_fp8_block_dequant(raw, scale_np)))
    two = F.decode_tensors(_fp8_fmt(), second, lookup=everything.__getitem__)
    assert list(two) == ["c.weight"]  # the scale went with its weight's shard
    with pytest.raises(F.SourceFormatError, match="a.weight_scale_inv is in no shard"):
        F.decode_tensors(_fp8_fmt(), first, lookup={}.__getitem__)


def test_plain_and_malformed_parts():
    import torch

    t = {"x.weight": torch.ones(2, 2, dtype=torch.float16), "y": torch.ones(3)}
    out = F.decode_tensors(F.SourceFormat("bf16"), t)
    assert out == t and all(out[k] is t[k] for k in t)
    with pytest.raises(F.SourceFormatError, match=r"x\.weight is torch\.bfloat16 \[2, 2\], expected 2-D float8_e4m3fn"):
        F.decode_tensors(_fp8_fmt(), {"x.weight": torch.ones(2, 2, dtype=torch.bfloat16),
                                      "x.weight_scale_inv": torch.ones(1, 1)})  # fmt: skip
    with pytest.raises(F.SourceFormatError, match="50 input columns are not a multiple of group_size 32"):
        F.decode_tensors(_int4_fmt(), {"e.weight_packed": torch.zeros(4, 7, dtype=torch.int32),
                                       "e.weight_scale": torch.ones(4, 2, dtype=torch.bfloat16),
                                       "e.weight_shape": torch.tensor([4, 50])})  # fmt: skip
