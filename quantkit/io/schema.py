"""Typed reading of parsed documents: a pydantic model validates each document at the boundary, so a wrong type is an
input error by construction, and a pydantic ValidationError becomes one line naming the file, the field path, what
was found and the fix.

The one home of that wording, used for config.json (quantkit.io.config), source quantization configs
(quantkit.io.formats), prompts files (quantkit.io.prompts), gate configs (quantkit.gate.config), recipes
(quantkit.recipes) and reports read back (quantkit.results). Gate configs and recipes keep the words their users
already read (a `Wording` each: GATE_WORDING, and the recipe's own, which explains against the recipe model).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, get_args

from pydantic import BaseModel, ValidationError

from quantkit.errors import QuantkitError

M = TypeVar("M", bound=BaseModel)

# pydantic's type words, as the JSON / YAML a user wrote them in calls them
_PLAIN = (
    (r"a valid dictionary or instance of \w+|a valid dictionary", "an object"),
    (r"a valid list", "a list"),
    (r"a valid integer", "an integer"),
    (r"a valid string", "a string"),
    (r"a valid number", "a number"),
    (r"a valid boolean", "true or false"),
)

MAX_SHOWN = 60  # characters of a found value in a message: hostile values (10 MB strings) are never echoed


@dataclass(frozen=True)
class Wording:
    """How `describe` words an error for one kind of document. The defaults (PLAIN_WORDING: config.json, source
    quantization configs, prompts files, reports): `a.b[0]` paths, "should be an integer", found values as `shown`
    writes them, "missing"."""

    paths: Literal["brackets", "dots"] = "brackets"  # `a.b[0]`, or pydantic's loc joined by dots: `a.b.0`
    # "plain": "should be an integer"; "short": "should be a valid integer"; "pydantic": "input should be a valid
    # integer" (each lower-cased, a validator's "Value error, " prefix dropped)
    messages: Literal["plain", "short", "pydantic"] = "plain"
    values: Literal["shown", "python"] = "shown"  # found values as `shown` words them, or `str 'x'` (Python's names)
    missing: str | None = "missing"  # what a missing field says; None: pydantic's message ("field required")
    # The document's model: with it, an unknown key lists the allowed ones, a wrong literal the allowed values, a
    # value that should be a mapping the mapping's keys, and an empty value says so.
    model: type[BaseModel] | None = None
    fixes: Mapping[str, str] = field(default_factory=dict)  # field name -> the fix for it missing or empty


PLAIN_WORDING = Wording()
GATE_WORDING = Wording(paths="dots", messages="pydantic", missing=None)  # as gate configs have always said


def field_path(loc: Sequence[int | str], prefix: str = "") -> str:
    """`a.b[0].c` from pydantic's loc ("a", "b", 0, "c"), under `prefix` (itself a field path); a deeply nested
    location keeps its first and last three parts."""
    path = prefix
    skipped = len(loc) - 6 if len(loc) > 8 else 0
    for i, part in enumerate(loc):
        if skipped and 3 <= i < 3 + skipped:
            if i == 3:
                path += f".<{skipped} levels>"
            continue
        path += f"[{part}]" if isinstance(part, int) else f".{part}" if path else str(part)
    return path or "(top level)"


def _dotted_path(loc: Sequence[int | str]) -> str:
    return ".".join(str(x) for x in loc) or "(top level)"


def shown(value: Any, python_types: bool = False) -> str:
    """`<type> <repr>`, the repr cut to MAX_SHOWN characters; the type as JSON / YAML names it ("string"), or with
    `python_types` as Python does ("str")."""
    kind = (
        type(value).__name__
        if python_types
        else {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(
            type(value), type(value).__name__
        )
    )
    try:
        text = repr(value)
    except ValueError:  # an int too long to print in decimal
        text = "<too long to print>"
    if len(text) > MAX_SHOWN:
        text = text[:MAX_SHOWN] + f"... ({len(text)} characters)"
    return f"{kind} {text}"


def _message(error: Any, wording: Wording) -> str:
    message = str(error["msg"])
    if message.startswith("Input should be ") and wording.messages != "pydantic":
        message = "should be " + message.removeprefix("Input should be ")
        if wording.messages == "plain":
            for pydantic_words, plain in _PLAIN:
                message = re.sub(pydantic_words, plain, message)
        return message
    message = message.removeprefix("Value error, ")
    return message[:1].lower() + message[1:]


def _model_at(model: type[BaseModel] | None, loc: Sequence[int | str]) -> type[BaseModel] | None:
    """The model class that validates the mapping at `loc` under `model` (list indices are skipped), if any."""
    for part in loc:
        if isinstance(part, int):
            continue
        if model is None or part not in model.model_fields:
            return None
        model = _inner_model(model.model_fields[part].annotation)
    return model


def _inner_model(annotation: Any) -> type[BaseModel] | None:
    # Unwraps list[X], X | None and the like down to the model class X, if there is one.
    pending = [annotation]
    while pending:
        current = pending.pop()
        if isinstance(current, type) and issubclass(current, BaseModel):
            return current
        pending.extend(get_args(current))
    return None


def describe(error: Any, prefix: str = "", wording: Wording = PLAIN_WORDING) -> str:
    """One pydantic error (an item of ValidationError.errors()) as `field: should be ..., got <type> <value>`, in
    `wording`. A validator's own error (a PydanticCustomError whose type starts with "quantkit_") is its message,
    under the key its context names."""
    loc: tuple[int | str, ...] = tuple(error["loc"])
    path = _dotted_path(loc) if wording.paths == "dots" else field_path(loc, prefix)
    kind: str = error["type"]
    value = error.get("input")
    if kind.startswith("quantkit_"):
        return f"{(error.get('ctx') or {}).get('key') or path}: {error['msg']}"
    if kind == "extra_forbidden":
        if wording.model is None:
            return f"{path}: unknown key"
        model = _model_at(wording.model, loc[:-1])
        return f"{path}: unknown key {loc[-1]!r}" + (f" (allowed: {', '.join(model.model_fields)})" if model else "")
    fix = wording.fixes.get(str(loc[-1])) if loc else None
    if kind == "missing":
        said = wording.missing if wording.missing is not None else _message(error, wording)
        return f"{path}: {said}" + (f"; {fix}" if fix else "")
    if wording.model is not None:
        if value is None:  # `key:` with nothing after it in YAML
            return f"{path}: is empty" + (f"; {fix}" if fix else "; give a value")
        if kind == "literal_error":
            expected = (error.get("ctx") or {}).get("expected", "")
            return f"{path}: unknown value {value!r} (allowed: {expected}); use one of them"
        if kind in ("model_type", "dict_type"):
            model = _model_at(wording.model, loc)
            keys = f" with keys {', '.join(model.model_fields)}" if model else ""
            return f"{path}: expected a mapping{keys}, got {shown(value, python_types=True)}"
    return f"{path}: {_message(error, wording)}, got {shown(value, python_types=wording.values == 'python')}"


def describe_all(e: ValidationError, prefix: str = "", wording: Wording = PLAIN_WORDING) -> str:
    """The first error of `e` in `wording`, and how many more there are."""
    errors = e.errors(include_url=False)
    line = describe(errors[0], prefix, wording)
    if len(errors) > 1:
        line += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return line


def validate(model: type[M], data: Any, where: str, fix: str, error: type[QuantkitError], prefix: str = "") -> M:
    """`model.model_validate(data)`, or `error("<where>: <field>: <what>, got <found>; <fix>")`."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise error(f"{where}: {describe_all(e, prefix)}; {fix}") from None
