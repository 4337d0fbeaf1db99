"""The gate report: a versioned JSON document that `gate` writes and `publish` reads into the model card.

Format, schema_version 1 (every section and every field may be missing; unknown keys are ignored, so a newer
writer of version 1 stays readable; a higher schema_version is refused, because its meaning may have changed):

    {
      "schema_version": 1,
      "model": "out/draft-fp8",                         # the quantized folder or repo the figures are for
      "baseline_model": "examples/tiny/eagle3-draft",   # what it was compared with
      "acceptance": {
        "backend": "vllm", "num_speculative_tokens": 3, "prompts": "built-in", "num_prompts": 42,
        "baseline":  {"mean_acceptance_length": 2.61, "per_domain": {"code": 2.9, ...},
                      "per_position": [0.71, 0.52, 0.38]},
        "candidate": {"mean_acceptance_length": 2.58, "per_domain": {"code": 2.85, ...},
                      "per_position": [0.70, 0.51, 0.37]},
        "ratio": 0.989, "ratio_ci": [0.975, 1.003]      # candidate AL / baseline AL, with its confidence interval
      },
      "eval": {
        "backend": "hf", "limit": 200, "num_fewshot": 0,
        "tasks": [{"task": "tiny_mc", "metric": "acc", "baseline": 0.81, "candidate": 0.80,
                   "baseline_stderr": 0.02, "candidate_stderr": 0.02, "delta": -0.01, "recovery": 0.988}]
      },
      "gate": {"passed": true, "checks": [{"name": "acceptance.ratio", "value": 0.989, "threshold": 0.97,
                                           "op": ">=", "passed": true}]}
    }

Mean acceptance length AL = 1 + accepted / drafts (per domain: the same over that domain's prompts);
`delta` = candidate - baseline; `recovery` = candidate / baseline.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from quantkit.errors import QuantkitError

REPORT_SCHEMA_VERSION = 1


class ReportError(QuantkitError):
    """A report file is missing, not JSON, of an unknown schema version, or has a field of the wrong type."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="ignore")


class AcceptanceRun(_Section):
    """One draft's acceptance on the prompt set: the BF16 baseline or the quantized candidate."""

    model: str | None = None
    mean_acceptance_length: float | None = None
    per_domain: dict[str, float] = {}
    per_position: list[float] | None = None


class AcceptanceSection(_Section):
    backend: str | None = None
    num_speculative_tokens: int | None = None
    prompts: str | None = None
    num_prompts: int | None = None
    baseline: AcceptanceRun | None = None
    candidate: AcceptanceRun | None = None
    ratio: float | None = None
    ratio_ci: tuple[float, float] | None = None

    def domains(self) -> list[str]:
        """Domains that either run reports, in first-seen order."""
        seen: dict[str, None] = {}
        for run in (self.baseline, self.candidate):
            if run is not None:
                seen.update(dict.fromkeys(run.per_domain))
        return list(seen)


class EvalTask(_Section):
    task: str
    metric: str
    baseline: float | None = None
    candidate: float | None = None
    baseline_stderr: float | None = None
    candidate_stderr: float | None = None
    delta: float | None = None
    recovery: float | None = None


class EvalSection(_Section):
    backend: str | None = None
    limit: int | None = None
    num_fewshot: int | None = None
    tasks: list[EvalTask] = []


class GateCheck(_Section):
    name: str
    value: float | None = None
    threshold: float | None = None
    op: str | None = None
    passed: bool | None = None


class GateSection(_Section):
    passed: bool | None = None
    checks: list[GateCheck] = []


class Report(_Section):
    """A gate report; see the module docstring for the JSON format."""

    schema_version: int = REPORT_SCHEMA_VERSION
    model: str | None = None
    baseline_model: str | None = None
    acceptance: AcceptanceSection | None = None
    eval: EvalSection | None = None
    gate: GateSection | None = None

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


def select_candidate(data: Any, model: str | Path | None, source: str = "report") -> Any:
    """From a whole-gate report (`candidates`: name -> report), the one whose `model` is `model`'s folder.

    A report of one model is returned as is; a gate report with one candidate gives that candidate.
    """
    if not isinstance(data, dict) or not isinstance(data.get("candidates"), dict):
        return data
    cands = data["candidates"]
    if model is not None:
        want = str(Path(model).resolve())
        for rep in cands.values():
            if isinstance(rep, dict) and rep.get("model") and str(Path(rep["model"]).resolve()) == want:
                return {"schema_version": data.get("schema_version", REPORT_SCHEMA_VERSION), **rep}
    if len(cands) == 1:
        rep = next(iter(cands.values()))
        return {"schema_version": data.get("schema_version", REPORT_SCHEMA_VERSION), **rep}
    names = ", ".join(cands)
    raise ReportError(f"{source}: a gate report with candidates {names} and none is {model}; pass the candidate's "
                      "report-<name>.json written beside it")


def parse_report(data: Any, source: str = "report", model: str | Path | None = None) -> Report:
    """Validate a decoded report; `source` names it in errors; `model` picks a candidate of a gate report."""
    data = select_candidate(data, model, source)
    if not isinstance(data, dict):
        raise ReportError(f"{source}: a report is a JSON object with schema_version {REPORT_SCHEMA_VERSION}")
    version = data.get("schema_version", REPORT_SCHEMA_VERSION)
    if not isinstance(version, int) or version > REPORT_SCHEMA_VERSION or version < 1:
        raise ReportError(f"{source}: schema_version {version!r} is not supported (this quantkit reads "
                          f"{REPORT_SCHEMA_VERSION}); write the report with this quantkit's `gate` or upgrade quantkit")
    try:
        return Report.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise ReportError(f"{source}: field {where}: {err['msg']}; see quantkit/report.py for the format") from None


def load_report(path: str | Path, model: str | Path | None = None) -> Report:
    """Read a gate report JSON file."""
    from quantkit.headers import load_json_file

    p = Path(path)
    data = load_json_file(p, "pass the report.json that `quantkit gate` wrote", ReportError)
    return parse_report(data, f"report {p}", model)
