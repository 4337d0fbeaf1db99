"""GLM-5 / GLM-5.1 targets (GlmMoeDsaForCausalLM, model_type glm_moe_dsa; AMD ships amd/GLM-5.1-MXFP4): DeepSeek-V3.2's
layout (quantkit.naming.archs.deepseek_v32): MLA with `fused_qkv_a_proj`, the DSA lightning indexer in self_attn,
routed and shared experts, one MTP layer after the decoder layers."""

from __future__ import annotations

import dataclasses

from quantkit.naming.archs.deepseek_v32 import FAMILY as DEEPSEEK_V32

# vLLM's registry maps GlmMoeDsaForCausalLM to vllm/models/deepseek_v32/__init__.py, which builds DeepSeek-V3.2's
# model for it on every platform: on CUDA and ROCm `DeepseekV32ForCausalLM as GlmMoeDsaForCausalLM`, on CPU and XPU
# vllm/model_executor/models/deepseek_v2.py `class GlmMoeDsaForCausalLM(DeepseekV2ForCausalLM): pass`. So the module
# tree, packed_modules_mapping (gate_up_proj, fused_qkv_a_proj), the indexer (index_topk present) and the MTP layer
# skipped by the target's load_weights are DeepSeek-V3.2's; the one GLM difference, `_get_moe_router_dtype` (fp32
# routing for glm_moe_dsa), changes the router's dtype, not its name or quantization (GateLinear without
# quant_config). vLLM's speculative config builds the MTP draft as DeepSeek-V3.2's (vllm/config/speculative.py:
# `use_v32_mtp = hf_config.model_type in ("deepseek_v32", "glm_moe_dsa")`). Quark 0.13 has a `glm_moe_dsa` template
# (quark/torch/quantization/config/template.py).
SOURCE = "vllm/model_executor/models/deepseek_v2.py"

FAMILY = dataclasses.replace(
    DEEPSEEK_V32, name="glm_moe_dsa", architectures=("GlmMoeDsaForCausalLM",), vllm_source=SOURCE,
    quark_templates={"glm_moe_dsa": "glm_moe_dsa"},
)  # fmt: skip
