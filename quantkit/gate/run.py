"""`quantkit gate`: the pre-deployment gate. Runs check / acceptance / eval / serve on candidates, compares every
figure with its threshold, gives one verdict, and writes one report (JSON, Markdown, JUnit XML, a chart per
candidate). It fails closed: a missed threshold, a step that errored, or a step with no result fails the gate.

Gate config (YAML; unknown keys are errors; paths are relative to the config file):

    name: tiny-bundled
    target: ../examples/tiny/target           # the verifier
    draft: ../examples/tiny/eagle3-draft      # the BF16 EAGLE-3 draft (acceptance baseline)
    candidates:                               # quantized checkpoints under test
      - {name: draft-fp8, path: ../out/draft-fp8}                           # a draft: baseline = draft
      - {name: moe-mxfp4, path: ../out/moe-mxfp4, baseline: ../examples/tiny/moe-target}
      - {name: pair, path: ../out/draft-fp8, target: ../out/target-q}       # a pair: quantized draft + target
    steps: [check, acceptance, eval, serve]
    check: {platform: gfx950, tp: 1, vllm: auto, max_size_ratio: 1.0, size_tolerance: 0.05}
    acceptance: {min_ratio: 0.98, per_domain_min_ratio: 0.95, min_al: 2.0, use_ci_lower_bound: false,
                 backend: auto, prompts: builtin, num_speculative_tokens: 3, max_new_tokens: 64}
    eval: {tasks: [tiny_french_mc], min_recovery: 0.98, use_lower_bound: false, limit: 100, backend: hf}
    serve: {agreement_level: 0.99, batch_sizes: [1, 8], require_batch_sizes: [1, 8], startup_timeout_s: 600}

Which step applies to which candidate: `check` to all; `acceptance` to drafts (against `draft` with `target`) and
to quantized targets whose baseline is `target` (run as the verifier of `draft`); `eval` to targets; `serve` to
drafts and pairs (a real `vllm serve` of `target`, or the pair's quantized target, with the candidate draft). A pair
(`path` = the quantized draft, `target` = the quantized target it is served with) is checked as a draft against its
own target, and its acceptance compares (its target + its draft) with (`target` + `draft`), with the drafts'
thresholds; list the quantized target as a candidate of its own to check and eval it.

Figures (GateCheck, one per judged figure; see README's gate section):
- check: `check.errors`, `check.quantized_layers`, `check.unexpected_unquantized` (findings weight-not-quantized and
  not-quantized), `check.precision_mismatches` (vllm-load-mismatch), and the release figures against the candidate's
  source (the BF16 draft for a draft or pair, the baseline for a target): `size.ratio` (< max_size_ratio),
  `size.prediction_error` (|measured / apply --dry-run predicted size ratio - 1|, when the output has quantkit.json),
  `tokenizer.drifted_files` (tokenizer files and chat template byte-identical: 0).
- acceptance: `acceptance.ratio` (anomalous when its bootstrap CI lies wholly above 1), `.ratio_ci_low`,
  `.per_domain_ratio.<d>`, `.candidate_al`.
- eval: `eval.<task>.<metric>.recovery` (anomalous when its CI lies wholly above 1: the quantized model beating its
  source), `.recovery_lower_bound`.
- serve, per batch size b: `serve.bs<b>.al_vs_in_process` (|served AL - in-process AL| against the bound that the
  prompts whose counters differ explain, quantkit.acceptance.agreement at agreement_level; beyond it the same
  figure measured two ways disagrees: anomalous; al_tolerance, if set, is a floor under it),
  `serve.bs<b>.acceptance_length` (>= min_al, for the required batch sizes), `serve.bs<b>.malformed_responses` (0).

Verdict (quantkit.gate.verdict.judge over one ReleaseCheck per figure): `pass`; `regression` (a threshold missed);
`anomalous` (better than the baseline beyond the CI, or served vs in-process AL disagree); `infeasible` (a step could
not run, or produced no result). A figure passes when its own judgement is `pass`, so the gate passes exactly when
the verdict is `pass`.
"""

