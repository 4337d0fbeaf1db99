"""Parsing JSON that quantkit did not write (config.json, safetensors headers, indexes, prompts, reports): every way a
document can be unreadable is one JsonInputError with a short reason, never a bare exception from inside `json`.

Besides JSONDecodeError, Python's json module fails on hostile input in two ways that are not JSONDecodeError:
RecursionError for deep nesting, and ValueError "Exceeds the limit (4300 digits) for integer string conversion"
(sys.get_int_max_str_digits) for a long integer literal. The literal is refused here before `int()` sees it, with a
message that says what was found. NaN and Infinity are not JSON (RFC 8259) but Python reads and transformers writes
them; `allow_nan=False` refuses them where the format forbids them (safetensors headers: the safetensors crate parses
with serde_json, which rejects them).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

# Python's default int_max_str_digits: longer integer literals are refused here (no real document holds one).
MAX_INT_DIGITS = 4300


class JsonInputError(ValueError):
    """A JSON document cannot be read; the message is a short reason without the file name (callers add it)."""


def _parse_int(literal: str) -> int:
    digits = len(literal) - literal.startswith("-")
    if digits > MAX_INT_DIGITS:
        raise JsonInputError(
            f"holds an integer of {digits} digits (at most {MAX_INT_DIGITS}); a corrupt or hostile file"
        )
    return int(literal)


def _refuse_constant(name: str) -> Any:
    raise JsonInputError(f"holds {name}, which is not JSON (RFC 8259)")


def parse_json(
    text: str | bytes,
    *,
    allow_nan: bool = True,
    object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None,
) -> Any:
    """The decoded document; raises JsonInputError naming what is wrong (not the file: the caller knows it)."""
    try:
        return json.loads(
            text,
            parse_int=_parse_int,
            parse_constant=None if allow_nan else _refuse_constant,
            object_pairs_hook=object_pairs_hook,
        )
    except JsonInputError:
        raise
    except json.JSONDecodeError as e:
        raise JsonInputError(f"not valid JSON (line {e.lineno}: {e.msg})") from None
    except RecursionError:
        raise JsonInputError("JSON nested too deeply to read") from None
    except UnicodeDecodeError:
        raise JsonInputError("not UTF-8 text") from None
    except ValueError as e:  # anything else json raises on a document it cannot represent
        raise JsonInputError(f"not readable JSON ({' '.join(str(e).split())[:120]})") from None
