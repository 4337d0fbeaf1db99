"""`quantkit check`: prove, before any GPU time is spent, that vLLM will load a Quark checkpoint as intended.

Three parts, each adding `Finding`s (severity, code, layer or tensor, what is wrong, how to fix it) to a CheckResult:

1. Static contract (config.json, safetensors headers, and the data of scale / vocabulary-map tensors only, read
   with numpy: no torch, no Quark). It replays vLLM 0.32's Quark loader; every rule names the vLLM source it follows
   (paths under vllm/model_executor/ unless said otherwise):
   - required keys: layers/quantization/quark/quark.py `QuarkConfig.from_config` (export, export.kv_cache_group,
     layer_quant_config for kv-cache groups), `get_quant_method_target` (exclude, passed to should_ignore_layer),
     `_find_matched_config` (layer_type_quant_config .get, global_quant_config);
   - exclusions: layers/quantization/quark/utils.py `should_ignore_layer` and
     layers/quantization/utils/config_utils.py `find_matching_patterns` (replayed in quantkit.naming.exclude): exact
     runtime name or `re:` only, fused layers all shards or none (ValueError), MoE layers all-or-nothing;
   - which config and scheme each layer gets: quark.py `_find_matched_config`, `get_layer_quant_config_from_name`,
     `_get_scheme_cls_from_config`, quark_moe.py `get_moe_method_target` (replayed in quantkit.naming.precision);
   - tensors: quark/schemes/quark_w8a8_fp8.py `create_weights` (FP8 E4M3FN weight [out, in], per-channel scale [out]
     or per-tensor scale, input_scale for static activations), quark/schemes/quark_ocp_mx.py `create_weights` and
     quark_moe.py `QuarkOCP_MX_MoEMethod.create_weights` (uint8 [out, in/2], uint8 E8M0 scale [out, in/32]);
     layers that get no Quark method load into plain BF16 parameters (layers/linear.py UnquantizedLinearMethod,
     layers/vocab_parallel_embedding.py), so quantized tensors there are garbage or a load failure;
   - TP: layers/linear.py (ColumnParallelLinear splits the output, RowParallelLinear the input, ReplicatedLinear
     nothing; QKVParallelLinear replicates KV heads when tp > num_kv_heads), layers/fused_moe (w13 split on the
     intermediate size, w2 on its input), quark_ocp_mx.py (input per partition % 32 == 0);
   - drafts: models/llama_eagle3.py (lm_head is a ParallelLMHead: never quantized; d2t -> draft_id_to_target_id,
     t2d skipped; logits mapped by arange(draft_vocab) + d2t), models/llama.py `_maybe_add_hidden_state` (aux ids
     0..L: id i is the hidden state after i target layers), v1/worker/gpu_model_runner.py
     `_get_eagle3_aux_layers_from_config` (top-level ids win over eagle_config's);
   - platform: quark_moe.py `QuarkW8A8Fp8MoEMethod.process_weights_after_loading` and the FP8 linear kernels
     (normalize_e4m3fn_to_e4m3fnuz on gfx942), layers/fused_moe/oracle/mxfp4.py (native MXFP4 only on gfx950,
     emulation elsewhere).
2. Real load (quantkit.check.vllm_worker in a subprocess with a timeout): generate a few tokens; for a draft with its target,
   the pair with EAGLE-3 speculative decoding; compare the loaded quant method and dtype of every layer with (1).
3. Numeric (optional, with the source checkpoint): dequantize every quantized weight (numpy) and compare it with the
   source weight; relative error above the scheme's bound is an error.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from quantkit.check.findings import (
    FLOAT_DTYPES,
    MXFP4_GROUP,
    QUANTIZED_DTYPES,
    REPLICATED,
    ROW_PARALLEL,
    SCALE_DTYPES,
    WEIGHT_DTYPES,
    Findings,
)
from quantkit.io.headers import TensorInfo
from quantkit.naming.precision import PLACEHOLDER, LoadedCheckpoint, resolve_layers
from quantkit.results.precision import LayerPrecision

# --- 1. static contract ----------------------------------------------------------------------------------------

_KEY_RULES = {
    "quant_method": ("vLLM picks its Quark loader by quant_method; without it the checkpoint is not loaded as Quark",
                     '"quant_method": "quark"'),
    "export": ("QuarkConfig.from_config raises ValueError when `export` is missing (quark.py)",
               '"export": {"kv_cache_group": [], "pack_method": "reorder", "weight_format": "real_quantized"}'),
    "global_quant_config": ("every layer no layer_quant_config key matches falls back to it; without it vLLM crashes "
                            "building the first quantized layer (quark.py _find_matched_config)",
                            "restore the global_quant_config Quark exported"),
    "layer_type_quant_config": ("quark.py _find_matched_config calls layer_type_quant_config.get(...): AttributeError "
                                "when it is missing", '"layer_type_quant_config": {}'),
    "exclude": ("quark.py get_quant_method_target passes quant_config.get('exclude') to should_ignore_layer, which "
                "iterates it: TypeError when it is missing", '"exclude": [] (or the layers to keep unquantized)'),
}  # fmt: skip


def static_contract(ck: LoadedCheckpoint, modules: dict[str, list[tuple[str, TensorInfo]]], tp: int,
                     findings: Findings) -> list[LayerPrecision]:
    qc = ck.qc
    if qc is None:
        findings.add("info", "not-quantized", "quantization_config",
                     "config.json has no quantization_config: vLLM loads every layer unquantized")
    else:
        _required_keys(qc, findings)
    quark = qc is not None and qc.get("quant_method") == "quark"
    resolved, problems = resolve_layers(ck.config, qc, ck.layers, modules)
    if qc is not None and not quark:
        return resolved  # not replayed: reported as not-quark
    for message in problems:
        findings.add("warning", "layer-type-config-ignored", "quantization_config.layer_type_quant_config", message,
                     "move these entries to layer_quant_config (keys are runtime layer names or * patterns)")
    by_name = {layer.name: layer for layer in ck.layers}
    if quark:
        assert qc is not None  # `quark` implies a quantization_config
        _exclude_entries(ck, resolved, by_name, modules, findings)
        _layer_quant_config_keys(ck, qc, findings)
    routers = {lp.name for lp in resolved if lp.role == "router" and lp.quantized}
    for lp in resolved:
        _layer_contract(ck, lp, by_name[lp.name], modules, findings,
                        lambda extra: _exclude_fix(ck, resolved, extra), routers)
        if lp.quantized and lp.scheme is not None and not lp.problem:
            _tp_contract(ck, lp, modules, tp, findings)
    return resolved


def _required_keys(qc: dict[str, Any], findings: Findings) -> None:
    if "quant_method" in qc and qc["quant_method"] != "quark":
        findings.add("error", "not-quark", "quantization_config.quant_method",
                     f"quant_method is {qc['quant_method']!r}; quantkit checks Quark checkpoints (quant_method "
                     "\"quark\") only", "re-export the checkpoint with Quark, or check it with its own tools")
        return
    for key in ("quant_method", "export", "global_quant_config", "layer_type_quant_config", "exclude"):
        if key not in qc:
            why, fix = _KEY_RULES[key]
            findings.add("error", "config-key-missing", f"quantization_config.{key}",
                         f"quantization_config has no {key!r}: {why}", f"add {fix}")
    export = qc.get("export")
    if isinstance(export, dict) and not isinstance(export.get("kv_cache_group"), list):
        findings.add("error", "config-key-missing", "quantization_config.export.kv_cache_group",
                     "export has no kv_cache_group list; QuarkConfig.from_config takes len() of it (TypeError)",
                     'add "kv_cache_group": [] to export')
    kv_groups = export.get("kv_cache_group") if isinstance(export, dict) else None
    if "layer_quant_config" not in qc:
        severity = "error" if kv_groups else "warning"
        findings.add(severity, "config-key-missing", "quantization_config.layer_quant_config",
                     "quantization_config has no 'layer_quant_config'; Quark always writes it"
                     + ("; QuarkConfig.from_config reads kv_cache_group settings from it (AttributeError)"
                        if kv_groups else "; vLLM 0.32 treats it as empty"), 'add "layer_quant_config": {}')
    exclude = qc.get("exclude")
    if "exclude" in qc and (isinstance(exclude, str) or not isinstance(exclude, list)
                            or not all(isinstance(e, str) for e in exclude)):
        findings.add("error", "exclude-not-list", "quantization_config.exclude",
                     f"exclude must be a list of strings, got {exclude!r:.80}", "write exclude as a JSON list of names")


def _quoted(entries: Sequence[str]) -> str:
    return json.dumps(list(entries))


def _exclude_fix(ck: LoadedCheckpoint, resolved: Sequence[LayerPrecision], extra: set[str]) -> str:
    """The exclude list under which exactly the layers excluded now, plus `extra`, are excluded (vLLM names)."""
    from quantkit.naming.exclude import exclude_entries_for

    kept_names = {lp.name for lp in resolved if lp.exclude_rule is not None
                  or lp.source == "partial_fused_exclusion"} | extra
    kept = [layer for layer in ck.layers if layer.name in kept_names]
    try:
        entries = exclude_entries_for(kept, ck.layers)
    except Exception:
        entries = [layer.name for layer in kept]
    fixed = []
    for e in entries:  # a draft checked without --target: its decoder layers' number is unknown
        if PLACEHOLDER in e:
            head, _, tail = e.partition(f"model.layers.{PLACEHOLDER}.")
            e = "re:" + re.escape(head.removeprefix("re:") + "model.layers.") + r"\d+\." + re.escape(tail) + "$"
        fixed.append(e)
    return f"write \"exclude\": {_quoted(fixed)}"


def _exclude_entries(ck: LoadedCheckpoint, resolved: list[LayerPrecision], by_name: dict[str, Any],
                     modules: dict[str, list[tuple[str, TensorInfo]]], findings: Findings) -> None:
    """Entries vLLM ignores (Quark checkpoint names, fnmatch globs, names of nothing), invalid regexes, and fused
    layers excluded in part."""
    from quantkit.naming.exclude import (
        ExcludeListError,
        PartialFusedExclusion,
        match_reason,
    )

    exclude = ck.qc.get("exclude") if ck.qc else None
    if not isinstance(exclude, list) or not all(isinstance(e, str) for e in exclude):
        return
    used: set[str] = set()
    for layer in ck.layers:
        try:
            m = match_reason(layer, exclude)
        except ExcludeListError as e:
            findings.add("error", "exclude-invalid-regex", "quantization_config.exclude", str(e),
                         "fix the regular expression (vLLM compiles it with the `regex` package)")
            return
        if isinstance(m, PartialFusedExclusion):
            used.update(e for _, es in m.shard_entries for e in es)
        else:
            used.update(m.entries)
    quantized = {lp.name for lp in resolved if lp.quantized}
    not_applied: dict[str, list[str]] = {}
    for entry in exclude:
        if entry in used:
            continue
        # Quark writes checkpoint module names (fnmatch globs in its own config); vLLM matches runtime names only.
        hits = [layer for layer in ck.layers if not entry.startswith("re:")
                and any(m == entry or fnmatch.fnmatchcase(m, entry) or m.startswith(entry + ".")
                        for m in layer.checkpoint_modules)]
        if not hits:
            findings.add("warning", "exclude-unmatched", entry,
                         f"exclude entry {entry!r} matches no layer vLLM builds for this checkpoint "
                         "(vLLM matches exact runtime names or `re:` regexes only); it has no effect",
                         "remove it, or write the runtime name (see `quantkit inspect`)")
            continue
        for layer in hits:
            if layer.name in quantized:
                not_applied.setdefault(layer.name, []).append(entry)
    if not_applied:
        fix = _exclude_fix(ck, resolved, set(not_applied))
        for name, entries in not_applied.items():
            lp = next(lp for lp in resolved if lp.name == name)
            dtypes = sorted({info.dtype for m in lp.checkpoint_modules for t, info in modules.get(m, [])
                             if t.endswith(".weight")})
            findings.add(
                "error", "exclude-not-applied", name,
                f"exclude entr{'ies' if len(entries) > 1 else 'y'} {', '.join(repr(e) for e in entries)} "
                f"name{'s' if len(entries) == 1 else ''} checkpoint module(s) of {name}, but vLLM matches exclude "
                f"against runtime names only (exact or `re:`), so it quantizes {name} as {lp.precision}"
                + (f" although its weight is {'/'.join(dtypes)}: it would compute with garbage" if
                   dtypes and set(dtypes) <= FLOAT_DTYPES else ""),
                f"{fix} (or the `re:` form re:{re.escape(name)}$)")
    for lp in resolved:
        if lp.source == "partial_fused_exclusion":
            layer = by_name[lp.name]
            findings.add("error", "partial-fused-exclusion", lp.name,
                         f"{lp.problem} (utils.py should_ignore_layer: ValueError 'Found different quantization "
                         "schemes for the shards')",
                         f"exclude all of {', '.join(layer.shards)} or the fused runtime name; "
                         f"{_exclude_fix(ck, resolved, set())}")


def _layer_quant_config_keys(ck: LoadedCheckpoint, qc: dict[str, Any], findings: Findings) -> None:
    lqc = qc.get("layer_quant_config")
    if not isinstance(lqc, dict) or not lqc:
        return
    names = [n for layer in ck.layers for n in (layer.shards or (layer.name,))]
    for key in lqc:
        hit = any((fnmatch.fnmatch(n, key) if "*" in key else n in key) for n in names)
        if not hit:
            findings.add("warning", "layer-config-unmatched", f"layer_quant_config.{key}",
                         f"layer_quant_config key {key!r} matches no runtime layer (vLLM looks keys up by runtime "
                         "name: substring of the key, or fnmatch for keys with *), so its config is never used",
                         "rename the key to the runtime layer name (see `quantkit inspect`)")


def _weight_dims(info: TensorInfo, family: str | None) -> tuple[int, int] | None:
    if len(info.shape) != 2:
        return None
    out, cols = info.shape
    return (out, cols * 2) if family == "mxfp4" and info.dtype == "U8" else (out, cols)


def _layer_contract(ck: LoadedCheckpoint, lp: LayerPrecision, layer: Any,
                    modules: dict[str, list[tuple[str, TensorInfo]]], findings: Findings,
                    exclude_fix: Callable[[set[str]], str], routers: set[str]) -> None:
    """Tensors of one layer against what vLLM will build for it."""
    if lp.source == "unsupported_scheme" and lp.entry is None and ck.qc is not None and \
            ck.qc.get("global_quant_config") is None and "global_quant_config" not in ck.qc:
        return  # reported once as the missing key
    if lp.problem and lp.source in ("fused_config_mismatch", "unsupported_scheme"):
        code = "fused-config-mismatch" if lp.source == "fused_config_mismatch" else "unsupported-scheme"
        findings.add("error", code, lp.name, lp.reason,
                     "give the layer a config vLLM supports (see quark.py _get_scheme_cls_from_config), or exclude it")
        return
    if lp.source in ("partial_fused_exclusion", "invalid_exclude"):
        return  # reported with the exclude list
    if any(f.layer_or_tensor == lp.name and f.code == "exclude-not-applied" for f in findings):
        return  # its tensors are described in that finding
    params = {m: dict(modules.get(m, [])) for m in lp.checkpoint_modules}
    quantized_tensors = sorted(t for m, ps in params.items() for t, i in ps.items()
                               if i.dtype in QUANTIZED_DTYPES and not t.endswith((".bias",))
                               or t.endswith((".weight_scale", ".weight_scale_inv")))
    if lp.role == "router" and (lp.quantized or quantized_tensors):
        why = (f"vLLM quantizes it as {lp.precision} ({lp.reason})" if lp.quantized else
               f"its tensors are quantized ({', '.join(quantized_tensors[:3])}) but vLLM loads it unquantized")
        findings.add("error", "router-quantized", lp.name,
                     f"router {lp.name} is quantized: {why}; router logits pick the experts, and a quantized router "
                     "changes routing (and a BF16 tensor read as quantized is garbage)",
                     f"keep routers BF16: {exclude_fix(routers)}" if lp.quantized else
                     "re-export with the router unquantized (Quark exclude: its checkpoint module)")
        return
    if not lp.quantized:
        if quantized_tensors:
            if lp.role == "lm_head":
                findings.add("error", "lm-head-quantized", lp.name,
                             f"lm_head holds quantized tensors ({', '.join(quantized_tensors[:3])}); vLLM builds "
                             "lm_head as a ParallelLMHead with no Quark method, so a quantized lm_head fails to load "
                             "or loads FP8 bytes as BF16 values", "re-export with lm_head kept BF16 (exclude lm_head)")
            else:
                why = ("vLLM never quantizes this kind of layer" if lp.source == "never_quantized" else
                       f"vLLM loads it unquantized ({lp.reason})")
                fix = ("re-export it unquantized" if lp.source == "never_quantized" else
                       "remove it from exclude so vLLM loads it quantized, or re-export it unquantized")
                findings.add("error", "unexpected-quantized-tensor", lp.name,
                             f"{lp.name} holds quantized tensors ({', '.join(quantized_tensors[:3])}) but {why}: "
                             "the load fails on the scale tensor or reads quantized bytes as BF16", fix)
        return
    scheme = lp.scheme
    if scheme is None:
        return
    family = scheme.family
    unquantized = [f"{m}.weight" for m, ps in params.items() if f"{m}.weight" in ps
                   and ps[f"{m}.weight"].dtype in FLOAT_DTYPES]
    if unquantized:
        findings.add("error", "weight-not-quantized", lp.name,
                     f"vLLM quantizes {lp.name} as {lp.precision} ({lp.reason}) but {', '.join(unquantized[:3])} "
                     f"{'is' if len(unquantized) == 1 else 'are'} {_dtype_of(params, unquantized[0])}: vLLM would "
                     "read the BF16 bytes as quantized values with uninitialised scales",
                     f"keep it unquantized: {exclude_fix({lp.name})}; or re-export the layer quantized")
        return
    expected_w = WEIGHT_DTYPES.get(family)
    for m, ps in params.items():
        w = ps.get(f"{m}.weight")
        if w is None:
            if layer.kind == "moe" and m == layer.checkpoint_modules[0] and not m.split(".")[-1].isdigit():
                continue  # a fused 3-D experts container (transformers v5 layout): checked by dtype only
            findings.add("error", "weight-missing", f"{m}.weight", f"quantized layer {lp.name} has no {m}.weight",
                         "re-export the checkpoint")
            continue
        if expected_w and w.dtype not in expected_w:
            findings.add("error", "weight-dtype", f"{m}.weight",
                         f"{m}.weight is {w.dtype}; vLLM's {lp.precision} scheme loads {'/'.join(sorted(expected_w))}",
                         "re-export the layer with the scheme in the config (OCP FP8 is F8_E4M3, MXFP4 is U8)")
            continue
        scale = ps.get(f"{m}.weight_scale")
        if scale is None:
            findings.add("error", "scale-missing", f"{m}.weight_scale",
                         f"quantized layer {lp.name} has {m}.weight but no {m}.weight_scale; vLLM keeps its "
                         "placeholder scale (float32 min for FP8) and computes garbage",
                         "re-export the checkpoint; a scale tensor was dropped")
            continue
        if family in SCALE_DTYPES and scale.dtype not in SCALE_DTYPES[family]:
            findings.add("error", "scale-dtype", f"{m}.weight_scale",
                         f"{m}.weight_scale is {scale.dtype}; {lp.precision} scales are "
                         f"{'/'.join(sorted(SCALE_DTYPES[family]))}", "re-export the checkpoint")
            continue
        _shape_contract(lp, m, w, scale, family, findings)
        if scheme.static_input and f"{m}.input_scale" not in ps:
            findings.add("error", "scale-missing", f"{m}.input_scale",
                         f"{lp.precision} with static activation scales ({scheme.activations}) needs "
                         f"{m}.input_scale, which is missing", "re-export with calibration (static input scales)")


def _dtype_of(params: dict[str, dict[str, TensorInfo]], tensor: str) -> str:
    for ps in params.values():
        if tensor in ps:
            return ps[tensor].dtype
    return "?"


def _shape_contract(lp: LayerPrecision, m: str, w: TensorInfo, scale: TensorInfo, family: str,
                    findings: Findings) -> None:
    scheme = lp.scheme
    assert scheme is not None
    if len(w.shape) != 2:
        findings.add("error", "weight-shape", f"{m}.weight", f"{m}.weight has shape {list(w.shape)}; a 2-D "
                     "[out, in] weight is expected", "re-export the checkpoint")
        return
    out, cols = w.shape
    s = tuple(scale.shape)
    if family == "fp8":
        if scheme.weight_qscheme == "per_channel":
            ok, want = s in ((out,), (out, 1)), f"[{out}] or [{out}, 1] (per-channel)"
        elif scheme.weight_qscheme == "per_tensor":
            ok, want = len(s) <= 1 and (not s or s[0] == 1), "a scalar or [1] (per-tensor)"
        else:
            bo, bi = scheme.block_size or (128, 128)
            want_shape = (-(-out // bo), -(-cols // bi))
            ok, want = s == want_shape, f"{list(want_shape)} (per-block {bo}x{bi})"
        if not ok:
            findings.add("error", "scale-shape", f"{m}.weight_scale",
                         f"{m}.weight_scale has shape {list(s)}; {lp.precision} needs {want}", "re-export the layer")
    elif family == "mxfp4":
        in_dim = cols * 2 if w.dtype == "U8" else cols
        if in_dim % MXFP4_GROUP:
            findings.add("error", "weight-shape", f"{m}.weight",
                         f"{m}.weight unpacks to input dim {in_dim}, not a multiple of the MXFP4 group of 32",
                         "MXFP4 needs input dims divisible by 32: keep this layer BF16")
        elif s != (out, in_dim // MXFP4_GROUP):
            findings.add("error", "scale-shape", f"{m}.weight_scale",
                         f"{m}.weight_scale has shape {list(s)}; MXFP4 weight {list(w.shape)} (uint8 [out, in/2], "
                         f"in={in_dim}) needs E8M0 scales [{out}, {in_dim // MXFP4_GROUP}] ([out, in/32])",
                         "re-export the layer (weights packed two per byte, low nibble first; one scale per 32)")


def _parallel_style(layer: LayerPrecision) -> str:
    if layer.kind == "moe":
        return "moe"
    last = layer.name.rsplit(".", 1)[-1]
    if last in ROW_PARALLEL:
        return "row"
    if last in REPLICATED:
        return "replicated"
    return "column"


def _num_kv_heads(config: dict[str, Any]) -> int | None:
    raw_layer_cfg = config.get("transformer_layer_config")
    layer_cfg: dict[str, Any] = raw_layer_cfg if isinstance(raw_layer_cfg, dict) else config
    n = layer_cfg.get("num_key_value_heads") or layer_cfg.get("num_attention_heads")
    return n if isinstance(n, int) and n > 0 else None


def _tp_contract(ck: LoadedCheckpoint, lp: LayerPrecision, modules: dict[str, list[tuple[str, TensorInfo]]],
                 tp: int, findings: Findings) -> None:
    """Per-TP-shard sizes of one quantized layer (quark_ocp_mx.py create_weights: input per partition % 32;
    quark_moe.py QuarkOCP_MX_MoEMethod: scales [.., intermediate_per_partition // 32]; linear.py splits)."""
    scheme = lp.scheme
    assert scheme is not None
    family = scheme.family
    style = _parallel_style(lp)
    weights = {m: dict(modules.get(m, [])).get(f"{m}.weight") for m in lp.checkpoint_modules}
    all_dims = {m: _weight_dims(w, family) for m, w in weights.items() if w is not None}
    dims = {m: d for m, d in all_dims.items() if d is not None}
    if not dims:
        return
    mx = family == "mxfp4"
    if style == "moe":
        # gate/up (w13): [I, H], column-split on I; down (w2): [H, I], row-split on I (fused_moe/layer.py).
        inter = sorted({d[0] for m, d in dims.items() if m.endswith(("gate_proj", "up_proj", "w1", "w3"))} |
                       {d[1] for m, d in dims.items() if m.endswith(("down_proj", "w2"))})
        for i in inter:
            if i % tp:
                findings.add("error", "tp-indivisible", lp.name,
                             f"expert intermediate size {i} is not divisible by --tp {tp}",
                             "use a TP size that divides it, or expert parallelism")
            elif mx and (i // tp) % MXFP4_GROUP:
                findings.add("error", "tp-mxfp4-group", lp.name,
                             f"at --tp {tp} each shard of the experts' down_proj gets {i // tp} input columns "
                             f"({i}/{tp}), not a multiple of the MXFP4 group of 32: one E8M0 scale would span two "
                             "shards (quark_moe.py QuarkOCP_MX_MoEMethod.create_weights allocates "
                             "intermediate_size_per_partition // 32 scales)",
                             f"use --tp {_largest_tp(i, tp)} or lower, or expert parallelism, or keep experts "
                             "in a format without 32-wide groups")
        return
    kv_heads = _num_kv_heads(ck.config)
    for m, (out, in_dim) in dims.items():
        if style == "row":
            if in_dim % tp:
                findings.add("error", "tp-indivisible", lp.name,
                             f"{m} input dim {in_dim} (row-parallel: split across TP) is not divisible by --tp {tp}",
                             "use a TP size that divides it")
            elif mx and (in_dim // tp) % MXFP4_GROUP:
                findings.add("error", "tp-mxfp4-group", lp.name,
                             f"at --tp {tp} each shard of {m} gets input dim {in_dim // tp}, not divisible by the "
                             "MXFP4 group of 32 (quark_ocp_mx.py create_weights raises ValueError)",
                             f"use --tp {_largest_tp(in_dim, tp)} or lower, or keep this layer BF16")
        else:
            if mx and in_dim % MXFP4_GROUP:
                continue  # reported by the shape check
            if style == "column" and out % tp:
                kv = m.endswith(("k_proj", "v_proj")) and kv_heads and tp % kv_heads == 0
                if not kv:
                    findings.add("error", "tp-indivisible", lp.name,
                                 f"{m} output dim {out} (column-parallel: split across TP) is not divisible by "
                                 f"--tp {tp}", "use a TP size that divides it")
            if scheme.weight_qscheme == "per_block" and style == "column" and (out // tp) % (scheme.block_size or
                                                                                            (128,))[0]:
                findings.add("error", "tp-indivisible", lp.name,
                             f"{m} output dim per shard {out // tp} is not a multiple of the FP8 block "
                             f"{scheme.block_size}", "use a smaller TP size")


def _largest_tp(dim: int, tp: int) -> int:
    for t in range(tp, 0, -1):
        if dim % t == 0 and (dim // t) % MXFP4_GROUP == 0:
            return t
    return 1


