"""Golden acceptance references: a committed file per model with the AL it must keep per category and per draft
position, and the tolerances, as InferenceX keeps golden AL files (golden_al_distribution/*.yaml) and vllm-ascend
per-position golden rates (tolerance 0.03-0.06).

A per-position check catches what a mean hides: a regression that collapses positions 1-2 while later positions
or other prompts make up the mean. The file (YAML or JSON; unknown keys are errors):

    model: tiny-eagle3-fp8                 # free text: whose reference this is
    settings:                              # optional: the run must match these, else the golden check is infeasible
      prompts: speed-bench:qualitative
      num_speculative_tokens: 3
      temperature: 0.0
    al: {value: 2.77, tolerance: 0.05, average: macro}      # optional; average: pooled | macro
    per_category: {coding: 3.16, math: 3.12}               # macro AL per category (ModelOpt's Category_AL)
    category_tolerance: 0.05
    acceptance_rate_per_pos: [0.80, 0.60, 0.40]            # vLLM's per-position rates, k = 1..K
    position_tolerance: 0.03

Each figure is the candidate's, judged against golden - tolerance (a drop beyond the tolerance is a regression).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from quantkit.errors import QuantkitError
from quantkit.gate.verdict import infeasible, threshold
from quantkit.io.schema import validate
from quantkit.io.yamlio import load_yaml
from quantkit.results import AcceptanceResult, GateCheck


class GoldenFileError(QuantkitError):
    """A golden reference file is missing or malformed."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GoldenAl(_Strict):
    value: float = Field(ge=1)
    tolerance: float = Field(default=0.05, ge=0)
    average: Literal["pooled", "macro"] = "pooled"


class GoldenSettings(_Strict):
    prompts: str | None = None
    num_speculative_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None


class Golden(_Strict):
    model: str | None = None
    settings: GoldenSettings = GoldenSettings()
    al: GoldenAl | None = None
    per_category: dict[str, float] = {}
    category_tolerance: float = Field(default=0.05, ge=0)
    acceptance_rate_per_pos: list[float] = []
    position_tolerance: float = Field(default=0.03, ge=0)


def load_golden(path: str | Path) -> Golden:
    fix = "a mapping with al, per_category, acceptance_rate_per_pos and tolerances (see quantkit.gate.golden)"
    import yaml

    try:
        data = load_yaml(Path(path).read_text(encoding="utf-8"))
    except (yaml.YAMLError, QuantkitError) as e:
        raise GoldenFileError(f"golden file {path}: not valid YAML/JSON ({str(e).splitlines()[0]}); {fix}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise GoldenFileError(f"golden file {path}: cannot read it as UTF-8 text ({type(e).__name__})") from None
    if not isinstance(data, dict):
        raise GoldenFileError(f"golden file {path}: not a mapping; {fix}")
    return validate(Golden, data, f"golden file {path}", fix, GoldenFileError)


def golden_checks(acc: AcceptanceResult, golden: Golden, candidate: str = "") -> list[GateCheck]:
    """The candidate's figures against the golden reference: `acceptance.golden.al`, `.category.<c>`, `.pos<k>`."""
    step = "acceptance"
    c = acc.candidate
    if c is None:
        return [infeasible(candidate, step, "acceptance.golden", "no candidate acceptance figures")]
    st, want = acc.settings, golden.settings
    for key in ("prompts", "num_speculative_tokens", "temperature", "top_p", "top_k"):
        g, have = getattr(want, key), getattr(st, key)
        if g is not None and g != have:
            return [
                infeasible(
                    candidate,
                    step,
                    "acceptance.golden",
                    f"the golden reference was measured with {key} {g}, this run used {have}; run with "
                    "the reference's settings or update the golden file",
                )
            ]
    out: list[GateCheck] = []
    if golden.al is not None:
        value = c.macro_acceptance_length if golden.al.average == "macro" else c.mean_acceptance_length
        out.append(
            threshold(
                candidate,
                step,
                "acceptance.golden.al",
                value,
                ">=",
                round(golden.al.value - golden.al.tolerance, 6),
                message=f"{golden.al.average} AL against golden {golden.al.value}",
            )
        )
    for cat, g in golden.per_category.items():
        d = c.per_domain.get(cat)
        value = d.macro_acceptance_length if d is not None else None
        out.append(
            threshold(
                candidate,
                step,
                f"acceptance.golden.category.{cat}",
                value,
                ">=",
                round(g - golden.category_tolerance, 6),
                message=f"macro AL of {cat} against golden {g}",
                error=None if d is not None else f"no prompts of category {cat} in this run",
            )
        )
    rates = c.acceptance_rate_per_pos or []
    for k, g in enumerate(golden.acceptance_rate_per_pos, 1):
        value = rates[k - 1] if k <= len(rates) else None
        out.append(
            threshold(
                candidate,
                step,
                f"acceptance.golden.pos{k}",
                value,
                ">=",
                round(g - golden.position_tolerance, 6),
                message=f"acceptance rate at position {k} against golden {g}",
                error=None if k <= len(rates) else f"the run drafts {len(rates)} tokens, not {k}",
            )
        )
    return out
