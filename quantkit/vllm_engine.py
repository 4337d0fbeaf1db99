"""Starting vLLM engines (target alone or target + EAGLE-3 draft) and reading their spec-decode counters.

vLLM is an optional extra; nothing here imports it at module level. On CPU (vllm-cpu) the engine runs
in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0: ~4 s start instead of ~55 s) with a 1 GiB KV cache
(VLLM_CPU_KVCACHE_SPACE=1; the default reserves ~14 GiB). Callers must run under `if __name__ == "__main__":`
when vLLM spawns workers.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

from quantkit.errors import QuantkitError


class VllmUnavailableError(QuantkitError):
    """vLLM is not installed."""


def vllm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def _set_cpu_defaults() -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def make_llm(target: str, draft: str | None = None, num_speculative_tokens: int = 3,
             max_model_len: int = 2048, seed: int = 0, **kwargs: Any):
    """An in-process vLLM `LLM` for `target`, with `draft` attached as its EAGLE-3 speculator if given."""
    if not vllm_available():
        raise VllmUnavailableError("vLLM is not installed; install the extra: pip install -e '.[vllm]'")
    _set_cpu_defaults()
    from vllm import LLM

    spec = None
    if draft is not None:
        spec = {"method": "eagle3", "model": str(draft), "num_speculative_tokens": num_speculative_tokens}
    return LLM(model=str(target), speculative_config=spec, max_model_len=max_model_len, seed=seed,
               disable_log_stats=False, enforce_eager=True, **kwargs)


@dataclass
class SpecDecodeCounters:
    """vLLM's cumulative spec-decode counters (vllm/v1/spec_decode/metrics.py)."""

    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    accepted_per_pos: list[int] = field(default_factory=list)

    @property
    def mean_acceptance_length(self) -> float:
        """AL = 1 + accepted / drafts: tokens produced per target forward pass."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else float("nan")

    def minus(self, before: "SpecDecodeCounters") -> "SpecDecodeCounters":
        """Counters accumulated since `before` (vLLM's are cumulative over the engine's life)."""
        return SpecDecodeCounters(
            self.num_drafts - before.num_drafts,
            self.num_draft_tokens - before.num_draft_tokens,
            self.num_accepted_tokens - before.num_accepted_tokens,
            [a - b for a, b in zip(self.accepted_per_pos, before.accepted_per_pos or [0] * len(self.accepted_per_pos))],
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "mean_acceptance_length": self.mean_acceptance_length}


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
