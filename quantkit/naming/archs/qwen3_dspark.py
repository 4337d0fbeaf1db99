"""Qwen3 DSpark drafts (Qwen3DSparkModel, Qwen3OmniDSparkModel): DFlash's Qwen3 backbone (quantkit.naming.archs.dflash)
with DSpark's Markov head and optional confidence head, served with `"method": "dspark"`. For SpecForge's drafts that
name themselves `DSparkDraftModel`, see quantkit.naming.archs.dspark_draft."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quantkit.naming.archs.dflash import dflash_layers
from quantkit.naming.builder import CheckpointModules
from quantkit.naming.family import DraftLayout, Family
from quantkit.naming.layers import RuntimeLayer

SOURCE = "vllm/model_executor/models/qwen3_dspark.py"

# vLLM's registry maps Qwen3DSparkModel and Qwen3OmniDSparkModel to qwen3_dspark.py Qwen3DSparkForCausalLM, a
# DFlashQwen3ForCausalLM whose model (Qwen3DSparkModel, a DFlashQwen3Model) adds `markov_head` (DSparkMarkovHead:
# `markov_w1` an nn.Embedding, `markov_w2` a ParallelLMHead, which Quark gives no method) and, with
# enable_confidence_head, `confidence_head.proj` (a ReplicatedLinear built without quant_config, float32). load_weights
# prefixes `model.` to every name but lm_head and d2t, drops t2d, and shares the target's embed_tokens / lm_head when
# the checkpoint has none. Every head is kept: the Markov bias and the confidence score feed acceptance directly.


def qwen3_dspark_layers(config: Mapping[str, Any], ckpt: CheckpointModules, target: int | None) -> list[RuntimeLayer]:
    layers = dflash_layers(config, ckpt, target)
    heads = [("model.markov_head.markov_w1", "embedding", "markov_head.markov_w1"),
             ("model.markov_head.markov_w2", "lm_head", "markov_head.markov_w2"),
             ("model.confidence_head.proj", "linear", "confidence_head.proj")]  # fmt: skip
    for name, kind, module in heads:
        if ckpt.has(module):
            layers.insert(
                -1,
                RuntimeLayer(
                    name,
                    kind,
                    "lm_head" if kind != "embedding" else "embed_tokens",
                    (),
                    ckpt.take([module]),
                    quantizable=False,
                    source=SOURCE,
                ),
            )
    return layers


FAMILY = Family(
    "qwen3_dspark", ("Qwen3DSparkModel", "Qwen3OmniDSparkModel"), SOURCE, qwen3_dspark_layers,
    quark_templates={"*": "qwen3"}, draft=DraftLayout(method="dspark"),
)  # fmt: skip
