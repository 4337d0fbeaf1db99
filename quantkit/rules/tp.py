"""Tensor parallelism: per-shard sizes of every quantized layer (MXFP4 scale groups, FP8 blocks, divisibility), and
attention / KV heads against the TP size (vllm/model_executor/layers/linear.py, layers/fused_moe,
quantization/quark/schemes/quark_ocp_mx.py, quark_moe.py; vllm/config/model.py, models/llama.py).

check's per-layer rule (`tp_split`) and deploy's tensor-pattern rule (`check_tp_mxfp4_group`) are both here until
they merge: deploy's reads MXFP4 weights from the headers alone, check's follows the quantization_config vLLM
reads, and merging them changes what deploy reports on a checkpoint without one (check's per-layer rule is to be the one)."""

from __future__ import annotations

import re
from typing import Any

from quantkit.io.config import attention_heads
from quantkit.io.headers import TensorInfo
from quantkit.naming.precision import LoadedCheckpoint
from quantkit.results.check import Finding
from quantkit.results.precision import LayerPrecision
from quantkit.rules.deploy_context import DeployContext, finding
from quantkit.rules.rule import Findings, RuleContext
from quantkit.rules.tensors import mxfp4_weights, weight_dims
from quantkit.schemes.mxfp4 import MXFP4_GROUP

# Tensor parallelism per runtime layer kind (vllm/model_executor/layers/linear.py and the model files).
ROW_PARALLEL = {"o_proj", "down_proj", "w2", "out_proj"}
REPLICATED = {"fc", "gate", "fused_qkv_a_proj", "kv_a_proj_with_mqa", "q_a_proj", "shared_expert_gate"}


def tp_split(ctx: RuleContext, lp: LayerPrecision) -> None:
    """tp-split: one quantized layer's shards at --tp."""
    view = ctx.subject
    if view.replayed and lp.quantized and lp.scheme is not None and not lp.problem:
        _tp_contract(view.loaded, lp, view.modules, ctx.serving.tp, ctx.findings)


def parallel_style(layer: LayerPrecision) -> str:
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


