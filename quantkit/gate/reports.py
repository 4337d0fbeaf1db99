"""The gate's report files: report.json (results.GateReport), report-<candidate>.json (results.CandidateReport, what
`publish --report` reads), report.md (also appended to $GITHUB_STEP_SUMMARY), junit.xml, and acceptance-<candidate>.png
(quantkit.publish.charts) for each candidate with an acceptance result."""

from __future__ import annotations

import os
import re
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

from quantkit.io import jsonout
from quantkit.io.files import write_file_atomic
from quantkit.io.markdown import md_code, md_text
from quantkit.results import (
    AcceptanceResult,
    BenchResult,
    CheckSummary,
    EvalResult,
    GateResult,
    ReleaseFigures,
    ServeReport,
)

# --- report writers ----------------------------------------------------------------------------------------------


def render_markdown(result: GateResult, charts: dict[str, str] | None = None) -> str:
    """The report as Markdown; `charts` maps a candidate to its chart's file name (relative to report.md)."""
    lines = [
        f"## quantkit gate {md_code(result.name)}: {'PASSED' if result.passed else 'FAILED'} (verdict: "
        f"**{md_text(result.verdict)}**)",
        "",
    ]
    if result.reasons:
        lines += ["Verdict reasons:", ""] + [f"- {md_text(r)}" for r in result.reasons] + [""]
    if result.failures:
        lines += ["Failed:", ""] + [f"- {md_text(c.line())}" for c in result.failures] + [""]
    lines += ["| candidate | step | figure | value | threshold | result |", "|---|---|---|---|---|---|"]
    for c in result.checks:
        value = "-" if c.value is None else f"{c.value:.4g}"
        thr = "-" if c.threshold is None else f"{c.op} {c.threshold:.4g}"
        verdict = "pass" if c.passed else f"**FAIL**{': ' + md_text(c.message) if c.message else ''}"
        lines.append(
            f"| {md_text(c.candidate)} | {md_text(c.step)} | {md_code(c.name)} | {value} | {thr} | {verdict} |"
        )
    for name, rep in result.candidates.items():
        lines += ["", f"### {md_text(name)}: verdict {md_text(rep.verdict or '-')}"]
        lines += _acceptance_md(name, rep.acceptance) + _eval_md(name, rep.eval)
        if charts and name in charts:
            lines += ["", f"![acceptance chart of {md_text(name)}]({md_text(charts[name])})"]
        lines += (
            _serve_md(name, rep.serve)
            + _bench_md(name, rep.bench)
            + _release_md(name, rep.release)
            + _check_md(name, rep.check)
        )
    return "\n".join(lines) + "\n"


