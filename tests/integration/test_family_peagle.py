# tier: integration
"""P-EAGLE (PEagleDraftModel): the bundled tiny EAGLE-3 draft re-labelled as P-EAGLE with its `mask_hidden` buffer,
through apply --recipe fp8-draft, check --vllm off and deploy, whose speculative config turns on vLLM's
`parallel_drafting` (a SpeculativeConfig field) with method eagle3."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from quantkit.cli import main
from quantkit.naming.archs import family_of, parallel_drafting, runtime_layers
from tests.fixtures.checkpoints import write_checkpoint

ROOT = Path(__file__).parents[2]
DRAFT, TARGET = ROOT / "examples" / "tiny" / "eagle3-draft", ROOT / "examples" / "tiny" / "target"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    base = tmp_path_factory.mktemp("peagle")
    # the mask token: vLLM's parallel drafting reads `mask_token_id` (SpecForge passes it to training, the user adds
    # it to config.json; check's draft-mask-token rule asks for it)
    config = {**json.loads((DRAFT / "config.json").read_text()), "architectures": ["PEagleDraftModel"],
              "mask_token_id": 3}  # fmt: skip
    tensors = load_file(str(DRAFT / "model.safetensors"))
    tensors["mask_hidden"] = (torch.randn(3 * config["hidden_size"], generator=torch.Generator().manual_seed(5))
                              * 0.05).to(torch.bfloat16)  # fmt: skip
    src = write_checkpoint(base / "draft", tensors, config)
    dst = base / "draft-fp8"
    runner = CliRunner()
    applied = runner.invoke(main, ["apply", "--recipe", "fp8-draft", "--model", str(src), "--target", str(TARGET),
                                   "--output", str(dst), "--json"])  # fmt: skip
    assert applied.exit_code == 0, applied.output
    checked = runner.invoke(main, ["check", str(dst), "--target", str(TARGET), "--vllm", "off", "--json"])
    deployed = runner.invoke(main, ["deploy", str(dst), "--target", str(TARGET), "--out", str(base / "deploy"),
                                    "--json"])  # fmt: skip
    out = {k: v for f in sorted(dst.glob("*.safetensors")) for k, v in load_file(str(f)).items()}
    return {"config": config, "src": tensors, "out": out, "check": checked, "deploy": deployed}


def test_record_and_names(run):
    assert family_of(run["config"]).name == "peagle" and parallel_drafting(run["config"])
    names = [layer.name for layer in runtime_layers(run["config"], list(run["src"]), 4)]
    assert names[0] == "model.fc" and names[-1] == "lm_head" and "model.layers.4.self_attn.qkv_proj" in names


def test_check_deploy_parallel_drafting(run):
    """check --vllm off passes; deploy refuses in one line: vLLM 0.32 cannot build a PEagleDraftModel config.json
    (its EAGLEConfig renames the architecture to Eagle3PEagleDraftModel, in no registry; measured in
    tests/integration/test_new_pairs_vllm.py)."""
    from vllm.config.speculative import SpeculativeConfig

    assert run["check"].exit_code == 0, run["check"].output
    assert json.loads(run["check"].stdout)["ok"] is True
    assert run["deploy"].exit_code == 2 and run["deploy"].stderr.count("error:") == 1, run["deploy"].output
    assert "Eagle3PEagleDraftModel" in run["deploy"].stderr and "--vllm off" in run["deploy"].stderr
    assert typing.get_type_hints(SpeculativeConfig)["parallel_drafting"] is bool  # vLLM's own field


def test_mask_hidden_kept_as_stored(run):
    src, out = run["src"], run["out"]
    assert torch.equal(out["mask_hidden"].view(torch.uint8), src["mask_hidden"].view(torch.uint8))
    assert out["midlayer.self_attn.q_proj.weight"].dtype == torch.float8_e4m3fn
