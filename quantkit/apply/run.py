"""`quantkit apply`: quantize a checkpoint with Quark as a recipe says, with an `exclude` list vLLM really honours.

Flow: read the source (headers only) -> map every layer to vLLM's runtime name (quantkit.naming.vllm_names) -> decide per
layer from the recipe (quantize with which scheme, or keep and why) -> run Quark, in memory (ModelQuantizer) or
per shard (direct_quantize_checkpoint) -> rewrite `quantization_config` so that `exclude` and per-layer entries use
vLLM's runtime names -> verify the written tensors against the plan and the source -> write quantkit.json ->
rename the finished folder into place.

Quark is imported only here, inside functions (`import quark.torch` takes ~30 s).
"""

from __future__ import annotations

import resource
import sys
import time
from pathlib import Path

from quantkit.apply.output import (
    refuse_non_finite,
    restore_kept_tensors,
    rewrite_layer_quant_config,
    verify_output,
)
from quantkit.apply.plan import (
    ApplyError,
    ApplyVerificationError,
    draft_runtime_name,
    plan_layers,
    vllm_exclude,
)
from quantkit.apply.quark_engine import run_in_memory, run_per_shard
from quantkit.io import jsonout
from quantkit.io.checkpoint import (
    atomic_output,
    check_output_free,
    copy_aux_files,
    resolve_source,
    sha256_file,
)
from quantkit.io.headers import read_config
from quantkit.naming.config import target_layer_count
from quantkit.naming.drafts import (
    DraftInfo,
    draft_config_for_vllm,
    draft_info,
    model_kind,
)
from quantkit.naming.vllm_names import UNKNOWN_TARGET_LAYERS
from quantkit.progress import Progress, or_silent
from quantkit.recipes import Recipe, load_recipe
from quantkit.results import EAGLE3_DRAFT, ApplyResult
from quantkit.versions import versions

# Architectures whose transformers 5 in-memory module names differ from their checkpoint names: Quark's in-memory
# export writes the in-memory names, which vLLM's loader for that architecture does not read. transformers 5 loads
# MiniMax-M2's `block_sparse_moe.experts.<e>.w1/w2/w3` as `mlp.experts` (conversion_mapping.py), so the export
# would hold `mlp.experts.<e>.gate_proj`, and vllm/model_executor/models/minimax_m2.py expects the original names.
IN_MEMORY_RENAMES = {
    "minimax_m2": "transformers 5 renames block_sparse_moe.experts.*.w1/w2/w3 in memory, so Quark's in-memory "
                  "export would write names vLLM's MiniMax-M2 loader does not read",
}







# --- Quark ---------------------------------------------------------------------------------------------------------


def resolve_device(device: str) -> str:
    if device not in ("auto", "cpu", "cuda"):
        raise ApplyError(f"device {device!r}: use auto, cpu or cuda")
    if device == "cpu":
        return "cpu"
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise ApplyError("device cuda: no CUDA/ROCm GPU visible to torch; use --device cpu or auto")
    return "cuda" if torch.cuda.is_available() else "cpu"


def apply(recipe: str | Path | Recipe, model: str | Path, output: str | Path, *, device: str = "auto",
          path: str | None = None, overwrite: bool = False, target: str | Path | None = None,
          progress: Progress | None = None) -> ApplyResult:
    """Quantize `model` with `recipe` into `output` (written to a temporary folder, renamed when complete)."""
    from quantkit.naming.vllm_names import runtime_layers

    progress = or_silent(progress)
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
    n_target = target_layer_count(target) if target is not None else None
    if kind == EAGLE3_DRAFT:
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
                            (n_target or UNKNOWN_TARGET_LAYERS) if kind == EAGLE3_DRAFT else None)
    decisions = plan_layers(rec, layers)
    if not any(d.action == "quantize" for d in decisions):
        raise ApplyError(f"recipe {rec.name} quantizes no layer of {model}; check its quantize/keep roles")
    exclude = vllm_exclude(layers, decisions, target_known=kind != EAGLE3_DRAFT or n_target is not None)
    if kind == EAGLE3_DRAFT and n_target is None:
        for d in decisions:
            d.runtime_name = draft_runtime_name(d.runtime_name)
    dev = resolve_device(device)
    timings["plan"] = time.perf_counter() - t0
    progress(f"{src.architecture} ({kind}): {sum(d.action == 'quantize' for d in decisions)} layers to quantize, "
             f"{sum(d.action == 'keep' for d in decisions)} kept; vLLM exclude: {exclude}")

    hashes = {f: sha256_file(src.path / f) for f in src.files}
    progress("checking that every weight to quantize is finite")
    refuse_non_finite(src, decisions)
    with atomic_output(output, overwrite, [src.path, *local_inputs]) as tmp:
        t1 = time.perf_counter()
        runner = run_in_memory if run_path == "in-memory" else run_per_shard
        quark_exclude = runner(src.path, tmp, rec, kind, src.config, decisions, dev, progress)
        timings["quantize"] = time.perf_counter() - t1

        t2 = time.perf_counter()
        written = read_config(tmp)
        qc = written.get("quantization_config")
        if not isinstance(qc, dict):
            raise ApplyVerificationError(f"Quark wrote no quantization_config to {tmp / 'config.json'}")
        qc["exclude"] = exclude
        rewrite_layer_quant_config(qc, decisions, layers)
        qc.setdefault("layer_type_quant_config", {})
        if kind == EAGLE3_DRAFT:
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
            command=" ".join(sys.argv) if sys.argv else "", target=str(target) if target is not None else None,
            output=str(output.expanduser().resolve()), source=src.hub_id or str(src.path.resolve()),
            recipe=rec.to_dict(), model_kind=kind, architecture=src.architecture, path=run_path,
            path_reason=path_note, device=dev,
            exclude=exclude, quark_exclude=quark_exclude, layers=decisions, size_before_bytes=src.size_bytes,
            size_after_bytes=out_size, timings_s={k: round(v, 3) for k, v in timings.items()},
            peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            versions=versions(), source_files=hashes, verified=verified, target_num_layers=n_target,
            output_files=sorted([p.name for p in tmp.iterdir()] + ["quantkit.json"]),
        )
        (tmp / "quantkit.json").write_text(jsonout.dumps(result.to_dict()) + "\n")
    progress(f"wrote {result.output} in {timings['total']:.1f}s")
    return result
