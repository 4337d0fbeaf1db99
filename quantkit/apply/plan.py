"""The plan of `quantkit apply`: for every vLLM runtime layer, quantize (with which scheme) or keep (and why), and the vLLM `exclude` list that keeps exactly the kept layers."""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from quantkit.errors import QuantkitError
from quantkit.naming.layers import UNKNOWN_TARGET_LAYERS, VISION_ROLE
from quantkit.recipes import Recipe
from quantkit.results import LayerDecision
from quantkit.vocab import ModelKind

if TYPE_CHECKING:
    from quantkit.io.checkpoint import SourceCheckpoint
    from quantkit.naming.builder import CheckpointModules
    from quantkit.naming.drafts import DraftInfo


class ApplyError(QuantkitError):
    """The recipe does not fit the model, or the run cannot go ahead as asked."""


class ApplyVerificationError(QuantkitError):
    """What Quark wrote does not match the plan (a layer quantized that should not be, or the reverse)."""


@dataclass
class ApplyPlan:
    """Everything decided before any tensor data is read (what `--dry-run` prints)."""

    recipe: Recipe
    src: SourceCheckpoint
    kind: ModelKind
    info: DraftInfo | None
    n_target: int | None
    layers: list[Any]
    decisions: list[LayerDecision]
    exclude: list[str]
    quark_exclude: list[str]
    layer_config: dict[str, str]
    path: str
    path_reason: str
    engine: str
    engine_reason: str
    devices: list[str]
    source_format: Any  # quantkit.io.formats.SourceFormat
    mtp_modules: int = 0
    dropped: set[str] = field(default_factory=set)  # tensors left out (the recipe's `mtp: drop`)
    not_copied: list[str] = field(default_factory=list)  # source files and folders apply does not copy (io.files)
    ignored_files: list[str] = field(default_factory=list)  # *.safetensors the index does not name
    # a quantized source's decoded tensor name -> the source tensors it is made from (io.formats.decoded_tensor_names,
    # read once per plan); empty for a BF16 source
    decoded: dict[str, list[str]] = field(default_factory=dict)
    # the tensor names the layers were built from, as quantkit.naming.builder.CheckpointModules (None: a multimodal
    # wrapper's, whose module names are made anew); read only
    modules: CheckpointModules | None = None


# --- planning ------------------------------------------------------------------------------------------------------


def plan_layers(recipe: Recipe, layers: list[Any]) -> list[LayerDecision]:
    """Decide, for every runtime layer, quantize (with which scheme) or keep (and why). Keep wins over all else."""
    from quantkit.naming.layers import in_role

    def selects(selector: Any, layer: Any) -> bool:
        if selector.role is not None:
            return in_role(layer, selector.role)
        return any(fnmatch.fnmatchcase(m, selector.pattern) for m in layer.checkpoint_modules)

    decisions = []
    for layer in layers:
        base = dict(
            runtime_name=layer.name, role=layer.role, kind=layer.kind, checkpoint_modules=list(layer.checkpoint_modules)
        )
        keep = next((k for k in recipe.keep if selects(k, layer)), None)
        override = next((o for o in recipe.overrides if selects(o, layer)), None)
        if keep is not None:
            decisions.append(LayerDecision(**base, action="keep", scheme=None, reason=keep.reason))
        elif layer.role == VISION_ROLE:
            decisions.append(
                LayerDecision(
                    **base,
                    action="keep",
                    scheme=None,
                    reason="multimodal encoder (vision tower / projector): runs once per image "
                    "and is small; AMD's Kimi-K2.5 MXFP4 release keeps it BF16",
                )
            )
        elif layer.kind == "embedding":
            decisions.append(
                LayerDecision(
                    **base,
                    action="keep",
                    scheme=None,
                    reason="embeddings are lookups; Quark quantizes linear layers only",
                )
            )
        elif not layer.quantizable:
            decisions.append(
                LayerDecision(
                    **base,
                    action="keep",
                    scheme=None,
                    reason="vLLM builds this layer without a quantization method, so it must stay unquantized",
                )
            )
        elif override is not None:
            decisions.append(LayerDecision(**base, action="quantize", scheme=override.scheme, reason=override.reason))
        elif recipe.quantize is None or any(in_role(layer, r) for r in recipe.quantize):
            decisions.append(
                LayerDecision(
                    **base, action="quantize", scheme=recipe.scheme, reason=f"recipe {recipe.name}: {recipe.scheme}"
                )
            )
        else:
            decisions.append(
                LayerDecision(
                    **base,
                    action="keep",
                    scheme=None,
                    reason=f"not in the recipe's quantize roles ({', '.join(recipe.quantize)})",
                )
            )
    return decisions