from __future__ import annotations

import math
import os
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from quantkit.acceptance.agreement import al_agreement, describe
from quantkit.errors import QuantkitError
from quantkit.gate.config import GateConfig, GateConfigError, load_gate_config
from quantkit.gate.release import size_ratio_check, tokenizer_drift_check
from quantkit.gate.verdict import ReleaseCheck, acceptance_ratio_check, judge, served_al_check
from quantkit.progress import Progress, or_silent
from quantkit.results import (
    CandidateReport,
    GateCheck,
    GateResult,
    ReleaseFigures,
    ServeReport,
    Verdict,
)
from quantkit.vocab import EAGLE3_DRAFT, ModelKind

# check findings surfaced as figures: layers vLLM would run unquantized though the candidate should not, and layers
# whose loaded precision differs from what the static contract predicts
UNQUANTIZED_CODES = ("weight-not-quantized", "not-quantized")
# served vs in-process AL when the server sends no per-request counters (so no prompt-by-prompt comparison)
FALLBACK_AL_TOLERANCE = 0.05
MISMATCH_CODES = ("vllm-load-mismatch",)


def _release_check(name: str, value: float | None, op: str, threshold: float | None) -> ReleaseCheck:
    """The ReleaseCheck of a plain threshold; a strict "<" is "<=" the next float below (ReleaseCheck has no "<")."""
    if op == "<":
        return ReleaseCheck(name, value, math.nextafter(threshold, -math.inf) if threshold is not None else None, "<=")
    if op not in (">=", "<="):
        raise ValueError(f"op {op!r}")
    return ReleaseCheck(name, value, threshold, ">=" if op == ">=" else "<=")


@dataclass
class Figures:
    """Every judged figure twice: as the report's GateCheck (what is shown) and as the ReleaseCheck it is judged by."""

    checks: list[GateCheck] = field(default_factory=list)
    judged: list[tuple[str, ReleaseCheck]] = field(default_factory=list)  # (candidate, check)

    def add(self, candidate: str, step: str, rc: ReleaseCheck, *, value: float | None = None, op: str | None = None,
            threshold: float | None = None, message: str = "") -> GateCheck:
        """Record `rc`; the GateCheck shows `value op threshold` (default: rc's own) and passes when `judge([rc])`
        is pass. A figure that is not a plain threshold miss says which verdict it gives in its message."""
        j = judge([rc])
        why = j.reasons[0].split(": ", 2)[-1] if j.reasons else ""  # "<verdict>: <name>: why"
        if j.verdict == "anomalous":
            message = f"anomalous: {why}" + (f"; {message}" if message else "")
        elif j.verdict == "infeasible" and not message:
            message = f"infeasible: {why}"
        gc = GateCheck(candidate=candidate, step=step, name=rc.name, value=rc.value if value is None else value,
                       threshold=rc.threshold if threshold is None and op is None else threshold, op=op or rc.op,
                       passed=j.verdict == "pass", message=message)
        self.checks.append(gc)
        self.judged.append((candidate, rc))
        return gc

    def plain(self, candidate: str, step: str, name: str, value: float | None, op: str, threshold: float | None,
              message: str = "") -> GateCheck:
        """A figure against a threshold: regression when missed, infeasible when it has no value."""
        return self.add(candidate, step, _release_check(name, value, op, threshold), value=value, op=op,
                        threshold=threshold, message=message)

    def error(self, candidate: str, step: str, name: str, message: str) -> GateCheck:
        """A step (or figure) that could not run: infeasible."""
        return self.add(candidate, step, ReleaseCheck(name, error=message), message=message)


