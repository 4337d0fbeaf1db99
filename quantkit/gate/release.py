"""Release checks in the style of ModelOpt's deployment checks: the output's size against its source and tokenizer
drift between them, as figures the gate judges (quantkit.gate.verdict). Pure functions over folders; nothing here runs
a model
(except `release_figures`' apply --dry-run prediction, which reads the recipe the output records)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from quantkit.errors import QuantkitError
from quantkit.gate.config import GateConfig
from quantkit.gate.verdict import first_line, infeasible, threshold
from quantkit.io.headers import safetensors_files
from quantkit.io.jsonin import JsonInputError, parse_json
from quantkit.results.gate import GateCheck, ReleaseFigures
from quantkit.vocab import EAGLE3_DRAFT

# Files that define how text becomes tokens and back; any drift between source and output changes the model.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
)
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
    return f"{path}: differs at character {i}: {_short(a[lo : i + 30])} in source, {_short(b[lo : i + 30])} in output"


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


# --- release figures ---------------------------------------------------------------------------------------------


def size_ratio_check(
    ratio: float | None, max_ratio: float, error: str | None = None, *, candidate: str = "", message: str = ""
) -> GateCheck:
    """Output / source weight bytes: below `max_ratio` (a quantized output as large as its source is not one)."""
    return threshold(candidate, "check", "size.ratio", ratio, "<", max_ratio, error=error, message=message)


def tokenizer_drift_check(drift: list[str] | None, error: str | None = None, *, candidate: str = "") -> GateCheck:
    """Number of drifted tokenizer files: must be 0 (the message names the first)."""
    return threshold(
        candidate,
        "check",
        "tokenizer.drifted_files",
        float(len(drift)) if drift is not None else None,
        "<=",
        0.0,
        error=error,
        message=drift[0] if drift else "",
    )


def predicted_size_ratio(output: str, source: str, target: str | None) -> float | None:
    """apply --dry-run's predicted output / source bytes, with the recipe the output's quantkit.json records, on
    `source` (the candidate's source as the gate knows it) and `target` (a draft's); None without a quantkit.json."""
    if not (Path(output) / "quantkit.json").is_file():
        return None
    from quantkit.apply.run import apply
    from quantkit.recipes import Recipe
    from quantkit.results import load_manifest

    manifest = load_manifest(output)
    recipe = Recipe.model_validate(manifest.recipe)
    dry = apply(
        recipe,
        source,
        output,
        target=target if manifest.model_kind == EAGLE3_DRAFT else None,
        dry_run=True,
        progress=None,
    )
    return dry.size_after_bytes / dry.size_before_bytes if dry.size_before_bytes else None


def release_figures(
    cand: str, output: str, source: str | None, target: str | None, cfg: GateConfig
) -> tuple[ReleaseFigures | None, list[GateCheck]]:
    """Size ratio (and its prediction) and tokenizer drift of `output` against `source`: the report's section and
    its figures."""
    c = cfg.check
    if source is None:
        why = "no source to compare with: set `draft` (the BF16 draft) in the gate config"
        return None, [
            size_ratio_check(None, c.max_size_ratio, error=why, candidate=cand),
            tokenizer_drift_check(None, error=why, candidate=cand),
        ]
    figures: list[GateCheck] = []
    rel = ReleaseFigures(source=source)
    try:
        rel.size_ratio = round(size_ratio(source, output), 6)
        figures.append(
            size_ratio_check(
                rel.size_ratio,
                c.max_size_ratio,
                candidate=cand,
                message="" if rel.size_ratio < c.max_size_ratio else "the output is not smaller than its source",
            )
        )
    except Exception as e:
        figures.append(size_ratio_check(None, c.max_size_ratio, error=first_line(e), candidate=cand))
    if rel.size_ratio is not None:
        try:
            predicted = predicted_size_ratio(output, source, target)
            if predicted is not None:
                rel.predicted_size_ratio = round(predicted, 6)
                err = abs(rel.size_ratio / predicted - 1)
                figures.append(
                    threshold(
                        cand,
                        "check",
                        "size.prediction_error",
                        round(err, 6),
                        "<=",
                        c.size_tolerance,
                        message=f"measured {rel.size_ratio:.4f}, apply --dry-run predicts {predicted:.4f}",
                    )
                )
        except Exception as e:
            figures.append(
                infeasible(cand, "check", "size.prediction_error", f"apply --dry-run prediction: {first_line(e)}")
            )
    try:
        rel.tokenizer_drift = tokenizer_drift(source, output)
        figures.append(tokenizer_drift_check(rel.tokenizer_drift, candidate=cand))
    except Exception as e:
        figures.append(tokenizer_drift_check(None, error=first_line(e), candidate=cand))
    return rel, figures
