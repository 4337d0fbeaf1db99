"""The exclude list as vLLM matches it: entries it ignores (Quark checkpoint names, fnmatch globs, names of nothing),
invalid regexes, fused layers excluded in part, and the exclude list that would keep exactly the intended layers
(vllm/model_executor/layers/quantization/quark/utils.py should_ignore_layer,
vllm/model_executor/layers/quantization/utils/config_utils.py find_matching_patterns; replayed in
quantkit.naming.exclude)."""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Sequence
from typing import Any

from quantkit.io.headers import TensorInfo
from quantkit.io.safetensors import FLOAT_DTYPES
from quantkit.naming.precision import PLACEHOLDER, LoadedCheckpoint
from quantkit.results.precision import LayerPrecision
from quantkit.rules.rule import Findings, RuleContext


def exclude_matching(ctx: RuleContext) -> None:
    """exclude-matching: every exclude entry does what it says, as vLLM matches it."""
    view = ctx.subject
    if view.is_quark:
        _exclude_entries(view.loaded, view.layers, view.runtime_layers, view.modules, ctx.findings)
        _mtp_draft_excluded(view.loaded, ctx.findings)


def _mtp_draft_layers(ck: LoadedCheckpoint) -> list[Any]:
    """The layers vLLM's MTP draft builds from this checkpoint's MTP tensors (none for a family without a record of
    them, or a checkpoint without MTP tensors)."""
    build = ck.family.mtp_draft_layers if ck.family is not None else None
    return build(ck.config, ck.tensors) if build is not None else []


def _mtp_draft_excluded(ck: LoadedCheckpoint, findings: Findings) -> None:
    """mtp-draft-quantized: vLLM builds the MTP draft (`--speculative-config '{"method": "mtp"}'`) with the target's
    quant config (qwen3_5_mtp.py / qwen3_next_mtp.py, deepseek_mtp.py, glm4_moe_mtp.py), so MTP layers whose weights
    are stored as floats must be excluded under the draft's runtime names too, or the draft fails to load (BF16 weight,
    quantized parameter)."""
    from quantkit.naming.exclude import ExcludeListError, is_excluded

    exclude = ck.qc.get("exclude") if ck.qc else None
    if not isinstance(exclude, list) or not all(isinstance(e, str) for e in exclude):
        return
    missed = []
    for layer in _mtp_draft_layers(ck):
        floats = all(ck.tensors[t].dtype in FLOAT_DTYPES for m in layer.checkpoint_modules
                     for t in (m, f"{m}.weight") if t in ck.tensors)  # fmt: skip
        try:
            if floats and not is_excluded(layer, exclude):
                missed.append(layer.name)
        except ExcludeListError:
            return  # exclude-matching reports the list itself
    if missed:
        entries = ck.family.mtp_exclusions(ck.config, ck.tensors) if ck.family is not None else ()
        findings.add(
            "warning",
            "mtp-draft-quantized",
            "quantization_config.exclude",
            f"the MTP layers {', '.join(missed)} keep float weights, but exclude does not exclude them under "
            "the runtime names of the MTP draft vLLM builds with this quant config (speculative method mtp): "
            "with MTP speculation vLLM gives them quantized parameters for float weights and fails to load the draft",
            f"add {_quoted(list(entries))} to exclude" if entries else "exclude the MTP draft's layers",
        )


def _quoted(entries: Sequence[str]) -> str:
    return json.dumps(list(entries))


def exclude_fix(ck: LoadedCheckpoint, resolved: Sequence[LayerPrecision], extra: set[str]) -> str:
    """The exclude list under which exactly the layers excluded now, plus `extra`, are excluded (vLLM names)."""
    from quantkit.naming.exclude import exclude_entries_for

    kept_names = {
        lp.name for lp in resolved if lp.exclude_rule is not None or lp.source == "partial_fused_exclusion"
    } | extra
    kept = [layer for layer in ck.layers if layer.name in kept_names]
    try:
        entries = exclude_entries_for(kept, ck.layers)
    except Exception:
        entries = [layer.name for layer in kept]
    fixed = []
    for e in entries:  # a draft checked without --target: its decoder layers' number is unknown
        if PLACEHOLDER in e:
            head, _, tail = e.partition(f"model.layers.{PLACEHOLDER}.")
            e = "re:" + re.escape(head.removeprefix("re:") + "model.layers.") + r"\d+\." + re.escape(tail) + "$"
        fixed.append(e)
    return f'write "exclude": {_quoted(fixed)}'


