"""`quantkit inspect`: the precision vLLM will give every layer of a checkpoint, and why, from headers and config only.

Reads config.json and the safetensors headers (quantkit.io.headers), never tensor data, and imports neither torch nor
Quark nor vLLM. The per-layer resolution is quantkit.naming.precision (the single replay of vLLM's Quark loader);
this module groups its layers and sums their sizes.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from quantkit.naming.precision import (
    PLACEHOLDER,
    REQUIRED_KEYS,
    LoadedCheckpoint,
    load_checkpoint,
    modules_of,
    resolve_layers,
    tensor_bytes,
)
from quantkit.results.check import InspectResult
from quantkit.results.cost import DraftCost
from quantkit.results.kernels import KernelReport
from quantkit.results.precision import LayerPrecision, PrecisionGroup
from quantkit.vocab import EAGLE3_DRAFT

_LAYER_NUM = re.compile(r"(?<=\.layers\.)(\d+)(?=\.)")


# --- grouping --------------------------------------------------------------------------------------------------


def _ranges(numbers: Sequence[int]) -> str:
    nums = sorted(set(numbers))
    parts: list[str] = []
    start = prev = nums[0]
    for n in nums[1:] + [None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return "{" + ",".join(parts) + "}"


def group_layers(layers: Sequence[LayerPrecision]) -> list[PrecisionGroup]:
    """Collapse decoder-layer numbers: same suffix, precision, source and (number-free) reason -> one group."""
    groups: dict[tuple[str, str, str, str, int | None], list[LayerPrecision]] = {}
    for layer in layers:
        key = (
            _LAYER_NUM.sub(PLACEHOLDER, layer.name),
            layer.precision,
            layer.source,
            _LAYER_NUM.sub(PLACEHOLDER, layer.reason),
            layer.experts,
        )
        groups.setdefault(key, []).append(layer)
    out = []
    for (pattern, precision, source, reason, experts), members in groups.items():
        nums = [int(m) for layer in members for m in _LAYER_NUM.findall(layer.name)[:1]]
        if len(members) > 1 and len(nums) == len(members):
            pattern = _LAYER_NUM.sub(_ranges(nums), members[0].name, count=1)
        else:
            pattern, reason = members[0].name, members[0].reason if len(members) == 1 else reason
        out.append(
            PrecisionGroup(
                pattern=pattern,
                count=len(members),
                precision=precision,
                source=source,
                reason=reason,
                bytes=sum(m.bytes for m in members),
                experts=experts,
            )
        )
    return out


# --- entry point -----------------------------------------------------------------------------------------------


def inspect_checkpoint(
    folder: str | Path,
    target_num_layers: int | None = None,
    platform: str | None = None,
    tp: int = 1,
    vllm_version: str | None = None,
) -> InspectResult:
    """Every runtime layer of the checkpoint in `folder` with the precision vLLM will give it, and why.

    For an EAGLE-3 draft, `target_num_layers` (the target's num_hidden_layers) gives its decoder layers their vLLM
    names; without it they are shown as `model.layers.{N}.*` (exclude entries naming a number will not match them).
    With `platform`, `kernels` says which vLLM kernel every MoE and linear layer takes there at TP `tp`
    (quantkit.rules.kernels, replaying vLLM 0.32's selection).
    """
    t0 = time.perf_counter()
    ck = load_checkpoint(folder, target_num_layers)
    modules = modules_of(ck.tensors)
    resolved, problems = resolve_layers(ck.config, ck.qc, ck.layers, modules)
    if ck.qc is not None:
        problems = [f"quantization_config has no {k!r}" for k in REQUIRED_KEYS if k not in ck.qc] + problems
    by_precision: dict[str, int] = {}
    for layer in resolved:
        by_precision[layer.precision] = by_precision.get(layer.precision, 0) + layer.bytes
    total = sum(tensor_bytes(i) for i in ck.tensors.values())
    in_layers = sum(layer.bytes for layer in resolved)
    quant = None
    if ck.qc is not None:
        lqc = ck.qc.get("layer_quant_config")
        quant = {
            "quant_method": ck.qc.get("quant_method"),
            "exclude": ck.qc.get("exclude"),
            "keys": sorted(ck.qc),
            "layer_quant_config_keys": len(lqc) if isinstance(lqc, dict) else 0,
        }
    kernels = _kernels(ck, platform, tp, vllm_version)
    return InspectResult(
        path=str(ck.path), architecture=ck.architecture, model_kind=ck.model_kind,
        target_num_layers=ck.target_num_layers, quantization=quant, layers=resolved, groups=group_layers(resolved),
        bytes_by_precision=by_precision, other_bytes=total - in_layers, total_bytes=total,
        num_tensors=len(ck.tensors), config_problems=problems, seconds=time.perf_counter() - t0,
        source_format=_source_format(ck), kernels=kernels, draft_cost=draft_step_cost(ck.model_kind, resolved, kernels),
    )  # fmt: skip


def draft_step_cost(kind: str, layers: list[Any], kernels: KernelReport | None) -> DraftCost | None:
    """A draft's step cost by role, as stored and after fp8-draft (quantkit.rules.cost); None for a target. inspect
    and check both report it."""
    if kind != EAGLE3_DRAFT:
        return None
    from quantkit.recipes import load_recipe
    from quantkit.rules.cost import draft_cost, kernel_paths_by_layer

    return draft_cost(layers, kernel_paths_by_layer(kernels, layers) if kernels else None, load_recipe("fp8-draft"))


def _kernels(ck: LoadedCheckpoint, platform: str | None, tp: int, vllm_version: str | None) -> KernelReport | None:
    if platform is None:
        return None
    from quantkit.rules.kernels import report_for
    from quantkit.rules.rule import CheckpointView, ServingOptions
    from quantkit.rules.vllm_versions import resolve_vllm_version

    serving = ServingOptions(platform=platform, tp=tp, vllm_version=resolve_vllm_version(vllm_version))
    return report_for(CheckpointView.of(ck), serving)


def _source_format(ck: LoadedCheckpoint) -> str:
    """The source format `apply` would decode (bf16, fp8-block, int4-pack-quantized), or why it cannot."""
    from quantkit.errors import QuantkitError
    from quantkit.io.formats import detect_format
    from quantkit.naming.archs import fused_layouts

    if ck.qc is not None and ck.qc.get("quant_method") == "quark":
        return "quark (already quantized by Quark)"
    try:
        return detect_format(
            ck.config, ck.tensors, source=str(ck.path / "config.json"), fused=fused_layouts(ck.config)
        ).description
    except QuantkitError as e:
        return f"not decodable: {e}"
