"""The gate's check step: `quantkit check` of every candidate as figures, and its release figures against its
source (size, apply's size prediction, tokenizer drift; quantkit.gate.release)."""

from __future__ import annotations

from typing import ClassVar

from quantkit.gate.release import release_figures
from quantkit.gate.steps.base import GateCandidate, GateContext
from quantkit.gate.verdict import first_line, infeasible, threshold
from quantkit.results.gate import CandidateReport, GateCheck
from quantkit.vocab import EAGLE3_DRAFT, StepName

# check findings surfaced as figures: layers vLLM would run unquantized though the candidate should not, and layers
# whose loaded precision differs from what the static contract predicts
UNQUANTIZED_CODES = ("weight-not-quantized", "not-quantized")
MISMATCH_CODES = ("vllm-load-mismatch",)


class Check:
    """`check.errors`, `check.quantized_layers`, `check.unexpected_unquantized`, `check.precision_mismatches`, then
    the release figures (which run even when the check itself failed)."""

    name: ClassVar[StepName] = "check"

    def applies_to(self, cand: GateCandidate, ctx: GateContext) -> bool:
        return True

    def run(self, cand: GateCandidate, report: CandidateReport, ctx: GateContext) -> list[GateCheck]:
        figures: list[GateCheck] = []
        try:
            self._check(cand, report, ctx, figures)  # appends as it goes: the figures before a failure stay
        except Exception as e:
            figures.append(infeasible(cand.name, "check", "check.error", f"step failed: {first_line(e)}"))
        # the draft's --target for apply's dry-run prediction: the BF16 target it was quantized against
        report.release, release = release_figures(cand.name, cand.path, cand.baseline, ctx.target, ctx.config)
        return figures + release

    @staticmethod
    def _check(cand: GateCandidate, report: CandidateReport, ctx: GateContext, figures: list[GateCheck]) -> None:
        from quantkit.check.run import run as check_checkpoint

        c = ctx.config.check
        draft_target = cand.pair_target or ctx.target  # a pair's draft is checked against the target it runs on
        chk = check_checkpoint(
            cand.path,
            target=draft_target if cand.kind == EAGLE3_DRAFT else None,
            tp=c.tp,
            platform=c.platform,
            vllm=c.vllm,
            progress=None,
        )
        report.check = summary = chk.summary()
        first = chk.errors[0] if chk.errors else None
        figures.append(
            threshold(
                cand.name,
                "check",
                "check.errors",
                float(len(chk.errors)),
                "<=",
                0.0,
                message=f"first: {first.code} on {first.layer_or_tensor}: {first.message}" if first else "",
            )
        )
        # A candidate that vLLM would load with no quantized layer is not what the gate was asked to pass.
        quantized = summary.quantized_layers or 0
        figures.append(
            threshold(
                cand.name,
                "check",
                "check.quantized_layers",
                float(quantized),
                ">=",
                1.0,
                message="" if quantized else "vLLM would load no layer quantized: is this the unquantized source?",
            )
        )
        for name, codes in (
            ("check.unexpected_unquantized", UNQUANTIZED_CODES),
            ("check.precision_mismatches", MISMATCH_CODES),
        ):
            found = [f for f in summary.findings if f.code in codes]
            figures.append(
                threshold(
                    cand.name,
                    "check",
                    name,
                    float(len(found)),
                    "<=",
                    0.0,
                    message=f"first: {found[0].code} on {found[0].layer_or_tensor}: {found[0].message}"
                    if found
                    else "",
                )
            )
