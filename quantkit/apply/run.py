"""`quantkit apply`: quantize a checkpoint as a recipe says, with an `exclude` list vLLM really honours.

Flow: plan (headers only: every layer mapped to vLLM's runtime name, a decision per layer, the vLLM exclude list,
the path, the engine and the devices) -> quantize into a temporary folder beside the output -> rewrite
`quantization_config` with vLLM's runtime names -> verify the written tensors against the plan and the source ->
write quantkit.json -> rename the finished folder into place.

Engines: `native` is quantkit's shard executor (quantkit.apply.shards: MXFP4 and PTPC-FP8, byte-identical to Quark
0.13's file-to-file path, no Quark import, parallel over devices, resumable); `quark` runs Quark itself, in memory
(ModelQuantizer: calibrated schemes) or per shard (direct_quantize_checkpoint). `auto` takes native whenever it
can. Per shard is the default path for every recipe without static activation scales.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import sys
import time
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Mapping
from itertools import chain, repeat
from operator import add, itemgetter
from pathlib import Path
from typing import Any

from quantkit.apply.output import (
    refuse_non_finite,
    restore_kept_tensors,
    verify_output,
    write_final_files,
)
from quantkit.apply.plan import (
    ApplyError,
    ApplyPlan,
    ApplyVerificationError,
    draft_runtime_name,
    plan_layers,
    quark_exclusions,
    unmatched_patterns,
    vllm_exclude,
)
from quantkit.io import jsonout
from quantkit.io.checkpoint import (
    RESUMABLE_MARKER,
    SourceCheckpoint,
    atomic_output,
    check_output_free,
    resolve_source,
    sha256_file,
    target_layer_count,
    written_files,
)
from quantkit.io.files import describe_not_copied, not_copied, scan_folder
from quantkit.io.headers import INDEX_FILE, paused_gc, read_config, unindexed_weight_files
from quantkit.io.sizes import parse_shard_size, parse_size  # noqa: F401  (re-exported: api.py, tests)
from quantkit.naming.archs import model_kind
from quantkit.naming.builder import CheckpointModules
from quantkit.naming.drafts import DraftInfo, draft_info
from quantkit.naming.layers import UNKNOWN_TARGET_LAYERS
from quantkit.progress import Progress, or_silent
from quantkit.recipes import Recipe, load_recipe
from quantkit.results import ApplyResult, LayerDecision, ShardSummary
from quantkit.schemes import SCHEMES, native_schemes
from quantkit.versions import versions
from quantkit.vocab import EAGLE3_DRAFT

_DTYPE, _SHAPE, _DTYPE_SHAPE = itemgetter(1), itemgetter(2), itemgetter(1, 2)  # of a TensorInfo
ENGINES = ("auto", "native", "quark")
PATHS = ("auto", "in-memory", "per-shard")


DEVICE = re.compile(r"cuda:[0-9]{1,4}")


def device_spec(devices: str | list[str] | None) -> list[str]:
    """The device names asked for, checked for syntax only (no torch import): [] for auto, ["cuda"], or names."""
    spec = devices if isinstance(devices, list) else [d.strip() for d in str(devices or "auto").split(",") if d.strip()]
    if spec in (["auto"], ["cuda"], []):
        return [] if spec == ["auto"] else spec
    for d in spec:
        # ASCII digits only: str.isdigit() also takes '²' and '٣', which int() then refuses or reads as 3
        if d != "cpu" and not DEVICE.fullmatch(d):
            shown = ",".join(spec)[:80]
            raise ApplyError(
                f"--devices {shown!r}: {d[:20]!r} is not a device; use auto, cpu, cuda or cuda:N,... "
                "(N a GPU index such as 0)"
            )
    if len(set(spec)) != len(spec):
        raise ApplyError(f"--devices {','.join(spec)}: a device is named twice")
    return spec


# The device files a GPU driver gives a Linux process, one of which CUDA (libcuda opens /dev/nvidiactl; WSL 2 has
# /dev/dxg instead) or ROCm (HIP opens /dev/kfd) needs before torch can count a GPU; containers get them mounted.
GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/dxg", "/dev/kfd")


def no_gpu_device_nodes() -> bool:
    """True on a Linux host without any of GPU_DEVICE_NODES, where torch.cuda sees no GPU (CUDA or ROCm); False
    elsewhere, where only torch can tell."""
    return sys.platform.startswith("linux") and not any(map(os.path.exists, GPU_DEVICE_NODES))


def resolve_devices(devices: str | list[str] | None) -> list[str]:
    """`auto` (every visible GPU, else the CPU), `cpu`, `cuda` (every visible GPU) or a list `cuda:0,cuda:1`."""
    spec = device_spec(devices)
    if spec == [] and no_gpu_device_nodes():
        return ["cpu"]  # auto on a host where no GPU can be visible: known without importing torch (1-2 s)
    if spec in (["cuda"], []):
        import torch

        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if spec == ["cuda"] and n == 0:
            raise ApplyError("--devices cuda: no CUDA/ROCm GPU visible to torch; use --devices cpu or auto")
        return [f"cuda:{i}" for i in range(n)] or ["cpu"]
    if any(d.startswith("cuda") for d in spec):
        import torch

        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        bad = [d for d in spec if d.startswith("cuda:") and int(d[5:]) >= n]
        if bad:
            raise ApplyError(
                f"--devices: {bad[0]} is not visible to torch ({n} GPU(s)); pick from cuda:0..cuda:{n - 1}"
                if n
                else f"--devices: {bad[0]}: no CUDA/ROCm GPU visible to torch; use cpu"
            )
    return spec


def plan_apply(
    recipe: str | Path | Recipe,
    model: str | Path,
    *,
    target: str | Path | None = None,
    path: str | None = None,
    engine: str = "auto",
    devices: str | list[str] | None = "auto",
) -> ApplyPlan:
    """Read the source's config and headers only, and decide everything apply will do."""
    from quantkit.naming.archs import architecture_of, checkpoint_layers, family_of, quark_template

    device_spec(devices)  # a misspelt device is found before the model is read
    rec = recipe if isinstance(recipe, Recipe) else load_recipe(recipe)
    if engine not in ENGINES:
        raise ApplyError(f"--engine {engine!r}: use one of {', '.join(ENGINES)}")
    asked = path or rec.path
    if asked not in PATHS:
        raise ApplyError(f"--path {asked!r}: use one of {', '.join(PATHS)}")
    if asked == "per-shard" and rec.needs_calibration:
        raise ApplyError(
            f"--path per-shard: recipe {rec.name} has static activation scales, which the per-shard path "
            "cannot calibrate (Quark's drops input_scale); use --path in-memory"
        )
    if asked == "auto":
        run_path = "in-memory" if rec.needs_calibration else "per-shard"
        path_reason = (
            "in memory: static activation scales need calibration"
            if rec.needs_calibration
            else "per shard (default without static activation scales: memory bounded by shard size)"
        )
    else:
        run_path, path_reason = asked, f"--path {asked}" if path else f"recipe {rec.name}"
    schemes = {rec.scheme, *(o.scheme for o in rec.overrides)}
    native = native_schemes()
    native_ok = run_path == "per-shard" and schemes <= set(native)
    if engine == "native" and not native_ok:
        why = (
            "it runs per shard only"
            if run_path != "per-shard"
            else f"it supports {', '.join(native)} (recipe uses {', '.join(sorted(schemes))})"
        )
        raise ApplyError(f"--engine native: {why}; use --engine quark")
    chosen = "native" if engine in ("auto", "native") and native_ok else "quark"
    engine_reason = {
        "native": "quantkit's shard executor (byte-identical to Quark 0.13's file-to-file path)",
        "quark": "Quark 0.13"
        + (
            " (--engine quark)"
            if engine == "quark"
            else f" ({'calibration' if run_path == 'in-memory' else 'scheme'} not run natively)"
        ),
    }[chosen]

    src = resolve_source(model, copying=True)
    from quantkit.io.formats import decoded_tensor_names, detect_format, names_ending
    from quantkit.naming.archs import fused_layouts, mtp_tensor_names

    # The architecture first, as inspect does: a folder no record names gets the same reason from both commands,
    # never a source-format finding about a model quantkit could not quantize anyway.
    architecture_of(src.config)
    fmt = detect_format(src.config, src.tensors, source=str(src.path / "config.json"), fused=fused_layouts(src.config))
    if fmt.name != "bf16":
        if chosen != "native":
            why = "--engine quark" if engine == "quark" else f"path {run_path}"
            raise ApplyError(
                f"{model} is a {fmt.name} checkpoint, which only quantkit's shard executor decodes exactly "
                f"(per shard, to BF16, then {rec.scheme}); {why} cannot: use --engine native (what "
                "--engine auto picks) and a recipe without calibration"
            )
        engine_reason += f"; decodes the {fmt.name} source per shard to BF16 first"
    decoded = decoded_tensor_names(fmt, src.tensors) if fmt.name != "bf16" else {}
    names = list(decoded) if fmt.name != "bf16" else list(src.tensors)
    kind = model_kind(src.config)
    if chosen == "quark":
        quark_template(src.config)  # a family without a Quark template is refused here, before Quark is imported
    if kind != rec.applies_to:
        raise ApplyError(
            f"recipe {rec.name} applies to {rec.applies_to} checkpoints, but {model} is a {kind} "
            f"({src.architecture}); pick a recipe for {kind} (quantkit recipes list)"
        )
    info: DraftInfo | None = None
    n_target = target_layer_count(target) if target is not None else None
    if kind == EAGLE3_DRAFT:
        info = draft_info(src.config, src.tensors, str(model))
        if n_target is not None and info.aux_layer_ids and max(info.aux_layer_ids) > n_target:
            raise ApplyError(
                f"draft {model}: aux layer id {max(info.aux_layer_ids)} is beyond the target's "
                f"{n_target} layers; is --target the draft's target?"
            )
    layers, table = checkpoint_layers(
        src.config, names, (n_target or UNKNOWN_TARGET_LAYERS) if kind == EAGLE3_DRAFT else None
    )
    unmatched = unmatched_patterns(rec, layers)
    if unmatched:
        key, pattern = unmatched[0]
        what = "keep" if key.startswith("keep") else "give another scheme"
        modules = [m for layer in layers for m in layer.checkpoint_modules]
        raise ApplyError(
            f"recipe {rec.name}: {key} {pattern[:100]!r} matches no module of {model}, so the layers it "
            f"means to {what} would get {rec.scheme}; fix the pattern (fnmatch on checkpoint module "
            f"names such as {modules[len(modules) // 2]!r}) or remove the entry"
            + (f" (and {len(unmatched) - 1} more)" if len(unmatched) > 1 else "")
        )
    decisions = plan_layers(rec, layers)
    if not any(d.action == "quantize" for d in decisions):
        raise ApplyError(f"recipe {rec.name} quantizes no layer of {model}; check its quantize/keep roles")
    if fmt.fp4_experts:
        _refuse_requantized_fp4(rec, decisions, src, fmt, str(model))
    exclude = vllm_exclude(layers, decisions, target_known=kind != EAGLE3_DRAFT or n_target is not None)
    if kind == EAGLE3_DRAFT and n_target is None:
        for d in decisions:
            d.runtime_name = draft_runtime_name(d.runtime_name)
    if fmt.name != "bf16":
        from quantkit.io.formats import origins_of

        origins = origins_of(fmt, decoded)
        for d in decisions:
            origin = origins.get(f"{d.checkpoint_modules[0]}.weight") if d.checkpoint_modules else None
            d.source_format = fmt.name if origin == fmt.name else "bf16"
    # Experts stored fused in a layout no family record knows (MoeLayout.fused; those are decoded per expert above) are one 3-D tensor per layer without a `.weight` suffix: the native executor quantizes
    # `.weight` tensors only, so refuse before any work instead of failing in verification.
    # only names ending so can be such a tensor: usually none (found in one search of the names that do not end in
    # `.weight`, which the layers' table holds apart), and then no module is looked at
    present = set(
        names_ending(table.other_tensor_names() if table is not None else names, (".gate_up_proj", ".down_proj"))
    )
    fused = (
        next(
            (
                f"{m}.{p}"
                for d in decisions
                if d.action == "quantize" and d.kind == "moe"
                for m in d.checkpoint_modules
                for p in ("gate_up_proj", "down_proj")
                if f"{m}.{p}" in present
            ),
            None,
        )
        if present
        else None
    )
    if fused is not None:
        raise ApplyError(
            f"{model}: routed experts are stored fused ({fused}, one 3-D tensor for all experts); quantkit "
            "quantizes per-expert experts.<e>.*_proj.weight tensors only and cannot quantize this "
            "checkpoint's experts yet; re-save the experts per expert (experts.<e>.gate_proj / up_proj / down_proj.weight, "
            "[out, in] each) and apply again"
        )
    quark_exclude, layer_config = quark_exclusions(rec, decisions)
    # Multi-token-prediction layers (DeepSeek-V3 num_nextn_predict_layers, MiniMax-M2 num_mtp_modules): vLLM never
    # loads them into the target (quantkit.naming.archs.mtp_tensor_names), only its MTP draft does; kept BF16 so that
    # MTP speculation stays possible.
    mtp_names = mtp_tensor_names(src.config, names)
    mtp = sorted({n.removesuffix(".weight") for n in mtp_names if n.endswith(".weight")})
    quark_exclude = sorted(set(quark_exclude) | set(mtp))
    if mtp_names and rec.mtp == "keep":
        # vLLM builds the MTP draft with the target's quant config, so the kept BF16 MTP layers need `exclude` entries
        # under the MTP model's runtime names too (the family record's mtp_exclude, e.g. Qwen3.5's `re:mtp\.`,
        # DeepSeek-V3's `re:model\.layers\.61\.`)
        family = family_of(src.config)
        entries = family.mtp_exclusions(src.config, names)
        exclude = exclude + [e for e in entries if e not in exclude]
        from quantkit.naming.exclude import is_excluded

        draft = family.mtp_draft_layers(src.config, names) if family.mtp_draft_layers is not None else []
        hit = [layer.name for layer in layers if is_excluded(layer, entries)]
        if hit:  # the entries are for the draft alone: a target layer they matched would change the target
            raise ApplyVerificationError(
                f"internal: MTP exclude entries {entries} also exclude target layers {hit[:3]}"
            )
        missed = [layer.name for layer in draft if not is_excluded(layer, exclude)]
        if missed:
            raise ApplyVerificationError(
                f"internal: exclude entries {exclude[-3:]} leave the MTP draft's {missed} quantized in vLLM"
            )
    if rec.mtp == "drop" and mtp_names and chosen != "native":
        raise ApplyError(
            f"recipe {rec.name}: mtp: drop needs quantkit's shard executor (engine native); use "
            "mtp: keep with --engine quark"
        )
    devs = resolve_devices(devices)
    if chosen == "quark" and len(devs) > 1:
        devs = devs[:1]  # Quark's own multi-device mode re-imports Quark per worker (slower than one device)
    return ApplyPlan(
        rec,
        src,
        kind,
        info,
        n_target,
        layers,
        decisions,
        exclude,
        quark_exclude,
        layer_config,
        run_path,
        path_reason,
        chosen,
        engine_reason,
        devs,
        fmt,
        len(mtp),
        set(mtp_names) if rec.mtp == "drop" else set(),
        not_copied(scan_folder(src.path, inside=True)),
        ignored_weight_files(src),
        decoded,
        table,
    )


