"""Reading result files: the schema-version check, validation with one-line errors, and the report and manifest
readers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from quantkit.results.apply import ApplyResult
from quantkit.results.base import SCHEMA_VERSION, Result, ResultFileError
from quantkit.results.gate import CandidateReport, GateReport


def _check_version(data: dict[str, Any], source: str) -> None:
    version = data.get("schema_version", data.get("quantkit_manifest_version", SCHEMA_VERSION))
    if isinstance(version, bool) or not isinstance(version, int) or version > SCHEMA_VERSION or version < 1:
        raise ResultFileError(
            f"{source}: schema_version {version!r} is not supported (this quantkit reads "
            f"{SCHEMA_VERSION}); write it with this quantkit or upgrade quantkit"
        )


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
        raise ResultFileError(
            f"{source}: field {where}: {err['msg']}{found}; write it with quantkit again (the "
            "format is quantkit/results/)"
        ) from None


def _resolved(path: str) -> str | None:
    try:
        return str(Path(path).resolve())
    except (OSError, ValueError):  # a NUL byte or a name too long: it names no folder
        return None


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
    raise ResultFileError(
        f"{source}: a gate report with candidates {names} and none is {model}; pass the "
        "candidate's report-<name>.json written beside it"
    )


def parse_report(data: Any, source: str = "report", model: str | Path | None = None) -> CandidateReport:
    """A candidate's report from decoded JSON; `model` picks the candidate of a whole-gate report."""
    return _validate(CandidateReport, select_candidate(data, model, source), source)


def load_report(path: str | Path, model: str | Path | None = None) -> CandidateReport:
    """Read report.json (picking `model`'s candidate) or a report-<candidate>.json."""
    from quantkit.io.headers import load_json_file

    p = Path(path)
    data = load_json_file(p, "pass the report.json that `quantkit gate` wrote", ResultFileError)
    return parse_report(data, f"report {p}", model)


def load_gate_report(path: str | Path) -> GateReport:
    """report.json as `quantkit gate` wrote it: the gate's verdict and every candidate's report, typed."""
    from quantkit.io.headers import load_json_file

    p = Path(path)
    data = load_json_file(p, "pass the report.json that `quantkit gate` wrote", ResultFileError)
    return _validate(GateReport, data, f"report {p}")


def load_manifest(folder: str | Path) -> ApplyResult:
    """The quantkit.json of an apply output folder."""
    from quantkit.io.headers import load_json_file

    p = Path(folder) / "quantkit.json"
    data = load_json_file(p, "re-run `quantkit apply` to rewrite the folder", ResultFileError)
    return _validate(ApplyResult, data, str(p))


def load_tune_option(folder: str | Path) -> Any:
    """The option `quantkit tune --apply` wrote into a draft folder (its tune.json, a TuneOption), or None when the
    folder has none; ResultFileError for one that does not read as a TuneOption. deploy takes its K, the card its
    AL ratio and estimated saving."""
    from quantkit.results.tune import TuneOption

    path = Path(folder) / "tune.json"
    if not path.is_file():
        return None
    try:
        return TuneOption.model_validate_json(path.read_text(encoding="utf-8"))
    except (ValidationError, UnicodeDecodeError, OSError) as e:
        raise ResultFileError(
            f"{path}: not the tune.json quantkit tune --apply writes ({type(e).__name__}); re-run "
            "quantkit tune --apply, or remove it"
        ) from None


__all__ = ["load_gate_report", "load_manifest", "load_report", "load_tune_option", "parse_report", "select_candidate"]
