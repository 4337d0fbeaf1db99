"""MkDocs hook: pages generated from the code's own tables, so the docs cannot drift from them.

A page holds a marker `<!-- quantkit:NAME -->` and this hook replaces it with the table the code holds now:
families (the family registry), recipes (the built-in recipes), rules (the rule table), gate (the gate config's
sections with their thresholds and defaults), benchmarks (the JSON rows under benchmarks/results/).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _cell(value: Any) -> str:
    text = "" if value is None else str(value)
    return text.replace("|", "\\|").replace("\n", " ").replace("<", "&lt;").replace(">", "&gt;")


def _table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def families() -> str:
    from quantkit.naming.archs import families as all_families
    from quantkit.naming.catalog import variants

    rows = []
    for f in sorted(all_families(), key=lambda f: f.name):
        kind = "draft layout" if f.draft is not None else "MoE" if f.moe is not None else "dense"
        if f.wrapper is not None:
            kind += " (wrapper)"
        refusal = "no vLLM class" if f.draft is not None and f.draft.vllm_refusal else ""
        rows.append([f"`{f.name}`", kind, ", ".join([*(f"`{a}`" for a in f.architectures), *(f"`{a}`" for a in variants(f))]),
                     f"`{f.vllm_source}`",
                     refusal])
    return (f"{len(rows)} records under `quantkit/naming/archs/` (`quantkit families` lists them with what is kept).\n\n"
            + _table(["record", "kind", "config.json architectures", "vLLM model file", "note"], rows))


def recipes() -> str:
    from quantkit.recipes import list_recipes

    rows = [[f"`{r.name}`", r.description, r.applies_to if isinstance(r.applies_to, str) else ", ".join(r.applies_to), r.scheme] for r in list_recipes()]
    return _table(["recipe", "what it does", "applies to", "scheme"], rows)


def rules() -> str:
    from quantkit.rules.table import RULES

    rows = []
    for r in RULES:
        versions = f">= {r.vllm_min}" if r.vllm_min else ""
        if r.vllm_max:
            versions = (versions + ", " if versions else "") + f"< {r.vllm_max}"
        rows.append([f"`{r.id}`", r.title, str(r.severity), ", ".join(sorted(r.commands)), versions or "all",
                     r.source])
    return f"{len(rows)} rules.\n\n" + _table(["id", "what it checks", "severity", "commands", "vLLM", "replays"], rows)


def _type(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
    return text or str(annotation).replace("typing.", "").replace("quantkit.gate.config.", "")


def gate() -> str:
    from quantkit.gate.config import GateConfig

    out = []
    for name, field in GateConfig.model_fields.items():
        model = field.annotation
        args = getattr(model, "__args__", None)
        if args:  # X | None
            model = next((a for a in args if hasattr(a, "model_fields")), None)
        if not hasattr(model, "model_fields"):
            continue
        rows = [[f"`{k}`", _type(f.annotation),
                 "required" if f.is_required() else f"`{f.default!r}`"] for k, f in model.model_fields.items()]
        out.append(f"### `{name}`\n\n{(model.__doc__ or '').strip()}\n\n" + _table(["key", "type", "default"], rows))
    return "\n".join(out)


def benchmarks() -> str:
    rows = []
    for path in sorted((ROOT / "benchmarks" / "results").glob("*.json")):
        doc = json.loads(path.read_text())
        for row in doc.get("rows", []):
            rows.append([path.stem, row.get("date", ""), row.get("machine", ""), row.get("commit", ""),
                         row.get("what", ""), row.get("figure", "")])
    if not rows:
        return "No benchmark rows recorded yet.\n"
    return _table(["benchmark", "date", "machine", "commit", "what", "figure"], rows)


def tune() -> str:
    """The latest `benchmarks/tune_bundled.py --record` run: every option with its measured AL ratio and its
    estimated saving, the platform, machine and date named."""
    path = ROOT / "benchmarks" / "results" / "tune_bundled.json"
    rows = json.loads(path.read_text())["rows"] if path.is_file() else []
    if not rows:
        return "No `quantkit tune` run recorded yet (`python benchmarks/tune_bundled.py --record`).\n"
    last = (rows[-1]["date"], rows[-1]["commit"], rows[-1]["machine"])
    run = [r for r in rows if (r["date"], r["commit"], r["machine"]) == last]

    def f(v: Any, digits: int) -> str:
        return "-" if v is None else f"{v:.{digits}f}"

    table = [[r["body"], r["draft_vocab"], r["k"], f(r["al"], 3), f(r["al_ratio"], 3), f(r["cost_ratio"], 2),
              "-" if r["estimated_saving"] is None else f"{r['estimated_saving']:.0%}",
              f"recommended (floor {r['floor']})" if r["recommended"] else ""] for r in run]
    head = (f"`quantkit tune` on the bundled pair, run {last[0]} on {last[2]} (commit {last[1]}; "
            f"`benchmarks/results/tune_bundled.json`): AL measured ({run[0]['settings']}); cost per accepted token "
            f"an estimate from bytes for **{run[0]['platform']}, TP {run[0]['tp']}**, never a measurement.\n\n")
    return head + _table(["body", "lm_head rows", "K", "AL", "AL ratio (measured)",
                          "cost per accepted token vs BF16 draft (estimate)", "estimated saving", ""], table)


GENERATORS = {"families": families, "recipes": recipes, "rules": rules, "gate": gate, "benchmarks": benchmarks,
              "tune": tune}
MARKER = re.compile(r"<!-- quantkit:(\w+) -->")


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return MARKER.sub(lambda m: GENERATORS[m.group(1)](), markdown)
