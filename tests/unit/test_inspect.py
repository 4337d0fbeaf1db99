# tier: unit
"""`quantkit inspect`: per-layer vLLM precision and reason from headers only, on a header-only synthetic DeepSeek-V3-style MXFP4 checkpoint (benchmarks/inspect_large.py writes it) and on real `apply` outputs (what a fresh process imports is in tests/e2e/test_inspect_imports.py)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from quantkit.check.inspect import inspect_checkpoint
from quantkit.check.run import run as check_checkpoint
from quantkit.cli import main
from quantkit.naming.precision import classify_scheme

ROOT = Path(__file__).resolve().parents[2]


def _benchmark_module():
    spec = importlib.util.spec_from_file_location("inspect_large", ROOT / "benchmarks" / "inspect_large.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> Path:
    """8 layers (3 dense) x 64 experts, small dimensions, data region sparse."""
    folder = tmp_path_factory.mktemp("synthetic") / "deepseek"
    facts = _benchmark_module().write_synthetic_deepseek(folder, layers=8, experts=64, small=True)
    assert facts["tensors"] == 3 + 8 * 9 + 3 * 3 + 5 * (2 + 3 + 64 * 6)
    return folder


def test_synthetic_deepseek_groups(synthetic):
    r = inspect_checkpoint(synthetic)
    assert r.architecture == "DeepseekV3ForCausalLM" and r.model_kind == "moe-target"
    rows = [(g.pattern, g.count, g.precision, g.source) for g in r.groups]
    attn = [
        (f"model.layers.{{0-7}}.self_attn.{p}", 8, "BF16", "exclude")
        for p in ("fused_qkv_a_proj", "q_b_proj", "kv_b_proj", "o_proj")
    ]
    assert rows == [
        ("model.embed_tokens", 1, "BF16", "never_quantized"),
        *attn,
        ("model.layers.{0-2}.mlp.gate_up_proj", 3, "BF16", "exclude"),
        ("model.layers.{0-2}.mlp.down_proj", 3, "BF16", "exclude"),
        ("model.layers.{3-7}.mlp.gate", 5, "BF16", "never_quantized"),  # DeepSeek's router: no quant_config
        ("model.layers.{3-7}.mlp.shared_experts.gate_up_proj", 5, "BF16", "exclude"),
        ("model.layers.{3-7}.mlp.shared_experts.down_proj", 5, "BF16", "exclude"),
        ("model.layers.{3-7}.mlp.experts", 5, "MXFP4", "global_quant_config"),
        ("lm_head", 1, "BF16", "never_quantized"),
    ]
    experts = next(g for g in r.groups if g.pattern.endswith("mlp.experts"))
    assert experts.experts == 64
    # sizes from the headers: per expert gate/up uint8 [64, 128] + [64, 8], down [256, 32] + [256, 2]
    per_expert = 2 * (64 * 128 + 64 * 8) + (256 * 32 + 256 * 2)
    assert r.bytes_by_precision["MXFP4"] == experts.bytes == 5 * 64 * per_expert
    assert r.total_bytes == sum(r.bytes_by_precision.values()) + r.other_bytes
    assert r.other_bytes > 0 and r.num_tensors == 2029
    gate = next(g for g in r.groups if g.pattern.endswith("mlp.gate"))
    assert "never quantizes this router" in gate.reason


def test_synthetic_deepseek_check(synthetic):
    """check on the same header-only checkpoint: zero scale bytes are valid E8M0 (2^-127); TP 4 splits the 64-wide
    expert intermediate size into 16 columns per shard, below the MXFP4 group of 32 (TP 2: 32, fine)."""
    # its 64-wide experts are padded to AITER W4A4's 128 on gfx950 (kernel-paths: oracle/mxfp4.py round-up): +100%
    r1 = check_checkpoint(synthetic, vllm="off")
    assert r1.codes() == {("moe-padding", "model.layers.{3-7}.mlp.experts (x5)")} and r1.ok
    assert "100% extra" in r1.findings[0].message
    assert check_checkpoint(synthetic, vllm="off", tp=2).ok
    r = check_checkpoint(synthetic, vllm="off", tp=4)
    assert r.codes("error") == {("tp-mxfp4-group", f"model.layers.{i}.mlp.experts") for i in range(3, 8)}


def test_cli_json_and_table(synthetic):
    res = CliRunner().invoke(main, ["inspect", str(synthetic), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert {g["pattern"] for g in data["groups"]} >= {"model.layers.{3-7}.mlp.experts", "lm_head"}
    assert len(data["layers"]) == 1 + 8 * 4 + 3 * 2 + 5 * 4 + 1
    res = CliRunner().invoke(main, ["inspect", str(synthetic)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "model.layers.{3-7}.mlp.experts (64 experts)" in res.stdout and "MXFP4" in res.stdout


def test_cli_bad_input_is_one_line(tmp_path):
    res = CliRunner().invoke(main, ["inspect", str(tmp_path / "nowhere")])
    assert res.exit_code == 2 and res.stderr.startswith("error: ") and len(res.stderr.strip().splitlines()) == 1


def test_unquantized_checkpoint(tiny):
    r = inspect_checkpoint(tiny / "target")
    assert {g.precision for g in r.groups} == {"BF16"} and {g.source for g in r.groups} == {"no_quantization_config"}
    assert ("model.layers.{0-3}.mlp.down_proj", 4) in [(g.pattern, g.count) for g in r.groups]


def test_real_draft_with_and_without_target(tiny, tiny_outputs):
    draft = tiny_outputs["fp8-draft"]
    with_target = CliRunner().invoke(main, ["inspect", str(draft), "--target", str(tiny / "target"), "--json"])
    assert with_target.exit_code == 0, with_target.output
    layers = {lp["name"]: lp for lp in json.loads(with_target.stdout)["layers"]}
    assert layers["model.fc"]["precision"] == "BF16" and layers["model.fc"]["entry"] == "model.fc"
    assert "exact runtime name" in layers["model.fc"]["reason"]
    assert layers["model.layers.4.mlp.down_proj"]["precision"] == "FP8 per-channel (ptpc)"
    assert layers["model.layers.4.mlp.down_proj"]["source"] == "global_quant_config"
    assert layers["lm_head"]["source"] == "never_quantized"
    names = {lp.name for lp in inspect_checkpoint(draft).layers}
    assert "model.layers.{N}.self_attn.qkv_proj" in names


def test_real_attention_override(tiny_outputs):
    r = inspect_checkpoint(tiny_outputs["mxfp4-moe-attn-fp8"])
    by = {g.pattern: g for g in r.groups}
    qkv = by["model.layers.{0-1}.self_attn.qkv_proj"]
    assert qkv.precision == "FP8 per-channel (ptpc)" and qkv.source == "layer_quant_config"
    assert by["model.layers.{0-1}.mlp.gate"].source == "exclude"
    assert (
        by["model.layers.{0-1}.mlp.experts"].precision == "MXFP4" and by["model.layers.{0-1}.mlp.experts"].experts == 8
    )
    assert set(r.bytes_by_precision) == {"BF16", "MXFP4", "FP8 per-channel (ptpc)"}


def _fp8(qscheme: str, dynamic: bool = False, **kw) -> dict:
    return {"dtype": "fp8_e4m3", "qscheme": qscheme, "is_dynamic": dynamic, "symmetric": True, **kw}


@pytest.mark.parametrize(("cfg", "precision", "static_input"), [
    ({"weight": _fp8("per_channel"), "input_tensors": _fp8("per_channel", True)}, "FP8 per-channel (ptpc)", False),
    ({"weight": _fp8("per_tensor"), "input_tensors": _fp8("per_tensor")}, "FP8 per-tensor", True),
    ({"weight": _fp8("per_channel"), "input_tensors": _fp8("per_tensor", True)}, "FP8 per-channel", False),
    ({"weight": _fp8("per_block", block_size=[128, 128]),
      "input_tensors": _fp8("per_group", True, group_size=128)}, "FP8 per-block 128x128", False),
    ({"weight": {"dtype": "fp4", "qscheme": "per_group", "group_size": 32, "scale_format": "e8m0"},
      "input_tensors": None}, "MXFP4", False),
    ({"weight": {"dtype": "int8", "qscheme": "per_channel", "symmetric": True},
      "input_tensors": {"dtype": "int8", "qscheme": "per_channel", "is_dynamic": True}}, "other (INT8 W8A8)", False),
])  # fmt: skip
def test_classify_scheme(cfg, precision, static_input):
    s = classify_scheme(cfg)
    assert (s.precision, s.static_input, s.problem) == (precision, static_input, None)


@pytest.mark.parametrize("cfg", [
    {"weight": _fp8("per_channel"), "input_tensors": None},  # FP8 weight-only: no vLLM scheme
    {"weight": _fp8("per_channel"), "input_tensors": _fp8("per_channel", True), "output_tensors": _fp8("per_tensor")},
    None,
])  # fmt: skip
def test_classify_scheme_rejections(cfg):
    assert classify_scheme(cfg).problem
