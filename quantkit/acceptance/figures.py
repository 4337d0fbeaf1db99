"""AL as the field reports it, from per-request counters: pooled and macro averages, the accepted-length histogram,
conditional acceptance per position, and AL by output-position bucket.

- pooled (micro) AL = 1 + sum(accepted) / sum(drafts): vLLM's counters (vllm/v1/spec_decode/metrics.py), InferenceX;
  long requests weigh more;
- macro AL = mean over requests of (1 + accepted_r / drafts_r): ModelOpt specdec_bench (metrics/specbench.py:
  Category_AL is the mean of per-request AL in a category, Average_AL the mean over requests); requests without a
  draft have no AL and are left out;
- the histogram counts drafts by accepted tokens. Acceptance is a prefix, so it follows from the per-position counts:
  rounds with exactly n accepted = accepted_at(n) - accepted_at(n+1), accepted_at(0) = drafts;
- conditional acceptance at k = accepted_at(k) / accepted_at(k-1);
- AL by output-position bucket pools the rounds that started in [lo, hi) generated tokens (sgl-project/sglang#34145:
  arms stopping at different points compared over different ranges).
"""

from __future__ import annotations

from collections.abc import Sequence

from quantkit.engines.stats import SequenceStats

OUTPUT_BUCKETS: tuple[int, ...] = (0, 32, 128, 512, 2048)  # bucket edges in generated tokens; the last is open


def pooled_al(drafts: float, accepted: float) -> float | None:
    return 1 + accepted / drafts if drafts else None


def request_al(s: SequenceStats) -> float | None:
    return pooled_al(s.num_drafts, s.num_accepted)


def macro_al(stats: Sequence[SequenceStats]) -> float | None:
    """Mean of per-request AL over the requests that drafted at all."""
    als = [a for s in stats if (a := request_al(s)) is not None]
    return sum(als) / len(als) if als else None


def histogram(drafts: int, accepted_per_pos: Sequence[int]) -> list[int]:
    """Drafts by accepted tokens 0..K, from the drafts and the per-position accepted counts."""
    at = [drafts, *accepted_per_pos, 0]
    return [at[n] - at[n + 1] for n in range(len(accepted_per_pos) + 1)]


def conditional_rates(drafts: int, accepted_per_pos: Sequence[int]) -> list[float | None]:
    at = [drafts, *accepted_per_pos]
    return [at[k] / at[k - 1] if at[k - 1] else None for k in range(1, len(at))]


def bucket_name(lo: int, hi: int | None) -> str:
    return f"{lo}-{hi}" if hi is not None else f"{lo}+"


def al_by_output_position(
    stats: Sequence[SequenceStats], edges: Sequence[int] = OUTPUT_BUCKETS
) -> dict[str, float | None]:
    """Pooled AL of the rounds that started in each bucket of generated tokens; buckets no round reached are left
    out; empty when the backend reports no rounds."""
    sums: dict[str, list[int]] = {}
    bounds = [(lo, edges[i + 1] if i + 1 < len(edges) else None) for i, lo in enumerate(edges)]
    for s in stats:
        for pos, acc in s.rounds:
            lo, hi = next(b for b in reversed(bounds) if pos >= b[0])
            cell = sums.setdefault(bucket_name(lo, hi), [0, 0])
            cell[0] += 1
            cell[1] += acc
    order = [bucket_name(lo, hi) for lo, hi in bounds]
    return {name: round(1 + sums[name][1] / sums[name][0], 4) for name in order if name in sums}


def expected_al(stats: Sequence[SequenceStats]) -> float | None:
    """Pooled expected AL: 1 + sum of E[accepted] over rounds / drafts; None when any request lacks it."""
    if not stats or any(s.expected_accepted is None for s in stats):
        return None
    return pooled_al(sum(s.num_drafts for s in stats), sum(s.expected_accepted or 0.0 for s in stats))
