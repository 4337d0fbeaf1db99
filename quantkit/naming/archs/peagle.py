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
FAMILY = Family(
    "peagle", ("PEagleDraftModel",), SOURCE, eagle3_builder(False, SOURCE),
    quark_templates={"*": "llama"}, draft=DraftLayout(parallel_drafting=True),
)  # fmt: skip
