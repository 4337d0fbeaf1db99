# tier: unit
"""What a user reads (issue 36): commands that paste as checked, verdicts first, figures that are true, tables that
fit, defaults that never write into the current folder. Each test reads the output a person reads."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from quantkit.cli import main


def run(*args: str, columns: int = 100, cwd: Path | None = None) -> Result:
    runner = CliRunner()
    env = {"COLUMNS": str(columns)}
    if cwd is None:
        return runner.invoke(main, list(args), env=env)
    old = Path.cwd()
    os.chdir(cwd)
    try:
        return runner.invoke(main, list(args), env=env)
    finally:
        os.chdir(old)


# --- deploy: the command pastes as checked ----------------------------------------------------------------------


def _pair_args(tiny: Path, out: Path, *more: str) -> list[str]:
    return ["deploy", str(tiny / "eagle3-draft"), "--target", str(tiny / "target"), "--platform", "gfx950",
            "--num-speculative-tokens", "3", "--out", str(out), "--overwrite", *more]


@pytest.mark.parametrize("columns", [60, 80, 200])
def test_the_printed_deploy_command_gives_the_manifests_argv_at_any_width(tiny: Path, tmp_path: Path,
                                                                        columns: int) -> None:
    res = run(*_pair_args(tiny, tmp_path), columns=columns)
    assert res.exit_code == 0, res.output
    argv = json.loads((tmp_path / "deploy.json").read_text())["argv"]
    assert argv[:2] == ["vllm", "serve"] and any(a.startswith("{") for a in argv)  # the speculative config JSON
    lines = res.stdout.splitlines()
    commands = [line for line in lines if line.startswith("vllm serve")]
    assert len(commands) == 1, res.stdout
    assert shlex.split(commands[0]) == argv
    assert lines[lines.index(commands[0]) - 1] == "command:"
    # --command-only: the whole of stdout is the command
    only = run(*_pair_args(tiny, tmp_path, "--command-only"), columns=columns)
    assert only.exit_code == 0, only.output
    assert only.stdout.count("\n") == 1 and shlex.split(only.stdout) == argv


def test_the_environment_lines_paste_as_exports(tiny: Path, tmp_path: Path) -> None:
    res = run(*_pair_args(tiny, tmp_path), columns=60)
    env = json.loads((tmp_path / "deploy.json").read_text())["env"]
    assert env
    for e in env:
        line = next(x for x in res.stdout.splitlines() if x.startswith(f"export {e['name']}="))
        words = shlex.split(line, comments=True)
        assert words == ["export", f"{e['name']}={e['value']}"]


def test_a_refused_deployment_says_so_in_one_line_and_prints_no_command(tiny: Path, tmp_path: Path) -> None:
    res = run(*_pair_args(tiny, tmp_path, "--tp", "3"), columns=200)  # 4 attention heads: TP 3 is an error
    assert res.exit_code == 1, res.output
    written = json.loads((tmp_path / "deploy.json").read_text())
    assert written["ok"] is False and written["argv"][:2] == ["vllm", "serve"]
    lines = res.stdout.splitlines()
    assert lines[0].startswith("deploy refused: 4 errors;")  # the verdict comes first
    assert not any("vllm serve" in line for line in lines), res.stdout
    assert not any(line.startswith("command") for line in lines)
    only = run(*_pair_args(tiny, tmp_path, "--tp", "3", "--command-only"))
    assert only.exit_code == 1 and only.stdout == ""
    assert only.stderr.startswith("deploy refused: 4 errors;") and only.stderr.count("\n") == 1


def test_deploy_writes_into_a_folder_named_after_the_model_and_never_replaces_silently(tiny: Path,
                                                                                        tmp_path: Path) -> None:
    args = ["deploy", str(tiny / "target"), "--platform", "cpu"]
    first = run(*args, cwd=tmp_path)
    assert first.exit_code == 0, first.output
    written = tmp_path / "quantkit-out" / "deploy-target" / "deploy.json"
    assert json.loads(written.read_text())["model"] == str(tiny / "target")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["quantkit-out"]  # nothing beside the user's files
    before = written.read_bytes()
    second = run(*args, "--max-model-len", "64", cwd=tmp_path)
    assert second.exit_code == 2 and second.stdout == ""
    assert second.stderr.startswith("error: --out quantkit-out/deploy-target: deploy.json exists")
    assert "--overwrite" in second.stderr and second.stderr.count("\n") == 1
    assert written.read_bytes() == before
    third = run(*args, "--max-model-len", "64", "--overwrite", cwd=tmp_path)
    assert third.exit_code == 0 and json.loads(written.read_text())["max_model_len"] == 64
    # --command-only writes nothing unless --out is given
    (tmp_path / "quantkit-out" / "deploy-target" / "deploy.json").unlink()
    only = run(*args, "--command-only", cwd=tmp_path)
    assert only.exit_code == 0 and not written.exists()


# --- rules and check: verdict first, tables that fit 100 columns, ids whole ----------------------------------------


def _fits(text: str, width: int = 100) -> None:
    long = [line for line in text.splitlines() if len(line) > width]
    assert not long, long


def test_rules_fits_100_columns_with_every_id_whole_and_says_what_each_checks() -> None:
    from quantkit.rules.table import RULES

    res = run("rules", columns=100)
    assert res.exit_code == 0, res.output
    _fits(res.stdout)
    rows = {line.split()[0]: line for line in res.stdout.splitlines() if line.split()}
    for rule in RULES:
        assert rule.id in rows, f"{rule.id} is not whole on one line"
        assert rule.title.split()[0] in rows[rule.id]  # the title starts on the id's line
    assert len(res.stdout.splitlines()) < 2.5 * len(RULES)  # (it was 788 lines for 34 rules)
    assert not any(r.source.split()[0] in res.stdout for r in RULES)  # sources only with --verbose
    verbose = run("rules", "--verbose", columns=100)
    _fits(verbose.stdout)
    flat = " ".join(verbose.stdout.split())
    assert all(" ".join(r.source.split()) in flat for r in RULES)


def _damaged_draft(tiny: Path, tmp_path: Path) -> Path:
    """The tiny draft with an FP8 quantization_config but no scale tensors: check finds several errors."""
    import shutil

    out = tmp_path / "draft-no-scales"
    shutil.copytree(tiny / "eagle3-draft", out)
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "quark", "version": "0.13", "exclude": ["fc", "lm_head"],
        "export": {"kv_cache_group": [], "pack_method": "reorder", "weight_format": "real_quantized"},
        "global_quant_config": {"weight": {"dtype": "fp8_e4m3", "qscheme": "per_channel", "ch_axis": 0,
                                           "is_dynamic": False},
                                "input_tensors": {"dtype": "fp8_e4m3", "qscheme": "per_channel", "ch_axis": 1,
                                                  "is_dynamic": True}},
        "layer_quant_config": {}, "layer_type_quant_config": {}}
    (out / "config.json").write_text(json.dumps(config))
    return out


def test_check_puts_its_verdict_first_and_fits_100_columns(tiny: Path, tmp_path: Path) -> None:
    folder = _damaged_draft(tiny, tmp_path)
    args = ["check", str(folder), "--target", str(tiny / "target"), "--vllm", "off", "--platform", "gfx950"]
    res = run(*args, columns=100)
    listed = run(*args, "--json")
    findings = json.loads(listed.stdout)["findings"]
    errors = [f for f in findings if f["severity"] == "error"]
    assert res.exit_code == listed.exit_code == 1 and len({f["code"] for f in findings}) >= 2, res.output
    _fits(res.stdout)
    lines = res.stdout.splitlines()
    assert lines[0].startswith(f"FAILED: {len(errors)} error")
    for f in findings:  # every finding's code whole on one line
        assert any(f["code"] in line.split() for line in lines), f["code"]
    # the kernel table is behind --verbose: one line by default
    assert "kernel path on" not in res.stdout and "--verbose" in res.stdout
    verbose = run(*args, "--verbose", columns=100)
    _fits(verbose.stdout)
    assert verbose.stdout.splitlines()[0] == lines[0] and "kernel path on gfx950" in verbose.stdout