def _refuse_requantized_fp4(rec: Recipe, decisions: list[LayerDecision], plan_src: SourceCheckpoint, fmt: Any,
                            model: str) -> None:  # fmt: skip
    """A source whose routed experts are OCP MXFP4 already (DeepSeek-V4: quantkit.io.formats relayout_fp4_experts)
    goes through only a recipe that quantizes those experts to MXFP4: they are then written in Quark's layout with their
    bytes unchanged. Another scheme, or keeping them, would round them a second time: refused in one line."""
    from quantkit.io.formats import AlreadyFp4Error, fp8_scale_name

    tensors = plan_src.tensors
    for d in decisions:
        if d.kind != "moe" or (d.action == "quantize" and d.scheme == "mxfp4"):
            continue
        hit = next(
            (
                m
                for m in d.checkpoint_modules
                if (t := tensors.get(m + ".weight")) is not None
                and t.dtype in ("I8", "U8", "F4")
                and fp8_scale_name(fmt, m + ".weight") in tensors
            ),
            None,
        )
        if hit is None:
            continue
        what = f"quantize them with {d.scheme}" if d.action == "quantize" else "keep them unquantized"
        raise AlreadyFp4Error(
            f"{model}: the routed experts ({hit}, {d.runtime_name}) are already OCP MXFP4 (E2M1, E8M0 per 32) and "
            f"recipe {rec.name} would {what}, a second rounding: already FP4: serve it as it is (vllm serve "
            f"{model}), or apply a recipe that quantizes the experts to mxfp4 (mxfp4-moe), which writes them with "
            "their bytes unchanged"
        )


