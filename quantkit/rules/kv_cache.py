"""The KV-cache dtype: fp8_e5m2 with a Quark checkpoint, an FP8 KV cache for a draft without KV scales, FP8 KV
cache on CPU (vllm/model_executor/layers/attention/attention.py, config/speculative.py, quantization/kv_cache.py,
v1/attention/backends/cpu_attn.py; vllm/config/cache.py CacheDType for the values)."""

from __future__ import annotations

from typing import Any

from quantkit.io.config import attention_heads, text_config
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
    """Whether a checkpoint ships KV-cache scales: Quark's `export.kv_cache_group` or k_scale/v_scale tensors (never
    an MLA model under Quark: kv_scales_mla)."""
    if _is_quark(config) and is_mla(config):
        return False
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
        if _is_quark(config) and not is_mla(config):  # MLA gets no Quark KV method: nothing raises (kv_scales_mla)
            inherits = (
                (" (the draft inherits the target's --kv-cache-dtype unless speculative_config sets kv_cache_dtype)")
                if role == "draft"
                else ""
            )
            fix = (
                "use --kv-cache-dtype fp8 (e4m3)"
                if role == "target"
                else 'use --kv-cache-dtype fp8, or give the draft its own: "kv_cache_dtype": "auto" in '
                "--speculative-config"
            )
            out.append(
                finding(
                    "kv-fp8-e5m2-quark",
                    "error",
                    "kv-fp8-e5m2-quark",
                    f"{role} {path}",
                    f"--kv-cache-dtype fp8_e5m2 with a Quark-quantized {role}{inherits}: vLLM raises "
                    "'fp8_e5m2 kv-cache is not supported with fp8 checkpoints' when it builds the "
                    "attention layers",
                    fix,
                )
            )
    return out


def check_kv_draft_unscaled(ctx: DeployContext) -> list[Finding]:
    if not kv_is_quantized(ctx.kv_cache_dtype) or ctx.kv_cache_dtype == "fp8_e5m2":
        return []  # e5m2 needs no scale (and with a Quark draft is an error above)
    assert ctx.draft_config is not None and ctx.draft_tensors is not None
    if _has_kv_scales(ctx.draft_config, ctx.draft_tensors):
        return []
    return [
        finding(
            "kv-fp8-draft-unscaled",
            "warning",
            "kv-fp8-draft-unscaled",
            f"draft {ctx.draft_path}",
            f"--kv-cache-dtype {ctx.kv_cache_dtype}: the draft inherits it, but its checkpoint has no "
            "k/v scales, so vLLM stores its keys and values in FP8 with scale 1.0 (values above 448 "
            "saturate); acceptance length can drop without any error",
            "measure acceptance with this KV dtype, or keep the draft's KV cache in BF16: "
            '"kv_cache_dtype": "auto" in --speculative-config',
        )
    ]


def check_kv_cpu_head_size(ctx: DeployContext) -> list[Finding]:
    if ctx.platform != "cpu" or not kv_is_quantized(ctx.kv_cache_dtype):
        return []
    out = []
    models = [("target", ctx.target_text)] + ([("draft", ctx.draft_layer)] if ctx.draft_config else [])
    for role, cfg in models:
        head_dim = attention_heads(cfg)[2]
        if head_dim is not None and head_dim % 32 and head_dim % 16 == 0:
            out.append(
                finding(
                    "kv-fp8-cpu-head-size",
                    "error",
                    "kv-fp8-cpu-head-size",
                    role,
                    f"FP8 KV cache on CPU needs a head size divisible by 32; the {role}'s is {head_dim}",
                    "use --kv-cache-dtype auto on CPU",
                )
            )
    out.append(
        finding(
            "kv-fp8-cpu-head-size",
            "info",
            "kv-fp8-cpu-isa",
            "platform cpu",
            "FP8 KV cache on CPU needs x86 with AVX-512 or AMX (not checkable from the checkpoint)",
            "check /proc/cpuinfo for avx512f or amx_tile, else use --kv-cache-dtype auto",
        )
    )
    return out


# --- the Quark KV-cache spec, as vLLM reads it ------------------------------------------------------------------

KV_SPEC_SOURCE = (
    "vllm/model_executor/layers/quantization/quark/quark.py QuarkConfig.from_config (kv_cache_group "
    "against layer_quant_config keys, fnmatchcase; identical output_tensors), "
    "QuarkKVCacheMethod.validate_kv_cache_config (dtype fp8_e4m3, qscheme per_tensor)"
)
KV_MLA_SOURCE = (
    "vllm/model_executor/layers/quantization/quark/quark.py get_quant_method_target (QuarkKVCacheMethod "
    "only for Attention subclasses; MLAAttention, vllm/model_executor/layers/attention/mla_attention.py, "
    "is not one), get_cache_scale_mapper (k_proj/v_proj/q_proj.output_scale only); "
    "vllm/model_executor/layers/attention/attention.py _init_kv_cache_quant (set_default_quant_scales: "
    "1.0)"
)


