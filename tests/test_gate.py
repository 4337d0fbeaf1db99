"""`quantkit gate`: passes on the bundled pair, fails closed and says why, rejects bad configs."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET

import pytest
import yaml
from click.testing import CliRunner

from quantkit.cli import main

pytestmark = pytest.mark.slow


def _config(tmp_path, tiny, candidate, **over) -> str:
    cfg = {
        "name": "t",
        "target": str(tiny / "target"),
        "draft": str(tiny / "eagle3-draft"),
        "candidates": [{"name": "draft-fp8", "path": str(candidate)}],
        "steps": ["check", "acceptance"],
        "check": {"vllm": "off"},
        "acceptance": {"min_ratio": 0.98, "per_domain_min_ratio": 0.95, "min_al": 2.0, "backend": "reference"},
    }
    cfg.update(over)
    path = tmp_path / "gate.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def _gate(config: str, out, *extra: str):
    return CliRunner().invoke(main, ["gate", config, "--out", str(out), *extra])


def test_gate_passes_on_the_bundled_pair(tiny, fp8_draft, tmp_path, monkeypatch):
    summary = tmp_path / "summary.md"
    summary.write_text("before\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    out, _ = fp8_draft
    result = _gate(_config(tmp_path, tiny, out), tmp_path / "r", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["schema_version"] == 1 and data["gate"]["passed"] is True and data["gate"]["verdict"] == "pass"
    names = {c["name"] for c in data["gate"]["checks"]}
    assert {"check.errors", "acceptance.ratio", "acceptance.candidate_al", "acceptance.per_domain_ratio.math",
            "check.unexpected_unquantized", "check.precision_mismatches", "size.ratio", "size.prediction_error",
            "tokenizer.drifted_files"} <= names
    assert data["candidates"]["draft-fp8"]["verdict"] == "pass"
    assert "gate verdict: pass" in result.stderr
    acc = data["candidates"]["draft-fp8"]["acceptance"]
    assert acc["ratio"] >= 0.98 and acc["baseline"]["mean_acceptance_length"] >= 2.0
    # the three report forms agree, and the step summary got the Markdown appended
    assert json.loads((tmp_path / "r" / "report.json").read_text()) == data
    md = (tmp_path / "r" / "report.md").read_text()
    assert "PASSED (verdict: **pass**)" in md and "| **all** |" in md
    assert summary.read_text() == "before\n" + md
    # the acceptance chart, linked from the Markdown
    chart = tmp_path / "r" / "acceptance-draft-fp8.png"
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "](acceptance-draft-fp8.png)" in md
    suite = ET.parse(tmp_path / "r" / "junit.xml").getroot()
    assert suite.get("failures") == "0" and int(suite.get("tests")) == len(data["gate"]["checks"])
    # the per-candidate report is what publish --report reads
    from quantkit.results import load_report

    rep = load_report(tmp_path / "r" / "report.json", model=out)
    assert rep.acceptance is not None and rep.acceptance.ratio == acc["ratio"] and rep.gate.passed is True


def test_gate_fails_on_a_damaged_draft(tiny, broken_fp8_draft, tmp_path):
    result = _gate(_config(tmp_path, tiny, broken_fp8_draft), tmp_path / "r")
    assert result.exit_code == 1, result.output
    assert "gate verdict: regression" in result.stderr
    lines = [x for x in result.stderr.splitlines() if x.startswith("gate failed:")]
    assert any("acceptance: acceptance.ratio = " in x and "threshold >= 0.98" in x for x in lines), lines
    assert any("acceptance.candidate_al" in x and "threshold >= 2" in x for x in lines), lines
    junit = ET.parse(tmp_path / "r" / "junit.xml").getroot()
    assert int(junit.get("failures")) >= 2


def test_gate_fails_on_a_wrong_exclusion(tiny, fp8_draft, tmp_path):
    out, _ = fp8_draft
    bad = tmp_path / "draft-quark-exclude"
    shutil.copytree(out, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["quantization_config"]["exclude"] = ["fc", "lm_head"]
    (bad / "config.json").write_text(json.dumps(cfg))
    result = _gate(_config(tmp_path, tiny, bad, steps=["check"]), tmp_path / "r")
    assert result.exit_code == 1, result.output
    line = next(x for x in result.stderr.splitlines() if "check.errors" in x)
    assert "check: check.errors = 1 (threshold <= 0)" in line and "model.fc" in line


def test_gate_fails_closed_on_a_missing_step_result(tiny, fp8_draft, tmp_path):
    """eval is configured but no candidate is a target: no result is a failure, not a pass."""
    out, _ = fp8_draft
    cfg = _config(tmp_path, tiny, out, steps=["check", "eval"], eval={"tasks": ["tiny_french_mc"]})
    result = _gate(cfg, tmp_path / "r")
    assert result.exit_code == 1, result.output
    assert any("eval: eval.result: no result" in x for x in result.stderr.splitlines()), result.stderr
    assert "gate verdict: infeasible" in result.stderr
    assert json.loads((tmp_path / "r" / "report.json").read_text())["gate"]["verdict"] == "infeasible"


@pytest.mark.parametrize("mutate, needle", [
    (lambda c: c.update(thresholds={"x": 1}), "thresholds: unknown key"),
    (lambda c: c["acceptance"].update(min_ratoi=0.9), "acceptance.min_ratoi: unknown key"),
    (lambda c: c.update(steps=["check", "benchmark"]), "steps.1"),
    (lambda c: c["candidates"][0].update(path="/nowhere/x"), "candidates[0].path: /nowhere/x does not exist"),
    (lambda c: c.pop("target"), "target: field required"),
    (lambda c: c.update(serve={"al_tolerence": 0.1}), "serve.al_tolerence: unknown key"),
    (lambda c: c.update(serve={"batch_sizes": [1, 8], "require_batch_sizes": [16]}),
     "serve.require_batch_sizes: [16] not in serve.batch_sizes [1, 8]"),
    (lambda c: c.update(serve={"batch_sizes": [0]}), "serve.batch_sizes: distinct sizes of at least 1"),
    (lambda c: c.update(steps=["check", "serve", "serve"]), "steps: each step at most once"),
    (lambda c: c.update(check={"max_size_ratio": 0}), "check.max_size_ratio: input should be greater than 0"),
    (lambda c: (c.pop("draft"), c.update(steps=["bench"])), "draft: the bench step needs the BF16 draft"),
    (lambda c: c.update(bench={"concurrency": [1, 1]}), "bench.concurrency: distinct values of at least 1"),
    (lambda c: c.update(bench={"min_speedup": 0}), "bench.min_speedup: input should be greater than 0"),
    (lambda c: c.update(bench={"ks": [1, 1]}), "bench.ks: distinct values of at least 0"),
])
def test_bad_gate_config(tiny, tmp_path, mutate, needle):
    cfg = {"name": "t", "target": str(tiny / "target"), "draft": str(tiny / "eagle3-draft"),
           "candidates": [{"name": "c", "path": str(tiny / "eagle3-draft")}], "steps": ["check"],
           "acceptance": {}}
    mutate(cfg)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    result = _gate(str(path), tmp_path / "r")
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: gate config") and needle in lines[0], lines
    assert "Traceback" not in result.output and not (tmp_path / "r").exists()


def test_bench_figures_of_a_k_sweep_judge_the_gated_k():
    """With bench.ks the bench measures the candidate at several K; the gated figures are those of the arm at the
    gate's K (tests/data/bench-tiny-ksweep.json: a real run on the tiny models, K=1 and K=3)."""
    from quantkit.gate.config import BenchStep
    from quantkit.gate.steps.bench import bench_figures
    from quantkit.results import BenchResult
    from tests.conftest import ROOT

    res = BenchResult.model_validate(json.loads((ROOT / "tests" / "data" / "bench-tiny-ksweep.json").read_text()))
    for k in (1, 3):
        figs = {f.name: f for f in bench_figures("c", res, BenchStep(min_speedup=0.5), k)}
        for c in (1, 2):
            assert figs[f"bench.c{c}.speedup"].value == res.comparison(f"target+candidate@k{k}", c).speedup