def _tp_contract(
    ck: LoadedCheckpoint,
    lp: LayerPrecision,
    modules: dict[str, list[tuple[str, TensorInfo]]],
    tp: int,
    findings: Findings,
) -> None:
    """Per-TP-shard sizes of one quantized layer (quark_ocp_mx.py create_weights: input per partition % 32;
    quark_moe.py QuarkOCP_MX_MoEMethod: scales [.., intermediate_per_partition // 32]; linear.py splits)."""
    scheme = lp.scheme
    assert scheme is not None
    family = scheme.family
    style = parallel_style(lp)
    weights = {m: dict(modules.get(m, [])).get(f"{m}.weight") for m in lp.checkpoint_modules}
    all_dims = {m: weight_dims(w, family) for m, w in weights.items() if w is not None}
    dims = {m: d for m, d in all_dims.items() if d is not None}
    if not dims:
        return
    mx = family == "mxfp4"
    if style == "moe":
        # gate/up (w13): [I, H], column-split on I; down (w2): [H, I], row-split on I (fused_moe/layer.py).
        inter = sorted(
            {d[0] for m, d in dims.items() if m.endswith(("gate_proj", "up_proj", "w1", "w3"))}
            | {d[1] for m, d in dims.items() if m.endswith(("down_proj", "w2"))}
        )
        for i in inter:
            if i % tp:
                findings.add(
                    "error",
                    "tp-indivisible",
                    lp.name,
                    f"expert intermediate size {i} is not divisible by --tp {tp}",
                    "use a TP size that divides it, or expert parallelism",
                )
            elif mx and (i // tp) % MXFP4_GROUP:
                findings.add(
                    "error",
                    "tp-mxfp4-group",
                    lp.name,
                    f"at --tp {tp} each shard of the experts' down_proj gets {i // tp} input columns "
                    f"({i}/{tp}), not a multiple of the MXFP4 group of 32: one E8M0 scale would span two "
                    "shards (quark_moe.py QuarkOCP_MX_MoEMethod.create_weights allocates "
                    "intermediate_size_per_partition // 32 scales)",
                    f"use --tp {_largest_tp(i, tp)} or lower, or expert parallelism, or keep experts "
                    "in a format without 32-wide groups",
                )
        return
    kv_heads = _num_kv_heads(ck.config)
    for m, (out, in_dim) in dims.items():
        if style == "row":
            if in_dim % tp:
                findings.add(
                    "error",
                    "tp-indivisible",
                    lp.name,
                    f"{m} input dim {in_dim} (row-parallel: split across TP) is not divisible by --tp {tp}",
                    "use a TP size that divides it",
                )
            elif mx and (in_dim // tp) % MXFP4_GROUP:
                findings.add(
                    "error",
                    "tp-mxfp4-group",
                    lp.name,
                    f"at --tp {tp} each shard of {m} gets input dim {in_dim // tp}, not divisible by the "
                    "MXFP4 group of 32 (quark_ocp_mx.py create_weights raises ValueError)",
                    f"use --tp {_largest_tp(in_dim, tp)} or lower, or keep this layer BF16",
                )
        else:
            if mx and in_dim % MXFP4_GROUP:
                continue  # reported by the shape check
            if style == "column" and out % tp:
                kv = m.endswith(("k_proj", "v_proj")) and kv_heads and tp % kv_heads == 0
                if not kv:
                    findings.add(
                        "error",
                        "tp-indivisible",
                        lp.name,
                        f"{m} output dim {out} (column-parallel: split across TP) is not divisible by --tp {tp}",
                        "use a TP size that divides it",
                    )
            if (
                scheme.weight_qscheme == "per_block"
                and style == "column"
                and (out // tp) % (scheme.block_size or (128,))[0]
            ):
                findings.add(
                    "error",
                    "tp-indivisible",
                    lp.name,
                    f"{m} output dim per shard {out // tp} is not a multiple of the FP8 block {scheme.block_size}",
                    "use a smaller TP size",
                )


def _largest_tp(dim: int, tp: int) -> int:
    for t in range(tp, 0, -1):
        if dim % t == 0 and (dim // t) % MXFP4_GROUP == 0:
            return t
    return 1


def _pattern(name: str) -> str:
    """A tensor name with layer / expert numbers replaced by {N}, to report a rule once per kind of layer."""
    return re.sub(r"\.\d+\.", ".{N}.", name)


def check_tp_mxfp4_group(ctx: DeployContext) -> list[Finding]:
    findings: list[Finding] = []
    seen: dict[tuple[str, int], int] = {}
    checkpoints = [("", ctx.target_tensors)] + ([("draft ", ctx.draft_tensors)] if ctx.draft_tensors else [])
    for label, tensors in checkpoints:
        for module, in_dim in sorted(mxfp4_weights(tensors).items()):
            if module.rsplit(".", 1)[-1] not in ROW_PARALLEL:
                continue  # column-parallel and replicated layers split rows or nothing: scale groups stay whole
            key = (label + _pattern(module), in_dim)
            seen[key] = seen.get(key, 0) + 1
    for (where, in_dim), count in seen.items():
        many = f" ({count} tensors)" if count > 1 else ""
        if in_dim % ctx.tp:
            findings.append(
                finding(
                    "tp-mxfp4-group",
                    "error",
                    "tp-indivisible",
                    where,
                    f"MXFP4 input size {in_dim}{many} is not divisible by --tensor-parallel-size "
                    f"{ctx.tp} (row-parallel: the input is split across ranks)",
                    f"use --tensor-parallel-size {_largest_tp(in_dim, ctx.tp)} or lower",
                )
            )
        elif (in_dim // ctx.tp) % MXFP4_GROUP:
            findings.append(
                finding(
                    "tp-mxfp4-group",
                    "error",
                    "tp-mxfp4-group",
                    where,
                    f"at --tensor-parallel-size {ctx.tp} each rank gets {in_dim // ctx.tp} of "
                    f"{in_dim} MXFP4 inputs{many}, not a multiple of the 32-wide scale group: one "
                    "E8M0 scale would span two ranks, and vLLM refuses the shard",
                    f"use --tensor-parallel-size {_largest_tp(in_dim, ctx.tp)} or lower, or expert "
                    "parallelism for MoE experts (--enable-expert-parallel)",
                )
            )
    return findings


def check_tp_heads(ctx: DeployContext) -> list[Finding]:
    out = []
    models = [("target", ctx.target_text)] + ([("draft", ctx.draft_layer)] if ctx.draft_config else [])
    for role, cfg in models:
        heads, kv, _ = attention_heads(cfg)
        if heads and heads % ctx.tp:
            out.append(
                finding(
                    "tp-heads",
                    "error",
                    "tp-attention-heads",
                    f"{role} num_attention_heads",
                    f"the {role} has {heads} attention heads, not divisible by --tensor-parallel-size {ctx.tp}",
                    f"use a --tensor-parallel-size that divides {heads}",
                )
            )
        mla = cfg.get("kv_lora_rank") is not None  # MLA caches one latent per token, replicated on every rank
        if kv and not mla and ((kv >= ctx.tp and kv % ctx.tp) or (kv < ctx.tp and ctx.tp % kv)):
            out.append(
                finding(
                    "tp-heads",
                    "error",
                    "tp-kv-heads",
                    f"{role} num_key_value_heads",
                    f"the {role} has {kv} KV heads and --tensor-parallel-size {ctx.tp}: vLLM needs one "
                    "to divide the other (it splits KV heads, or replicates them when there are fewer "
                    "than ranks)",
                    f"use a --tensor-parallel-size that divides {kv} or is a multiple of it",
                )
            )
    return out
