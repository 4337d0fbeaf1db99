# tier: unit
"""`quantkit apply` at the user's boundary, in-process: the CLI, the files it writes and every bad input (what vLLM loads is in tests/integration/test_apply.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from click.testing import CliRunner
from safetensors.torch import save_file

from quantkit.cli import main
from tests.fixtures.checkpoints import tensors


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))
        if a.dtype != torch.bool
        else torch.equal(a, b)
    )


def test_fp8_draft_output_files(tiny, fp8_draft):
    out, report = fp8_draft
    src_cfg = json.loads((tiny / "eagle3-draft" / "config.json").read_text())
    cfg = json.loads((out / "config.json").read_text())
    # vLLM's runtime names (llama_eagle3.py: the draft's fc is `model.fc`), not Quark's ["fc", "lm_head"].
    assert cfg["quantization_config"]["exclude"] == ["model.fc", "lm_head"]
    assert report["exclude"] == ["model.fc", "lm_head"]
    assert report["quark_exclude"] == ["fc", "lm_head"]
    qc = cfg["quantization_config"]
    assert qc["quant_method"] == "quark" and "export" in qc and "layer_type_quant_config" in qc
    assert qc["global_quant_config"]["weight"]["dtype"] == "fp8_e4m3"
    assert qc["global_quant_config"]["input_tensors"]["is_dynamic"] is True
    # every source config field kept; aux ids at the top level and in eagle_config
    for key, value in src_cfg.items():
        assert cfg[key] == value, key
    assert (
        cfg["eagle_aux_hidden_state_layer_ids"] == cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    )

    src, got = tensors(tiny / "eagle3-draft"), tensors(out)
    for name in (
        "fc.weight",
        "lm_head.weight",
        "d2t",
        "t2d",
        "norm.weight",
        "midlayer.hidden_norm.weight",
        "midlayer.input_layernorm.weight",
        "midlayer.post_attention_layernorm.weight",
    ):
        assert _same_bytes(src[name], got[name]), name
    for proj in (
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
    ):
        w, s = got[f"midlayer.{proj}.weight"], got[f"midlayer.{proj}.weight_scale"]
        assert w.dtype == torch.float8_e4m3fn and w.shape == src[f"midlayer.{proj}.weight"].shape
        assert s.numel() == w.shape[0] and torch.isfinite(s.float()).all() and (s.float() > 0).all()
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (out / f).read_bytes() == (tiny / "eagle3-draft" / f).read_bytes()
    manifest = json.loads((out / "quantkit.json").read_text())
    assert manifest["recipe"]["name"] == "fp8-draft" and manifest["target_num_layers"] == 4
    assert (
        set(manifest["source_files"]) == {"model.safetensors"}
        and len(manifest["source_files"]["model.safetensors"]) == 64
    )
    decisions = {d["runtime_name"]: d for d in manifest["layers"]}
    assert decisions["model.fc"]["action"] == "keep" and "three target hidden states" in decisions["model.fc"]["reason"]
    assert decisions["model.layers.4.self_attn.qkv_proj"]["action"] == "quantize"
    assert manifest["versions"]["amd-quark"] == "0.13"
    assert not list(out.parent.glob(".draft-fp8.quantkit-*")), "temporary folder left behind"


def _run_bad(args: list[str], output: Path) -> str:
    result = CliRunner().invoke(main, ["apply", *args, "--output", str(output)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output and result.stdout == ""
    assert not output.exists(), "an output folder was left behind"
    assert not list(output.parent.glob(f".{output.name}.quantkit-*")), "a temporary folder was left behind"
    return lines[0]


def test_unknown_recipe(tiny, tmp_path):
    line = _run_bad(["--recipe", "fp9-draft", "--model", str(tiny / "eagle3-draft")], tmp_path / "o")
    assert "fp9-draft" in line and "fp8-draft" in line


def test_draft_recipe_on_moe_target(tiny, tmp_path):
    line = _run_bad(["--recipe", "fp8-draft", "--model", str(tiny / "moe-target")], tmp_path / "o")
    assert "eagle3-draft" in line and "moe-target" in line and "Qwen3MoeForCausalLM" in line


def test_moe_recipe_on_dense_target(tiny, tmp_path):
    line = _run_bad(["--recipe", "mxfp4-moe", "--model", str(tiny / "target")], tmp_path / "o")
    assert "moe-target" in line and "dense-target" in line


def test_unsupported_architecture(tmp_path):
    src = tmp_path / "gpt2"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    save_file({"transformer.h.0.attn.c_attn.weight": torch.zeros(96, 32)}, str(src / "model.safetensors"))
    line = _run_bad(["--recipe", "fp8-target", "--model", str(src)], tmp_path / "o")
    assert "GPT2LMHeadModel" in line


def test_draft_missing_required_tensor(tiny, tmp_path):
    src = tmp_path / "draft"
    shutil.copytree(tiny / "eagle3-draft", src)
    state = tensors(src)
    del state["fc.weight"]
    save_file(state, str(src / "model.safetensors"))
    line = _run_bad(["--recipe", "fp8-draft", "--model", str(src)], tmp_path / "o")
    assert "fc.weight" in line


def test_output_exists_without_overwrite(tiny, tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = CliRunner().invoke(
        main, ["apply", "--recipe", "fp8-draft", "--model", str(tiny / "eagle3-draft"), "--output", str(out)]
    )
    assert result.exit_code == 2 and "--overwrite" in result.stderr and "Traceback" not in result.output
    assert (out / "keep.txt").read_text() == "mine" and sorted(p.name for p in out.iterdir()) == ["keep.txt"]


def test_source_missing(tmp_path):
    line = _run_bad(["--recipe", "fp8-draft", "--model", str(tmp_path / "nowhere")], tmp_path / "o")
    assert "nowhere" in line


def test_source_unreadable(tiny, tmp_path):
    src = tmp_path / "draft"
    shutil.copytree(tiny / "eagle3-draft", src)
    data = (src / "model.safetensors").read_bytes()
    (src / "model.safetensors").write_bytes(data[:1000])  # truncated mid-header
    line = _run_bad(["--recipe", "fp8-draft", "--model", str(src)], tmp_path / "o")
    assert "model.safetensors" in line


def test_per_shard_refused_for_static_activation_scales(tiny, tmp_path):
    recipe = tmp_path / "static.yaml"
    recipe.write_text(
        "name: static\ndescription: static fp8\napplies_to: dense-target\nscheme: fp8\n"
        "keep: [{role: lm_head, reason: logits}]\ncalibration: {samples: 4, seq_len: 32}\n"
    )
    line = _run_bad(["--recipe", str(recipe), "--model", str(tiny / "target"), "--path", "per-shard"], tmp_path / "o")
    assert "per-shard" in line and "input_scale" in line
