"""Running Quark 0.13 for `quantkit apply`: the QConfig from the plan, the in-memory path (ModelQuantizer) and the per-shard path (direct_quantize_checkpoint)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from quantkit.apply.plan import ApplyError, LayerDecision, quark_exclusions
from quantkit.io.headers import CONFIG_FILE, INDEX_FILE, checkpoint_tensors, safetensors_files
from quantkit.io.quark import import_quark, quark_output_to_stderr
from quantkit.naming.archs import quark_kv_layers, quark_template
from quantkit.progress import Progress
from quantkit.recipes import Recipe
from quantkit.vocab import EAGLE3_DRAFT


def quark_config(
    recipe: Recipe, template_name: str, decisions: list[LayerDecision], kv_layers: tuple[str, ...] | None = None
):
    """Quark QConfig: global scheme, exclude = every kept module (checkpoint names), overrides per module.
    `template_name` is the family's Quark template (quantkit.naming.archs.quark_template); `kv_layers` the family's
    KV-cache projection patterns where the template's would match other layers (quantkit.naming.archs
    .quark_kv_layers): get_config writes them as the QConfig's kv_cache_group and, with a KV-cache scheme, as the
    layer_quant_config entries that quantize those layers' outputs."""
    import copy

    from quark.torch import LLMTemplate

    template = LLMTemplate.get(template_name)
    if kv_layers is not None:  # a copy: Quark's registered template stays as Quark ships it
        template = copy.copy(template)
        template.kv_layers_name = list(kv_layers)
    exclude, layer_config = quark_exclusions(recipe, decisions)
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
    raw_layer_cfg = config.get("transformer_layer_config")
    layer_cfg: dict[str, Any] = raw_layer_cfg if isinstance(raw_layer_cfg, dict) else config
    hf_cfg = LlamaConfig(**{k: v for k, v in layer_cfg.items() if k not in ("architectures", "quantization_config")})

    class Eagle3DraftTensors(PreTrainedModel):
        config_class = LlamaConfig
        base_model_prefix = "draft"
        _no_split_modules: list[str] = []

        def __init__(self, cfg):
            super().__init__(cfg)
            for name in state:
                module_name, _, leaf = name.rpartition(".")
                parent: nn.Module = self
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
    from quantkit.io.hf import load_tokenizer
    from quantkit.io.prompts import load_prompts

    assert recipe.calibration is not None
    tok = load_tokenizer(src)
    texts = [r.render(tok) for r in load_prompts("builtin")]
    batches = []
    for i in range(recipe.calibration.samples):
        ids = tok(
            texts[i % len(texts)],
            return_tensors="pt",
            add_special_tokens=False,
            truncation=True,
            max_length=recipe.calibration.seq_len,
        )["input_ids"]
        batches.append(ids.to(device))
    return batches


def run_in_memory(
    src: Path,
    tmp: Path,
    recipe: Recipe,
    kind: str,
    config: dict[str, Any],
    decisions: list[LayerDecision],
    device: str,
    progress: Progress,
) -> list[str]:
    import torch

    import_quark()
    from quark.torch import ModelQuantizer, export_safetensors

    qconfig, quark_exclude = quark_config(recipe, quark_template(config), decisions, quark_kv_layers(config))
    if kind == EAGLE3_DRAFT:
        if recipe.needs_calibration:
            raise ApplyError(
                f"recipe {recipe.name}: static activation scales need calibration, which an EAGLE-3 "
                "draft cannot run alone (it needs target hidden states); use ptpc_fp8 or mxfp4"
            )
        model = _draft_module(src, config, decisions)
    else:
        from quark.torch.utils.llm import preprocess_for_quantization

        from quantkit.io.hf import load_causal_lm

        progress("loading the model with transformers")
        model = load_causal_lm(src, dtype="auto")
        # transformers 5 keeps MoE experts as fused 3-D parameters, which Quark's ModelQuantizer silently skips;
        # Quark's preprocess turns them into per-expert nn.Linear (and the export back into per-expert tensors).
        with quark_output_to_stderr():
            preprocess_for_quantization(model)
        refuse_in_memory_renames(model, decisions, config, recipe)
    model = model.to(device).eval()
    data = _calibration_data(src, recipe, device) if recipe.needs_calibration else None
    progress(f"quantizing with Quark {recipe.scheme} on {device} (in memory)")
    with quark_output_to_stderr(), torch.no_grad():
        quantizer = ModelQuantizer(qconfig)
        model = quantizer.quantize_model(model, data)
        model = quantizer.freeze(model)
        export_safetensors(model, str(tmp))
    return quark_exclude


