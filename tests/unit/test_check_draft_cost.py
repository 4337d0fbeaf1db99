# tier: unit
"""`check` on an EAGLE-3 draft reports its step cost by role (text and --json), the same report `inspect` gives."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from quantkit.cli import main
from tests.unit.test_draft_cost import by_hand, kimi_draft

TINY = Path(__file__).resolve().parents[2] / "examples" / "tiny"


def test_check_reports_the_lm_head_share_of_a_kimi_replica(tmp_path: Path) -> None:
    folder = kimi_draft(tmp_path / "torchspec", 12288, 163840)
    r = CliRunner().invoke(main, ["check", str(folder), "--vllm", "off", "--json"])
    cost = json.loads(r.stdout)["draft_cost"]
    parts = by_hand(12288, 163840)
    token = sum(v for k, v in parts.items() if k != "fc")
    assert abs(cost["lm_head_share"] - parts["lm_head"] / token) < 1e-3  # 0.635
    assert "estimate from bytes" in cost["estimate"]
    # the same report inspect gives
    shown = json.loads(CliRunner().invoke(main, ["inspect", str(folder), "--json"]).stdout)["draft_cost"]
    assert shown == cost


def test_check_prints_the_draft_step_line_and_the_table_with_verbose() -> None:
    draft = TINY / "eagle3-draft"
    line = CliRunner().invoke(main, ["check", str(draft), "--target", str(TINY / "target"), "--vllm", "off"])
    assert "draft step (estimate from bytes" in line.output and "lm_head" in line.output
    table = CliRunner().invoke(
        main, ["check", str(draft), "--target", str(TINY / "target"), "--vllm", "off", "--verbose"]
    )
    assert "Draft step by role" in table.output and "once per round" in table.output
    target = CliRunner().invoke(main, ["check", str(TINY / "target"), "--vllm", "off", "--json"])
    assert json.loads(target.stdout)["draft_cost"] is None  # a target has no draft step
