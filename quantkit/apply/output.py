"""The output of `quantkit apply` before it is renamed into place: quantization_config under vLLM names, source dtypes of kept tensors restored, and verification against the plan and the source (kept tensors byte-identical, scales finite and positive, no non-finite source weight quantized)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantkit.apply.plan import (
    ApplyVerificationError,
    LayerDecision,
)
from quantkit.errors import NonFiniteWeightError
from quantkit.io import jsonout
from quantkit.io.checkpoint import (
    SourceCheckpoint,
)
from quantkit.io.files import copy_aux_files, is_weight_file
from quantkit.io.headers import checkpoint_tensors
from quantkit.naming.drafts import draft_config_for_vllm
from quantkit.schemes import SCHEMES
from quantkit.vocab import EAGLE3_DRAFT

if TYPE_CHECKING:
    from quantkit.apply.plan import ApplyPlan

# --- output --------------------------------------------------------------------------------------------------------


def final_config(plan: ApplyPlan, quark_qc: dict[str, Any]) -> dict[str, Any]:
    """The output's config.json: the source's config with the quantizer's `quantization_config` (`quark_qc`, in
    checkpoint names) under vLLM's runtime names, the exclude list vLLM's, an EAGLE-3 draft's config as vLLM reads
    it, the source's own quantization config removed, and the MTP layer counts zeroed when the recipe drops MTP."""
    qc = dict(quark_qc)
    qc["exclude"] = plan.exclude
    rewrite_layer_quant_config(qc, plan.decisions, plan.layers)
    qc.setdefault("layer_type_quant_config", {})
    if plan.kind == EAGLE3_DRAFT:
        assert plan.info is not None
        return draft_config_for_vllm(plan.src.config, plan.info, qc)
    # The source's own quantization config (FP8-block, compressed-tensors; top level or in text_config) must not
    # survive: vLLM reads the top-level one first and text_config's second.
    config = {
        k: ({kk: vv for kk, vv in v.items() if kk != "quantization_config"} if isinstance(v, dict) else v)
        for k, v in plan.src.config.items()
        if k not in ("quantization_config", "compression_config")
    }
    config["quantization_config"] = qc
    if plan.dropped:  # the MTP layers are gone: say so where vLLM's MTP draft would look for them
        for cfg in (config, config.get("text_config")):
            if isinstance(cfg, dict):
                for key in ("num_nextn_predict_layers", "num_mtp_modules"):
                    if key in cfg:
                        cfg[key] = 0
    return config


def write_final_files(plan: ApplyPlan, dst: Path, quark_qc: dict[str, Any]) -> None:
    """Write the output's final config.json (`final_config`) and its files beside the weights, once: everything in
    `dst` but the weights (Quark's exporters write files of their own: generation_config.json, ...) is removed,
    sub-folders included, and the source's allow-list is copied (quantkit.io.files.AUX_FILES)."""
    (dst / "config.json").write_text(jsonout.dumps(final_config(plan, quark_qc)) + "\n")
    for stale in dst.iterdir():
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale)
        elif not is_weight_file(stale.name):
            stale.unlink()
    copy_aux_files(plan.src.path, dst)


def rewrite_layer_quant_config(qc: dict[str, Any], decisions: list[LayerDecision], layers: list[Any]) -> None:
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
        for name in layer.shards or (layer.name,):
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


