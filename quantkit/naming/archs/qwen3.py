"""Qwen3 dense targets (Qwen3ForCausalLM): Llama's dense layout (quantkit.naming.archs.llama), its own vLLM file."""

from __future__ import annotations

from quantkit.naming.archs.llama import dense_layers
from quantkit.naming.family import Family

SOURCE = "vllm/model_executor/models/qwen3.py"

FAMILY = Family("qwen3", ("Qwen3ForCausalLM",), SOURCE, lambda c, k, t: dense_layers(c, k, t, source=SOURCE),
                quark_templates={"qwen3": "qwen3"})  # fmt: skip
