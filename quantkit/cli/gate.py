"""`quantkit gate`: the pre-deployment check for CI. Exit 0 pass, 1 fail, 2 bad config."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from quantkit.cli.app import exit_failed, main
from quantkit.cli.options import json_option, make_console, print_json
from quantkit.progress import stderr_progress

if TYPE_CHECKING:  # result types only; the modules are imported when the command runs
    from quantkit.gate.run import GateResult


@main.command("gate")
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("quantkit-gate"),
              show_default=True, help="Folder for report.json, report.md, junit.xml and report-<candidate>.json.")
@click.option("--junit", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Where to write the JUnit XML (default: OUT/junit.xml).")
@json_option("Print the report JSON on stdout.")
def gate_command(config: Path, out_dir: Path, junit: Path | None, as_json: bool) -> None:
    """Run a pre-deployment gate: check, acceptance and eval on candidates, each figure against its threshold.

    \b
    quantkit gate examples/gate-tiny.yaml --out gate-report --junit junit.xml

    Exit 0 when every threshold holds; 1 when any is missed, any step fails or errors, or a configured step
    produced no result (the gate fails closed); 2 for a bad config. Writes the report as JSON (versioned), Markdown
    and JUnit XML, and appends the Markdown to $GITHUB_STEP_SUMMARY when it is set.
    """
    from quantkit.gate.reports import write_reports
    from quantkit.gate.run import run_gate

    result = run_gate(config, progress=stderr_progress("gate"))
    write_reports(result, out_dir, junit)
    if as_json:
        print_json(result.to_dict())
    else:
        _render_gate(result)
    for c in result.failures:
        click.echo(f"gate failed: {c.line()}{': ' + c.message if c.message and c.value is not None else ''}",
                   err=True)
    if not result.passed:
        exit_failed()


def _render_gate(result: GateResult) -> None:
    from rich.table import Table

    table = Table(title=f"gate {result.name}: {'PASSED' if result.passed else 'FAILED'}", title_justify="left")
    for col in ("candidate", "step", "figure", "value", "threshold", "result"):
        table.add_column(col, overflow="fold")
    for c in result.checks:
        table.add_row(c.candidate, c.step, c.name, "-" if c.value is None else f"{c.value:.4g}",
                      "-" if c.threshold is None else f"{c.op} {c.threshold:.4g}",
                      "pass" if c.passed else f"FAIL {c.message}".strip())
    console = make_console()
    console.print(table)
    console.print(f"reports: {', '.join(result.outputs.values())}")
