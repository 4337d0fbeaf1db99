"""What a speculative-decoding step costs, estimated from the bytes it reads: the draft's step by role, the target's
decode and verify steps, and the speedup bound they give on a named platform. An ESTIMATE FROM BYTES, never a
measurement: at decode batch sizes the linear layers are bandwidth-bound (weights read at ~0.875 of the HBM peak
on an H200 for BF16 GEMMs from batch 1 to 64: benchmarks/draft_step_gpu.py), so a step's time is the bytes its
weights take over the platform's bandwidth, with the kernel path each layer takes (quantkit.rules.kernels) deciding
what a quantized layer's bytes buy.

The shares are defined per draft token: a draft token runs attention, MLP and lm_head once; fc runs once per
drafting round of K tokens, so a round reads fc + K x (attention + MLP + lm_head). Checked against the H200
(benchmarks/results/draft_step_gpu.json): the lm_head's share of a 163,840-row Kimi-K2.5 draft token is 0.635 by
bytes and 0.63-0.67 measured; of a 32,000-row one, 0.22 and 0.21-0.22.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from quantkit.results.cost import ESTIMATE, DraftCost, DraftStepEstimate, RoleCost

# HBM bandwidth (TB/s) of each platform, from its vendor's public data sheet.
BANDWIDTH_TBS: dict[str, tuple[float, str]] = {
    "MI300X": (5.3, "AMD Instinct MI300X data sheet: 5.3 TB/s HBM3"),
    "MI325X": (6.0, "AMD Instinct MI325X data sheet: 6 TB/s HBM3E"),
    "MI355X": (8.0, "AMD Instinct MI355X data sheet: 8 TB/s HBM3E"),
    "H100": (3.35, "NVIDIA H100 SXM data sheet: 3.35 TB/s HBM3"),
    "H200": (4.8, "NVIDIA H200 data sheet: 4.8 TB/s HBM3e"),
    "B200": (8.0, "NVIDIA B200 (DGX B200) data sheet: 8 TB/s HBM3e"),
}
# The fraction of the peak that decode GEMMs reach: 4.2 of 4.8 TB/s measured on an H200 (BF16, CUDA graphs, batch
# 1-64; benchmarks/draft_step_gpu.py), taken for every platform.
ATTAINED = 0.875
# How much longer a layer takes than its bytes say, by kernel path. A per-tensor FP8 GEMM moves its bytes as fast as
# BF16 does (1.0). A row- and column-scaled FP8 GEMM (ptpc_fp8, per-token activations) took 0.71-0.87 of the BF16
# time on the H200 where its bytes say 0.5 (research/draft_cost.md): 1.6. An emulated path dequantizes the weights and
# runs them in BF16: at least the BF16 time, 9-15x slower than native in the field: 9 x its bytes' time, a floor.
PATH_FACTOR = {"bf16": 1.0, "per_tensor": 1.0, "row_scaled": 1.6, "emulation": 9.0}
# roles of a draft step: fc once per round, the others once per draft token
PER_TOKEN_ROLES = (
    "attention",
    "linear_attention",
    "indexer",
    "dense_mlp",
    "router",
    "shared_experts",
    "experts",
    "lm_head",
)


def _path(layer: Any, paths: dict[str, str]) -> str:
    if not layer.quantized:
        return "bf16"
    kind = paths.get(layer.name)
    if kind == "emulation":
        return "emulation"
    scheme = str(getattr(layer, "precision", "")).lower()
    return "row_scaled" if "ptpc" in scheme or "per_channel" in scheme or "per-channel" in scheme else "per_tensor"


def _roles(layers: Iterable[Any], paths: dict[str, str], after: Sequence[str] = ()) -> list[RoleCost]:
    """Bytes by role; roles in `after` count as quantized by a row-scaled FP8 recipe (half their BF16 bytes)."""
    out: dict[str, list[float]] = {}
    for layer in layers:
        stored = float(layer.bytes)
        if layer.role in after and not layer.quantized:
            stored, factor = stored / 2, PATH_FACTOR["row_scaled"]
        else:
            factor = PATH_FACTOR[_path(layer, paths)]
        acc = out.setdefault(layer.role, [0.0, 0.0])
        acc[0] += stored
        acc[1] += stored * factor
    token = sum(w for role, (_, w) in out.items() if role != "fc")
    return [
        RoleCost(role=role, bytes=int(b), weighted_bytes=w, share=None if role == "fc" or not token else w / token)
        for role, (b, w) in out.items()
    ]


def quantized_roles(recipe: Any) -> list[str]:
    """The layer roles `recipe` quantizes (its `quantize` roles, `decoder_linears` spelled out, less its `keep`)."""
    from quantkit.naming.layers import ROLES, in_role

    keep = {k.role for k in recipe.keep if getattr(k, "role", None)}

    class _Layer:
        def __init__(self, role: str) -> None:
            self.role = role

    quantize = recipe.quantize if recipe.quantize is not None else ["decoder_linears", "experts", "lm_head", "fc"]
    return [
        r
        for r in ROLES
        if r not in keep and r != "decoder_linears" and any(in_role(cast(Any, _Layer(r)), q) for q in quantize)
    ]


def kernel_paths_by_layer(report: Any, layers: Sequence[Any]) -> dict[str, str]:
    """Each layer's kernel perf class (native, emulation, ...) from a KernelReport, whose rows may name a group
    (`model.layers.{0-1}.mlp.experts`)."""
    import re

    out: dict[str, str] = {}
    for path in getattr(report, "paths", None) or []:
        pattern = re.compile(
            "".join(
                "[^.]+" if part.startswith("{") else re.escape(part) for part in re.split(r"(\{[^}]*\})", path.layer)
            )
            + "$"
        )
        for layer in layers:
            if pattern.match(layer.name):
                out[layer.name] = str(path.perf_class)
    return out


def draft_cost(layers: Sequence[Any], kernel_paths: dict[str, str] | None = None, recipe: Any = None) -> DraftCost:
    """The cost report of a draft's `layers` (LayerPrecision rows of `inspect`); with `recipe` (a Recipe), also the
    bytes after it for the layers it would quantize that the folder stores unquantized."""
    paths = kernel_paths or {}
    roles = _roles(layers, paths)
    token = sum(r.weighted_bytes for r in roles if r.role != "fc")
    lm = next((r.share for r in roles if r.role == "lm_head"), None)
    cost = DraftCost(
        roles=roles,
        per_token_bytes=token,
        lm_head_share=lm,
        fc_bytes=sum(r.weighted_bytes for r in roles if r.role == "fc"),
    )
    if recipe is not None and any(not layer.quantized and layer.role in quantized_roles(recipe) for layer in layers):
        after = _roles(layers, paths, after=quantized_roles(recipe))
        after_token = sum(r.weighted_bytes for r in after if r.role != "fc")
        cost.after, cost.after_recipe = after, recipe.name
        cost.lm_head_share_after = next((r.share for r in after if r.role == "lm_head"), None)
        cost.step_ratio_after = after_token / token if token else None
    return cost


def expected_distinct_experts(num_experts: int, top_k: int, tokens: int) -> float:
    """Expected number of distinct experts `tokens` tokens touch in one layer, each routed to `top_k` of
    `num_experts` uniformly: E x (1 - (1 - k/E)^tokens)."""
    if num_experts <= 0 or tokens <= 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


@dataclass(frozen=True)
class TargetShape:
    """What a target decode step reads: the weights every token needs (attention, dense and shared layers, lm_head)
    and, per MoE layer, its experts."""

    always_bytes: float  # read once per step whatever the batch
    moe_layers: int = 0
    num_experts: int = 0
    top_k: int = 0
    expert_bytes: float = 0.0  # one expert of one layer

    def step_bytes(self, tokens: int) -> float:
        """Bytes of one forward over `tokens` tokens (decode: the batch; verify: batch x (K + 1))."""
        return self.always_bytes + self.moe_layers * self.expert_bytes * expected_distinct_experts(
            self.num_experts, self.top_k, tokens
        )


@dataclass(frozen=True)
class SpeedupBound:
    """The speedup a draft can give, from bytes alone (no scheduling, sampling or KV-cache reads): `speedup` is the
    bound (verifying b x (K+1) tokens reads no more experts than decoding b: tokens of one sequence reuse theirs),
    `speedup_uniform` the estimate with every token routed uniformly at random (the most experts a verify can read)."""

    platform: str
    bandwidth_tbs: float
    source: str
    target_decode_us: float
    target_verify_us: float  # uniform routing
    draft_round_us: float
    speedup: float
    speedup_uniform: float
    notes: list[str] = field(default_factory=list)


def microseconds(weighted_bytes: float, platform: str, tp: int = 1) -> float:
    """The time `weighted_bytes` take to read on `platform`, split over `tp` GPUs."""
    tbs, _ = BANDWIDTH_TBS[platform]
    return weighted_bytes / tp / (tbs * 1e12 * ATTAINED) * 1e6


def speedup_bound(
    target: TargetShape, draft_round_bytes: float, al: float, k: int, batch: int, platform: str, tp: int = 1
) -> SpeedupBound:
    """Tokens per second with speculation over without: a round (draft K tokens, verify b x (K+1)) yields AL tokens
    per sequence where a plain decode step yields one."""
    tbs, source = BANDWIDTH_TBS[platform]
    decode = microseconds(target.step_bytes(batch), platform, tp)
    verify = microseconds(target.step_bytes(batch * (k + 1)), platform, tp)
    draft = microseconds(draft_round_bytes, platform, tp)
    return SpeedupBound(
        platform=platform,
        bandwidth_tbs=tbs,
        source=source,
        target_decode_us=decode,
        target_verify_us=verify,
        draft_round_us=draft,
        speedup=al * decode / (decode + draft),
        speedup_uniform=al * decode / (verify + draft),
        notes=[ESTIMATE],
    )


# the platform an estimate is named for when the hardware has no bandwidth on record (a CPU): the mission's GPU
DEFAULT_PLATFORM = "MI355X"


def platform_for(gpu_name: str | None) -> tuple[str, str]:
    """(BANDWIDTH_TBS key, why) for a GPU's name as torch reports it ("AMD Instinct MI355X", "NVIDIA H200")."""
    for key in sorted(BANDWIDTH_TBS, key=len, reverse=True):
        if gpu_name and key.lower() in gpu_name.lower():
            return key, f"the bench's GPU ({gpu_name})"
    where = gpu_name or "a CPU"
    return DEFAULT_PLATFORM, f"no HBM bandwidth on record for {where}: named for {DEFAULT_PLATFORM}, not this hardware"


