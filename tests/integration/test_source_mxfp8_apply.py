# tier: integration
"""MiniMax-M3-MXFP8 (quant_method mxfp8, weight_block_size [1, 32], U8 E8M0 weight_scale_inv) through apply: every
FP8 weight is decoded exactly to BF16, then quantized. The reference is vLLM's own dequantization
(vllm/model_executor/layers/quantization/utils/mxfp8_utils.py dequant_mxfp8_to_bf16), not quantkit's decoder."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from quantkit.cli import main
from tests.fixtures import checkpoints as ck
from tests.fixtures.checkpoints import write_checkpoint
from tests.integration.test_family_minimax_m3 import CONFIG, MOE_LAYERS, _tensors, m3_tensors

MXFP8 = {"quant_method": "mxfp8", "activation_scheme": "dynamic", "weight_block_size": [1, 32], "scale_fmt": "ue8m0",
         "ignored_layers": ["lm_head", "model.embed_tokens", "vision_tower", "block_sparse_moe.gate"]}  # fmt: skip


def _to_mxfp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """By hand: per row block of 32, scale 2**e with e = floor(log2(amax)) - 8 (E4M3's largest exponent), stored as
    the E8M0 byte e + 127; the elements w / 2**e cast to E4M3 (within +-448)."""
    blocks = w.float().unflatten(-1, (-1, 32))
    amax = blocks.abs().amax(-1).clamp(min=2.0**-100)
    e = torch.floor(torch.log2(amax)) - 8
    q = (blocks / torch.exp2(e).unsqueeze(-1)).clamp(-448, 448).to(torch.float8_e4m3fn).flatten(-2)
    return q, (e + 127).to(torch.uint8)


def _fp8_stored(name: str, t: torch.Tensor) -> bool:
    return (
        name.startswith("language_model.model.layers.")
        and name.endswith("_proj.weight")
        or name.endswith((".w1.weight", ".w2.weight", ".w3.weight"))
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    base = tmp_path_factory.mktemp("m3-mxfp8")
    bf16 = _tensors(ck.write(base / "bf16", CONFIG, m3_tensors(), seed=8))
    tensors = {}
    for name, t in bf16.items():
        if _fp8_stored(name, t):
            tensors[name], tensors[name + "_scale_inv"] = _to_mxfp8(t)
        else:
            tensors[name] = t
    src = write_checkpoint(base / "mxfp8", tensors, {**CONFIG, "quantization_config": MXFP8})
    dst = base / "out"
    runner = CliRunner()
    shown = runner.invoke(main, ["inspect", str(src), "--json"])
    applied = runner.invoke(
        main, ["apply", "--recipe", "mxfp4-moe", "--model", str(src), "--output", str(dst), "--json"]
    )
    assert applied.exit_code == 0, applied.output
    return {
        "src": tensors,
        "out": _tensors(dst),
        "inspect": json.loads(shown.stdout),
        "apply": json.loads(applied.stdout),
    }


def test_mxfp8_source_is_detected(run):
    assert run["inspect"]["source_format"].startswith("MXFP8: FP8 E4M3 weights with 1x32 E8M0 block scales")
    assert run["apply"]["source_format"] == "fp8-block"


def test_decoded_exactly_then_quantized(run):
    from vllm.model_executor.layers.quantization.utils.mxfp8_utils import dequant_mxfp8_to_bf16

    from quantkit.schemes import quantize_weight

    src, out = run["src"], run["out"]
    experts = tuple(f"language_model.model.layers.{i}.block_sparse_moe.experts." for i in MOE_LAYERS)
    assert not any(n.endswith("_scale_inv") for n in out)
    checked = {"experts": 0, "kept": 0}
    for name, t in src.items():
        if t.dtype != torch.float8_e4m3fn:
            continue
        decoded = dequant_mxfp8_to_bf16(t, src[name + "_scale_inv"])
        if name.startswith(experts):
            q, s = quantize_weight(decoded, "mxfp4")
            assert torch.equal(out[name], q) and torch.equal(out[name.replace(".weight", ".weight_scale")], s), name
            checked["experts"] += 1
        else:  # attention (and the indexer's projections), shared experts, dense MLP: BF16, the exact decode
            assert out[name].dtype == torch.bfloat16 and torch.equal(
                out[name].view(torch.int16), decoded.view(torch.int16)
            ), name
            checked["kept"] += 1
    assert checked["experts"] == 2 * 4 * 3 and checked["kept"] > 10
