"""Llama-4 Scout / Maverick (Llama4ForConditionalGeneration): a multimodal wrapper around the Llama-4 text family
(quantkit.naming.archs.llama4_text) under `language_model.`, with the vision tower and projector beside it."""

from __future__ import annotations

from quantkit.naming.family import Family, Wrapper

SOURCE = "vllm/model_executor/models/mllama4.py"

# vllm/model_executor/models/mllama4.py (Llama4ForConditionalGeneration): `language_model` is initialize_model(
# text_config, model_class=Llama4ForCausalLM, prefix="language_model"), so checkpoint and runtime names are
# language_model.model.layers.N.* and language_model.lm_head; `vision_model` (Llama4VisionModel) and
# `multi_modal_projector` are built with quant_config=None: vLLM never quantizes them, whatever `exclude` says, so their
# weights must stay BF16. No hf_to_vllm_mapper renames (load_weights only maps legacy model.* names).
FAMILY = Family(
    "llama4", ("Llama4ForConditionalGeneration",), SOURCE, None,
    quark_templates={"llama4": "llama4"},
    wrapper=Wrapper("language_model.", ("vision_model.", "multi_modal_projector."),
                    text_architecture_by_model_type={"llama4_text": "Llama4ForCausalLM"}, encoders_quantizable=False),
)  # fmt: skip
