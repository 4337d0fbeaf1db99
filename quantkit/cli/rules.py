"""`quantkit rules`: the rule table check, inspect and deploy read (quantkit.rules.table), with each rule's platforms,
vLLM version range, source and whether it is decided from the checkpoint or only at serve time."""

from __future__ import annotations

import click

from quantkit.cli.app import main
from quantkit.cli.options import json_option, make_console, print_json, verbose_option, vllm_version_option
from quantkit.vocab import PLATFORMS


@main.command("rules")
@click.option(
    "--platform", "platform", type=click.Choice(PLATFORMS), default=None, help="Mark which rules hold on this platform."
)
@vllm_version_option()
@verbose_option("the vLLM source each rule replays")
@json_option("Print the table as JSON (RulesResult).")
def rules_command(platform: str | None, vllm_version: str | None, verbose: bool, as_json: bool) -> None:
    """Print the rule table: id, severity, the commands that run it, and what it checks (with its platforms and
    vLLM versions when it does not hold everywhere); --verbose adds each rule's vLLM source.

    \b
    quantkit rules
    quantkit rules --platform gfx942 --vllm-version 0.25.1 --json
    """
    render_rules(platform, vllm_version, as_json, verbose)


def rules_result(platform: str | None, vllm_version: str | None):  # -> RulesResult (imported when run)
    from quantkit.results.kernels import RuleRow, RulesResult
    from quantkit.rules.table import RULES
    from quantkit.rules.vllm_versions import KNOWN_VLLM_VERSIONS, resolve_vllm_version, unknown_version_note

    version = resolve_vllm_version(vllm_version) if vllm_version is not None else None
    filtered = platform is not None or version is not None
    rows = []
    for r in RULES:
        holds = None
        if filtered:
            holds = (r.platforms is None or platform is None or platform in r.platforms) and r.holds_for_version(
                version
            )
        rows.append(
            RuleRow(
                id=r.id,
                title=r.title,
                severity=r.severity,
                codes=list(r.codes),
                commands=sorted(r.commands),
                platforms=sorted(r.platforms) if r.platforms is not None else None,
                vllm_min=r.vllm_min,
                vllm_max=r.vllm_max,
                decided_at=r.decided_at,
                when=r.when,
                needs=r.needs,
                reads=r.reads,
                source=r.source,
                holds=holds,
            )
        )
    return RulesResult(
        platform=platform,
        vllm_version=version,
        known_vllm_versions=list(KNOWN_VLLM_VERSIONS),
        version_note=unknown_version_note(version) if version is not None else None,
        rules=rows,
    )


def render_rules(platform: str | None, vllm_version: str | None, as_json: bool, verbose: bool = False) -> None:
    """The rule table: what each rule checks, in columns that fit the terminal (ids never wrap); the scope of a rule
    that does not hold everywhere is said after its title; sources with --verbose (always in --json)."""
    result = rules_result(platform, vllm_version)
    if as_json:
        print_json(result.to_dict())
        return
    from rich import box
    from rich.table import Table

    console = make_console()
    title = (
        f"quantkit rule table: {len(result.rules)} rules"
        + (f", platform {platform}" if platform else "")
        + (f", vLLM {result.vllm_version}" if result.vllm_version else "")
    )
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("id", no_wrap=True, min_width=max((len(r.id) for r in result.rules), default=2))
    table.add_column("severity", no_wrap=True)
    table.add_column("runs in", no_wrap=True)
    table.add_column("what it checks", overflow="fold", ratio=1)
    holds = bool(result.rules) and result.rules[0].holds is not None
    if holds:
        table.add_column("holds", no_wrap=True)
    for r in result.rules:
        scope = [
            f"on {', '.join(r.platforms)}" if r.platforms else "",
            "vLLM "
            + ", ".join(
                p for p in (f">= {r.vllm_min}" if r.vllm_min else "", f"< {r.vllm_max}" if r.vllm_max else "") if p
            )
            if r.vllm_min or r.vllm_max
            else "",
            "decided at serve time" if r.decided_at != "checkpoint" else "",
        ]
        what = r.title + (f" ({'; '.join(x for x in scope if x)})" if any(scope) else "")
        row = [r.id, r.severity, ",".join(r.commands), what]
        if holds:
            row.append("yes" if r.holds else "no")
        table.add_row(*row)
    console.print(table)
    if result.version_note:
        console.print(f"note: {result.version_note}")
    if verbose:
        console.print("sources (the vLLM code each rule replays):")
        for r in result.rules:
            console.print(f"{r.id}: {r.source}")
    console.print(
        f"vLLM versions known: {', '.join(result.known_vllm_versions)}; each rule's vLLM source: --verbose, or --json"
    )
