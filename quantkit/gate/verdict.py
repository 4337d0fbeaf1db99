"""The gate's verdict: each figure (results.GateCheck) judged once, when one of the constructors here builds it, and
one verdict over every figure of a release (pass, regression, anomalous, infeasible). Pure functions over numbers;
nothing here runs a model. The release figures (size, tokenizer drift) are in quantkit.gate.release.

How a figure is judged:

- infeasible: a required figure could not be measured (`infeasible`, an `error`, or no `value`). A figure with
  `required=False` that could not be measured is left out.
- regression (`threshold`): a measured figure misses its threshold: not `value op threshold` (`op` ">=" when higher
  is better, "<=" or a strict "<" when lower is better); with `use_ci_bound`, the pessimistic end of `ci` is compared
  instead of `value` (the CI's lower end for ">=", its upper end otherwise).
- anomalous (`threshold`): a measured figure is better than its baseline beyond its confidence interval, i.e. the
  whole `ci` lies on the better side of `parity` (the value at which candidate and baseline are equal: 1.0 for
  ratios, 0.0 for deltas). A quantized model does not beat its source with confidence; when it seems to, the
  measurement is suspect (wrong baseline, swapped paths, leaked test data).
- anomalous (`agreement`): the same figure measured two ways disagrees (served AL against in-process AL). With a
  prompt-by-prompt comparison (`p_value`, the p-value of quantkit.acceptance.agreement's paired randomization test,
  and its `level`), that is p <= 1 - level: the difference is more than the prompts that came out differently explain
  (near-tied logits flip tokens under another batch composition or CPU kernel, in either direction); `tolerance`, if
  set, is then a floor under which a difference is never anomalous. Without per-prompt figures,
  |value - reference| > tolerance.
- pass: none of the above.

When several apply, the verdict is the first of regression, infeasible, anomalous: a figure that misses its
threshold is a definite failure and is not hidden behind a step that could not run; a release that could not be
measured fully is not called merely anomalous. `judge` returns every reason, so nothing is lost by the ordering.
"""

from __future__ import annotations

import math
import os
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from quantkit.errors import QuantkitError
from quantkit.results.gate import GateCheck

Verdict = Literal["pass", "regression", "anomalous", "infeasible"]
ORDER: tuple[Verdict, ...] = ("regression", "infeasible", "anomalous")
Op = Literal[">=", "<=", "<"]


@dataclass
class Judgement:
    verdict: Verdict
    reasons: list[str] = field(default_factory=list)  # "<verdict>: <figure>: why", every one that applies


def _figure(
    candidate: str,
    step: str,
    name: str,
    value: float | None,
    op: str | None,
    threshold: float | None,
    found: dict[Verdict, list[str]],
    message: str,
) -> GateCheck:
    """The GateCheck with its judgement; a figure that is not a plain threshold miss says which verdict it gives in
    its message (an anomalous one always, an infeasible one when it has no message of its own)."""
    reasons = [f"{v}: {name}: {why}" for v in ORDER for why in found[v]]
    verdict: Verdict = next((v for v in ORDER if found[v]), "pass")
    why = reasons[0].split(": ", 2)[-1] if reasons else ""
    if verdict == "anomalous":
        message = f"anomalous: {why}" + (f"; {message}" if message else "")
    elif verdict == "infeasible" and not message:
        message = f"infeasible: {why}"
    return GateCheck(
        candidate=candidate,
        step=step,
        name=name,
        value=value,
        threshold=threshold,
        op=op,
        passed=verdict == "pass",
        message=message,
        verdict=verdict,
        reasons=reasons,
    )


def _empty() -> dict[Verdict, list[str]]:
    return {"regression": [], "infeasible": [], "anomalous": []}


def threshold(
    candidate: str,
    step: str,
    name: str,
    value: float | None,
    op: Op,
    threshold: float | None,
    *,
    message: str = "",
    ci: tuple[float, float] | None = None,
    parity: float | None = None,
    use_ci_bound: bool = False,
    required: bool = True,
    error: str | None = None,
) -> GateCheck:
    """A figure against a threshold: regression when missed, anomalous when its CI lies wholly beyond `parity`,
    infeasible when it has no value (or `error` says why it could not be measured)."""
    if op not in (">=", "<=", "<"):
        raise ValueError(f"op {op!r}")
    found = _empty()
    if error is not None or value is None:
        if required:
            found["infeasible"].append(f"could not run ({error or 'no value'})")
        return _figure(candidate, step, name, value, op, threshold, found, message)
    if threshold is not None:
        judged = (ci[0] if op == ">=" else ci[1]) if use_ci_bound and ci is not None else value
        ok = judged >= threshold if op == ">=" else judged <= threshold if op == "<=" else judged < threshold
        if not ok:
            what = "CI bound" if use_ci_bound and ci is not None else "value"
            found["regression"].append(f"{what} {judged:.4g} misses {op} {threshold:.4g}")
    if ci is not None and parity is not None:
        lo, hi = ci
        if (op == ">=" and lo > parity) or (op != ">=" and hi < parity):
            found["anomalous"].append(
                f"better than its baseline beyond its CI ({lo:.4g}-{hi:.4g} entirely "
                f"{'above' if op == '>=' else 'below'} {parity:.4g})"
            )
    return _figure(candidate, step, name, value, op, threshold, found, message)


