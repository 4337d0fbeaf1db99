"""The family registry: every record under quantkit/naming/archs/, looked up by the architecture vLLM builds for a
config.json, and the runtime layers of a checkpoint through its family (wrappers delegate to their text family)."""

from __future__ import annotations

import contextlib
import importlib
import os
import pkgutil
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from quantkit.errors import QuantkitError
from quantkit.io.config import declare_keys, text_config
from quantkit.io.formats import FusedLayout
from quantkit.io.formats import mtp_tensor_names as _mtp_names
from quantkit.naming.builder import CheckpointModules, reject_leftovers
from quantkit.naming.exclude import renamed
from quantkit.naming.family import Family, QuarkTemplateError, Wrapper
from quantkit.naming.layers import (
    VISION_ROLE,
    CheckpointLayoutError,
    RuntimeLayer,
    UnsupportedArchitectureError,
)
from quantkit.vocab import DENSE_TARGET, EAGLE3_DRAFT, MOE_TARGET, ModelKind

__all__ = ["SUPPORTED_ARCHITECTURES", "NoVllmModelError", "QuarkTemplateError", "architecture_of", "families", "family_named",
           "family_of", "fused_layouts", "is_draft", "mtp_tensor_names", "text_family", "model_kind", "quark_kv_layers", "quark_template", "register", "registered", "require_vllm_model",
           "checkpoint_layers", "runtime_layers", "parallel_drafting", "speculative_method", "supported_architectures"]  # fmt: skip

# Modules outside this package that define a FAMILY too (comma-separated module names): how a family that is not
# (yet) part of quantkit reaches every quantkit process, the CLI subprocesses of a test included.
FAMILY_MODULES_ENV = "QUANTKIT_FAMILY_MODULES"


class FamilyModuleError(QuantkitError):
    """A module named in QUANTKIT_FAMILY_MODULES cannot be imported or defines no FAMILY."""


class NoVllmModelError(QuantkitError):
    """The checkpoint's family is one vLLM builds no model for (DraftLayout.vllm_refusal): nothing to load or serve."""


_BY_ARCH: dict[str, Family] = {}
_BY_NAME: dict[str, Family] = {}
# architecture -> the record that takes it for the configs its Family.variant picks out (one per architecture)
_VARIANTS: dict[str, Family] = {}


def register(family: Family) -> None:
    """Add `family` to the registry (tests' fake families, future plugins). A name or architecture that another
    record already claims is a ValueError: the registry never picks between two records."""
    if family.name in _BY_NAME:
        raise ValueError(f"family {family.name!r} is registered twice")
    taken = [a for a in family.architectures if a in _BY_ARCH]
    if taken:
        raise ValueError(
            f"family {family.name!r} claims {', '.join(taken)}, already claimed by family {_BY_ARCH[taken[0]].name!r}"
        )
    variants = family.variant.architectures if family.variant is not None else ()
    twice = [a for a in variants if a in _VARIANTS]
    if twice:
        raise ValueError(
            f"family {family.name!r} takes a variant of {', '.join(twice)}, already taken by family "
            f"{_VARIANTS[twice[0]].name!r}"
        )
    declare_keys(
        family.name,
        family.config_keys,
        {a: family.wrapper.text_config_key for a in family.architectures} if family.wrapper else None,
    )
    _BY_NAME[family.name] = family
    for arch in family.architectures:
        _BY_ARCH[arch] = family
    for arch in variants:
        _VARIANTS[arch] = family


def unregister(family: Family) -> None:
    """Remove `family` from the registry (the end of `registered`)."""
    if _BY_NAME.get(family.name) is family:
        del _BY_NAME[family.name]
        for arch in family.architectures:
            _BY_ARCH.pop(arch, None)
        for arch in family.variant.architectures if family.variant is not None else ():
            _VARIANTS.pop(arch, None)


@contextlib.contextmanager
def registered(family: Family) -> Iterator[Family]:
    """`family` registered for the block (a test's fake family), removed on exit."""
    register(family)
    try:
        yield family
    finally:
        unregister(family)


