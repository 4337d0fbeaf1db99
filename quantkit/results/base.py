"""The base of the result model: `Result`, `CommandResult` (what a command's `--json` prints), the schema version
and the result-file error."""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict

from quantkit.errors import QuantkitError

SCHEMA_VERSION = 1


class ResultFileError(QuantkitError):
    """A result file (report, manifest) is missing, not JSON, of an unknown schema version, or has a wrong field."""


class Result(BaseModel):
    """Base of every result: tolerant reading (unknown keys ignored), strict JSON writing (NaN -> null)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    def to_dict(self) -> dict[str, Any]:
        from quantkit.io.jsonout import finite

        return finite(self.model_dump(mode="json"))


def _nan_to_none(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v


class CommandResult(Result):
    """Base of every top-level command result: the document a command's `--json` prints or writes, versioned."""

    schema_version: int = SCHEMA_VERSION


__all__ = ["SCHEMA_VERSION", "CommandResult", "Result", "ResultFileError"]
