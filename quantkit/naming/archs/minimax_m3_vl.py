"""MiniMax-M3 as released (MiniMaxM3SparseForConditionalGeneration, model_type minimax_m3_vl; also its MXFP8 release):
the text model (quantkit.naming.archs.minimax_m3) under `language_model.`, and a vision tower kept BF16."""

from __future__ import annotations

from quantkit.naming.family import Family, Wrapper

SOURCE = "vllm/models/minimax_m3/nvidia/model.py"

# MiniMaxM3SparseForConditionalGeneration.__init__ builds `vision_tower` (MiniMaxVLVisionModel, WITH quant_config) and
# `language_model` = init_vllm_registered_model(hf_config=config.text_config, prefix="language_model",
# architectures=["MiniMaxM3SparseForCausalLM"]): the checkpoint's `language_model.model.layers.N.*` and
# `language_model.lm_head` are the text model's names under that prefix. Its hf_to_vllm_mapper moves
# `multi_modal_projector.` and `patch_merge_mlp.` under `vision_tower.` and renames `.mlp.fc1.` / `.mlp.fc2.` to
# `.fc1.` / `.fc2.`. Quark 0.13 has a `minimax_m3_vl` template (quark/torch/quantization/config/template.py).
FAMILY = Family(
    "minimax_m3_vl", ("MiniMaxM3SparseForConditionalGeneration",), SOURCE, None,
    quark_templates={"minimax_m3_vl": "minimax_m3_vl"},
    # Quark's minimax_m3_vl template's KV patterns `*language_model.*k_proj` / `*v_proj` also match the MSA indexer's
    # `index_k_proj` (quantkit.naming.archs.minimax_m3 says what that does); these name attention's k/v only, and
    # still not the vision tower's `self_attn.k_proj`. As with the template's own patterns, the middle wildcard
    # defeats the k/v pairing of Quark's find_patterns_groups (it replaces the pattern's literal text in the name),
    # which this record does not change.
    quark_kv_layers=("*language_model.*self_attn.k_proj", "*language_model.*self_attn.v_proj"),
    wrapper=Wrapper(
        "language_model.", ("vision_tower.", "multi_modal_projector.", "patch_merge_mlp."),
        (("multi_modal_projector.", "vision_tower.multi_modal_projector."),
         ("patch_merge_mlp.", "vision_tower.patch_merge_mlp."), (".mlp.fc1", ".fc1"), (".mlp.fc2", ".fc2")),
        {"minimax_m3": "MiniMaxM3SparseForCausalLM"},
    ),
)  # fmt: skip
