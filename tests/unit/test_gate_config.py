# tier: unit
"""`quantkit gate` without vLLM: fails closed and says why, rejects bad configs, judges a K sweep's bench figures (the passing and failing runs over vLLM are in tests/integration/test_gate.py)."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml
from click.testing import CliRunner

from quantkit.cli import main


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


@pytest.mark.parametrize(
    "mutate, needle",
    [
        (lambda c: c.update(thresholds={"x": 1}), "thresholds: unknown key"),
        (lambda c: c["acceptance"].update(min_ratoi=0.9), "acceptance.min_ratoi: unknown key"),
        (lambda c: c.update(steps=["check", "benchmark"]), "steps.1"),
        (lambda c: c["candidates"][0].update(path="/nowhere/x"), "candidates[0].path: /nowhere/x does not exist"),
        (lambda c: c.pop("target"), "target: field required"),
        (lambda c: c.update(serve={"al_tolerence": 0.1}), "serve.al_tolerence: unknown key"),
        (
            lambda c: c.update(serve={"batch_sizes": [1, 8], "require_batch_sizes": [16]}),
            "serve.require_batch_sizes: [16] not in serve.batch_sizes [1, 8]",
        ),
        (lambda c: c.update(serve={"batch_sizes": [0]}), "serve.batch_sizes: distinct sizes of at least 1"),
        (lambda c: c.update(steps=["check", "serve", "serve"]), "steps: each step at most once"),
        (lambda c: c.update(check={"max_size_ratio": 0}), "check.max_size_ratio: input should be greater than 0"),
        (lambda c: (c.pop("draft"), c.update(steps=["bench"])), "draft: the bench step needs the BF16 draft"),
        (lambda c: c.update(bench={"concurrency": [1, 1]}), "bench.concurrency: distinct values of at least 1"),
        (lambda c: c.update(bench={"min_speedup": 0}), "bench.min_speedup: input should be greater than 0"),
        (lambda c: c.update(bench={"ks": [1, 1]}), "bench.ks: distinct values of at least 0"),
    ],
)
def test_bad_gate_config(tiny, tmp_path, mutate, needle):
    cfg = {
        "name": "t",
        "target": str(tiny / "target"),
        "draft": str(tiny / "eagle3-draft"),
        "candidates": [{"name": "c", "path": str(tiny / "eagle3-draft")}],
        "steps": ["check"],
        "acceptance": {},
    }
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