def _first_line(e: BaseException) -> str:
    msg = str(e).splitlines()[0] if str(e) else type(e).__name__
    if not isinstance(e, QuantkitError):
        msg = f"{type(e).__name__}: {msg}"
        if os.environ.get("QUANTKIT_DEBUG") == "1":
            traceback.print_exc()
    return msg


def _ci(v: Sequence[float | None] | None) -> tuple[float, float] | None:
    if v and len(v) == 2 and all(x is not None and math.isfinite(x) for x in v):
        lo, hi = v
        assert lo is not None and hi is not None
        return (lo, hi)
    return None


def predicted_size_ratio(output: str, source: str, target: str | None) -> float | None:
    """apply --dry-run's predicted output / source bytes, with the recipe the output's quantkit.json records, on
    `source` (the candidate's source as the gate knows it) and `target` (a draft's); None without a quantkit.json."""
    if not (Path(output) / "quantkit.json").is_file():
        return None
    from quantkit.apply.run import apply
    from quantkit.recipes import Recipe
    from quantkit.results import load_manifest

    manifest = load_manifest(output)
    recipe = Recipe.model_validate(manifest.recipe)
    dry = apply(recipe, source, output, target=target if manifest.model_kind == EAGLE3_DRAFT else None,
                dry_run=True, progress=None)
    return dry.size_after_bytes / dry.size_before_bytes if dry.size_before_bytes else None


def release_figures(figs: Figures, cand: str, output: str, source: str | None, target: str | None,
                    cfg: GateConfig) -> ReleaseFigures | None:
    """Size ratio (and its prediction) and tokenizer drift of `output` against `source`, as figures."""
    from quantkit.gate.release import size_ratio, tokenizer_drift

    c = cfg.check
    if source is None:
        why = "no source to compare with: set `draft` (the BF16 draft) in the gate config"
        figs.add(cand, "check", size_ratio_check(None, c.max_size_ratio, error=why), op="<", threshold=c.max_size_ratio)
        figs.add(cand, "check", tokenizer_drift_check(None, error=why))
        return None
    rel = ReleaseFigures(source=source)
    try:
        rel.size_ratio = round(size_ratio(source, output), 6)
        figs.add(cand, "check", size_ratio_check(rel.size_ratio, math.nextafter(c.max_size_ratio, -math.inf)),
                 op="<", threshold=c.max_size_ratio,
                 message="" if rel.size_ratio < c.max_size_ratio else "the output is not smaller than its source")
    except Exception as e:
        figs.add(cand, "check", size_ratio_check(None, c.max_size_ratio, error=_first_line(e)), op="<",
                 threshold=c.max_size_ratio)
    if rel.size_ratio is not None:
        try:
            predicted = predicted_size_ratio(output, source, target)
            if predicted is not None:
                rel.predicted_size_ratio = round(predicted, 6)
                err = abs(rel.size_ratio / predicted - 1)
                figs.plain(cand, "check", "size.prediction_error", round(err, 6), "<=", c.size_tolerance,
                           f"measured {rel.size_ratio:.4f}, apply --dry-run predicts {predicted:.4f}")
        except Exception as e:
            figs.error(cand, "check", "size.prediction_error", f"apply --dry-run prediction: {_first_line(e)}")
    try:
        rel.tokenizer_drift = tokenizer_drift(source, output)
        figs.add(cand, "check", tokenizer_drift_check(rel.tokenizer_drift),
                 message=f"{rel.tokenizer_drift[0]}" if rel.tokenizer_drift else "")
    except Exception as e:
        figs.add(cand, "check", tokenizer_drift_check(None, error=_first_line(e)))
    return rel


