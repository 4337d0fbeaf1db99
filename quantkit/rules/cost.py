"""What a draft step and a target step cost, estimated from the bytes of weights they read: an ESTIMATE FROM BYTES.

Why bytes: at decode sizes a draft's GEMMs are bandwidth-bound (one H200, Kimi-K2.5-shaped drafts: weight reads at
about 4.2 TB/s, flat from batch 1 to 64; shared/research/draft_cost.md), so a step's time is close to the bytes it
reads over the HBM bandwidth. What each step reads, as vLLM 0.32 runs an EAGLE-3 draft
(vllm/model_executor/models/llama_eagle3.py): `combine_hidden_states` runs fc once per drafting round on the target's
aux hidden states; every draft token then runs the decoder layer (attention, MLP) and `compute_logits` (the lm_head
of `draft_vocab_size` rows). The embedding is a lookup of a few rows and is left out, as are norms.

What FP8 buys depends on the kernel (draft_cost.md: a per-tensor FP8 GEMM halves the BF16 time; a row- and
column-scaled one saves only 13-29%): each quantized role takes the path quantkit.rules.kernels.select_fp8_linear
predicts on the platform; a "native" path gets the byte ratio, a "fallback" (row-scaled hipBLASLt / torch
_scaled_mm) path is charged FALLBACK_FP8_TIME of the BF16 time, an emulated one the BF16 time.

The target: a decode step for b tokens and a verify step for b x (K+1) tokens read the attention, dense and shared
weights once, and of each MoE layer's E routed experts with top-k routing the expected number of distinct experts
that many uniformly routed tokens touch, E * (1 - (1 - k/E) ** tokens). Uniform routing is an assumption (real
routing is skewed, which touches fewer experts). Tensor parallelism divides every weight evenly over `tp` GPUs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantkit.errors import QuantkitError
from quantkit.io.config import draft_config, text_config
from quantkit.io.safetensors import DTYPE_BYTES
from quantkit.results.cost import DraftCost, RoleBytes, StepEstimate, TargetStepBytes
from quantkit.rules.kernels import select_fp8_linear


@dataclass(frozen=True)
class Gpu:
    name: str
    hbm_tb_s: float  # peak HBM bandwidth per GPU, TB/s (10^12 bytes/s)
    platform: str  # the kernel platform rules/kernels predicts for
    source: str  # the vendor's public spec page the figure is from


# Peak HBM bandwidth per GPU, from each vendor's public spec page. B200 is SM100; rules/kernels has one "cuda"
# platform (its FP8 linear path is CUTLASS on SM89+ either way).
GPUS: dict[str, Gpu] = {g.name: g for g in (
    Gpu("MI300X", 5.3, "gfx942", "AMD Instinct MI300X accelerator product page (amd.com): 5.3 TB/s peak memory "
                                 "bandwidth, 192 GB HBM3"),
    Gpu("MI325X", 6.0, "gfx942", "AMD Instinct MI325X accelerator product page (amd.com): 6 TB/s, 256 GB HBM3E"),
    Gpu("MI355X", 8.0, "gfx950", "AMD Instinct MI355X GPU product page (amd.com): 8 TB/s, 288 GB HBM3E"),
    Gpu("H100", 3.35, "cuda", "NVIDIA H100 Tensor Core GPU datasheet (nvidia.com), H100 SXM: 3.35 TB/s, 80 GB"),
    Gpu("H200", 4.8, "cuda", "NVIDIA H200 Tensor Core GPU product page (nvidia.com): 4.8 TB/s, 141 GB HBM3e"),
    Gpu("B200", 8.0, "cuda", "NVIDIA DGX B200 / HGX B200 spec page (nvidia.com): 64 TB/s HBM3e for 8 GPUs, "
                             "8 TB/s each"),
)}

# Time of a row- and column-scaled FP8 GEMM against BF16 at decode sizes: 0.71-0.87 measured on one H200
# (torch._scaled_mm, draft_cost.md); the middle of that range.
FALLBACK_FP8_TIME = 0.8
FP8_RECIPE_ROLES = ("attention", "mlp")  # fp8-draft: decoder linears (and an MoE draft's experts); fc, lm_head BF16

_ROLE_PATTERNS = (("fc", re.compile(r"(^|\.)fc\.weight$")), ("lm_head", re.compile(r"(^|\.)lm_head\.weight$")),
                  ("attention", re.compile(r"self_attn\.[^.]+\.weight$")), ("mlp", re.compile(r"mlp\..*weight$")))
_FP8 = ("F8_E4M3", "F8_E5M2")


class CostError(QuantkitError):
    """A cost estimate cannot be made as asked (an unknown GPU, a checkpoint without a draft's layers)."""


def draft_role(name: str) -> str | None:
    """The cost role of a draft tensor (fc, attention, mlp, lm_head), None for norms, d2t/t2d, the embedding."""
    if name.endswith(("_scale", "scale_inv")):
        return None
    for role, pattern in _ROLE_PATTERNS:
        if pattern.search(name):
            return role
    return None


def _numel(shape: Any) -> int:
    return math.prod(int(x) for x in shape)


def _bf16_bytes(info: Any) -> int:
    return _numel(info.shape) * 2


def _fp8_bytes(info: Any) -> int:
    """FP8 weight + one FP32 scale per output channel (ptpc_fp8)."""
    return _numel(info.shape) + int(info.shape[0]) * 4 if len(info.shape) >= 2 else _bf16_bytes(info)


def draft_cost(config: Mapping[str, Any], tensors: Mapping[str, Any], quantized_roles: tuple[str, ...] |
               None = FP8_RECIPE_ROLES, recipe: str = "fp8-draft") -> DraftCost:
    """Bytes by role of one draft step, in BF16 and after the recipe (`quantized_roles` in FP8). A draft whose
    weights are already FP8 is costed as stored (`quantized_roles=None` forces that)."""
    stored_fp8 = any(getattr(i, "dtype", "") in _FP8 for i in tensors.values())
    bf16: dict[str, int] = {}
    after: dict[str, int] = {}
    quantized: set[str] = set()
    for name, info in tensors.items():
        role = draft_role(name)
        if role is None:
            continue
        bf16[role] = bf16.get(role, 0) + _bf16_bytes(info)
        if stored_fp8 or quantized_roles is None:
            size = _numel(info.shape) * DTYPE_BYTES.get(info.dtype, 2)
            scale = tensors.get(name.removesuffix(".weight") + ".weight_scale")
            size += _numel(scale.shape) * DTYPE_BYTES.get(scale.dtype, 4) if scale is not None else 0
            if info.dtype in _FP8:
                quantized.add(role)
        elif role in quantized_roles:
            size = _fp8_bytes(info)
            quantized.add(role)
        else:
            size = _bf16_bytes(info)
        after[role] = after.get(role, 0) + size
    step_roles = ("attention", "mlp", "lm_head")
    token_bf16 = sum(bf16.get(r, 0) for r in step_roles)
    token_after = sum(after.get(r, 0) for r in step_roles)
    if token_bf16 == 0:
        raise CostError("no attention, MLP or lm_head weights found: not an EAGLE-3 draft")
    roles = [RoleBytes(role=r, per="round" if r == "fc" else "draft token", bf16_bytes=bf16.get(r, 0),
                       recipe_bytes=after.get(r, 0), quantized=r in quantized,
                       bf16_share=0.0 if r == "fc" else round(bf16.get(r, 0) / token_bf16, 4),
                       recipe_share=0.0 if r == "fc" else round(after.get(r, 0) / max(token_after, 1), 4))
             for r in ("fc", *step_roles)]
    dc = draft_config(dict(config))
    return DraftCost(recipe="as stored" if stored_fp8 or quantized_roles is None else recipe,
                     draft_vocab_size=dc.draft_vocab_size or 0, vocab_size=dc.vocab_size or 0, roles=roles,
                     draft_token_bf16_bytes=token_bf16, draft_token_recipe_bytes=token_after)


_EXPERT = re.compile(r"^(.*\.layers\.\d+)\.(?:mlp|block_sparse_moe|feed_forward)\.experts\.(\d+)\.")
_EXPERT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts")
_TOPK_KEYS = ("num_experts_per_tok", "moe_topk", "num_experts_per_token", "top_k")


def expected_experts(experts: int, top_k: int, tokens: int) -> float:
    """Expected distinct experts touched when `tokens` tokens each pick `top_k` of `experts` uniformly."""
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


def _config_int(cfg: Mapping[str, Any], keys: tuple[str, ...]) -> int:
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return 0


def target_step_bytes(config: Mapping[str, Any], tensors: Mapping[str, Any], tokens: int) -> TargetStepBytes:
    """Bytes one target step reads for `tokens` tokens: the routed experts' expected share, all else once. The
    embedding (a lookup) is left out."""
    cfg = text_config(dict(config))
    n_exp, top_k = _config_int(cfg, _EXPERT_KEYS), _config_int(cfg, _TOPK_KEYS)
    per_layer: dict[str, int] = {}
    other = 0
    for name, info in tensors.items():
        size = _numel(info.shape) * DTYPE_BYTES.get(info.dtype, 2)
        if "embed_tokens" in name or "vision" in name or "mm_projector" in name:
            continue
        m = _EXPERT.match(name)
        if m is not None and n_exp:
            per_layer[m.group(1)] = per_layer.get(m.group(1), 0) + size
        else:
            other += size
    share = expected_experts(n_exp, top_k, tokens) / n_exp if n_exp and top_k else 1.0
    experts = int(sum(per_layer.values()) * share)
    return TargetStepBytes(tokens=tokens, experts=n_exp, top_k=top_k,
                           expected_experts_per_layer=round(share * n_exp, 3) if n_exp else 0.0,
                           expert_bytes=experts, other_bytes=other, total_bytes=experts + other)


def _fp8_time_factor(platform: str, tensors: Mapping[str, Any], role: str) -> tuple[float, str, str]:
    """(time of the role in FP8 relative to its bytes' ideal, kernel, perf class): 1.0 on a native path."""
    shapes = [i.shape for n, i in tensors.items() if draft_role(n) == role and len(i.shape) == 2]
    if not shapes:
        return 1.0, "", ""
    n, k = (int(x) for x in shapes[0])
    kernel, perf, _why = select_fp8_linear(platform, True, n, k)
    return (1.0 if perf == "native" else -1.0 if perf == "emulation" else FALLBACK_FP8_TIME), kernel or "", perf


def estimate(cost: DraftCost, tensors: Mapping[str, Any], gpu: str, *, k: int, al: float, batch: int = 1,
             tp: int = 1, target: tuple[Mapping[str, Any], Mapping[str, Any]] | None = None) -> DraftCost:
    """`cost` with step times on `gpu` at TP `tp`, and (with `target` = (config, tensors)) the target's decode and
    verify steps and the speedup bound AL x t_decode / (t_fc + K t_draft + t_verify). An ESTIMATE FROM BYTES."""
    if gpu not in GPUS:
        raise CostError(f"unknown GPU {gpu!r}; use one of {', '.join(GPUS)}")
    g = GPUS[gpu]
    bw = g.hbm_tb_s * 1e12 * tp  # bytes/s over tp GPUs (weights split evenly)

    def us(nbytes: float) -> float:
        return nbytes / bw * 1e6

    roles = []
    token_bf16 = token_recipe = 0.0
    for r in cost.roles:
        t_bf16 = us(r.bf16_bytes)
        t_recipe = us(r.recipe_bytes)
        kernel = perf = ""
        if r.quantized:
            factor, kernel, perf = _fp8_time_factor(g.platform, tensors, r.role)
            # fallback: a fixed fraction of the BF16 time; emulation: no gain
            t_recipe = t_recipe if factor == 1.0 else t_bf16 if factor < 0 else t_bf16 * factor
        roles.append(r.model_copy(update={"kernel": kernel, "perf_class": perf}))
        if r.role != "fc":
            token_bf16 += t_bf16
            token_recipe += t_recipe
    fc = us(next((r.bf16_bytes for r in cost.roles if r.role == "fc"), 0))
    est = StepEstimate(gpu=g.name, platform=g.platform, hbm_tb_s=g.hbm_tb_s, bandwidth_source=g.source, tp=tp, k=k,
                       al=al, batch=batch, draft_token_us_bf16=round(token_bf16, 4),
                       draft_token_us_recipe=round(token_recipe, 4), fc_us=round(fc, 4))
    steps: list[TargetStepBytes] = []
    if target is not None:
        decode = target_step_bytes(target[0], target[1], batch)
        verify = target_step_bytes(target[0], target[1], batch * (k + 1))
        steps = [decode, verify]
        t_dec, t_ver = us(decode.total_bytes), us(verify.total_bytes)
        r_bf16, r_recipe = fc + k * token_bf16 + t_ver, fc + k * token_recipe + t_ver
        est = est.model_copy(update=dict(
            target_decode_us=round(t_dec, 4), target_verify_us=round(t_ver, 4), round_us_bf16=round(r_bf16, 4),
            round_us_recipe=round(r_recipe, 4),
            speedup_bound_bf16=round(al * t_dec / r_bf16, 3) if al > 0 else None,
            speedup_bound_recipe=round(al * t_dec / r_recipe, 3) if al > 0 else None))
    return cost.model_copy(update={"roles": roles, "target": steps, "estimate": est})


def cost_report(config: Mapping[str, Any], tensors: Mapping[str, Any], *, gpu: str | None = None, k: int = 3,
                al: float | None = None, tp: int = 1, batch: int = 1,
                target: str | Path | None = None) -> DraftCost | None:
    """What inspect and check show for a draft: bytes by role (None for a checkpoint that is not an EAGLE-3
    draft), and with `gpu` the step times there; with `target` (a folder: config.json and headers only) the
    target's decode and verify steps, and with `al` the speedup bound."""
    from quantkit.io.headers import checkpoint_tensors, read_config

    try:
        cost = draft_cost(config, tensors)
    except CostError:
        return None
    if gpu is None:
        return cost
    pair = (read_config(target), checkpoint_tensors(target)) if target is not None else None
    return estimate(cost, tensors, gpu, k=k, al=al or 0.0, batch=batch, tp=tp, target=pair)


__all__ = ["FALLBACK_FP8_TIME", "FP8_RECIPE_ROLES", "GPUS", "CostError", "Gpu", "cost_report", "draft_cost", "draft_role",
           "estimate", "expected_experts", "target_step_bytes"]
