"""Loading Quark checkpoints into PyTorch for evaluation and reference runs (eval, acceptance).

Quark's own importer (`quark.torch.import_model_from_safetensors`) is used for every Quark checkpoint: it loads
MoE checkpoints that transformers mis-loads. quantkit writes `exclude` in vLLM's runtime names, which Quark's
importer (fnmatch on checkpoint module names) does not understand; quantkit.json records the Quark-side list
(`quark_exclude`), so the importer reads a view of the folder whose config carries that list.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from quantkit.errors import CheckpointError
from quantkit.io.headers import read_config


def quark_view(folder: str | Path) -> Path:
    """A temporary folder of symlinks to `folder`, with `exclude` in Quark's checkpoint names when known."""
    from quantkit.results import load_manifest

    folder = Path(folder)
    cfg = read_config(folder)
    quark_exclude = None
    if (folder / "quantkit.json").is_file():
        manifest = load_manifest(folder)  # typed: quark_exclude is a list of names, or absent (older outputs)
        quark_exclude = manifest.quark_exclude if "quark_exclude" in manifest.model_fields_set else None
    view = Path(tempfile.mkdtemp(prefix="quantkit-quark-view-"))
    for f in folder.iterdir():
        if f.name != "config.json":
            os.symlink(f.resolve(), view / f.name)
    if quark_exclude is not None and isinstance(cfg.get("quantization_config"), dict):
        cfg["quantization_config"]["exclude"] = quark_exclude
    (view / "config.json").write_text(json.dumps(cfg))
    return view


def load_for_torch(folder: str | Path, device: str = "cpu", dtype=None):
    """A torch model of a Quark checkpoint (weights fake-quantized as Quark runs them), in float32 by default."""
    import torch

    from quantkit.io.quark import import_quark, quark_output_to_stderr

    cfg = read_config(folder)
    if (cfg.get("quantization_config") or {}).get("quant_method") != "quark":
        raise CheckpointError(f"{folder}: not a Quark checkpoint (no quantization_config with quant_method quark)")
    import_quark()
    from quark.torch import import_model_from_safetensors

    view = quark_view(folder)
    try:
        with quark_output_to_stderr():
            model = import_model_from_safetensors(None, str(view), device=device)
    finally:
        shutil.rmtree(view, ignore_errors=True)
    return model.to(dtype or torch.float32).eval()
