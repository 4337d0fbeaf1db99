"""Results of `bench`: served throughput and latency of arms (no speculation, the BF16 draft, each candidate draft),
per concurrency, with the speedups, the quantized-vs-BF16-draft ratio, c_step, the crossover and the K schedule.

One repeat of one cell (`BenchRun`) keeps the field names of vLLM's own serving benchmark
(vllm/benchmarks/serve.py `benchmark` and `main_async`: `output_throughput`, `median_tpot_ms`, `p99_itl_ms`,
`spec_decode_acceptance_length`, ...), so a quantkit figure can be put beside any `vllm bench serve` result.
"""

from __future__ import annotations

from typing import Literal

from pydantic import computed_field, field_validator

from quantkit.results.base import CommandResult, Result, _nan_to_none
from quantkit.results.cost import DraftStepEstimate
from quantkit.results.serve import SpecDecodeCounters

BENCH_SCHEMA_VERSION = 1
ArmKind = Literal["no-spec", "bf16-draft", "candidate"]
PERCENTILES = (50, 90, 99)
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
# the per-repeat fields of vLLM's result JSON that BenchRun keeps (vllm/benchmarks/serve.py), besides the latencies
VLLM_FIELDS = (
    "duration",
    "completed",
    "failed",
    "num_prompts",
    "max_concurrency",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "max_output_tokens_per_s",
    "max_concurrent_requests",
    "spec_decode_acceptance_rate",
    "spec_decode_acceptance_length",
    "spec_decode_num_drafts",
    "spec_decode_draft_tokens",
    "spec_decode_accepted_tokens",
    "spec_decode_per_position_acceptance_rates",
)
LATENCY_FIELDS = tuple(f"{s}_{m}_ms" for m in LATENCY_METRICS for s in ("mean", "median", "std")) + tuple(
    f"p{p}_{m}_ms" for m in LATENCY_METRICS for p in PERCENTILES
)


class BenchIdentity(Result):
    """What a figure was measured on and with: without it a served figure means nothing."""

    hardware: str = ""  # "AMD EPYC 9454 (2 cores)" or "8 x AMD Instinct MI355X"
    cpu_model: str | None = None
    cpu_cores: int | None = None
    gpu_name: str | None = None
    gpu_count: int = 0
    platform: str = ""  # quantkit's vocab: gfx950, gfx942, cuda, cpu
    tensor_parallel_size: int = 1
    vllm_version: str | None = None
    backends: dict[str, str] | None = None  # attention / MoE backends the server chose, read from its log
    backends_reason: str = ""  # why `backends` is None
    kv_cache_dtype: str = "auto"
    max_num_seqs: int | None = None
    sampling: dict[str, float | int | None] = {}
    dataset: str = ""
    dataset_revision: str | None = None
    workload: str = ""
    workload_label: str = ""  # e.g. "random data: AL not representative"
    synthetic_acceptance: bool = False  # rejection_sample_method "synthetic" in any arm
    fast_start: bool = False


class BenchRun(Result):
    """One repeat of one cell: vLLM's serving-benchmark result, with its field names (per-request lists kept:
    `input_lens`, `output_lens`, `errors`)."""

    duration: float = 0.0
    completed: int = 0
    failed: int = 0
    num_prompts: int | None = None
    max_concurrency: int | None = None
    total_input_tokens: int = 0
    total_output_tokens: int = 0
    request_throughput: float | None = None
    output_throughput: float | None = None
    total_token_throughput: float | None = None
    max_output_tokens_per_s: float | None = None
    max_concurrent_requests: int | None = None
    mean_ttft_ms: float | None = None
    median_ttft_ms: float | None = None
    std_ttft_ms: float | None = None
    p50_ttft_ms: float | None = None
    p90_ttft_ms: float | None = None
    p99_ttft_ms: float | None = None
    mean_tpot_ms: float | None = None
    median_tpot_ms: float | None = None
    std_tpot_ms: float | None = None
    p50_tpot_ms: float | None = None
    p90_tpot_ms: float | None = None
    p99_tpot_ms: float | None = None
    mean_itl_ms: float | None = None
    median_itl_ms: float | None = None
    std_itl_ms: float | None = None
    p50_itl_ms: float | None = None
    p90_itl_ms: float | None = None
    p99_itl_ms: float | None = None
    mean_e2el_ms: float | None = None
    median_e2el_ms: float | None = None
    std_e2el_ms: float | None = None
    p50_e2el_ms: float | None = None
    p90_e2el_ms: float | None = None
    p99_e2el_ms: float | None = None
    spec_decode_acceptance_rate: float | None = None
    spec_decode_acceptance_length: float | None = None
    spec_decode_num_drafts: int | None = None
    spec_decode_draft_tokens: int | None = None
    spec_decode_accepted_tokens: int | None = None
    spec_decode_per_position_acceptance_rates: list[float] = []
    input_lens: list[int] = []
    output_lens: list[int] = []
    errors: list[str] = []
    prompts_digest: str = ""  # sha256 of the prompt texts sent, in order
    json_path: str | None = None  # the whole vLLM result JSON of this repeat

    @property
    def spec(self) -> SpecDecodeCounters | None:
        """The repeat's /metrics deltas as the engines' counter type (per position: rate x drafts, as vLLM's
        serving benchmark divided them)."""
        if not self.spec_decode_num_drafts:
            return None
        d = self.spec_decode_num_drafts
        return SpecDecodeCounters(
            num_drafts=d,
            num_draft_tokens=self.spec_decode_draft_tokens or 0,
            num_accepted_tokens=self.spec_decode_accepted_tokens or 0,
            accepted_per_pos=[round(r * d) for r in self.spec_decode_per_position_acceptance_rates],
        )