def run_gate(config_path: str | Path, progress: Progress | None = None) -> GateResult:
    """Run the configured steps on every candidate, judge every figure, and give the verdict."""
    progress = or_silent(progress)
    t0 = time.perf_counter()
    cfg, base = load_gate_config(config_path)

    def rel(p: str) -> str:
        return str((base / p).resolve())

    target, draft = rel(cfg.target), rel(cfg.draft) if cfg.draft is not None else None
    figs = Figures()
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

    prompts = cfg.acceptance.prompts if cfg.acceptance.prompts == "builtin" else rel(cfg.acceptance.prompts)
    check_sequence_lengths(cfg, config_path, [target] + [rel(c.target) for c in cfg.candidates if c.target])

    for cand in cfg.candidates:
        path = rel(cand.path)
        kind = kinds[cand.name]
        pair_target = rel(cand.target) if cand.target is not None else None
        baseline = (rel(cand.baseline) if cand.baseline is not None else None) or \
            (draft if kind == EAGLE3_DRAFT else target)
        report = CandidateReport(model=path, baseline_model=baseline, model_kind=kind)
        candidates[cand.name] = report

        def add(step: str, name: str, value: float | None, op: str, threshold: float | None, message: str = "",
                cand_name: str = cand.name) -> None:
            figs.plain(cand_name, step, name, value, op, threshold, message)

        def failed_step(step: str, e: BaseException, cand_name: str = cand.name) -> None:
            figs.error(cand_name, step, f"{step}.error", f"step failed: {_first_line(e)}")

        if "check" in cfg.steps:
            progress(f"{cand.name}: check")
            try:
                from quantkit.check.run import run as check_checkpoint

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
                for name, codes in (("check.unexpected_unquantized", UNQUANTIZED_CODES),
                                    ("check.precision_mismatches", MISMATCH_CODES)):
                    found = [f for f in summary.findings if f.code in codes]
                    add("check", name, float(len(found)), "<=", 0.0,
                        f"first: {found[0].code} on {found[0].layer_or_tensor}: {found[0].message}" if found else "")
            except Exception as e:
                failed_step("check", e)
            # the draft's --target for apply's dry-run prediction: the BF16 target it was quantized against
            report.release = release_figures(figs, cand.name, path, baseline, target, cfg)

        wants_acceptance = kind == EAGLE3_DRAFT or (baseline == target and draft is not None)
        if "acceptance" in cfg.steps and wants_acceptance:
            a = cfg.acceptance
            progress(f"{cand.name}: acceptance")
            try:
                from quantkit.acceptance.run import run_acceptance

                assert draft is not None  # load_gate_config requires `draft` when acceptance is a step
                acc = run_acceptance(target, draft, path, prompts=prompts,
                                     num_speculative_tokens=a.num_speculative_tokens, temperature=a.temperature,
                                     max_new_tokens=a.max_new_tokens, backend=a.backend,
                                     candidate_target=pair_target, progress=None)
                report.acceptance = acc
                figs.add(cand.name, "acceptance", acceptance_ratio_check(acc.ratio, _ci(acc.ratio_ci), a.min_ratio))
                if a.use_ci_lower_bound:
                    add("acceptance", "acceptance.ratio_ci_low", acc.ratio_ci[0] if acc.ratio_ci else None, ">=",
                        a.min_ratio)
                if a.per_domain_min_ratio is not None:
                    for d, r in acc.per_domain_ratio.items():
                        add("acceptance", f"acceptance.per_domain_ratio.{d}", r, ">=", a.per_domain_min_ratio)
                if a.min_al is not None:
                    add("acceptance", "acceptance.candidate_al",
                        acc.candidate.mean_acceptance_length if acc.candidate else None, ">=", a.min_al)
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
                    # recovery is candidate / baseline with "higher is better" for every metric (inverted for
                    # lower-is-better ones), so a CI wholly above 1 is the quantized model beating its source
                    figs.add(cand.name, "eval", ReleaseCheck(f"{label}.recovery", t.recovery, e_cfg.min_recovery, ">=",
                                                             _ci(t.recovery_ci95), 1.0),
                             message="" if t.recovery is not None else "no recovery (baseline score 0?)")
                    if e_cfg.use_lower_bound:
                        add("eval", f"{label}.recovery_lower_bound", t.recovery_lower_bound, ">=", e_cfg.min_recovery)
            except Exception as e:
                failed_step("eval", e)

        if "serve" in cfg.steps and kind == EAGLE3_DRAFT:
            progress(f"{cand.name}: serve")
            serve_step(figs, cand.name, report, cfg, served_target=pair_target or target, bf16_target=target,
                       draft_path=path, prompts=prompts, progress=progress)

    # Fail closed: a configured step that produced a result for no candidate is infeasible, not a pass.
    for step in cfg.steps:
        if not any(c.step == step for c in figs.checks):
            figs.error("*", step, f"{step}.result", f"no result: no candidate is one the {step} step applies to")
    for name, report in candidates.items():
        mine = [c for c in figs.checks if c.candidate == name]
        j = judge([rc for c, rc in figs.judged if c == name])
        report.gate = Verdict(passed=j.verdict == "pass", checks=mine)
        report.verdict, report.verdict_reasons = j.verdict, j.reasons
    j = judge([rc for _, rc in figs.judged])
    passed = j.verdict == "pass"
    return GateResult(name=cfg.name, config=str(Path(config_path).resolve()), passed=passed, verdict=j.verdict,
                      reasons=j.reasons, checks=figs.checks, candidates=candidates, seconds=time.perf_counter() - t0)


