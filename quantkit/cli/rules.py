"""`quantkit rules`: the rule table check, inspect and deploy read (quantkit.rules.table), with each rule's platforms,
vLLM version range, source and whether it is decided from the checkpoint or only at serve time."""

from __future__ import annotations

import click

from quantkit.cli.app import main
from quantkit.cli.options import json_option, make_console, print_json, vllm_version_option
from quantkit.vocab import PLATFORMS


@main.command("rules")
@click.option("--platform", "platform", type=click.Choice(PLATFORMS), default=None,
              help="Mark which rules hold on this platform.")
@vllm_version_option()
@json_option("Print the table as JSON (RulesResult).")
def rules_command(platform: str | None, vllm_version: str | None, as_json: bool) -> None:
    """Print the rule table: id, severity, commands, platforms, vLLM versions, decided at, source.

    \b
    quantkit rules
    quantkit rules --platform gfx942 --vllm-version 0.25.1 --json
    """
    render_rules(platform, vllm_version, as_json)


def rules_result(platform: str | None, vllm_version: str | None):  # -> RulesResult (imported when run)
    from quantkit.results.kernels import RuleRow, RulesResult
    from quantkit.rules.table import RULES
    from quantkit.rules.vllm_versions import KNOWN_VLLM_VERSIONS, resolve_vllm_version

    version = resolve_vllm_version(vllm_version) if vllm_version is not None else None
    filtered = platform is not None or version is not None
    rows = []
    for r in RULES:
        holds = None
        if filtered:
            holds = (r.platforms is None or platform is None or platform in r.platforms) and r.holds_for_version(version)
        rows.append(RuleRow(id=r.id, title=r.title, severity=r.severity, codes=list(r.codes), commands=sorted(r.commands),
                            platforms=sorted(r.platforms) if r.platforms is not None else None, vllm_min=r.vllm_min,
                            vllm_max=r.vllm_max, decided_at=r.decided_at, when=r.when, needs=r.needs, reads=r.reads,
                            source=r.source, holds=holds))
    return RulesResult(platform=platform, vllm_version=version, known_vllm_versions=list(KNOWN_VLLM_VERSIONS),
                       rules=rows)


def render_rules(platform: str | None, vllm_version: str | None, as_json: bool) -> None:
    result = rules_result(platform, vllm_version)
    if as_json:
        print_json(result.to_dict())
        return
    from rich.table import Table

    console = make_console()
    title = "quantkit rule table" + (f" (platform {platform})" if platform else "") + \
        (f" (vLLM {result.vllm_version})" if result.vllm_version else "")
    table = Table(title=title, title_justify="left")
    for col in ("id", "severity", "commands", "platforms", "vLLM", "decided", "source"):
        table.add_column(col, overflow="fold")
    if result.rules and result.rules[0].holds is not None:
        table.add_column("holds", no_wrap=True)
    for r in result.rules:
        vrange = ",".join(p for p in (f">={r.vllm_min}" if r.vllm_min else "", f"<{r.vllm_max}" if r.vllm_max else "")
                          if p) or "all"
        row = [r.id, r.severity, ",".join(r.commands), ",".join(r.platforms) if r.platforms else "all", vrange,
               r.decided_at, r.source]
        if r.holds is not None:
            row.append("yes" if r.holds else "no")
        table.add_row(*row)
    console.print(table)
    console.print(f"{len(result.rules)} rules; vLLM versions known: {', '.join(result.known_vllm_versions)}")
