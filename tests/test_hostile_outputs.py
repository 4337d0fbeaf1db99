# tier: e2e
"""Issue 35, outputs: every result file is written atomically and never through a link (item 4); no command writes
into a model folder it reads (item 2); a pickle-only folder is refused by every command in one line (item 3);
one parameter type per kind of value (item 10); config counts checked against the checkpoint (item 5);
remote-code refusals that name a flag the command takes (item 11); Markdown escaping; unknown vLLM versions.

The CLI cases run the real CLI in a subprocess and assert test_bad_inputs.py's contract: exit status 2, exactly one
`error:` line, no traceback, nothing complete-looking left, every source byte for byte unchanged.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from .conftest import TINY
from .hostile import copy_model, error_lines, run_cli, tree_digest

TARGET = TINY / "target"


def _one_error(run, *mentions: str) -> str:  # type: ignore[no-untyped-def]
    where = f"\nexit {run.returncode}\nstderr: {run.stderr[-3000:]!r}\nstdout: {run.stdout[-500:]!r}"
    assert "Traceback" not in run.stderr, where
    assert run.returncode == 2, where
    lines = error_lines(run.stderr)
    assert len(lines) == 1, where
    for m in mentions:
        assert m in lines[0], f"{m!r} not in the error line" + where
    return lines[0]


# --- item 4: atomic writes, never through a link --------------------------------------------------------------------


def test_write_file_atomic_replaces_a_planted_link(tmp_path: Path) -> None:
    from quantkit.io.files import write_file_atomic

    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.json").symlink_to(outside)
    (out / "dangling.json").symlink_to(tmp_path / "nowhere" / "x.json")
    write_file_atomic(out / "report.json", "{}\n")
    write_file_atomic(out / "dangling.json", b"{}\n")
    assert outside.read_text() == "secret"
    assert not (tmp_path / "nowhere").exists()
    for name in ("report.json", "dangling.json"):
        assert not (out / name).is_symlink() and (out / name).read_text() == "{}\n"
    assert sorted(p.name for p in out.iterdir()) == ["dangling.json", "report.json"]  # no temporary file left
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE((out / "report.json").stat().st_mode) == 0o666 & ~mask


def test_write_file_atomic_keeps_the_previous_file_on_failure(tmp_path: Path) -> None:
    from quantkit.errors import QuantkitError
    from quantkit.io.files import write_file_atomic

    target = tmp_path / "report.md"
    target.write_text("previous")

    with pytest.raises(TypeError):
        write_file_atomic(target, 12345)  # type: ignore[arg-type]  # fails after the temp file exists
    assert target.read_text() == "previous"
    assert [p.name for p in tmp_path.iterdir()] == ["report.md"]
    (tmp_path / "folder.json").mkdir()
    with pytest.raises(QuantkitError, match="is a folder"):
        write_file_atomic(tmp_path / "folder.json", "x")


def test_jsonout_write_and_manifest_write_never_follow_a_link(tmp_path: Path) -> None:
    from quantkit.io import jsonout

    outside = tmp_path / "outside.json"
    outside.write_text("keep")
    (tmp_path / "a.json").symlink_to(outside)
    jsonout.write(tmp_path / "a.json", {"x": float("nan")})
    assert outside.read_text() == "keep"
    assert json.loads((tmp_path / "a.json").read_text()) == {"x": None}


@pytest.mark.parametrize("overwrite", [True, False])
def test_deploy_never_writes_through_a_planted_link(tmp_path: Path, overwrite: bool) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    out = tmp_path / "out"
    out.mkdir()
    (out / "deploy.json").symlink_to(outside)
    run = run_cli(["deploy", str(TARGET), "--platform", "cpu", "--out", str(out),
                   *(["--overwrite"] if overwrite else [])], cwd=tmp_path)
    assert outside.read_text() == "secret"
    if overwrite:
        assert run.returncode == 0, run.stderr
        assert not (out / "deploy.json").is_symlink()
        assert json.loads((out / "deploy.json").read_text())["ok"] is True
    else:
        _one_error(run, "deploy.json exists", "--overwrite")
        assert (out / "deploy.json").is_symlink()
