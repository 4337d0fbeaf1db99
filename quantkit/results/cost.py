"""Results of the cost estimate (quantkit.rules.cost): the bytes a draft step and a target step read, by role, and
the step times and speedup bound they give on a named GPU. Every figure here is an ESTIMATE FROM BYTES, never a
measurement."""

from __future__ import annotations

from quantkit.results.base import Result

ESTIMATE_LABEL = "ESTIMATE FROM BYTES (weights read once per step at the GPU's peak HBM bandwidth; not a measurement)"


class RoleBytes(Result):
    """Weight bytes one step reads for one role, and their share of the per-draft-token step."""

    role: str  # fc | attention | mlp | lm_head
    per: str  # "round" (fc: once per drafting round) | "draft token" (the rest)
    bf16_bytes: int
    recipe_bytes: int  # after the recipe (FP8 weights + per-channel scales for quantized roles, BF16 for kept)
    bf16_share: float  # of the per-draft-token step (fc excluded: it runs once per round)
    recipe_share: float
    quantized: bool = False
    kernel: str = ""  # the FP8 kernel path rules/kernels predicts on the platform, for a quantized role
    perf_class: str = ""


class StepEstimate(Result):
    """Step times on one GPU, and the speedup bound over decoding without a draft, for one (AL, K, batch)."""

    gpu: str
    platform: str  # the kernel platform (gfx942, gfx950, cuda)
    hbm_tb_s: float
    bandwidth_source: str
    tp: int = 1
    k: int
    al: float  # 0: not given (no speedup bound)
    batch: int = 1
    draft_token_us_bf16: float
    draft_token_us_recipe: float
    fc_us: float
    target_decode_us: float | None = None  # one target step for `batch` tokens (None: no target given)
    target_verify_us: float | None = None  # one target step for batch x (K+1) tokens
    round_us_bf16: float | None = None  # fc + K draft tokens + verify
    round_us_recipe: float | None = None
    speedup_bound_bf16: float | None = None  # AL x decode / round: an upper bound (acceptance and overheads aside)
    speedup_bound_recipe: float | None = None
    label: str = ESTIMATE_LABEL


class TargetStepBytes(Result):
    """Bytes one target step reads when `tokens` tokens go through it (decode: batch; verify: batch x (K+1))."""

    tokens: int
    experts: int = 0  # routed experts per MoE layer (0: dense)
    top_k: int = 0
    expected_experts_per_layer: float = 0.0  # E * (1 - (1 - k/E) ** tokens)
    expert_bytes: int = 0  # routed-expert bytes read (expected)
    other_bytes: int = 0  # attention, shared experts, dense MLPs, router, lm_head: read once per step
    total_bytes: int = 0


class DraftCost(Result):
    """A draft's cost per step: bytes by role before and after the recipe, and, with a platform, step times."""

    recipe: str  # the recipe the "after" figures assume, or "as stored" for an already quantized draft
    draft_vocab_size: int
    vocab_size: int
    roles: list[RoleBytes]
    draft_token_bf16_bytes: int  # attention + MLP + lm_head
    draft_token_recipe_bytes: int
    target: list[TargetStepBytes] = []  # decode and verify (with --target)
    estimate: StepEstimate | None = None
    label: str = ESTIMATE_LABEL


__all__ = ["ESTIMATE_LABEL", "DraftCost", "RoleBytes", "StepEstimate", "TargetStepBytes"]
