"""The result model: what every stage writes and every reader (gate, report files, card, demo, CLI) reads.

One typed, versioned model, written once: `apply` writes an ApplyResult (quantkit.json), `check` a CheckResult
whose summary is CheckSummary, `acceptance` an AcceptanceResult, `eval` an EvalResult; the gate assembles these
very objects into a GateReport (report.json, and report-<candidate>.json per candidate), and `publish` reads that
report and the ApplyResult into the model card. No stage rebuilds another's result as a dict.

Every document carries `schema_version` (SCHEMA_VERSION). Readers are tolerant within a version: unknown keys are
ignored and sections may be missing (a partial report still renders a card); a higher version is refused, since
its meaning may have changed. Figures that could not be computed are null in JSON (never NaN).

Mean acceptance length AL = 1 + accepted draft tokens / drafts (vLLM's and Quark's definition); eval `delta` =
candidate - baseline, `recovery` = candidate / baseline (inverted for lower-is-better metrics).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from quantkit.errors import QuantkitError

SCHEMA_VERSION = 1

ModelKind = Literal["eagle3-draft", "moe-target", "dense-target"]
EAGLE3_DRAFT: ModelKind = "eagle3-draft"
MOE_TARGET: ModelKind = "moe-target"
DENSE_TARGET: ModelKind = "dense-target"
Severity = Literal["error", "warning", "info"]


class ResultFileError(QuantkitError):
    """A result file (report, manifest) is missing, not JSON, of an unknown schema version, or has a wrong field."""


# Kept for readers of older code: the gate report's error class.
ReportError = ResultFileError


class Result(BaseModel):
    """Base of every result: tolerant reading (unknown keys ignored), strict JSON writing (NaN -> null)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    def to_dict(self) -> dict[str, Any]:
        from quantkit.io.jsonout import finite

        return finite(self.model_dump(mode="json"))


