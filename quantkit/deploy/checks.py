"""Release checks in the style of ModelOpt's deployment checks: the output's size against its source, tokenizer
drift between them, and one verdict over every check of a release. Pure functions over simple inputs (folders,
numbers); nothing here runs a model.

Verdict rules (`judge`, `verdict`), over `ReleaseCheck`s:

- infeasible: a required check could not run (its `error` is set, or it has no `value`). A check with
  `required=False` that could not run is left out.
- regression: a check that ran misses its threshold: not `value op threshold` (`op` ">=" when higher is better,
  "<=" when lower is better); with `use_ci_bound`, the pessimistic end of `ci` is compared instead of `value`
  (the CI's lower end for ">=", its upper end for "<=").
- anomalous: a check that ran is better than its baseline beyond its confidence interval, i.e. the whole `ci` lies
  on the better side of `parity` (the value at which candidate and baseline are equal: 1.0 for ratios, 0.0 for
  deltas). A quantized model does not beat its source with confidence; when it seems to, the measurement is
  suspect (wrong baseline, swapped paths, leaked test data). Also anomalous: the same figure measured two ways
  disagrees (served AL against in-process AL). With a prompt-by-prompt comparison (`agreement_p`, the p-value of
  quantkit.acceptance.agreement's paired randomization test, and its `agreement_level`), that is p <= 1 - level:
  the difference is more than the prompts that came out differently explain (near-tied logits flip tokens under
  another batch composition or CPU kernel, in either direction); `tolerance`, if set, is then a floor under which a
  difference is never anomalous. Without per-prompt figures, |value - reference| > tolerance.
- pass: none of the above.

When several apply, the verdict is the first of regression, infeasible, anomalous: a figure that misses its
threshold is a definite failure and is not hidden behind a step that could not run; a release that could not be
measured fully is not called merely anomalous. `judge` returns every reason, so nothing is lost by the ordering.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from quantkit.errors import QuantkitError
from quantkit.io.headers import safetensors_files
from quantkit.io.jsonin import JsonInputError, parse_json

Verdict = Literal["pass", "regression", "anomalous", "infeasible"]

# Files that define how text becomes tokens and back; any drift between source and output changes the model.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json", "vocab.json", "vocab.txt", "merges.txt",
                   "tokenizer.model", "spiece.model")
_SHOW = 60  # characters of a differing value shown in a message


class ReleaseCheckError(QuantkitError):
    """A release check was given a folder it cannot read."""


# --- size --------------------------------------------------------------------------------------------------------


def safetensors_bytes(folder: str | Path) -> int:
    """Bytes of a checkpoint's weight shards (those its index names, else every *.safetensors)."""
    folder = Path(folder)
    return sum((folder / f).stat().st_size for f in safetensors_files(folder) if (folder / f).is_file())


def size_ratio(source: str | Path, output: str | Path) -> float:
    """Output weight bytes / source weight bytes (an FP8 draft with BF16 fc + lm_head: ~0.7; MXFP4 MoE: ~0.3)."""
    src = safetensors_bytes(source)
    if src == 0:
        raise ReleaseCheckError(f"{source}: its safetensors files are empty; pass the source checkpoint folder")
    return safetensors_bytes(output) / src


# --- tokenizer drift ---------------------------------------------------------------------------------------------


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else repr(value)
    return text if len(text) <= _SHOW else text[: _SHOW - 3] + "..."


def _key(path: str, key: str) -> str:
    plain = key.isidentifier()
    return f"{path}.{key}" if plain and path else key if plain else f"{path}[{json.dumps(key, ensure_ascii=False)}]"


