"""Kimi-K2.5 (KimiK25ForConditionalGeneration): a multimodal wrapper around the DeepSeek-V3 text family, no builder
of its own (the registry delegates to the text family under the wrapper's prefix)."""

from __future__ import annotations

from quantkit.naming.family import Family, Wrapper

SOURCE = "vllm/model_executor/models/kimi_k25.py"


# Multimodal wrappers around a supported text model. Kimi-K2.5: vllm/model_executor/models/kimi_k25.py
# (KimiK25ForConditionalGeneration): `language_model` is a DeepseekV2ForCausalLM built from `text_config` with prefix
# "language_model" (checkpoint tensors language_model.model.layers.*, language_model.lm_head; its
# hf_to_vllm_mapper's language_model.layers. -> language_model.model.layers. is for legacy NVFP4 checkpoints only);
# `vision_tower` (MoonViT) and `mm_projector` are built WITH the quant config for Quark checkpoints
# (_maybe_ignore_quant_config drops it only for compressed-tensors), so they must be excluded to stay BF16; the
# mapper renames mm_projector.proj.0/2 to mm_projector.linear_1/2.
FAMILY = Family(
    "kimi_k25", ("KimiK25ForConditionalGeneration",), SOURCE, None,
    quark_templates={"kimi_k25": "kimi_k25"},
    wrapper=Wrapper(
        "language_model.", ("vision_tower.", "mm_projector."),
        (("mm_projector.proj.0", "mm_projector.linear_1"), ("mm_projector.proj.2", "mm_projector.linear_2")),
        # a text_config without architectures: the text model vLLM builds from its model_type
        {"deepseek_v3": "DeepseekV3ForCausalLM", "kimi_k2": "DeepseekV3ForCausalLM"},
    ),
)  # fmt: skip
