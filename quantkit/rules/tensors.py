"""Tensors against what vLLM builds for each layer: weight and scale dtypes and shapes per scheme, quantized tensors
where vLLM loads BF16 (routers, lm_head, excluded layers), and weight files the index leaves out
(vllm/model_executor/layers/quantization/quark/schemes/quark_w8a8_fp8.py and quark_ocp_mx.py create_weights,
quark_moe.py, vllm/model_executor/layers/linear.py UnquantizedLinearMethod, models/llama_eagle3.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from quantkit.io.headers import INDEX_FILE, TensorInfo, unindexed_weight_files
from quantkit.io.safetensors import FLOAT_DTYPES
from quantkit.naming.precision import LoadedCheckpoint
from quantkit.results.precision import LayerPrecision
from quantkit.rules.rule import Findings, RuleContext
from quantkit.schemes.mxfp4 import MXFP4_GROUP

QUANTIZED_DTYPES = {"F8_E4M3", "F8_E5M2", "F8_E8M0", "U8", "I8", "F4", "F6_E2M3", "F6_E3M2", "I32"}
# Dtypes vLLM's schemes take for the weight and the weight scale, per scheme family.
WEIGHT_DTYPES = {"fp8": {"F8_E4M3"}, "mxfp4": {"U8", "F4"}, "int8": {"I8"}}
SCALE_DTYPES = {"fp8": {"F32", "BF16", "F16"}, "mxfp4": {"U8", "F8_E8M0"}, "int8": {"F32", "BF16", "F16"}}
# Relative Frobenius error of a dequantized weight against its source above which --numeric reports an error.
NUMERIC_BOUNDS = {"fp8": 0.08, "mxfp4": 0.3}


def unindexed_files(ctx: RuleContext) -> None:
    """unindexed-weight-file: *.safetensors files the index does not name."""
    stray = unindexed_weight_files(ctx.subject.path)
    if stray:
        shown = ", ".join(stray[:3]) + (f" and {len(stray) - 3} more" if len(stray) > 3 else "")
        ctx.findings.add(
            "warning",
            "unindexed-weight-file",
            stray[0],
            f"{INDEX_FILE} does not name {shown}: vLLM skips such files "
            "(model_loader/weight_utils.py filter_duplicate_safetensors_files), but a tool that reads "
            "every *.safetensors file of the folder loads their tensors as well",
            "remove them, or regenerate the index if they hold weights of this model",
        )


def layer_tensors(ctx: RuleContext, lp: LayerPrecision) -> None:
    """layer-tensors: the tensors of one runtime layer against what vLLM builds for it."""
    # imported here: quantkit.rules.exclude reads this module's dtype sets
    from quantkit.rules.exclude import exclude_fix

    view = ctx.subject
    if not view.replayed:
        return
    ck = view.loaded
    _layer_contract(
        ck,
        lp,
        view.runtime_layers[lp.name],
        view.modules,
        ctx.findings,
        lambda extra: exclude_fix(ck, view.layers, extra),
        view.quantized_routers,
    )


def weight_dims(info: TensorInfo, family: str | None) -> tuple[int, int] | None:
    if len(info.shape) != 2:
        return None
    out, cols = info.shape
    return (out, cols * 2) if family == "mxfp4" and info.dtype == "U8" else (out, cols)


def _layer_contract(
    ck: LoadedCheckpoint,
    lp: LayerPrecision,
    layer: Any,
    modules: dict[str, list[tuple[str, TensorInfo]]],
    findings: Findings,
    exclude_fix: Callable[[set[str]], str],
    routers: set[str],
) -> None:
    """Tensors of one layer against what vLLM will build for it."""
    if (
        lp.source == "unsupported_scheme"
        and lp.entry is None
        and ck.qc is not None
        and ck.qc.get("global_quant_config") is None
        and "global_quant_config" not in ck.qc
    ):
        return  # reported once as the missing key
    if lp.problem and lp.source in ("fused_config_mismatch", "unsupported_scheme"):
        code = "fused-config-mismatch" if lp.source == "fused_config_mismatch" else "unsupported-scheme"
        findings.add(
            "error",
            code,
            lp.name,
            lp.reason,
            "give the layer a config vLLM supports (see quark.py _get_scheme_cls_from_config), or exclude it",
        )
        return
    if lp.source in ("partial_fused_exclusion", "invalid_exclude"):
        return  # reported with the exclude list
    if any(f.layer_or_tensor == lp.name and f.code == "exclude-not-applied" for f in findings):
        return  # its tensors are described in that finding
    params = {m: dict(modules.get(m, [])) for m in lp.checkpoint_modules}
    quantized_tensors = sorted(
        t
        for m, ps in params.items()
        for t, i in ps.items()
        if i.dtype in QUANTIZED_DTYPES
        and not t.endswith((".bias",))
        or t.endswith((".weight_scale", ".weight_scale_inv"))
    )
    if lp.role == "router" and (lp.quantized or quantized_tensors):
        why = (
            f"vLLM quantizes it as {lp.precision} ({lp.reason})"
            if lp.quantized
            else f"its tensors are quantized ({', '.join(quantized_tensors[:3])}) but vLLM loads it unquantized"
        )
        findings.add(
            "error",
            "router-quantized",
            lp.name,
            f"router {lp.name} is quantized: {why}; router logits pick the experts, and a quantized router "
            "changes routing (and a BF16 tensor read as quantized is garbage)",
            f"keep routers BF16: {exclude_fix(routers)}"
            if lp.quantized
            else "re-export with the router unquantized (Quark exclude: its checkpoint module)",
        )
        return
    if not lp.quantized:
        if quantized_tensors:
            if lp.role == "lm_head":
                return  # rule lm-head-quantized (lm_head_quantized below), ranged by vLLM version
            else:
                why = (
                    "vLLM never quantizes this kind of layer"
                    if lp.source == "never_quantized"
                    else f"vLLM loads it unquantized ({lp.reason})"
                )
                fix = (
                    "re-export it unquantized"
                    if lp.source == "never_quantized"
                    else "remove it from exclude so vLLM loads it quantized, or re-export it unquantized"
                )
                findings.add(
                    "error",
                    "unexpected-quantized-tensor",
                    lp.name,
                    f"{lp.name} holds quantized tensors ({', '.join(quantized_tensors[:3])}) but {why}: "
                    "the load fails on the scale tensor or reads quantized bytes as BF16",
                    fix,
                )
        return
    scheme = lp.scheme
    if scheme is None:
        return
    family = scheme.family
    unquantized = [
        f"{m}.weight" for m, ps in params.items() if f"{m}.weight" in ps and ps[f"{m}.weight"].dtype in FLOAT_DTYPES
    ]
    if unquantized:
        findings.add(
            "error",
            "weight-not-quantized",
            lp.name,
            f"vLLM quantizes {lp.name} as {lp.precision} ({lp.reason}) but {', '.join(unquantized[:3])} "
            f"{'is' if len(unquantized) == 1 else 'are'} {_dtype_of(params, unquantized[0])}: vLLM would "
            "read the BF16 bytes as quantized values with uninitialised scales",
            f"keep it unquantized: {exclude_fix({lp.name})}; or re-export the layer quantized",
        )
        return
    expected_w = WEIGHT_DTYPES.get(family)
    for m, ps in params.items():
        w = ps.get(f"{m}.weight")
        if w is None:
            if layer.kind == "moe" and m == layer.checkpoint_modules[0] and not m.split(".")[-1].isdigit():
                continue  # a fused 3-D experts container (transformers v5 layout): checked by dtype only
            findings.add(
                "error",
                "weight-missing",
                f"{m}.weight",
                f"quantized layer {lp.name} has no {m}.weight",
                "re-export the checkpoint",
            )
            continue
        if expected_w and w.dtype not in expected_w:
            findings.add(
                "error",
                "weight-dtype",
                f"{m}.weight",
                f"{m}.weight is {w.dtype}; vLLM's {lp.precision} scheme loads {'/'.join(sorted(expected_w))}",
                "re-export the layer with the scheme in the config (OCP FP8 is F8_E4M3, MXFP4 is U8)",
            )
            continue
        scale = ps.get(f"{m}.weight_scale")
        if scale is None:
            findings.add(
                "error",
                "scale-missing",
                f"{m}.weight_scale",
                f"quantized layer {lp.name} has {m}.weight but no {m}.weight_scale; vLLM keeps its "
                "placeholder scale (float32 min for FP8) and computes garbage",
                "re-export the checkpoint; a scale tensor was dropped",
            )
            continue
        if family in SCALE_DTYPES and scale.dtype not in SCALE_DTYPES[family]:
            findings.add(
                "error",
                "scale-dtype",
                f"{m}.weight_scale",
                f"{m}.weight_scale is {scale.dtype}; {lp.precision} scales are "
                f"{'/'.join(sorted(SCALE_DTYPES[family]))}",
                "re-export the checkpoint",
            )
            continue
        _shape_contract(lp, m, w, scale, family, findings)
        if scheme.static_input and f"{m}.input_scale" not in ps:
            findings.add(
                "error",
                "scale-missing",
                f"{m}.input_scale",
                f"{lp.precision} with static activation scales ({scheme.activations}) needs "
                f"{m}.input_scale, which is missing",
                "re-export with calibration (static input scales)",
            )


def _dtype_of(params: dict[str, dict[str, TensorInfo]], tensor: str) -> str:
    for ps in params.values():
        if tensor in ps:
            return ps[tensor].dtype
    return "?"


def _shape_contract(
    lp: LayerPrecision, m: str, w: TensorInfo, scale: TensorInfo, family: str, findings: Findings
) -> None:
    scheme = lp.scheme
    assert scheme is not None
    if len(w.shape) != 2:
        findings.add(
            "error",
            "weight-shape",
            f"{m}.weight",
            f"{m}.weight has shape {list(w.shape)}; a 2-D [out, in] weight is expected",
            "re-export the checkpoint",
        )
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
            findings.add(
                "error",
                "scale-shape",
                f"{m}.weight_scale",
                f"{m}.weight_scale has shape {list(s)}; {lp.precision} needs {want}",
                "re-export the layer",
            )
    elif family == "mxfp4":
        in_dim = cols * 2 if w.dtype == "U8" else cols
        if in_dim % MXFP4_GROUP:
            findings.add(
                "error",
                "weight-shape",
                f"{m}.weight",
                f"{m}.weight unpacks to input dim {in_dim}, not a multiple of the MXFP4 group of 32",
                "MXFP4 needs input dims divisible by 32: keep this layer BF16",
            )
        elif s != (out, in_dim // MXFP4_GROUP):
            findings.add(
                "error",
                "scale-shape",
                f"{m}.weight_scale",
                f"{m}.weight_scale has shape {list(s)}; MXFP4 weight {list(w.shape)} (uint8 [out, in/2], "
                f"in={in_dim}) needs E8M0 scales [{out}, {in_dim // MXFP4_GROUP}] ([out, in/32])",
                "re-export the layer (weights packed two per byte, low nibble first; one scale per 32)",
            )


def mxfp4_weights(tensors: dict[str, TensorInfo]) -> dict[str, int]:
    """Module name -> unpacked input size of every MXFP4 weight, from headers alone: a U8 `weight` packed two
    values a byte with a U8 / F8_E8M0 `weight_scale` holding one E8M0 scale per 32 inputs
    (quark_ocp_mx.py `create_weights`: weight [out, in/2], scale [out, in/32])."""
    out: dict[str, int] = {}
    for name, info in tensors.items():
        if not name.endswith(".weight") or info.dtype != "U8" or not info.shape:
            continue
        module = name[: -len(".weight")]
        scale = tensors.get(f"{module}.weight_scale")
        if scale is None or scale.dtype not in ("U8", "F8_E8M0") or not scale.shape:
            continue
        in_dim = info.shape[-1] * 2
        if scale.shape[-1] * MXFP4_GROUP == in_dim:
            out[module] = in_dim
    return out


def lm_head_quantized(ctx: RuleContext, lp: LayerPrecision) -> None:
    """lm-head-quantized: an lm_head holding quantized tensors. vLLM builds lm_head as a ParallelLMHead, a
    VocabParallelEmbedding and not a LinearBase, and QuarkConfig.get_quant_method_target gives such a layer no method
    (vllm/model_executor/layers/quantization/quark/quark.py; vocab_parallel_embedding.py ParallelLMHead), so its
    quantized bytes fail to load or load as BF16 values. Ranged in the rule table: lift it (vllm_max) when a vLLM
    release loads one."""
    view = ctx.subject
    if (
        lp.role != "lm_head"
        or lp.quantized
        or not view.replayed
        or lp.source in ("partial_fused_exclusion", "invalid_exclude")
    ):
        return
    if any(f.layer_or_tensor == lp.name and f.code == "exclude-not-applied" for f in ctx.findings):
        return  # its tensors are described in that finding
    quantized = sorted(
        t
        for m in lp.checkpoint_modules
        for t, i in view.modules.get(m, [])
        if i.dtype in QUANTIZED_DTYPES and not t.endswith(".bias") or t.endswith((".weight_scale", ".weight_scale_inv"))
    )
    if quantized:
        ctx.findings.add(
            "error",
            "lm-head-quantized",
            lp.name,
            f"lm_head holds quantized tensors ({', '.join(quantized[:3])}); vLLM builds lm_head as a "
            "ParallelLMHead, which QuarkConfig.get_quant_method gives no method, so a quantized lm_head "
            "fails to load or loads FP8 bytes as BF16 values",
            "re-export with lm_head kept BF16 (exclude lm_head); to cut the lm_head's cost, prune the "
            "draft vocabulary instead",
        )
