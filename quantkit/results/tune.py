"""Results of `quantkit tune`: every draft option swept (body precision x draft vocabulary x K), its measured AL
against the BF16 full-vocabulary draft, its ESTIMATE FROM BYTES of cost per accepted token, and the recommendation."""

from __future__ import annotations

from quantkit.results.base import CommandResult, Result
from quantkit.results.cost import ESTIMATE_LABEL


class TuneOption(Result):
    body: str  # "bf16" | "fp8" (the fp8-draft recipe)
    draft_vocab: int
    k: int
    al: float | None  # measured (reference engine or vLLM), the candidate's mean acceptance length
    baseline_al: float | None  # the BF16 full-vocabulary draft at the same K, same prompts
    al_ratio: float | None
    round_us: float | None  # ESTIMATE FROM BYTES: fc + K draft tokens + the target's verify step
    us_per_accepted_token: float | None  # round_us / AL
    speedup_bound: float | None  # AL x t_decode / round_us
    pareto: bool = False
    meets_floor: bool = False


class TuneResult(CommandResult):
    target: str
    draft: str
    gpu: str
    corpus: str
    backend: str
    al_ratio_floor: float
    options: list[TuneOption] = []
    recommended: TuneOption | None = None
    applied_to: str | None = None
    chart: str | None = None
    label: str = ESTIMATE_LABEL


__all__ = ["TuneOption", "TuneResult"]