def ignored_weight_files(src: SourceCheckpoint) -> list[str]:
    """io.headers.unindexed_weight_files for the source, whose index re-read and walk of the tree are skipped where
    the folder's own listing settles it: no sub-folder (hidden ones included) and no *.safetensors besides the shards
    read, which are all named by the index when there is one (checkpoint_tensors reads only those)."""
    with os.scandir(src.path) as listing:
        entries = list(listing)
    read = set(src.files)
    if any(e.is_dir() or (e.name.endswith(".safetensors") and e.name not in read) for e in entries):
        return unindexed_weight_files(src.path)
    return []


def _listed(names: list[str], shown: int = 3) -> str:
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def predicted_output_bytes(plan: ApplyPlan) -> int:
    """Bytes of the output's tensors, from the plan and the source headers (no tensor data read)."""
    from quantkit.io.safetensors import DTYPE_BYTES

    layouts = _layout_counts(plan.decisions, _quantizer_tensors(plan), plan.modules)
    total = 0
    for (scheme, dtype, shape), count in layouts.items():
        exact = SCHEMES[scheme].output_bytes(shape) if scheme in SCHEMES and len(shape) >= 2 else None
        if exact is not None:  # a scheme whose record holds its layout (the native ones)
            total += exact * count
        elif scheme and "fp8" in scheme and len(shape) >= 2:  # Quark-only FP8 schemes: no layout in the registry yet
            total += (math.prod(shape) + shape[0] * 4) * count
        else:
            total += math.prod(shape) * DTYPE_BYTES.get(dtype, 1) * count
    return total