def _is_vocab(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """token -> id maps (tokenizer.json model.vocab, vocab.json, added_tokens.json): compared by id."""
    return bool(a) and bool(b) and all(type(v) is int for d in (a, b) for v in d.values())


def _string_diff(path: str, a: str, b: str) -> str:
    i = next((n for n, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    lo = max(0, i - 20)
    return (f"{path}: differs at character {i}: {_short(a[lo:i + 30])} in source, {_short(b[lo:i + 30])} in "
            "output")


def first_json_difference(a: Any, b: Any, path: str = "") -> str | None:
    """Where two parsed JSON values first differ, in words; None when equal. Vocabularies are compared by id, so
    one changed token reads `model.vocab: id 17 is 'hello' in source, 'hellp' in output`."""
    where = path or "(top level)"
    if type(a) is not type(b):
        return f"{where}: {_short(a)} in source, {_short(b)} in output"
    if isinstance(a, dict):
        if _is_vocab(a, b):
            by_id_a = {v: k for k, v in a.items()}
            by_id_b = {v: k for k, v in b.items()}
            for i in sorted(set(by_id_a) | set(by_id_b)):
                ta, tb = by_id_a.get(i), by_id_b.get(i)
                if ta != tb:
                    sa, sb = ("absent" if t is None else _short(t) for t in (ta, tb))
                    return f"{where}: id {i} is {sa} in source, {sb} in output"
            if a != b:  # two tokens share an id on one side
                moved = sorted(set(a.items()) ^ set(b.items()))
                return f"{where}: token {_short(moved[0][0])} maps to different ids"
            return None
        for k in a:
            if k not in b:
                return f"{_key(path, k)}: in source, missing in output"
            d = first_json_difference(a[k], b[k], _key(path, k))
            if d is not None:
                return d
        extra = [k for k in b if k not in a]
        return f"{_key(path, extra[0])}: only in output" if extra else None
    if isinstance(a, list):
        for n, (x, y) in enumerate(zip(a, b)):
            d = first_json_difference(x, y, f"{path}[{n}]")
            if d is not None:
                return d
        if len(a) != len(b):
            return f"{where}: {len(a)} entries in source, {len(b)} in output"
        return None
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return None
    if a != b:
        if isinstance(a, str) and isinstance(b, str) and max(len(a), len(b)) > _SHOW:
            return _string_diff(where, a, b)
        return f"{where}: {_short(a)} in source, {_short(b)} in output"
    return None


def _text_difference(a: bytes, b: bytes) -> str:
    try:
        la, lb = a.decode("utf-8").splitlines(), b.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        i = next((n for n, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        return f"first differing byte at offset {i} ({len(a)} bytes in source, {len(b)} in output)"
    for n, (x, y) in enumerate(zip(la, lb), 1):
        if x != y:
            return f"line {n}: {_short(x)} in source, {_short(y)} in output"
    if len(la) != len(lb):
        return f"{len(la)} lines in source, {len(lb)} in output"
    return "same lines, different bytes (line endings or a trailing newline)"


def tokenizer_files(folder: str | Path) -> list[str]:
    """The tokenizer-defining files present in a folder (fixed names plus *.tiktoken)."""
    folder = Path(folder)
    names = [n for n in TOKENIZER_FILES if (folder / n).is_file()]
    return names + sorted(p.name for p in folder.glob("*.tiktoken") if p.is_file())


def tokenizer_drift(source: str | Path, output: str | Path) -> list[str]:
    """Every tokenizer file that is not byte-identical between source and output, one line each, naming the first
    differing key, token or line (`tokenizer.json: model.vocab: id 17 is 'hello' in source, 'hellp' in output`).
    Empty when the tokenizer files are byte-identical. The chat template inside tokenizer_config.json is compared
    as its `chat_template` key."""
    source, output = Path(source), Path(output)
    for folder in (source, output):
        if not folder.is_dir():
            raise ReleaseCheckError(f"{folder}: not a folder; pass the source and output checkpoint folders")
    drift: list[str] = []
    src_files, out_files = tokenizer_files(source), tokenizer_files(output)
    for name in src_files + [n for n in out_files if n not in src_files]:
        if name not in out_files:
            drift.append(f"{name}: in source, missing in output")
            continue
        if name not in src_files:
            drift.append(f"{name}: only in output")
            continue
        a, b = (source / name).read_bytes(), (output / name).read_bytes()
        if a == b:
            continue
        if name.endswith(".json"):
            try:
                diff = first_json_difference(parse_json(a), parse_json(b))
            except JsonInputError:
                diff = _text_difference(a, b)
            drift.append(f"{name}: {diff or 'same JSON content, different bytes (formatting or key order)'}")
        else:
            drift.append(f"{name}: {_text_difference(a, b)}")
    return drift


# --- verdict -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReleaseCheck:
    """One figure of a release and how to judge it (see the module docstring for the rules)."""

    name: str
    value: float | None = None
    threshold: float | None = None
    op: Literal[">=", "<="] = ">="
    ci: tuple[float, float] | None = None
    parity: float | None = None
    use_ci_bound: bool = False
    reference: float | None = None
    tolerance: float | None = None
    agreement_p: float | None = None
    agreement_level: float | None = None
    required: bool = True
    error: str | None = None

    @property
    def ran(self) -> bool:
        return self.error is None and self.value is not None


@dataclass
class Judgement:
    verdict: Verdict
    reasons: list[str] = field(default_factory=list)  # "<verdict>: <check>: why", every one that applies


def _judged(c: ReleaseCheck) -> float:
    assert c.value is not None
    if c.use_ci_bound and c.ci is not None:
        return c.ci[0] if c.op == ">=" else c.ci[1]
    return c.value


def judge(checks: list[ReleaseCheck]) -> Judgement:
    """The release verdict and every reason for it."""
    reasons: dict[Verdict, list[str]] = {"regression": [], "infeasible": [], "anomalous": []}
    for c in checks:
        if not c.ran:
            if c.required:
                reasons["infeasible"].append(f"{c.name}: could not run ({c.error or 'no value'})")
            continue
        assert c.value is not None
        if c.threshold is not None:
            judged = _judged(c)
            ok = judged >= c.threshold if c.op == ">=" else judged <= c.threshold
            if not ok:
                what = "CI bound" if c.use_ci_bound and c.ci is not None else "value"
                reasons["regression"].append(f"{c.name}: {what} {judged:.4g} misses {c.op} {c.threshold:.4g}")
        if c.ci is not None and c.parity is not None:
            lo, hi = c.ci
            if (c.op == ">=" and lo > c.parity) or (c.op == "<=" and hi < c.parity):
                reasons["anomalous"].append(f"{c.name}: better than its baseline beyond its CI ({lo:.4g}-{hi:.4g} "
                                            f"entirely {'above' if c.op == '>=' else 'below'} {c.parity:.4g})")
        if c.reference is not None and c.agreement_p is not None and c.agreement_level is not None:
            beyond_floor = c.tolerance is None or abs(c.value - c.reference) > c.tolerance
            if c.agreement_p <= 1 - c.agreement_level and beyond_floor:
                reasons["anomalous"].append(
                    f"{c.name}: {c.value:.4g} disagrees with {c.reference:.4g} measured the other way beyond what the "
                    f"prompts that came out differently explain (p {c.agreement_p:.3g} <= {1 - c.agreement_level:.3g})")
        elif c.reference is not None and c.tolerance is not None and abs(c.value - c.reference) > c.tolerance:
            reasons["anomalous"].append(f"{c.name}: {c.value:.4g} disagrees with {c.reference:.4g} measured the other "
                                        f"way (tolerance {c.tolerance:.4g})")
    order: tuple[Verdict, ...] = ("regression", "infeasible", "anomalous")
    for v in order:
        if reasons[v]:
            return Judgement(v, [f"{k}: {r}" for k in order for r in reasons[k]])
    return Judgement("pass", [])


def verdict(checks: list[ReleaseCheck]) -> Verdict:
    """pass | regression | anomalous | infeasible (module docstring)."""
    return judge(checks).verdict


# --- common checks -----------------------------------------------------------------------------------------------


def acceptance_ratio_check(ratio: float | None, ratio_ci: tuple[float, float] | None, min_ratio: float = 0.98,
                           use_ci_bound: bool = False, error: str | None = None) -> ReleaseCheck:
    """Candidate / BF16-draft AL: at least `min_ratio`; anomalous when its CI lies wholly above 1."""
    return ReleaseCheck("acceptance.ratio", ratio, min_ratio, ">=", ratio_ci, 1.0, use_ci_bound, error=error)


def eval_delta_check(task: str, delta: float | None, delta_ci: tuple[float, float] | None, max_drop: float,
                     use_ci_bound: bool = False, error: str | None = None) -> ReleaseCheck:
    """Quantized minus baseline score: no lower than -max_drop; anomalous when its CI lies wholly above 0."""
    return ReleaseCheck(f"eval.{task}.delta", delta, -max_drop, ">=", delta_ci, 0.0, use_ci_bound, error=error)


def served_al_check(served_al: float | None, in_process_al: float | None, tolerance: float | None,
                    min_al: float | None = None, error: str | None = None, *,
                    agreement_p: float | None = None, agreement_level: float | None = None) -> ReleaseCheck:
    """AL through `vllm serve` against the in-process AL on the same prompts: anomalous when the prompt-by-prompt
    comparison (`agreement_p` at `agreement_level`, quantkit.acceptance.agreement) says they disagree and the
    difference exceeds the optional floor `tolerance`; without it, anomalous beyond `tolerance`."""
    missing = error or (None if in_process_al is not None else "no in-process AL to compare with")
    return ReleaseCheck("serve.acceptance_length", served_al, min_al, ">=", reference=in_process_al,
                        tolerance=tolerance, agreement_p=agreement_p, agreement_level=agreement_level, error=missing)


def size_ratio_check(ratio: float | None, max_ratio: float, error: str | None = None) -> ReleaseCheck:
    """Output / source weight bytes: at most `max_ratio` (a quantized output as large as its source is not one)."""
    return ReleaseCheck("size.ratio", ratio, max_ratio, "<=", error=error)


def tokenizer_drift_check(drift: list[str] | None, error: str | None = None) -> ReleaseCheck:
    """Number of drifted tokenizer files: must be 0."""
    return ReleaseCheck("tokenizer.drifted_files", float(len(drift)) if drift is not None else None, 0.0, "<=",
                        error=error)
