# tier: unit
"""`quantkit check` on real `apply` outputs (the session's native applies), each damaged on purpose, asserting the exact findings (code + layer); the clean outputs pass; bad input exits 2 with one line. The real vLLM loads and the numeric check are in tests/integration/test_check.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from quantkit.check.run import run as check_checkpoint
from quantkit.cli import main


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def edit_config(folder: Path, fn) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    fn(cfg)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))


def edit_tensors(folder: Path, fn) -> None:
    """Rewrite an apply output's safetensors shards after `fn` changed its tensors dict (all shards merged): each
    tensor goes back to its shard, a new one to the first shard, and the index follows."""
    shards = sorted(folder.glob("*.safetensors"))
    home = {}
    tensors = {}
    for path in shards:
        for name, t in load_file(str(path)).items():
            tensors[name], home[name] = t, path.name
    fn(tensors)
    for path in shards:
        mine = {n: t for n, t in tensors.items() if home.get(n, shards[0].name) == path.name}
        save_file(mine, str(path), metadata={"format": "pt"})
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        data = json.loads(index.read_text())
        data["weight_map"] = {n: home.get(n, shards[0].name) for n in tensors}
        index.write_text(json.dumps(data))


def errors(result) -> set[tuple[str, str]]:
    return result.codes("error")


def check(folder: Path, **kwargs):
    kwargs.setdefault("vllm", "off")
    return check_checkpoint(folder, **kwargs)


def test_clean_fp8_draft_with_target_passes(tiny, tiny_outputs):
    r = check(tiny_outputs["fp8-draft"], target=tiny / "target")
    assert r.findings == [] and r.ok
    by_name = {lp.name: lp for lp in r.layers}
    assert by_name["model.fc"].precision == "BF16" and by_name["model.fc"].source == "exclude"
    assert by_name["model.layers.4.self_attn.qkv_proj"].precision == "FP8 per-channel (ptpc)"
    assert by_name["lm_head"].source == "never_quantized"


@pytest.mark.parametrize("recipe", ["mxfp4-moe", "mxfp4-moe-attn-fp8", "fp8-target"])
def test_clean_targets_pass(tiny_outputs, recipe):
    r = check(tiny_outputs[recipe], tp=4)
    # the tiny experts' 128-wide intermediate is 32 per rank at TP 4, which AITER W4A4 pads to 128 (kernel-paths):
    # a cost finding, not a load problem
    pads = [f for f in r.findings if f.code == "moe-padding"]
    assert len(pads) == (recipe != "fp8-target") and r.ok
    assert [f for f in r.findings if f.code != "moe-padding"] == [], [f.to_dict() for f in r.findings]


def test_draft_without_target_is_info_only(tiny_outputs):
    r = check(tiny_outputs["fp8-draft"])
    assert r.ok and r.codes() == {("target-unknown", "--target")}
    assert any(lp.name == "model.layers.{N}.mlp.down_proj" for lp in r.layers)


def test_1_quark_style_exclude_on_draft(tiny, tiny_outputs, tmp_path):
    """The case on AMD's Kimi-K2.5 EAGLE-3 FP8 card: Quark's checkpoint names leave model.fc quantized in vLLM."""
    bad = copy(tiny_outputs["fp8-draft"], tmp_path / "d")
    edit_config(bad, lambda c: c["quantization_config"].update(exclude=["fc", "lm_head"]))
    r = check(bad, target=tiny / "target")
    assert errors(r) == {("exclude-not-applied", "model.fc")}
    (f,) = r.errors
    assert "'fc'" in f.message and "BF16" in f.message
    assert 'write "exclude": ["model.fc", "lm_head"]' in f.fix and "re:model\\.fc$" in f.fix
    # and the same through the CLI: exit 1, the finding in --json
    res = CliRunner().invoke(main, ["check", str(bad), "--target", str(tiny / "target"), "--vllm", "off", "--json"])
    assert res.exit_code == 1, res.output
    out = json.loads(res.stdout)
    assert out["ok"] is False and [(f["code"], f["layer_or_tensor"]) for f in out["findings"]] == [
        ("exclude-not-applied", "model.fc")
    ]


@pytest.mark.parametrize("recipe", ["fp8-target", "mxfp4-moe-attn-fp8"])
def test_2_only_q_proj_of_fused_qkv_excluded(tiny_outputs, tmp_path, recipe):
    bad = copy(tiny_outputs[recipe], tmp_path / "t")
    edit_config(bad, lambda c: c["quantization_config"]["exclude"].append("model.layers.1.self_attn.q_proj"))
    r = check(bad)
    assert errors(r) == {("partial-fused-exclusion", "model.layers.1.self_attn.qkv_proj")}
    (f,) = r.errors
    assert "k_proj" in f.message and "model.layers.1.self_attn.qkv_proj" in f.fix


def test_3_quantized_lm_head_in_draft(tiny, tiny_outputs, tmp_path):
    bad = copy(tiny_outputs["fp8-draft"], tmp_path / "d")

    def quantize_head(t):
        w = t["lm_head.weight"].float()
        scale = w.abs().amax(dim=1) / 448.0
        t["lm_head.weight"] = (w / scale[:, None]).to(torch.float8_e4m3fn)
        t["lm_head.weight_scale"] = scale.to(torch.bfloat16)

    edit_tensors(bad, quantize_head)
    r = check(bad, target=tiny / "target")
    assert errors(r) == {("lm-head-quantized", "lm_head")}


def test_4_one_expert_weight_scale_missing(tiny_outputs, tmp_path):
    bad = copy(tiny_outputs["mxfp4-moe"], tmp_path / "m")
    missing = "model.layers.1.mlp.experts.3.down_proj.weight_scale"
    edit_tensors(bad, lambda t: t.pop(missing))
    r = check(bad)
    assert errors(r) == {("scale-missing", missing)}


def test_5_nan_inf_zero_fp8_scales(tiny, tiny_outputs, tmp_path):
    bad = copy(tiny_outputs["fp8-draft"], tmp_path / "d")

    def damage(t):
        t["midlayer.self_attn.q_proj.weight_scale"][3] = float("nan")
        t["midlayer.self_attn.o_proj.weight_scale"][0] = float("inf")
        t["midlayer.mlp.down_proj.weight_scale"][7] = 0.0

    edit_tensors(bad, damage)
    r = check(bad, target=tiny / "target")
    assert errors(r) == {
        ("scale-not-finite", "midlayer.self_attn.q_proj.weight_scale"),
        ("scale-not-finite", "midlayer.self_attn.o_proj.weight_scale"),
        ("scale-not-positive", "midlayer.mlp.down_proj.weight_scale"),
    }


def test_5_e8m0_0xff_scale_is_nan(tiny_outputs, tmp_path):
    bad = copy(tiny_outputs["mxfp4-moe"], tmp_path / "m")
    name = "model.layers.0.mlp.experts.5.gate_proj.weight_scale"

    def damage(t):
        t[name][2, 1] = 0xFF

    edit_tensors(bad, damage)
    r = check(bad)
    assert errors(r) == {("scale-e8m0-nan", name)}
    assert "[2, 1]" in r.errors[0].message


def test_6_mxfp4_input_dim_per_shard_not_divisible_by_32(tiny_outputs):
    """moe_intermediate_size 128: down_proj input per shard is 128/8 = 16 at --tp 8 (fine at --tp 4: 32)."""
    r = check(tiny_outputs["mxfp4-moe"], tp=8)
    assert errors(r) == {
        ("tp-mxfp4-group", "model.layers.0.mlp.experts"),
        ("tp-mxfp4-group", "model.layers.1.mlp.experts"),
    }
    assert "use --tp 4" in r.errors[0].fix
    assert check(tiny_outputs["mxfp4-moe"], tp=4).ok


@pytest.mark.parametrize("key", ["export", "layer_type_quant_config", "exclude", "global_quant_config"])
def test_7_required_key_missing(tiny_outputs, tmp_path, key):
    bad = copy(tiny_outputs["mxfp4-moe"], tmp_path / "m")
    edit_config(bad, lambda c: c["quantization_config"].pop(key))
    r = check(bad)
    assert ("config-key-missing", f"quantization_config.{key}") in errors(r)
    if key != "exclude":  # without exclude the router/attention/lm_head exclusions are gone as well
        assert errors(r) == {("config-key-missing", f"quantization_config.{key}")}


def _bad_input(folder: Path) -> str:
    res = CliRunner().invoke(main, ["check", str(folder), "--vllm", "off"])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "Traceback" not in res.output and res.stdout == ""
    return lines[0]


def test_8_truncated_shard(tiny_outputs, tmp_path):
    bad = copy(tiny_outputs["mxfp4-moe"], tmp_path / "m")
    path = sorted(bad.glob("*.safetensors"))[0]  # per shard (the default path) keeps the source's shard names
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    assert path.name in _bad_input(bad)


def test_8_index_names_a_missing_file(tiny_outputs, tmp_path):
    bad = copy(tiny_outputs["mxfp4-moe"], tmp_path / "m")
    from quantkit.io.headers import checkpoint_tensors

    tensors = checkpoint_tensors(bad)
    weight_map = {n: info.file for n, info in tensors.items()}
    weight_map[sorted(tensors)[-1]] = "model-00009-of-00009.safetensors"
    (bad / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    assert "model-00009-of-00009.safetensors" in _bad_input(bad)


def test_8_corrupt_header_json(tiny_outputs, tmp_path):
    bad = copy(tiny_outputs["fp8-draft"], tmp_path / "d")
    path = bad / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[8:12] = b"#!?{"  # the header's first bytes: no longer JSON, same length
    path.write_bytes(bytes(data))
    line = _bad_input(bad)
    assert "not valid JSON" in line and "model.safetensors" in line


def test_8_not_a_checkpoint(tmp_path):
    assert "not found" in _bad_input(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    assert "config.json" in _bad_input(tmp_path / "empty")


def test_9_router_left_quantized_in_vllm(tiny_outputs, tmp_path):
    """Qwen3-MoE's router is a GateLinear built with quant_config: dropped from exclude, vLLM quantizes it."""
    bad = copy(tiny_outputs["mxfp4-moe"], tmp_path / "m")
    edit_config(bad, lambda c: c["quantization_config"]["exclude"].remove("re:model\\.layers\\.\\d+\\.mlp\\.gate$"))
    r = check(bad)
    assert errors(r) == {
        ("router-quantized", "model.layers.0.mlp.gate"),
        ("router-quantized", "model.layers.1.mlp.gate"),
    }
    assert "MXFP4" in r.errors[0].message and "re:model\\\\.layers\\\\.\\\\d+\\\\.mlp\\\\.gate$" in r.errors[0].fix