def _load() -> None:
    """Register the FAMILY of every module of this package (pkgutil: no list to keep), then those named in
    QUANTKIT_FAMILY_MODULES."""
    names = [f"{__name__}.{m.name}" for m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name)]
    names += [m.strip() for m in os.environ.get(FAMILY_MODULES_ENV, "").split(",") if m.strip()]
    for module_name in names:
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:  # only a module named in the variable can be missing
            raise FamilyModuleError(
                f"{FAMILY_MODULES_ENV}: cannot import {module_name} ({e}); fix the variable or "
                "put the module on PYTHONPATH"
            ) from None
        family = getattr(module, "FAMILY", None)
        if not isinstance(family, Family):
            raise FamilyModuleError(f"{module_name} defines no FAMILY = Family(...); every family module must")
        register(family)


_load()
# The built-in families' architectures, for messages and tests (supported_architectures() adds registered ones).
SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(_BY_ARCH)


def families() -> tuple[Family, ...]:
    """Every registered record, sorted by name."""
    return tuple(sorted(_BY_NAME.values(), key=lambda f: f.name))


def family_named(name: str) -> Family:
    """The record called `name` (a module name under naming/archs/)."""
    if name not in _BY_NAME:
        raise KeyError(f"no family {name!r}; known: {', '.join(sorted(_BY_NAME))}")
    return _BY_NAME[name]


def quark_template(config: Mapping[str, Any]) -> str:
    """The Quark 0.13 LLMTemplate name for this config.json, from its family's record; QuarkTemplateError naming the
    family when the record has none (never a default: another family's template quantizes the wrong layers)."""
    return family_of(config).quark_template(config)


