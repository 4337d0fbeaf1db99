"""Per-prompt speculative-decoding counters, the common output of both acceptance backends, and the order statistics and bootstrap the served bench puts on repeats (no torch here, so the CLI's validation stays light)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SequenceStats:
    """Spec-decode counters and output of one prompt."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    target_forwards: int = 0


# --- figures over repeats (the served bench) --------------------------------------------------------------------


def median(values: list[float]) -> float:
    """The median (the mean of the middle two for an even count)."""
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def scaled_mad(values: list[float]) -> float:
    """1.4826 x the median absolute deviation: a spread that one outlying repeat does not blow up (vLLM's sweep
    and InferenceX report it the same way)."""
    m = median(values)
    return 1.4826 * median([abs(v - m) for v in values])


def percentile_interval(samples: list[float], level: float = 0.95) -> tuple[float, float]:
    """The percentile interval of bootstrap samples at `level` (the same rule as acceptance's paired bootstrap)."""
    s = sorted(samples)
    return s[int((1 - level) / 2 * (len(s) - 1))], s[int((1 + level) / 2 * (len(s) - 1))]


def bootstrap_median_ratio_ci(num: list[float], den: list[float], samples: int = 2000, seed: int = 0,
                              level: float = 0.95) -> tuple[float, float] | None:
    """Percentile bootstrap CI of median(num) / median(den), the two resampled independently (repeats of two arms
    are separate server runs, not pairs). None without values or with a zero median in a resample."""
    import random

    if not num or not den:
        return None
    rng = random.Random(seed)
    ratios = []
    for _ in range(samples):
        a = median([num[rng.randrange(len(num))] for _ in num])
        b = median([den[rng.randrange(len(den))] for _ in den])
        if b > 0:
            ratios.append(a / b)
    return percentile_interval(ratios, level) if ratios else None
