"""Move test files written before the tiers (tests/test_*.py) into the folder their first line names
(`# tier: unit|integration|e2e`), with `git mv`, and rewrite what changed under them: the helpers' package
(tests/fixtures/), the depth of `Path(__file__)`, relative imports, and imports of test modules that moved.

    python scripts/retier_tests.py            # moves and rewrites; prints what it did
    python scripts/retier_tests.py --check    # only lists what it would move

A file without a tier line is listed and left where it is (tests/unit/test_tiers.py then fails naming it).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
TIERS = ("unit", "integration", "e2e")
HELPERS = ("bench_fixture", "executor_checkpoints", "families", "hostile", "hub_server", "moe_replicas", "replicas",
           "source_checkpoints", "speed_bench_fixture", "toy_family")


def module_homes() -> dict[str, str]:
    """test module name -> its dotted path now (tests.<tier>.<name>), for imports between test modules."""
    return {p.stem: f"tests.{p.parent.name}.{p.stem}" for tier in TIERS for p in (TESTS / tier).glob("test_*.py")}


def rewrite(text: str, homes: dict[str, str]) -> str:
    helpers = "|".join(HELPERS)
    text = re.sub(rf"^(\s*)from \. import ({helpers})\b", r"\1from tests.fixtures import \2", text, flags=re.M)
    text = re.sub(rf"^(\s*)from \.({helpers}) import", r"\1from tests.fixtures.\2 import", text, flags=re.M)
    text = re.sub(rf"^(\s*)from tests import ({helpers})\b", r"\1from tests.fixtures import \2", text, flags=re.M)
    text = re.sub(rf"^(\s*)from tests\.({helpers}) import", r"\1from tests.fixtures.\2 import", text, flags=re.M)
    text = re.sub(r"^(\s*)from \.conftest import", r"\1from tests.conftest import", text, flags=re.M)
    text = re.sub(r"\btests\.toy_family\b", "tests.fixtures.toy_family", text)

    def test_module(m: re.Match) -> str:
        return f"{m[1]}from {homes.get(m[2], 'tests.' + m[2])} import"

    text = re.sub(r"^(\s*)from (?:\.|tests\.)(test_\w+) import", test_module, text, flags=re.M)
    text = text.replace("Path(__file__).resolve().parent.parent", "Path(__file__).resolve().parents[2]")
    return text.replace("Path(__file__).resolve().parents[1]", "Path(__file__).resolve().parents[2]")


def main(check: bool) -> int:
    homes = module_homes()
    untiered = []
    for path in sorted(TESTS.glob("test_*.py")):
        first = path.read_text(encoding="utf-8").splitlines()[:1]
        m = re.match(r"#\s*tier:\s*(\w+)", first[0]) if first else None
        if not m or m[1] not in TIERS:
            untiered.append(path.name)
            continue
        dest = TESTS / m[1] / path.name
        print(f"{path.relative_to(ROOT)} -> {dest.relative_to(ROOT)}")
        if check:
            continue
        if dest.exists():
            print(f"  {dest.relative_to(ROOT)} exists: merge the two by hand", file=sys.stderr)
            continue
        tracked = subprocess.run(["git", "ls-files", "--error-unmatch", str(path)], cwd=ROOT,
                                 capture_output=True).returncode == 0
        if tracked:  # keeps its history
            subprocess.run(["git", "mv", str(path), str(dest)], cwd=ROOT, check=True)
        else:
            path.rename(dest)
        homes[dest.stem] = f"tests.{m[1]}.{dest.stem}"
        dest.write_text(rewrite(dest.read_text(encoding="utf-8"), homes), encoding="utf-8")
    for name in untiered:
        print(f"tests/{name}: no `# tier:` first line; decide its tier (docs/testing.md) and move it by hand",
              file=sys.stderr)
    return 1 if untiered else 0


if __name__ == "__main__":
    sys.exit(main("--check" in sys.argv))
