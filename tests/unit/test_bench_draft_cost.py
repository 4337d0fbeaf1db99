# tier: unit
"""The bench report's cost section (issue 39): each draft's step by role and its time on a named platform, labelled
an estimate from bytes, never a measurement. The bundled draft's bytes are counted by hand from its config here, the
time from the platform's data-sheet bandwidth; the Markdown (gate report, card) and the terminal table say what the
figures are."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantkit.bench.identity import draft_costs
from quantkit.bench.tables import draft_cost_markdown, estimate_line, speedup_markdown
from quantkit.results.bench import BenchArm, BenchIdentity, BenchResult, SpeedupSummary
from quantkit.rules.cost import platform_for

ROOT = Path(__file__).resolve().parents[2]
DRAFT = str(ROOT / "examples" / "tiny" / "eagle3-draft")
# the bundled draft's config: hidden 256, 4 heads x 64 (q 256), 2 KV heads (k, v 128) over 2 x hidden, MLP 512,
# lm_head 1024 rows (its draft vocabulary), fc 3 x 256 -> 256; BF16
HAND = {
    "attention": 2 * (256 * 512 + 2 * 128 * 512 + 256 * 256),
    "dense_mlp": 2 * 3 * 512 * 256,
    "lm_head": 2 * 1024 * 256,
    "fc": 2 * 256 * 768,
}
TOKEN = HAND["attention"] + HAND["dense_mlp"] + HAND["lm_head"]
MI355X_US = 1e6 / (8.0e12 * 0.875)  # microseconds per byte at 8 TB/s x the attained 0.875


@pytest.mark.parametrize(
    "gpu,platform,why",
    [
        ("AMD Instinct MI355X", "MI355X", "the bench's GPU"),
        ("AMD Instinct MI300X", "MI300X", "the bench's GPU"),
        ("NVIDIA H100 80GB HBM3", "H100", "the bench's GPU"),
        ("NVIDIA H200", "H200", "the bench's GPU"),
        (None, "MI355X", "no HBM bandwidth on record for a CPU"),
        ("NVIDIA GeForce RTX 4090", "MI355X", "no HBM bandwidth on record for NVIDIA GeForce RTX 4090"),
    ],
)
def test_the_platform_is_the_benchs_gpu_or_named_as_not_it(gpu, platform, why) -> None:
    got, reason = platform_for(gpu)
    assert got == platform and reason.startswith(why)
    if why.startswith("no"):
        assert "not this hardware" in reason


def test_draft_costs_by_hand() -> None:
    """The bundled draft once (named twice), a served model's name skipped, K=0 no round; on a CPU the estimate is
    named for MI355X and says it is not this hardware."""
    warnings: list[str] = []
    got = draft_costs([DRAFT, None, DRAFT, "org/served-draft"], None, 1, [0, 3, 2], warnings)
    assert len(got) == 1 and not warnings
    e = got[0]
    assert e.draft == DRAFT and {r.role: r.bytes for r in e.cost.roles} == HAND
    assert e.platform == "MI355X" and e.bandwidth_tbs == 8.0 and "data sheet" in e.bandwidth_source
    assert "not this hardware" in e.platform_reason and "not a measurement" in e.estimate
    assert e.token_us == pytest.approx(TOKEN * MI355X_US)
    assert e.fc_us == pytest.approx(HAND["fc"] * MI355X_US)
    assert e.round_us == pytest.approx(
        {2: (HAND["fc"] + 2 * TOKEN) * MI355X_US, 3: (HAND["fc"] + 3 * TOKEN) * MI355X_US}
    )
    # over TP 4 every read is split four ways
    (tp4,) = draft_costs([DRAFT], "AMD Instinct MI355X", 4, [3], warnings)
    assert tp4.token_us == pytest.approx(e.token_us / 4) and tp4.platform_reason.startswith("the bench's GPU")


def test_a_folder_that_is_not_a_checkpoint_warns_and_the_bench_goes_on(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    warnings: list[str] = []
    assert draft_costs([str(tmp_path), DRAFT], None, 1, [3], warnings)[0].draft == DRAFT
    assert len(warnings) == 1 and warnings[0].startswith(f"{tmp_path}: no draft-step estimate")


def test_markdown_says_what_the_figures_are() -> None:
    (e,) = draft_costs([DRAFT], None, 1, [3], [])
    lines = draft_cost_markdown([e])
    text = "\n".join(lines)
    assert lines[0].startswith("**Draft step cost: an estimate from bytes") and "not a measurement" in lines[0]
    assert f"| lm_head | per draft token | {HAND['lm_head'] / 1e6:,.2f} | {HAND['lm_head'] / TOKEN:.2f} |" in lines
    assert f"| fc | once per round | {HAND['fc'] / 1e6:,.2f} | - |" in lines
    line = estimate_line(e)
    assert line in lines and line.startswith("Estimated on MI355X (8 TB/s, AMD Instinct MI355X data sheet")
    assert f"a draft token {TOKEN * MI355X_US:,.1f} us" in line
    assert f"a round of K=3 {(HAND['fc'] + 3 * TOKEN) * MI355X_US:,.1f} us" in line
    assert "not a measurement" in line.rsplit(". ", 1)[1] and "not this hardware" in text


def test_the_summary_carries_its_arms_drafts_and_the_report_shows_them(tmp_path: Path) -> None:
    """speedup_summary keeps the candidate's and the BF16 draft's estimates (not another candidate's); the gate
    report's and the card's Markdown shows them after the identity line, and nothing when there are none."""
    other = tmp_path / "other"
    (e,) = draft_costs([DRAFT], None, 1, [3], [])
    stray = e.model_copy(update={"draft": str(other)})
    res = BenchResult(
        identity=BenchIdentity(hardware="test host"),
        arms=[
            BenchArm(name="t", kind="no-spec", target="T"),
            BenchArm(name="t+bf16", kind="bf16-draft", target="T", draft=DRAFT, num_speculative_tokens=3),
            BenchArm(name="t+cand", kind="candidate", target="T", draft=DRAFT, num_speculative_tokens=3),
        ],
        draft_costs=[e, stray],
    )
    summary = res.speedup_summary()
    assert summary is not None and [x.draft for x in summary.draft_costs] == [DRAFT]
    md = speedup_markdown(summary)
    at = md.index(draft_cost_markdown(summary.draft_costs)[0])
    assert md[at - 2].startswith("Measured on test host")
    round_trip = SpeedupSummary.model_validate(summary.to_dict())
    assert round_trip.draft_costs[0].round_us == {3: pytest.approx(e.round_us[3])}
    bare = summary.model_copy(update={"draft_costs": []})
    assert not any("estimate from bytes" in line for line in speedup_markdown(bare))
