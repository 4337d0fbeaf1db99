"""MLA EAGLE-3 drafts (Eagle3DeepseekV2ForCausalLM, Eagle3DeepseekV3ForCausalLM: the Kimi-K2.5 / K3 drafts): fc, one
DeepSeek decoder layer with MLA attention and a dense MLP numbered after the target's layers, lm_head, d2t/t2d."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quantkit.naming.archs.deepseek_v3 import decoder_slots
from quantkit.naming.archs.eagle3_llama import eagle3_layers
from quantkit.naming.builder import CheckpointModules
from quantkit.naming.family import DraftLayout, Family
from quantkit.naming.layers import RuntimeLayer

SOURCE = "vllm/model_executor/models/deepseek_eagle3.py"

# vLLM's registry maps Eagle3DeepseekV2ForCausalLM and Eagle3DeepseekV3ForCausalLM to deepseek_eagle3.py
# Eagle3DeepseekV2ForCausalLM: `model` a DeepseekV2Eagle3Model with `layers.{target_layers + i}` (start_layer_id =
# the target's layer count), `fc` a ReplicatedLinear WITH the draft's quant config (get_draft_quant_config), and
# `lm_head`. Each layer (DeepseekV2Eagle3DecoderLayer) is `self_attn` a DeepseekV2MLAAttention (with q_lora_rank:
# `fused_qkv_a_proj` merging the checkpoint's q_a_proj and kv_a_proj_with_mqa, `q_b_proj`; without it `q_proj` and
# `kv_a_proj_with_mqa`; then `kv_b_proj`, `o_proj`) and `mlp` a DeepseekV2MLP (gate_up_proj, down_proj): "Always uses
# MLP (not MoE)", whatever expert keys the draft's config copies from its target. Its hf_to_vllm_mapper renames
# `midlayer.` -> `layers.0.` and stacks .q_a_proj / .kv_a_proj_with_mqa into .fused_qkv_a_proj (shards 0, 1) and
# .gate_proj / .up_proj into .gate_up_proj; load_weights prefixes `model.` to every name but lm_head and d2t, maps d2t
# to draft_id_to_target_id and drops t2d. The class's __init__ does not run DeepseekV2ForCausalLM.__init__, whose
# `self.packed_modules_mapping["fused_qkv_a_proj"] = [...]` mutates the dict the class shares with it: the entry is
# there once the DeepSeek/Kimi target (built first, in the same process) ran it, so exclusions expand the fused layer
# to its two shards as for the target.


def eagle3_mla_layers(config: Mapping[str, Any], ckpt: CheckpointModules, target: int | None) -> list[RuntimeLayer]:
    dense = {k: v for k, v in config.items() if k != "n_routed_experts"}  # the draft layer is never MoE
    slots, mapping = decoder_slots(dense)(0)
    return eagle3_layers(config, ckpt, target, qwen3=False, source=SOURCE, layer_slots=slots, fused_mapping=mapping)


FAMILY = Family(
    "eagle3_mla", ("Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM"), SOURCE, eagle3_mla_layers,
    # Quark's deepseek_v3 / kimi_k2 templates name the target's MoE layers; the draft is a DeepSeek dense layer
    quark_templates={"*": "deepseek_v3"}, draft=DraftLayout(),
)  # fmt: skip