class Spread(Result):
    """A figure over repeats: median, min, max and the scaled MAD (1.4826 x median absolute deviation)."""

    median: float | None = None
    min: float | None = None
    max: float | None = None
    mad: float | None = None
    n: int = 0

    _nan = field_validator("median", "min", "max", "mad", mode="before")(_nan_to_none)


class BenchCell(Result):
    """One arm at one concurrency: every repeat, and the figures over them."""

    concurrency: int
    num_prompts: int
    output_len: int
    repeats: list[BenchRun] = []
    ok: bool = True  # no repeat had a failed request (a failed request fails the cell)
    problems: list[str] = []
    output_throughput: Spread = Spread()  # tok/s
    output_throughput_per_gpu: Spread = Spread()  # tok/s / tensor_parallel_size
    latency_ms: dict[str, Spread] = {}  # "<p50|p90|p99|mean>_<ttft|tpot|itl|e2el>" -> spread over repeats
    interactivity: float | None = None  # tokens/s per user: 1000 / median TPOT (InferenceX's intvty)
    interactivity_reason: str = ""  # why `interactivity` is None (a TPOT of 0 from a merged stream is no TPOT)
    acceptance_length: float | None = None  # pooled over repeats: 1 + accepted / drafts
    per_position_acceptance: list[float] = []  # pooled: accepted at position i / drafts
    spec: SpecDecodeCounters | None = None  # summed over repeats

    _nan = field_validator("interactivity", "acceptance_length", mode="before")(_nan_to_none)


class BenchArm(Result):
    """One served configuration: a target, with or without a draft, at one K."""

    name: str
    kind: ArmKind
    target: str
    draft: str | None = None
    num_speculative_tokens: int | None = None  # K; 0 = the draft served with a K=0 schedule (nothing drafted)
    speculative_config: dict[str, object] | None = None
    endpoint: str | None = None  # an already-running server, measured only
    command: list[str] = []
    startup_s: float | None = None
    server_pid: int | None = None  # the started server's pid (its process group), gone once the arm is done
    backends: dict[str, str] | None = None
    backends_reason: str = ""
    cells: list[BenchCell] = []
    error: str | None = None

    def cell(self, concurrency: int) -> BenchCell | None:
        return next((c for c in self.cells if c.concurrency == concurrency), None)


class BenchComparison(Result):
    """One arm against its baselines at one concurrency."""

    arm: str
    concurrency: int
    speedup: float | None = None  # median output tok/s over the no-speculation arm's (same target)
    speedup_ci: list[float | None] | None = None  # bootstrap over repeats
    vs_bf16_draft: float | None = None  # a candidate's median output tok/s over the BF16 draft's (same target, K)
    vs_bf16_draft_ci: list[float | None] | None = None
    c_step: float | None = None  # TPOT_spec x AL / TPOT_base: a speculative step's cost in plain decode steps
    c_step_from: Literal["tpot", "throughput"] | None = None  # how (quantkit.bench.figures.c_step_measured)
    acceptance_length: float | None = None
    cost_named: str = ""  # e.g. "keeps its AL but costs more per step" (against the BF16 draft)

    _nan = field_validator("speedup", "vs_bf16_draft", "c_step", "acceptance_length", mode="before")(_nan_to_none)


