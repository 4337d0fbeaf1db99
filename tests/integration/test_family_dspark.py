# tier: integration
"""DSpark drafts. The name collision: `DSparkDraftModel` is DeepSeek-V4's DSpark class in vLLM's registry, and SpecForge
writes the same string for Qwen3-based drafts (model_type qwen3); both resolve, each to a one-line answer naming the
class vLLM builds. A Qwen3 DSpark draft (Qwen3DSparkModel: DFlash's backbone + Markov and confidence heads) goes through
inspect, apply --recipe fp8-draft, check --vllm off and deploy with `"method": "dspark"`."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from quantkit.cli import main
from quantkit.naming.archs import family_of, runtime_layers, speculative_method
from quantkit.naming.layers import CheckpointLayoutError
from tests.fixtures.checkpoints import write_checkpoint
from tests.integration.test_family_dflash import CONFIG as DFLASH_CONFIG
from tests.integration.test_family_dflash import TARGET, H, V, dflash_tensors
from tests.unit.test_families_listing import VLLM_REGISTRY

RANK = 16
CONFIG = {**DFLASH_CONFIG, "architectures": ["Qwen3DSparkModel"], "markov_rank": RANK, "enable_confidence_head": True}


def dspark_tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(17)
    out = dflash_tensors()
    out["markov_head.markov_w1.weight"] = (torch.randn(V, RANK, generator=g) * 0.05).to(torch.bfloat16)
    out["markov_head.markov_w2.weight"] = (torch.randn(V, RANK, generator=g) * 0.05).to(torch.bfloat16)
    out["confidence_head.proj.weight"] = torch.randn(1, H, generator=g) * 0.05
    out["confidence_head.proj.bias"] = torch.zeros(1)
    return out


def _registry() -> dict[str, str]:
    """vLLM's registry entries, architecture -> class name, read from registry.py's dict literals."""
    out = {}
    for node in ast.walk(ast.parse(VLLM_REGISTRY.read_text())):
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values, strict=True):
                if isinstance(k, ast.Constant) and isinstance(v, ast.Tuple) and len(v.elts) >= 2:
                    out[k.value] = v.elts[1].value  # type: ignore[attr-defined]
    return out


def test_the_name_collision_resolves_both_ways():
    registry = _registry()
    assert registry["DSparkDraftModel"] == "DSparkDeepseekV4ForCausalLM"  # what vLLM builds for the string
    assert registry["Qwen3DSparkModel"] == "Qwen3DSparkForCausalLM"
    specforge = {"architectures": ["DSparkDraftModel"], "model_type": "qwen3", "num_hidden_layers": 1}
    deepseek = {"architectures": ["DSparkDraftModel"], "model_type": "deepseek_v4", "num_hidden_layers": 1}
    assert family_of(specforge).name == family_of(deepseek).name == "dspark_draft"
    with pytest.raises(CheckpointLayoutError) as e:
        runtime_layers(specforge, ["fc.weight"], 4)
    assert "SpecForge's Qwen3 DSpark draft" in str(e.value) and '["Qwen3DSparkModel"]' in str(e.value)
    assert "DSparkDeepseekV4ForCausalLM" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(CheckpointLayoutError) as e:
        runtime_layers(deepseek, ["fc.weight"], 4)
    assert "DeepSeek-V4's DSpark draft" in str(e.value) and "Qwen3DSparkModel" not in str(e.value)


def test_qwen3_dspark_names_keep_the_heads():
    assert family_of(CONFIG).name == "qwen3_dspark" and speculative_method(CONFIG) == "dspark"
    layers = {layer.name: layer for layer in runtime_layers(CONFIG, list(dspark_tensors()), 4)}
    for head in ("model.markov_head.markov_w1", "model.markov_head.markov_w2", "model.confidence_head.proj"):
        assert layers[head].quantizable is False, head
    assert "model.layers.4.self_attn.qkv_proj" in layers


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    base = tmp_path_factory.mktemp("dspark")
    src = write_checkpoint(base / "draft", dspark_tensors(), CONFIG)
    dst = base / "draft-fp8"
    runner = CliRunner()
    applied = runner.invoke(main, ["apply", "--recipe", "fp8-draft", "--model", str(src), "--target", str(TARGET),
                                   "--output", str(dst), "--json"])  # fmt: skip
    assert applied.exit_code == 0, applied.output
    checked = runner.invoke(main, ["check", str(dst), "--target", str(TARGET), "--vllm", "off", "--json"])
    deployed = runner.invoke(main, ["deploy", str(dst), "--target", str(TARGET), "--out", str(base / "deploy"),
                                    "--json"])  # fmt: skip
    return {"src": src, "out": dst, "check": checked, "deploy": deployed}


def _tensors(folder: Path):
    from safetensors import safe_open

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), "pt") as s:
            out |= {k: s.get_tensor(k) for k in s.keys()}
    return out


def test_apply_check_deploy_and_heads_kept(run):
    assert run["check"].exit_code == 0, run["check"].output
    assert json.loads(run["check"].stdout)["ok"] is True
    assert run["deploy"].exit_code == 0, run["deploy"].output
    assert json.loads(run["deploy"].stdout)["speculative_config"]["method"] == "dspark"
    src, out = _tensors(run["src"]), _tensors(run["out"])
    assert out["layers.0.mlp.gate_proj.weight"].dtype == torch.float8_e4m3fn
    for name in ("markov_head.markov_w1.weight", "markov_head.markov_w2.weight", "confidence_head.proj.weight",
                 "confidence_head.proj.bias"):  # fmt: skip
        assert out[name].dtype == src[name].dtype and torch.equal(
            out[name].view(torch.uint8), src[name].view(torch.uint8)
        ), name
