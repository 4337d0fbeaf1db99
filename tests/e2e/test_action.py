# tier: e2e
"""The composite GitHub Action (action.yml, issue 40): its `run:` lines, run in order with bash as the runner runs
them (inputs substituted, GITHUB_OUTPUT a file), gate a passing and a failing candidate: the report is written
either way, to the folder the upload step uploads, and the job fails exactly when the verdict is not pass."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from quantkit.apply.run import apply

ROOT = Path(__file__).resolve().parents[2]
EXPR = re.compile(r"\$\{\{\s*([\w.-]+)\s*\}\}")


def run_action(inputs: dict[str, str], workdir: Path) -> tuple[int, dict[str, str], dict]:
    """Run action.yml's steps as a runner would: `run:` steps with bash, outputs collected from GITHUB_OUTPUT;
    the `uses:` step (upload-artifact) is returned, its `with:` resolved, instead of being run."""
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    values = {name: str(spec.get("default", "")) for name, spec in action["inputs"].items()} | inputs
    outputs: dict[str, dict[str, str]] = {}
    upload: dict = {}

    def resolve(text: str) -> str:
        def one(m: re.Match[str]) -> str:
            parts = m.group(1).split(".")
            if parts[0] == "inputs":
                return values[parts[1]]
            if parts[0] == "steps":
                return outputs.get(parts[1], {}).get(parts[3], "")
            raise AssertionError(f"unknown expression {m.group(0)}")

        return EXPR.sub(one, text)

    code = 0
    for step in action["runs"]["steps"]:
        if "uses" in step:
            assert step.get("if") == "always()", "the report must be uploaded whatever the verdict"
            upload = {k: resolve(str(v)) for k, v in step["with"].items()}
            continue
        out_file = workdir / f"output-{step.get('id', 'x')}"
        out_file.write_text("")
        env = {**os.environ, "GITHUB_OUTPUT": str(out_file)}
        done = subprocess.run(["bash", "-e", "-c", resolve(step["run"])], cwd=workdir, env=env)
        outputs[step.get("id", "")] = dict(line.split("=", 1) for line in out_file.read_text().splitlines())
        code = done.returncode
        if code != 0:
            break
    return code, outputs.get("gate", {}), upload


@pytest.fixture(scope="module")
def draft_fp8(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("action") / "draft-fp8"
    apply("fp8-draft", tiny / "eagle3-draft", out, target=tiny / "target")
    return out


@pytest.mark.parametrize("max_size_ratio,verdict_code", [(1.0, 0), (0.05, 1)])
def test_action_gates_and_uploads_the_report(
    tiny: Path, draft_fp8: Path, tmp_path: Path, max_size_ratio: float, verdict_code: int
) -> None:
    config = tmp_path / "gate.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "action",
                "target": str(tiny / "target"),
                "draft": str(tiny / "eagle3-draft"),
                "candidates": [{"name": "draft-fp8", "path": str(draft_fp8)}],
                "steps": ["check"],
                "check": {"platform": "cpu", "vllm": "off", "max_size_ratio": max_size_ratio},
            }
        )
    )
    code, gate_outputs, upload = run_action({"config": str(config), "install": "", "python": sys.executable}, tmp_path)
    assert code == verdict_code
    assert gate_outputs["exit-code"] == str(verdict_code)
    report = tmp_path / upload["path"]
    assert report == tmp_path / "quantkit-gate-report"
    assert {"report.json", "report.md", "junit.xml"} <= {p.name for p in report.iterdir()}
