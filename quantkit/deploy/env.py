"""The environment `vllm serve` needs on each platform, for deploy.json: AMD's ROCm recipes on MI300 (gfx942) and MI355
(gfx950), vLLM's CPU settings on cpu; each variable with the source that recommends or defines it."""

from __future__ import annotations

import math
from typing import Any

from quantkit.io.config import attention_heads, config_int
from quantkit.results.deploy import EnvVar
from quantkit.rules.deploy_context import DeployContext
from quantkit.rules.kv_cache import kv_is_quantized

_AMD_VLLM_GUIDE = (
    "AMD ROCm docs, 'vLLM V1 performance optimization' (MI300X/MI325X/MI350X/MI355X): "
    "https://rocm.docs.amd.com/en/docs-7.2.0/how-to/rocm-for-ai/inference-optimization/"
    "vllm-optimization.html"
)


def _env(name: str, value: str, why: str, source: str) -> EnvVar:
    return EnvVar(name=name, value=value, why=why, source=source)


# --- platform environment ----------------------------------------------------------------------------------------


def _kv_bytes_per_token(ctx: DeployContext) -> int:
    """KV-cache bytes one token takes in the target (+ the draft's one layer), for sizing the CPU KV cache."""
    per_elem = 1 if kv_is_quantized(ctx.kv_cache_dtype) else 2
    total = 0
    models = [(ctx.target_text, config_int(ctx.target_text.get("num_hidden_layers")) or 1)]
    if ctx.draft_config is not None:
        models.append((ctx.draft_layer, config_int(ctx.draft_layer.get("num_hidden_layers")) or 1))
    for cfg, layers in models:
        _, kv, head_dim = attention_heads(cfg)
        total += 2 * layers * (kv or 1) * (head_dim or 128) * per_elem
    return total


def platform_env(ctx: DeployContext) -> list[EnvVar]:
    """The environment AMD's ROCm recipes set for vLLM on MI300 (gfx942) / MI355 (gfx950), or vLLM's CPU settings."""
    envs_py = "vllm/envs.py"
    env: list[EnvVar] = []
    if ctx.platform in ("gfx950", "gfx942"):
        env.append(
            _env(
                "VLLM_ROCM_USE_AITER",
                "1",
                "master switch for AMD's AITER kernels (linear, MoE, RMSNorm, MHA/MLA); off by default, "
                "and every VLLM_ROCM_USE_AITER_* flag only takes effect with it",
                f"{envs_py} VLLM_ROCM_USE_AITER (default False; _aiter_ops.py is_enabled); {_AMD_VLLM_GUIDE}",
            )
        )
        if _is_moe(ctx.target_text):
            env.append(
                _env(
                    "VLLM_ROCM_USE_AITER_MOE",
                    "1",
                    "AITER fused-MoE kernels for the target's experts (default on once AITER is on; set "
                    "explicitly so a site-wide 0 does not silently disable them)",
                    f"{envs_py} VLLM_ROCM_USE_AITER_MOE ('Whether to use aiter moe ops', default True; "
                    f"_aiter_ops.py is_fused_moe_enabled); {_AMD_VLLM_GUIDE}",
                )
            )
        if ctx.target_text.get("kv_lora_rank") is not None:
            env.append(
                _env(
                    "VLLM_ROCM_USE_AITER_MLA",
                    "1",
                    "AITER multi-head latent attention for MLA models (DeepSeek-V3, Kimi-K2)",
                    f"{envs_py} VLLM_ROCM_USE_AITER_MLA ('Whether to use aiter mla ops', default True; "
                    f"_aiter_ops.py is_mla_enabled); {_AMD_VLLM_GUIDE}",
                )
            )
        env.append(
            _env(
                "HIP_FORCE_DEV_KERNARG",
                "1",
                "faster kernel launches (device kernel arguments); preset "
                "in AMD's vLLM containers, needed on bare metal",
                _AMD_VLLM_GUIDE,
            )
        )
        env.append(
            _env(
                "TORCH_BLAS_PREFER_HIPBLASLT",
                "1",
                "prefer hipBLASLt for the BF16 GEMMs that stay unquantized (router, attention, lm_head)",
                _AMD_VLLM_GUIDE,
            )
        )
    elif ctx.platform == "cpu":
        need = _kv_bytes_per_token(ctx) * (ctx.max_model_len or 4096) * 4
        gib = max(1, math.ceil(need / 2**30))
        env.append(
            _env(
                "VLLM_CPU_KVCACHE_SPACE",
                str(gib),
                f"KV cache in GiB: room for 4 sequences of {ctx.max_model_len or 4096} tokens "
                f"({_kv_bytes_per_token(ctx)} bytes a token); vLLM's default reserves far more",
                f"{envs_py} VLLM_CPU_KVCACHE_SPACE ('(CPU backend only) CPU key-value cache space'); "
                "v1/worker/cpu_worker.py",
            )
        )
        env.append(
            _env(
                "VLLM_CPU_OMP_THREADS_BIND",
                "auto",
                "bind OpenMP threads to the cores of one NUMA node (vLLM reserves one core for its scheduler process)",
                f"{envs_py} VLLM_CPU_OMP_THREADS_BIND; utils/ompmultiprocessing.py",
            )
        )
    return env


def _is_moe(cfg: dict[str, Any]) -> bool:
    return any((config_int(cfg.get(k)) or 0) > 1 for k in ("num_experts", "num_local_experts", "n_routed_experts"))
