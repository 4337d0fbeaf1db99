# tier: integration
"""`quantkit tune` on the bundled pair, at its smallest: the table holds every option swept, and the recommended one
meets the AL-ratio floor in a re-measurement."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantkit.acceptance.run import run_acceptance
from quantkit.tune.run import run_tune

PROMPTS = [{"prompt": "The capital of France is", "domain": "chat"}, {"prompt": "def fib(n):", "domain": "coding"}]


@pytest.mark.slow
def test_tune_sweeps_every_option_and_its_pick_meets_the_floor(tiny, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps(p) for p in PROMPTS) + "\n")
    corpus = Path(__file__).parent / "data" / "draft_vocab_corpus.jsonl"
    r = run_tune(tiny / "target", tiny / "eagle3-draft", tmp_path / "work", gpu="MI355X", vocab_sizes=[512], ks=[2],
                 bodies=("bf16",), corpus=str(corpus), prompts=str(prompts), max_new_tokens=16, floor=0.9,
                 apply_to=tmp_path / "picked", chart=tmp_path / "tune.png")
    assert {(o.body, o.draft_vocab, o.k) for o in r.options} == {("bf16", 1024, 2), ("bf16", 512, 2)}
    full = next(o for o in r.options if o.draft_vocab == 1024)
    assert full.al_ratio == pytest.approx(1.0)  # the draft against itself
    assert all(o.us_per_accepted_token and o.speedup_bound for o in r.options)
    assert (tmp_path / "tune.png").stat().st_size > 1000
    best = r.recommended
    assert best is not None and best.al_ratio is not None and best.al_ratio >= 0.9
    again = run_acceptance(tiny / "target", tiny / "eagle3-draft", tmp_path / "picked", backend="reference",
                           num_speculative_tokens=best.k, max_new_tokens=16, prompts=str(prompts))
    assert again.ratio is not None and again.ratio >= 0.9
