"""Reading model configs the way vLLM does: the text model of multimodal wrappers, the layer count of a target."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quantkit.errors import CheckpointError


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's config: `text_config` of a multimodal wrapper (e.g. Kimi-K2.5), else the config itself."""
    inner = config.get("text_config")
    return inner if isinstance(inner, dict) else config


def num_hidden_layers(config: dict[str, Any], where: str | Path) -> int:
    """The text model's decoder layer count; a one-line error naming `where` when config.json has no valid one."""
    n = text_config(config).get("num_hidden_layers")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise CheckpointError(f"{where}: config.json has no valid num_hidden_layers ({n!r}); is this the target?")
    return n


def target_layer_count(target: str | Path) -> int:
    """num_hidden_layers of a target (local folder or Hub id), from its config.json only: no weights are read."""
    from quantkit.io.checkpoint import resolve_config

    return num_hidden_layers(resolve_config(target), target)
