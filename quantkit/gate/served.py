"""The gate's serve step: a real `vllm serve` of a draft candidate on its target (quantkit.deploy.serve), measured at
each batch size on the acceptance prompts, and the in-process vLLM AL of the same pair on the same prompts to judge
it against.

The prompts are the acceptance step's own texts: its prompt set rendered with the (BF16) target's chat template, sent
raw to the completions endpoint, greedy, `max_new_tokens` each. The in-process reference is the acceptance step's
candidate run when that ran in vLLM with the same K, token budget and temperature 0 (the same pair, prompts and
settings), else `quantkit.acceptance.vllm_backend.run_vllm` run here with those settings. Greedy decoding with the
same engine settings gives the same tokens, so the served and in-process ALs agree to rounding (measured on the
bundled pair: 3.6455 at batch 1, at batch 8 and in-process); `al_tolerance` allows a prompt or two to flip a token.

One server per candidate, measured at every batch size in turn (vLLM's spec-decode counters are read before and after
each measurement). The server is stopped whatever happens: VllmServer is a context manager whose exit stops its whole
process group (also on Ctrl-C, and on SIGTERM through the CLI's handler, which raises KeyboardInterrupt).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from quantkit.progress import Progress, or_silent
from quantkit.results import AcceptanceResult, ServedBatch, ServeReport

if TYPE_CHECKING:
    from quantkit.deploy.serve import ServedResult

MAX_PROBLEMS = 5  # malformed responses kept in the report per batch size


def prompt_texts(target: str | Path, prompts: str | Path) -> tuple[list[str], int]:
    """The acceptance step's texts (its prompt set with the target's chat template) and the longest one in tokens."""
    from quantkit.io.hf import load_tokenizer
    from quantkit.io.prompts import load_prompts

    tokenizer = load_tokenizer(target)
    texts = [r.render(tokenizer) for r in load_prompts(prompts)]
    longest = max(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)
    return texts, longest


def reusable_acceptance(acc: AcceptanceResult | None, k: int, max_new_tokens: int, prompts: str) -> float | None:
    """The acceptance step's in-process candidate AL when it measured exactly what the server is sent (vLLM backend,
    the same K, token budget, prompt set, greedy, no extra context lengths), else None."""
    if acc is None or acc.backend != "vllm" or acc.candidate is None:
        return None
    s = acc.settings
    same = (s.num_speculative_tokens == k and s.max_new_tokens == max_new_tokens and s.temperature == 0
            and s.prompts == str(prompts))
    return acc.candidate.mean_acceptance_length if same else None


def in_process_al(target: str, draft: str, texts: list[str], k: int, max_new_tokens: int,
                  max_model_len: int) -> float | None:
    """AL of `draft` on `target` over `texts` in an in-process vLLM engine, greedy (None when nothing was drafted)."""
    from quantkit.acceptance.vllm_backend import run_vllm

    stats = run_vllm(target, draft, texts, k, max_new_tokens, 0.0, max_model_len=max_model_len)
    drafts = sum(s.num_drafts for s in stats)
    return 1 + sum(s.num_accepted for s in stats) / drafts if drafts else None


def served_batch(res: ServedResult) -> ServedBatch:
    """results.ServedBatch from a quantkit.deploy.serve.ServedResult (its per-request detail left out)."""
    spec = res.spec
    return ServedBatch(
        batch_size=res.batch_size, num_requests=len(res.requests), mean_acceptance_length=res.mean_acceptance_length,
        num_drafts=spec.num_drafts if spec else None, num_draft_tokens=spec.num_draft_tokens if spec else None,
        num_accepted=spec.num_accepted_tokens if spec else None, accepted_per_pos=spec.accepted_per_pos if spec else [],
        completion_tokens=res.completion_tokens, tokens_per_s=round(res.tokens_per_s, 2), ttft_s=res.ttft_s,
        tpot_s=res.tpot_s, wall_s=round(res.wall_s, 3), well_formed=res.ok,
        malformed_responses=sum(1 for r in res.requests if r.problems), problems=res.problems[:MAX_PROBLEMS])


def measure_served(report: ServeReport, texts: list[str], batch_sizes: list[int], *, max_model_len: int,
                   startup_timeout_s: float, request_timeout_s: float, fast_start: bool,
                   progress: Progress | None = None) -> None:
    """Start one `vllm serve` for report.target + report.draft, measure every batch size into report.batches, stop
    it. Raises quantkit.deploy.serve.ServeError (one line, with the server's last log lines) when the server does not
    come up, dies, or refuses a request; the batches measured before that stay in the report."""
    from quantkit.deploy.serve import VllmServer, measure

    progress = or_silent(progress)
    assert report.num_speculative_tokens is not None and report.max_tokens is not None
    with VllmServer(report.target, report.draft, report.num_speculative_tokens, max_model_len=max_model_len,
                    startup_timeout_s=startup_timeout_s, fast_start=fast_start, progress=progress) as server:
        report.startup_s = round(server.startup_s or 0.0, 2)
        report.command = list(server.command)
        for b in batch_sizes:
            res = measure(server, texts, max_tokens=report.max_tokens, batch_size=b,
                          request_timeout_s=request_timeout_s)
            batch = served_batch(res)
            report.batches.append(batch)
            al = batch.mean_acceptance_length
            progress(f"batch {b}: served AL {'-' if al is None else f'{al:.4f}'}, {batch.tokens_per_s} tok/s, TTFT p50 "
                     f"{1000 * (batch.ttft_s.get('p50') or 0):.0f} ms, "
                     f"{'well-formed' if batch.well_formed else 'MALFORMED'}")
