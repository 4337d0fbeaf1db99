"""GLM-4.5 / GLM-4.6 / GLM-4.7 targets (Glm4MoeForCausalLM): Llama attention with a qkv bias, DeepSeek-style routed
and shared experts behind a sigmoid router with e_score_correction_bias, dense first layers, MTP layers dropped."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quantkit.naming.builder import (
    ATTN_SLOTS,
    DENSE_MAP,
    DENSE_MLP_SLOTS,
    CheckpointModules,
    Slot,
    check_layer_range,
    decoder_layer,
    embed_and_head,
    num_layers,
    skip_layers,
)
from quantkit.naming.family import Family, MoeLayout
from quantkit.naming.layers import RuntimeLayer

SOURCE = "vllm/model_executor/models/glm4_moe.py"

# vllm/model_executor/models/glm4_moe.py (Glm4MoeForCausalLM, Glm4MoeModel, Glm4MoeDecoderLayer, Glm4MoeAttention,
# Glm4MoE, Glm4MoeMLP):
# - attention: `self_attn.qkv_proj` (QKVParallelLinear, bias=attention_bias) and `self_attn.o_proj`, both WITH
#   quant_config; q_norm / k_norm (use_qk_norm) are RMSNorms;
# - layer i is MoE iff n_routed_experts is set and i >= first_k_dense_replace (no moe_layer_freq here), else a
#   Glm4MoeMLP `mlp.gate_up_proj` / `mlp.down_proj`;
# - Glm4MoE: `mlp.gate` is a GateLinear built WITHOUT quant_config (vLLM never quantizes it; its
#   e_score_correction_bias is a parameter of the gate), `mlp.shared_experts` a Glm4MoeMLP WITH quant_config,
#   `mlp.experts` the FusedMoE. With ROCm AITER fused shared experts the shared experts fold into mlp.experts
#   (resolve_layer_fused_shared_expert); modelled without;
# - Glm4MoeForCausalLM is not SupportsQuant: configure_quant_config hands the quant config its packed_modules_mapping
#   {qkv_proj, gate_up_proj}; its hf_to_vllm_mapper lives on Glm4MoeModel (stacked maps only), so `exclude` entries
#   are not renamed;
# - the MTP layers model.layers.<num_hidden_layers + k> (k < num_nextn_predict_layers) are dropped by
#   Glm4MoeModel.load_weights (skip_spec_layers, models/utils.py get_spec_layer_idx_from_weight_name); they are
#   loaded by glm4_moe_mtp.py when serving with MTP speculation, not by the target.
MOE_SLOTS = (
    Slot("mlp.gate", "router", "router", ("mlp.gate",), quantizable=False),
    Slot("mlp.shared_experts.gate_up_proj", "fused_linear", "shared_experts",
         ("mlp.shared_experts.gate_proj", "mlp.shared_experts.up_proj")),
    Slot("mlp.shared_experts.down_proj", "linear", "shared_experts", ("mlp.shared_experts.down_proj",)),
    Slot("mlp.experts", "moe", "experts", ("mlp.experts",)),
)  # fmt: skip


def glm4_moe_layers(config: Mapping[str, Any], ckpt: CheckpointModules, _target: int | None) -> list[RuntimeLayer]:
    n = num_layers(config, "model")
    routed = config.get("n_routed_experts") is not None
    first_dense = config.get("first_k_dense_replace", 0) or 0
    shared = config.get("n_shared_experts") is not None
    moe = MOE_SLOTS if shared else tuple(s for s in MOE_SLOTS if s.role != "shared_experts")
    embed, head = embed_and_head(ckpt, config, SOURCE)
    out = [embed]
    for i in range(n):
        mlp = moe if routed and i >= first_dense else DENSE_MLP_SLOTS
        out += decoder_layer(ckpt, ATTN_SLOTS + mlp, f"model.layers.{i}", f"model.layers.{i}", i, DENSE_MAP, SOURCE)
    mtp = config.get("num_nextn_predict_layers", 0) or 0
    check_layer_range(ckpt, "model.layers", n, SOURCE, extra=mtp)
    skip_layers(ckpt, "model.layers", n)
    return out + [head]


FAMILY = Family(
    "glm4_moe", ("Glm4MoeForCausalLM",), SOURCE, glm4_moe_layers,
    model_types=("glm4_moe",), quark_templates={"glm4_moe": "glm4_moe"},
    moe=MoeLayout(("n_routed_experts",),
                  shared_experts=("mlp.shared_experts.gate_up_proj", "mlp.shared_experts.down_proj")),
    mtp_layer_keys=("num_nextn_predict_layers",),
)  # fmt: skip
