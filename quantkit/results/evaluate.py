"""Results of `eval`: each task metric of the baseline and the candidate, with delta and recovery."""

from __future__ import annotations

from typing import Any

from quantkit.results.base import CommandResult, Result


class MetricDelta(Result):
    """One task metric of both models. `metric` is lm-eval's key without `,none` (`acc`, `exact_match,json-object`)."""

    task: str
    metric: str
    filter: str = "none"
    higher_is_better: bool | None = None
    num_items: int | None = None
    baseline: float | None = None
    baseline_stderr: float | None = None
    candidate: float | None = None
    candidate_stderr: float | None = None
    delta: float | None = None
    delta_stderr: float | None = None
    delta_stderr_method: str = ""  # "paired" over items, or "unpaired" from the two stderrs
    delta_ci95: list[float] | None = None
    recovery: float | None = None  # candidate / baseline (inverted when lower is better); None if undefined
    recovery_ci95: list[float] | None = None
    recovery_lower_bound: float | None = None  # recovery_ci95[0], for a gate's statistical threshold


class EvalResult(CommandResult):
    """Baseline vs candidate on the same tasks and settings."""

    model: str | None = None
    baseline_model: str | None = None
    backend: str | None = None
    limit: int | None = None
    num_fewshot: int | None = None
    tasks: list[MetricDelta] = []
    settings: dict[str, Any] = {}
    timings_s: dict[str, float] = {}


__all__ = ["EvalResult", "MetricDelta"]
