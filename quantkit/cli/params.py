"""One Click parameter type per kind of value a command takes: a size in bytes, a count, a vLLM version, a real
number. Each refuses, in one line and before any import, what its kind cannot be: a value too long to be one (a
400- or 5,000-digit number), NaN and infinities, and magnitudes outside a range that makes sense.

- `Size`: --max-memory (and QUANTKIT_MAX_MEMORY), --max-shard-size: quantkit.io.sizes, at most 1 EiB; an
  `error: --OPTION ...` line (QuantkitError).
- `Count`: an integer in a closed range [lo, hi] (both bounds required), its text at most 20 characters.
- `VllmVersion`: a PEP 440 version, at most 64 characters (packaging raises ValueError, not InvalidVersion, on a
  5,000-digit one); normalised to its base version (0.32.0+cpu -> 0.32.0); an `error: --vllm-version ...` line.
- `Real`: a finite float in [lo, hi] (Click's FloatRange lets NaN through: every comparison with NaN is false).

Count and Real fail as Click usage errors (`Error: Invalid value for '--tp' ...`), as click.IntRange did.
"""

from __future__ import annotations

import math
from typing import Any

import click

MAX_NUMBER_TEXT = 40  # characters: no count or float a command takes needs more


def shown(value: Any, limit: int = 40) -> str:
    """`value` as a message echoes it: repr, cut at `limit` characters, with its length when cut."""
    text = str(value)
    return repr(text[:limit]) + (f" ({len(text)} characters)" if len(text) > limit else "")


class Size(click.ParamType):
    """A size in bytes (8GiB, 500MB, 2GiB, or bytes); `shard=True` reads it as transformers reads max_shard_size."""

    name = "SIZE"

    def __init__(self, shard: bool = False) -> None:
        self.shard = shard

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        from quantkit.io.sizes import parse_shard_size, parse_size

        option = _option(param, ctx)
        return parse_shard_size(str(value), option) if self.shard else parse_size(str(value), option)


class Count(click.IntRange):
    """An integer in [lo, hi]; both bounds are required (an unbounded count is how 10^10 prompt rows get built)."""

    def __init__(self, lo: int, hi: int) -> None:
        super().__init__(lo, hi)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and len(value.strip()) > MAX_NUMBER_TEXT:
            self.fail(f"{shown(value)} is not an integer in the range {self.min} to {self.max}", param, ctx)
        return super().convert(value, param, ctx)


class Real(click.FloatRange):
    """A finite float in [lo, hi] (bounds closed unless `lo_open` / `hi_open`): NaN, inf and too-long text fail."""

    def __init__(self, lo: float, hi: float, lo_open: bool = False, hi_open: bool = False) -> None:
        super().__init__(lo, hi, min_open=lo_open, max_open=hi_open)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and len(value.strip()) > MAX_NUMBER_TEXT:
            self.fail(f"{shown(value)} is not a number in the range {self.min} to {self.max}", param, ctx)
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(
                f"{shown(value)} is not a finite number; give one in the range {self.min} to {self.max}", param, ctx
            )
        return super().convert(number, param, ctx)


class VllmVersion(click.ParamType):
    """A vLLM version (PEP 440), normalised to its base version; quantkit.rules.vllm_versions.parse_version."""

    name = "X.Y.Z"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from quantkit.rules.vllm_versions import resolve_vllm_version

        return resolve_vllm_version(str(value))


def _option(param: click.Parameter | None, ctx: click.Context | None = None) -> str:
    """How a message names where the value came from: the option, or its environment variable when it came from
    there (QUANTKIT_MAX_MEMORY)."""
    if param is None:
        return "value"
    if (
        ctx is not None
        and param.name
        and isinstance(param, click.Option)
        and param.envvar
        and ctx.get_parameter_source(param.name) == click.core.ParameterSource.ENVIRONMENT
    ):
        envvar = param.envvar if isinstance(param.envvar, str) else param.envvar[0]
        return f"{envvar} (--{param.name.replace('_', '-')})"
    opts = getattr(param, "opts", None) or [param.name or "value"]
    return max(opts, key=len)
