"""EAGLE-3 Qwen3 draft layout (Eagle3Qwen3ForCausalLM): the Llama draft builder with qkv_proj directly under the
decoder layer (the vLLM comment block is in quantkit.naming.archs.eagle3_llama)."""

from __future__ import annotations

from quantkit.naming.archs.eagle3_llama import eagle3_builder
from quantkit.naming.family import Family

SOURCE = "vllm/model_executor/models/qwen3_eagle3.py"

FAMILY = Family("eagle3_qwen3", ("Eagle3Qwen3ForCausalLM",), SOURCE, eagle3_builder(True, SOURCE), is_draft=True)