def _layout_counts(
    decisions: list[LayerDecision], infos: Mapping[str, Any], modules: CheckpointModules | None = None
) -> Counter[tuple[Any, str, Any]]:
    """How many of the tensors the quantizer sees have each (scheme, dtype, shape): scheme None for a tensor kept as
    it is, else that of the quantize decision whose module's `.weight` it is (a later decision wins).

    `modules`: the CheckpointModules the decisions' modules were taken from, built from the names of `infos`. The
    experts of an MoE layer are then usually one run of its positions (CheckpointModules.weight_run), read as a slice
    of `infos`' values; other decisions' weights are looked up by name. The tensors kept as they are are counted as
    those outside the runs (or all) less those quantized by name, so no tensor is looked up for being left over."""
    quantize = [d for d in decisions if d.action == "quantize"]
    runs = _weight_runs(quantize, infos, modules)
    values = list(infos.values()) if runs else []
    layouts: Counter[tuple[Any, str, Any]] = Counter()
    named: Counter[tuple[str, Any]] = Counter()  # (dtype, shape) of the weights counted by name
    by_name, missing = 0, False
    listed = []  # (scheme, weight names) of the decisions counted by name
    for i, d in enumerate(quantize):
        run = runs.get(i)
        if run is not None:
            got = values[run.start : run.stop]
        else:
            names = list(map(add, d.checkpoint_modules, repeat(".weight")))
            listed.append((d.scheme, names))
            got = list(map(infos.get, names))
            if None in got:  # a module without a .weight tensor: nothing to count for it
                got, missing = list(filter(None, got)), True
            by_name += len(got)
        for (dtype, shape), n in Counter(map(_DTYPE_SHAPE, got)).items():
            layouts[d.scheme, dtype, shape] += n
            if run is None:
                named[dtype, shape] += n
    # the runs are apart from each other and from the other decisions' weights (_weight_runs); those are distinct
    # unless a module is in two decisions (the lookups above hashed them already)
    weights = set(chain.from_iterable(names for _, names in listed))
    if by_name != (len(weights.intersection(infos)) if missing else len(weights)):  # a later decision wins
        listed = [(d.scheme, list(map(add, d.checkpoint_modules, repeat(".weight")))) for d in quantize]
        quantized = dict(
            zip(
                chain.from_iterable(names for _, names in listed),
                chain.from_iterable(repeat(scheme, len(names)) for scheme, names in listed),
            )
        )
        return Counter(zip(map(quantized.get, infos), map(_DTYPE, infos.values()), map(_SHAPE, infos.values())))
    # the tensors kept as they are: those outside the runs (TensorInfos are shared, so few kinds) but those counted
    # by name
    kept: Counter[tuple[str, Any]] = Counter()
    if runs:
        spans = sorted((run.start, run.stop) for run in runs.values())
        gaps = zip([0, *(stop for _, stop in spans)], [*(start for start, _ in spans), len(values)])
        kept.update(map(_DTYPE_SHAPE, chain.from_iterable(values[start:stop] for start, stop in gaps)))
    else:
        for info, n in Counter(infos.values()).items():
            kept[_DTYPE_SHAPE(info)] += n
    kept.subtract(named)
    for (dtype, shape), n in kept.items():
        if n:
            layouts[None, dtype, shape] += n
    return layouts


