# tier: unit
"""The command line as a user sees it, in-process (CliRunner): help, version, recipe views, the demo's missing models. What a fresh process imports is in tests/e2e/test_cli.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from quantkit import __version__
from quantkit.cli import main
from quantkit.io.paths import TINY_MODELS_DIR_ENV
from quantkit.recipes import load_recipe
from quantkit.results import RecipeDocument, RecipeList


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
    assert (
        result.stderr
        == f"error: no tiny models in {folder}; run `python examples/make_tiny_models.py` to create them\n"
    )
