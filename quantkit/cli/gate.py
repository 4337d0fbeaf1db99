"""`quantkit gate`: the pre-deployment check for CI. Exit 0 for the verdict pass, 1 for regression, anomalous or
infeasible, 2 for a bad config."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from quantkit.cli.app import exit_failed, main
from quantkit.cli.options import json_option, make_console, print_json
from quantkit.progress import stderr_progress

if TYPE_CHECKING:  # result types only; the modules are imported when the command runs
    from quantkit.results.gate import GateResult


def _print_example(ctx: click.Context) -> None:
    """The example config shipped in the package (quantkit/data/gate-example.yaml), with the bundled tiny models'
    folder in place of TINY/ so that it runs as printed."""
    from quantkit.io.paths import data_dir, tiny_models_dir

    text = (data_dir() / "gate-example.yaml").read_text(encoding="utf-8")
    click.echo(text.replace("TINY/", f"{tiny_models_dir()}/"), nl=False)
    ctx.exit(0)


@main.command("gate")
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("quantkit-gate"),
    show_default=True,
    help="Folder for report.json, report.md, junit.xml and report-<candidate>.json.",
)
@click.option(
    "--junit",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Where to write the JUnit XML (default: OUT/junit.xml).",
)
@click.option(
    "--example-config",
    is_flag=True,
    is_eager=True,
    expose_value=False,
    callback=lambda ctx, _p, v: _print_example(ctx) if v else None,
    help="Print an example gate config (the bundled tiny deployment, with the commands that make its "
    "candidates) and exit: quantkit gate --example-config > gate.yaml",
)
@json_option("Print the report JSON on stdout.")
def gate_command(config: Path, out_dir: Path, junit: Path | None, as_json: bool) -> None:
    """Run a pre-deployment gate: check, acceptance, eval and a real `vllm serve` on candidates, each figure
    against its threshold, and one verdict.

    \b
    quantkit gate --example-config > gate.yaml      # an example to start from
    quantkit gate gate.yaml --out gate-report --junit junit.xml

    \b
    Verdict: pass; regression (a threshold missed); anomalous (a candidate better than its baseline beyond the
    CI, or served and in-process AL disagree); infeasible (a step could not run or produced no result).
    Exit 0 for pass, 1 otherwise (the gate fails closed), 2 for a bad config. Writes the report as JSON
    (versioned), Markdown, JUnit XML and a chart per candidate, and appends the Markdown to $GITHUB_STEP_SUMMARY
    when it is set.
    """
    from quantkit.gate.config import gate_model_folders, load_gate_config
    from quantkit.gate.reports import write_reports
    from quantkit.gate.run import run as gate
    from quantkit.io.files import check_model_folders

    check_model_folders(gate_model_folders(*load_gate_config(config)), out_dir, extra_outputs=[("--junit", junit)])
    result = gate(config, progress=stderr_progress("gate"))
    write_reports(result, out_dir, junit)
    if as_json:
        print_json(result.to_dict())
    else:
        _render_gate(result)
    for w in result.warnings:
        click.echo(f"warning: {w}", err=True)
    for c in result.failures:
        click.echo(f"gate failed: {c.line()}{': ' + c.message if c.message and c.value is not None else ''}", err=True)
    click.echo(f"gate verdict: {result.verdict}", err=True)
    for reason in result.reasons:
        click.echo(f"  {reason}", err=True)
    if not result.passed:
        exit_failed()


def _render_gate(result: GateResult) -> None:
    from rich.table import Table

    table = Table(
        title=f"gate {result.name}: {'PASSED' if result.passed else 'FAILED'} (verdict {result.verdict})",
        title_justify="left",
    )
    for col in ("candidate", "step", "figure", "value", "threshold", "result"):
        table.add_column(col, overflow="fold")
    for c in result.checks:
        table.add_row(
            c.candidate,
            c.step,
            c.name,
            "-" if c.value is None else f"{c.value:.4g}",
            "-" if c.threshold is None else f"{c.op} {c.threshold:.4g}",
            "pass" if c.passed else f"FAIL {c.message}".strip(),
        )
    console = make_console()
    console.print(table)
    for name, rep in result.candidates.items():
        sr = rep.serve
        for b in sr.batches if sr is not None else []:
            al, ref = b.mean_acceptance_length, sr.in_process_al if sr is not None else None
            console.print(
                f"{name}: served batch {b.batch_size}: AL {'-' if al is None else f'{al:.4f}'} (in-process "
                f"{'-' if ref is None else f'{ref:.4f}'}), TTFT p50 "
                f"{1000 * (b.ttft_s.get('p50') or 0):.0f} ms, {b.tokens_per_s or 0:.1f} tok/s, "
                f"{'well-formed' if b.well_formed else 'MALFORMED'}"
            )
    console.print(f"verdict: {result.verdict}")
    console.print(f"reports: {', '.join(result.outputs.values())}")