class KChoice(Result):
    """The K with the highest median output tok/s at one concurrency, for one draft."""

    concurrency: int
    k: int
    output_throughput: float | None = None
    by_k: dict[int, float | None] = {}


class KSchedule(Result):
    """A recommended K per batch size for one draft, in vLLM's form: `num_speculative_tokens_per_batch_size`, a list of
    inclusive (range_start, range_end, K) (vllm/config/speculative.py SpeculativeConfig; validated by
    vllm/v1/spec_decode/dynamic/utils.py validate_and_normalize_dynamic_sd_schedule)."""

    target: str = ""
    draft: str
    arm_prefix: str
    choices: list[KChoice] = []
    num_speculative_tokens_per_batch_size: list[tuple[int, int, int]] = []
    num_speculative_tokens: int | None = None  # the largest K of the schedule (vLLM's maximum)


class BenchSettings(Result):
    concurrency: list[int] = []
    output_len: int = 0
    repeats: int = 0
    num_warmups: str = ""  # "2 x C"
    ks: list[int] = []
    prompts: str = ""
    num_prompt_texts: int = 0
    request_rate: str = "inf"
    ignore_eos: bool = True
    prefix_caching: bool = False
    bootstrap_samples: int = 0
    load_generator: str = "vllm.benchmarks.serve (in-process: add_cli_args + main)"


class SpeedupRow(Result):
    """One concurrency of a candidate's speedup: the three arms' median output tok/s side by side, and the
    comparisons the bench made (quantkit.bench.figures.compare), as they were made."""

    concurrency: int
    no_spec_output_throughput: float | None = None  # tok/s, median over repeats
    bf16_draft_output_throughput: float | None = None
    candidate_output_throughput: float | None = None
    speedup: float | None = None  # candidate / no speculation
    speedup_ci: list[float | None] | None = None
    bf16_draft_speedup: float | None = None  # BF16 draft / no speculation
    bf16_draft_speedup_ci: list[float | None] | None = None
    vs_bf16_draft: float | None = None  # candidate / BF16 draft
    vs_bf16_draft_ci: list[float | None] | None = None
    c_step: float | None = None  # the candidate's
    bf16_draft_c_step: float | None = None
    acceptance_length: float | None = None  # the candidate's, served
    bf16_draft_acceptance_length: float | None = None
    cost_named: str = ""


class SpeedupSummary(Result):
    """A candidate's served speedup, per concurrency, with what it was measured on: what the gate report, the model
    card and the published sidecar show (BenchResult.speedup_summary)."""

    candidate_arm: str
    bf16_draft_arm: str | None = None
    no_spec_arm: str | None = None
    num_speculative_tokens: int | None = None
    rows: list[SpeedupRow] = []
    crossover: int | None = None  # the candidate's BenchResult.crossover (None: it pays at the largest C measured)
    bf16_draft_crossover: int | None = None
    max_concurrency_measured: int | None = None
    # the bench's recommended K per batch size for the candidate (KSchedule), in vLLM's form; [] when not swept
    num_speculative_tokens_per_batch_size: list[tuple[int, int, int]] = []
    identity: BenchIdentity = BenchIdentity()
    output_len: int = 0
    repeats: int = 0
    deployment_hardware: bool | None = None  # BenchResult.deployment_hardware
    # the BF16 draft's and the candidate's step by role on a named platform: an estimate from bytes (BenchResult)
    draft_costs: list[DraftStepEstimate] = []

    @computed_field  # type: ignore[prop-decorator]
    @property
    def hardware_dependent(self) -> bool:
        """Whether these figures were measured elsewhere than on the deployment's hardware (or nobody said)."""
        return self.deployment_hardware is not True


