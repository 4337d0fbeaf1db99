"""The unit tier's own guard: a test here that imports Quark or vLLM, or starts a process, fails and says where it
belongs. A folder is a tier only if nothing heavy can creep into it unnoticed (docs/testing.md)."""

from __future__ import annotations

import _posixsubprocess
import os
import sys
from collections.abc import Iterator

import pytest

HEAVY = ("quark", "vllm")


class TierViolation(RuntimeError):
    """Not an ImportError on purpose: code that catches ImportError to skip must not hide the violation."""


class _HeavyImportGuard:
    """A meta-path finder that refuses Quark and vLLM while a unit test runs."""

    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HEAVY:
            raise TierViolation(f"{self.nodeid} imports {name}: a unit test imports neither Quark nor vLLM; "
                                f"move it to tests/integration/ (tests/e2e/ if it starts a process or a server)")
        return None


@pytest.fixture(autouse=True)
def unit_tier_guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    nodeid = request.node.nodeid

    def refuse(*_args, **_kwargs):
        raise TierViolation(f"{nodeid} starts a process: a unit test starts none; move it to tests/e2e/")

    # subprocess.Popen and multiprocessing's spawn both go through _posixsubprocess.fork_exec; fork starts go
    # through os.fork.
    monkeypatch.setattr(_posixsubprocess, "fork_exec", refuse)
    monkeypatch.setattr(os, "fork", refuse)
    # A heavy module imported earlier in the same session (integration tests ran first) cannot be caught here;
    # `pytest tests/unit`, as CI's unit stage and the inner loop run it, always starts clean.
    guard = None
    if not any(m in sys.modules for m in HEAVY):
        guard = _HeavyImportGuard(nodeid)
        sys.meta_path.insert(0, guard)
    try:
        yield
    finally:
        if guard is not None:
            sys.meta_path.remove(guard)
