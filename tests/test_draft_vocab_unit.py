# tier: unit
"""Draft-vocabulary pruning's choice of rows (quantkit.apply.prune), on hand-computed corpora."""

from __future__ import annotations

from collections import Counter

import pytest

from quantkit.apply.prune import DraftVocabError, KeptVocab, choose_kept, source_target_ids


def test_most_frequent_tokens_are_kept_with_specials_in_target_order():
    # corpus "a b a c a b d" as ids: a=10 x3, b=11 x2, c=12 x1, d=13 x1; EOS = 2 never occurs but is kept
    counts = Counter([10, 11, 10, 12, 10, 11, 13])
    kept = choose_kept(counts, 3, list(range(16)), always=[2])
    # EOS, then the two most frequent (10, 11); ascending target ids; rows are the target ids (no source d2t)
    assert kept.target_ids == [2, 10, 11] and kept.rows == [2, 10, 11]
    assert kept.d2t == [2, 9, 9]  # d2t[i] = target id - i
    # a tie (12 and 13 once each) goes to the lower id
    assert choose_kept(counts, 4, list(range(16)), always=[2]).target_ids == [2, 10, 11, 12]


def test_pruning_composes_with_an_existing_d2t():
    # source draft rows map to target ids 0, 3, 5, 9, 12 (d2t = [0, 2, 3, 6, 8]); vLLM: target = row + d2t[row]
    src = source_target_ids([0, 2, 3, 6, 8], 5)
    assert src == [0, 3, 5, 9, 12]
    # target 7 is frequent but the source has no row for it: it cannot be kept; special 1 has no row either
    counts = Counter({7: 50, 12: 9, 5: 4, 3: 4, 9: 1})
    kept = choose_kept(counts, 3, src, always=[0, 1])
    assert kept == KeptVocab(target_ids=[0, 3, 12], rows=[0, 1, 4], always_kept=[0], special_not_in_draft=[1])
    assert kept.d2t == [0, 2, 10]
    # composed: draft row i of the pruned draft is source row rows[i]; its target is that row's source target
    assert [src[r] for r in kept.rows] == [i + o for i, o in enumerate(kept.d2t)]


@pytest.mark.parametrize("n, needle", [(6, "has 5 rows"), (0, "pick N from 1"), (4, "covers only 3 distinct")])
def test_refusals_are_one_line(n, needle):
    with pytest.raises(DraftVocabError, match=needle) as e:
        choose_kept(Counter({3: 2, 5: 1, 7: 1}), n, [0, 3, 5, 9, 12], always=[0])
    assert "\n" not in str(e.value)


def test_more_specials_than_n_is_refused():
    with pytest.raises(DraftVocabError, match="always kept; pick N of at least 3"):
        choose_kept(Counter({5: 3}), 2, list(range(8)), always=[0, 1, 2])