class BenchResult(CommandResult):
    """`quantkit bench --json`: every arm's cells, the comparisons, the crossovers and the K schedules."""

    schema_version: int = BENCH_SCHEMA_VERSION
    identity: BenchIdentity = BenchIdentity()
    settings: BenchSettings = BenchSettings()
    arms: list[BenchArm] = []
    comparisons: list[BenchComparison] = []
    crossover: dict[str, int | None] = {}  # arm -> lowest C from which its speedup stays < 1 (None: pays at the top C)
    not_paying: dict[str, list[int]] = {}  # arm -> every measured C where its speedup < 1
    k_schedules: list[KSchedule] = []
    charts: dict[str, str] = {}
    # each EAGLE-3 draft's step by role and its time on a named platform: an estimate from bytes, never a measurement
    draft_costs: list[DraftStepEstimate] = []
    out_dir: str | None = None
    seconds: float = 0.0
    warnings: list[str] = []
    # whether the runner was the deployment's hardware: the gate sets it from bench.runner_is_deployment_hardware;
    # None when nobody said (quantkit bench alone), which readers treat as "not the deployment's"
    deployment_hardware: bool | None = None

    def arm(self, name: str) -> BenchArm | None:
        return next((a for a in self.arms if a.name == name), None)

    def comparison(self, arm: str, concurrency: int) -> BenchComparison | None:
        return next((c for c in self.comparisons if c.arm == arm and c.concurrency == concurrency), None)

    @property
    def ok(self) -> bool:
        return all(a.error is None and all(c.ok for c in a.cells) for a in self.arms)

    def candidate_arm(self, k: int | None = None) -> BenchArm | None:
        """The (first) candidate arm, at K `k` when given, else at the largest K measured."""
        arms = [a for a in self.arms if a.kind == "candidate" and (k is None or a.num_speculative_tokens == k)]
        return max(arms, key=lambda a: a.num_speculative_tokens or 0, default=None)

    def schedule_for(self, draft: str | None) -> KSchedule | None:
        return next((s for s in self.k_schedules if s.draft == draft), None)

    def speedup_summary(self, k: int | None = None) -> SpeedupSummary | None:
        """The candidate's speedup (candidate_arm(k)) beside the no-speculation arm and the BF16 draft at the same
        target and K: the comparisons and crossovers this result holds, selected, not recomputed."""
        cand = self.candidate_arm(k)
        if cand is None:
            return None
        base = next((a for a in self.arms if a.kind == "no-spec" and a.target == cand.target), None)
        bf16 = next(
            (
                a
                for a in self.arms
                if a.kind == "bf16-draft"
                and a.target == cand.target
                and a.num_speculative_tokens == cand.num_speculative_tokens
            ),
            None,
        )
        rows = []
        for cell in cand.cells:
            c = cell.concurrency
            comp, ref = self.comparison(cand.name, c), self.comparison(bf16.name, c) if bf16 else None
            bc, rc = (base.cell(c) if base else None), (bf16.cell(c) if bf16 else None)
            rows.append(
                SpeedupRow(
                    concurrency=c,
                    no_spec_output_throughput=bc.output_throughput.median if bc else None,
                    bf16_draft_output_throughput=rc.output_throughput.median if rc else None,
                    candidate_output_throughput=cell.output_throughput.median,
                    speedup=comp.speedup if comp else None,
                    speedup_ci=comp.speedup_ci if comp else None,
                    bf16_draft_speedup=ref.speedup if ref else None,
                    bf16_draft_speedup_ci=ref.speedup_ci if ref else None,
                    vs_bf16_draft=comp.vs_bf16_draft if comp else None,
                    vs_bf16_draft_ci=comp.vs_bf16_draft_ci if comp else None,
                    c_step=comp.c_step if comp else None,
                    bf16_draft_c_step=ref.c_step if ref else None,
                    acceptance_length=cell.acceptance_length,
                    bf16_draft_acceptance_length=rc.acceptance_length if rc else None,
                    cost_named=comp.cost_named if comp else "",
                )
            )
        sched = self.schedule_for(cand.draft)
        return SpeedupSummary(
            candidate_arm=cand.name,
            bf16_draft_arm=bf16.name if bf16 else None,
            no_spec_arm=base.name if base else None,
            num_speculative_tokens=cand.num_speculative_tokens,
            rows=rows,
            crossover=self.crossover.get(cand.name),
            bf16_draft_crossover=self.crossover.get(bf16.name) if bf16 else None,
            max_concurrency_measured=max((r.concurrency for r in rows), default=None),
            num_speculative_tokens_per_batch_size=list(sched.num_speculative_tokens_per_batch_size) if sched else [],
            identity=self.identity,
            output_len=self.settings.output_len,
            repeats=self.settings.repeats,
            deployment_hardware=self.deployment_hardware,
            draft_costs=[e for e in self.draft_costs if e.draft in {cand.draft, bf16.draft if bf16 else None}],
        )


__all__ = [
    "BENCH_SCHEMA_VERSION",
    "LATENCY_FIELDS",
    "VLLM_FIELDS",
    "ArmKind",
    "BenchArm",
    "BenchCell",
    "BenchComparison",
    "BenchIdentity",
    "BenchResult",
    "BenchRun",
    "BenchSettings",
    "KChoice",
    "KSchedule",
    "SpeedupRow",
    "SpeedupSummary",
    "Spread",
]
