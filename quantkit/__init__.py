"""quantkit: quantize MoE targets to MXFP4 and EAGLE-3 drafts to FP8 with AMD Quark, and check them for vLLM.

The Python API is one verb per stage (`quantkit.api`), each taking its inputs, a spec (`quantkit.specs`) or keyword
overrides, and returning the typed result the command's `--json` prints:

    import quantkit
    r = quantkit.apply("draft", recipe="fp8-draft", target="target", output="out")
    c = quantkit.check("out", target="target", vllm="off")

Importing quantkit loads nothing heavy: each verb imports what its stage needs when it runs.
"""

import sys
import types
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__: str = version("quantkit")
except PackageNotFoundError:  # running from a source tree that was never pip-installed
    __version__ = "0.1.0"

_VERBS = ("acceptance", "apply", "bench", "check", "deploy", "evaluate", "gate", "inspect", "publish")
_SPECS = (
    "AcceptanceSpec",
    "ApplySpec",
    "BenchSpec",
    "CheckSpec",
    "EvalSpec",
    "InspectSpec",
    "PublishSpec",
    "ServeSpec",
    "SpecError",
)

if TYPE_CHECKING:
    from quantkit.api import acceptance, apply, bench, check, deploy, evaluate, gate, inspect, publish
    from quantkit.errors import QuantkitError
    from quantkit.specs import (
        AcceptanceSpec,
        ApplySpec,
        BenchSpec,
        CheckSpec,
        EvalSpec,
        InspectSpec,
        PublishSpec,
        ServeSpec,
        SpecError,
    )


class _Package(types.ModuleType):
    """quantkit's module type: a verb's name stays the verb when the stage package of the same name is imported
    (the import system sets `quantkit.apply = <module quantkit.apply>` on the parent; the module stays reachable as
    `sys.modules["quantkit.apply"]` and by `import quantkit.apply`)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _VERBS and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    """The verbs, specs and QuantkitError, imported on first use (so that `import quantkit` stays light)."""
    import importlib

    if name in _VERBS:
        return getattr(importlib.import_module("quantkit.api"), name)
    if name in _SPECS:
        return getattr(importlib.import_module("quantkit.specs"), name)
    if name == "QuantkitError":
        return importlib.import_module("quantkit.errors").QuantkitError
    raise AttributeError(f"module 'quantkit' has no attribute {name!r}")


__all__ = [
    "AcceptanceSpec",
    "ApplySpec",
    "BenchSpec",
    "CheckSpec",
    "EvalSpec",
    "InspectSpec",
    "PublishSpec",
    "QuantkitError",
    "ServeSpec",
    "SpecError",
    "__version__",
    "acceptance",
    "apply",
    "bench",
    "check",
    "deploy",
    "evaluate",
    "gate",
    "inspect",
    "publish",
]
