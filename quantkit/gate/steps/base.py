"""What a gate step is (`Step`), what it runs on (`GateCandidate`, `GateContext`), and the candidates of a config
resolved before any step runs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol

from quantkit.gate.config import GateConfig, GateConfigError
from quantkit.progress import Progress
from quantkit.results.gate import CandidateReport, GateCheck
from quantkit.vocab import EAGLE3_DRAFT, ModelKind, StepName


@dataclass(frozen=True)
class GateCandidate:
    """One candidate with its paths resolved (absolute) and its kind read from its config.json."""

    name: str
    path: str
    kind: ModelKind
    baseline: str | None  # a draft's: the BF16 draft; a target's: its `baseline`, else `target`
    pair_target: str | None  # a pair: the quantized target the draft is served with


@dataclass(frozen=True)
class GateContext:
    """What every step of one gate run shares."""

    config: GateConfig
    target: str  # the BF16 target (absolute)
    draft: str | None  # the BF16 draft (absolute)
    prompts: str  # the acceptance prompts: "builtin", speed-bench:..., or an absolute path
    progress: Progress
    base: Path | None = None  # the gate config's folder: what relative paths in it are relative to
    deploy_manifest: str | None = None  # serve.deploy_manifest (absolute): the served step's backend prediction


class Step(Protocol):
    """One gate step. `run` writes its section into `report` (report.check / .release / .acceptance / .eval /
    .serve) and returns its figures, built by quantkit.gate.verdict's constructors; an exception it raises becomes
    the step's infeasible `<name>.error` figure (quantkit.gate.run)."""

    name: ClassVar[StepName]

    def applies_to(self, cand: GateCandidate, ctx: GateContext) -> bool: ...

    def run(self, cand: GateCandidate, report: CandidateReport, ctx: GateContext) -> list[GateCheck]: ...


def resolve_candidates(cfg: GateConfig, base: Path, config_path: str | Path) -> list[GateCandidate]:
    """Every candidate with absolute paths and its kind; a pair's path must be a draft and its target a target
    (checked for all before any step runs)."""
    from quantkit.io.checkpoint import resolve_source
    from quantkit.naming.archs import model_kind

    def rel(p: str) -> str:
        return str((base / p).resolve())

    target, draft = rel(cfg.target), rel(cfg.draft) if cfg.draft is not None else None
    out = []
    for i, cand in enumerate(cfg.candidates):
        kind = model_kind(resolve_source(rel(cand.path)).config)
        if cand.target is not None and kind != EAGLE3_DRAFT:
            raise GateConfigError(
                f"gate config {config_path}: candidates[{i}].path: {cand.path} is a {kind}; a pair's "
                "path is the quantized EAGLE-3 draft and its target the quantized target"
            )
        if cand.target is not None:
            tkind = model_kind(resolve_source(rel(cand.target)).config)
            if tkind == EAGLE3_DRAFT:
                raise GateConfigError(
                    f"gate config {config_path}: candidates[{i}].target: {cand.target} is an "
                    "EAGLE-3 draft; a pair's target is the quantized target model"
                )
        baseline = (rel(cand.baseline) if cand.baseline is not None else None) or (
            draft if kind == EAGLE3_DRAFT else target
        )
        out.append(
            GateCandidate(
                name=cand.name,
                path=rel(cand.path),
                kind=kind,
                baseline=baseline,
                pair_target=rel(cand.target) if cand.target is not None else None,
            )
        )
    return out
