"""Progress reporting, one convention for every stage: a callback that takes one line of text.

A library function takes `progress: Progress | None`; None means silent (the default for library callers). The CLI
passes `stderr_progress("apply")`, so long work is visible on stderr while stdout stays clean for --json.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TextIO

Progress = Callable[[str], None]


def _silent(message: str) -> None:
    return None


def or_silent(progress: Progress | None) -> Progress:
    """`progress`, or a callback that prints nothing."""
    return progress if progress is not None else _silent


def stderr_progress(stage: str, stream: TextIO | None = None) -> Progress:
    """A callback printing `[quantkit STAGE] message` lines on stderr (or `stream`: the terminal's stderr while
    third-party output goes to a log), credentials scrubbed (errors.scrub_secrets)."""

    from quantkit.errors import scrub_secrets

    def emit(message: str) -> None:
        print(scrub_secrets(f"[quantkit {stage}] {message}"), file=stream or sys.stderr, flush=True)

    return emit
