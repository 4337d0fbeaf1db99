"""DFlash and DFlash2 drafts (DFlashDraftModel, DFlash2DraftModel; z-lab's Qwen3 DFlash drafts): block-diffusion
drafters served with `"method": "dflash"`: fc over the target's context layers, several Qwen3 decoder layers
numbered after the target's, hidden_norm and norm; the target's lm_head and embeddings shared."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quantkit.naming.archs.eagle3_llama import eagle3_layers
from quantkit.naming.builder import DENSE_MAP, CheckpointModules
from quantkit.naming.family import DraftLayout, Family
from quantkit.naming.layers import RuntimeLayer

SOURCE = "vllm/model_executor/models/qwen3_dflash.py"

# vLLM's registry maps DFlashDraftModel to qwen3_dflash.py DFlashQwen3ForCausalLM and DFlash2DraftModel to
# qwen3_dflash2.py DFlash2Qwen3ForCausalLM (a subclass with the same module tree), both Qwen3ForCausalLM subclasses
# (packed_modules_mapping qkv_proj = q/k/v, gate_up_proj = gate/up). DFlashQwen3Model builds `layers.{target + i}`
# for i < num_hidden_layers (start_layer_id = the target's layer count), each a DFlashQwen3DecoderLayer:
# `self_attn.qkv_proj`, `self_attn.o_proj` (q_norm, k_norm) and a Qwen3MLP `mlp.gate_up_proj` / `mlp.down_proj`, all
# WITH the draft's quant config; `fc` (ReplicatedLinear over the target's `dflash_config.target_layer_ids` hidden
# states, with the quant config) when use_aux_hidden_state (default true); `hidden_norm`, `norm`. load_weights
# prefixes `model.` to every name but lm_head and d2t, and drops embed_tokens / fc / mask_embedding where absent; the
# lm_head is built WITHOUT a quant config unless has_own_lm_head. `_add_global_draft_layer_exclusions` adds, for every
# `exclude` entry naming a checkpoint-local `layers.<i>`, its runtime alias `layers.<i + target>`: both spellings match.
# The mask token (`dflash_config.mask_token_id`) is an embedding slot, not a weight; a `mask_hidden` tensor is refused
# by vLLM's loader (that is P-EAGLE's).


def dflash_layers(config: Mapping[str, Any], ckpt: CheckpointModules, target: int | None) -> list[RuntimeLayer]:
    return eagle3_layers(config, ckpt, target, qwen3=False, source=SOURCE, fused_mapping=DENSE_MAP)


FAMILY = Family(
    "dflash", ("DFlashDraftModel", "DFlash2DraftModel"), SOURCE, dflash_layers,
    quark_templates={"*": "qwen3"}, draft=DraftLayout(method="dflash"),
)  # fmt: skip
