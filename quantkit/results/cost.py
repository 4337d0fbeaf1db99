"""The draft-step cost report (quantkit.rules.cost): bytes a draft step reads by role, an estimate from bytes."""

from __future__ import annotations

from pydantic import Field

from quantkit.results.base import Result

ESTIMATE = "estimate from bytes (weights read over HBM bandwidth), not a measurement"


class RoleCost(Result):
    """The bytes one role reads per draft token (fc: per round), as stored and as the step's time counts them."""

    role: str
    bytes: int
    weighted_bytes: float  # bytes x the kernel path's factor: what the time estimate divides by the bandwidth
    share: float | None = None  # of a draft token's weighted bytes (None for fc, which runs once per round)


class DraftCost(Result):
    """The bytes a draft step reads by role, as the folder stores them and as the recipe would store them."""

    estimate: str = ESTIMATE
    roles: list[RoleCost]
    per_token_bytes: float  # weighted: attention + MLP + lm_head (+ router, experts)
    fc_bytes: float
    lm_head_share: float | None
    after: list[RoleCost] = Field(default_factory=list)  # with `recipe` applied (empty: the folder is the result)
    after_recipe: str | None = None
    lm_head_share_after: float | None = None
    step_ratio_after: float | None = None  # draft-token time after / as stored

    def round_bytes(self, k: int, after: bool = False) -> float:
        """Weighted bytes of one drafting round of `k` tokens: fc once, the rest k times."""
        roles = self.after if after and self.after else self.roles
        fc = sum(r.weighted_bytes for r in roles if r.role == "fc")
        return fc + k * sum(r.weighted_bytes for r in roles if r.role != "fc")


class DraftStepEstimate(Result):
    """A draft's step on a named platform (quantkit.rules.cost.step_estimate): its bytes by role and the time they
    take to read there, an estimate from bytes, never a measurement. What `quantkit bench` reports beside the
    served figures."""

    estimate: str = ESTIMATE
    draft: str
    cost: DraftCost
    platform: str  # a BANDWIDTH_TBS key: MI300X, MI325X, MI355X, H100, H200, B200
    platform_reason: str  # why this platform: the bench's GPU, or no bandwidth on record for it
    bandwidth_tbs: float
    bandwidth_source: str
    tensor_parallel_size: int = 1
    token_us: float  # one draft token: attention, MLP, lm_head (+ router, experts)
    fc_us: float  # once per round
    round_us: dict[int, float] = Field(default_factory=dict)  # K -> fc + K draft tokens


__all__ = ["ESTIMATE", "DraftCost", "DraftStepEstimate", "RoleCost"]
