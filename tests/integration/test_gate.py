"""`quantkit gate`: passes on the bundled pair, fails closed and says why, rejects bad configs.

Bad configs and fail-closed cases, without vLLM, are in tests/unit/test_gate_config.py.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from tests.unit.test_gate_config import _config, _gate


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
    assert {
        "check.errors",
        "acceptance.ratio",
        "acceptance.candidate_al",
        "acceptance.per_domain_ratio.math",
        "check.unexpected_unquantized",
        "check.precision_mismatches",
        "size.ratio",
        "size.prediction_error",
        "tokenizer.drifted_files",
    } <= names
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
