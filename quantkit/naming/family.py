"""The record of one model family or EAGLE-3 draft layout: everything quantkit knows about it, one file under
quantkit/naming/archs/ each (the registry, quantkit.naming.archs, looks records up by architecture name)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from quantkit.naming.builder import CheckpointModules
from quantkit.naming.layers import RuntimeLayer

# (config.json, the checkpoint's modules, the target's layer count for a draft) -> the runtime layers in model order
LayerBuilder = Callable[[Mapping[str, Any], CheckpointModules, "int | None"], list[RuntimeLayer]]


@dataclass(frozen=True)
class Wrapper:
    """A multimodal wrapper around a text family (Kimi-K2.5): where its text model and encoders sit."""

    text_prefix: str  # checkpoint (and runtime) prefix of the text model ("language_model.")
    encoder_prefixes: tuple[str, ...] = ()  # vision tower / projector: kept BF16
    encoder_renames: tuple[tuple[str, str], ...] = ()  # hf_to_vllm_mapper renames of encoder modules
    # the text architecture for a text_config that names none, by its model_type
    text_architecture_by_model_type: Mapping[str, str] | None = None


@dataclass(frozen=True)
class Family:
    """Everything quantkit knows about one model family or draft layout; one file under naming/archs/."""

    name: str  # == its module name under naming/archs/
    architectures: tuple[str, ...]  # config.json architectures, as vllm/model_executor/models/registry.py maps them
    vllm_source: str  # the vLLM model file the builder follows
    build_layers: LayerBuilder | None  # runtime layers and fusions; None only for a pure wrapper
    is_draft: bool = False  # an EAGLE-3 draft layout (its names need the target's layer count)
    wrapper: Wrapper | None = None
