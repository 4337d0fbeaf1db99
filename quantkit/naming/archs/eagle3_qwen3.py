"""EAGLE-3 Qwen3 draft layout (Eagle3Qwen3ForCausalLM): the Llama draft builder with qkv_proj directly under the
decoder layer (the vLLM comment block is in quantkit.naming.archs.eagle3_llama)."""

from __future__ import annotations

from quantkit.naming.archs.eagle3_llama import eagle3_builder
from quantkit.naming.family import DraftLayout, Family

SOURCE = "vllm/model_executor/models/qwen3_eagle3.py"

# Quark's llama template, as for every draft layout (quantkit.naming.archs.eagle3_llama says why).
FAMILY = Family("eagle3_qwen3", ("Eagle3Qwen3ForCausalLM",), SOURCE, eagle3_builder(True, SOURCE),
                quark_templates={"*": "llama"}, draft=DraftLayout(speculators=(("eagle3", "qwen3"),)))  # fmt: skip