def _exclude_entries(
    ck: LoadedCheckpoint,
    resolved: list[LayerPrecision],
    by_name: dict[str, Any],
    modules: dict[str, list[tuple[str, TensorInfo]]],
    findings: Findings,
) -> None:
    """Entries vLLM ignores (Quark checkpoint names, fnmatch globs, names of nothing), invalid regexes, and fused
    layers excluded in part."""
    from quantkit.naming.exclude import ExcludeListError, PartialFusedExclusion, match_reason

    exclude = ck.qc.get("exclude") if ck.qc else None
    if not isinstance(exclude, list) or not all(isinstance(e, str) for e in exclude):
        return
    used: set[str] = set()
    for layer in [*ck.layers, *_mtp_draft_layers(ck)]:  # an entry for the MTP draft's layers is no unmatched entry
        try:
            m = match_reason(layer, exclude)
        except ExcludeListError as e:
            findings.add(
                "error",
                "exclude-invalid-regex",
                "quantization_config.exclude",
                str(e),
                "fix the regular expression (vLLM compiles it with the `regex` package)",
            )
            return
        if isinstance(m, PartialFusedExclusion):
            used.update(e for _, es in m.shard_entries for e in es)
        else:
            used.update(m.entries)
    quantized = {lp.name for lp in resolved if lp.quantized}
    not_applied: dict[str, list[str]] = {}
    for entry in exclude:
        if entry in used:
            continue
        # Quark writes checkpoint module names (fnmatch globs in its own config); vLLM matches runtime names only.
        hits = [
            layer
            for layer in ck.layers
            if not entry.startswith("re:")
            and any(
                m == entry or fnmatch.fnmatchcase(m, entry) or m.startswith(entry + ".")
                for m in layer.checkpoint_modules
            )
        ]
        if not hits:
            findings.add(
                "warning",
                "exclude-unmatched",
                entry,
                f"exclude entry {entry!r} matches no layer vLLM builds for this checkpoint "
                "(vLLM matches exact runtime names or `re:` regexes only); it has no effect",
                "remove it, or write the runtime name (see `quantkit inspect`)",
            )
            continue
        for layer in hits:
            if layer.name in quantized:
                not_applied.setdefault(layer.name, []).append(entry)
    if not_applied:
        fix = exclude_fix(ck, resolved, set(not_applied))
        for name, entries in not_applied.items():
            lp = next(lp for lp in resolved if lp.name == name)
            dtypes = sorted(
                {info.dtype for m in lp.checkpoint_modules for t, info in modules.get(m, []) if t.endswith(".weight")}
            )
            findings.add(
                "error",
                "exclude-not-applied",
                name,
                f"exclude entr{'ies' if len(entries) > 1 else 'y'} {', '.join(repr(e) for e in entries)} "
                f"name{'s' if len(entries) == 1 else ''} checkpoint module(s) of {name}, but vLLM matches exclude "
                f"against runtime names only (exact or `re:`), so it quantizes {name} as {lp.precision}"
                + (
                    f" although its weight is {'/'.join(dtypes)}: it would compute with garbage"
                    if dtypes and set(dtypes) <= FLOAT_DTYPES
                    else ""
                ),
                f"{fix} (or the `re:` form re:{re.escape(name)}$)",
            )
    for lp in resolved:
        if lp.source == "partial_fused_exclusion":
            layer = by_name[lp.name]
            findings.add(
                "error",
                "partial-fused-exclusion",
                lp.name,
                f"{lp.problem} (utils.py should_ignore_layer: ValueError 'Found different quantization "
                "schemes for the shards')",
                f"exclude all of {', '.join(layer.shards)} or the fused runtime name; "
                f"{exclude_fix(ck, resolved, set())}",
            )