def refuse_in_memory_renames(
    model: Any, decisions: list[LayerDecision], config: dict[str, Any], recipe: Recipe
) -> None:
    """Refuse the in-memory path when transformers holds a layer to quantize under another name than the checkpoint.

    Quark's in-memory export writes the module names of the loaded model. transformers 5 renames some
    architectures' modules while loading (conversion_mapping.py: MiniMax-M2's and Mixtral's
    `block_sparse_moe.experts.<e>.w1/w2/w3` become `mlp.experts.<e>.gate_proj/...`), and vLLM's loader for them reads
    the checkpoint names, so such an export would load with those layers missing. Compared for any architecture
    (not from a list): every checkpoint module the plan quantizes must be a module of the loaded model.
    """
    names = {n for n, _ in model.named_modules()}
    missing = [m for d in decisions if d.action == "quantize" for m in d.checkpoint_modules if m not in names]
    if missing:
        arch = (config.get("architectures") or [config.get("model_type")])[0]
        fix = (
            "use a dynamic-activation scheme (ptpc_fp8, mxfp4), which runs per shard"
            if recipe.needs_calibration
            else "use --path per-shard (the default for this recipe)"
        )
        raise ApplyError(
            f"--path in-memory: transformers renames {arch}'s modules in memory ({missing[0]} is not a "
            f"module of the loaded model), so Quark's in-memory export would hold names vLLM does not "
            f"read; {fix}"
        )


def run_per_shard(
    src: Path,
    tmp: Path,
    recipe: Recipe,
    kind: str,
    config: dict[str, Any],
    decisions: list[LayerDecision],
    device: str,
    progress: Progress,
) -> list[str]:
    if recipe.needs_calibration:
        raise ApplyError(
            f"recipe {recipe.name}: per-shard cannot calibrate static activation scales (Quark's "
            "per-shard path drops input_scale); use --path in-memory"
        )
    import_quark()
    from quark.torch import ModelQuantizer

    qconfig, quark_exclude = quark_config(recipe, quark_template(config), decisions, quark_kv_layers(config))
    progress(f"quantizing with Quark {recipe.scheme} on {device} (per shard)")
    with quark_output_to_stderr(), weights_only_view(src) as view:
        ModelQuantizer(qconfig).direct_quantize_checkpoint(str(view), str(tmp), device=device)
    return quark_exclude


@contextlib.contextmanager
def weights_only_view(src: Path) -> Iterator[Path]:
    """A temporary folder of links to `src`'s config.json, index and the weight shards quantkit reads (those the
    index names, else every top-level *.safetensors), for Quark's file-to-file path.

    Quark 0.13 quantizes every *.safetensors it finds by os.walk (file2file_quantization.py
    `_get_safetensor_files`), index or not: a stray `consolidated.safetensors` beside a sharded checkpoint (Mistral's
    repos ship one) would be quantized and indexed too, every tensor stored twice. The index is the truth. Quark
    also copies every other file and folder of its source, following links (`_copy_json_and_py_files`): given this
    view it copies nothing, and apply copies the source's allow-list itself (quantkit.io.files.AUX_FILES).
    """
    with tempfile.TemporaryDirectory(prefix="quantkit-quark-source-") as tmp:
        view = Path(tmp)
        for name in [CONFIG_FILE, INDEX_FILE, *safetensors_files(src)]:
            if (src / name).is_file():
                os.symlink((src / name).absolute(), view / name)
        yield view
