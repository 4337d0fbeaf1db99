"""Per-prompt speculative-decoding counters and the sampling settings, common to both acceptance backends, and
the order statistics and bootstrap the served bench puts on repeats (no torch here, so the CLI's validation stays
light)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

DraftSampleMethod = Literal["greedy", "probabilistic"]  # vllm/config/speculative.py DraftSampleMethod
DRAFT_SAMPLE_METHODS: tuple[DraftSampleMethod, ...] = ("greedy", "probabilistic")


@dataclass(frozen=True)
class Sampling:
    """How a request samples, as vLLM's SamplingParams (temperature, top_p, top_k, seed) and SpeculativeConfig
    (`draft_sample_method`, vllm/config/speculative.py: "greedy", the default, proposes the draft's argmax and treats
    the draft probabilities as one-hot in rejection sampling; "probabilistic" samples the draft at the request's
    temperature and tests p/q). temperature 0 is greedy decoding (argmax equality)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 (or -1): no top-k, as vLLM's SamplingParams
    draft_sample_method: DraftSampleMethod = "greedy"

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class SequenceStats:
    """Spec-decode counters and output of one prompt (or one conversation, its turns summed)."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    target_forwards: int = 0
    # one entry per draft round: (tokens the request had generated before the round, accepted draft tokens); empty
    # where the backend does not report rounds (vLLM's per-request metrics are totals)
    rounds: list[tuple[int, int]] = field(default_factory=list)
    # sum over rounds of E[accepted | the round's draft tokens] under the target's (sampling) probabilities along the
    # realised path; None where the backend cannot compute it
    expected_accepted: float | None = None

    def merge(self, other: SequenceStats) -> None:
        """Add the counters of a later turn of the same conversation."""
        self.num_drafts += other.num_drafts
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted += other.num_accepted
        self.accepted_per_pos = [a + b for a, b in zip(self.accepted_per_pos, other.accepted_per_pos)]
        self.output_ids = [*self.output_ids, *other.output_ids]
        self.target_forwards += other.target_forwards
        self.rounds = [*self.rounds, *other.rounds]
        self.expected_accepted = (
            None
            if self.expected_accepted is None or other.expected_accepted is None
            else self.expected_accepted + other.expected_accepted
        )


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


def bootstrap_median_ratio_ci(
    num: list[float], den: list[float], samples: int = 2000, seed: int = 0, level: float = 0.95
) -> tuple[float, float] | None:
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
