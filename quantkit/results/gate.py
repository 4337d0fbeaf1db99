"""Results of `gate`: compared figures, release figures, each candidate's report, report.json and the gate's result."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from quantkit import __version__
from quantkit.results.acceptance import AcceptanceResult
from quantkit.results.base import CommandResult, Result
from quantkit.results.bench import BenchResult
from quantkit.results.check import CheckSummary
from quantkit.results.evaluate import EvalResult
from quantkit.results.serve import ServeReport
from quantkit.vocab import ModelKind

ReleaseVerdict = Literal["pass", "regression", "anomalous", "infeasible"]


# The last part of the names of gate figures that count things (quantkit.gate.steps, quantkit.gate.release): their
# value and threshold are integers, and the report and card show them so (never `0.0000 <= 0.0000`).
COUNT_FIGURES = frozenset(
    {
        "errors",
        "quantized_layers",
        "unexpected_unquantized",
        "precision_mismatches",
        "failed_requests",
        "unpredicted_fallbacks",
        "malformed_responses",
        "drifted_files",
    }
)


class GateCheck(Result):
    """One judged figure of the gate: what the report shows (`value op threshold`, `passed`, `message`) and, from
    quantkit.gate.verdict's constructors, its own judgement (`verdict`, `reasons`), made once when the figure is built.
    `passed` is `verdict == "pass"`. The judgement is not written to the report (report.json keeps its keys)."""

    candidate: str = ""
    step: str = ""
    name: str
    value: float | None = None
    threshold: float | None = None
    op: str | None = None
    passed: bool | None = None
    message: str = ""
    verdict: ReleaseVerdict | None = Field(default=None, exclude=True)
    reasons: list[str] = Field(default_factory=list, exclude=True)  # "<verdict>: <name>: why", every one that applies

    @property
    def is_count(self) -> bool:
        """Whether the figure counts things (errors, failed requests, drifted files): shown as an integer."""
        return self.name.rsplit(".", 1)[-1] in COUNT_FIGURES

    def shown(self, x: float | None, digits: int = 4) -> str:
        """`x` (this figure's value or threshold) as its kind reads: a count as an integer, else `digits` decimals;
        "-" when not measured."""
        if x is None:
            return "-"
        return f"{x:.0f}" if self.is_count else f"{x:.{digits}f}"

    def line(self) -> str:
        if self.value is None or self.threshold is None:
            return f"{self.candidate}: {self.step}: {self.name}: {self.message}"
        return (
            f"{self.candidate}: {self.step}: {self.name} = {self.value:.4g} "
            f"(threshold {self.op} {self.threshold:.4g}){'' if self.passed else ' FAILED'}"
        )


class Verdict(Result):
    passed: bool | None = None
    checks: list[GateCheck] = []


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
    bench: BenchResult | None = None
    release: ReleaseFigures | None = None
    gate: Verdict | None = None
    verdict: ReleaseVerdict | None = None  # quantkit.gate.verdict.judge over this candidate's figures
    verdict_reasons: list[str] = []


class GateSummary(Result):
    name: str = ""
    config: str = ""
    passed: bool = False
    verdict: ReleaseVerdict | None = None  # pass | regression | anomalous | infeasible (quantkit.gate.verdict)
    reasons: list[str] = []  # "<verdict>: <figure>: why", every one that applies
    checks: list[GateCheck] = []
    seconds: float = 0.0


class GateReport(CommandResult):
    """report.json: the gate's verdict and every candidate's report."""

    quantkit_version: str = ""
    gate: GateSummary
    candidates: dict[str, CandidateReport] = {}


class GateResult(CommandResult):
    """The gate's verdict, every compared figure, and every candidate's report (results.CandidateReport)."""

    name: str
    config: str
    passed: bool
    verdict: ReleaseVerdict
    reasons: list[str] = []
    checks: list[GateCheck]
    candidates: dict[str, CandidateReport]
    seconds: float
    outputs: dict[str, str] = {}
    warnings: list[str] = []  # what went wrong around the verdict without changing it (the CI step summary)

    @property
    def failures(self) -> list[GateCheck]:
        return [c for c in self.checks if not c.passed]

    def report(self) -> GateReport:
        return GateReport(
            quantkit_version=__version__,
            gate=GateSummary(
                name=self.name,
                config=self.config,
                passed=self.passed,
                verdict=self.verdict,
                reasons=self.reasons,
                checks=self.checks,
                seconds=round(self.seconds, 2),
            ),
            candidates=self.candidates,
        )

    def to_dict(self) -> dict[str, Any]:
        return self.report().to_dict()


__all__ = [
    "COUNT_FIGURES",
    "CandidateReport",
    "GateCheck",
    "GateReport",
    "GateResult",
    "GateSummary",
    "ReleaseFigures",
    "ReleaseVerdict",
    "Verdict",
]
