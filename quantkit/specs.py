"""One settings model per stage: what `apply`, `check`, `acceptance`, `eval`, `bench`, `deploy` and `publish` are
asked to do, apart from the models they are given.

A spec is validated by field name (pydantic), so a library caller is told about the field it set, never about a
command-line flag it did not pass. The Python API (`quantkit.apply(...)` etc.) builds one from its keyword
arguments; the gate config's step sections are a spec plus the step's thresholds (`quantkit.gate.config`); a
result echoes the settings it ran with. Imports nothing heavy: `import quantkit` stays light.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from quantkit.bench import MAX_CONCURRENCY, MAX_K, MAX_LIST, MAX_REQUEST_TIMEOUT_S
from quantkit.errors import QuantkitError
from quantkit.vocab import Platform, VllmMode

S = TypeVar("S", bound="Spec")

PathLike = str | Path
# numbers a spec accepts are bounded: a hostile or mistyped value is refused before it drives any loop
MAX_TP = 1024
MAX_TOKENS = 1_048_576


class SpecError(QuantkitError):
    """A spec (or a keyword argument of the Python API) has an unknown field or a value out of its range."""


class Spec(BaseModel):
    """Base of the stage specs: unknown fields are errors, NaN and infinities are refused, assignments are checked."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False, frozen=False)

    @classmethod
    def build(cls: type[S], spec: S | None = None, **overrides: Any) -> S:
        """`spec` (or the defaults) with `overrides` applied, validated; SpecError naming the field otherwise."""
        from quantkit.io.schema import describe_all

        base = spec.model_dump(exclude_unset=True) if spec is not None else {}
        if spec is not None and not isinstance(spec, cls):
            raise SpecError(
                f"spec: expected a {cls.__name__}, got {type(spec).__name__}; build one with "
                f"quantkit.{cls.__name__}(...)"
            )
        try:
            return cls.model_validate({**base, **overrides})
        except ValidationError as e:
            field, _, reason = describe_all(e).partition(": ")
            if field == "(top level)":  # a rule across fields names its field first: "num_seeds: ..."
                field, _, reason = reason.partition(": ")
                reason = reason.split(", got ")[0]
            raise SpecError(
                input=f"{cls.__name__}.{field}", reason=reason, fix=f"see the fields of quantkit.{cls.__name__}"
            ) from None


class ApplySpec(Spec):
    """How `apply` quantizes a checkpoint (the checkpoint itself is the verb's first argument)."""

    recipe: str = Field(min_length=1, description="A built-in recipe name or the path of a recipe YAML file.")
    output: PathLike = Field(description="The output folder (written beside, renamed into place when complete).")
    target: PathLike | None = Field(default=None, description="For EAGLE-3 drafts: the target (folder or Hub id).")
    devices: str | list[str] = Field(default="auto", description="auto, cpu, cuda, or devices such as cuda:0,cuda:1.")
    path: Literal["auto", "in-memory", "per-shard"] | None = None
    engine: Literal["auto", "native", "quark"] = "auto"
    overwrite: bool = False
    resume: bool = False
    dry_run: bool = False
    max_memory: int | str | None = Field(default=None, description="Host memory budget: bytes or '8GiB'.")
    max_shard_size: int | str | None = Field(default=None, description="Output shard size: bytes or '5GB'.")
    trust_remote_code: bool = False


class InspectSpec(Spec):
    """What `inspect` reports for a folder: vLLM's precision per layer and the kernel path on a platform."""

    target_num_layers: int | None = Field(default=None, ge=1, le=100_000)
    platform: Platform | None = None
    tp: int = Field(default=1, ge=1, le=MAX_TP)
    vllm_version: str | None = Field(default=None, max_length=64)


class CheckSpec(Spec):
    """What `check` verifies about a quantized folder, and whether it loads it in vLLM."""

    target: PathLike | None = None
    tp: int = Field(default=1, ge=1, le=MAX_TP)
    platform: Platform = "gfx950"
    vllm: VllmMode = "auto"
    numeric: bool = False
    source: PathLike | None = None
    load_timeout_s: float = Field(default=900.0, gt=0, le=86_400)
    vllm_version: str | None = Field(default=None, max_length=64)


