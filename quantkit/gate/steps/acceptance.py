"""The gate's acceptance step: the candidate draft's acceptance length against the BF16 draft's (quantkit
acceptance), as figures."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from quantkit.gate.steps.base import GateCandidate, GateContext
from quantkit.gate.verdict import acceptance_ratio_check, ci_pair, threshold
from quantkit.results.gate import CandidateReport, GateCheck
from quantkit.vocab import EAGLE3_DRAFT, StepName


class Acceptance:
    """`acceptance.ratio` (anomalous when its bootstrap CI lies wholly above 1), `.ratio_ci_low`,
    `.per_domain_ratio.<d>`, `.candidate_al`, and with a golden file `.golden.al`, `.golden.category.<c>`,
    `.golden.pos<k>` (quantkit.gate.golden). Drafts and pairs run against `draft` with `target`; a quantized target
    whose baseline is `target` runs as the verifier of `draft`."""

    name: ClassVar[StepName] = "acceptance"

    def applies_to(self, cand: GateCandidate, ctx: GateContext) -> bool:
        return cand.kind == EAGLE3_DRAFT or (cand.baseline == ctx.target and ctx.draft is not None)

    def run(self, cand: GateCandidate, report: CandidateReport, ctx: GateContext) -> list[GateCheck]:
        from quantkit.acceptance.run import run_acceptance

        a = ctx.config.acceptance
        assert ctx.draft is not None  # load_gate_config requires `draft` when acceptance is a step
        base = ctx.base or Path(".")
        speed_bench = a.speed_bench
        if speed_bench is not None and (base / speed_bench).exists():  # a folder next to the config, else a Hub id
            speed_bench = str((base / speed_bench).resolve())
        settings = a.spec().model_copy(update={"prompts": ctx.prompts, "speed_bench": speed_bench})
        acc = run_acceptance(
            ctx.target, ctx.draft, cand.path, candidate_target=cand.pair_target, progress=None, **settings.model_dump()
        )
        report.acceptance = acc
        figures = [acceptance_ratio_check(acc.ratio, ci_pair(acc.ratio_ci), a.min_ratio, candidate=cand.name)]
        if a.use_ci_lower_bound:
            figures.append(
                threshold(
                    cand.name,
                    "acceptance",
                    "acceptance.ratio_ci_low",
                    acc.ratio_ci[0] if acc.ratio_ci else None,
                    ">=",
                    a.min_ratio,
                )
            )
        if a.per_domain_min_ratio is not None:
            figures += [
                threshold(cand.name, "acceptance", f"acceptance.per_domain_ratio.{d}", r, ">=", a.per_domain_min_ratio)
                for d, r in acc.per_domain_ratio.items()
            ]
        if a.min_al is not None:
            figures.append(
                threshold(
                    cand.name,
                    "acceptance",
                    "acceptance.candidate_al",
                    acc.candidate.mean_acceptance_length if acc.candidate else None,
                    ">=",
                    a.min_al,
                )
            )
        if a.golden is not None:
            from quantkit.gate.golden import golden_checks, load_golden

            figures += golden_checks(acc, load_golden(base / a.golden), candidate=cand.name)
        return figures
