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


def quark_view(folder: str | Path) -> Path:
    """A temporary folder of symlinks to `folder`, with `exclude` in Quark's checkpoint names when known."""
    folder = Path(folder)
    cfg = json.loads((folder / "config.json").read_text())
    manifest = folder / "quantkit.json"
    view = Path(tempfile.mkdtemp(prefix="quantkit-quark-view-"))
    for f in folder.iterdir():
        if f.name != "config.json":
            os.symlink(f.resolve(), view / f.name)
    if manifest.is_file():
        cfg["quantization_config"]["exclude"] = json.loads(manifest.read_text())["quark_exclude"]
    (view / "config.json").write_text(json.dumps(cfg))
    return view


def load_for_torch(folder: str | Path, device: str = "cpu", dtype=None):
    """A torch model of a Quark checkpoint (weights fake-quantized as Quark runs them), in float32 by default."""
    import torch

    from quantkit.io.quark import import_quark, quark_output_to_stderr

    cfg = json.loads((Path(folder) / "config.json").read_text())
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
