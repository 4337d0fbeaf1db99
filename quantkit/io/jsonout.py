"""JSON for machines: strict JSON (no NaN or Infinity, which JSON has no words for) everywhere quantkit writes it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

_LEAVES = {str, int, bool, type(None)}  # JSON values finite() leaves as they are


def finite(obj: Any) -> Any:
    """`obj` with every NaN or infinite float replaced by None (null), recursively through dicts, lists, tuples."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        if not set(map(type, obj)) - _LEAVES:  # a list of names or numbers (apply's module lists): one C-level pass
            return list(obj)
        return [finite(v) for v in obj]
    return obj


def dumps(obj: Any, indent: int | None = 2) -> str:
    """Strict JSON text: a figure that could not be computed is null, never NaN."""
    return json.dumps(finite(obj), indent=indent, allow_nan=False)


def write(path: str | Path, obj: Any) -> None:
    """Strict JSON into `path`, atomically and never through a link (quantkit.io.files.write_file_atomic)."""
    from quantkit.io.files import write_file_atomic

    write_file_atomic(path, dumps(obj) + "\n")
