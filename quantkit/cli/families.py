"""`quantkit families`: every model family and draft layout quantkit names, what vLLM builds for it, what is kept."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from quantkit.cli.app import main
from quantkit.cli.options import json_option, make_console, print_json

if TYPE_CHECKING:  # result types only; the modules are imported when the command runs
    from quantkit.results.families import FamilyEntry


@main.command("families")
@json_option("Print the listing as JSON (results.FamilyList: each record's architectures, vLLM file and kept parts).")
def families_command(as_json: bool) -> None:
    """List every model family and draft layout quantkit supports.

    For each: the config.json architectures it claims (the vLLM classes it builds), the vLLM model file its layer
    names follow, and what every recipe keeps unquantized, with the reason.
    """
    from quantkit.naming.catalog import family_list
    from quantkit.results.families import FamilyList

    entries = family_list()
    if as_json:
        print_json(FamilyList(families=entries).to_dict())
    else:
        make_console().print(_families_table(entries))


def _families_table(entries: list[FamilyEntry]) -> Any:
    from rich.table import Table

    table = Table(title="Families and draft layouts", title_justify="left")
    for column in ("family", "kind", "architectures (vLLM classes)", "vLLM file", "kept unquantized"):
        table.add_column(column)
    for e in entries:
        kept = "; ".join(k.part for k in e.kept)
        short = e.vllm_source.replace("vllm/model_executor/models/", "")
        source = short if e.vllm_builds else f"{short} (no vLLM class)"
        table.add_row(e.name, e.kind, ", ".join([*e.architectures, *e.variants]), source, kept)
    return table