def unmatched_patterns(recipe: Recipe, layers: list[Any]) -> list[tuple[str, str]]:
    """(recipe key, pattern) of every `keep` or `overrides` entry whose pattern matches no checkpoint module here.

    Such an entry is an error, not a warning: a pattern names modules of one checkpoint layout, so matching nothing
    means a typo or a recipe written for another model, and the layers it meant to keep (or give another scheme) get
    the recipe's scheme, silently. Roles are different: they are family-independent by design, and a role a family
    lacks (shared_experts in Qwen3-MoE) selects nothing because there is nothing to keep; the built-in recipes, which
    cover several families, use roles only.
    """
    entries = [(f"keep[{i}]", k.pattern) for i, k in enumerate(recipe.keep)]
    entries += [(f"overrides[{i}]", o.pattern) for i, o in enumerate(recipe.overrides)]
    if all(pattern is None for _, pattern in entries):  # roles only (every built-in recipe): no module to list
        return []
    modules = [m for layer in layers for m in layer.checkpoint_modules]
    return [
        (f"{key}.pattern", pattern)
        for key, pattern in entries
        if pattern is not None and not any(fnmatch.fnmatchcase(m, pattern) for m in modules)
    ]


def draft_runtime_name(name: str) -> str:
    return name.replace(f"model.layers.{UNKNOWN_TARGET_LAYERS}.", "model.layers.{N}.")


def vllm_exclude(layers: list[Any], decisions: list[LayerDecision], target_known: bool) -> list[str]:
    """`exclude` entries under vLLM's runtime names that exclude exactly the kept layers (checked by replay)."""
    from quantkit.naming.exclude import exclude_entries_for, excluded_names

    kept_names = {d.runtime_name for d in decisions if d.action == "keep"}
    # Encoders of a multimodal wrapper are kept whole: one anchored `re:` entry each (vLLM matches from the start)
    # instead of hundreds of names; the replay below checks it excludes exactly them.
    encoders = sorted({layer.name.split(".", 1)[0] for layer in layers if layer.role == VISION_ROLE})
    text_layers = [layer for layer in layers if layer.role != VISION_ROLE]
    kept = [layer for layer in text_layers if layer.name in kept_names]
    entries = exclude_entries_for(kept, text_layers) + [f"re:{re.escape(e)}\\." for e in encoders]
    if not target_known:
        # The draft's decoder layer number depends on the target; match any number rather than a made-up one.
        marker = f"model.layers.{UNKNOWN_TARGET_LAYERS}."
        entries = [
            ("re:" + re.escape("model.layers.") + r"\d+\." + re.escape(e[len(marker) :]) + "$")
            if e.startswith(marker)
            else e
            for e in entries
        ]
        if any(marker in e for e in entries):  # a compressed `re:` entry kept the stand-in number: spell it out
            entries = [e for e in entries if marker not in e] + [
                "re:" + re.escape("model.layers.") + r"\d+\." + re.escape(layer.name[len(marker) :]) + "$"
                for layer in kept
                if layer.name.startswith(marker)
            ]
    got = excluded_names(layers, entries)
    if got != kept_names:
        raise ApplyVerificationError(
            f"internal: exclude entries {entries} would exclude {sorted(got ^ kept_names)} differently from the plan"
        )
    return entries


def quark_exclusions(recipe: Recipe, decisions: list[LayerDecision]) -> tuple[list[str], dict[str, str]]:
    """Quark-side names: `exclude` = every kept module (checkpoint names), `layer_config` = module -> override scheme.

    Both engines take these: Quark's QConfig (exclude_layers, layer_config) and the native executor, which replays
    Quark's file-to-file matching of them.
    """
    exclude = sorted({m for d in decisions if d.action == "keep" for m in d.checkpoint_modules})
    layer_config = {
        m: d.scheme
        for d in decisions
        if d.action == "quantize" and d.scheme and d.scheme != recipe.scheme
        for m in d.checkpoint_modules
    }
    return exclude, layer_config