def agreement(
    candidate: str,
    step: str,
    name: str,
    value: float | None,
    reference: float | None,
    tolerance: float | None,
    *,
    p_value: float | None = None,
    level: float | None = None,
    shown_threshold: float | None = None,
    message: str = "",
) -> GateCheck:
    """One figure measured two ways (`value`, and `reference` the other way): anomalous when they disagree (see the
    module docstring), infeasible when either is missing. The report shows |value - reference| against
    `shown_threshold` (the agreement bound, or the fixed tolerance)."""
    found = _empty()
    diff = abs(value - reference) if value is not None and reference is not None else None
    if value is None or reference is None:
        missing = "no value" if reference is not None else "no in-process AL to compare with"
        found["infeasible"].append(f"could not run ({missing})")
    elif p_value is not None and level is not None:
        if p_value <= 1 - level and (tolerance is None or abs(value - reference) > tolerance):
            found["anomalous"].append(
                f"{value:.4g} disagrees with {reference:.4g} measured the other way beyond what the prompts that came "
                f"out differently explain (p {p_value:.3g} <= {1 - level:.3g})"
            )
    elif tolerance is not None and abs(value - reference) > tolerance:
        found["anomalous"].append(
            f"{value:.4g} disagrees with {reference:.4g} measured the other way (tolerance {tolerance:.4g})"
        )
    shown = diff if diff is not None else value  # no reference: the measured value is all there is to show
    return _figure(candidate, step, name, shown, "<=", shown_threshold, found, message)


def reported(
    candidate: str, step: str, name: str, value: float | None, op: Op, limit: float | None, *, why: str
) -> GateCheck:
    """A figure shown and not judged (`why`: e.g. hardware_dependent, measured on other hardware than the
    deployment's): it always passes, and its message says what the threshold would have said."""
    would = threshold(candidate, step, name, value, op, limit, required=False)
    verdict_text = "would pass" if would.verdict == "pass" else f"would be {would.verdict}"
    return GateCheck(
        candidate=candidate,
        step=step,
        name=name,
        value=value,
        threshold=limit,
        op=op,
        passed=True,
        message=f"{why}; reported, not gated ({verdict_text})",
        verdict="pass",
        reasons=[],
    )


def infeasible(candidate: str, step: str, name: str, message: str) -> GateCheck:
    """A step (or figure) that could not run. Its op reads ">=" in the report, as it always has."""
    return threshold(candidate, step, name, None, ">=", None, message=message, error=message)


def acceptance_ratio_check(
    ratio: float | None,
    ratio_ci: tuple[float, float] | None,
    min_ratio: float = 0.98,
    use_ci_bound: bool = False,
    error: str | None = None,
    *,
    candidate: str = "",
    step: str = "acceptance",
) -> GateCheck:
    """Candidate / BF16-draft AL: at least `min_ratio`; anomalous when its CI lies wholly above 1."""
    return threshold(
        candidate,
        step,
        "acceptance.ratio",
        ratio,
        ">=",
        min_ratio,
        ci=ratio_ci,
        parity=1.0,
        use_ci_bound=use_ci_bound,
        error=error,
    )


def judge(figures: Sequence[GateCheck]) -> Judgement:
    """The verdict over `figures` and every reason for it, in the order regression, infeasible, anomalous. A figure
    not built here (read back from a report) counts as its `passed` says."""
    found: dict[Verdict, list[str]] = _empty()
    for c in figures:
        if c.verdict is None and c.passed is False:
            found["regression"].append(f"regression: {c.name}: {c.message or 'failed'}")
        for r in c.reasons:
            found[r.split(": ", 1)[0]].append(r)  # type: ignore[index]
    for v in ORDER:
        if found[v]:
            return Judgement(v, [r for k in ORDER for r in found[k]])
    return Judgement("pass", [])


def first_line(e: BaseException) -> str:
    """An exception as one line: its message, with its type when it is not a QuantkitError (a bug, not an input);
    QUANTKIT_DEBUG=1 prints the traceback too."""
    msg = str(e).splitlines()[0] if str(e) else type(e).__name__
    if not isinstance(e, QuantkitError):
        msg = f"{type(e).__name__}: {msg}"
        if os.environ.get("QUANTKIT_DEBUG") == "1":
            traceback.print_exc()
    return msg


def ci_pair(v: Sequence[float | None] | None) -> tuple[float, float] | None:
    """A result's CI as a (low, high) pair; None unless both ends are finite numbers."""
    if v and len(v) == 2 and all(x is not None and math.isfinite(x) for x in v):
        lo, hi = v
        assert lo is not None and hi is not None
        return (lo, hi)
    return None