def _f(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _acceptance_md(name: str, acc: AcceptanceResult | None) -> list[str]:
    if acc is None or acc.baseline is None or acc.candidate is None:
        return []
    lines = [
        "",
        f"### {md_text(name)}: acceptance length ({md_text(acc.backend)}, K={acc.settings.num_speculative_tokens})",
        "",
        "| domain | BF16 draft AL (pooled) | candidate AL (pooled) | ratio |",
        "|---|---|---|---|",
    ]
    for d, r in acc.per_domain_ratio.items():
        lines.append(f"| {md_text(d)} | {_f(acc.baseline.domain_al(d))} | {_f(acc.candidate.domain_al(d))} | {_f(r)} |")
    lo, hi = acc.ratio_ci or [None, None]
    lines.append(
        f"| **all** | {_f(acc.baseline.mean_acceptance_length)} | {_f(acc.candidate.mean_acceptance_length)} "
        f"| {_f(acc.ratio)} (95% CI {_f(lo)}-{_f(hi)}) |"
    )
    return lines


def _eval_md(name: str, ev: EvalResult | None) -> list[str]:
    if ev is None:
        return []
    lines = [
        "",
        f"### {md_text(name)}: eval ({md_text(ev.backend)}, limit {ev.limit})",
        "",
        "| task | metric | baseline | quantized | delta | recovery |",
        "|---|---|---|---|---|---|",
    ]
    for t in ev.tasks:
        lines.append(
            f"| {md_text(t.task)} | {md_text(t.metric)} | {_f(t.baseline, 4)} | {_f(t.candidate, 4)} | {_f(t.delta, 4)} | "
            f"{_f(t.recovery, 4)} |"
        )
    return lines


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{1000 * v:.1f}"


def _bench_md(name: str, res: BenchResult | None) -> list[str]:
    summary = res.speedup_summary() if res is not None else None
    if summary is None:
        return []
    from quantkit.bench.tables import speedup_markdown

    return [
        "",
        f"### {md_text(name)}: served speedup (quantkit bench, arm {md_text(summary.candidate_arm)})",
        "",
        *speedup_markdown(summary),
    ]


def _serve_md(name: str, sr: ServeReport | None) -> list[str]:
    if sr is None:
        return []
    lines = [
        "",
        f"### {md_text(name)}: served (`vllm serve`, K={sr.num_speculative_tokens}, {sr.num_prompts} prompts x "
        f"{sr.max_tokens} tokens, up in {_f(sr.startup_s, 1)} s)",
        "",
    ]
    if sr.error:
        lines += [f"Step failed: {md_text(sr.error)}", ""]
    if sr.batches:
        ref = sr.in_process_al
        lines += [
            f"| batch | served AL | in-process AL ({md_text(sr.in_process_source)}) | difference | TTFT p50 ms "
            "| TTFT p90 ms | TPOT ms | tokens/s | well-formed |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for b in sr.batches:
            al = b.mean_acceptance_length
            diff = al - ref if al is not None and ref is not None else None
            lines.append(
                f"| {b.batch_size} | {_f(al, 4)} | {_f(ref, 4)} | {_f(diff, 4)} | "
                f"{_ms(b.ttft_s.get('p50'))} | {_ms(b.ttft_s.get('p90'))} | {_ms(b.tpot_s)} | "
                f"{_f(b.tokens_per_s, 1)} | "
                f"{'yes' if b.well_formed else f'no ({b.malformed_responses})'} |"
            )
    return lines


def _release_md(name: str, rel: ReleaseFigures | None) -> list[str]:
    if rel is None:
        return []
    pred = f" (apply --dry-run predicts {rel.predicted_size_ratio:.4f})" if rel.predicted_size_ratio is not None else ""
    drift = rel.tokenizer_drift
    tok = "-" if drift is None else "byte-identical" if not drift else f"{len(drift)} files drift"
    lines = [
        "",
        f"### {md_text(name)}: release checks against {md_code(rel.source)}",
        "",
        f"- weight bytes: {_f(rel.size_ratio, 4)} of the source{pred}",
        f"- tokenizer: {tok}",
    ]
    lines += [f"  - {md_text(d)}" for d in drift or []]
    return lines


def _check_md(name: str, chk: CheckSummary | None) -> list[str]:
    if chk is None:
        return []
    lines = ["", f"### {md_text(name)}: check: {chk.errors} errors, {chk.warnings} warnings"]
    for f in chk.findings:
        if f.severity in ("error", "warning"):
            lines.append(
                f"- {md_text(f.severity)}: {md_code(f.code)} {md_text(f.layer_or_tensor)}: {md_text(f.message)}"
            )
    return lines


# Characters XML 1.0 cannot carry at all, not even as character references (XML 1.0 section 2.2 `Char`): C0 controls
# other than tab, newline and carriage return, surrogates, U+FFFE and U+FFFF. Step messages quote exceptions and
# file contents, so any of them can turn up; they are written as visible `\xNN` / `\uNNNN` text instead.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_text(text: str) -> str:
    """`text` with every character XML 1.0 forbids replaced by its escape sequence as visible text."""
    return _NOT_XML.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def _attr(text: str) -> str:
    return quoteattr(xml_text(text))


def render_junit(result: GateResult) -> str:
    """JUnit XML that any XML 1.0 parser reads, whatever the names and messages hold."""
    cases = []
    for c in result.checks:
        name = _attr(c.name)
        cls = _attr(f"quantkit.gate.{c.candidate}.{c.step}")
        if c.passed:
            cases.append(f"    <testcase classname={cls} name={name}/>")
        else:
            cases.append(
                f"    <testcase classname={cls} name={name}>\n"
                f"      <failure message={_attr(c.line())}>{escape(xml_text(c.message or c.line()))}"
                "</failure>\n    </testcase>"
            )
    failures = len(result.failures)
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<testsuites tests="{len(result.checks)}" failures="{failures}">\n'
        f'  <testsuite name={_attr("quantkit-gate " + result.name)} tests="{len(result.checks)}" '
        f'failures="{failures}" time="{result.seconds:.2f}">\n'
        f'    <properties><property name="verdict" value={_attr(result.verdict)}/></properties>\n'
        + "\n".join(cases)
        + "\n  </testsuite>\n</testsuites>\n"
    )


def write_charts(result: GateResult, out: Path) -> dict[str, str]:
    """acceptance-<candidate>.png (quantkit.publish.charts) for each candidate with acceptance figures; candidate ->
    file name. A stale chart of an earlier run is removed, so the folder shows only this run's."""
    from quantkit.publish.charts import render_acceptance_chart

    charts: dict[str, str] = {}
    for name, rep in result.candidates.items():
        path = out / f"acceptance-{name}.png"
        path.unlink(missing_ok=True)
        if rep.acceptance is not None and render_acceptance_chart(rep.acceptance, rep.eval, path) is not None:
            charts[name] = path.name
    return charts


def write_reports(result: GateResult, out_dir: str | Path, junit: str | Path | None = None) -> dict[str, str]:
    """report.json (+ one report-<candidate>.json per candidate for `publish --report`), report.md, junit.xml, and
    acceptance-<candidate>.png charts."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": out / "report.json",
        "markdown": out / "report.md",
        "junit": Path(junit) if junit else out / "junit.xml",
    }
    charts = write_charts(result, out)
    result.outputs = {k: str(v) for k, v in paths.items()}
    result.outputs.update({f"chart:{name}": str(out / f) for name, f in charts.items()})
    jsonout.write(paths["json"], result.to_dict())
    for name, rep in result.candidates.items():
        jsonout.write(out / f"report-{name}.json", rep.to_dict())
    md = render_markdown(result, charts)
    write_file_atomic(paths["markdown"], md)
    write_file_atomic(paths["junit"], render_junit(result))
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        try:
            with open(summary, "a", encoding="utf-8") as f:
                f.write(md)
        except (OSError, ValueError) as e:  # a folder, a read-only file, a NUL byte in the variable: the verdict stands
            why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            result.warnings.append(
                f"GITHUB_STEP_SUMMARY={summary[:200]}: cannot append the report ({why}); it is in {paths['markdown']}"
            )
    return result.outputs
