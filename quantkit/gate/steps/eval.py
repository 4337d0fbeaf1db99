"""The gate's eval step: lm-eval recovery of a quantized target against its baseline (quantkit eval), as figures."""

from __future__ import annotations

from typing import ClassVar

from quantkit.gate.steps.base import GateCandidate, GateContext
from quantkit.gate.verdict import ci_pair, threshold
from quantkit.results.gate import CandidateReport, GateCheck
from quantkit.vocab import EAGLE3_DRAFT, StepName


class Eval:
    """`eval.<task>.<metric>.recovery` (anomalous when its CI lies wholly above 1: the quantized model beating its
    source), `.recovery_lower_bound`; on every candidate that is not a draft."""

    name: ClassVar[StepName] = "eval"

    def applies_to(self, cand: GateCandidate, ctx: GateContext) -> bool:
        return cand.kind != EAGLE3_DRAFT

    def run(self, cand: GateCandidate, report: CandidateReport, ctx: GateContext) -> list[GateCheck]:
        from quantkit.evaluate.run import run_eval

        e = ctx.config.eval
        assert e is not None  # load_gate_config requires `eval` settings when eval is a step
        assert cand.baseline is not None  # a target's baseline is its own `baseline` or `target`
        ev = run_eval(
            cand.path,
            cand.baseline,
            e.tasks,
            backend=e.backend,
            limit=e.limit,
            num_fewshot=e.num_fewshot,
            progress=None,
        )
        report.eval = ev
        figures = []
        if not ev.tasks:
            figures.append(
                threshold(cand.name, "eval", "eval.tasks", None, ">=", e.min_recovery, message="no task result")
            )
        for t in ev.tasks:
            label = f"eval.{t.task}.{t.metric}"
            # recovery is candidate / baseline with "higher is better" for every metric (inverted for lower-is-better
            # ones), so a CI wholly above 1 is the quantized model beating its source
            figures.append(
                threshold(
                    cand.name,
                    "eval",
                    f"{label}.recovery",
                    t.recovery,
                    ">=",
                    e.min_recovery,
                    ci=ci_pair(t.recovery_ci95),
                    parity=1.0,
                    message="" if t.recovery is not None else "no recovery (baseline score 0?)",
                )
            )
            if e.use_lower_bound:
                figures.append(
                    threshold(
                        cand.name, "eval", f"{label}.recovery_lower_bound", t.recovery_lower_bound, ">=", e.min_recovery
                    )
                )
        return figures