def quark_kv_layers(config: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The KV-cache projection patterns Quark is handed for this config.json in place of its template's
    (Family.quark_kv_layers); None: the template's own."""
    return family_of(config).quark_kv_layers


def supported_architectures() -> tuple[str, ...]:
    """Every architecture some registered record claims, in registry order."""
    return tuple(_BY_ARCH)


def _speculators_layout(spec_type: Any, model_type: Any) -> str | None:
    """The draft architecture vLLM builds for a speculators config (vllm/transformers_utils/configs/speculators/
    algos.py update_eagle3's eagle3_arch_map), from the records' DraftLayout.speculators."""
    for family in _BY_NAME.values():
        if family.draft is not None and (spec_type, model_type) in family.draft.speculators:
            return family.architectures[0]
    return None


def architecture_of(config: Mapping[str, Any]) -> str:
    """The supported architecture vLLM would build for this config.json, or UnsupportedArchitectureError."""
    spec_type = config.get("speculators_model_type")
    if spec_type is not None:
        model_type = (config.get("transformer_layer_config") or {}).get("model_type", "llama")
        arch = _speculators_layout(spec_type, model_type)
        if arch is not None:
            return arch
        known = " or ".join(f"{s} with model_type {m}" for f in families() if f.draft for s, m in f.draft.speculators)
        raise UnsupportedArchitectureError(
            f"speculators model {spec_type!r} with transformer_layer_config.model_type {model_type!r} is not "
            f"supported; supported: speculators {known}, or architectures {', '.join(supported_architectures())}"
        )
    archs = config.get("architectures") or []
    for arch in archs:
        if _claimant(arch, config) is not None:
            return arch
    named = ", ".join(archs) if archs else "no architectures"
    from quantkit.naming.catalog import nearest_family

    near = nearest_family(config)
    hint = (
        f"the nearest supported is family {near.name} ({', '.join(near.architectures)}); " if near is not None else ""
    )
    raise UnsupportedArchitectureError(
        f"config.json architecture {named} is not supported; {hint}`quantkit families` lists every supported family "
        "and draft layout with the vLLM classes it builds"
    )


def require_vllm_model(config: Mapping[str, Any], folder: str) -> None:
    """NoVllmModelError, in one line naming the step that works, when vLLM builds no model for this config.json's
    family (an MoE-layer EAGLE-3 draft: quantkit.naming.archs.eagle3_moe); nothing for a config no record names."""
    try:
        family = family_of(config)
    except UnsupportedArchitectureError:
        return
    if family.draft is not None and family.draft.vllm_refusal is not None:
        raise NoVllmModelError(family.draft.vllm_refusal.format(arch=architecture_of(config), folder=folder))


def speculative_method(config: Mapping[str, Any]) -> str:
    """The --speculative-config method vLLM needs for this draft config.json (its layout's DraftLayout.method);
    "eagle3" for a draft no record names (deploy's behaviour before layouts had methods)."""
    try:
        family = family_of(config)
    except UnsupportedArchitectureError:
        return "eagle3"
    return family.draft.method if family.draft is not None else "eagle3"


def parallel_drafting(config: Mapping[str, Any]) -> bool:
    """Whether this draft config.json's layout drafts in parallel (DraftLayout.parallel_drafting)."""
    try:
        family = family_of(config)
    except UnsupportedArchitectureError:
        return False
    return family.draft is not None and family.draft.parallel_drafting


def family_of(config: Mapping[str, Any]) -> Family:
    """The record of the family vLLM would build for this config.json (or, for a variant a record takes by a config
    key, the layout the checkpoint is in), or UnsupportedArchitectureError."""
    family = _claimant(architecture_of(config), config)
    assert family is not None  # architecture_of returns only a claimed architecture
    return family


def _claimant(arch: Any, config: Mapping[str, Any]) -> Family | None:
    """The record that takes `arch` for this config.json: the variant whose Family.variant.when holds, else the record
    that claims it outright; None when neither does."""
    if not isinstance(arch, str):
        return None
    variant = _VARIANTS.get(arch)
    if variant is not None and variant.variant is not None and variant.variant.when.of(config):
        return variant
    return _BY_ARCH.get(arch)


def is_draft(config: Mapping[str, Any]) -> bool:
    """Whether config.json is an EAGLE-3 draft (whose runtime names need the target's layer count): a speculators
    eagle3 config, or an architecture whose record is a draft layout. Never raises: acceptance and eval ask it of
    models quantkit cannot name."""
    if config.get("speculators_model_type") == "eagle3":
        return True
    archs = config.get("architectures") or []
    return any(f is not None and f.is_draft for f in (_claimant(a, config) for a in archs))


def model_kind(config: Mapping[str, Any]) -> ModelKind:
    """`eagle3-draft`, `moe-target` or `dense-target`, from config.json alone, as its family's record says
    (Family.kind; a wrapper asks its text family). A config no record names is a draft if it is a speculators eagle3
    config, else MoE when any record's expert-count key is > 1 in it, else dense: acceptance and eval ask it of
    models quantkit cannot name."""
    if is_draft(config):
        return EAGLE3_DRAFT
    try:
        family = family_of(config)
    except UnsupportedArchitectureError:
        keys = {k for f in _BY_NAME.values() if f.moe is not None for k in f.moe.expert_count_keys}
        moe = any(_count(c.get(k)) > 1 for c in (config, text_config(dict(config))) for k in keys)
        return MOE_TARGET if moe else DENSE_TARGET
    if family.wrapper is not None:
        text = _text_config_of(config, family.wrapper)
        try:
            return family_of(text).kind(text)
        except UnsupportedArchitectureError:
            return DENSE_TARGET
    return family.kind(config)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def text_family(config: Mapping[str, Any]) -> tuple[Family | None, dict[str, Any], str]:
    """(the record of the text model, its config, the text model's tensor-name prefix): a wrapper's text family under
    its text_config and prefix (Kimi-K2.5: DeepSeek-V3 under `language_model.`), else the config's own family, the
    config and "". The record is None for a config no record names (never raises: kernels and formats ask it)."""
    try:
        family = family_of(config)
    except UnsupportedArchitectureError:
        return None, dict(config), ""
    if family.wrapper is None:
        return family, dict(config), ""
    text = _text_config_of(config, family.wrapper)
    try:
        return family_of(text), text, family.wrapper.text_prefix
    except UnsupportedArchitectureError:
        return None, text, family.wrapper.text_prefix


def fused_layouts(config: Mapping[str, Any]) -> tuple[FusedLayout, ...]:
    """The fused-expert layouts a checkpoint of this config may store, from its (text) family's record
    (MoeLayout.fused): what quantkit.io.formats.detect_format is handed."""
    family = text_family(config)[0]
    return family.moe.fused if family is not None and family.moe is not None else ()


def mtp_tensor_names(config: Mapping[str, Any], names: Iterable[str]) -> list[str]:
    """The checkpoint's multi-token-prediction tensors, where its (text) family's record puts them
    (Family.mtp_prefix, mtp_layer_keys, a wrapper's text prefix), by quantkit.io.formats.mtp_tensor_names."""
    family, text, prefix = text_family(config)
    if family is None:
        return []
    return _mtp_names(text, names, count_keys=family.mtp_layer_keys, prefix=prefix, stored_prefix=family.mtp_prefix)


def _text_config_of(config: Mapping[str, Any], wrapper: Wrapper) -> dict[str, Any]:
    """A wrapper's text config, with the architecture vLLM builds for it when it names none."""
    raw = config.get(wrapper.text_config_key)
    text = dict(raw) if isinstance(raw, dict) else {}
    if not text.get("architectures"):
        arch = (wrapper.text_architecture_by_model_type or {}).get(str(text.get("model_type")))
        text["architectures"] = [arch] if arch else []
    return text


def runtime_layers(
    config: Mapping[str, Any], tensor_names: Iterable[str], target_num_layers: int | None = None
) -> list[RuntimeLayer]:
    """Every linear / MoE / lm_head / embedding module vLLM builds for this checkpoint, in model order.

    `config` is the checkpoint's config.json as a dict, `tensor_names` all its tensor names (the index's
    weight_map keys), `target_num_layers` the target's num_hidden_layers (required for EAGLE-3 drafts, whose vLLM
    layers are numbered after the target's). Raises CheckpointLayoutError when the tensors do not fit the layout the
    architecture's vLLM model file loads.
    """
    return checkpoint_layers(config, tensor_names, target_num_layers)[0]


def checkpoint_layers(
    config: Mapping[str, Any], tensor_names: Iterable[str], target_num_layers: int | None = None
) -> tuple[list[RuntimeLayer], CheckpointModules | None]:
    """runtime_layers, and the CheckpointModules of `tensor_names` the layers' checkpoint_modules were taken from
    (None for a multimodal wrapper, whose modules are the text model's renamed)."""
    archs = config.get("architectures") or []
    wrapped = next((_BY_ARCH[a] for a in archs if a in _BY_ARCH and _BY_ARCH[a].wrapper is not None), None)
    if wrapped is not None and wrapped.wrapper is not None:
        return _wrapped_layers(config, list(tensor_names), wrapped.wrapper, wrapped.vllm_source), None
    family = family_of(config)
    if family.build_layers is None:  # pragma: no cover - only a wrapper has no builder, and it is handled above
        raise UnsupportedArchitectureError(f"{family.name} has no layer builder; quantkit bug")
    ckpt = CheckpointModules(tensor_names)
    layers = family.build_layers(config, ckpt, target_num_layers)
    reject_leftovers(ckpt, family.vllm_source)
    return layers, ckpt


def _wrapped_layers(config: Mapping[str, Any], names: list[str], wrapper: Wrapper, source: str) -> list[RuntimeLayer]:
    """The text model's layers under the wrapper's prefix, plus one kept-BF16 layer per encoder linear."""
    prefix, encoders, renames = wrapper.text_prefix, wrapper.encoder_prefixes, wrapper.encoder_renames
    if not isinstance(config.get(wrapper.text_config_key), dict):
        raise CheckpointLayoutError(f"{source}: a {config.get('architectures')} config needs a text_config")
    text = _text_config_of(config, wrapper)
    inner = [n[len(prefix) :] for n in names if n.startswith(prefix)]
    if not inner:
        raise CheckpointLayoutError(
            f"{source}: no {prefix}* tensors; is this a {config.get('architectures')} "
            "checkpoint as it ships (language_model.model.layers.*)?"
        )
    layers = [
        RuntimeLayer(
            prefix + lay.name,
            lay.kind,
            lay.role,
            tuple(prefix + s for s in lay.shards),
            tuple(prefix + m for m in lay.checkpoint_modules),
            lay.quantizable,
            lay.layer_index,
            lay.exclude_renames,
            lay.source,
        )
        for lay in runtime_layers(text, inner)
    ]
    others = [n for n in names if not n.startswith(prefix)]
    unknown = [n for n in others if not n.startswith(encoders)]
    if unknown:
        raise CheckpointLayoutError(
            f"{source}: tensor {unknown[0]} is neither {prefix}* nor an encoder "
            f"({', '.join(encoders)}); quantkit does not know where vLLM loads it"
        )
    for module in dict.fromkeys(n.removesuffix(".weight") for n in others if n.endswith(".weight")):
        runtime = renamed(module, renames)
        layers.append(
            RuntimeLayer(runtime, "linear", VISION_ROLE, (), (module,), wrapper.encoders_quantizable, None, (), source)
        )
    return layers
