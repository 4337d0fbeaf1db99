"""Results of `gate`: compared figures, release figures, each candidate's report and report.json."""

from __future__ import annotations

from typing import Literal

from quantkit.results.acceptance import AcceptanceResult
from quantkit.results.base import CommandResult, Result
from quantkit.results.check import CheckSummary
from quantkit.results.evaluate import EvalResult
from quantkit.results.serve import ServeReport
from quantkit.vocab import ModelKind


class GateCheck(Result):
    """One compared figure: passes when `value op threshold` holds."""

    candidate: str = ""
    step: str = ""
    name: str
    value: float | None = None
    threshold: float | None = None
    op: str | None = None
    passed: bool | None = None
    message: str = ""

    def line(self) -> str:
        if self.value is None or self.threshold is None:
            return f"{self.candidate}: {self.step}: {self.name}: {self.message}"
        return (f"{self.candidate}: {self.step}: {self.name} = {self.value:.4g} "
                f"(threshold {self.op} {self.threshold:.4g}){'' if self.passed else ' FAILED'}")


class Verdict(Result):
    passed: bool | None = None
    checks: list[GateCheck] = []


ReleaseVerdict = Literal["pass", "regression", "anomalous", "infeasible"]


class ReleaseFigures(Result):
    """ModelOpt-style release figures of a candidate against its source (the BF16 draft for a draft, the baseline
    for a target): weight bytes, apply's dry-run prediction of them, and tokenizer drift."""

    source: str = ""
    size_ratio: float | None = None  # output / source safetensors bytes
    predicted_size_ratio: float | None = None  # apply --dry-run's prediction with quantkit.json's recipe
    tokenizer_drift: list[str] | None = None  # one line per drifted tokenizer file; [] when byte-identical


class CandidateReport(CommandResult):
    """Everything the gate measured for one candidate; also the document `publish --report` reads."""

    model: str | None = None
    baseline_model: str | None = None
    model_kind: ModelKind | None = None
    check: CheckSummary | None = None
    acceptance: AcceptanceResult | None = None
    eval: EvalResult | None = None
    serve: ServeReport | None = None
    release: ReleaseFigures | None = None
    gate: Verdict | None = None
    verdict: ReleaseVerdict | None = None  # quantkit.deploy.checks.judge over this candidate's figures
    verdict_reasons: list[str] = []


class GateSummary(Result):
    name: str = ""
    config: str = ""
    passed: bool = False
    verdict: ReleaseVerdict | None = None  # pass | regression | anomalous | infeasible (quantkit.deploy.checks)
    reasons: list[str] = []  # "<verdict>: <figure>: why", every one that applies
    checks: list[GateCheck] = []
    seconds: float = 0.0


class GateReport(CommandResult):
    """report.json: the gate's verdict and every candidate's report."""

    quantkit_version: str = ""
    gate: GateSummary
    candidates: dict[str, CandidateReport] = {}


__all__ = [
    "CandidateReport",
    "GateCheck",
    "GateReport",
    "GateSummary",
    "ReleaseFigures",
    "ReleaseVerdict",
    "Verdict",
]