def check_sequence_lengths(cfg: GateConfig, config_path: str | Path, targets: list[str]) -> None:
    """Before any step runs: the token budgets the config sets (acceptance and serve: new tokens + speculative tokens
    after at least one prompt token) fit every target the steps run, as vLLM derives its length (prompts are checked
    once tokenized, by the steps)."""
    from quantkit.io.checkpoint import resolve_config
    from quantkit.io.config import max_model_len

    a, s = cfg.acceptance, cfg.serve
    k = a.num_speculative_tokens
    budgets = [("acceptance.max_new_tokens", a.max_new_tokens)] if "acceptance" in cfg.steps else []
    if "serve" in cfg.steps:
        budgets.append(("serve.max_new_tokens" if s.max_new_tokens else "acceptance.max_new_tokens (for serve)",
                        s.max_new_tokens or a.max_new_tokens))
    for t in dict.fromkeys(targets) if budgets else ():
        limit = max_model_len(resolve_config(t))
        for key, new in budgets:
            if limit is not None and 1 + new + k > limit.tokens:
                raise GateConfigError(f"gate config {config_path}: {key}: {new} new + {k} speculative tokens after a "
                                      f"prompt do not fit target {t}, which holds {limit}; use at most "
                                      f"{max(limit.tokens - k - 1, 0)}")


