"""The families listing (`quantkit families`) and the nearest supported family of an unsupported config: both read
the records of quantkit.naming.archs and nothing else, so a new record appears in them by existing."""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from typing import Any

from quantkit.naming.archs import families
from quantkit.naming.family import Family
from quantkit.results.families import FamilyEntry, KeptPart

# Words of a draft architecture's name (EAGLE-3, DFlash, DSpark, P-EAGLE, MTP drafts).
_DRAFT_WORDS = ("Eagle", "Draft", "DSpark", "DFlash", "MTP")


def family_entry(family: Family) -> FamilyEntry:
    """One record as `quantkit families` lists it."""
    if family.draft is not None:
        kind = "draft layout"
    elif family.wrapper is not None:
        kind = "wrapper"
    else:
        kind = "MoE family" if family.moe is not None else "dense family"
    return FamilyEntry(name=family.name, architectures=list(family.architectures), vllm_source=family.vllm_source,
                       kind=kind, model_types=model_types(family),
                       vllm_builds=family.draft is None or family.draft.vllm_refusal is None,
                       variants=variants(family), kept=kept_parts(family))  # fmt: skip


def variants(family: Family) -> list[str]:
    """The architectures the record takes from another record's by a config key (Family.variant), with the key."""
    if family.variant is None:
        return []
    when = family.variant.when
    value = json.dumps(when.equals if when.equals is not None else True)
    return [f"{arch} with {when.name}: {value}" for arch in family.variant.architectures]


def model_types(family: Family) -> list[str]:
    """The config.json model_type values the record names (its Quark templates are keyed on them)."""
    return [t for t in family.quark_templates if t != "*"]


def kept_parts(family: Family) -> list[KeptPart]:
    """What every recipe leaves unquantized in this family, each with the reason, from the record's fields."""
    kept = []
    if family.draft is not None:
        kept.append(KeptPart(part="lm_head, embed_tokens, d2t/t2d",
                             reason="the draft's vocabulary projection and token maps: vLLM gives them no Quark method "
                                    "and acceptance depends on them"))  # fmt: skip
    else:
        kept.append(KeptPart(part="lm_head, embed_tokens", reason="vLLM gives them no Quark method"))
    if family.moe is not None and family.moe.router is not None:
        kept.append(KeptPart(part="router and its bias (the score-correction bias where the family has one)",
                             reason="routing picks the experts: every MoE recipe keeps it BF16, excluded by name where "
                                    "vLLM would give it a Quark method"))  # fmt: skip
    elif family.moe is not None:  # an MoE-layer draft: vLLM builds no router for it, the recipes keep it all the same
        kept.append(KeptPart(part="router and its bias (the score-correction bias where the draft has one)",
                             reason="routing picks the experts: a small logit error sends a token to other experts, "
                                    "so fp8-draft keeps the router BF16 and its bias as stored"))  # fmt: skip
    if family.draft is not None:
        kept.append(KeptPart(part="norms (hidden_norm, input/post-attention layernorms, norm)",
                             reason="vectors, not linear layers: no recipe quantizes them, they are written as "
                                    "stored"))  # fmt: skip
    if family.mtp_layer_keys or family.mtp_prefix or family.mtp_exclude is not None:
        kept.append(
            KeptPart(
                part="MTP layers",
                reason="vLLM's target never loads them; its MTP draft model reads "
                "them with the target's quant config, so they are not quantized: BF16 (decoded from an FP8 "
                "source), or MXFP4 as stored where the source's experts already are (DeepSeek-V4)",
            )
        )
    if family.wrapper is not None:
        kept.append(
            KeptPart(
                part=", ".join(p.rstrip(".") for p in family.wrapper.encoder_prefixes) or "encoders",
                reason="the vision encoder and projector: quantkit quantizes the text model only",
            )
        )
    return kept


def family_list() -> list[FamilyEntry]:
    """Every registered record, in name order."""
    return [family_entry(f) for f in families()]


def nearest_family(config: Mapping[str, Any]) -> Family | None:
    """The supported family closest to an unsupported config.json: the one sharing its model_type's stem
    (deepseek_v4 -> deepseek_v3...), else the one whose architecture name is most alike; None when nothing is alike."""
    model_type = str(config.get("model_type") or "")
    text = config.get("text_config")
    if not model_type and isinstance(text, Mapping):
        model_type = str(text.get("model_type") or "")
    archs = [str(a) for a in config.get("architectures") or ()]
    if any(w in a for a in archs for w in _DRAFT_WORDS):  # a draft is nearest to a draft layout, whatever its base
        drafts = {a: f for f in families() if f.draft is not None for a in f.architectures}
        for arch in archs:
            match = difflib.get_close_matches(arch, list(drafts), n=1, cutoff=0.0)
            if match:
                return drafts[match[0]]
    records = [f for f in families() if f.draft is None]
    by_type = {t: f for f in records for t in model_types(f)}
    if model_type:
        match = difflib.get_close_matches(model_type, list(by_type), n=1, cutoff=0.6)
        if match:
            return by_type[match[0]]
    by_arch = {a: f for f in families() for a in f.architectures}
    for arch in archs:
        match = difflib.get_close_matches(arch, list(by_arch), n=1, cutoff=0.6)
        if match:
            return by_arch[match[0]]
    return None
