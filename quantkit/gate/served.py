"""The gate's serve step: a real `vllm serve` of a draft candidate on its target (quantkit.deploy.serve), measured at
each batch size on the acceptance prompts, and the in-process vLLM AL of the same pair on the same prompts to judge
it against.

The prompts are the acceptance step's own texts: its prompt set rendered with the (BF16) target's chat template, sent
raw to the completions endpoint, greedy, `max_new_tokens` each. The in-process reference is the acceptance step's
candidate run when that ran in vLLM with the same K, token budget and temperature 0 (the same pair, prompts and
settings), else `quantkit.acceptance.vllm_backend.run_vllm` run here with those settings. Both sides keep their
per-prompt counters and a digest of each prompt's tokens (the server's from its per-request spec-decode metrics,
quantkit.deploy.serve), and the served AL is judged against the in-process one prompt by prompt
(quantkit.acceptance.agreement): greedy decoding of the same pair gives the same tokens and counters except where a
near-tie flips a token under another batch composition, which moves a few prompts either way; a systematic
difference (another draft, K or dtype behind the server) moves them all and is anomalous. Measured on the bundled
pair (AVX2 host): served and in-process AL equal at batch 1 and 8, every prompt with the same tokens and counters.

One server per candidate, measured at every batch size in turn (vLLM's spec-decode counters are read before and after
each measurement). The server is stopped whatever happens: VllmServer is a context manager whose exit stops its whole
process group (also on Ctrl-C, and on SIGTERM through the CLI's handler, which raises KeyboardInterrupt).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from quantkit.acceptance.agreement import output_digest
from quantkit.progress import Progress, or_silent
from quantkit.results import AcceptanceResult, DraftAcceptance, PromptAcceptance, ServedBatch, ServeReport

if TYPE_CHECKING:
    from quantkit.engines.serve_client import ServedResult

MAX_PROBLEMS = 5  # malformed responses kept in the report per batch size


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


def reusable_acceptance(acc: AcceptanceResult | None, k: int, max_new_tokens: int,
                        prompts: str) -> DraftAcceptance | None:
    """The acceptance step's in-process candidate run when it measured exactly what the server is sent (vLLM
    backend, the same K, token budget, prompt set, greedy, no extra context lengths), else None."""
    if acc is None or acc.backend != "vllm" or acc.candidate is None:
        return None
    s = acc.settings
    same = (s.num_speculative_tokens == k and s.max_new_tokens == max_new_tokens and s.temperature == 0
            and s.prompts == str(prompts))
    return acc.candidate if same else None


def in_process_run(target: str, draft: str, texts: list[str], ids: list[tuple[str, str]], k: int,
                   max_new_tokens: int, max_model_len: int) -> list[PromptAcceptance]:
    """Per-prompt counters of `draft` on `target` over `texts` in an in-process vLLM engine, greedy."""
    from quantkit.engines.vllm_engine import run_spec_decode as run_vllm

    stats = run_vllm(target, draft, texts, k, max_new_tokens, 0.0, max_model_len=max_model_len)
    return [PromptAcceptance(id=i, domain=d, num_drafts=s.num_drafts, num_accepted=s.num_accepted,
                             generated_tokens=len(s.output_ids), output_digest=output_digest(s.output_ids))
            for (i, d), s in zip(ids, stats)]


def mean_al(per_prompt: list[PromptAcceptance]) -> float | None:
    """vLLM's AL over prompts: 1 + accepted / drafts (None when nothing was drafted)."""
    drafts = sum(p.num_drafts for p in per_prompt)
    return 1 + sum(p.num_accepted for p in per_prompt) / drafts if drafts else None


def served_batch(res: ServedResult, ids: list[tuple[str, str]] | None = None) -> ServedBatch:
    """results.ServedBatch from a quantkit.deploy.serve.ServedResult (its per-request detail left out, except each
    request's counters and token digest as `per_prompt` when the server sent them and `ids` names the prompts)."""
    spec = res.spec
    per_prompt = []
    if ids is not None and len(ids) == len(res.requests) and all(r.num_drafts is not None for r in res.requests):
        per_prompt = [PromptAcceptance(id=i, domain=d, num_drafts=r.num_drafts or 0, num_accepted=r.num_accepted or 0,
                                       generated_tokens=len(r.token_ids), output_digest=output_digest(r.token_ids))
                      for (i, d), r in zip(ids, sorted(res.requests, key=lambda r: r.index))]
        totals = (sum(q.num_drafts for q in per_prompt), sum(q.num_accepted for q in per_prompt))
        if spec is not None and totals != (spec.num_drafts, spec.num_accepted_tokens):
            per_prompt = []  # per-request figures that do not add up to the server's counters are not used
    return ServedBatch(
        batch_size=res.batch_size, num_requests=len(res.requests), mean_acceptance_length=res.mean_acceptance_length,
        num_drafts=spec.num_drafts if spec else None, num_draft_tokens=spec.num_draft_tokens if spec else None,
        num_accepted=spec.num_accepted_tokens if spec else None, accepted_per_pos=spec.accepted_per_pos if spec else [],
        completion_tokens=res.completion_tokens, tokens_per_s=round(res.tokens_per_s, 2), ttft_s=res.ttft_s,
        tpot_s=res.tpot_s, wall_s=round(res.wall_s, 3), well_formed=res.ok,
        malformed_responses=sum(1 for r in res.requests if r.problems), problems=res.problems[:MAX_PROBLEMS],
        per_prompt=per_prompt)


def measure_served(report: ServeReport, texts: list[str], batch_sizes: list[int], *, max_model_len: int,
                   startup_timeout_s: float, request_timeout_s: float, fast_start: bool,
                   progress: Progress | None = None, ids: list[tuple[str, str]] | None = None) -> None:
    """Start one `vllm serve` for report.target + report.draft, measure every batch size into report.batches, stop
    it. Raises quantkit.deploy.serve.ServeError (one line, with the server's last log lines) when the server does not
    come up, dies, or refuses a request; the batches measured before that stay in the report."""
    from quantkit.engines.serve_client import measure
    from quantkit.engines.vllm_server import VllmServer

    progress = or_silent(progress)
    assert report.num_speculative_tokens is not None and report.max_tokens is not None
    with VllmServer(report.target, report.draft, report.num_speculative_tokens, max_model_len=max_model_len,
                    startup_timeout_s=startup_timeout_s, fast_start=fast_start, progress=progress) as server:
        report.startup_s = round(server.startup_s or 0.0, 2)
        report.command = list(server.command)
        for b in batch_sizes:
            res = measure(server, texts, max_tokens=report.max_tokens, batch_size=b,
                          request_timeout_s=request_timeout_s)
            batch = served_batch(res, ids)
            report.batches.append(batch)
            al = batch.mean_acceptance_length
            progress(f"batch {b}: served AL {'-' if al is None else f'{al:.4f}'}, {batch.tokens_per_s} tok/s, TTFT p50 "
                     f"{1000 * (batch.ttft_s.get('p50') or 0):.0f} ms, "
                     f"{'well-formed' if batch.well_formed else 'MALFORMED'}")
