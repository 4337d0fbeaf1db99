"""The house's shape (issue 19): no import circle, check and acceptance apart, one home per fact.

The graph is read from the code's own import statements (ast), not from a list kept here: a new module joins it by
existing. Module-level imports (outside functions and `if TYPE_CHECKING:`) make the circle test; every import,
lazy ones too, makes the check <-> acceptance test, since a lazy import still ties the two packages.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "quantkit"


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in PKG.rglob("*.py")}


def _resolve(name: str) -> str | None:
    """The quantkit module an import names (a name imported from a package counts as the package's module)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(path: Path, module_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    me = _module(path)
    found: set[str] = set()

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if not module_level_only:
                    visit(child, False)
                continue
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                if not module_level_only:
                    visit(child, top)
                continue
            names: list[str] = []
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    pkg = me if path.name == "__init__.py" else me.rpartition(".")[0]
                    for _ in range(child.level - 1):
                        pkg = pkg.rpartition(".")[0]
                    base = f"{pkg}.{base}" if base else pkg
                names = [f"{base}.{a.name}" for a in child.names] or [base]
            for n in names:
                if n.startswith("quantkit"):
                    r = _resolve(n)
                    if r and r != me:
                        found.add(r)
            visit(child, top)

    visit(tree, True)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def _package_edges(pkg_a: str, pkg_b: str) -> list[str]:
    edges = []
    for mod, path in MODULES.items():
        if mod == pkg_a or mod.startswith(pkg_a + "."):
            edges += [f"{mod} -> {t}" for t in _imports(path, False) if t == pkg_b or t.startswith(pkg_b + ".")]
    return sorted(edges)


def test_the_graph_reader_sees_a_known_import():
    # the test can fail: the reader must see what a module visibly imports, or an empty graph would pass the rest
    assert "quantkit.errors" in _imports(MODULES["quantkit.cli.app"], False) | {
        t for m, p in MODULES.items() if m.startswith("quantkit.cli") for t in _imports(p, False)
    }
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


def test_no_import_circle_at_module_level():
    graph = {m: _imports(p, True) for m, p in MODULES.items()}
    assert _cycles(graph) == []


@pytest.mark.parametrize(
    ("a", "b"), [("quantkit.check", "quantkit.acceptance"), ("quantkit.acceptance", "quantkit.check")]
)
def test_check_and_acceptance_do_not_import_each_other(a, b):
    assert _package_edges(a, b) == []


def test_engines_stand_below_the_stages():
    # engines/ runs models for check, acceptance, eval and the gate; it imports none of them
    for stage in (
        "quantkit.check",
        "quantkit.acceptance",
        "quantkit.evaluate",
        "quantkit.gate",
        "quantkit.apply",
        "quantkit.bench",
    ):
        assert _package_edges("quantkit.engines", stage) == []


def test_no_house_move_stub_is_left():
    left = [str(p.relative_to(ROOT)) for p in PKG.rglob("*.py") if "house-move stub" in p.read_text()]
    assert left == []
