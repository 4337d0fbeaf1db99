# tier: integration
"""The Python API (issue 40): each verb on the bundled tiny models returns what its command's `--json` prints (timings
and the output folder's path aside), a bad spec raises a SpecError naming the field (never a flag), `import quantkit`
stays light, and a failing `--json` run prints a JSON error object on stdout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import quantkit
from quantkit.cli import main

TIMING_WORDS = ("rss", "second", "timing", "elapsed", "duration", "mb_per_s", "_s", "wall", "created", "date")


def _strip(value: Any, paths: dict[str, str]) -> Any:
    """`value` without timing fields, with the run-specific folders replaced by their role."""
    if isinstance(value, dict):
        return {k: _strip(v, paths) for k, v in value.items() if not any(k.endswith(w) or w in k for w in TIMING_WORDS)}
    if isinstance(value, list):
        return [_strip(v, paths) for v in value]
    if isinstance(value, str):
        for path, role in paths.items():
            value = value.replace(path, role)
    return value


def _cli_json(*args: str) -> dict[str, Any]:
    result = CliRunner().invoke(main, [*args, "--json"])
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def applied(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """fp8-draft applied to the bundled draft once through the API and once through the CLI."""
    root = tmp_path_factory.mktemp("api")
    api_out, cli_out = root / "api-out", root / "cli-out"
    result = quantkit.apply(tiny / "eagle3-draft", recipe="fp8-draft", target=tiny / "target", output=api_out)
    cli = _cli_json(
        "apply",
        "--recipe",
        "fp8-draft",
        "--model",
        str(tiny / "eagle3-draft"),
        "--target",
        str(tiny / "target"),
        "--output",
        str(cli_out),
    )
    return {"api": result, "cli": cli, "api_out": api_out, "cli_out": cli_out}


def test_apply_returns_what_the_command_prints(applied: dict[str, Any]) -> None:
    from quantkit.results import ApplyResult

    assert isinstance(applied["api"], ApplyResult)
    paths_api = {str(applied["api_out"]): "OUT"}
    paths_cli = {str(applied["cli_out"]): "OUT"}
    assert _strip(applied["api"].to_dict(), paths_api) == _strip(applied["cli"], paths_cli)


@pytest.mark.parametrize(
    "verb,args,kwargs",
    [
        ("inspect", [], {}),
        ("check", ["--target", "{target}", "--vllm", "off"], {"target": "{target}", "vllm": "off"}),
        (
            "deploy",
            ["--target", "{target}", "--platform", "cpu", "--out", "{tmp}"],
            {"target": "{target}", "platform": "cpu"},
        ),
    ],
)
def test_static_verbs_return_what_the_command_prints(
    applied: dict[str, Any], tiny: Path, tmp_path: Path, verb: str, args: list[str], kwargs: dict[str, str]
) -> None:
    out = str(applied["api_out"])
    fill = {"target": str(tiny / "target"), "tmp": str(tmp_path)}
    api = getattr(quantkit, verb)(out, **{k: v.format(**fill) for k, v in kwargs.items()})
    cli = _cli_json(verb, out, *[a.format(**fill) for a in args])
    assert api.schema_version == cli["schema_version"]
    assert _strip(api.to_dict(), {}) == _strip(cli, {})


def test_publish_dry_run_returns_what_the_command_prints(applied: dict[str, Any], tmp_path: Path) -> None:
    out = str(applied["api_out"])
    api = quantkit.publish(out, repo_id="org/tiny-draft-fp8", dry_run=True, dry_run_dir=tmp_path / "api")
    cli = _cli_json(
        "publish", out, "--repo-id", "org/tiny-draft-fp8", "--dry-run", "--dry-run-dir", str(tmp_path / "cli")
    )
    paths_api, paths_cli = {str(tmp_path / "api"): "PREVIEW"}, {str(tmp_path / "cli"): "PREVIEW"}
    assert _strip(api.to_dict(), paths_api) == _strip(cli, paths_cli)


def test_acceptance_returns_what_the_command_prints(applied: dict[str, Any], tiny: Path, tmp_path: Path) -> None:
    """The reference engine on three prompts: the same settings give the same figures."""
    out = str(applied["api_out"])
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"prompt": p, "domain": d}) + "\n"
            for p, d in [
                ("The capital of France is", "facts"),
                ("def add(a, b):", "code"),
                ("Once upon a time", "story"),
            ]
        )
    )
    settings = {"backend": "reference", "max_new_tokens": 8, "num_speculative_tokens": 2, "prompts": str(prompts)}
    api = quantkit.acceptance(out, target=tiny / "target", draft=tiny / "eagle3-draft", **settings)
    cli = _cli_json(
        "acceptance",
        "--target",
        str(tiny / "target"),
        "--draft",
        str(tiny / "eagle3-draft"),
        "--candidate",
        out,
        "--backend",
        "reference",
        "--max-new-tokens",
        "8",
        "--num-speculative-tokens",
        "2",
        "--prompts",
        str(prompts),
    )
    assert api.ratio is not None and api.ratio == cli["ratio"]
    assert _strip(api.to_dict(), {}) == _strip(cli, {})


@pytest.mark.parametrize(
    "verb,kwargs,field",
    [
        ("check", {"tp": 0}, "CheckSpec.tp"),
        ("check", {"platform": "gfx1"}, "CheckSpec.platform"),
        ("check", {"bogus": 1}, "CheckSpec.bogus"),
        (
            "acceptance",
            {"num_speculative_tokens": 0, "target": "t", "draft": "d"},
            "AcceptanceSpec.num_speculative_tokens",
        ),
        ("acceptance", {"temperature": float("nan"), "target": "t", "draft": "d"}, "AcceptanceSpec.temperature"),
        ("apply", {"output": "o"}, "ApplySpec.recipe"),
        ("deploy", {"tp": 10**9}, "ServeSpec.tp"),
        ("bench", {"out_dir": "o", "repeats": 0}, "BenchSpec.repeats"),
        ("evaluate", {"baseline": "b", "tasks": []}, "EvalSpec.tasks"),
        ("publish", {"repo_id": "x"}, "PublishSpec.repo_id"),
    ],
)
def test_a_bad_spec_names_the_field_not_a_flag(verb: str, kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(quantkit.SpecError) as info:
        getattr(quantkit, verb)("folder", **kwargs)
    error = info.value
    assert isinstance(error, quantkit.QuantkitError)
    assert error.input == field, error
    assert "--" not in str(error), error
    assert error.to_dict()["exit_code"] == 2 and error.to_dict()["fix"]


def test_a_spec_object_and_overrides_combine() -> None:
    spec = quantkit.CheckSpec(platform="cpu", tp=2)
    assert quantkit.CheckSpec.build(spec, tp=4) == quantkit.CheckSpec(platform="cpu", tp=4)
    with pytest.raises(quantkit.SpecError):
        quantkit.CheckSpec.build(quantkit.ServeSpec())  # type: ignore[arg-type]


def test_gate_acceptance_section_is_the_spec_plus_thresholds() -> None:
    from quantkit.gate.config import AcceptanceStep

    step = AcceptanceStep(min_ratio=0.95, num_speculative_tokens=5, temperature=0.5)
    assert isinstance(step, quantkit.AcceptanceSpec)
    assert step.spec() == quantkit.AcceptanceSpec(num_speculative_tokens=5, temperature=0.5)
    assert set(AcceptanceStep.model_fields) - set(quantkit.AcceptanceSpec.model_fields) == {
        "min_ratio",
        "per_domain_min_ratio",
        "min_al",
        "use_ci_lower_bound",
        "golden",
    }


def test_verbs_stay_verbs_after_their_stage_packages_are_imported() -> None:
    import quantkit.apply.run  # noqa: F401  the import system sets quantkit.apply to the package on the way
    import quantkit.check.run  # noqa: F401

    assert callable(quantkit.apply) and callable(quantkit.check)
    assert sys.modules["quantkit.apply"].__name__ == "quantkit.apply"


def test_import_quantkit_loads_nothing_heavy() -> None:
    code = (
        "import sys, quantkit; quantkit.__all__; "
        "print(' '.join(m for m in ('torch','quark','transformers','vllm','lm_eval','pydantic') "
        "if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ""


@pytest.mark.parametrize(
    "args",
    [
        ["inspect", "/nonexistent-folder"],
        ["recipes", "show", "no-such-recipe"],
        ["check", "/nonexistent-folder", "--tp", "0"],
    ],
)
def test_a_failing_json_run_prints_a_json_error(args: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "quantkit", *args, "--json"], capture_output=True, text=True)
    assert done.returncode == 2
    doc = json.loads(done.stdout)
    assert doc["schema_version"] == 1 and doc["ok"] is False
    assert doc["command"] == " ".join(a for a in args[:2] if not a.startswith("/"))
    assert doc["error"]["exit_code"] == 2 and doc["error"]["message"]
    assert "Traceback" not in done.stderr
    assert done.stderr.count("rror: ") == 1


def test_gate_returns_what_the_command_prints(applied: dict[str, Any], tiny: Path, tmp_path: Path) -> None:
    """A check-only gate (no vLLM): the verdict and every figure are the same from Python and from the command."""
    import yaml

    config = tmp_path / "gate.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "api-parity",
                "target": str(tiny / "target"),
                "draft": str(tiny / "eagle3-draft"),
                "candidates": [{"name": "draft-fp8", "path": str(applied["api_out"])}],
                "steps": ["check"],
                "check": {"platform": "cpu", "vllm": "off"},
            }
        )
    )
    api = quantkit.gate(config)
    cli = _cli_json("gate", str(config), "--out", str(tmp_path / "report"))
    assert api.to_dict()["gate"]["verdict"] == cli["gate"]["verdict"]
    assert _strip(api.to_dict(), {}) == _strip(cli, {})
