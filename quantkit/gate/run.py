"""`quantkit gate`: the pre-deployment gate. Runs check / acceptance / eval on candidates, compares every figure
with its threshold, and writes one report (JSON, Markdown, JUnit XML). It fails closed: a missed threshold, a step
that errored, or a step with no result fails the gate.

Gate config (YAML; unknown keys are errors; paths are relative to the config file):

    name: tiny-bundled
    target: ../examples/tiny/target           # the verifier
    draft: ../examples/tiny/eagle3-draft      # the BF16 EAGLE-3 draft (acceptance baseline)
    candidates:                               # quantized checkpoints under test
      - {name: draft-fp8, path: ../out/draft-fp8}                           # a draft: baseline = draft
      - {name: moe-mxfp4, path: ../out/moe-mxfp4, baseline: ../examples/tiny/moe-target}
      - {name: pair, path: ../out/draft-fp8, target: ../out/target-q}       # a pair: quantized draft + target
    steps: [check, acceptance, eval]
    check: {platform: gfx950, tp: 1, vllm: auto}
    acceptance: {min_ratio: 0.98, per_domain_min_ratio: 0.95, min_al: 2.0, use_ci_lower_bound: false,
                 backend: auto, prompts: builtin, num_speculative_tokens: 3, max_new_tokens: 64}
    eval: {tasks: [tiny_french_mc], min_recovery: 0.98, use_lower_bound: false, limit: 100, backend: hf}

Which step applies to which candidate: `check` to all; `acceptance` to drafts (against `draft` with `target`) and
to quantized targets whose baseline is `target` (run as the verifier of `draft`); `eval` to targets. A pair
(`path` = the quantized draft, `target` = the quantized target it is served with) is checked as a draft against its
own target, and its acceptance compares (its target + its draft) with (`target` + `draft`), with the drafts'
thresholds; list the quantized target as a candidate of its own to check and eval it.
"""

from __future__ import annotations

import os
import time
import traceback
from pathlib import Path
from typing import Any

from quantkit import __version__
from quantkit.errors import QuantkitError
from quantkit.gate.config import GateConfigError, load_gate_config
from quantkit.progress import Progress, or_silent
from quantkit.results import (
    EAGLE3_DRAFT,
    CandidateReport,
    GateCheck,
    GateReport,
    GateSummary,
    ModelKind,
    Result,
    Verdict,
)


class GateResult(Result):
    """The gate's verdict, every compared figure, and every candidate's report (results.CandidateReport)."""

    name: str
    config: str
    passed: bool
    checks: list[GateCheck]
    candidates: dict[str, CandidateReport]
    seconds: float
    outputs: dict[str, str] = {}

    @property
    def failures(self) -> list[GateCheck]:
        return [c for c in self.checks if not c.passed]

    def report(self) -> GateReport:
        return GateReport(quantkit_version=__version__,
                          gate=GateSummary(name=self.name, config=self.config, passed=self.passed, checks=self.checks,
                                           seconds=round(self.seconds, 2)),
                          candidates=self.candidates)

    def to_dict(self) -> dict[str, Any]:
        return self.report().to_dict()


def _cmp(value: float, op: str, threshold: float) -> bool:
    return value >= threshold if op == ">=" else value <= threshold


