"""GLM-4.7-Flash targets (Glm4MoeLiteForCausalLM): DeepSeek-V3's MLA layout (quantkit.naming.archs.deepseek_v3)
with GLM-4.5's MoE block, MTP layers dropped."""

from __future__ import annotations

from quantkit.naming.archs.deepseek_v3 import deepseek_v3_layers
from quantkit.naming.archs.glm4_moe import GLM_KEYS, GLM_ROUTER
from quantkit.naming.family import Family, MoeLayout

SOURCE = "vllm/model_executor/models/glm4_moe_lite.py"

# vllm/model_executor/models/glm4_moe_lite.py: Glm4MoeLiteDecoderLayer builds Glm4MoeLiteMLAAttention
# (= deepseek_v2.DeepseekV2MLAAttention: fused_qkv_a_proj when q_lora_rank is set, q_b_proj, kv_b_proj, o_proj) and,
# for i >= first_k_dense_replace with i % moe_layer_freq == 0, Glm4MoeLite (= glm4_moe.Glm4MoE: `mlp.gate` a GateLinear
# without quant_config, `mlp.shared_experts`, `mlp.experts`), else Glm4MoeLiteMLP. Glm4MoeLiteForCausalLM is not
# SupportsQuant; its packed_modules_mapping {gate_up_proj} gets fused_qkv_a_proj in __init__ (the class dict the
# quant config holds by reference), exactly as DeepseekV2ForCausalLM. load_weights skips the MTP layers
# (get_spec_layer_idx_from_weight_name: model.layers.<num_hidden_layers + k>), which glm4_moe_lite_mtp.py loads.
# No `exclude` entry for the MTP draft (mtp_exclude None): vLLM 0.32's hf_config_override (vllm/config/speculative.py,
# Glm4MoeLiteForCausalLM) sets the draft config's num_hidden_layers to 0, so Glm4MoeLiteMultiTokenPredictor builds its
# layers at model.layers.<k> (glm4_moe_lite_mtp.py:164-176) and get_spec_layer_idx_from_weight_name, numbering from 0,
# hands it the TARGET's layer k tensors, not the MTP layer's: the draft's names are target layers' names, which an
# MTP entry must not exclude, and its weights are the target's as quantized.
FAMILY = Family(
    "glm4_moe_lite", ("Glm4MoeLiteForCausalLM",), SOURCE,
    lambda c, k, t: deepseek_v3_layers(c, k, t, source=SOURCE),
    quark_templates={"glm4_moe_lite": "glm4_moe_lite"},
    # glm4_moe_lite.py Glm4MoeLite(Glm4MoE): the GLM-4.5 MoE block, so its router
    moe=MoeLayout(("n_routed_experts",), router=GLM_ROUTER), config_keys=GLM_KEYS,
    mtp_layer_keys=("num_nextn_predict_layers",),
)  # fmt: skip
