"""Qwen3.5 / Qwen3.6 dense (Qwen3_5ForConditionalGeneration, model_type qwen3_5, e.g. Qwen3.6-27B): Qwen3.5-MoE's
wrapper and hybrid layers (quantkit.naming.archs.qwen3_5_moe: Gated DeltaNet with split in_proj_qkv/z and b/a, gated
full attention, vision tower kept BF16, `mtp.` kept BF16 and excluded for vLLM's MTP draft) with a dense MLP in every
layer."""

from __future__ import annotations

import dataclasses

from quantkit.naming.archs.qwen3_5_moe import FAMILY as QWEN3_5_MOE

# vllm/model_executor/models/qwen3_5.py: Qwen3_5ForConditionalGeneration (Qwen3_5MoeForConditionalGeneration's base
# class: the same hf_to_vllm_mapper with `"mtp.": None`, the same packed_modules_mapping) builds Qwen3_5DecoderLayer,
# whose `mlp` is a Qwen3NextMLP (= qwen2_moe.Qwen2MoeMLP: gate_up_proj, down_proj WITH quant_config) where the text
# config's model_type is "qwen3_5_text", and Qwen3NextSparseMoeBlock only for "qwen3_5_moe_text". The layer builder
# (qwen3_next.hybrid_layers) gives a layer the dense MLP when the config has no experts (num_experts absent), which is
# what a qwen3_5_text config is. qwen3_5_mtp.py builds the MTP draft from the same decoder layer: its dense MLP
# is named mtp.layers.0.mlp.*, covered by the same `re:mtp\.` exclusion. Quark 0.13 has a `qwen3_5` template.
FAMILY = dataclasses.replace(
    QWEN3_5_MOE, name="qwen3_5", architectures=("Qwen3_5ForConditionalGeneration",),
    quark_templates={"qwen3_5": "qwen3_5"}, moe=None,
)  # fmt: skip
