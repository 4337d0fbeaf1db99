"""DeepSeek-V3.2 targets (DeepseekV32ForCausalLM): DeepSeek-V3's layout (quantkit.naming.archs.deepseek_v3) plus the
lightning indexer of DeepSeek Sparse Attention in every layer's self_attn."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from quantkit.io.config import PositiveInt
from quantkit.naming.archs.deepseek_v3 import (
    DEEPSEEK_KEYS,
    DEEPSEEK_ROUTER,
    MTP_KEYS,
    deepseek_v3_layers,
    deepseek_v3_mtp_draft_layers,
    mtp_exclude,
)
from quantkit.naming.builder import CheckpointModules, Slot
from quantkit.naming.family import Family, MoeLayout
from quantkit.naming.layers import RuntimeLayer

SOURCE = "vllm/model_executor/models/deepseek_v2.py"

# vLLM's registry maps DeepseekV32ForCausalLM to vllm/models/deepseek_v32/__init__.py, which picks
# nvidia/model.py (CUDA), amd/model.py (ROCm) or, on CPU and XPU, deepseek_v2.DeepseekV3ForCausalLM; all are
# DeepseekV2ForCausalLM subclasses with its packed_modules_mapping (gate_up_proj, fused_qkv_a_proj) and the same
# module tree. The indexer (deepseek_v2.py Indexer; deepseek_v32/attention.py DeepseekV32Indexer) sits at
# `self_attn.indexer` in every layer whose IndexCache rule does not skip it (deepseek_v2.py DeepseekV2MLAAttention:
# index_topk present; index_topk_pattern "S" or index_topk_freq / index_skip_topk_offset skip a layer):
# - `indexer.wq_b`: ReplicatedLinear WITH quant_config: vLLM quantizes it unless excluded;
# - `indexer.wk_weights_proj`: MergedColumnParallelLinear of the checkpoint's `indexer.wk` and `indexer.weights_proj`
#   (load_weights' stacked_params_mapping), built with quant_config=None: never quantized; the fused name is in no
#   packed_modules_mapping, so vLLM expands no shards for it;
# - `indexer.k_norm` is a LayerNorm (weight and bias).
# The MTP layer (model.layers.<num_hidden_layers>) is skipped by the target's load_weights; vLLM's MTP draft
# (DeepseekV32MTPModel) builds it under the same prefix with the indexer (quantkit.naming.archs.deepseek_v3 MTP_SOURCE).


def _indexer_slots(config: Mapping[str, Any]):
    pattern = config.get("index_topk_pattern")
    freq = config.get("index_topk_freq", 1) or 1
    offset = config.get("index_skip_topk_offset", 2)
    slots = (
        Slot("self_attn.indexer.wq_b", "linear", "indexer", ("self_attn.indexer.wq_b",)),
        Slot("self_attn.indexer.wk_weights_proj", "fused_linear", "indexer",
             ("self_attn.indexer.wk", "self_attn.indexer.weights_proj"), quantizable=False),
    )  # fmt: skip

    def for_layer(i: int) -> tuple[Slot, ...]:
        if "index_topk" not in config:
            return ()
        if pattern is None:
            skip = max(i - offset + 1, 0) % freq != 0
        else:
            skip = 0 <= i < len(pattern) and pattern[i] == "S"
        return () if skip else slots

    return for_layer


def deepseek_v32_layers(config: Mapping[str, Any], ckpt: CheckpointModules, target: int | None) -> list[RuntimeLayer]:
    return deepseek_v3_layers(config, ckpt, target, source=SOURCE, attn_extra=_indexer_slots(config))


def deepseek_v32_mtp_draft_layers(config: Mapping[str, Any], names: Iterable[str]) -> list[RuntimeLayer]:
    return deepseek_v3_mtp_draft_layers(config, names, _indexer_slots(config))


FAMILY = Family(
    "deepseek_v32", ("DeepseekV32ForCausalLM",), SOURCE, deepseek_v32_layers,
    quark_templates={"deepseek_v32": "deepseek_v32"},
    moe=MoeLayout(("n_routed_experts",), router=DEEPSEEK_ROUTER),
    # _indexer_slots reads these (the DeepseekV32 indexer pattern: a string of S / F per layer, or a list of them)
    config_keys={**DEEPSEEK_KEYS, "index_topk": int, "index_topk_freq": PositiveInt, "index_skip_topk_offset": int,
                 "index_topk_pattern": str | list[str] | None},
    mtp_layer_keys=MTP_KEYS, mtp_exclude=mtp_exclude, mtp_draft_layers=deepseek_v32_mtp_draft_layers,
    # the indexer makes every MLA layer sparse (deepseek_v2.py DeepseekV2MLAAttention: use_sparse with index_topk)
    vllm_cpu_refusal=("its DeepSeek Sparse Attention (the indexer's top-k MLA) has no CPU backend: vllm/platforms/"
                      "cpu.py get_attn_backend_cls raises 'Sparse Attention is not supported on CPU.'"),
)  # fmt: skip
