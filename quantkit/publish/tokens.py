"""No Hub token leaves through an upload: every file `publish` would send is searched, before anything is sent, for
the user's own tokens (found the way huggingface_hub finds them) and for anything shaped like a Hub token.

- The user's tokens: the `token` argument, HF_TOKEN (and the older HUGGING_FACE_HUB_TOKEN), the token file
  (`hf auth login`, huggingface_hub.constants.HF_TOKEN_PATH) and every token stored by name (HF_STORED_TOKENS_PATH).
  Searched in every byte of every file, weights included: an exact string of 30+ characters does not occur in
  weights by chance.
- The pattern `hf_` / `api_org_` followed by 30+ letters or digits (errors.HUB_TOKEN): searched in every file but
  the tensor bytes of a .safetensors file (its JSON header is searched), where arbitrary bytes could match.

Nothing here reads the network: an OAuth or OIDC token that huggingface_hub would fetch or refresh is not on disk,
so it cannot be in the folder either.
"""

from __future__ import annotations

import configparser
import hashlib
import os
import re
from pathlib import Path

from quantkit.errors import HUB_TOKEN, register_secret
from quantkit.io.files import require_regular_file

_CHUNK = 1 << 20
_PATTERN = re.compile(HUB_TOKEN.pattern.encode())
_MIN_OWN = 16  # a shorter "token" is no Hub token; searching weights for it would find it by chance


def _read_small(path: str | None) -> str | None:
    if not path:
        return None
    p = Path(path)
    try:
        require_regular_file(p)
        if not p.is_file() or p.stat().st_size > 1 << 20:
            return None
        return p.read_text(encoding="utf-8", errors="replace")
    except Exception:  # noqa: BLE001 - an unreadable token file holds no token quantkit could look for
        return None


def user_tokens(explicit: str | None = None) -> list[str]:
    """The Hub tokens of this user on this machine (see the module docstring), longest first; each is also
    registered with errors.scrub_secrets so that no message shows it."""
    found = [explicit, os.environ.get("HF_TOKEN"), os.environ.get("HUGGING_FACE_HUB_TOKEN")]
    try:
        from huggingface_hub import constants
    except ImportError:  # pragma: no cover - huggingface_hub is a dependency
        constants = None  # type: ignore[assignment]
    token_path = getattr(constants, "HF_TOKEN_PATH", None)
    stored_path = getattr(constants, "HF_STORED_TOKENS_PATH", None)
    found.append(_read_small(token_path))
    stored = _read_small(stored_path)
    if stored:
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read_string(stored)
            found += [parser[s].get("hf_token") for s in parser.sections()]
        except configparser.Error:
            pass
    out = sorted({t.strip() for t in found if t and len(t.strip()) >= _MIN_OWN}, key=len, reverse=True)
    for t in out:
        register_secret(t)
    return out


def _what(own: bool) -> str:
    return (
        "your own Hugging Face token (the one in HF_TOKEN, the token file of `hf auth login` or a stored token)"
        if own
        else "a Hugging Face token (a string shaped like hf_...)"
    )


def find_token_in_bytes(data: bytes, own: list[str]) -> str | None:
    """What kind of token `data` holds (a phrase for the error message), or None."""
    for t in own:
        if t.encode() in data:
            return _what(True)
    return _what(False) if _PATTERN.search(data) else None


def hash_and_find_token(path: Path, own: list[str]) -> tuple[int, str, str | None]:
    """(size, sha256, what kind of token the file holds or None), from one read of the file."""
    needles = [t.encode() for t in own]
    overlap = max([len(n) for n in needles] + [256])
    h = hashlib.sha256()
    size = 0
    found: str | None = None
    tail = b""
    header_end = None
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
            if found is None:
                window = tail + block
                if any(n in window for n in needles):
                    found = _what(True)
                else:
                    if header_end is None:
                        header_end = _safetensors_header_end(path, block) if size == 0 else -1
                    # Pattern search: the whole file, or only the header of a .safetensors file.
                    limit = len(window) if header_end < 0 else max(0, header_end - (size - len(tail)))
                    if limit and _PATTERN.search(window, 0, limit):
                        found = _what(False)
                tail = window[-overlap:]
            size += len(block)
    return size, h.hexdigest(), found


def _safetensors_header_end(path: Path, first: bytes) -> int:
    """The byte offset where a .safetensors file's tensor data starts, or -1 for any other file."""
    if not path.name.endswith(".safetensors") or len(first) < 8:
        return -1
    return 8 + int.from_bytes(first[:8], "little")