def verify_output(
    src: SourceCheckpoint,
    out: Path,
    decisions: list[LayerDecision],
    kept_checked_by_hash: bool = False,
    source_tensors: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Check the written tensors against the plan: kept tensors byte-identical to the source, quantized ones in
    a quantized dtype with finite, positive scales. Raises ApplyVerificationError on the first mismatch.

    `kept_checked_by_hash`: the native executor already proved every kept tensor's bytes equal to the source's
    (SHA-256 of the bytes read against the bytes written), so here only their presence, dtype and shape are
    checked from the headers, without reading the output back; its scales were tested (finite, positive) as they
    were written, so they are not read back either. `source_tensors` replaces the source's own tensor list
    for a decoded source (FP8-block, INT4): what the quantizer saw."""
    from safetensors import safe_open

    out_tensors = checkpoint_tensors(out)
    quantized_modules = {m: d for d in decisions if d.action == "quantize" for m in d.checkpoint_modules}
    checked_identical = 0
    for m, d in quantized_modules.items():
        w = out_tensors.get(f"{m}.weight")
        record = SCHEMES.get(d.scheme or "")
        weight_dtype = record.weight_dtype if record is not None else None
        if w is None:
            raise ApplyVerificationError(f"{out}: quantized layer {m} has no weight tensor")
        if weight_dtype and w.dtype != weight_dtype:
            raise ApplyVerificationError(
                f"{out}: {m}.weight is {w.dtype}, but the plan quantizes it with {d.scheme}; Quark skipped it"
            )
        scale = out_tensors.get(f"{m}.weight_scale")
        if scale is None:
            raise ApplyVerificationError(f"{out}: quantized layer {m} has no weight_scale")
        if not kept_checked_by_hash:  # the native executor tested every scale on the device as it wrote it
            _check_scale_values(out, f"{m}.weight_scale", scale)
    quantized_tensor_prefixes = tuple(f"{m}." for m in quantized_modules)
    handles: dict[tuple[str, str], Any] = {}

    def tensor(folder: Path, file: str, name: str):
        key = (str(folder), file)
        if key not in handles:
            handles[key] = safe_open(str(folder / file), "pt")
        return handles[key].get_tensor(name)

    for name, info in (source_tensors or src.tensors).items():  # a decoded source: its decoded tensors
        if name.startswith(quantized_tensor_prefixes):
            continue
        o = out_tensors.get(name)
        if o is None:
            raise ApplyVerificationError(f"{out}: tensor {name} from the source is missing from the output")
        if kept_checked_by_hash:
            if (o.dtype, o.shape) != (info.dtype, info.shape):
                raise ApplyVerificationError(
                    f"{out}: kept tensor {name} is {o.dtype} {list(o.shape)}, the source's "
                    f"{info.dtype} {list(info.shape)}"
                )
            checked_identical += 1
            continue
        a, b = tensor(src.path, info.file, name), tensor(out, o.file, name)
        if a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape) or _bytes(a) != _bytes(b):
            raise ApplyVerificationError(f"{out}: kept tensor {name} differs from the source")
        checked_identical += 1
    return {
        "kept_tensors_byte_identical": checked_identical,
        "quantized_layers_checked": len(quantized_modules),
        "kept_bytes_checked": "written from the source bytes read and hashed"
        if kept_checked_by_hash
        else "read back and compared",
        "scales_checked": "while writing" if kept_checked_by_hash else "read back",
    }


def _check_scale_values(out: Path, name: str, info: Any) -> None:
    """Every written scale must be finite and positive (E8M0: not the NaN byte 0xFF) before the folder is renamed."""
    import numpy as np

    from quantkit.io.tensordata import TensorReader

    values = TensorReader(out).array(info.file, name)
    if info.dtype in ("U8", "F8_E8M0"):
        bad = np.argwhere(values == 0xFF)
        what = "the E8M0 NaN byte 0xFF"
    else:
        bad = np.argwhere(~(np.isfinite(values) & (values > 0)))
        what = "not finite and positive"
    if bad.size:
        index = bad[0].tolist()
        raise ApplyVerificationError(
            f"{out}: {name}{index} = {values[tuple(index)]} is {what}; Quark wrote an "
            "unusable scale (is the source weight damaged?), so no output was written"
        )


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
                        "non-finite weights (the group's scale would be NaN): repair or re-export the source"
                    )


def _bytes(t) -> bytes:
    import torch

    t = t.contiguous()
    return t.view(torch.uint8).numpy().tobytes() if t.dtype != torch.bool else t.numpy().tobytes()