class AcceptanceSpec(Spec):
    """How acceptance is measured: the same settings for the baseline and the candidate. The gate's `acceptance`
    section is this spec plus its thresholds."""

    backend: Literal["auto", "reference", "vllm"] = "auto"
    prompts: str = "builtin"
    num_speculative_tokens: int = Field(default=3, ge=1, le=64)
    max_new_tokens: int = Field(default=64, ge=1, le=MAX_TOKENS)
    temperature: float = Field(default=0.0, ge=0, le=100)
    # sampling as production runs it, recorded in every result
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=-1)
    seed: int = Field(default=0, ge=0)
    num_seeds: int = Field(default=1, ge=1, le=1000)
    draft_sample_method: Literal["greedy", "probabilistic"] = "greedy"
    chat_template_kwargs: dict[str, bool | int | float | str | None] = {}
    speed_bench: str | None = None  # with prompts speed-bench:CONFIG[/CATEGORY]: a folder or Hub id
    context_lengths: list[int] | None = None  # long-context prompts of these token lengths (None: none)
    context_source: str | None = None  # the long text those prompts are cut from (None: synthetic notes)
    device: str = "cpu"  # the reference engine's device

    @field_validator("context_lengths")
    @classmethod
    def _no_lengths_is_none(cls, value: list[int] | None) -> list[int] | None:
        return value or None

    @model_validator(mode="after")
    def _consistent(self) -> AcceptanceSpec:
        if self.num_seeds > 1 and self.temperature == 0:
            raise ValueError(
                "num_seeds: greedy decoding (temperature 0) does not depend on the seed; use 1 seed or a "
                "temperature above 0"
            )
        if self.context_source is not None and not self.context_lengths:
            raise ValueError("context_source: give the bucket lengths in context_lengths")
        return self


class EvalSpec(Spec):
    """The lm-eval run `eval` makes on the model and its baseline, with the same settings."""

    tasks: list[str] | str = Field(min_length=1)
    backend: Literal["hf", "vllm"] = "hf"
    limit: int | None = Field(default=None, ge=1)
    num_fewshot: int = Field(default=0, ge=0, le=1000)
    device: str = "cpu"
    batch_size: int = Field(default=16, ge=1, le=65_536)
    max_model_len: int | None = Field(default=None, ge=1, le=MAX_TOKENS)


class BenchSpec(Spec):
    """How `bench` serves and loads each arm (concurrencies, output length, repeats, K values)."""

    out_dir: PathLike
    draft: PathLike | None = None
    candidates: list[PathLike] = []
    candidate_target: PathLike | None = None
    concurrency: list[Annotated[int, Field(ge=1, le=MAX_CONCURRENCY)]] | None = Field(
        default=None, min_length=1, max_length=MAX_LIST
    )
    output_len: int = Field(default=64, ge=2, le=MAX_TOKENS)
    repeats: int = Field(default=3, ge=1, le=100)
    ks: list[Annotated[int, Field(ge=0, le=MAX_K)]] | None = Field(default=None, min_length=1, max_length=MAX_LIST)
    prompts: str = "builtin"
    workload: str = "prompts"
    endpoints: dict[str, str] | None = None
    tp: int = Field(default=1, ge=1, le=MAX_TP)
    max_num_seqs: int | None = Field(default=None, ge=1)
    fast_start: bool = False
    startup_timeout_s: float = Field(default=600, gt=0, le=86_400)
    temperature: float = Field(default=0.0, ge=0, le=100)
    max_prompt_texts: int | None = Field(default=None, ge=1)
    request_timeout_s: float = Field(default=600, gt=0, le=MAX_REQUEST_TIMEOUT_S)


class ServeSpec(Spec):
    """How `vllm serve` is to run a folder (and its target): what `deploy` checks and writes as a command."""

    target: PathLike | None = None
    platform: Platform = "gfx950"
    tp: int = Field(default=1, ge=1, le=MAX_TP)
    max_model_len: int | None = Field(default=None, ge=1, le=MAX_TOKENS * 16)
    kv_cache_dtype: str = "auto"
    num_speculative_tokens: int = Field(default=3, ge=1, le=64)
    model_ref: str | None = None
    draft_ref: str | None = None
    block_size: int | None = Field(default=None, ge=1, le=65_536)
    draft_attention_backend: str | None = None
    dtype: str | None = None
    pin_backends: bool = False
    vllm_version: str | None = Field(default=None, max_length=64)
    nodes: int = Field(default=1, ge=1, le=4096)


class PublishSpec(Spec):
    """Where and how `publish` uploads a folder with its model card."""

    repo_id: str = Field(min_length=3, max_length=96)
    private: bool = False
    revision: str | None = None
    create_pr: bool = False
    report: PathLike | None = None
    dry_run: bool = False
    endpoint: str | None = None
    token: str | None = Field(default=None, repr=False)
    base_model: str | None = None
    target: str | None = None
    dry_run_dir: PathLike | None = None
    platform: Platform = "gfx950"
    tp: int = Field(default=1, ge=1, le=MAX_TP)


__all__ = [
    "AcceptanceSpec",
    "ApplySpec",
    "BenchSpec",
    "CheckSpec",
    "EvalSpec",
    "InspectSpec",
    "PublishSpec",
    "ServeSpec",
    "Spec",
    "SpecError",
]
