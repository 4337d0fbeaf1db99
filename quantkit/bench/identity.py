"""What a bench figure was measured on: the hardware, the vLLM version, and what the server reported choosing."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from quantkit.results.bench import BenchIdentity
from quantkit.results.cost import DraftStepEstimate

RANDOM_LABEL = "random data: AL not representative"
NOT_PARSED = "not parsed: no server log was read"


def cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def gpus() -> tuple[str | None, int]:
    """(name, count) of the visible GPUs through torch (ROCm builds report through torch.cuda too); (None, 0)."""
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.device_count():
            return torch.cuda.get_device_name(0), torch.cuda.device_count()
    except Exception:  # a broken driver is not the bench's to diagnose
        pass
    return None, 0


def identity(
    *,
    tp: int,
    kv_cache_dtype: str,
    max_num_seqs: int,
    sampling: dict[str, float | int | None],
    dataset: str,
    dataset_revision: str | None,
    workload: str,
    fast_start: bool,
) -> BenchIdentity:
    from quantkit.engines.platform import installed_vllm

    vllm = installed_vllm()
    name, count = gpus()
    cpu, cores = cpu_model(), cpu_cores()
    if vllm is not None and vllm.device == "cpu":
        name, count = None, 0
    hardware = f"{count} x {name}" if name else f"{cpu or 'unknown CPU'} ({cores} cores)"
    platform = "cpu" if not name else "gfx950" if "MI355" in name else "gfx942" if "MI300" in name else "cuda"
    return BenchIdentity(
        hardware=hardware,
        cpu_model=cpu,
        cpu_cores=cores,
        gpu_name=name,
        gpu_count=count,
        platform=platform,
        tensor_parallel_size=tp,
        vllm_version=f"{vllm.distribution} {vllm.version}" if vllm else None,
        backends=None,
        backends_reason=NOT_PARSED,
        kv_cache_dtype=kv_cache_dtype,
        max_num_seqs=max_num_seqs,
        sampling=sampling,
        dataset=dataset,
        dataset_revision=dataset_revision,
        workload=workload,
        workload_label=RANDOM_LABEL if workload.startswith("random") else "",
        fast_start=fast_start,
    )


def draft_costs(
    drafts: Iterable[str | None], gpu_name: str | None, tp: int, ks: Iterable[int], warnings: list[str]
) -> list[DraftStepEstimate]:
    """The bench report's cost section: each local EAGLE-3 draft's step by role (quantkit.check.inspect, headers
    only) and its time on the bench's GPU, or on the default platform named as such (quantkit.rules.cost). A folder
    that cannot be inspected gets a warning, never a failed bench: the estimate is beside the measurement."""
    from quantkit.check.inspect import inspect_checkpoint
    from quantkit.errors import QuantkitError
    from quantkit.rules.cost import platform_for, step_estimate

    platform, reason = platform_for(gpu_name)
    out: list[DraftStepEstimate] = []
    for draft in dict.fromkeys(d for d in drafts if d):
        if not Path(draft).is_dir():
            continue  # a served model's name (an endpoint arm): no headers here to read
        try:
            cost: Any = inspect_checkpoint(draft).draft_cost
        except QuantkitError as e:
            warnings.append(f"{draft}: no draft-step estimate ({str(e).splitlines()[0] if str(e) else e})")
            continue
        if cost is not None:
            out.append(step_estimate(draft, cost, platform, ks, tp, reason))
    return out
