"""Sizes in bytes from text (`8GiB`, `500MB`, `5GB`): --max-memory, QUANTKIT_MAX_MEMORY, --max-shard-size and the
Python API's fields of the same names. Bounded: a size is at most MAX_SIZE_TEXT characters and MAX_BYTES bytes, so a
400-digit or 5,000-digit value is one error line, never an OverflowError or int's digit-limit ValueError."""

from __future__ import annotations

import re

from quantkit.errors import QuantkitError

MAX_SIZE_TEXT = 32  # "1023.999999 GiB" and the like fit; nothing longer is a size a machine has
MAX_BYTES = 2**60  # 1 EiB: more memory or shard than any machine holds

_SIZE = re.compile(r"([0-9]{1,18}(?:\.[0-9]{1,9})?)\s*([KMGT]?)(?:i?B)?", re.IGNORECASE)
_SHARD_SIZE = re.compile(r"([0-9]{1,19})\s*(GiB|MiB|KiB|GB|MB|KB|Gb|Mb|Kb)?", re.IGNORECASE)


class SizeError(QuantkitError):
    """A size option is not a size, or is out of range."""


def _shown(text: str) -> str:
    return repr(text[:40]) + (f" ({len(text)} characters)" if len(text) > 40 else "")


def _bounded(n: int, option: str, text: str, example: str) -> int:
    if n > MAX_BYTES:
        raise SizeError(f"{option} {_shown(text)}: larger than {MAX_BYTES} bytes (1 EiB); give e.g. {example}")
    return n


def parse_size(text: str, option: str) -> int:
    """Bytes from `8GiB`, `8G`, `500MiB`, `500MB` (binary units) or a plain number of bytes."""
    m = _SIZE.fullmatch(text.strip()) if len(text) <= MAX_SIZE_TEXT else None
    if m is None:
        raise SizeError(f"{option} {_shown(text)}: not a size; give e.g. 8GiB, 500MiB or a number of bytes")
    scale = 1024 ** " KMGT".index((m.group(2) or " ").upper())
    return _bounded(max(1, int(float(m.group(1)) * scale)), option, text, "8GiB")


def parse_shard_size(text: str, option: str = "--max-shard-size") -> int:
    """Bytes from a `--max-shard-size` as transformers reads `max_shard_size` (transformers/utils/hub.py
    `convert_file_size_to_int`): GiB/MiB/KiB binary, GB/MB/KB decimal, Gb/Mb/Kb (lower-case b) bits, or a plain
    number of bytes; case-insensitive otherwise. Written here because importing transformers costs seconds."""
    m = _SHARD_SIZE.fullmatch(text.strip()) if len(text) <= MAX_SIZE_TEXT else None
    if m is None or int(m.group(1)) < 1:
        raise SizeError(f"{option} {_shown(text)}: not a size; give e.g. 5GB, 500MB or 2GiB")
    n, unit = int(m.group(1)), m.group(2) or ""
    if unit.upper().endswith("IB"):
        size = n * 2 ** (10 * "KMG".index(unit[0].upper()) + 10)
    elif not unit:
        size = n
    else:
        size = n * 10 ** (3 * "KMG".index(unit[0].upper()) + 3)
        size = max(1, size // 8) if unit.endswith("b") else size
    return _bounded(size, option, text, "5GB")
