"""The unit tier's own guard: a test here that imports Quark or vLLM, or starts a process, fails and says where it
belongs. A folder is a tier only if nothing heavy can creep into it unnoticed (docs/testing.md)."""

from __future__ import annotations

import _posixsubprocess
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

HEAVY = ("quark", "vllm")


class TierViolation(RuntimeError):
    """Not an ImportError on purpose: code that catches ImportError to skip must not hide the violation."""


class _Refused:
    """The loader of a heavy module's spec: finding it is allowed (a test may read Quark's source text through
    importlib.util.find_spec), executing it is not."""

    def __init__(self, message: str) -> None:
        self.message = message

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        raise TierViolation(self.message)


class _HeavyImportGuard:
    """A meta-path finder that lets Quark and vLLM be found but not imported while a unit test runs."""

    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] not in HEAVY:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                spec.loader = _Refused(
                    f"{self.nodeid} imports {name}: a unit test imports neither Quark nor vLLM; "
                    f"move it to tests/integration/ (tests/e2e/ if it starts a process or a server)"
                )
                return spec
        return None


@pytest.fixture(autouse=True)
def unit_tier_guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    nodeid = request.node.nodeid

    def refuse(*_args, **_kwargs):
        raise TierViolation(f"{nodeid} starts a process: a unit test starts none; move it to tests/e2e/")

    # subprocess.Popen starts every child in _execute_child (fork_exec or posix_spawn, bound at its import);
    # multiprocessing's spawn calls _posixsubprocess.fork_exec, its fork start os.fork.
    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse)
    monkeypatch.setattr(_posixsubprocess, "fork_exec", refuse)
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, refuse)
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
