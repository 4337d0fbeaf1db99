"""Llama dense targets (LlamaForCausalLM): the dense decoder layout that Qwen3 shares."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quantkit.naming.builder import (
    ATTN_SLOTS,
    DENSE_MAP,
    DENSE_MLP_SLOTS,
    CheckpointModules,
    check_layer_range,
    decoder_layer,
    embed_and_head,
    num_layers,
)
from quantkit.naming.family import Family
from quantkit.naming.layers import RuntimeLayer

SOURCE = "vllm/model_executor/models/llama.py"


# Llama / Qwen3 dense targets: vllm/model_executor/models/llama.py (LlamaForCausalLM, LlamaDecoderLayer,
# LlamaAttention, LlamaMLP) and vllm/model_executor/models/qwen3.py (Qwen3ForCausalLM, Qwen3DecoderLayer; MLP from
# qwen2.py). LlamaForCausalLM is SupportsQuant (mapping merged in SupportsQuant.__new__); Qwen3ForCausalLM is not
# (configure_quant_config in model_loader/utils.py sets it). Both mappings: qkv_proj and gate_up_proj; the
# hf_to_vllm_mapper of both has only stacked maps, which get_rename_mapper drops, so exclude entries are not renamed.
def dense_layers(
    config: Mapping[str, Any], ckpt: CheckpointModules, _target: int | None, *, source: str
) -> list[RuntimeLayer]:
    n = num_layers(config, "model")
    embed, head = embed_and_head(ckpt, config, source)
    out = [embed]
    for i in range(n):
        out += decoder_layer(ckpt, ATTN_SLOTS + DENSE_MLP_SLOTS, f"model.layers.{i}", f"model.layers.{i}", i,
                              DENSE_MAP, source)  # fmt: skip
    check_layer_range(ckpt, "model.layers", n, source)
    return out + [head]


FAMILY = Family("llama", ("LlamaForCausalLM",), SOURCE, lambda c, k, t: dense_layers(c, k, t, source=SOURCE),
                quark_templates={"llama": "llama"})  # fmt: skip
