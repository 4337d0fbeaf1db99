"""Results of the `vllm serve` measurement: one batch size's figures, and the gate's serve step for a candidate."""

from __future__ import annotations

from pydantic import field_validator

from quantkit.results.acceptance import AlAgreement, PromptAcceptance
from quantkit.results.base import Result, _nan_to_none


class ServedBatch(Result):
    """One measurement through `vllm serve` at one batch size (quantkit.engines.serve_client.ServedResult, without the
    per-request detail): spec-decode counters read from /metrics before and after, timings from the stream."""

    batch_size: int
    num_requests: int = 0
    mean_acceptance_length: float | None = None
    num_drafts: int | None = None
    num_draft_tokens: int | None = None
    num_accepted: int | None = None
    accepted_per_pos: list[int] = []
    completion_tokens: int = 0
    tokens_per_s: float | None = None
    ttft_s: dict[str, float | None] = {}  # mean, p50, p90, max
    tpot_s: float | None = None
    wall_s: float = 0.0
    well_formed: bool = True
    malformed_responses: int = 0  # responses without choices, finish_reason, usage, [DONE], or with a bad count
    problems: list[str] = []  # the first few problems, "request i: what"
    per_prompt: list[PromptAcceptance] = []  # per-request counters (vLLM's per-request spec-decode metrics)
    agreement: AlAgreement | None = None  # served (a) against the in-process run (b), prompt by prompt

    _nan = field_validator("mean_acceptance_length", "tokens_per_s", "tpot_s", mode="before")(_nan_to_none)


class ServeReport(Result):
    """The gate's serve step for one candidate: one `vllm serve` (target + candidate draft), measured at each batch
    size on the acceptance prompts, against the in-process vLLM AL of the same pair on the same prompts."""

    target: str = ""
    draft: str = ""
    num_speculative_tokens: int | None = None
    max_tokens: int | None = None
    num_prompts: int | None = None
    startup_s: float | None = None
    command: list[str] = []
    in_process_al: float | None = None
    in_process_source: str = ""  # "acceptance" (the acceptance step's vLLM run) or "vllm" (run for this step)
    in_process_per_prompt: list[PromptAcceptance] = []
    batches: list[ServedBatch] = []
    error: str | None = None  # why the step stopped (server did not come up, died, refused a request)

    _nan = field_validator("in_process_al", mode="before")(_nan_to_none)

    def batch(self, size: int) -> ServedBatch | None:
        return next((b for b in self.batches if b.batch_size == size), None)


__all__ = ["ServeReport", "ServedBatch"]