def step_estimate(
    draft: str, cost: DraftCost, platform: str, ks: Iterable[int] = (), tp: int = 1, reason: str = ""
) -> DraftStepEstimate:
    """`cost` (a draft's bytes by role, as stored) read on `platform` over `tp` GPUs: a draft token, fc, and a
    round of each K in `ks`."""
    tbs, source = BANDWIDTH_TBS[platform]
    return DraftStepEstimate(
        draft=draft,
        cost=cost,
        platform=platform,
        platform_reason=reason,
        bandwidth_tbs=tbs,
        bandwidth_source=source,
        tensor_parallel_size=tp,
        token_us=microseconds(cost.per_token_bytes, platform, tp),
        fc_us=microseconds(cost.fc_bytes, platform, tp),
        round_us={k: microseconds(cost.round_bytes(k), platform, tp) for k in sorted(set(ks)) if k > 0},
    )


__all__ = [
    "ATTAINED",
    "BANDWIDTH_TBS",
    "DEFAULT_PLATFORM",
    "ESTIMATE",
    "PATH_FACTOR",
    "DraftCost",
    "DraftStepEstimate",
    "RoleCost",
    "SpeedupBound",
    "TargetShape",
    "draft_cost",
    "expected_distinct_experts",
    "kernel_paths_by_layer",
    "microseconds",
    "platform_for",
    "quantized_roles",
    "speedup_bound",
    "step_estimate",
]
