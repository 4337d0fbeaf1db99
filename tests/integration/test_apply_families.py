"""apply on the MoE families quantkit exists for beyond the bundled Qwen3-MoE: DeepSeek-V3 (Kimi-K2.5's text model)
and MiniMax-M2, as tiny random checkpoints in their published layouts."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from quantkit.apply.run import apply
from quantkit.cli import main
from quantkit.naming.archs import runtime_layers
from quantkit.naming.exclude import is_excluded
from tests.fixtures import checkpoints as ck


@pytest.fixture(scope="module")
def outputs(tiny, tmp_path_factory):
    base = tmp_path_factory.mktemp("families")
    ds = ck.make("deepseek_v3", base / "deepseek")
    mm = ck.make("minimax_m2", base / "minimax")
    runs = {
        "ds-mem": apply("mxfp4-moe", ds, base / "ds-mem", path="in-memory", progress=None),
        "ds-shard": apply("mxfp4-moe", ds, base / "ds-shard", path="per-shard", progress=None),
        "ds-attn": apply("mxfp4-moe-attn-fp8", ds, base / "ds-attn", progress=None),
        "mm": apply("mxfp4-moe", mm, base / "mm", progress=None),
        "mm-attn": apply("mxfp4-moe-attn-fp8", mm, base / "mm-attn", progress=None),
    }
    return {"ds_src": ds, "mm_src": mm, "base": base, **runs}


def _check_plan_against_vllm_rules(result, out):
    """Replaying vLLM's exclude rule over the written config excludes exactly the layers the plan keeps."""
    cfg = json.loads((out / "config.json").read_text())
    names = (
        json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
        if (out / "model.safetensors.index.json").exists()
        else None
    )
    layers = runtime_layers(cfg, names or ck.tensors(out).keys())
    keep = {d.runtime_name for d in result.layers if d.action == "keep"}
    for layer in layers:
        if layer.quantizable:
            assert is_excluded(layer, cfg["quantization_config"]["exclude"]) == (layer.name in keep), layer.name


def test_deepseek_v3_experts_mxfp4_rest_identical(outputs):
    src, out, res = ck.tensors(outputs["ds_src"]), ck.tensors(outputs["base"] / "ds-mem"), outputs["ds-mem"]
    for name, t in src.items():
        if ".mlp.experts." in name:
            w, s = out[name], out[name.replace(".weight", ".weight_scale")]
            assert w.dtype == torch.uint8 and w.shape == (t.shape[0], t.shape[1] // 2), name
            assert s.dtype == torch.uint8 and s.shape == (t.shape[0], t.shape[1] // 32), name
        else:  # router (+ e_score_correction_bias), MLA attention, shared experts, dense layer 0, norms, lm_head
            assert out[name].dtype == t.dtype and torch.equal(out[name].view(torch.uint8), t.view(torch.uint8)), name
    kept = {d.runtime_name: d for d in res.layers if d.action == "keep"}
    assert "model.layers.0.mlp.gate_up_proj" in kept and "model.layers.1.mlp.shared_experts.gate_up_proj" in kept
    assert "model.layers.1.self_attn.fused_qkv_a_proj" in kept and "model.layers.2.mlp.gate" in kept
    assert res.verified["restored_source_dtype"] == [
        "model.layers.1.mlp.gate.e_score_correction_bias",
        "model.layers.2.mlp.gate.e_score_correction_bias",
    ]
    _check_plan_against_vllm_rules(res, outputs["base"] / "ds-mem")


def test_deepseek_v3_in_memory_equals_per_shard(outputs):
    a, b = ck.tensors(outputs["base"] / "ds-mem"), ck.tensors(outputs["base"] / "ds-shard")
    assert set(a) == set(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name].view(torch.uint8), b[name].view(torch.uint8)), (
            name
        )


def test_deepseek_v3_attention_fp8_under_runtime_names(outputs):
    out, res = outputs["base"] / "ds-attn", outputs["ds-attn"]
    t = ck.tensors(out)
    lqc = json.loads((out / "config.json").read_text())["quantization_config"]["layer_quant_config"]
    for layer in range(3):
        for proj in ("q_a_proj", "kv_a_proj_with_mqa", "q_b_proj", "kv_b_proj", "o_proj"):
            name = f"model.layers.{layer}.self_attn.{proj}"
            assert t[f"{name}.weight"].dtype == torch.float8_e4m3fn, name
            # vLLM looks fused_qkv_a_proj's config up per shard (q_a_proj, kv_a_proj_with_mqa): both must be there
            assert lqc[name]["weight"]["dtype"] == "fp8_e4m3", name
    _check_plan_against_vllm_rules(res, out)


def test_minimax_m2_uses_per_shard_and_keeps_names(outputs):
    res, out = outputs["mm"], outputs["base"] / "mm"
    assert res.path == "per-shard"  # the default for every recipe without static activation scales (issue 12)
    src, got = ck.tensors(outputs["mm_src"]), ck.tensors(out)
    assert got["model.layers.1.block_sparse_moe.experts.7.w2.weight"].dtype == torch.uint8
    assert torch.equal(
        got["model.layers.1.block_sparse_moe.gate.weight"], src["model.layers.1.block_sparse_moe.gate.weight"]
    )
    assert torch.equal(
        got["model.layers.1.block_sparse_moe.e_score_correction_bias"],
        src["model.layers.1.block_sparse_moe.e_score_correction_bias"],
    )
    # vLLM builds MiniMax-M2's MoE under `mlp` (minimax_m2.py): the runtime names say so
    names = {d.runtime_name for d in res.layers}
    assert "model.layers.1.mlp.experts" in names
    _check_plan_against_vllm_rules(res, out)
    _check_plan_against_vllm_rules(outputs["mm-attn"], outputs["base"] / "mm-attn")


def test_minimax_m2_refuses_explicit_in_memory(outputs, tmp_path):
    result = CliRunner().invoke(
        main,
        [
            "apply",
            "--recipe",
            "mxfp4-moe",
            "--model",
            str(outputs["mm_src"]),
            "--output",
            str(tmp_path / "o"),
            "--path",
            "in-memory",
        ],
    )
    assert result.exit_code == 2 and "per-shard" in result.stderr and not (tmp_path / "o").exists()
