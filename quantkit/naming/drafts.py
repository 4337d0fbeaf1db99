"""EAGLE-3 draft checkpoints: detect the format (EAGLE/SpecForge or speculators) and the model kind of a folder.

Formats (how vLLM reads them: vllm/model_executor/models/llama_eagle3.py and
vllm/transformers_utils/configs/speculators/):
  eagle      `architectures: [LlamaForCausalLMEagle3]` (EAGLE-3 reference code, SpecForge); decoder layer
             stored as `midlayer.*` (vLLM maps `midlayer.` -> `layers.0.`) or `layers.0.*`; aux hidden-state
             layer ids in `eagle_config.eagle_aux_hidden_state_layer_ids`.
  speculators `speculators_model_type: eagle3`; the Llama layer config under `transformer_layer_config`,
             decoder layer stored as `layers.0.*`.
Both hold `fc.weight` (hidden x n_aux*target_hidden), `norm.weight`, `lm_head.weight` (draft_vocab x hidden)
and, with a reduced draft vocab, `d2t` (draft id -> target id offset) and `t2d` (target-vocab mask).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from quantkit.errors import QuantkitError
from quantkit.io.config import draft_config
from quantkit.io.headers import TensorInfo


class DraftFormatError(QuantkitError):
    """A draft checkpoint lacks what an EAGLE-3 draft must have."""


@dataclass(frozen=True)
class DraftInfo:
    """What quantkit needs to know about an EAGLE-3 draft."""

    format: str  # "eagle" | "speculators"
    layer_prefix: str  # "midlayer." or "layers.0."
    hidden_size: int
    draft_vocab_size: int
    vocab_size: int
    aux_layer_ids: list[int] | None
    layer_config: dict[str, Any]  # the Llama-style config of the decoder layer


def draft_info(config: dict[str, Any], tensors: dict[str, TensorInfo], where: str) -> DraftInfo:
    """Validate an EAGLE-3 draft's config and tensors; every problem is a one-line error naming `where`."""
    dc = draft_config(config)
    if dc.format == "speculators" and not isinstance(config.get("transformer_layer_config"), dict):
        raise DraftFormatError(f"draft {where}: speculators config without 'transformer_layer_config'")
    prefix = "midlayer." if any(n.startswith("midlayer.") for n in tensors) else "layers.0."
    # The MLP of an MoE-layer draft (quantkit.naming.archs.eagle3_moe) is its router and experts, which its layer
    # builder requires; a dense draft's is mlp.down_proj.
    mlp = [] if dc.format == "eagle" and _moe_layer(config) else [f"{prefix}mlp.down_proj.weight"]
    # o_proj: every draft layout's attention has it (Llama's q/k/v, MLA's q_a/kv_a: the layer builder names the rest)
    # lm_head: a DFlash draft without has_own_lm_head shares the target's (qwen3_dflash.py builds lm_head without a
    # quant config and loads none), so it is checked where present
    head = [] if _shares_lm_head(config) else ["lm_head.weight"]
    required = ["fc.weight", *head, "norm.weight", f"{prefix}self_attn.o_proj.weight", *mlp]
    missing = [n for n in required if n not in tensors]
    if missing:
        raise DraftFormatError(
            f"draft {where}: missing tensor(s) {', '.join(missing)}; an EAGLE-3 draft needs fc, one decoder layer "
            "(midlayer.* or layers.0.*), norm and lm_head"
        )
    hidden = dc.hidden_size or int(tensors["fc.weight"].shape[0])
    vocab = dc.vocab_size or 0
    draft_vocab = dc.draft_vocab_size or vocab
    if "lm_head.weight" in tensors and tensors["lm_head.weight"].shape[0] != draft_vocab:
        raise DraftFormatError(
            f"draft {where}: lm_head has {tensors['lm_head.weight'].shape[0]} rows but draft_vocab_size is "
            f"{draft_vocab}; fix draft_vocab_size in config.json"
        )
    if draft_vocab != vocab and ("d2t" not in tensors or "t2d" not in tensors):
        raise DraftFormatError(
            f"draft {where}: draft vocab ({draft_vocab}) differs from vocab ({vocab}) but d2t/t2d are missing; "
            "vLLM needs d2t to map draft tokens to target tokens"
        )
    ids = dc.aux_layer_ids
    return DraftInfo(dc.format, prefix, hidden, draft_vocab, vocab, list(ids) if ids else None, dict(dc.layer))


def _shares_lm_head(config: dict[str, Any]) -> bool:
    from quantkit.naming.archs import speculative_method

    return speculative_method(config) in ("dflash", "dspark") and not config.get("has_own_lm_head", False)


def _moe_layer(config: dict[str, Any]) -> bool:
    from quantkit.naming.archs import family_of
    from quantkit.naming.layers import UnsupportedArchitectureError

    try:
        return family_of(config).moe is not None
    except UnsupportedArchitectureError:
        return False


def draft_config_for_vllm(config: dict[str, Any], info: DraftInfo, quantization_config: dict[str, Any]) -> dict:
    """The source config with `quantization_config` added where vLLM reads it, and the aux ids at the top level.

    vLLM builds a speculators draft's hf_config from `transformer_layer_config` only
    (SpeculatorsConfig.extract_transformers_pre_trained_config), so there the quantization config must sit
    inside it too; an eagle-format draft reads its own top-level `quantization_config`
    (get_draft_quant_config in vllm/model_executor/models/utils.py).
    """
    out = dict(config)
    out["quantization_config"] = quantization_config
    if info.aux_layer_ids is not None:
        out["eagle_aux_hidden_state_layer_ids"] = list(info.aux_layer_ids)
        eagle_config = dict(out.get("eagle_config") or {})
        eagle_config["eagle_aux_hidden_state_layer_ids"] = list(info.aux_layer_ids)
        out["eagle_config"] = eagle_config
    if info.format == "speculators":
        layer = dict(out["transformer_layer_config"])
        layer["quantization_config"] = quantization_config
        out["transformer_layer_config"] = layer
    return out