def _nan_to_none(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v


# --- apply -------------------------------------------------------------------------------------------------------


class LayerDecision(Result):
    """What apply does with one vLLM runtime layer, and why."""

    runtime_name: str
    role: str = ""
    kind: str = ""
    checkpoint_modules: list[str] = []
    action: Literal["quantize", "keep"]
    scheme: str | None = None
    reason: str = ""
    source_format: str | None = None  # how the source stored it (bf16, fp8-block, int4-pack-quantized)


class ShardSummary(Result):
    """One shard as the executor wrote it: sizes, the SHA-256 of the bytes read and written, device, seconds."""

    name: str
    bytes_in: int = 0
    bytes_out: int = 0
    sha256_in: str = ""
    sha256_out: str = ""
    device: str = ""
    seconds: float = 0.0
    resumed: bool = False


class ApplyResult(Result):
    """Everything `apply` did; written as quantkit.json (the manifest) and printed by `--json`."""

    schema_version: int = SCHEMA_VERSION
    command: str = ""
    output: str = ""
    source: str = ""
    target: str | None = None  # the --target an EAGLE-3 draft was applied with (folder or Hub id)
    recipe: dict[str, Any] = {}
    model_kind: ModelKind = DENSE_TARGET
    architecture: str = ""
    path: str = ""
    path_reason: str = ""
    device: str = ""
    engine: str = "quark"
    source_format: str = "bf16"
    exclude: list[str] = []
    quark_exclude: list[str] = []
    layers: list[LayerDecision] = []
    size_before_bytes: int = 0
    size_after_bytes: int = 0
    timings_s: dict[str, float] = {}
    peak_rss_mb: float = 0.0
    versions: dict[str, str] = {}
    source_files: dict[str, str] = {}
    verified: dict[str, Any] = {}
    target_num_layers: int | None = None
    output_files: list[str] = []  # every file written, as paths relative to the output (`sub/file`)
    not_copied: list[str] = []  # source files (and `folder/`s) not copied: not what a checkpoint carries (io.files)
    # The shard executor (engine "native") and --dry-run:
    devices: list[str] = []
    device_plan: dict[str, list[str]] = {}  # device -> source shards it quantizes
    shards: list[ShardSummary] = []
    resumed_shards: int = 0
    throughput_mb_s: float | None = None
    dry_run: bool = False
    # *.safetensors in the source that its index does not name: neither quantized nor copied (the index is the truth)
    ignored_weight_files: list[str] = []

    @property
    def quantized(self) -> list[LayerDecision]:
        return [d for d in self.layers if d.action == "quantize"]

    @property
    def kept(self) -> list[LayerDecision]:
        return [d for d in self.layers if d.action == "keep"]

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d["summary"] = {"quantized_layers": len(self.quantized), "kept_layers": len(self.kept),
                        "size_ratio": round(self.size_after_bytes / max(self.size_before_bytes, 1), 4)}
        return d


# --- check -------------------------------------------------------------------------------------------------------


class Finding(Result):
    """One result of a check: what is wrong (or worth knowing) about which layer or tensor, and the fix."""

    severity: Severity
    code: str
    layer_or_tensor: str
    message: str
    fix: str = ""


class VllmLoad(Result):
    """The real vLLM load of `check`: status off | skipped | loaded | failed | timeout, and what was loaded."""

    status: str
    reason: str | None = None
    engine: str | None = None
    mode: str | None = None
    error: str | None = None
    seconds: float | None = None
    generated_token_ids: list[int] | None = None
    generated_text: str | None = None
    layers: dict[str, dict[str, Any]] | None = None


class NumericLayer(Result):
    relative_error: float | None = None
    bound: float | None = None
    precision: str | None = None


class LogitsAgreement(Result):
    method: str = ""
    positions: int = 0
    mean_cosine: float | None = None
    min_cosine: float | None = None
    top1_agreement: float | None = None
    error: str | None = None


class NumericResult(Result):
    """`check --numeric`: dequantized weights vs the source's, and logits agreement on built-in prompts."""

    source: str
    method: str = ""
    layers: dict[str, NumericLayer] = {}
    logits: LogitsAgreement | None = None


class CheckSummary(Result):
    """What the gate keeps of a check: counts, every finding, the real load."""

    errors: int
    warnings: int
    quantized_layers: int | None = None
    findings: list[Finding] = []
    vllm_load: VllmLoad | None = None


# --- acceptance --------------------------------------------------------------------------------------------------


class DomainAcceptance(Result):
    mean_acceptance_length: float | None = None
    num_drafts: int | None = None
    num_accepted: int | None = None
    prompts: int | None = None

    _nan = field_validator("mean_acceptance_length", mode="before")(_nan_to_none)


class PromptAcceptance(Result):
    id: str
    domain: str
    num_drafts: int
    num_accepted: int
    generated_tokens: int
    output_digest: str | None = None  # fingerprint of the generated token ids (quantkit.acceptance.agreement)


class AlAgreement(Result):
    """Two measurements of one pair's AL on the same prompts, compared per prompt and with a paired randomization
    bound (quantkit.acceptance.agreement, whose docstring gives the reasons)."""

    delta: float | None = None  # AL(a) - AL(b)
    bound: float = 0.0  # the |delta| the prompts whose counters differ explain, at `level`
    p_value: float = 0.0
    level: float = 0.99
    agree: bool = False  # p_value > 1 - level
    prompts: int = 0
    differing_prompts: int = 0  # prompts whose (drafts, accepted) differ
    same_output_prompts: int | None = None  # prompts with identical generated tokens (None: not known)
    counter_mismatches: list[str] = []  # prompts with identical tokens but other counters


class DraftAcceptance(Result):
    """Counters and derived figures of one draft (or one target) over the prompt set."""

    label: str = ""
    target: str | None = None
    draft: str | None = None
    model: str | None = None  # the checkpoint whose figures these are (the draft, or the target when it is judged)
    mean_acceptance_length: float | None = None
    num_drafts: int | None = None
    num_draft_tokens: int | None = None
    num_accepted: int | None = None
    acceptance_rate_per_pos: list[float | None] | None = None
    tokens_per_target_forward: float | None = None
    generated_tokens: int | None = None
    per_domain: dict[str, DomainAcceptance] = {}
    per_prompt: list[PromptAcceptance] = []
    by_context_length: dict[str, float | None] = {}
    wall_s: float = 0.0

    @model_validator(mode="before")
    @classmethod
    def _older_names(cls, data: Any) -> Any:
        # Gate reports before the result model named the per-position rates `per_position`.
        if isinstance(data, dict) and "per_position" in data and "acceptance_rate_per_pos" not in data:
            data = {**data, "acceptance_rate_per_pos": data["per_position"]}
        return data

    @field_validator("per_domain", mode="before")
    @classmethod
    def _domain_figures(cls, v: Any) -> Any:
        # Reports written by hand (or by other tools) may give a domain's AL as a bare number.
        if isinstance(v, dict):
            return {k: {"mean_acceptance_length": x} if isinstance(x, (int, float)) else x for k, x in v.items()}
        return v

    _nan = field_validator("mean_acceptance_length", "tokens_per_target_forward", mode="before")(_nan_to_none)

    def domain_al(self, domain: str) -> float | None:
        d = self.per_domain.get(domain)
        return d.mean_acceptance_length if d is not None else None


class AcceptanceSettings(Result):
    num_speculative_tokens: int | None = None
    temperature: float | None = None
    max_new_tokens: int | None = None
    prompts: str | None = None
    num_prompts: int | None = None
    seed: int | None = None
    context_lengths: list[int] = []


class AcceptanceResult(Result):
    """Baseline (BF16 draft) vs candidate, as the CLI prints it, `--json` emits it and the gate report holds it."""

    backend: str | None = None
    settings: AcceptanceSettings = AcceptanceSettings()
    baseline: DraftAcceptance | None = None
    candidate: DraftAcceptance | None = None
    ratio: float | None = None
    ratio_ci: list[float | None] | None = None
    per_domain_ratio: dict[str, float | None] = {}
    context_length_ratio: dict[str, float | None] = {}
    candidate_kind: str | None = None  # "draft", "target", or "pair" (candidate draft on candidate target)
    candidate_target: str | None = None  # pair mode: the quantized target the candidate draft runs on
    greedy_outputs_identical: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _older_layout(cls, data: Any) -> Any:
        # Gate reports before the result model kept the run settings at the top of the acceptance section.
        if isinstance(data, dict) and "settings" not in data:
            moved = {k: data[k] for k in ("num_speculative_tokens", "prompts", "num_prompts") if k in data}
            if moved:
                data = {**data, "settings": moved}
        return data

    def domains(self) -> list[str]:
        """Domains that either run reports, in first-seen order."""
        seen: dict[str, None] = {}
        for run in (self.baseline, self.candidate):
            if run is not None:
                seen.update(dict.fromkeys(run.per_domain))
        return list(seen)


# --- eval --------------------------------------------------------------------------------------------------------


class MetricDelta(Result):
    """One task metric of both models. `metric` is lm-eval's key without `,none` (`acc`, `exact_match,json-object`)."""

    task: str
    metric: str
    filter: str = "none"
    higher_is_better: bool | None = None
    num_items: int | None = None
    baseline: float | None = None
    baseline_stderr: float | None = None
    candidate: float | None = None
    candidate_stderr: float | None = None
    delta: float | None = None
    delta_stderr: float | None = None
    delta_stderr_method: str = ""  # "paired" over items, or "unpaired" from the two stderrs
    delta_ci95: list[float] | None = None
    recovery: float | None = None  # candidate / baseline (inverted when lower is better); None if undefined
    recovery_ci95: list[float] | None = None
    recovery_lower_bound: float | None = None  # recovery_ci95[0], for a gate's statistical threshold


class EvalResult(Result):
    """Baseline vs candidate on the same tasks and settings."""

    model: str | None = None
    baseline_model: str | None = None
    backend: str | None = None
    limit: int | None = None
    num_fewshot: int | None = None
    tasks: list[MetricDelta] = []
    settings: dict[str, Any] = {}
    timings_s: dict[str, float] = {}


# --- gate --------------------------------------------------------------------------------------------------------


class GateCheck(Result):
    """One compared figure: passes when `value op threshold` holds."""

    candidate: str = ""
    step: str = ""
    name: str
    value: float | None = None
    threshold: float | None = None
    op: str | None = None
    passed: bool | None = None
    message: str = ""

    def line(self) -> str:
        if self.value is None or self.threshold is None:
            return f"{self.candidate}: {self.step}: {self.name}: {self.message}"
        return (f"{self.candidate}: {self.step}: {self.name} = {self.value:.4g} "
                f"(threshold {self.op} {self.threshold:.4g}){'' if self.passed else ' FAILED'}")


class Verdict(Result):
    passed: bool | None = None
    checks: list[GateCheck] = []


ReleaseVerdict = Literal["pass", "regression", "anomalous", "infeasible"]


class ServedBatch(Result):
    """One measurement through `vllm serve` at one batch size (quantkit.deploy.serve.ServedResult, without the
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


class ReleaseFigures(Result):
    """ModelOpt-style release figures of a candidate against its source (the BF16 draft for a draft, the baseline
    for a target): weight bytes, apply's dry-run prediction of them, and tokenizer drift."""

    source: str = ""
    size_ratio: float | None = None  # output / source safetensors bytes
    predicted_size_ratio: float | None = None  # apply --dry-run's prediction with quantkit.json's recipe
    tokenizer_drift: list[str] | None = None  # one line per drifted tokenizer file; [] when byte-identical


class CandidateReport(Result):
    """Everything the gate measured for one candidate; also the document `publish --report` reads."""

    schema_version: int = SCHEMA_VERSION
    model: str | None = None
    baseline_model: str | None = None
    model_kind: ModelKind | None = None
    check: CheckSummary | None = None
    acceptance: AcceptanceResult | None = None
    eval: EvalResult | None = None
    serve: ServeReport | None = None
    release: ReleaseFigures | None = None
    gate: Verdict | None = None
    verdict: ReleaseVerdict | None = None  # quantkit.deploy.checks.judge over this candidate's figures
    verdict_reasons: list[str] = []


class GateSummary(Result):
    name: str = ""
    config: str = ""
    passed: bool = False
    verdict: ReleaseVerdict | None = None  # pass | regression | anomalous | infeasible (quantkit.deploy.checks)
    reasons: list[str] = []  # "<verdict>: <figure>: why", every one that applies
    checks: list[GateCheck] = []
    seconds: float = 0.0


class GateReport(Result):
    """report.json: the gate's verdict and every candidate's report."""

    schema_version: int = SCHEMA_VERSION
    quantkit_version: str = ""
    gate: GateSummary
    candidates: dict[str, CandidateReport] = {}


# --- reading -----------------------------------------------------------------------------------------------------


def _check_version(data: dict[str, Any], source: str) -> None:
    version = data.get("schema_version", data.get("quantkit_manifest_version", SCHEMA_VERSION))
    if isinstance(version, bool) or not isinstance(version, int) or version > SCHEMA_VERSION or version < 1:
        raise ResultFileError(f"{source}: schema_version {version!r} is not supported (this quantkit reads "
                              f"{SCHEMA_VERSION}); write it with this quantkit or upgrade quantkit")


def _validate(cls: type[Result], data: Any, source: str) -> Any:
    if not isinstance(data, dict):
        raise ResultFileError(f"{source}: expected a JSON object with schema_version {SCHEMA_VERSION}")
    _check_version(data, source)
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        from quantkit.io.schema import shown

        err = e.errors(include_url=False)[0]
        where = ".".join(str(p) for p in err["loc"])
        found = "" if err["type"] == "missing" else f", got {shown(err.get('input'))}"
        raise ResultFileError(f"{source}: field {where}: {err['msg']}{found}; write it with quantkit again (the "
                              "format is quantkit/results.py)") from None


def select_candidate(data: Any, model: str | Path | None, source: str = "report") -> Any:
    """From a whole-gate report (`candidates`: name -> report), the one whose `model` is `model`'s folder.

    A report of one candidate is returned as is; a gate report with one candidate gives that candidate.
    """
    if not isinstance(data, dict) or not isinstance(data.get("candidates"), dict):
        return data
    cands = data["candidates"]
    version = data.get("schema_version", SCHEMA_VERSION)
    if model is not None:
        want = str(Path(model).resolve())
        for rep in cands.values():
            if isinstance(rep, dict) and isinstance(rep.get("model"), str) and _resolved(rep["model"]) == want:
                return {"schema_version": version, **rep}
    if len(cands) == 1:
        return {"schema_version": version, **next(iter(cands.values()))}
    names = ", ".join(cands)
    raise ResultFileError(f"{source}: a gate report with candidates {names} and none is {model}; pass the "
                          "candidate's report-<name>.json written beside it")


def _resolved(path: str) -> str | None:
    try:
        return str(Path(path).resolve())
    except (OSError, ValueError):  # a NUL byte or a name too long: it names no folder
        return None


def parse_report(data: Any, source: str = "report", model: str | Path | None = None) -> CandidateReport:
    """A candidate's report from decoded JSON; `model` picks the candidate of a whole-gate report."""
    return _validate(CandidateReport, select_candidate(data, model, source), source)


def load_report(path: str | Path, model: str | Path | None = None) -> CandidateReport:
    """Read report.json (picking `model`'s candidate) or a report-<candidate>.json."""
    from quantkit.io.headers import load_json_file

    p = Path(path)
    data = load_json_file(p, "pass the report.json that `quantkit gate` wrote", ResultFileError)
    return parse_report(data, f"report {p}", model)


def load_manifest(folder: str | Path) -> ApplyResult:
    """The quantkit.json of an apply output folder."""
    from quantkit.io.headers import load_json_file

    p = Path(folder) / "quantkit.json"
    data = load_json_file(p, "re-run `quantkit apply` to rewrite the folder", ResultFileError)
    return _validate(ApplyResult, data, str(p))