def _weight_runs(
    quantize: list[LayerDecision], infos: Mapping[str, Any], modules: CheckpointModules | None
) -> dict[int, range]:
    """The positions in `infos` of the weights of each decision (by its index in `quantize`) that are one run
    (CheckpointModules.weight_run), where those runs overlap neither each other nor another decision's modules;
    else none."""
    if modules is None or list(infos) != modules.tensor_names:  # (the same strings: compared by identity)
        return {}
    runs = {i: run for i, d in enumerate(quantize) if (run := modules.weight_run(d.checkpoint_modules)) is not None}
    spans = sorted((run.start, run.stop) for run in runs.values())
    if any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:])):
        return {}
    starts = [start for start, _ in spans]
    for i, d in enumerate(quantize):
        if runs and i not in runs:
            for module in d.checkpoint_modules:
                for p in modules.positions(module):
                    j = bisect_right(starts, p) - 1
                    if j >= 0 and p < spans[j][1]:
                        return {}
    return runs


def _quantizer_tensors(plan: ApplyPlan) -> Mapping[str, Any]:
    """`decoded_infos` without a copy of a BF16 source's tensors (read only)."""
    return plan.src.tensors if plan.source_format.name == "bf16" else decoded_infos(plan)


def decoded_infos(plan: ApplyPlan) -> dict[str, Any]:
    """The tensors the quantizer sees: the source's, or for a quantized source its decoded BF16 weights."""
    from quantkit.io.formats import decoded_tensor_names, fused_expert_parts
    from quantkit.io.headers import TensorInfo

    fmt, tensors = plan.source_format, plan.src.tensors
    if fmt.name == "bf16":
        return dict(tensors)
    out: dict[str, Any] = {}
    shapes: dict[str, dict[str, tuple[int, ...]]] = {}  # fused tensor -> its per-expert tensors' shapes
    quantized = {m for d in plan.decisions if d.action == "quantize" for m in d.checkpoint_modules}
    for name, parts in (plan.decoded or decoded_tensor_names(fmt, tensors)).items():
        if parts == [name]:
            out[name] = tensors[name]
        elif fmt.name == "fused-experts":  # one expert of a fused [E, ...] tensor, in vLLM's [out, in]
            fused = tensors[parts[0]]
            if parts[0] not in shapes:
                shapes[parts[0]] = {d: shape for d, _, _, shape in fused_expert_parts(fmt, parts[0], fused.shape)}
            out[name] = TensorInfo(fused.file, fused.dtype, shapes[parts[0]][name])
        elif name in tensors and tensors[name].dtype in ("I8", "U8", "F4"):  # DeepSeek-V4's OCP-MXFP4 experts
            weight, scale = tensors[parts[0]], tensors[parts[1]]
            if name.removesuffix(".weight") in quantized:  # quantized to MXFP4: the same bytes, re-laid out
                out[name] = TensorInfo(weight.file, "BF16", (*weight.shape[:-1], weight.shape[-1] * 2))
            else:  # kept as stored (an MTP block's experts): written in Quark's MXFP4 layout all the same
                out[name] = TensorInfo(weight.file, "U8", weight.shape)
                out[name + "_scale"] = TensorInfo(scale.file, "U8", scale.shape)
        elif name in tensors:  # fp8-block: the e4m3 weight has the decoded shape
            out[name] = TensorInfo(tensors[name].file, "BF16", tensors[name].shape)
        else:  # int4 pack-quantized: 8 values per int32 along the input dimension
            packed = tensors[parts[0]]
            out[name] = TensorInfo(packed.file, "BF16", (*packed.shape[:-1], packed.shape[-1] * 8))
    return out


