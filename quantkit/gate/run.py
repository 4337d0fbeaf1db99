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
- bench, per concurrency C (quantkit.gate.steps.bench): `bench.c<C>.<arm>.failed_requests` (0), `bench.c<C>.speedup`
  (>= min_speedup), `bench.c<C>.vs_bf16_draft` (>= 1 - vs_bf16_draft_tolerance), `bench.crossover` (>= min_crossover);
  the speed figures are hardware_dependent (reported, not gated) unless runner_is_deployment_hardware.

Each step is a small object in quantkit.gate.steps (`STEPS`); this module runs them, candidate by candidate, in
the registry's order, and judges their figures. Verdict (quantkit.gate.verdict.judge over the figures, each judged
when it was built): `pass`; `regression` (a threshold missed);
`anomalous` (better than the baseline beyond the CI, or served vs in-process AL disagree); `infeasible` (a step could
not run, or produced no result). A figure passes when its own judgement is `pass`, so the gate passes exactly when
the verdict is `pass`.
"""

from __future__ import annotations

import time
from pathlib import Path

from quantkit.gate.config import GateConfig, GateConfigError, load_gate_config
from quantkit.gate.steps import STEPS, GateContext, resolve_candidates
from quantkit.gate.verdict import first_line, infeasible, judge
from quantkit.progress import Progress, or_silent
from quantkit.results import CandidateReport, GateCheck, GateResult, Verdict


def run(config_path: str | Path, progress: Progress | None = None) -> GateResult:
    """Run the configured steps on every candidate, judge every figure, and give the verdict."""
    progress = or_silent(progress)
    t0 = time.perf_counter()
    cfg, base = load_gate_config(config_path)
    cands = resolve_candidates(cfg, base, config_path)  # before any step runs: a bad pair is a config error
    prompts = cfg.acceptance.prompts
    ctx = GateContext(
        config=cfg,
        target=str((base / cfg.target).resolve()),
        draft=str((base / cfg.draft).resolve()) if cfg.draft is not None else None,
        prompts=prompts
        if prompts == "builtin" or prompts.startswith("speed-bench:")
        else str((base / prompts).resolve()),
        progress=progress,
        base=base,
        deploy_manifest=(
            str((base / cfg.serve.deploy_manifest).resolve()) if cfg.serve.deploy_manifest is not None else None
        ),
    )
    check_sequence_lengths(cfg, config_path, [ctx.target] + [c.pair_target for c in cands if c.pair_target])

    figures: list[GateCheck] = []
    reports: dict[str, CandidateReport] = {}
    for cand in cands:
        report = reports[cand.name] = CandidateReport(
            model=cand.path, baseline_model=cand.baseline, model_kind=cand.kind
        )
        for name, step in STEPS.items():
            if name not in cfg.steps or not step.applies_to(cand, ctx):
                continue
            progress(f"{cand.name}: {name}")
            try:
                figures += step.run(cand, report, ctx)
            except Exception as e:
                figures.append(infeasible(cand.name, name, f"{name}.error", f"step failed: {first_line(e)}"))

    # Fail closed: a configured step that produced a result for no candidate is infeasible, not a pass.
    for name in cfg.steps:
        if not any(c.step == name for c in figures):
            figures.append(
                infeasible("*", name, f"{name}.result", f"no result: no candidate is one the {name} step applies to")
            )
    for cand_name, report in reports.items():
        mine = [c for c in figures if c.candidate == cand_name]
        j = judge(mine)
        report.gate = Verdict(passed=j.verdict == "pass", checks=mine)
        report.verdict, report.verdict_reasons = j.verdict, j.reasons
    j = judge(figures)
    return GateResult(
        name=cfg.name,
        config=str(Path(config_path).resolve()),
        passed=j.verdict == "pass",
        verdict=j.verdict,
        reasons=j.reasons,
        checks=figures,
        candidates=reports,
        seconds=time.perf_counter() - t0,
    )


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
        budgets.append(
            (
                "serve.max_new_tokens" if s.max_new_tokens else "acceptance.max_new_tokens (for serve)",
                s.max_new_tokens or a.max_new_tokens,
            )
        )
    for t in dict.fromkeys(targets) if budgets else ():
        limit = max_model_len(resolve_config(t))
        for key, new in budgets:
            if limit is not None and 1 + new + k > limit.tokens:
                raise GateConfigError(
                    f"gate config {config_path}: {key}: {new} new + {k} speculative tokens after a "
                    f"prompt do not fit target {t}, which holds {limit}; use at most "
                    f"{max(limit.tokens - k - 1, 0)}"
                )