def run_gate(config_path: str | Path, progress: Progress | None = None) -> GateResult:
    """Run the configured steps on every candidate and judge every figure."""
    progress = or_silent(progress)
    t0 = time.perf_counter()
    cfg, base = load_gate_config(config_path)

    def rel(p: str) -> str:
        return str((base / p).resolve())

    target, draft = rel(cfg.target), rel(cfg.draft) if cfg.draft is not None else None
    checks: list[GateCheck] = []
    candidates: dict[str, CandidateReport] = {}

    from quantkit.io.checkpoint import resolve_source
    from quantkit.naming.drafts import model_kind

    kinds: dict[str, ModelKind] = {}
    for i, cand in enumerate(cfg.candidates):  # before any step runs: a pair's path must be a draft
        kinds[cand.name] = kind = model_kind(resolve_source(rel(cand.path)).config)
        if cand.target is not None and kind != EAGLE3_DRAFT:
            raise GateConfigError(f"gate config {config_path}: candidates[{i}].path: {cand.path} is a {kind}; a pair's "
                                  "path is the quantized EAGLE-3 draft and its target the quantized target")
        if cand.target is not None:
            tkind = model_kind(resolve_source(rel(cand.target)).config)
            if tkind == EAGLE3_DRAFT:
                raise GateConfigError(f"gate config {config_path}: candidates[{i}].target: {cand.target} is an "
                                      "EAGLE-3 draft; a pair's target is the quantized target model")

    for cand in cfg.candidates:
        path = rel(cand.path)
        kind = kinds[cand.name]
        pair_target = rel(cand.target) if cand.target is not None else None
        baseline = (rel(cand.baseline) if cand.baseline is not None else None) or \
            (draft if kind == EAGLE3_DRAFT else target)
        report = CandidateReport(model=path, baseline_model=baseline, model_kind=kind)
        candidates[cand.name] = report
        ran: dict[str, bool] = {}

        def add(step: str, name: str, value: float | None, op: str, threshold: float | None, message: str = "",
                cand_name: str = cand.name) -> None:
            ok = value is not None and threshold is not None and _cmp(value, op, threshold)
            checks.append(GateCheck(candidate=cand_name, step=step, name=name, value=value, threshold=threshold, op=op,
                                    passed=ok, message=message))

        def failed_step(step: str, e: BaseException, cand_name: str = cand.name) -> None:
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            if not isinstance(e, QuantkitError):
                msg = f"{type(e).__name__}: {msg}"
                if os.environ.get("QUANTKIT_DEBUG") == "1":
                    traceback.print_exc()
            checks.append(GateCheck(candidate=cand_name, step=step, name=f"{step}.error", passed=False,
                                    message=f"step failed: {msg}"))

        if "check" in cfg.steps:
            progress(f"{cand.name}: check")
            try:
                from quantkit.check import check_checkpoint

                draft_target = pair_target or target  # a pair's draft is checked against the target it runs on
                chk = check_checkpoint(path, target=draft_target if kind == EAGLE3_DRAFT else None, tp=cfg.check.tp,
                                       platform=cfg.check.platform, vllm=cfg.check.vllm, progress=None)
                report.check = summary = chk.summary()
                first = chk.errors[0] if chk.errors else None
                add("check", "check.errors", float(len(chk.errors)), "<=", 0.0,
                    f"first: {first.code} on {first.layer_or_tensor}: {first.message}" if first else "")
                # A candidate that vLLM would load with no quantized layer is not what the gate was asked to pass.
                quantized = summary.quantized_layers or 0
                add("check", "check.quantized_layers", float(quantized), ">=", 1.0,
                    "" if quantized else "vLLM would load no layer quantized: is this the unquantized source?")
                ran["check"] = True
            except Exception as e:
                failed_step("check", e)

        wants_acceptance = kind == EAGLE3_DRAFT or (baseline == target and draft is not None)
        if "acceptance" in cfg.steps and wants_acceptance:
            a = cfg.acceptance
            progress(f"{cand.name}: acceptance")
            try:
                from quantkit.acceptance.run import run_acceptance

                assert draft is not None  # load_gate_config requires `draft` when acceptance is a step
                acc = run_acceptance(target, draft, path, prompts=a.prompts, num_speculative_tokens=a.num_speculative_tokens,
                                     temperature=a.temperature, max_new_tokens=a.max_new_tokens, backend=a.backend,
                                     candidate_target=pair_target, progress=None)
                report.acceptance = acc
                add("acceptance", "acceptance.ratio", acc.ratio, ">=", a.min_ratio)
                if a.use_ci_lower_bound:
                    add("acceptance", "acceptance.ratio_ci_low", acc.ratio_ci[0] if acc.ratio_ci else None, ">=",
                        a.min_ratio)
                if a.per_domain_min_ratio is not None:
                    for d, r in acc.per_domain_ratio.items():
                        add("acceptance", f"acceptance.per_domain_ratio.{d}", r, ">=", a.per_domain_min_ratio)
                if a.min_al is not None:
                    add("acceptance", "acceptance.candidate_al",
                        acc.candidate.mean_acceptance_length if acc.candidate else None, ">=", a.min_al)
                ran["acceptance"] = True
            except Exception as e:
                failed_step("acceptance", e)

        if "eval" in cfg.steps and kind != EAGLE3_DRAFT:
            e_cfg = cfg.eval
            assert e_cfg is not None
            progress(f"{cand.name}: eval")
            try:
                from quantkit.evaluate.run import run_eval

                assert baseline is not None  # a target's baseline is its own `baseline` or `target`
                ev = run_eval(path, baseline, e_cfg.tasks, backend=e_cfg.backend, limit=e_cfg.limit,
                               num_fewshot=e_cfg.num_fewshot, progress=None)
                report.eval = ev
                if not ev.tasks:
                    add("eval", "eval.tasks", None, ">=", e_cfg.min_recovery, "no task result")
                for t in ev.tasks:
                    label = f"eval.{t.task}.{t.metric}"
                    add("eval", f"{label}.recovery", t.recovery, ">=", e_cfg.min_recovery,
                        "" if t.recovery is not None else "no recovery (baseline score 0?)")
                    if e_cfg.use_lower_bound:
                        add("eval", f"{label}.recovery_lower_bound", t.recovery_lower_bound, ">=", e_cfg.min_recovery)
                ran["eval"] = True
            except Exception as e:
                failed_step("eval", e)

    # Fail closed: a configured step that produced a result for no candidate is a failure, not a pass.
    for step in cfg.steps:
        if not any(c.step == step for c in checks):
            checks.append(GateCheck(candidate="*", step=step, name=f"{step}.result", passed=False,
                                    message=f"no result: no candidate is one the {step} step applies to"))
    for name, report in candidates.items():
        mine = [c for c in checks if c.candidate == name]
        report.gate = Verdict(passed=all(c.passed for c in mine), checks=mine)
    return GateResult(name=cfg.name, config=str(Path(config_path).resolve()), passed=all(c.passed for c in checks),
                      checks=checks, candidates=candidates, seconds=time.perf_counter() - t0)

