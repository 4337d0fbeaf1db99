# tier: e2e
"""Issue 35 items 2 and 3, issue 36 item 9, for `quantkit bench`: where bench may write, checked before any import of
vLLM (the real CLI in a subprocess, with heavy imports forbidden: a refusal must come first).

bench writes `OUT/bench.json`, the charts, `OUT/third-party.log` and `OUT/<arm name>/` (prompts and per-cell JSON).
So an --out that is, lies inside, or CONTAINS a model folder it reads is refused: `--out .` run beside a model folder
named `target` would write `./target/c1-r0.json` into it. Links are resolved. Each case: exit 2, exactly one `error:`
line, no traceback, nothing written, every model folder's SHA-256 unchanged.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.fixtures.hostile import error_lines, pickle_only_folder, run_cli, tree_digest


@pytest.fixture()
def models(tiny, tmp_path) -> dict[str, Path]:
    root = tmp_path / "models"
    return {
        "root": root,
        "target": shutil.copytree(tiny / "target", root / "target"),
        "draft": shutil.copytree(tiny / "eagle3-draft", root / "draft"),
        "candidate": shutil.copytree(tiny / "eagle3-draft", root / "cand"),
    }


def _refused(models: dict[str, Path], tmp_path: Path, out: Path | None, *extra: str, cwd: Path | None = None) -> str:
    before = tree_digest(models["root"])
    argv = [
        "bench",
        "--target",
        str(models["target"]),
        "--draft",
        str(models["draft"]),
        "--candidate",
        str(models["candidate"]),
        *extra,
    ] + (["--out", str(out)] if out is not None else [])
    r = run_cli(argv, cwd=cwd or tmp_path, forbid_heavy=True, timeout=120)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert len(error_lines(r.stderr)) == 1 and "Traceback" not in r.stderr + r.stdout, r.stderr
    assert tree_digest(models["root"]) == before, "a model folder changed"
    return error_lines(r.stderr)[0]


@pytest.mark.parametrize("where", ["target", "target/bench", "draft", "cand/x/y"])
def test_out_is_or_lies_inside_a_model_folder(models, tmp_path, where):
    line = _refused(models, tmp_path, models["root"] / where)
    assert "model folder" in line and where.split("/")[0] in line
    assert not (models["root"] / "target" / "bench").exists() and not (models["root"] / "cand" / "x").exists()


def test_out_that_holds_a_model_folder_is_refused(models, tmp_path):
    """`--out` = the folder the models are in: bench's arm folder `OUT/target/` would be the target itself."""
    line = _refused(models, tmp_path, models["root"])
    assert "contains the model folder" in line
    assert sorted(p.name for p in models["root"].iterdir()) == ["cand", "draft", "target"]


def test_default_out_inside_the_model_folder_is_refused(models, tmp_path):
    """Run from inside the target folder: the default ./quantkit-out/bench-<name> lies inside the model."""
    line = _refused(models, tmp_path, None, cwd=models["target"])
    assert "model folder" in line and not (models["target"] / "quantkit-out").exists()


def test_out_through_a_link_to_a_model_folder_is_refused(models, tmp_path):
    link = tmp_path / "looks-harmless"
    link.symlink_to(models["draft"], target_is_directory=True)
    line = _refused(models, tmp_path, link)
    assert "model folder" in line


def test_candidate_target_folder_counts_too(models, tmp_path):
    qt = shutil.copytree(models["target"], models["root"] / "qtarget")
    line = _refused(models, tmp_path, qt / "out", "--candidate-target", str(qt))
    assert "qtarget" in line


@pytest.mark.parametrize("which", ["--draft", "--candidate", "--candidate-target"])
def test_pickle_only_model_folder_is_refused_before_any_server(models, tmp_path, which):
    marker = tmp_path / "pwned"
    pickled = pickle_only_folder(models["draft"], models["root"] / "pickled", marker)
    if which == "--draft":
        argv = ["bench", "--target", str(models["target"]), "--draft", str(pickled)]
    elif which == "--candidate":
        argv = [
            "bench",
            "--target",
            str(models["target"]),
            "--draft",
            str(models["draft"]),
            "--candidate",
            str(pickled),
        ]
    else:
        argv = ["bench", "--target", str(models["target"]), "--candidate-target", str(pickled)]
    before = tree_digest(models["root"])
    r = run_cli([*argv, "--out", str(tmp_path / "out")], cwd=tmp_path, forbid_heavy=True, timeout=120)
    assert r.returncode == 2 and len(error_lines(r.stderr)) == 1, r.stderr[-2000:]
    assert "pickle" in r.stderr and "pytorch_model.bin" in r.stderr
    assert not marker.exists() and not (tmp_path / "out").exists()
    assert tree_digest(models["root"]) == before
