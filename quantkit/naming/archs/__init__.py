"""The family registry: every record under quantkit/naming/archs/, looked up by the architecture vLLM builds for a
config.json, and the runtime layers of a checkpoint through its family (wrappers delegate to their text family)."""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from typing import Any

from quantkit.io.config import text_config
from quantkit.naming.builder import CheckpointModules, reject_leftovers
from quantkit.naming.exclude import renamed
from quantkit.naming.family import Family, Wrapper
from quantkit.naming.layers import (
    VISION_ROLE,
    CheckpointLayoutError,
    RuntimeLayer,
    UnsupportedArchitectureError,
)
from quantkit.vocab import DENSE_TARGET, EAGLE3_DRAFT, MOE_TARGET, ModelKind

# The family modules, in the order their architectures are listed in messages.
_MODULES = ("eagle3_llama", "eagle3_qwen3", "llama", "qwen3", "qwen3_moe", "deepseek_v3", "mixtral", "minimax_m2",
            "kimi_k25")  # fmt: skip


def _load() -> tuple[Family, ...]:
    return tuple(importlib.import_module(f"{__name__}.{m}").FAMILY for m in _MODULES)


_FAMILIES = _load()
# Architecture names as vLLM's registry (vllm/model_executor/models/registry.py) resolves them.
_BY_ARCH: dict[str, Family] = {a: f for f in _FAMILIES for a in f.architectures}
SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(_BY_ARCH)
# What vllm/transformers_utils/configs/speculators/algos.py (update_eagle3) turns a speculators eagle3 config into.
_SPECULATORS_EAGLE3 = {"llama": "Eagle3LlamaForCausalLM", "qwen3": "Eagle3Qwen3ForCausalLM"}


def architecture_of(config: Mapping[str, Any]) -> str:
    """The supported architecture vLLM would build for this config.json, or UnsupportedArchitectureError."""
    spec_type = config.get("speculators_model_type")
    if spec_type is not None:
        model_type = (config.get("transformer_layer_config") or {}).get("model_type", "llama")
        if spec_type == "eagle3" and model_type in _SPECULATORS_EAGLE3:
            return _SPECULATORS_EAGLE3[model_type]
        raise UnsupportedArchitectureError(
            f"speculators model {spec_type!r} with transformer_layer_config.model_type {model_type!r} is not "
            f"supported; supported: speculators eagle3 with model_type llama or qwen3, or architectures "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    archs = config.get("architectures") or []
    for arch in archs:
        if arch in _BY_ARCH:
            return arch
    named = ", ".join(archs) if archs else "no architectures"
    raise UnsupportedArchitectureError(
        f"config.json architecture {named} is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)} "
        f"(or a speculators eagle3 draft)"
    )


def family_of(config: Mapping[str, Any]) -> Family:
    """The record of the family vLLM would build for this config.json, or UnsupportedArchitectureError."""
    return _BY_ARCH[architecture_of(config)]


def is_draft(config: Mapping[str, Any]) -> bool:
    """Whether config.json is an EAGLE-3 draft (whose runtime names need the target's layer count): a speculators
    eagle3 config, or an architecture whose record is a draft layout. Never raises: acceptance and eval ask it of
    models quantkit cannot name."""
    if config.get("speculators_model_type") == "eagle3":
        return True
    archs = config.get("architectures") or []
    return any(a in _BY_ARCH and _BY_ARCH[a].is_draft for a in archs if isinstance(a, str))


def model_kind(config: Mapping[str, Any]) -> ModelKind:
    """`eagle3-draft`, `moe-target` or `dense-target`, from config.json alone."""
    if is_draft(config):
        return EAGLE3_DRAFT
    if any(_count(c.get(k)) > 1 for c in (config, text_config(dict(config))) for k in _MOE_CONFIG_KEYS):
        return MOE_TARGET
    return DENSE_TARGET


# The config keys whose value > 1 makes a target MoE (Qwen3-MoE, Mixtral / MiniMax-M2, DeepSeek-V3).
_MOE_CONFIG_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def runtime_layers(
    config: Mapping[str, Any], tensor_names: Iterable[str], target_num_layers: int | None = None
) -> list[RuntimeLayer]:
    """Every linear / MoE / lm_head / embedding module vLLM builds for this checkpoint, in model order.

    `config` is the checkpoint's config.json as a dict, `tensor_names` all its tensor names (the index's
    weight_map keys), `target_num_layers` the target's num_hidden_layers (required for EAGLE-3 drafts, whose vLLM
    layers are numbered after the target's). Raises CheckpointLayoutError when the tensors do not fit the layout the
    architecture's vLLM model file loads.
    """
    archs = config.get("architectures") or []
    wrapped = next((_BY_ARCH[a] for a in archs if a in _BY_ARCH and _BY_ARCH[a].wrapper is not None), None)
    if wrapped is not None and wrapped.wrapper is not None:
        return _wrapped_layers(config, list(tensor_names), wrapped.wrapper, wrapped.vllm_source)
    family = family_of(config)
    if family.build_layers is None:  # pragma: no cover - only a wrapper has no builder, and it is handled above
        raise UnsupportedArchitectureError(f"{family.name} has no layer builder; quantkit bug")
    ckpt = CheckpointModules(tensor_names)
    layers = family.build_layers(config, ckpt, target_num_layers)
    reject_leftovers(ckpt, family.vllm_source)
    return layers


def _wrapped_layers(config: Mapping[str, Any], names: list[str], wrapper: Wrapper, source: str) -> list[RuntimeLayer]:
    """The text model's layers under the wrapper's prefix, plus one kept-BF16 layer per encoder linear."""
    prefix, encoders, renames = wrapper.text_prefix, wrapper.encoder_prefixes, wrapper.encoder_renames
    text = config.get("text_config")
    if not isinstance(text, dict):
        raise CheckpointLayoutError(f"{source}: a {config.get('architectures')} config needs a text_config")
    text = dict(text)
    if not text.get("architectures"):
        arch = (wrapper.text_architecture_by_model_type or {}).get(str(text.get("model_type")))
        text["architectures"] = [arch] if arch else []
    inner = [n[len(prefix):] for n in names if n.startswith(prefix)]
    if not inner:
        raise CheckpointLayoutError(f"{source}: no {prefix}* tensors; is this a {config.get('architectures')} "
                                    "checkpoint as it ships (language_model.model.layers.*)?")
    layers = [RuntimeLayer(prefix + lay.name, lay.kind, lay.role, tuple(prefix + s for s in lay.shards),
                           tuple(prefix + m for m in lay.checkpoint_modules), lay.quantizable, lay.layer_index,
                           lay.exclude_renames, lay.source)
              for lay in runtime_layers(text, inner)]
    others = [n for n in names if not n.startswith(prefix)]
    unknown = [n for n in others if not n.startswith(encoders)]
    if unknown:
        raise CheckpointLayoutError(f"{source}: tensor {unknown[0]} is neither {prefix}* nor an encoder "
                                    f"({', '.join(encoders)}); quantkit does not know where vLLM loads it")
    for module in dict.fromkeys(n.removesuffix(".weight") for n in others if n.endswith(".weight")):
        runtime = renamed(module, renames)
        layers.append(RuntimeLayer(runtime, "linear", VISION_ROLE, (), (module,), True, None, (), source))
    return layers