def device_plan(plan: ApplyPlan) -> dict[str, list[str]]:
    """Which source shards each device is expected to take: largest first, to the least loaded device (the
    executor hands shards out as devices free up, so this is the plan, not a promise)."""
    sizes = {f: (plan.src.path / f).stat().st_size for f in plan.src.files}
    load = {d: 0 for d in plan.devices}
    out: dict[str, list[str]] = {d: [] for d in plan.devices}
    for f in sorted(sizes, key=lambda f: -sizes[f]):
        d = min(load, key=lambda k: load[k])
        out[d].append(f)
        load[d] += sizes[f]
    return out


def _resume_command(
    recipe: Recipe,
    model: str | Path,
    output: Path,
    target: str | Path | None,
    path: str | None,
    engine: str,
    devices: list[str],
    max_shard_size: int | None = None,
) -> str:
    recipe_arg = str(recipe.source) if recipe.source and recipe.source.parent.name != "recipes" else recipe.name
    parts = ["quantkit", "apply", "--recipe", recipe_arg, "--model", str(model), "--output", str(output)]
    if target is not None:
        parts += ["--target", str(target)]
    if path:
        parts += ["--path", path]
    if engine != "auto":
        parts += ["--engine", engine]
    if max_shard_size is not None:
        parts += ["--max-shard-size", str(max_shard_size)]
    parts += ["--devices", ",".join(devices), "--resume"]
    return " ".join(shlex.quote(p) for p in parts)


