"""EAGLE-3 draft layouts (Eagle3LlamaForCausalLM, LlamaForCausalLMEagle3): fc, one or more decoder layers numbered
after the target's, lm_head; Eagle3Qwen3ForCausalLM (quantkit.naming.archs.eagle3_qwen3) shares the builder."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quantkit.io.config import draft_config
from quantkit.naming.builder import (
    ATTN_SLOTS,
    DENSE_MLP_SLOTS,
    QKV,
    CheckpointModules,
    Slot,
    check_layer_range,
    decoder_layer,
    require_modules,
)
from quantkit.naming.family import DraftLayout, Family, LayerBuilder
from quantkit.naming.layers import CheckpointLayoutError, MissingTargetLayersError, RuntimeLayer

SOURCE = "vllm/model_executor/models/llama_eagle3.py"


# EAGLE-3 llama draft: vllm/model_executor/models/llama_eagle3.py (Eagle3LlamaForCausalLM, LlamaModel,
# LlamaDecoderLayer). Checkpoint names get "model." prepended unless they contain "lm_head"
# (Eagle3LlamaForCausalLM.load_weights), then "midlayer." -> "layers.0." (LlamaModel.hf_to_vllm_mapper); the decoder
# layers are built with prefix model.layers.{layer_idx + target layer count}. Every layer gets its quant config from
# get_draft_quant_config (vllm/model_executor/models/utils.py), a fresh QuarkConfig from the draft's config.json that
# no SupportsQuant/configure_quant_config ever touches: its packed_modules_mapping stays {} and no exclude rename
# happens. So qkv_proj / gate_up_proj are matched only by their fused names, never through q_proj/... shards.
# Eagle3Qwen3ForCausalLM (qwen3_eagle3.py) is the same except that its replacement qkv_proj is built with
# prefix `model.layers.{N}.qkv_proj` (maybe_prefix(prefix, "qkv_proj") on the decoder layer's prefix, no self_attn).
def eagle3_layers(config: Mapping[str, Any], ckpt: CheckpointModules, target_num_layers: int | None, *, qwen3: bool,
                  source: str, layer_slots: tuple[Slot, ...] | None = None,
                  fused_mapping: Mapping[str, list[str]] | None = None) -> list[RuntimeLayer]:  # fmt: skip
    """The draft's layers; `layer_slots` / `fused_mapping`: another decoder layer than Llama's (the MLA draft's,
    quantkit.naming.archs.eagle3_mla) and the packed_modules_mapping its fused layers expand by."""
    if target_num_layers is None:
        raise MissingTargetLayersError(
            "an EAGLE-3 draft's vLLM layer names depend on its target: pass the target model (or its "
            "num_hidden_layers) along with the draft"
        )
    if isinstance(target_num_layers, bool) or not isinstance(target_num_layers, int) or target_num_layers < 1:
        raise MissingTargetLayersError(
            f"target layer count {target_num_layers!r} is not a positive integer; pass the target's num_hidden_layers"
        )
    draft = draft_config(config)  # a speculators draft nests the llama config; eagle_config at the top or in it
    use_aux = draft.use_aux_hidden_state
    n = draft.num_hidden_layers
    if not isinstance(n, int) or n < 1:
        # Without it transformers' LlamaConfig defaults to 32 and vLLM would build 32 draft layers.
        raise CheckpointLayoutError(
            f"draft config.json has num_hidden_layers={n!r}; set it to the draft's decoder layer count (usually 1)"
        )
    hint = (
        f"{source} loads drafts saved as fc.weight, midlayer.* or layers.<i>.*, lm_head.weight (no model. prefix); "
        "re-save the draft in that layout"
    )
    out: list[RuntimeLayer] = []
    if ckpt.has("embed_tokens"):  # optional: without it vLLM shares the target's embedding
        out.append(RuntimeLayer("model.embed_tokens", "embedding", "embed_tokens", (), ckpt.take(["embed_tokens"]),
                                quantizable=False, source=source))  # fmt: skip
    if use_aux:
        require_modules(ckpt, ["fc"], "runtime layer model.fc", source, hint)
        out.append(RuntimeLayer("model.fc", "linear", "fc", (), ckpt.take(["fc"]), source=source))
    elif ckpt.has("fc"):  # load_weights drops fc.* when use_aux_hidden_state is off
        ckpt.take(["fc"])
    qkv_suffix = "qkv_proj" if qwen3 else "self_attn.qkv_proj"
    slots = layer_slots or (
        Slot(qkv_suffix, "fused_linear", "attention", QKV),
        ATTN_SLOTS[1],
        *DENSE_MLP_SLOTS,
    )
    for i in range(n):
        # vLLM rewrites any "midlayer." to "layers.0.", so only layer 0 can come from midlayer.*
        ckpt_prefix = "midlayer" if i == 0 and any(m.startswith("midlayer.") for m in ckpt.params) else f"layers.{i}"
        out += decoder_layer(ckpt, slots, f"model.layers.{target_num_layers + i}", ckpt_prefix,
                              target_num_layers + i, fused_mapping or {}, source, hint=hint)  # fmt: skip
    check_layer_range(ckpt, "layers", n, source)
    head = ckpt.take(["lm_head"] if ckpt.has("lm_head") else [])
    out.append(RuntimeLayer("lm_head", "lm_head", "lm_head", (), head, quantizable=False, source=source))
    return out


def eagle3_builder(qwen3: bool, source: str) -> LayerBuilder:
    return lambda c, k, t: eagle3_layers(c, k, t, qwen3=qwen3, source=source)


# Quark quantizes a draft as the Llama-style module quantkit builds for it (apply/quark_engine.py _draft_module), so
# every draft layout takes Quark's llama template, whatever its model_type.
FAMILY = Family("eagle3_llama", ("Eagle3LlamaForCausalLM", "LlamaForCausalLMEagle3"), SOURCE,
                eagle3_builder(False, SOURCE), quark_templates={"*": "llama"},
                draft=DraftLayout(speculators=(("eagle3", "llama"),)))  # fmt: skip