def kv_spec_problem(qc: dict[str, Any]) -> str | None:
    """Why vLLM rejects a Quark config's KV-cache spec, replaying QuarkConfig.from_config and
    QuarkKVCacheMethod.validate_kv_cache_config (quark.py), or None when it takes it (or there is none).

    from_config: an empty kv_cache_group means no KV spec. Otherwise the group must be a subset of the
    layer_quant_config keys, or some key must fnmatchcase one of its patterns (ValueError "no kv_cache quantization
    settings"); every key matching a pattern must have the same output_tensors (ValueError "should be the same"), and
    the first one's must not be empty (ValueError). validate_kv_cache_config (each Attention layer): dtype fp8_e4m3
    and qscheme per_tensor (NotImplementedError)."""
    import fnmatch

    export = qc.get("export")
    group = export.get("kv_cache_group") if isinstance(export, dict) else None
    if not isinstance(group, list) or not group:
        return None  # missing or not a list: quark-config-keys reports it
    lqc = qc.get("layer_quant_config")
    if not isinstance(lqc, dict):
        return "kv_cache_group is set but there is no layer_quant_config to hold its settings"
    keys, patterns = set(lqc), set(group)
    if not (patterns <= keys or any(fnmatch.fnmatchcase(k, p) for k in keys for p in patterns)):
        return (
            f"kv_cache_group {group} matches no layer_quant_config key ({sorted(keys)[:4]}...): vLLM raises "
            "'no kv_cache quantization settings were found'"
        )
    matched = [cfg for k, cfg in lqc.items() if any(fnmatch.fnmatchcase(k, p) for p in group)]
    outputs = [cfg.get("output_tensors") if isinstance(cfg, dict) else None for cfg in matched]
    if any(o != outputs[0] for o in outputs):
        return "the layer_quant_config entries kv_cache_group matches have different output_tensors"
    spec = outputs[0]
    if not spec:
        return "the layer_quant_config entry kv_cache_group matches has no output_tensors (the KV spec is empty)"
    if not isinstance(spec, dict):
        return f"the KV spec (output_tensors) is {type(spec).__name__}, not one spec"
    if spec.get("dtype") != "fp8_e4m3":
        return f"KV spec dtype {spec.get('dtype')!r}: vLLM supports fp8_e4m3 only"
    if spec.get("qscheme") != "per_tensor":
        return f"KV spec qscheme {spec.get('qscheme')!r}: vLLM supports per_tensor only"
    return None


def is_mla(config: dict[str, Any]) -> bool:
    """Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2): the text config has kv_lora_rank."""
    return text_config(config).get("kv_lora_rank") is not None


def kv_spec(ctx: Any) -> None:
    """kv-quark-spec: the Quark KV-cache spec as vLLM validates it (RuleContext rule)."""
    view = ctx.subject  # config.json only: deploy loads no target layers
    if not _is_quark(view.config):
        return
    problem = kv_spec_problem(view.config["quantization_config"])
    if problem is None:
        return
    if is_mla(view.config) and problem.startswith("KV spec "):
        return  # MLA: vLLM never builds a QuarkKVCacheMethod, so the spec is not validated (kv-scales-mla-quark)
    ctx.findings.add(
        "error",
        "kv-quark-spec",
        "quantization_config.export.kv_cache_group",
        f"{problem}; the load fails",
        "re-export with Quark's FP8 KV cache (fp8_e4m3, per_tensor, "
        "kv_cache_group naming the k_proj/v_proj layer_quant_config keys), or drop kv_cache_group",
    )


def kv_scales_mla(ctx: Any) -> None:
    """kv-scales-mla-quark: an MLA target under Quark cannot carry KV-cache scales (RuleContext rule)."""
    view = ctx.served  # config.json only
    if not _is_quark(view.config) or not is_mla(view.config):
        return
    export = view.config["quantization_config"].get("export")
    group = export.get("kv_cache_group") if isinstance(export, dict) else None
    fp8_kv = kv_is_quantized(ctx.serving.kv_cache_dtype)
    if not group and not fp8_kv:
        return
    why = f"its kv_cache_group {group} is never applied" if group else "no KV scales can be read for it"
    runtime = (
        f"--kv-cache-dtype {ctx.serving.kv_cache_dtype} then stores K/V in FP8 with scale 1.0 (no warning: "
        "the 1.0 default is set before loading, not by the KV method)"
        if fp8_kv
        else "with the default --kv-cache-dtype auto the KV cache stays BF16"
    )
    ctx.findings.add(
        "warning" if fp8_kv else "info",
        "kv-scales-mla-quark",
        f"{'target ' if ctx.draft else ''}{view.path}",
        f"an MLA model under Quark cannot carry KV-cache scales: vLLM gives MLAAttention no Quark KV "
        f"method and maps only k_proj/v_proj/q_proj output scales, which MLA has none of, so {why}; "
        f"{runtime}",
        "measure accuracy with the FP8 KV cache (values beyond +-448 saturate), or serve with --kv-cache-dtype auto",
    )