def _shard_progress(progress: Progress, total_bytes: int) -> Callable[[Any], None]:
    """Executor events as progress lines: shards done, MB/s over the run so far, and the ETA."""
    t0 = time.perf_counter()
    done = [0, 0]  # bytes processed in this run, shards finished (incl. resumed)

    def emit(event: Any) -> None:
        if event.kind == "start":
            return
        if event.kind == "source-changed":
            progress(
                f"shard {event.shard}: its source bytes changed since the interrupted run (SHA-256 differs); "
                "quantizing it again"
            )
            return
        done[1] += 1
        if event.kind == "resumed":
            progress(
                f"shard {done[1]}/{event.total} {event.shard}: kept from the interrupted run (source and output "
                "re-hashed)"
            )
            return
        done[0] += event.bytes_in
        elapsed = max(time.perf_counter() - t0, 1e-9)
        rate = done[0] / elapsed
        left = max(total_bytes - done[0], 0) / rate if rate else 0.0
        took = f"{event.seconds:.1f}s" if event.seconds >= 0.1 else f"{event.seconds * 1000:.0f} ms"
        # no rate here: the run's one rate is the executor's, in the summary (this one counted start-up as well)
        progress(
            f"shard {done[1]}/{event.total} {event.shard} on {event.device}: {event.bytes_in / 1e6:.1f} MB in "
            f"{took}" + (f"; ETA {left:.0f}s" if done[1] < event.total else "")
        )

    return emit


