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
