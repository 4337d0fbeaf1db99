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
from quantkit.io.paths import TINY_MODELS_DIR_ENV
from quantkit.recipes import load_recipe
from quantkit.results import RecipeDocument, RecipeList

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
    data = json.loads(result.stdout)  # results.RecipeList (issue 19): versioned, the recipes under "recipes"
    assert data["schema_version"] == 1
    assert RecipeList.model_validate(data).to_dict() == data  # the model reads back what it printed
    items = data["recipes"]
    assert [r["name"] for r in items] == ["fp8-draft", "fp8-target", "mxfp4-moe", "mxfp4-moe-attn-fp8"]
    for item in items:
        assert Path(item.pop("source")) == load_recipe(item["name"]).source
        assert item == load_recipe(item["name"]).to_dict()


def test_recipes_show_json_is_to_dict() -> None:
    result = _run("recipes", "show", "fp8-draft", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)  # results.RecipeDocument (issue 19): the recipe under "recipe", and its file
    assert doc["schema_version"] == 1 and Path(doc["source"]) == load_recipe("fp8-draft").source
    data = doc["recipe"]
    assert data == load_recipe("fp8-draft").to_dict()
    assert data["scheme"] == "ptpc_fp8"
    assert [k["role"] for k in data["keep"]] == ["fc", "lm_head", "router"]
    assert RecipeDocument.model_validate(doc).to_dict() == doc


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


def test_auto_devices_on_a_host_without_gpu_nodes_import_no_torch() -> None:
    # A dry run with the default `--devices auto` used to import torch (1-2 s) only to count GPUs. Where no GPU
    # device file exists, torch can see none: the plan says cpu without it, and torch itself agrees.
    from quantkit.apply.run import GPU_DEVICE_NODES, no_gpu_device_nodes

    if not no_gpu_device_nodes():
        pytest.skip(f"this host has a GPU device file ({', '.join(GPU_DEVICE_NODES)}): torch decides here")
    root = Path(__file__).resolve().parents[2]
    code = textwrap.dedent(
        """
        import json, sys
        from quantkit.apply.run import resolve_devices
        print(json.dumps([resolve_devices("auto"), resolve_devices(None), "torch" in sys.modules]))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root).stdout
    auto, default, torch_loaded = json.loads(out)
    assert auto == default == ["cpu"]
    assert torch_loaded is False
    import torch

    assert torch.cuda.device_count() == 0 or not torch.cuda.is_available()  # the reference: torch sees no GPU


# moved from tests/unit/test_naming_tables.py: it needs a fresh process
def test_quantkit_entries_on_ascii_names_need_no_regex_import() -> None:
    """Importing the regex package is ~12 ms of a dry run; quantkit's own entries on ASCII names do without it."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from quantkit.naming.exclude import excluded_names\n"
        "from quantkit.naming.layers import RuntimeLayer\n"
        "layers = [RuntimeLayer(f'model.layers.{i}.mlp.gate_up_proj', 'fused_linear', 'dense_mlp',"
        " shards=(f'model.layers.{i}.mlp.gate_proj', f'model.layers.{i}.mlp.up_proj')) for i in range(12)]\n"
        "got = excluded_names(layers, [r're:model\\.layers\\.\\d+\\.mlp\\.gate_up_proj$', r're:model\\.layers\\.(?:3|4)\\.',"
        " r're:vision_tower\\.', 'lm_head'])\n"
        "assert len(got) == 12, got\n"
        "assert 'regex' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
