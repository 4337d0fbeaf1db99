"""Recipes: the built-ins, the scheme data against installed Quark, and every bad recipe as a user sees it."""

from __future__ import annotations

import copy
import importlib.util
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from quantkit.cli import main
from quantkit.errors import RecipeError
from quantkit.io.paths import RECIPES_DIR_ENV, recipes_dir
from quantkit.recipes import Recipe, list_recipes, load_recipe
from quantkit.schemes import ALIASES as QUARK_SCHEME_ALIASES
from quantkit.schemes import SCHEMES as QUARK_SCHEMES

BUILTINS = ["fp8-draft", "fp8-target", "mxfp4-moe", "mxfp4-moe-attn-fp8"]

DRAFT: dict[str, Any] = {
    "name": "my-draft",
    "description": "a user recipe",
    "applies_to": "eagle3-draft",
    "scheme": "ptpc_fp8",
    "quantize": ["decoder_linears"],
    "keep": [{"role": "fc", "reason": "mixes scales"}, {"role": "lm_head", "reason": "vLLM cannot load it quantized"}],
}
MOE: dict[str, Any] = {
    "name": "my-moe",
    "description": "a user MoE recipe",
    "applies_to": "moe-target",
    "scheme": "mxfp4",
    "quantize": ["experts"],
    "keep": [{"role": "router", "reason": "tiny"}],
}


def _write(folder: Path, content: dict[str, Any] | str, name: str = "my.yaml") -> Path:
    path = folder / name
    path.write_text(content if isinstance(content, str) else yaml.safe_dump(content, sort_keys=False))
    return path


