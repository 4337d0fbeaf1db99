"""quantkit.gate.verdict: one verdict over every judged figure of a release (pass, regression, anomalous,
infeasible), with every reason, in the order regression, infeasible, anomalous. Moved from tests/unit/test_deploy.py
(issue 19), where the eval-delta figure and `verdict()` were the only users of two functions the gate never called:
the eval figure is now a plain threshold figure, the verdict `judge(...).verdict`. Every figure is a results.GateCheck
built by quantkit.gate.verdict's constructors (one figure type)."""

from __future__ import annotations

from quantkit.gate.release import size_ratio_check, tokenizer_drift_check
from quantkit.gate.verdict import acceptance_ratio_check, agreement, infeasible, judge, threshold
from quantkit.results import GateCheck


def verdict(checks: list[GateCheck]) -> str:
    return judge(checks).verdict


def eval_delta(delta: float, ci: tuple[float, float], max_drop: float) -> GateCheck:
    """Quantized minus baseline score: no lower than -max_drop; anomalous when its CI lies wholly above 0."""
    return threshold("c", "eval", "eval.french.delta", delta, ">=", -max_drop, ci=ci, parity=0.0)


def served_al_check(served_al: float, in_process_al: float, tolerance: float) -> GateCheck:
    """AL through `vllm serve` against the in-process AL, without per-prompt figures: anomalous beyond `tolerance`."""
    return agreement("c", "serve", "serve.bs1.al_vs_in_process", served_al, in_process_al, tolerance)


def test_verdict_reaches_every_outcome():
    good = acceptance_ratio_check(1.0, (0.99, 1.01))
    assert verdict([good, eval_delta(-0.01, (-0.03, 0.01), max_drop=0.02)]) == "pass"
    assert verdict([acceptance_ratio_check(0.27, (0.25, 0.30))]) == "regression"
    assert verdict([good, acceptance_ratio_check(None, None, error="vLLM failed to start")]) == "infeasible"
    # better than the baseline beyond the CI: a ratio whose CI lies above 1, an eval delta whose CI lies above 0
    assert verdict([acceptance_ratio_check(1.2, (1.1, 1.3))]) == "anomalous"
    assert verdict([eval_delta(0.08, (0.05, 0.11), max_drop=0.02)]) == "anomalous"
    # the same figure measured two ways disagrees: served AL vs in-process AL
    assert verdict([served_al_check(3.10, 3.674, tolerance=0.02)]) == "anomalous"
    assert verdict([served_al_check(3.674, 3.674, tolerance=0.02)]) == "pass"
    assert verdict([size_ratio_check(0.7, max_ratio=0.8), tokenizer_drift_check([])]) == "pass"
    assert verdict([tokenizer_drift_check(["tokenizer.json: ..."])]) == "regression"


def test_verdict_precedence_and_reasons():
    j = judge(
        [
            acceptance_ratio_check(0.5, (0.4, 0.6)),
            infeasible("c", "eval", "eval", "lm-eval crashed"),
            served_al_check(3.0, 3.5, tolerance=0.02),
        ]
    )
    assert j.verdict == "regression"
    assert [r.split(":")[0] for r in j.reasons] == ["regression", "infeasible", "anomalous"]
    assert (
        judge([infeasible("c", "eval", "eval", "x"), served_al_check(3.0, 3.5, tolerance=0.02)]).verdict == "infeasible"
    )
    # a check that is not required and could not run is left out
    optional = threshold("c", "eval", "optional", None, ">=", None, required=False)
    assert verdict([acceptance_ratio_check(1.0, (0.99, 1.01)), optional]) == "pass"
    # with use_ci_bound the CI's lower end is judged: a ratio of 0.99 whose CI reaches 0.95 misses 0.98
    assert verdict([acceptance_ratio_check(0.99, (0.95, 1.02))]) == "pass"
    assert verdict([acceptance_ratio_check(0.99, (0.95, 1.02), use_ci_bound=True)]) == "regression"
    # lower-is-better figures mirror: a size ratio CI wholly below its parity is anomalous
    assert verdict([threshold("c", "eval", "latency.ratio", 0.5, "<=", 1.2, ci=(0.4, 0.6), parity=1.0)]) == "anomalous"
