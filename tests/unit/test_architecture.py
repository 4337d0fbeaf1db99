# tier: unit
"""ARCHITECTURE.md cannot go stale: its tree names every module under quantkit/ on its package's line, and names no
module that does not exist. The modules are read from the disk, the names from the tree block (## The tree)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "quantkit"
DOC = ROOT / "ARCHITECTURE.md"
# A family or draft layout is one file in naming/archs/ and nothing else is edited (ARCHITECTURE.md, "How to add a
# family"), so the tree does not list them.
UNLISTED_FOLDERS = ("naming/archs",)
ENTRY = re.compile(r"^  (?P<head>\S+)")
MODULE = re.compile(r"(?<![\w/.])(\w+\.py)\b")


def tree_block() -> list[str]:
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("## The tree") :]
    start = section.index("```\nquantkit/\n") + len("```\nquantkit/\n")
    return section[start : section.index("```", start)].splitlines()


def named_in_tree() -> dict[str, set[str]]:
    """{package folder relative to quantkit/ ("" for the top): the module file names its entry lists}. An entry is a
    line indented by two spaces, starting with the folder (`apply/shards/`) or, for top-level modules, with a module;
    deeper-indented lines continue it."""
    named: dict[str, set[str]] = {}
    folder = None
    for line in tree_block():
        m = ENTRY.match(line)
        if m:
            head = m["head"]
            folder = head.rstrip("/") if head.endswith("/") else ""
            named.setdefault(folder, set())
        if folder is None:
            continue
        named[folder].update(MODULE.findall(line))
    return named


def modules_on_disk() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if "__pycache__" in rel.parts or (rel.parts and rel.parts[0] == "data"):
            continue
        folder = rel.parent.as_posix() if rel.parent != Path(".") else ""
        found.setdefault(folder, set()).add(rel.name)
    return found


def test_the_tree_block_is_found_and_parsed():
    named = named_in_tree()
    # A parse that finds nothing would make the test below pass whatever the tree says.
    assert {"", "io", "apply/shards", "gate/steps"} <= set(named), sorted(named)
    assert "safetensors.py" in named["io"] and "pipeline.py" in named["apply/shards"]


def test_every_module_under_quantkit_is_named_in_architecture_md():
    named, on_disk = named_in_tree(), modules_on_disk()
    missing = []
    for folder, files in sorted(on_disk.items()):
        if folder in UNLISTED_FOLDERS:
            continue
        label = f"{folder}/" if folder else "the top-level line (`__main__.py vocab.py ...`)"
        for name in sorted(files - {"__init__.py"} - named.get(folder, set())):
            where = (
                f"add `{name}` to the `  {folder}/` line"
                if folder in named
                else f"add a line `  {folder}/   <what it is>: {name} ...` in package order"
            )
            missing.append(
                f"quantkit/{folder + '/' if folder else ''}{name}: {where} of the tree in ARCHITECTURE.md "
                f"(## The tree; {label}) and say what it holds in its package's section"
            )
    assert not missing, "modules ARCHITECTURE.md does not name:\n" + "\n".join(missing)


def test_architecture_md_names_no_module_that_does_not_exist():
    named, on_disk = named_in_tree(), modules_on_disk()
    stale = [
        f"quantkit/{folder + '/' if folder else ''}{name}: remove it from the `{folder or 'top-level'}` entry of "
        f"the tree in ARCHITECTURE.md (## The tree), and from its package's section"
        for folder, files in sorted(named.items())
        for name in sorted(files - on_disk.get(folder, set()))
    ]
    assert not stale, "ARCHITECTURE.md names modules that do not exist:\n" + "\n".join(stale)
