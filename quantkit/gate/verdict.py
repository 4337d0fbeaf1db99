"""The gate's verdict: one verdict over every judged figure of a release (pass, regression, anomalous, infeasible),
and the figures judged against a baseline (acceptance ratio, served vs in-process AL). Pure functions
over numbers; nothing here runs a model. The release figures (size, tokenizer drift) are in quantkit.gate.release.

Verdict rules (`judge`), over `ReleaseCheck`s:

- infeasible: a required check could not run (its `error` is set, or it has no `value`). A check with
  `required=False` that could not run is left out.
- regression: a check that ran misses its threshold: not `value op threshold` (`op` ">=" when higher is better,
  "<=" when lower is better); with `use_ci_bound`, the pessimistic end of `ci` is compared instead of `value`
  (the CI's lower end for ">=", its upper end for "<=").
- anomalous: a check that ran is better than its baseline beyond its confidence interval, i.e. the whole `ci` lies
  on the better side of `parity` (the value at which candidate and baseline are equal: 1.0 for ratios, 0.0 for
  deltas). A quantized model does not beat its source with confidence; when it seems to, the measurement is
  suspect (wrong baseline, swapped paths, leaked test data). Also anomalous: the same figure measured two ways
  disagrees (served AL against in-process AL). With a prompt-by-prompt comparison (`agreement_p`, the p-value of
  quantkit.acceptance.agreement's paired randomization test, and its `agreement_level`), that is p <= 1 - level:
  the difference is more than the prompts that came out differently explain (near-tied logits flip tokens under
  another batch composition or CPU kernel, in either direction); `tolerance`, if set, is then a floor under which a
  difference is never anomalous. Without per-prompt figures, |value - reference| > tolerance.
- pass: none of the above.

When several apply, the verdict is the first of regression, infeasible, anomalous: a figure that misses its
threshold is a definite failure and is not hidden behind a step that could not run; a release that could not be
measured fully is not called merely anomalous. `judge` returns every reason, so nothing is lost by the ordering.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Verdict = Literal["pass", "regression", "anomalous", "infeasible"]


# --- verdict -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReleaseCheck:
    """One figure of a release and how to judge it (see the module docstring for the rules)."""

    name: str
    value: float | None = None
    threshold: float | None = None
    op: Literal[">=", "<="] = ">="
    ci: tuple[float, float] | None = None
    parity: float | None = None
    use_ci_bound: bool = False
    reference: float | None = None
    tolerance: float | None = None
    agreement_p: float | None = None
    agreement_level: float | None = None
    required: bool = True
    error: str | None = None

    @property
    def ran(self) -> bool:
        return self.error is None and self.value is not None


@dataclass
class Judgement:
    verdict: Verdict
    reasons: list[str] = field(default_factory=list)  # "<verdict>: <check>: why", every one that applies


def _judged(c: ReleaseCheck) -> float:
    assert c.value is not None
    if c.use_ci_bound and c.ci is not None:
        return c.ci[0] if c.op == ">=" else c.ci[1]
    return c.value


def judge(checks: list[ReleaseCheck]) -> Judgement:
    """The release verdict and every reason for it."""
    reasons: dict[Verdict, list[str]] = {"regression": [], "infeasible": [], "anomalous": []}
    for c in checks:
        if not c.ran:
            if c.required:
                reasons["infeasible"].append(f"{c.name}: could not run ({c.error or 'no value'})")
            continue
        assert c.value is not None
        if c.threshold is not None:
            judged = _judged(c)
            ok = judged >= c.threshold if c.op == ">=" else judged <= c.threshold
            if not ok:
                what = "CI bound" if c.use_ci_bound and c.ci is not None else "value"
                reasons["regression"].append(f"{c.name}: {what} {judged:.4g} misses {c.op} {c.threshold:.4g}")
        if c.ci is not None and c.parity is not None:
            lo, hi = c.ci
            if (c.op == ">=" and lo > c.parity) or (c.op == "<=" and hi < c.parity):
                reasons["anomalous"].append(f"{c.name}: better than its baseline beyond its CI ({lo:.4g}-{hi:.4g} "
                                            f"entirely {'above' if c.op == '>=' else 'below'} {c.parity:.4g})")
        if c.reference is not None and c.agreement_p is not None and c.agreement_level is not None:
            beyond_floor = c.tolerance is None or abs(c.value - c.reference) > c.tolerance
            if c.agreement_p <= 1 - c.agreement_level and beyond_floor:
                reasons["anomalous"].append(
                    f"{c.name}: {c.value:.4g} disagrees with {c.reference:.4g} measured the other way beyond what the "
                    f"prompts that came out differently explain (p {c.agreement_p:.3g} <= {1 - c.agreement_level:.3g})")
        elif c.reference is not None and c.tolerance is not None and abs(c.value - c.reference) > c.tolerance:
            reasons["anomalous"].append(f"{c.name}: {c.value:.4g} disagrees with {c.reference:.4g} measured the other "
                                        f"way (tolerance {c.tolerance:.4g})")
    order: tuple[Verdict, ...] = ("regression", "infeasible", "anomalous")
    for v in order:
        if reasons[v]:
            return Judgement(v, [f"{k}: {r}" for k in order for r in reasons[k]])
    return Judgement("pass", [])


# --- common checks -----------------------------------------------------------------------------------------------


def acceptance_ratio_check(ratio: float | None, ratio_ci: tuple[float, float] | None, min_ratio: float = 0.98,
                           use_ci_bound: bool = False, error: str | None = None) -> ReleaseCheck:
    """Candidate / BF16-draft AL: at least `min_ratio`; anomalous when its CI lies wholly above 1."""
    return ReleaseCheck("acceptance.ratio", ratio, min_ratio, ">=", ratio_ci, 1.0, use_ci_bound, error=error)


def served_al_check(served_al: float | None, in_process_al: float | None, tolerance: float | None,
                    min_al: float | None = None, error: str | None = None, *,
                    agreement_p: float | None = None, agreement_level: float | None = None) -> ReleaseCheck:
    """AL through `vllm serve` against the in-process AL on the same prompts: anomalous when the prompt-by-prompt
    comparison (`agreement_p` at `agreement_level`, quantkit.acceptance.agreement) says they disagree and the
    difference exceeds the optional floor `tolerance`; without it, anomalous beyond `tolerance`."""
    missing = error or (None if in_process_al is not None else "no in-process AL to compare with")
    return ReleaseCheck("serve.acceptance_length", served_al, min_al, ">=", reference=in_process_al,
                        tolerance=tolerance, agreement_p=agreement_p, agreement_level=agreement_level, error=missing)
