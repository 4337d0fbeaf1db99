"""Importing Quark (`import quark.torch` costs 20-30 s) with CPU-safe settings and its console output kept off stdout."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def quark_output_to_stderr() -> Iterator[None]:
    """Quark logs to stdout; keep stdout clean for --json."""
    with contextlib.redirect_stdout(sys.stderr):
        yield


def import_quark():
    """Import quark.torch (~30 s) with CPU-safe settings."""
    os.environ.setdefault("QUARK_DISABLE_COMPILE", "1")
    with quark_output_to_stderr():
        import quark.torch
    return quark.torch
