# tier: unit
"""Tests live in their tier's folder (docs/testing.md), so a tier cannot drift: no test file at tests/ root, a file's
`# tier:` first line agrees with its folder, and helpers that are not tests stay in tests/fixtures/."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
TIERS = ("unit", "integration", "e2e")
TIER_LINE = re.compile(r"#\s*tier:\s*(\S+)")


def declared_tier(path: Path) -> str | None:
    with path.open(encoding="utf-8") as f:
        m = TIER_LINE.match(f.readline())
    return m[1] if m else None


def test_no_test_file_is_outside_a_tier_folder():
    stray = []
    for path in sorted(TESTS.glob("test_*.py")):
        tier = declared_tier(path)
        to = f"tests/{tier}/" if tier in TIERS else "tests/unit/, tests/integration/ or tests/e2e/ (docs/testing.md)"
        stray.append(f"{path.relative_to(TESTS.parent)}: git mv it to {to}")
    assert not stray, "test files outside a tier folder:\n" + "\n".join(stray)


def test_a_declared_tier_matches_the_folder():
    wrong = []
    for tier in TIERS:
        for path in sorted((TESTS / tier).rglob("test_*.py")):
            declared = declared_tier(path)
            if declared is not None and declared != tier:
                wrong.append(
                    f"{path.relative_to(TESTS.parent)} says `# tier: {declared}`: move it to tests/{declared}/"
                    f" or correct its first line"
                )
    assert not wrong, "\n".join(wrong)


def test_fixture_modules_hold_no_tests():
    # pytest collects test_*.py only; a helper named so would run its functions as tests.
    assert not sorted(p.name for p in (TESTS / "fixtures").glob("test_*.py"))
