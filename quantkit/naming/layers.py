"""The runtime layers vLLM builds for a checkpoint: the record of one (RuntimeLayer), its kinds and roles, and the
errors a checkpoint's names can raise against a family's layout."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from quantkit.errors import CheckpointError, QuantkitError

# A stand-in for an EAGLE-3 draft's target layer count when it is unknown (no --target): vLLM numbers the draft's
# decoder layer after the target's layers; names with it are shown (and excluded) as model.layers.{N}.
UNKNOWN_TARGET_LAYERS = 987654

# --- vocabulary ------------------------------------------------------------------------------------------------

KINDS = ("linear", "fused_linear", "moe", "router", "lm_head", "embedding")
ROLES = (
    "fc", "lm_head", "embed_tokens", "attention", "linear_attention", "indexer", "router", "experts", "shared_experts",
    "dense_mlp", "decoder_linears",
)  # fmt: skip
# Roles whose layers are LinearBase modules inside a decoder layer (recipes' "every linear in the decoder layers").
# Routed experts are a FusedMoE, not a linear, so they are not decoder linears.
_DECODER_LINEAR_ROLES = frozenset({"attention", "linear_attention", "indexer", "router", "shared_experts", "dense_mlp"})
# The role of a multimodal wrapper's encoder linears (vision tower, projector): kept BF16.
VISION_ROLE = "vision"


class UnsupportedArchitectureError(QuantkitError):
    """config.json names an architecture whose vLLM runtime names quantkit does not know."""


class MissingTargetLayersError(QuantkitError):
    """An EAGLE-3 draft's runtime names depend on the target's layer count, which was not given."""


class CheckpointLayoutError(CheckpointError):
    """The checkpoint's tensor names do not fit the layout vLLM's model file loads for its architecture."""


# --- runtime layers --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RuntimeLayer:
    """One module vLLM builds and asks the quant config about, under the name vLLM passes as `prefix`/`layer_name`.

    `shards` are the names vLLM substitutes for a fused layer when it matches `exclude` (empty when the model's
    packed_modules_mapping in force has no entry for the last name component, as for every EAGLE-3 draft layer).
    `checkpoint_modules` are the checkpoint module names (tensor names without `.weight`) loaded into this layer.
    `quantizable` is False when vLLM never gives this layer a Quark method (lm_head, embeddings, routers built
    without a quant_config): excluding it changes nothing in vLLM, but its tensors must stay unquantized.
    `exclude_renames` are the (substring, replacement) renames vLLM applies to each `exclude` entry first.
    """

    name: str
    kind: str
    role: str
    shards: tuple[str, ...] = ()
    checkpoint_modules: tuple[str, ...] = ()
    quantizable: bool = True
    layer_index: int | None = None
    exclude_renames: tuple[tuple[str, str], ...] = ()
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["shards"] = list(self.shards)
        d["checkpoint_modules"] = list(self.checkpoint_modules)
        d["exclude_renames"] = [list(r) for r in self.exclude_renames]
        return d


def in_role(layer: RuntimeLayer, role: str) -> bool:
    """Whether `layer` belongs to `role`: its primary role, or `decoder_linears` for any linear in a decoder layer."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; known: {', '.join(ROLES)}")
    if layer.role == role:
        return True
    return role == "decoder_linears" and layer.role in _DECODER_LINEAR_ROLES


def layers_in_role(layers: Iterable[RuntimeLayer], role: str) -> list[RuntimeLayer]:
    """The layers that belong to `role` (see in_role), in the given order."""
    return [layer for layer in layers if in_role(layer, role)]