def serve_step(figs: Figures, cand: str, report: CandidateReport, cfg: GateConfig, *, served_target: str,
               bf16_target: str, draft_path: str, prompts: str, progress: Progress) -> None:
    """Serve `draft_path` on `served_target` with a real `vllm serve`, measure every batch size, and judge: served AL
    against the in-process AL prompt by prompt (anomalous beyond the bound the differing prompts explain), against
    min_al (required batch sizes), and that every
    response is well-formed. A server that does not come up or dies makes the step infeasible with its one-line
    reason (the last log lines included); the server is always stopped (quantkit.gate.served)."""
    from quantkit.gate import served

    s, a = cfg.serve, cfg.acceptance
    k = a.num_speculative_tokens
    max_new = s.max_new_tokens or a.max_new_tokens
    sr = report.serve = ServeReport(target=served_target, draft=draft_path, num_speculative_tokens=k,
                                    max_tokens=max_new)
    try:
        from quantkit.io.checkpoint import resolve_config
        from quantkit.io.config import fit_max_model_len
        from quantkit.io.config import max_model_len as derived_len

        texts, longest, ids = served.prompt_set(bf16_target, prompts)
        sr.num_prompts = len(texts)
        served_config = resolve_config(served_target)
        limit = derived_len(served_config)
        if limit is not None and longest + max_new + k > limit.tokens:
            raise QuantkitError(f"the longest prompt of {prompts} is {longest} tokens, and with {max_new} new + {k} "
                                  f"speculative tokens it does not fit {served_target}, which holds {limit}; use "
                                  "shorter prompts or fewer new tokens")
        # slack for the chat template and the speculative lookahead, never past what the model holds (vLLM refuses)
        max_model_len = fit_max_model_len(served_config, max(2048, longest + max_new + k + 8))
        ref = served.reusable_acceptance(report.acceptance, k, max_new, prompts)
        if ref is not None:
            sr.in_process_al, sr.in_process_source = ref.mean_acceptance_length, "acceptance"
            sr.in_process_per_prompt = list(ref.per_prompt)
        else:
            progress(f"{cand}: serve: in-process vLLM reference on {len(texts)} prompts")
            sr.in_process_per_prompt = served.in_process_run(served_target, draft_path, texts, ids, k, max_new,
                                                             max_model_len)
            sr.in_process_al, sr.in_process_source = served.mean_al(sr.in_process_per_prompt), "vllm"
        progress(f"{cand}: serve: vllm serve {Path(served_target).name} + {Path(draft_path).name}, batch sizes "
                 f"{s.batch_sizes}")
        served.measure_served(sr, texts, s.batch_sizes, max_model_len=max_model_len,
                              startup_timeout_s=s.startup_timeout_s, request_timeout_s=s.request_timeout_s,
                              fast_start=s.fast_start, progress=lambda m: progress(f"{cand}: serve: {m}"), ids=ids)
    except Exception as e:
        sr.error = _first_line(e)
        figs.error(cand, "serve", "serve.error", f"step failed: {sr.error}")
        return
    min_al = s.min_al if s.min_al is not None else a.min_al
    required = s.require_batch_sizes if s.require_batch_sizes is not None else s.batch_sizes
    ref_al = sr.in_process_al
    for b in sr.batches:
        al = b.mean_acceptance_length
        diff = abs(al - ref_al) if al is not None and ref_al is not None else None
        name = f"serve.bs{b.batch_size}.al_vs_in_process"
        comparable = (b.per_prompt and len(b.per_prompt) == len(sr.in_process_per_prompt)
                      and [p.id for p in b.per_prompt] == [p.id for p in sr.in_process_per_prompt])
        if comparable:
            b.agreement = al_agreement(b.per_prompt, sr.in_process_per_prompt, level=s.agreement_level)
            agree = replace(served_al_check(al, ref_al, s.al_tolerance, agreement_p=b.agreement.p_value,
                                            agreement_level=b.agreement.level), name=name)
            threshold = b.agreement.bound if s.al_tolerance is None else max(b.agreement.bound, s.al_tolerance)
            how = describe(b.agreement)
        else:  # no per-request counters from the server: only a fixed tolerance can be applied
            tolerance = s.al_tolerance if s.al_tolerance is not None else FALLBACK_AL_TOLERANCE
            agree = replace(served_al_check(al, ref_al, tolerance), name=name)
            threshold, how = tolerance, "no per-request counters from the server: fixed tolerance"
        figs.add(cand, "serve", agree, value=diff, op="<=", threshold=threshold,
                 message=f"served AL {'-' if al is None else f'{al:.4f}'}, in-process "
                         f"{'-' if ref_al is None else f'{ref_al:.4f}'} ({sr.in_process_source}); {how}")
        if min_al is not None and b.batch_size in required:
            figs.plain(cand, "serve", f"serve.bs{b.batch_size}.acceptance_length", al, ">=", min_al)
        figs.plain(cand, "serve", f"serve.bs{b.batch_size}.malformed_responses", float(b.malformed_responses), "<=",
                   0.0, b.problems[0] if b.problems else "")
