"""The KV-cache dtype: fp8_e5m2 with a Quark checkpoint, an FP8 KV cache for a draft without KV scales, FP8 KV
cache on CPU (vllm/model_executor/layers/attention/attention.py, config/speculative.py, quantization/kv_cache.py,
v1/attention/backends/cpu_attn.py; vllm/config/cache.py CacheDType for the values)."""

from __future__ import annotations

from typing import Any

from quantkit.io.config import attention_heads
from quantkit.io.headers import TensorInfo
from quantkit.results.check import Finding
from quantkit.rules.deploy_context import DeployContext, finding

# vllm/config/cache.py `CacheDType`: every value `--kv-cache-dtype` accepts in vLLM 0.32.
KV_CACHE_DTYPES: tuple[str, ...] = (
    "auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla", "nvfp4_ds_mla",
    "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "ultraquant_4bit",
    "int4_per_token_head", "int8_per_token_head", "fp8_per_token_head", "nvfp4", "nvfp4_4over6",
)  # fmt: skip


def _is_quark(config: dict[str, Any]) -> bool:
    qc = config.get("quantization_config")
    return isinstance(qc, dict) and qc.get("quant_method") == "quark"


def _has_kv_scales(config: dict[str, Any], tensors: dict[str, TensorInfo]) -> bool:
    """Whether a checkpoint ships KV-cache scales: Quark's `export.kv_cache_group` or k_scale/v_scale tensors."""
    qc = config.get("quantization_config")
    export = qc.get("export") if isinstance(qc, dict) else None
    if isinstance(export, dict) and export.get("kv_cache_group"):
        return True
    return any(n.endswith((".k_scale", ".v_scale", ".kv_scale")) for n in tensors)


def kv_is_quantized(dtype: str) -> bool:
    return dtype not in ("auto", "float16", "bfloat16")


def check_kv_e5m2_quark(ctx: DeployContext) -> list[Finding]:
    if ctx.kv_cache_dtype != "fp8_e5m2":
        return []
    out = []
    models = [("target", ctx.target_path, ctx.target_config)]
    if ctx.draft_config is not None and ctx.draft_path is not None:
        models.append(("draft", ctx.draft_path, ctx.draft_config))
    for role, path, config in models:
        if _is_quark(config):
            inherits = (" (the draft inherits the target's --kv-cache-dtype unless speculative_config sets "
                        "kv_cache_dtype)") if role == "draft" else ""
            fix = ("use --kv-cache-dtype fp8 (e4m3)" if role == "target" else
                   'use --kv-cache-dtype fp8, or give the draft its own: "kv_cache_dtype": "auto" in '
                   "--speculative-config")
            out.append(finding("kv-fp8-e5m2-quark", "error", "kv-fp8-e5m2-quark", f"{role} {path}",
                                f"--kv-cache-dtype fp8_e5m2 with a Quark-quantized {role}{inherits}: vLLM raises "
                                "'fp8_e5m2 kv-cache is not supported with fp8 checkpoints' when it builds the "
                                "attention layers", fix))
    return out


def check_kv_draft_unscaled(ctx: DeployContext) -> list[Finding]:
    if not kv_is_quantized(ctx.kv_cache_dtype) or ctx.kv_cache_dtype == "fp8_e5m2":
        return []  # e5m2 needs no scale (and with a Quark draft is an error above)
    assert ctx.draft_config is not None and ctx.draft_tensors is not None
    if _has_kv_scales(ctx.draft_config, ctx.draft_tensors):
        return []
    return [finding("kv-fp8-draft-unscaled", "warning", "kv-fp8-draft-unscaled", f"draft {ctx.draft_path}",
                     f"--kv-cache-dtype {ctx.kv_cache_dtype}: the draft inherits it, but its checkpoint has no "
                     "k/v scales, so vLLM stores its keys and values in FP8 with scale 1.0 (values above 448 "
                     "saturate); acceptance length can drop without any error",
                     'measure acceptance with this KV dtype, or keep the draft\'s KV cache in BF16: '
                     '"kv_cache_dtype": "auto" in --speculative-config')]


def check_kv_cpu_head_size(ctx: DeployContext) -> list[Finding]:
    if ctx.platform != "cpu" or not kv_is_quantized(ctx.kv_cache_dtype):
        return []
    out = []
    models = [("target", ctx.target_text)] + ([("draft", ctx.draft_layer)] if ctx.draft_config else [])
    for role, cfg in models:
        head_dim = attention_heads(cfg)[2]
        if head_dim is not None and head_dim % 32 and head_dim % 16 == 0:
            out.append(finding("kv-fp8-cpu-head-size", "error", "kv-fp8-cpu-head-size", role,
                                f"FP8 KV cache on CPU needs a head size divisible by 32; the {role}'s is {head_dim}",
                                "use --kv-cache-dtype auto on CPU"))
    out.append(finding("kv-fp8-cpu-head-size", "info", "kv-fp8-cpu-isa", "platform cpu",
                        "FP8 KV cache on CPU needs x86 with AVX-512 or AMX (not checkable from the checkpoint)",
                        "check /proc/cpuinfo for avx512f or amx_tile, else use --kv-cache-dtype auto"))
    return out
