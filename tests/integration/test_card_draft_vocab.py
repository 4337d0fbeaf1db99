# tier: integration
"""The model card of a pruned, tuned draft: its draft-vocabulary reasons and the option `quantkit tune` chose."""

from __future__ import annotations

import json
from pathlib import Path

from quantkit.publish.card import build_model_card
from quantkit.results.tune import TuneOption
from tests.integration.test_publish import REPO, draft_out  # noqa: F401  (the fixture)


def test_card_of_a_pruned_tuned_draft(draft_out: Path) -> None:  # noqa: F811
    card = build_model_card(draft_out, repo_id=REPO).text
    assert "## Draft vocabulary and tuning" not in card  # neither pruned nor tuned: no section
    manifest = json.loads((draft_out / "quantkit.json").read_text())
    manifest["draft_vocab"] = {
        "source": "/home/me/draft",
        "rows_before": 1024,
        "rows_after": 512,
        "target_vocab_size": 2048,
        "corpus": "/home/me/prompts.jsonl",
        "corpus_tokens": 5076,
        "coverage": 0.474,
        "always_kept": 3,
        "reason": "pruned to the tokens /home/me/prompts.jsonl uses most; the target verifies every token",
    }
    (draft_out / "quantkit.json").write_text(json.dumps(manifest))
    option = TuneOption(body="fp8", draft_vocab=512, k=4, al=2.9, baseline_al=3.0, al_ratio=0.9833, cost_ratio=0.71)
    (draft_out / "tune.json").write_text(option.model_dump_json())
    card = build_model_card(draft_out, repo_id=REPO).text
    assert "## Draft vocabulary and tuning" in card
    assert "keeps 512 of 1,024 rows (target vocabulary 2,048)" in card and "`prompts.jsonl`" in card
    assert "47.4% of its 5,076 tokens" in card and "the target verifies every token" in card
    assert "body fp8, 512 rows, K 4" in card and "AL ratio against the unpruned BF16 draft 0.983 (measured)" in card
    assert "29% less time per accepted token" in card and "estimate from bytes" in card
    assert "/home/me" not in card
