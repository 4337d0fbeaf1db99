"""Qwen3.5 MoE (Qwen3_5MoeForConditionalGeneration): Qwen3-Next's hybrid MoE language model (quantkit.naming.archs.
qwen3_next) with split linear-attention projections under `model.language_model.`, a vision tower kept BF16, and MTP
weights under `mtp.` kept BF16 as stored and excluded for vLLM's MTP draft (`re:mtp\\.`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from quantkit.io.formats import FusedLayout
from quantkit.naming.archs.qwen3_next import (
    MTP_EXCLUDE,
    QWEN3_NEXT_KEYS,
    QWEN3_NEXT_ROUTER,
    drop_prefix,
    hybrid_layers,
    mtp_draft_layers,
)
from quantkit.naming.builder import CheckpointModules, Slot
from quantkit.naming.family import Family, MoeLayout
from quantkit.naming.layers import VISION_ROLE, CheckpointLayoutError, RuntimeLayer

SOURCE = "vllm/model_executor/models/qwen3_5.py"

# vllm/model_executor/models/qwen3_5.py (Qwen3_5MoeForConditionalGeneration -> Qwen3_5MoeForCausalLM ->
# Qwen3_5Model(Qwen3NextModel), Qwen3_5DecoderLayer(Qwen3NextDecoderLayer)); vision tower qwen3_vl.py
# Qwen3_VisionTransformer:
# - the language model is built with prefix "language_model": runtime names language_model.model.layers.N.* and
#   language_model.lm_head; the vision tower with prefix "visual", WITH the quant config (so it must be excluded);
# - Qwen3VLForConditionalGeneration.hf_to_vllm_mapper (inherited) renames model.language_model. ->
#   language_model.model., model.visual. -> visual., lm_head. -> language_model.lm_head., and Qwen3_5's adds
#   mtp. -> None (MTP weights, loaded by qwen3_5_mtp.py); the class is not SupportsQuant, so configure_quant_config
#   applies these renames to `exclude` too (not the None: get_rename_mapper drops it);
# - the MTP block (mtp.fc, mtp.layers.0.*, its experts per expert in Qwen3.5 releases and fused in Qwen3.6's) is no
#   target layer; the output keeps it BF16 byte for byte (fused experts unsplit: QWEN3_5_FUSED below,
#   stored_prefixes) and MTP_EXCLUDE (qwen3_next.py) excludes it for the MTP draft vLLM builds with this quant config;
# - Qwen3.5's Gated DeltaNet is built with gqa_interleaved_layout=False: in_proj_qkvz is loaded from the checkpoint's
#   in_proj_qkv + in_proj_z, in_proj_ba from in_proj_b + in_proj_a (Qwen3_5Model.hf_to_vllm_mapper), and the
#   packed_modules_mapping (Qwen3_5ForConditionalGeneration) names those shards; everything else as Qwen3-Next
#   (routers without quant_config, conv1d never quantized, shared_expert + shared_expert_gate);
# - routed experts ship fused (experts.gate_up_proj [E, 2I, H], experts.down_proj [E, H, I], not transposed): the
#   `fused-experts` source format (QWEN3_5_FUSED below, decoded by quantkit.io.formats) splits them per expert into the
#   experts.<e>.gate_proj / up_proj / down_proj names vLLM's RoutedExperts.load_weights maps to the same w1 / w3 / w2.
QWEN3_5_MAP = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"],
               "in_proj_qkvz": ["in_proj_qkv", "in_proj_z"], "in_proj_ba": ["in_proj_b", "in_proj_a"]}  # fmt: skip
QWEN3_5_LINEAR_ATTN = (
    Slot("linear_attn.in_proj_qkvz", "fused_linear", "linear_attention",
         ("linear_attn.in_proj_qkv", "linear_attn.in_proj_z")),
    Slot("linear_attn.in_proj_ba", "fused_linear", "linear_attention", ("linear_attn.in_proj_b", "linear_attn.in_proj_a")),
    Slot("linear_attn.conv1d", "linear", "linear_attention", ("linear_attn.conv1d",), quantizable=False),
    Slot("linear_attn.out_proj", "linear", "linear_attention", ("linear_attn.out_proj",)),
)  # fmt: skip
TEXT_CKPT, TEXT_RUNTIME, VISION_CKPT, VISION_RUNTIME = (
    "model.language_model",
    "language_model.model",
    "model.visual.",
    "visual.",
)
# the mapper's prefix renames that configure_quant_config applies to `exclude` entries (replayed as substrings: an
# entry naming a checkpoint module starts with them)
RENAMES = (("model.language_model.", "language_model.model."), ("model.visual.", "visual."))


def qwen3_5_moe_layers(config: Mapping[str, Any], ckpt: CheckpointModules, _target: int | None) -> list[RuntimeLayer]:
    text = config.get("text_config")
    if not isinstance(text, dict):
        raise CheckpointLayoutError(f"{SOURCE}: a Qwen3_5MoeForConditionalGeneration config needs a text_config")
    embed = RuntimeLayer(
        f"{TEXT_RUNTIME}.embed_tokens",
        "embedding",
        "embed_tokens",
        checkpoint_modules=ckpt.take([f"{TEXT_CKPT}.embed_tokens"]),
        quantizable=False,
        source=SOURCE,
    )
    layers = hybrid_layers(text, ckpt, runtime_prefix=f"{TEXT_RUNTIME}.layers", ckpt_prefix=f"{TEXT_CKPT}.layers",
                           linear_attn=QWEN3_5_LINEAR_ATTN, fused_mapping=QWEN3_5_MAP, source=SOURCE)  # fmt: skip
    tied = text.get("tie_word_embeddings", config.get("tie_word_embeddings", False))
    if not ckpt.has("lm_head") and not tied:
        raise CheckpointLayoutError(
            f"checkpoint has no tensors for lm_head ({SOURCE} loads it as "
            "language_model.lm_head); check that config.json belongs to these weights"
        )
    head = RuntimeLayer("language_model.lm_head", "lm_head", "lm_head",
                        checkpoint_modules=ckpt.take(["lm_head"] if ckpt.has("lm_head") else []), quantizable=False,
                        source=SOURCE)  # fmt: skip
    vision = []
    for module in sorted(m for m in ckpt.params if m.startswith(VISION_CKPT)):
        ckpt.used.add(module)
        if "weight" in ckpt.params[module] and "norm" not in module.rsplit(".", 1)[-1]:
            runtime = VISION_RUNTIME + module[len(VISION_CKPT) :]
            vision.append(RuntimeLayer(runtime, "linear", VISION_ROLE, (), (module,), True, None, (), SOURCE))
    drop_prefix(ckpt, "mtp.")
    return [dataclasses.replace(layer, exclude_renames=RENAMES) for layer in (embed, *layers, head, *vision)]


# transformers 5 Qwen3_5MoeExperts: gate_up_proj [E, 2I, H], down_proj [E, H, I], not transposed. vLLM 0.32 loads
# the fused tensors in vllm/model_executor/layers/fused_moe/routed_experts.py RoutedExperts.load_weights: the
# qwen3_next.py Qwen3NextSparseMoeBlock experts are built with is_fused_checkpoint_transposed=False
# (_orient_fused_weight leaves them as stored), w1 (gate) = fused.chunk(2, dim=1)[0] and w3 (up) = [1] (the fused
# entries of build_expert_params_mapping, `expert_id doubles as the chunk index`), w2 = down_proj per expert. The
# same function maps per-expert `experts.<e>.gate_proj / up_proj / down_proj.weight` (ckpt names gate_proj,
# down_proj, up_proj) to the same w1 / w3 / w2 of expert e: the names written here. Quark 0.13's qwen3_5_moe
# template splits the same way (template.py f2f_weight_converters, weight_convert.py SplitFusedExperts:
# torch.chunk(expert, 2, dim=0) -> gate, up).
# The MTP block's experts (mtp.layers.0.mlp.experts.*: fused in Qwen3.6 releases, per expert in Qwen3.5's) are
# kept as stored: the target never loads them (qwen3_5.py hf_to_vllm_mapper `"mtp.": None`), MTP tensors are
# kept BF16, and vLLM's MTP model loads the fused tensors with the same RoutedExperts.load_weights
# (qwen3_5_mtp.py Qwen3_5MultiTokenPredictor builds Qwen3_5DecoderLayer, hence Qwen3NextSparseMoeBlock experts,
# and load_weights renames mtp. -> model.), so splitting them would only change the bytes.
QWEN3_5_FUSED = FusedLayout("qwen3_5_moe", {
    ".mlp.experts.gate_up_proj": (("gate_proj", "weight", "first half"), ("up_proj", "weight", "second half")),
    ".mlp.experts.down_proj": (("down_proj", "weight", "all"),),
}, transposed=False, experts_key="num_experts", stored_prefixes=("mtp.",))  # fmt: skip


FAMILY = Family(
    "qwen3_5_moe", ("Qwen3_5MoeForConditionalGeneration",), SOURCE, qwen3_5_moe_layers,
    quark_templates={"qwen3_5_moe": "qwen3_5_moe"},
    # qwen3_5.py builds Qwen3NextSparseMoeBlock: Qwen3-Next's router
    moe=MoeLayout(("num_experts",), router=QWEN3_NEXT_ROUTER, fused=(QWEN3_5_FUSED,)), mtp_prefix="mtp.",
    config_keys=QWEN3_NEXT_KEYS,
    exclude_renames=RENAMES, mtp_exclude=lambda _c, _names: MTP_EXCLUDE, mtp_draft_layers=mtp_draft_layers,
)  # fmt: skip
