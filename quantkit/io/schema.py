"""Typed reading of parsed documents: a pydantic model validates each document at the boundary, so a wrong type is an
input error by construction, and a pydantic ValidationError becomes one line naming the file, the field path, what
was found and the fix.

Used for config.json (quantkit.io.config), source quantization configs (quantkit.io.formats), prompts files
(quantkit.io.prompts), gate configs (quantkit.gate.config) and reports read back (quantkit.results). Recipes have their
own, richer wording of the same errors (quantkit.recipes).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from quantkit.errors import QuantkitError

M = TypeVar("M", bound=BaseModel)

# pydantic's type words, as the JSON / YAML a user wrote them in calls them
_PLAIN = ((r"a valid dictionary or instance of \w+|a valid dictionary", "an object"), (r"a valid list", "a list"),
          (r"a valid integer", "an integer"), (r"a valid string", "a string"), (r"a valid number", "a number"),
          (r"a valid boolean", "true or false"))

MAX_SHOWN = 60  # characters of a found value in a message: hostile values (10 MB strings) are never echoed


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


def shown(value: Any) -> str:
    """`<type> <repr>`, the repr cut to MAX_SHOWN characters."""
    kind = {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(type(value),
                                                                                                 type(value).__name__)
    try:
        text = repr(value)
    except ValueError:  # an int too long to print in decimal
        text = "<too long to print>"
    if len(text) > MAX_SHOWN:
        text = text[:MAX_SHOWN] + f"... ({len(text)} characters)"
    return f"{kind} {text}"


def describe(error: Any, prefix: str = "") -> str:
    """One pydantic error (an item of ValidationError.errors()) as `field: should be ..., got <type> <value>`."""
    path = field_path(tuple(error["loc"]), prefix)
    kind = error["type"]
    if kind == "missing":
        return f"{path}: missing"
    if kind == "extra_forbidden":
        return f"{path}: unknown key"
    message = str(error["msg"])
    if message.startswith("Input should be "):
        message = "should be " + message.removeprefix("Input should be ")
        for pydantic_words, plain in _PLAIN:
            message = re.sub(pydantic_words, plain, message)
    else:
        message = message.removeprefix("Value error, ")
        message = message[:1].lower() + message[1:]
    return f"{path}: {message}, got {shown(error.get('input'))}"


def describe_all(e: ValidationError, prefix: str = "") -> str:
    """The first error of `e`, and how many more there are."""
    errors = e.errors(include_url=False)
    line = describe(errors[0], prefix)
    if len(errors) > 1:
        line += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return line


def validate(model: type[M], data: Any, where: str, fix: str, error: type[QuantkitError], prefix: str = "") -> M:
    """`model.model_validate(data)`, or `error("<where>: <field>: <what>, got <found>; <fix>")`."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise error(f"{where}: {describe_all(e, prefix)}; {fix}") from None
