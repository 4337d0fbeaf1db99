"""The gate's report files: report.json (results.GateReport), report-<candidate>.json (results.CandidateReport, what `publish --report` reads), report.md (also appended to $GITHUB_STEP_SUMMARY) and junit.xml."""

from __future__ import annotations

import os
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

from quantkit.gate.run import GateResult
from quantkit.io import jsonout
from quantkit.results import AcceptanceResult, CheckSummary, EvalResult

# --- report writers ----------------------------------------------------------------------------------------------


def render_markdown(result: GateResult) -> str:
    lines = [f"## quantkit gate `{result.name}`: {'PASSED' if result.passed else 'FAILED'}", ""]
    if result.failures:
        lines += ["Failed:", ""] + [f"- {c.line()}" for c in result.failures] + [""]
    lines += ["| candidate | step | figure | value | threshold | result |", "|---|---|---|---|---|---|"]
    for c in result.checks:
        value = "-" if c.value is None else f"{c.value:.4g}"
        thr = "-" if c.threshold is None else f"{c.op} {c.threshold:.4g}"
        verdict = "pass" if c.passed else f"**FAIL**{': ' + c.message if c.message else ''}"
        lines.append(f"| {c.candidate} | {c.step} | `{c.name}` | {value} | {thr} | {verdict} |")
    for name, rep in result.candidates.items():
        lines += _acceptance_md(name, rep.acceptance) + _eval_md(name, rep.eval) + _check_md(name, rep.check)
    return "\n".join(lines) + "\n"


def _f(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _acceptance_md(name: str, acc: AcceptanceResult | None) -> list[str]:
    if acc is None or acc.baseline is None or acc.candidate is None:
        return []
    lines = ["", f"### {name}: acceptance length ({acc.backend}, K={acc.settings.num_speculative_tokens})", "",
             "| domain | BF16 draft AL | candidate AL | ratio |", "|---|---|---|---|"]
    for d, r in acc.per_domain_ratio.items():
        lines.append(f"| {d} | {_f(acc.baseline.domain_al(d))} | {_f(acc.candidate.domain_al(d))} | {_f(r)} |")
    lo, hi = acc.ratio_ci or [None, None]
    lines.append(f"| **all** | {_f(acc.baseline.mean_acceptance_length)} | {_f(acc.candidate.mean_acceptance_length)} "
                 f"| {_f(acc.ratio)} (95% CI {_f(lo)}-{_f(hi)}) |")
    return lines


def _eval_md(name: str, ev: EvalResult | None) -> list[str]:
    if ev is None:
        return []
    lines = ["", f"### {name}: eval ({ev.backend}, limit {ev.limit})", "",
             "| task | metric | baseline | quantized | delta | recovery |", "|---|---|---|---|---|---|"]
    for t in ev.tasks:
        lines.append(f"| {t.task} | {t.metric} | {_f(t.baseline, 4)} | {_f(t.candidate, 4)} | {_f(t.delta, 4)} | "
                     f"{_f(t.recovery, 4)} |")
    return lines


def _check_md(name: str, chk: CheckSummary | None) -> list[str]:
    if chk is None:
        return []
    lines = ["", f"### {name}: check: {chk.errors} errors, {chk.warnings} warnings"]
    for f in chk.findings:
        if f.severity in ("error", "warning"):
            lines.append(f"- {f.severity}: `{f.code}` {f.layer_or_tensor}: {f.message}")
    return lines


def render_junit(result: GateResult) -> str:
    cases = []
    for c in result.checks:
        name = quoteattr(c.name)
        cls = quoteattr(f"quantkit.gate.{c.candidate}.{c.step}")
        if c.passed:
            cases.append(f"    <testcase classname={cls} name={name}/>")
        else:
            cases.append(f"    <testcase classname={cls} name={name}>\n"
                         f"      <failure message={quoteattr(c.line())}>{escape(c.message or c.line())}</failure>\n"
                         f"    </testcase>")
    failures = len(result.failures)
    return ('<?xml version="1.0" encoding="UTF-8"?>\n'
            f'<testsuites tests="{len(result.checks)}" failures="{failures}">\n'
            f'  <testsuite name={quoteattr("quantkit-gate " + result.name)} tests="{len(result.checks)}" '
            f'failures="{failures}" time="{result.seconds:.2f}">\n' + "\n".join(cases) + "\n  </testsuite>\n</testsuites>\n")


def write_reports(result: GateResult, out_dir: str | Path, junit: str | Path | None = None) -> dict[str, str]:
    """report.json (+ one report-<candidate>.json per candidate for `publish --report`), report.md, junit.xml."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "report.json", "markdown": out / "report.md",
             "junit": Path(junit) if junit else out / "junit.xml"}
    result.outputs = {k: str(v) for k, v in paths.items()}
    paths["json"].write_text(jsonout.dumps(result.to_dict()) + "\n")
    for name, rep in result.candidates.items():
        (out / f"report-{name}.json").write_text(jsonout.dumps(rep.to_dict()) + "\n")
    md = render_markdown(result)
    paths["markdown"].write_text(md)
    paths["junit"].parent.mkdir(parents=True, exist_ok=True)
    paths["junit"].write_text(render_junit(result))
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a", encoding="utf-8") as f:
            f.write(md)
    return result.outputs
