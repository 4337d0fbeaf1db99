"""The Quark quantization_config as vLLM's Quark loader reads it: the keys it requires, the layer_type_quant_config
entries it ignores, and layer_quant_config keys that match no runtime layer
(vllm/model_executor/layers/quantization/quark/quark.py)."""

from __future__ import annotations

import fnmatch
from typing import Any

from quantkit.naming.precision import LoadedCheckpoint
from quantkit.rules.rule import Findings, RuleContext

_KEY_RULES = {
    "quant_method": ("vLLM picks its Quark loader by quant_method; without it the checkpoint is not loaded as Quark",
                     '"quant_method": "quark"'),
    "export": ("QuarkConfig.from_config raises ValueError when `export` is missing (quark.py)",
               '"export": {"kv_cache_group": [], "pack_method": "reorder", "weight_format": "real_quantized"}'),
    "global_quant_config": ("every layer no layer_quant_config key matches falls back to it; without it vLLM crashes "
                            "building the first quantized layer (quark.py _find_matched_config)",
                            "restore the global_quant_config Quark exported"),
    "layer_type_quant_config": ("quark.py _find_matched_config calls layer_type_quant_config.get(...): AttributeError "
                                "when it is missing", '"layer_type_quant_config": {}'),
    "exclude": ("quark.py get_quant_method_target passes quant_config.get('exclude') to should_ignore_layer, which "
                "iterates it: TypeError when it is missing", '"exclude": [] (or the layers to keep unquantized)'),
}  # fmt: skip


def config_keys(ctx: RuleContext) -> None:
    """quark-config-keys: a quantization_config vLLM's Quark loader can read (or none: every layer BF16)."""
    qc = ctx.subject.qc
    if qc is None:
        ctx.findings.add(
            "info",
            "not-quantized",
            "quantization_config",
            "config.json has no quantization_config: vLLM loads every layer unquantized",
        )
    else:
        _required_keys(qc, ctx.findings)


def layer_type_config_ignored(ctx: RuleContext) -> None:
    """layer-type-config-ignored: vLLM looks layer_type_quant_config up by the module's class, which no JSON key is."""
    if not ctx.subject.replayed:
        return
    for message in ctx.subject.config_problems:
        ctx.findings.add(
            "warning",
            "layer-type-config-ignored",
            "quantization_config.layer_type_quant_config",
            message,
            "move these entries to layer_quant_config (keys are runtime layer names or * patterns)",
        )


def layer_config_keys(ctx: RuleContext) -> None:
    """layer-config-keys: every layer_quant_config key names a runtime layer."""
    view = ctx.subject
    if view.is_quark:
        assert view.qc is not None  # is_quark implies a quantization_config
        _layer_quant_config_keys(view.loaded, view.qc, ctx.findings)


def _required_keys(qc: dict[str, Any], findings: Findings) -> None:
    if "quant_method" in qc and qc["quant_method"] != "quark":
        findings.add(
            "error",
            "not-quark",
            "quantization_config.quant_method",
            f'quant_method is {qc["quant_method"]!r}; quantkit checks Quark checkpoints (quant_method "quark") only',
            "re-export the checkpoint with Quark, or check it with its own tools",
        )
        return
    for key in ("quant_method", "export", "global_quant_config", "layer_type_quant_config", "exclude"):
        if key not in qc:
            why, fix = _KEY_RULES[key]
            findings.add(
                "error",
                "config-key-missing",
                f"quantization_config.{key}",
                f"quantization_config has no {key!r}: {why}",
                f"add {fix}",
            )
    export = qc.get("export")
    if isinstance(export, dict) and not isinstance(export.get("kv_cache_group"), list):
        findings.add(
            "error",
            "config-key-missing",
            "quantization_config.export.kv_cache_group",
            "export has no kv_cache_group list; QuarkConfig.from_config takes len() of it (TypeError)",
            'add "kv_cache_group": [] to export',
        )
    kv_groups = export.get("kv_cache_group") if isinstance(export, dict) else None
    if "layer_quant_config" not in qc:
        severity = "error" if kv_groups else "warning"
        findings.add(
            severity,
            "config-key-missing",
            "quantization_config.layer_quant_config",
            "quantization_config has no 'layer_quant_config'; Quark always writes it"
            + (
                "; QuarkConfig.from_config reads kv_cache_group settings from it (AttributeError)"
                if kv_groups
                else "; vLLM 0.32 treats it as empty"
            ),
            'add "layer_quant_config": {}',
        )
    exclude = qc.get("exclude")
    if "exclude" in qc and (
        isinstance(exclude, str) or not isinstance(exclude, list) or not all(isinstance(e, str) for e in exclude)
    ):
        findings.add(
            "error",
            "exclude-not-list",
            "quantization_config.exclude",
            f"exclude must be a list of strings, got {exclude!r:.80}",
            "write exclude as a JSON list of names",
        )


def _layer_quant_config_keys(ck: LoadedCheckpoint, qc: dict[str, Any], findings: Findings) -> None:
    lqc = qc.get("layer_quant_config")
    if not isinstance(lqc, dict) or not lqc:
        return
    names = [n for layer in ck.layers for n in (layer.shards or (layer.name,))]
    for key in lqc:
        hit = any((fnmatch.fnmatch(n, key) if "*" in key else n in key) for n in names)
        if not hit:
            findings.add(
                "warning",
                "layer-config-unmatched",
                f"layer_quant_config.{key}",
                f"layer_quant_config key {key!r} matches no runtime layer (vLLM looks keys up by runtime "
                "name: substring of the key, or fnmatch for keys with *), so its config is never used",
                "rename the key to the runtime layer name (see `quantkit inspect`)",
            )