def _edit(base: dict[str, Any], change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    data = copy.deepcopy(base)
    change(data)
    return data


def _show(*args: str) -> Any:
    return CliRunner().invoke(main, ["recipes", "show", *args])


def _assert_one_line_error(result: Any, *expected: str) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.stdout == ""  # errors go to stderr, stdout stays clean for --json
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    for fragment in expected:
        assert fragment in lines[0]
    return lines[0]


# --- built-in recipes ---------------------------------------------------------------------------------------------


def test_builtin_recipes_are_the_expected_files_and_load() -> None:
    assert sorted(p.stem for p in recipes_dir().glob("*.yaml")) == BUILTINS
    recipes = list_recipes()
    assert [r.name for r in recipes] == BUILTINS
    for recipe in recipes:
        assert recipe.source == recipes_dir() / f"{recipe.name}.yaml"
        assert recipe.keep, f"{recipe.name} keeps nothing"
        assert all(entry.reason.strip() for entry in [*recipe.keep, *recipe.overrides])


def test_fp8_draft_keeps_fc_and_lm_head_bf16() -> None:
    recipe = load_recipe("fp8-draft")
    assert (recipe.applies_to, recipe.scheme, recipe.path) == ("eagle3-draft", "ptpc_fp8", "auto")
    assert recipe.quantize == ["decoder_linears", "experts"]  # experts: an MoE-layer draft's (eagle3_moe)
    assert [k.role for k in recipe.keep] == ["fc", "lm_head", "router"]
    assert recipe.calibration is None and not recipe.needs_calibration
    assert recipe.to_dict()["calibration"] == "none"


def test_mxfp4_moe_quantizes_only_experts() -> None:
    recipe = load_recipe("mxfp4-moe")
    assert (recipe.applies_to, recipe.scheme, recipe.path) == ("moe-target", "mxfp4", "auto")
    assert recipe.quantize == ["experts"]
    assert {k.role for k in recipe.keep} == {
        "router", "attention", "lm_head", "shared_experts", "dense_mlp", "embed_tokens",
    }  # fmt: skip
    assert recipe.overrides == []


def test_mxfp4_moe_attn_fp8_overrides_attention() -> None:
    recipe = load_recipe("mxfp4-moe-attn-fp8")
    assert [(o.role, o.scheme) for o in recipe.overrides] == [("attention", "ptpc_fp8")]
    assert "attention" not in {k.role for k in recipe.keep}
    assert {k.role for k in recipe.keep} == {"router", "lm_head", "shared_experts", "dense_mlp", "embed_tokens"}


def test_fp8_target_quantizes_every_linear_not_kept() -> None:
    recipe = load_recipe("fp8-target")
    assert (recipe.applies_to, recipe.scheme, recipe.quantize) == ("dense-target", "ptpc_fp8", None)
    assert {k.role for k in recipe.keep} == {"lm_head", "embed_tokens"}


@pytest.mark.parametrize("name", BUILTINS)
def test_to_dict_round_trips_through_yaml(name: str, tmp_path: Path) -> None:
    recipe = load_recipe(name)
    again = load_recipe(_write(tmp_path, yaml.safe_dump(recipe.to_dict(), sort_keys=False)))
    assert again.to_dict() == recipe.to_dict()
    assert json.loads(json.dumps(recipe.to_dict())) == recipe.to_dict()


# --- scheme data --------------------------------------------------------------------------------------------------


def test_scheme_table_matches_installed_quark() -> None:
    # Read Quark's source text: importing quark.torch takes ~30 s, and the table exists to avoid exactly that.
    spec = importlib.util.find_spec("quark")
    assert spec is not None and spec.submodule_search_locations
    template = Path(list(spec.submodule_search_locations)[0]) / "torch/quantization/config/template.py"
    names = re.findall(r'self\._schemes\["([a-z0-9_]+)"\]\s*=', template.read_text())
    assert [n for n in names if n not in QUARK_SCHEME_ALIASES] == list(QUARK_SCHEMES)
    assert set(QUARK_SCHEME_ALIASES) <= set(names)


def test_static_activation_facts() -> None:
    static = {name for name, facts in QUARK_SCHEMES.items() if facts.static_activation_scales}
    assert {"fp8", "int8", "mxfp4_fp8"} <= static
    assert not {"ptpc_fp8", "mxfp4", "mxfp4_weight_only", "int4_wo_128"} & static


# --- bad recipes, as `quantkit recipes show <file>` reports them --------------------------------------------------

BAD_RECIPES: list[tuple[str, dict[str, Any] | str, list[str]]] = [
    (
        "unknown-top-level-key",
        {**DRAFT, "colour": "red"},
        ["colour: unknown key 'colour' (allowed: name, description, applies_to, scheme, quantize, keep"],
    ),
    (
        "unknown-key-in-keep",
        _edit(DRAFT, lambda d: d["keep"].__setitem__(0, {"rol": "fc", "reason": "x"})),
        ["keep[0].rol: unknown key 'rol' (allowed: role, pattern, reason)"],
    ),
    (
        "unknown-key-in-calibration",
        {**DRAFT, "calibration": {"samples": 4, "seq_len": 8, "batch": 2}},
        ["calibration.batch: unknown key 'batch' (allowed: samples, seq_len)"],
    ),
    (
        "unknown-scheme",
        {**DRAFT, "scheme": "fp8_e4m3"},
        ["scheme: unknown Quark scheme 'fp8_e4m3' (known: int4_wo_32, ", "ptpc_fp8", "did you mean 'fp8'?"],
    ),
    (
        "legacy-scheme-alias",
        {**DRAFT, "scheme": "fp4_block16_scale_e4m3"},
        ["scheme: unknown Quark scheme 'fp4_block16_scale_e4m3'", "use 'nvfp4'"],
    ),
    (
        "unknown-override-scheme",
        {**MOE, "overrides": [{"role": "attention", "scheme": "w_fp8_a_fp8", "reason": "old name"}]},
        ["overrides[0].scheme: unknown Quark scheme 'w_fp8_a_fp8'"],
    ),
    (
        "missing-applies-to",
        _edit(DRAFT, lambda d: d.pop("applies_to")),
        ["applies_to: missing required field", "eagle3-draft | moe-target | dense-target"],
    ),
    ("missing-keep", _edit(DRAFT, lambda d: d.pop("keep")), ["keep: missing required field", "keep: []"]),
    (
        "missing-reason",
        _edit(DRAFT, lambda d: d["keep"][0].pop("reason")),
        ["keep[0].reason: missing required field"],
    ),
    ("empty-reason", _edit(DRAFT, lambda d: d["keep"][0].update(reason="  ")), ["keep[0].reason: empty reason"]),
    (
        "per-shard-with-static-scheme",
        {**DRAFT, "scheme": "fp8", "path": "per-shard", "calibration": {"samples": 4, "seq_len": 8}},
        ["path: per-shard cannot be used with scheme 'fp8'", "drops input_scale", "path: in-memory"],
    ),
    (
        "per-shard-with-static-override",
        {
            **MOE,
            "path": "per-shard",
            "calibration": {"samples": 4, "seq_len": 8},
            "overrides": [{"role": "attention", "scheme": "fp8", "reason": "x"}],
        },
        ["path: per-shard cannot be used with overrides[0].scheme 'fp8'", "drops input_scale"],
    ),
    (
        "static-scheme-without-calibration",
        {**DRAFT, "scheme": "fp8"},
        ["calibration: scheme 'fp8' has static activation scales", "calibration: {samples: 128, seq_len: 512}"],
    ),
    (
        "eagle3-draft-without-lm-head-kept",
        _edit(DRAFT, lambda d: d["keep"].pop(1)),
        ["keep: an eagle3-draft recipe must keep lm_head", "vLLM cannot load a quantized EAGLE-3 draft lm_head"],
    ),
    (
        "role-in-keep-and-overrides",
        {**DRAFT, "overrides": [{"role": "fc", "scheme": "ptpc_fp8", "reason": "x"}]},
        ["overrides[0].role: 'fc' is also in keep"],
    ),
    (
        "role-in-keep-and-quantize",
        {**MOE, "quantize": ["experts", "router"]},
        ["quantize[1]: 'router' is also in keep"],
    ),
    (
        "unknown-role",
        _edit(DRAFT, lambda d: d["keep"][1].update(role="lm_hed")),
        ["keep[1].role: unknown role 'lm_hed' (known: fc, lm_head", "did you mean 'lm_head'?"],
    ),
    (
        "unknown-role-in-quantize",
        {**MOE, "quantize": ["experts", "expert"]},
        ["quantize[1]: unknown role 'expert'", "did you mean 'experts'?"],
    ),
    (
        "role-of-another-model-kind",
        {**DRAFT, "quantize": ["shared_experts"]},
        ["quantize[0]: role 'shared_experts' does not exist in eagle3-draft models"],
    ),
    (
        "role-and-pattern",
        _edit(DRAFT, lambda d: d["keep"][0].update(pattern="*.fc")),
        ["keep[0]: give exactly one of 'role' or 'pattern'"],
    ),
    ("empty-quantize", {**DRAFT, "quantize": []}, ["quantize: empty list quantizes nothing"]),
    (
        "calibration-samples-as-string",
        {**DRAFT, "calibration": {"samples": "128", "seq_len": 512}},
        ["calibration.samples: should be a valid integer, got str '128'"],
    ),
    (
        "calibration-samples-zero",
        {**DRAFT, "calibration": {"samples": 0, "seq_len": 512}},
        ["calibration.samples: should be greater than 0, got int 0"],
    ),
    ("calibration-word", {**DRAFT, "calibration": "some"}, ["calibration: expected 'none' or a mapping"]),
    ("bad-name", {**DRAFT, "name": "My_Draft"}, ["name: invalid name 'My_Draft'", "lowercase"]),
    ("bad-path-value", {**DRAFT, "path": "fast"}, ["path: unknown value 'fast'", "'in-memory' or 'per-shard'"]),
    (
        "keep-entry-not-a-mapping",
        _edit(DRAFT, lambda d: d["keep"].__setitem__(0, "fc")),
        ["keep[0]: expected a mapping with keys role, pattern, reason, got str 'fc'"],
    ),
    ("top-level-list", "- name: x\n- scheme: fp8\n", ["expected a mapping of keys (name, description", "got a list"]),
    ("empty-file", "", ["got an empty file"]),
    ("invalid-yaml", "name: [unclosed\nscheme: fp8\n", ["invalid YAML at line", "fix the YAML syntax"]),
    (
        "duplicate-key",
        yaml.safe_dump(DRAFT, sort_keys=False) + "keep: []\n",
        ["invalid YAML at line", "duplicate key 'keep'", "merge"],
    ),
    (
        "two-problems",
        {**DRAFT, "scheme": "nope", "path": "fast"},
        ["scheme: unknown Quark scheme 'nope'", "(and 1 more problem)"],
    ),
]


@pytest.mark.parametrize(("content", "expected"), [c[1:] for c in BAD_RECIPES], ids=[c[0] for c in BAD_RECIPES])
def test_bad_recipe_is_one_line_error_naming_file_and_key(
    tmp_path: Path, content: dict[str, Any] | str, expected: list[str]
) -> None:
    path = _write(tmp_path, content)
    line = _assert_one_line_error(_show(str(path)), *expected)
    assert line.startswith(f"error: recipe {path}: ")


def test_bad_recipe_raises_recipe_error_from_the_library(tmp_path: Path) -> None:
    path = _write(tmp_path, {**DRAFT, "scheme": "fp8_e4m3"})
    with pytest.raises(RecipeError, match=r"^recipe .*my\.yaml: scheme: unknown Quark scheme 'fp8_e4m3'"):
        load_recipe(path)


def test_nonexistent_file_names_it_and_the_builtins(tmp_path: Path) -> None:
    path = tmp_path / "missing.yaml"
    _assert_one_line_error(_show(str(path)), f"recipe file {path} not found", "fp8-draft, fp8-target")


def test_unknown_name_lists_available_recipes() -> None:
    _assert_one_line_error(
        _show("fp9-draft"),
        "unknown recipe 'fp9-draft' (available: fp8-draft, fp8-target, mxfp4-moe, mxfp4-moe-attn-fp8)",
    )


def test_folder_instead_of_file(tmp_path: Path) -> None:
    _assert_one_line_error(_show(str(tmp_path)), f"recipe {tmp_path}: is a folder")


# --- user files work wherever names do ----------------------------------------------------------------------------


@pytest.mark.parametrize("spelling", ["absolute", "relative.yaml", "./relative.yaml", "relative.yml", "no-suffix"])
def test_user_file_works_where_a_name_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spelling: str) -> None:
    monkeypatch.chdir(tmp_path)
    file_name = {"absolute": "abs.yaml", "./relative.yaml": "relative.yaml"}.get(spelling, spelling)
    path = _write(tmp_path, DRAFT, file_name)
    argument = str(path) if spelling == "absolute" else spelling

    recipe = load_recipe(argument)
    assert recipe.name == "my-draft"  # the name comes from the file, whatever the file is called
    assert recipe.source is not None and recipe.source.resolve() == path.resolve()

    result = _show(argument, "--json")
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)  # results.RecipeDocument (issue 19): the recipe under "recipe", and its file
    assert shown["schema_version"] == 1 and Path(shown["source"]).resolve() == path.resolve()
    assert shown["recipe"] == recipe.to_dict()
    assert shown["recipe"]["keep"] == DRAFT["keep"]


def test_recipes_dir_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path, DRAFT, "my-draft.yaml")
    monkeypatch.setenv(RECIPES_DIR_ENV, str(tmp_path))
    assert [r.name for r in list_recipes()] == ["my-draft"]
    result = CliRunner().invoke(main, ["recipes", "list", "--json"])
    assert result.exit_code == 0, result.output
    assert [r["name"] for r in json.loads(result.stdout)["recipes"]] == ["my-draft"]  # results.RecipeList


def test_builtin_name_must_match_file_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path, DRAFT, "other.yaml")
    monkeypatch.setenv(RECIPES_DIR_ENV, str(tmp_path))
    _assert_one_line_error(_show("other"), "name: 'my-draft' differs from the file name")


def test_missing_recipes_dir_says_how_to_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RECIPES_DIR_ENV, str(tmp_path / "nowhere"))
    _assert_one_line_error(CliRunner().invoke(main, ["recipes", "list"]), "not found", "QUANTKIT_RECIPES_DIR")


def test_recipe_built_in_code_is_validated_too() -> None:
    with pytest.raises(ValueError, match="must keep lm_head"):
        Recipe.model_validate(_edit(DRAFT, lambda d: d["keep"].pop(1)))
