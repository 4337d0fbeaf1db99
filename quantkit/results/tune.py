"""Results of `tune`: every draft option tried on a target, its acceptance against the unpruned BF16 draft, its step
cost estimated from bytes, and the option recommended."""

from __future__ import annotations

from pydantic import Field

from quantkit.results.base import CommandResult, Result
from quantkit.results.cost import ESTIMATE


class TuneOption(Result):
    """One draft option: its body precision, draft vocabulary and K, what it measured and what it costs."""

    body: str  # "bf16" or "fp8" (the fp8-draft recipe)
    draft_vocab: int  # lm_head rows
    k: int
    al: float | None = None  # mean acceptance length with this option
    baseline_al: float | None = None  # the unpruned BF16 draft's, at the same K, on the same prompts
    al_ratio: float | None = None
    round_us: float | None = None  # target verify + K draft tokens + fc, estimated from bytes
    us_per_token: float | None = None  # round_us / AL: the estimated cost of an accepted token
    cost_ratio: float | None = None  # us_per_token / the unpruned BF16 draft's at its best K
    pareto: bool = False
    error: str | None = None


class TuneResult(CommandResult):
    """`quantkit tune --json`: the table of options, the Pareto front and the recommendation."""

    target: str
    draft: str
    platform: str
    tp: int = 1
    floor: float
    estimate: str = ESTIMATE
    options: list[TuneOption] = Field(default_factory=list)
    recommended: TuneOption | None = None
    applied: str | None = None  # --apply: the folder the recommended draft was written to
    chart: str | None = None


__all__ = ["TuneOption", "TuneResult"]
