"""The command line as a user sees it: help, version, recipe views, the demo, and how light it is to start."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from quantkit import __version__
from quantkit.cli import main
from quantkit.paths import TINY_MODELS_DIR_ENV
from quantkit.recipes import load_recipe

HEAVY_MODULES = ["torch", "quark", "transformers", "vllm", "lm_eval", "safetensors", "numpy"]


def _run(*args: str) -> Any:
    return CliRunner().invoke(main, list(args))


def test_help_lists_commands_and_says_what_the_tool_does() -> None:
    result = _run("--help")
    assert result.exit_code == 0, result.output
    assert "Quantize MoE targets to MXFP4 and EAGLE-3 drafts to FP8" in result.stdout
    assert "recipes" in result.stdout and "demo" in result.stdout
    assert "apply -> check -> acceptance -> eval -> gate -> publish" in result.stdout


def test_version() -> None:
    result = _run("--version")
    assert result.exit_code == 0
    assert result.stdout == f"quantkit, version {__version__}\n"


def test_help_and_recipes_list_import_nothing_heavy() -> None:
    # A fresh interpreter: the test process itself may already hold torch from other tests.
    code = textwrap.dedent(
        """
        import contextlib, io, json, sys
        from quantkit.cli import main
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["--help"], standalone_mode=False) == 0
            main(["recipes", "list"], standalone_mode=False)
            main(["recipes", "list", "--json"], standalone_mode=False)
            main(["recipes", "show", "fp8-draft", "--json"], standalone_mode=False)
        print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = set(json.loads(out))
    assert "quantkit" in loaded and "click" in loaded  # the probe really ran the CLI
    assert loaded.isdisjoint(HEAVY_MODULES), sorted(loaded & set(HEAVY_MODULES))


def test_recipes_list_table() -> None:
    result = _run("recipes", "list")
    assert result.exit_code == 0, result.output
    for name, scheme in [("fp8-draft", "ptpc_fp8"), ("mxfp4-moe", "mxfp4"), ("mxfp4-moe-attn-fp8", "mxfp4")]:
        row = next(line for line in result.stdout.splitlines() if f" {name} " in line)
        assert scheme in row


def test_recipes_list_json() -> None:
    result = _run("recipes", "list", "--json")
    assert result.exit_code == 0, result.output
    items = json.loads(result.stdout)
    assert [r["name"] for r in items] == ["fp8-draft", "fp8-target", "mxfp4-moe", "mxfp4-moe-attn-fp8"]
    for item in items:
        assert Path(item.pop("source")) == load_recipe(item["name"]).source
        assert item == load_recipe(item["name"]).to_dict()


def test_recipes_show_json_is_to_dict() -> None:
    result = _run("recipes", "show", "fp8-draft", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data == load_recipe("fp8-draft").to_dict()
    assert data["scheme"] == "ptpc_fp8"
    assert [k["role"] for k in data["keep"]] == ["fc", "lm_head"]


def test_recipes_show_for_people_gives_reasons_and_scheme_facts() -> None:
    result = _run("recipes", "show", "mxfp4-moe-attn-fp8")
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())  # undo rich's wrapping
    assert "Kept in BF16" in text and "Overrides" in text
    assert "the router is tiny and accuracy-critical" in text
    assert "activations: MXFP4, dynamic" in text
    assert "ptpc_fp8" in text


def test_recipe_text_is_not_read_as_rich_markup(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(
        "name: r\ndescription: d\napplies_to: dense-target\nscheme: ptpc_fp8\n"
        "keep:\n  - role: lm_head\n    reason: '[bold]kept[/bold] as [AMD] does'\n"
    )
    result = _run("recipes", "show", str(path))
    assert result.exit_code == 0, result.output
    assert "[bold]kept[/bold] as [AMD] does" in result.stdout


# --- demo ---------------------------------------------------------------------------------------------------------


def _make_tiny_models(root: Path) -> None:
    """A sharded MoE-like target and a single-file draft, written by the real safetensors library."""
    import numpy as np
    from safetensors.numpy import save_file

    target = root / "tiny-target"
    target.mkdir(parents=True)
    (target / "config.json").write_text(json.dumps({
        "architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 4, "hidden_size": 64, "vocab_size": 256,
    }))  # fmt: skip
    shard1 = {"model.embed_tokens.weight": np.zeros((256, 64), np.float16), "model.norm.weight": np.ones(64, np.float32)}
    shard2 = {"lm_head.weight": np.zeros((256, 64), np.float16)}
    save_file(shard1, str(target / "model-00001-of-00002.safetensors"))
    save_file(shard2, str(target / "model-00002-of-00002.safetensors"))
    weight_map = {name: "model-00001-of-00002.safetensors" for name in shard1}
    weight_map |= {name: "model-00002-of-00002.safetensors" for name in shard2}
    (target / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))

    draft = root / "tiny-draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "text_config": {"num_hidden_layers": 1, "hidden_size": 64},
    }))  # fmt: skip
    save_file({"fc.weight": np.zeros((64, 192), np.float16)}, str(draft / "model.safetensors"))

    (root / "not-a-model").mkdir()  # no config.json: skipped


def test_demo_shows_tiny_models_from_headers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _make_tiny_models(tmp_path)
    monkeypatch.setenv(TINY_MODELS_DIR_ENV, str(tmp_path))
    result = _run("demo", "--json", "--workdir", str(tmp_path / "work"))
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["workdir"] == str(tmp_path / "work")
    assert not (tmp_path / "work").exists()  # nothing is written yet
    models = {m["name"]: m for m in data["models"]}
    assert sorted(models) == ["tiny-draft", "tiny-target"]
    target, draft = models["tiny-target"], models["tiny-draft"]
    assert (target["architecture"], target["num_layers"], target["hidden_size"], target["vocab_size"]) == (
        "DeepseekV3ForCausalLM", 4, 64, 256,
    )  # fmt: skip
    assert (target["shards"], target["tensors"]) == (2, 3)
    assert (draft["architecture"], draft["num_layers"], draft["vocab_size"]) == ("LlamaForCausalLMEagle3", 1, None)
    assert (draft["shards"], draft["tensors"]) == (1, 1)
    weight_bytes = 2 * 256 * 64 * 2 + 64 * 4
    assert weight_bytes / 1e6 < target["size_mb"] < weight_bytes / 1e6 + 0.01
    assert [r["name"] for r in data["recipes"]][:1] == ["fp8-draft"]

    people = _run("demo")
    assert people.exit_code == 0, people.output
    assert "tiny-target" in people.stdout and "DeepseekV3ForCausalLM" in people.stdout
    assert "later releases" in people.stdout


@pytest.mark.parametrize("state", ["missing", "empty"])
def test_demo_without_tiny_models_says_how_to_make_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: str
) -> None:
    folder = tmp_path / "tiny"
    if state == "empty":
        folder.mkdir()
    monkeypatch.setenv(TINY_MODELS_DIR_ENV, str(folder))
    result = _run("demo")
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr == f"error: no tiny models in {folder}; run `python examples/make_tiny_models.py` to create them\n"


def test_demo_with_corrupt_shard_is_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _make_tiny_models(tmp_path)
    shard = tmp_path / "tiny-draft" / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[:12])
    monkeypatch.setenv(TINY_MODELS_DIR_ENV, str(tmp_path))
    result = _run("demo")
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"error: {shard}: safetensors header length")
