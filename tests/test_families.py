"""The family registry (quantkit.naming.archs): one record per family or draft layout, the only source of what a
checkpoint is; a draft whose config names a registered draft layout is a draft wherever quantkit asks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from click.testing import CliRunner

from quantkit.cli import main
from quantkit.deploy.manifest import deploy_manifest
from quantkit.naming.archs import is_draft, model_kind
from quantkit.vocab import EAGLE3_DRAFT


def _qwen3_draft(tiny: Path, out: Path) -> Path:
    """The bundled EAGLE-3 draft, its config naming Eagle3Qwen3ForCausalLM directly (no speculators_model_type):
    the layout vLLM's registry maps to qwen3_eagle3.py."""
    shutil.copytree(tiny / "eagle3-draft", out)
    config = json.loads((out / "config.json").read_text())
    config["architectures"] = ["Eagle3Qwen3ForCausalLM"]
    config["model_type"] = "qwen3"
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def test_eagle3_qwen3_architecture_is_a_draft(tiny, tmp_path):
    """Before the one registry, naming/drafts.py had its own list of draft architectures without Eagle3Qwen3ForCausalLM,
    so this draft was a dense target for apply, deploy and inspect."""
    draft = _qwen3_draft(tiny, tmp_path / "draft")
    config = json.loads((draft / "config.json").read_text())
    assert is_draft(config) and model_kind(config) == EAGLE3_DRAFT

    res = CliRunner().invoke(main, ["inspect", str(draft), "--json"])
    assert res.exit_code == 0, res.output
    shown = json.loads(res.stdout)
    assert shown["model_kind"] == EAGLE3_DRAFT and shown["target_num_layers"] is None
    names = {layer["name"] for layer in shown["layers"]}
    assert "model.layers.{N}.qkv_proj" in names and "model.fc" in names  # qwen3_eagle3.py's own qkv_proj prefix

    res = CliRunner().invoke(main, ["apply", "--recipe", "fp8-draft", "--model", str(draft), "--target",
                                    str(tiny / "target"), "--output", str(tmp_path / "out"), "--dry-run", "--json"])
    assert res.exit_code == 0, res.output
    assert "dense-target" not in res.output
    plan = json.loads(res.stdout)
    assert plan["model_kind"] == EAGLE3_DRAFT and plan["target_num_layers"] == 4

    manifest = deploy_manifest(draft, tiny / "target")
    assert manifest.draft is not None and "--speculative-config" in manifest.command