def apply(
    recipe: str | Path | Recipe,
    model: str | Path,
    output: str | Path,
    *,
    device: str | None = None,
    devices: str | list[str] | None = "auto",
    path: str | None = None,
    engine: str = "auto",
    overwrite: bool = False,
    resume: bool = False,
    dry_run: bool = False,
    target: str | Path | None = None,
    max_memory: int | None = None,
    max_shard_size: int | None = None,
    progress: Progress | None = None,
) -> ApplyResult:
    """Quantize `model` with `recipe` into `output` (written to a temporary folder, renamed when complete).

    `devices`: auto | cpu | cuda | "cuda:0,cuda:1" (`device` is the older single-device spelling). `max_memory`:
    the native executor's host-memory budget in bytes (None: from the machine). `max_shard_size`: output shards of
    at most that many bytes, named model-0000i-of-0000N.safetensors (None: the source's shards and names; native
    engine only). `resume`
    continues an interrupted native run from its temporary folder. `dry_run` returns the plan (layers, exclude,
    predicted size, device plan) without reading tensor data or writing anything.
    """
    progress = or_silent(progress)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    output = Path(output)
    local_inputs = [p for p in (model, target) if p is not None]
    if not dry_run:
        check_output_free(output, overwrite, local_inputs)
    with paused_gc():
        plan = plan_apply(
            recipe,
            model,
            target=target,
            path=path,
            engine=engine,
            devices=device if device not in (None, "auto") else devices,
        )
    rec, src, decisions = plan.recipe, plan.src, plan.decisions
    if max_shard_size is not None and plan.engine != "native":
        raise ApplyError(
            f"--max-shard-size: only the native executor re-shards, and this run uses the {plan.engine} "
            f"engine ({plan.engine_reason}); use --engine native, or leave out --max-shard-size"
        )
    timings["plan"] = time.perf_counter() - t0
    progress(
        f"{src.architecture} ({plan.kind}): {sum(d.action == 'quantize' for d in decisions)} layers to quantize, "
        f"{sum(d.action == 'keep' for d in decisions)} kept; vLLM exclude: {plan.exclude}; engine {plan.engine} "
        f"{plan.path} on {','.join(plan.devices)}"
    )
    if plan.not_copied:
        progress(
            f"warning: not copied from the source (apply copies only the weights and the files a checkpoint "
            f"carries, see the README's Safety section): {describe_not_copied(plan.not_copied)}"
        )

    base = dict(
        command=" ".join(sys.argv) if sys.argv else "",
        target=str(target) if target is not None else None,
        output=str(output.expanduser().resolve()),
        source=src.hub_id or str(src.path.resolve()),
        recipe=rec.to_dict(),
        model_kind=plan.kind,
        architecture=src.architecture,
        path=plan.path,
        path_reason=plan.path_reason,
        device=plan.devices[0],
        devices=plan.devices,
        engine=plan.engine,
        exclude=plan.exclude,
        quark_exclude=plan.quark_exclude,
        layers=decisions,
        size_before_bytes=src.size_bytes,
        target_num_layers=plan.n_target,
        versions=versions(),
        source_format=plan.source_format.name,
        not_copied=plan.not_copied,
        ignored_weight_files=plan.ignored_files,
        max_shard_size=max_shard_size,
    )
    if plan.ignored_files:
        progress(
            f"warning: {INDEX_FILE} does not name {_listed(plan.ignored_files)}; the index is the truth: "
            f"{'they are' if len(plan.ignored_files) > 1 else 'it is'} neither quantized nor copied"
        )
    if dry_run:
        with paused_gc():
            predicted, shards_by_device = predicted_output_bytes(plan), device_plan(plan)
        timings["total"] = time.perf_counter() - t0  # the whole plan, its size prediction and device plan included
        return ApplyResult(
            **base,
            dry_run=True,
            size_after_bytes=predicted,
            device_plan=shards_by_device,
            timings_s={k: round(v, 3) for k, v in timings.items()},
        )

    native = plan.engine == "native"
    hashes: dict[str, str] = {}
    resume_hint = "resume with: " + _resume_command(
        rec, model, output, target, path, engine, plan.devices, max_shard_size
    )
    shards: list[ShardSummary] = []
    throughput = None
    resumed = 0
    with atomic_output(
        output,
        overwrite,
        [src.path, *local_inputs],
        resumable=native,
        resume=resume,
        resume_hint=resume_hint,
        command=base["command"],
        progress=progress,
    ) as tmp:
        if not native:  # the native executor hashes each shard from the same read that quantizes it
            hashes = {f: sha256_file(src.path / f) for f in src.files}
            progress("checking that every weight to quantize is finite")
            refuse_non_finite(src, decisions)
        t1 = time.perf_counter()
        if native:
            from quantkit.apply.shards import quantize_checkpoint

            continuing = resume and (tmp / RESUMABLE_MARKER).is_file()
            progress(
                "resuming the interrupted run in " + tmp.name
                if continuing
                else f"quantizing {len(src.files)} shard(s) with the native executor"
            )
            report = quantize_checkpoint(
                src.path,
                tmp,
                scheme=rec.scheme,
                exclude=plan.quark_exclude,
                layer_config=plan.layer_config or None,
                devices=plan.devices,
                resume=continuing,
                progress=_shard_progress(progress, src.size_bytes),
                decode=plan.source_format if plan.source_format.name != "bf16" else None,
                drop=plan.dropped,
                max_memory=max_memory,
                max_shard_size=max_shard_size,
                finish=lambda _src, dst, qc: write_final_files(plan, dst, qc),
            )
            shards = report.shards
            hashes = dict(report.source_sha256)
            throughput, resumed = report.mb_per_s, report.resumed_shards
        else:
            from quantkit.apply.quark_engine import run_in_memory, run_per_shard

            runner = run_in_memory if plan.path == "in-memory" else run_per_shard
            runner(src.path, tmp, rec, plan.kind, src.config, decisions, plan.devices[0].split(":")[0], progress)
            qc = read_config(tmp).get("quantization_config")
            if not isinstance(qc, dict):
                raise ApplyVerificationError(f"the quantizer wrote no quantization_config to {tmp / 'config.json'}")
            write_final_files(plan, tmp, qc)
        timings["quantize"] = time.perf_counter() - t1

        t2 = time.perf_counter()
        restored = [] if native else restore_kept_tensors(src, tmp, decisions)
        progress("verifying the written tensors against the plan and the source")
        # The executor already checked every shard as it wrote it (kept tensors by hash, scales finite and
        # positive); the whole-folder check against the plan runs for both engines.
        decoded = decoded_infos(plan) if plan.source_format.name != "bf16" or plan.dropped else None
        if decoded is not None and plan.dropped:
            decoded = {n: t for n, t in decoded.items() if n not in plan.dropped}
        from quantkit.apply.shards.memory import peak_rss_mb

        verified = verify_output(src, tmp, decisions, kept_checked_by_hash=native, source_tensors=decoded)
        verified["restored_source_dtype"] = restored
        timings["verify"] = time.perf_counter() - t2
        timings["total"] = time.perf_counter() - t0
        out_size = sum(p.stat().st_size for p in tmp.glob("*.safetensors"))
        result = ApplyResult(
            **base,
            size_after_bytes=out_size,
            timings_s={k: round(v, 3) for k, v in timings.items()},
            peak_rss_mb=peak_rss_mb(),
            source_files=hashes,
            verified=verified,
            shards=shards,
            resumed_shards=resumed,
            throughput_mb_s=throughput,
            device_plan={},
            output_files=sorted({*written_files(tmp), "quantkit.json"}),
        )
        (tmp / "quantkit.json").write_text(jsonout.dumps(result.to_dict()) + "\n")
    progress(f"wrote {result.output} in {timings['total']:.1f}s")
    return result
