# tier: integration
"""`quantkit tune` on the bundled pair (issue 39): its table holds every option asked for, each with a measured AL
ratio and an estimated cost, the recommendation is the cheapest option over the floor, and a re-measurement of the
draft it writes keeps the floor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantkit.acceptance.run import run_acceptance
from quantkit.io.paths import builtin_prompts_file
from quantkit.tune.run import TuneError, tune


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    lines = builtin_prompts_file().read_text().splitlines()[::7][:4]  # four domains' first prompts
    path = tmp_path_factory.mktemp("tune") / "prompts.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_tune_recommends_an_option_that_keeps_the_floor(tiny: Path, prompts: Path, tmp_path: Path) -> None:
    corpus = builtin_prompts_file().with_name("vocab-corpus.jsonl")
    result = tune(
        tiny / "target",
        tiny / "eagle3-draft",
        tmp_path / "work",
        vocab_corpus=corpus,
        vocabs=[1024, 512],
        ks=[3],
        bodies=["bf16"],
        prompts=str(prompts),
        max_new_tokens=16,
        floor=0.9,
        apply_to=tmp_path / "tuned",
    )
    assert {(o.body, o.draft_vocab, o.k) for o in result.options} == {("bf16", 1024, 3), ("bf16", 512, 3)}
    assert all(o.error is None and o.al_ratio is not None and o.us_per_token for o in result.options)
    full = next(o for o in result.options if o.draft_vocab == 1024)
    assert full.al_ratio == pytest.approx(1.0) and full.cost_ratio == pytest.approx(1.0)
    pruned = next(o for o in result.options if o.draft_vocab == 512)
    assert pruned.round_us < full.round_us  # fewer lm_head rows: a cheaper round, by bytes
    best = result.recommended
    assert best is not None and best.al_ratio >= 0.9
    assert best.us_per_token == min(o.us_per_token for o in result.options if o.al_ratio >= 0.9)
    assert Path(result.chart).is_file()
    written = tmp_path / "tuned"
    assert json.loads((written / "tune.json").read_text())["k"] == best.k
    again = run_acceptance(
        tiny / "target",
        tiny / "eagle3-draft",
        written,
        num_speculative_tokens=best.k,
        prompts=str(prompts),
        max_new_tokens=16,
        backend="reference",
    )
    assert again.ratio is not None and again.ratio >= 0.9


def test_tune_refuses_what_it_cannot_build(tiny: Path, tmp_path: Path) -> None:
    with pytest.raises(TuneError, match="above the draft's 1024 rows"):
        tune(tiny / "target", tiny / "eagle3-draft", tmp_path, vocabs=[4096])
    with pytest.raises(TuneError, match="--vocab-corpus"):
        tune(tiny / "target", tiny / "eagle3-draft", tmp_path, vocabs=[512])
    with pytest.raises(TuneError, match="no bandwidth on record"):
        tune(tiny / "target", tiny / "eagle3-draft", tmp_path, platform="gfx950")