def test_9_router_tensor_quantized(tiny_outputs, tmp_path):
    bad = copy(tiny_outputs["mxfp4-moe-attn-fp8"], tmp_path / "m")

    def damage(t):
        w = t["model.layers.1.mlp.gate.weight"].float()
        t["model.layers.1.mlp.gate.weight"] = w.to(torch.float8_e4m3fn)
        t["model.layers.1.mlp.gate.weight_scale"] = torch.ones(w.shape[0], dtype=torch.bfloat16)

    edit_tensors(bad, damage)
    r = check(bad)
    assert errors(r) == {("router-quantized", "model.layers.1.mlp.gate")}


def test_10_aux_layer_id_beyond_target(tiny, tiny_outputs, tmp_path):
    bad = copy(tiny_outputs["fp8-draft"], tmp_path / "d")

    def ids(c):
        c["eagle_aux_hidden_state_layer_ids"] = [1, 2, 9]
        c["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [1, 2, 9]

    edit_config(bad, ids)
    r = check(bad, target=tiny / "target")
    assert errors(r) == {("aux-layer-out-of-range", "eagle_aux_hidden_state_layer_ids")}
    assert "[9]" in r.errors[0].message and "0..4" in r.errors[0].message


def test_bf16_layer_that_vllm_quantizes(tiny, tiny_outputs, tmp_path):
    bad = copy(tiny_outputs["fp8-draft"], tmp_path / "d")
    edit_config(bad, lambda c: c["quantization_config"].update(exclude=["lm_head"]))
    r = check(bad, target=tiny / "target")
    assert errors(r) == {("weight-not-quantized", "model.fc")}
    assert '["model.fc", "lm_head"]' in r.errors[0].fix


def test_quantized_tensor_in_excluded_layer(tiny, tiny_outputs, tmp_path):
    bad = copy(tiny_outputs["fp8-target"], tmp_path / "t")
    edit_config(bad, lambda c: c["quantization_config"]["exclude"].append("re:model\\.layers\\.0\\.mlp\\.down_proj$"))
    r = check(bad)
    assert errors(r) == {("unexpected-quantized-tensor", "model.layers.0.mlp.down_proj")}


def test_draft_vocab_maps(tiny, tiny_outputs, tmp_path):
    bad = copy(tiny_outputs["fp8-draft"], tmp_path / "d")

    def damage(t):
        t["d2t"][10] += 1

    edit_tensors(bad, damage)
    assert errors(check(bad, target=tiny / "target")) == {("d2t-t2d-mismatch", "d2t")}
    gone = copy(tiny_outputs["fp8-draft"], tmp_path / "d2")
    edit_tensors(gone, lambda t: t.pop("d2t"))
    assert errors(check(gone, target=tiny / "target")) == {("d2t-missing", "d2t")}


def test_hidden_size_and_vocab_against_target(tiny, tiny_outputs, tmp_path):
    other = copy(tiny / "target", tmp_path / "other-target")
    edit_config(other, lambda c: c.update(hidden_size=512, vocab_size=4096))
    r = check(tiny_outputs["fp8-draft"], target=other)
    assert errors(r) == {("hidden-size-mismatch", "model.fc"), ("vocab-size-mismatch", "vocab_size")}


def test_not_quark_and_unmatched_entries(tiny_outputs, tmp_path):
    bad = copy(tiny_outputs["fp8-target"], tmp_path / "t")
    edit_config(bad, lambda c: c["quantization_config"]["exclude"].append("model.layers.7.mlp.down_proj"))
    edit_config(
        bad,
        lambda c: c["quantization_config"]["layer_quant_config"].update(
            {"layers.0.self_attn.o_proj": c["quantization_config"]["global_quant_config"]}
        ),
    )
    r = check(bad)
    assert r.ok and r.codes("warning") == {
        ("exclude-unmatched", "model.layers.7.mlp.down_proj"),
        ("layer-config-unmatched", "layer_quant_config.layers.0.self_attn.o_proj"),
    }
    edit_config(
        bad,
        lambda c: c["quantization_config"].update(
            layer_type_quant_config={"QuarkLinear": c["quantization_config"]["global_quant_config"]}
        ),
    )
    assert ("layer-type-config-ignored", "quantization_config.layer_type_quant_config") in check(bad).codes("warning")
    edit_config(bad, lambda c: c["quantization_config"].update(quant_method="fp8"))
    assert ("not-quark", "quantization_config.quant_method") in errors(check(bad))


def test_platform_notes(tiny_outputs):
    assert check(tiny_outputs["fp8-target"], platform="gfx942").codes() == {("platform-fp8-fnuz", "platform")}
    r = check(tiny_outputs["mxfp4-moe"], platform="gfx942")
    # W4A4 experts on gfx942: vLLM 0.32's EMULATION backend (quantkit.rules.kernels, tests/integration/test_kernels.py)
    assert r.ok and r.codes("warning") == {("moe-emulated", "model.layers.{0-1}.mlp.experts (x2)")}
    assert check(tiny_outputs["mxfp4-moe"], platform="gfx950").findings == []
