"""The safetensors format in one place: the header rules as safetensors' own loader enforces them (the one
validator behind every quantkit reader of safetensors files: quantkit.io.headers for inspect/check/apply planning,
and the shard executor), the one dtype table, and the writer (byte-identical to `safetensors.torch.save_file`).

The rules replay `SafeTensors::read_metadata` and `Metadata::validate` of the safetensors crate (safetensors/src/
tensor.rs; the Python package's `safe_open` calls them when it opens a file), checked against safetensors 0.8's
`safe_open` in tests/test_safety_integrity.py:

- 8 bytes little-endian header length N, N <= 100,000,000 (MAX_HEADER_SIZE) and 8 + N <= file size;
- the N bytes are UTF-8 JSON as serde_json reads it: an object, nested at most 127 deep, no NaN/Infinity, no
  number beyond float64's range, no unpaired UTF-16 surrogate escape; whitespace may pad it;
- `__metadata__` (once at most) is null or an object of string -> string;
- every other key is a tensor: an object with `dtype` (a name of the crate's `Dtype` enum), `shape` (unsigned
  64-bit integers) and `data_offsets` (exactly two of them), each field once (other fields are ignored), or the
  same three as a 3-element array (serde reads a struct from a sequence too). A name given twice keeps its last
  entry, but every entry must be well-formed;
- sorted by data_offsets, the tensors tile the data section from byte 0 with no gap and no overlap (`InvalidOffset`),
  each spans exactly numel x dtype bits / 8 bytes (a whole number of bytes; the shape's product may not overflow
  64 bits, `ValidationOverflow`), and the last one ends at the end of the file (`MetadataIncompleteBuffer`).

The writer (`serialize_safetensors`) replays safetensors' `serialize`: tensors laid out by dtype in the Rust `Dtype`
enum's descending order (ST_ORDER), then by name, the header JSON compact and space-padded to a multiple of 8 bytes.

Stdlib only at import: inspecting a checkpoint never imports torch (the writer imports it when it runs).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from itertools import accumulate, chain, repeat
from operator import add, itemgetter, sub
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from quantkit.errors import CheckpointError, QuantkitError
from quantkit.io.files import require_regular_file

if TYPE_CHECKING:
    import torch

# safetensors/src/tensor.rs MAX_HEADER_SIZE: a larger header length means corruption.
MAX_HEADER_BYTES = 100_000_000


class DtypeInfo(NamedTuple):
    """One safetensors dtype: bits per element (the crate's `Dtype::bitsize()`), and the torch dtype name the native
    executor reads and writes it as (None: sub-byte packed F4/F6, or the FNUZ variants, which it leaves to Quark)."""

    bits: int
    torch: str | None


# Every dtype safetensors 0.8 defines (safetensors/src/tensor.rs `Dtype`): THE dtype table of quantkit.
DTYPES: dict[str, DtypeInfo] = {
    "BOOL": DtypeInfo(8, "bool"), "F4": DtypeInfo(4, None), "F6_E2M3": DtypeInfo(6, None),
    "F6_E3M2": DtypeInfo(6, None), "U8": DtypeInfo(8, "uint8"), "I8": DtypeInfo(8, "int8"),
    "F8_E5M2": DtypeInfo(8, "float8_e5m2"), "F8_E4M3": DtypeInfo(8, "float8_e4m3fn"),
    "F8_E8M0": DtypeInfo(8, "float8_e8m0fnu"), "F8_E4M3FNUZ": DtypeInfo(8, None), "F8_E5M2FNUZ": DtypeInfo(8, None),
    "I16": DtypeInfo(16, "int16"), "U16": DtypeInfo(16, "uint16"), "F16": DtypeInfo(16, "float16"),
    "BF16": DtypeInfo(16, "bfloat16"), "I32": DtypeInfo(32, "int32"), "U32": DtypeInfo(32, "uint32"),
    "F32": DtypeInfo(32, "float32"), "C64": DtypeInfo(64, "complex64"), "F64": DtypeInfo(64, "float64"),
    "I64": DtypeInfo(64, "int64"), "U64": DtypeInfo(64, "uint64"),
}  # fmt: skip
DTYPE_BITS: dict[str, int] = {d: info.bits for d, info in DTYPES.items()}
# Bytes per element of whole-byte dtypes (io/headers' DTYPE_BYTES until apply's size prediction reads the schemes).
DTYPE_BYTES: dict[str, int] = {d: info.bits // 8 for d, info in DTYPES.items() if info.bits % 8 == 0}
KNOWN_DTYPES = set(DTYPES)
_DTYPE_NAMES = {d: d for d in DTYPES}  # a header's dtype string -> the one string object of that name
FLOAT_DTYPES = {"BF16", "F16", "F32", "F64"}  # the dtypes a source weight is stored in before quantization
# The order safetensors lays tensors out in: by dtype, this order (the Rust Dtype enum, descending), then by name.
ST_ORDER = [
    "U64",
    "I64",
    "F64",
    "C64",
    "F32",
    "U32",
    "I32",
    "BF16",
    "F16",
    "U16",
    "I16",
    "F8_E8M0",
    "F8_E4M3",
    "F8_E5M2",
    "I8",
    "U8",
    "BOOL",
]
METADATA_KEY = "__metadata__"
REFETCH = "the file is truncated or corrupt; re-download or re-export it"

_USIZE_MAX = 2**64 - 1  # shapes and offsets are Rust usize (64-bit)
_I64_MIN = -(2**63)
_MAX_DEPTH = 127  # serde_json's recursion limit: the 128th nested array/object is refused
_FIELDS = ("dtype", "shape", "data_offsets")
# `-0` is a float to serde_json (so not a valid shape entry) but an int to Python's json: parse ints by hand then.
_NEGATIVE_ZERO = re.compile(rb"-0(?![0-9.eE])")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_DTYPE_OF, _SHAPE_OF, _OFFSETS_OF = map(itemgetter, _FIELDS)
_FIRST, _SECOND = itemgetter(0), itemgetter(1)
_FILE_ORDER = itemgetter(3, 4)  # of a HeaderEntry: (begin, end), the order Metadata sorts tensors in


class HeaderEntry(NamedTuple):
    """One tensor of a safetensors file: offsets are relative to the data section (the byte after the header).
    `decoded`: made by decoding a quantized source (quantkit.io.formats), so not a view of the file's bytes."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int
    decoded: bool = False


_HEADER_ENTRY = partial(tuple.__new__, HeaderEntry)  # HeaderEntry from one tuple of its fields, without Python code


def itemsize(dtype: str) -> float:
    """Bytes per element of safetensors dtype `dtype` (0.5 for F4, 0.75 for F6)."""
    return DTYPES[dtype].bits / 8


def tensor_nbytes(dtype: str, shape: Iterable[int]) -> int:
    """Bytes a tensor of `dtype` and `shape` takes in a safetensors file (0 for a dtype safetensors does not
    define)."""
    info = DTYPES.get(dtype)
    return math.prod(shape) * info.bits // 8 if info is not None else 0


@dataclass(frozen=True)
class ParsedHeader:
    """A validated header: `entries` in file order (by data offsets), `listed` in the header's own (JSON) order, the
    `__metadata__` object if any; `header` is the header as stored (tensor name -> {dtype, shape, data_offsets},
    `__metadata__` where it was), built when asked for."""

    header_len: int
    entries: list[HeaderEntry]
    listed: list[HeaderEntry]
    metadata: Any = None
    metadata_at: int | None = None  # how many tensors precede `__metadata__` in the header, None without one

    @property
    def data_start(self) -> int:
        return 8 + self.header_len

    @property
    def header(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for i, e in enumerate(self.listed):
            if i == self.metadata_at:
                out[METADATA_KEY] = self.metadata
            out[e.name] = {"dtype": e.dtype, "shape": list(e.shape), "data_offsets": [e.begin, e.end]}
        if self.metadata_at is not None and self.metadata_at >= len(self.listed):
            out[METADATA_KEY] = self.metadata
        return out

    def copy(self) -> ParsedHeader:
        """A copy whose lists the caller may change (the cache keeps its own)."""
        return ParsedHeader(self.header_len, list(self.entries), list(self.listed), self.metadata, self.metadata_at)


class HeaderColumns(NamedTuple):
    """A validated header as columns, in the header's own (JSON) order: what a reader of every tensor of a checkpoint
    needs (quantkit.io.headers), without a HeaderEntry per tensor. A header holds a few dozen kinds of tensor (every
    expert of a layer has the same three), so dtype and shape are one column of indices into `kinds`. Tuples, so
    one copy serves every reader."""

    header_len: int
    names: tuple[str, ...]
    kinds: tuple[tuple[str, tuple[int, ...]], ...]  # the distinct (dtype, shape) pairs, in order of first use
    kind: tuple[int, ...]  # each tensor's index in `kinds`
    begins: tuple[int, ...]
    ends: tuple[int, ...]
    metadata: Any
    metadata_at: int | None
    in_file_order: bool  # the header lists the tensors by data offsets (as safetensors writes them)

    def parsed(self) -> ParsedHeader:
        """The same header as a ParsedHeader."""
        dtypes, shapes = zip(*map(self.kinds.__getitem__, self.kind)) if self.kind else ((), ())
        listed = list(map(_HEADER_ENTRY, zip(self.names, dtypes, shapes, self.begins, self.ends, repeat(False))))
        entries = list(listed) if self.in_file_order else sorted(listed, key=_FILE_ORDER)
        return ParsedHeader(self.header_len, entries, listed, self.metadata, self.metadata_at)


def _columns(parsed: ParsedHeader) -> HeaderColumns:
    listed = parsed.listed
    ids: dict[tuple[str, tuple[int, ...]], int] = {}
    kind = tuple(ids.setdefault((e.dtype, e.shape), len(ids)) for e in listed)
    return HeaderColumns(
        parsed.header_len,
        tuple(e.name for e in listed),
        tuple(ids),
        kind,
        tuple(e.begin for e in listed),
        tuple(e.end for e in listed),
        parsed.metadata,
        parsed.metadata_at,
        parsed.entries == listed,
    )


class _Validated:
    """A cached header: its columns, and the ParsedHeader made from them once a reader asks for one."""

    __slots__ = ("columns", "header")

    def __init__(self, columns: HeaderColumns, header: ParsedHeader | None = None) -> None:
        self.columns = columns
        self.header = header

    def parsed(self) -> ParsedHeader:
        if self.header is None:
            self.header = self.columns.parsed()
        return self.header


# Headers already validated in this process, by file size and header bytes: the one home that makes every reader of
# a shard (inspect, the plan, the executor's shard plan, verification) parse and validate it once. Validation is a
# pure function of those two (parse_header), so a hit is exactly what validating again would return, whatever the
# path or the error class asked for; a changed file has other bytes or another size and is validated afresh.
# Failures are never cached. Bounded by the bytes of the headers held. Keyed by the size and the header's length and
# ends, with the header beside its result and compared on a hit: hashing every header (tens of MB on a large
# checkpoint) would cost more than the comparison, and two headers with one key take turns.
_HeaderKey = tuple[int, int, bytes, bytes]
_PARSED: dict[_HeaderKey, tuple[bytes, _Validated]] = {}
_PARSED_MAX_BYTES = 256_000_000
_parsed_bytes = 0


_parsed_lock = threading.Lock()  # the executor's reader threads parse headers too


def _header_key(raw: bytes, n: int, size: int) -> _HeaderKey:
    return size, n, raw[:64], raw[-64:]


def _remember(key: _HeaderKey, raw: bytes, parsed: _Validated) -> None:
    global _parsed_bytes
    with _parsed_lock:
        if len(raw) > _PARSED_MAX_BYTES:
            return
        held = _PARSED.pop(key, None)
        if held is not None:
            _parsed_bytes -= len(held[0])
        while _PARSED and _parsed_bytes + len(raw) > _PARSED_MAX_BYTES:
            oldest = next(iter(_PARSED))
            _parsed_bytes -= len(_PARSED.pop(oldest)[0])
        _PARSED[key] = (raw, parsed)
        _parsed_bytes += len(raw)


class JsonObject(dict[str, Any]):
    """A JSON object that remembers the values a repeated key overwrote (safetensors type-checks those too, and the
    index reader names them): the `object_pairs_hook` of the header and index readers is `json_object`."""

    shadowed: tuple[tuple[str, Any], ...] = ()


def json_object(pairs: list[tuple[str, Any]]) -> JsonObject:
    obj = JsonObject(pairs)
    if len(obj) != len(pairs):
        seen: dict[str, Any] = {}
        shadowed = []
        for key, value in pairs:
            if key in seen:
                shadowed.append((key, seen[key]))
            seen[key] = value
        obj.shadowed = tuple(shadowed)
    return obj


class _Refused(Exception):
    pass


def _constant(name: str) -> Any:
    raise _Refused(f"{name} is not JSON")


def _float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _Refused(f"number {text[:20]} is out of float64's range")
    return value


def _int(text: str) -> int | float:
    return -0.0 if text == "-0" else int(text)


def header_length(
    prefix: bytes | bytearray | memoryview, size: int, where: str, error: type[QuantkitError] = CheckpointError
) -> int:
    """The header length N from a file's first 8 bytes, refused as safetensors refuses it."""
    if size < 8 or len(prefix) < 8:
        raise error(f"{where}: only {size} bytes, too short for a safetensors header; {REFETCH}")
    n = int.from_bytes(bytes(prefix[:8]), "little")
    if n == 0 or n > MAX_HEADER_BYTES or 8 + n > size:
        limit = f" (safetensors allows at most {MAX_HEADER_BYTES})" if n > MAX_HEADER_BYTES else ""
        raise error(f"{where}: safetensors header length {n} does not fit the file's {size} bytes{limit}; {REFETCH}")
    return n


def parse_header(
    data: bytes | bytearray | memoryview, size: int, where: str, error: type[QuantkitError] = CheckpointError
) -> ParsedHeader:
    """Validate the header of a safetensors file of `size` bytes whose first bytes (at least 8 + N) are `data`.

    Raises `error` (one line naming `where`, the tensor and the fix) for every file safetensors' loader refuses.
    """
    return _validated(data, size, where, error).parsed().copy()


def _validated(data: bytes | bytearray | memoryview, size: int, where: str, error: type[QuantkitError]) -> _Validated:
    n = header_length(data, size, where, error)
    return _validated_raw(bytes(data[8 : 8 + n]), n, size, where, error)


def _validated_raw(raw: bytes, n: int, size: int, where: str, error: type[QuantkitError]) -> _Validated:
    """The validated header `raw` (N = `n`) of a file of `size` bytes, from the cache when it holds it."""
    key = _header_key(raw, n, size)
    held = _PARSED.get(key)
    if held is not None and held[0] == raw:
        return held[1]
    valid = _validate(raw, n, size, where, error)
    _remember(key, raw, valid)
    return valid


def _validate(raw: bytes, n: int, size: int, where: str, error: type[QuantkitError]) -> _Validated:
    """parse_header's rules on the header bytes `raw` (N = `n`) of a file of `size` bytes."""
    data_len = size - 8 - n
    plain = _validate_compact(raw, data_len, n) or _validate_plain(raw, data_len, n)
    if plain is not None:
        return _Validated(plain)
    full = _validate_full(raw, n, size, where, error)
    return _Validated(_columns(full), full)


def _validate_full(raw: bytes, n: int, size: int, where: str, error: type[QuantkitError]) -> ParsedHeader:
    """The rules, tensor by tensor, naming what is wrong."""
    try:
        header = json.loads(
            raw.decode("utf-8"),
            object_pairs_hook=json_object,
            parse_constant=_constant,
            parse_float=_float,
            parse_int=_int if _NEGATIVE_ZERO.search(raw) else None,
        )
    except UnicodeDecodeError:
        raise error(f"{where}: safetensors header is not valid JSON (not UTF-8); {REFETCH}") from None
    except json.JSONDecodeError as e:
        raise error(f"{where}: safetensors header is not valid JSON ({e}); {REFETCH}") from None
    except (_Refused, ValueError) as e:  # ValueError: an integer beyond Python's digit limit (also beyond float64)
        digits = re.search(r"value has (\d+) digits", str(e))
        reason = f"an integer of {digits.group(1)} digits" if digits else str(e)[:80]
        raise error(
            f"{where}: safetensors header is not valid JSON as safetensors reads it ({reason}); {REFETCH}"
        ) from None
    except RecursionError:
        raise error(f"{where}: safetensors header JSON is nested too deeply to read; {REFETCH}") from None
    if not isinstance(header, dict):
        raise error(f"{where}: safetensors header is a JSON {_kind(header)}, not an object; {REFETCH}")
    if _SURROGATE_ESCAPE.search(raw) and _has_lone_surrogate(header):
        raise error(
            f"{where}: safetensors header holds an unpaired UTF-16 surrogate escape, which safetensors' JSON "
            f"parser refuses; {REFETCH}"
        )
    shadowed = getattr(header, "shadowed", ())
    if any(key == METADATA_KEY for key, _ in shadowed):
        raise error(f"{where}: safetensors header gives {METADATA_KEY} twice; {REFETCH}")
    _check_metadata(header.get(METADATA_KEY), where, error)
    for name, entry in shadowed:  # overwritten by a later entry of the same name, but still parsed by safetensors
        _entry_fields(name, entry, where, error)

    data_len = size - 8 - n
    listed: list[HeaderEntry] = []
    metadata_at = None
    for name, value in header.items():
        if name == METADATA_KEY:
            metadata_at = len(listed)
            continue
        fields = _plain_entry(value)
        if fields is None:  # anything but the plain form: the full rules, with their messages
            fields = _entry_fields(name, value, where, error)
        dtype, shape, begin, end = fields
        numel = 1
        for d in shape:
            numel *= d
            if numel > _USIZE_MAX:
                raise error(f"{where}: tensor {name!r} shape {_short(shape)} overflows 64 bits; {REFETCH}")
        bits = numel * DTYPE_BITS[dtype]
        if bits > _USIZE_MAX:
            raise error(f"{where}: tensor {name!r} shape {_short(shape)} overflows 64 bits; {REFETCH}")
        if bits % 8:
            raise error(
                f"{where}: tensor {name!r} is {dtype} {_short(shape)}: {bits} bits, not a whole number of "
                f"bytes; {REFETCH}"
            )
        if end < begin:
            raise error(f"{where}: tensor {name!r} ends (byte {end}) before it begins (byte {begin}); {REFETCH}")
        if end > data_len:
            raise error(
                f"{where}: tensor {name!r} bytes {begin}..{end} lie outside the file's {data_len} data bytes; {REFETCH}"
            )
        if bits // 8 != end - begin:
            raise error(
                f"{where}: tensor {name!r} is {dtype} {_short(shape)} ({bits // 8} bytes) but spans "
                f"{end - begin} bytes; {REFETCH}"
            )
        listed.append(HeaderEntry(name, dtype, shape, begin, end))
    entries = sorted(listed, key=_FILE_ORDER)  # as Metadata's deserializer sorts them before validate()
    pos, previous = 0, None
    for t in entries:
        if t.begin > pos:
            before = (
                f"between tensors {previous!r} and {t.name!r}" if previous is not None else f"before tensor {t.name!r}"
            )
            raise error(
                f"{where}: data bytes {pos}..{t.begin} {before} belong to no tensor (safetensors refuses "
                f"holes); {REFETCH}"
            )
        if t.begin < pos:
            raise error(
                f"{where}: tensors {previous!r} and {t.name!r} share data bytes {t.begin}..{min(pos, t.end)} "
                f"(safetensors refuses overlapping tensors); {REFETCH}"
            )
        pos, previous = t.end, t.name
    if pos != data_len:
        raise error(
            f"{where}: the tensors end at data byte {pos} but the file holds {data_len}: {data_len - pos} "
            f"trailing bytes belong to no tensor (safetensors refuses them); {REFETCH}"
        )
    return ParsedHeader(n, entries, listed, header.get(METADATA_KEY), metadata_at)


class _NotPlain(Exception):
    """A header outside the form _validate_plain takes."""


def _no_float(text: str) -> float:
    raise _NotPlain(text)


class _Kinds(dict[tuple[str, tuple[int, ...]], int]):
    """The kinds (dtype, shape) of one header's tensors -> their index in `table`, each kind checked once, on first
    sight, and its bytes in `nbytes`. The shapes are tuples of a parse without floats, so equal ones are alike but
    for `true`, which equals 1: a kind with a dimension 1 sets `ones` (its header's dimensions are then
    type-checked one by one), and one without dimensions sets `scalar` (an empty object gives that tuple too)."""

    ones = False
    scalar = False

    def __init__(self) -> None:
        super().__init__()
        self.table: list[tuple[str, tuple[int, ...]]] = []
        self.nbytes: list[int] = []

    def __missing__(self, key: tuple[str, tuple[int, ...]]) -> int:
        dtype, shape = _DTYPE_NAMES[key[0]], key[1]  # KeyError: a dtype safetensors does not define
        for d in shape:
            if type(d) is not int or d < 1:  # a zero dimension can hide an overflow, which the full rules report
                raise _NotPlain(shape)
        bits = math.prod(shape) * DTYPE_BITS[dtype]  # dimensions >= 1: the running product's overflow is this one's
        if bits > _USIZE_MAX or bits % 8:
            raise _NotPlain(shape)
        self.ones = self.ones or 1 in shape
        self.scalar = self.scalar or not shape
        index = self[key] = len(self.table)
        self.table.append((dtype, shape))
        self.nbytes.append(bits >> 3)
        return index


def _validate_plain(raw: bytes, data_len: int, n: int) -> HeaderColumns | None:
    """`_validate`'s result for a header in the form every writer produces, or None for any other header, which the
    full rules then judge (with their messages). It accepts only headers those rules accept, with the same result,
    but checks the tensors in C-level passes over columns instead of Python code per tensor (on a 67,667-tensor
    index the full rules cost 4-5x the json.loads itself), and what depends on a tensor's dtype and shape alone once
    per kind (_Kinds).

    The form: no backslash anywhere (so every `"` delimits a string), no `-0`, no float, every entry an object of
    exactly dtype, shape (dimensions >= 1) and data_offsets, `__metadata__` null or an object of strings, the tensors
    tiling the data section. What is inferred rather than checked:
    - strings, from their count: without backslashes the text holds raw.count('"') / 2 of them, and a header whose
      entries have the three fields (and a dtype of the table) holds at least 5 per tensor and 1 + 2 per metadata
      pair, so that count holds exactly those: no other field, no string in a shape or offsets, and no repeated key
      (which leaves no trace in the dicts json.loads builds without a hook, but is a string more in the text);
    - the offsets' types: a null, list or object in them fails the subtraction that gives the spans, and a boolean
      (0 or 1) could only stand where the tiling puts those values, the first begin, end and second begin;
    - their range: the tiling puts them between 0 and data_len."""
    if b"\\" in raw or b"-" in raw and b"-0" in raw or data_len > _USIZE_MAX:  # (a 2-byte search is 40x slower)
        return None
    try:
        header = json.loads(raw.decode("utf-8"), parse_float=_no_float)
    except (ValueError, RecursionError, _NotPlain):  # JSONDecodeError, UnicodeDecodeError, a huge integer, a float
        return None
    if type(header) is not dict:
        return None
    names = tuple(header)
    metadata, metadata_at, strings = None, None, 0
    if METADATA_KEY in header:
        metadata = header.pop(METADATA_KEY)
        metadata_at = names.index(METADATA_KEY)
        names = names[:metadata_at] + names[metadata_at + 1 :]
        if metadata is not None and (type(metadata) is not dict or set(map(type, metadata.values())) - {str}):
            return None
        strings = 1 + 2 * len(metadata or ())
    if raw.count(b'"') != 2 * (strings + 5 * len(names)):
        return None
    if not names:
        return HeaderColumns(n, (), (), (), (), (), metadata, metadata_at, True) if data_len == 0 else None
    values = header.values()
    kinds = _Kinds()
    try:  # each entry an object holding the three fields (itemgetter raises TypeError for a list, string, number)
        lists, offsets = tuple(map(_SHAPE_OF, values)), tuple(map(_OFFSETS_OF, values))
        # TypeError: a list or object as a dimension (unhashable), or a dtype that is no string
        kind = tuple(map(kinds.__getitem__, zip(map(_DTYPE_OF, values), map(tuple, lists))))
        begins, ends = tuple(map(_FIRST, offsets)), tuple(map(_SECOND, offsets))  # each offsets of length >= 2
        if sum(map(len, offsets)) != 2 * len(offsets) or list(map(sub, ends, begins)) != list(
            map(kinds.nbytes.__getitem__, kind)
        ):  # each tensor spans exactly its bytes (>= 1)
            return None
    except (KeyError, IndexError, TypeError, _NotPlain):  # KeyError: a field missing, or a dtype safetensors lacks
        return None
    if (
        kinds.scalar
        and set(map(type, lists)) - {list}
        or kinds.ones
        and set(map(type, chain.from_iterable(lists))) - {int}
    ):
        return None
    in_file_order = begins[0] == 0 and begins[1:] == ends[:-1]  # what safetensors writes
    if in_file_order:
        if {type(begins[0]), type(ends[0]), *map(type, begins[1:2])} != {int}:
            return None
        begins, last = (0, *ends[:-1]), ends[-1]  # the same ints as `ends`: the parser's copies need not be kept
    else:
        if set(map(type, chain(begins, ends))) - {int}:
            return None
        by_begin, by_end = zip(*sorted(zip(begins, ends)))
        if by_begin[0] != 0 or by_begin[1:] != by_end[:-1]:
            return None
        last = by_end[-1]
    if last != data_len:
        return None
    return HeaderColumns(n, names, tuple(kinds.table), kind, begins, ends, metadata, metadata_at, in_file_order)


# The writer form of a header (safetensors' `Metadata` serializer, quantkit's writer): compact JSON, `__metadata__`
# first if at all, then each tensor as `"name":{"dtype":"..","shape":[..],"data_offsets":[b,e]}` in file order, the
# whole padded with spaces. It holds no control character (JSON refuses them raw in a string, and compact JSON has no
# whitespace) and, in a header without a backslash, no escape. A tensor's match has three groups: its name, its kind
# (`BF16","shape":[7168,2048`) and its offsets (`0,29360128`), the last compared with the canonical decimals of the
# tiling, which also refuses the leading zeros JSON refuses.
_COMPACT_TENSOR = re.compile(
    r'"([^"]*)":\{"dtype":"([A-Z0-9_]+","shape":\[[0-9,]*)\],"data_offsets":\['
    r"([0-9]+,[0-9]+)\]\}(?:,|\}\Z)"
)
_COMPACT_FIXED = len('"":{"dtype":"],"data_offsets":[]}') + 1  # the characters of a match besides its groups
_COMPACT_METADATA = re.compile(r'\{"__metadata__":(null|\{(?:"[^"]*":"[^"]*"(?:,"[^"]*":"[^"]*")*)?\}),')
# dimensions >= 1 of at most 20 digits (u64's; longer ones are past its range, and past int()'s 4,300-digit limit)
_COMPACT_KIND = re.compile(r'([A-Z0-9_]+)","shape":\[((?:[1-9][0-9]{0,19}(?:,[1-9][0-9]{0,19})*)?)')
_CONTROL_BYTES = bytes(range(32))


class _KindTexts(dict[str, int]):
    """A kind's text (`BF16","shape":[7168,2048`) -> its index in this header's `table` (and its bytes in `nbytes`),
    as _Kinds keeps them: one text per kind, since the writer form writes an integer one way. A text's kind is checked
    once per process (_KIND_OF_TEXT), since every shard of a checkpoint repeats the same few."""

    def __init__(self) -> None:
        super().__init__()
        self.table: list[tuple[str, tuple[int, ...]]] = []
        self.nbytes: list[int] = []

    def __missing__(self, text: str) -> int:
        known = _KIND_OF_TEXT.get(text)
        if known is None:
            m = _COMPACT_KIND.fullmatch(text)
            if m is None:  # a dimension 0, a leading zero, an empty dimension
                raise _NotPlain(text)
            dtype, shape = m.groups()
            kinds = _Kinds()  # KeyError, _NotPlain: a dtype safetensors lacks, a size beyond 64 bits
            kinds[dtype, tuple(map(int, shape.split(","))) if shape else ()]
            known = kinds.table[0], kinds.nbytes[0]
            if len(_KIND_OF_TEXT) >= 4096:  # (a checkpoint has dozens)
                _KIND_OF_TEXT.clear()
            _KIND_OF_TEXT[text] = known
        index = self[text] = len(self.table)
        self.table.append(known[0])
        self.nbytes.append(known[1])
        return index


_KIND_OF_TEXT: dict[str, tuple[tuple[str, tuple[int, ...]], int]] = {}


def _validate_compact(raw: bytes, data_len: int, n: int) -> HeaderColumns | None:
    """`_validate_plain`'s result for a header in the writer form in file order (above), or None for any other
    header, which _validate_plain then judges: one regex pass over the text instead of json.loads and a pass per
    field. It pays: `python benchmarks/dry_run_large.py --fast-paths`, row `fast_path_cpu_ratio.validate_compact`
    (the whole `apply --dry-run` process's CPU without it over with it; 1.09 on the 67,667-tensor index).

    The matches tile the text after `{` and the metadata: each match starts where the previous ended (their lengths,
    from the groups', sum to what is left), so nothing between them escapes the pattern, and only the last ends the
    object (`}` at the text's end). Without backslashes every `"` delimits a string, so the tiling leaves no room for
    another field or value. What json.loads and _validate_plain would find otherwise is checked: a name twice, a
    tensor named `__metadata__`, each kind by _Kinds, and the spans tiling the data section from byte 0 in header
    order."""
    body = raw.rstrip(b" ")  # safetensors pads the header with spaces
    if b"\\" in body or data_len > _USIZE_MAX or len(body.translate(None, _CONTROL_BYTES)) != len(body):
        return None
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return None
    start, metadata, metadata_at = 1, None, None
    if text.startswith('{"__metadata__":'):
        head = _COMPACT_METADATA.match(text)
        if head is None:
            return None
        start, metadata_at = head.end(), 0
        if head.group(1) != "null":
            metadata = json.loads(head.group(1))  # a key twice keeps its last value, as in the full rules
    elif not text.startswith('{"'):
        return None
    found = _COMPACT_TENSOR.findall(text, start)
    if not found:
        return None
    names, kind_texts, offsets = zip(*found)
    if (
        sum(map(len, names)) + sum(map(len, kind_texts)) + sum(map(len, offsets)) + _COMPACT_FIXED * len(found)
        != len(text) - start
        or text[-1] != "}"
        or METADATA_KEY in names
    ):
        return None  # something between or after the matches, or the last one ends in a comma
    kinds = _KindTexts()
    try:
        kind = tuple(map(kinds.__getitem__, kind_texts))
    except (KeyError, _NotPlain):  # a dtype safetensors lacks, a shape outside the form
        return None
    ends = tuple(accumulate(map(kinds.nbytes.__getitem__, kind)))  # each tensor spans exactly its bytes, in order
    if ends[-1] != data_len or len(set(names)) != len(names):
        return None
    decimals = tuple(map(str, ends))
    if offsets != tuple(map(add, map(add, ("0", *decimals[:-1]), repeat(",")), decimals)):
        return None
    return HeaderColumns(n, names, tuple(kinds.table), kind, (0, *ends[:-1]), ends, metadata, metadata_at, True)


def read_parsed_header(path: str | Path, error: type[QuantkitError] = CheckpointError) -> ParsedHeader:
    """Read and validate the header of the safetensors file at `path` (tensor data is not read)."""
    return _read_validated(Path(path), error).parsed().copy()


def read_header_columns(path: str | Path, error: type[QuantkitError] = CheckpointError) -> HeaderColumns:
    """read_parsed_header's validated header, as columns."""
    return _read_validated(Path(path), error).columns


def _read_validated(path: Path, error: type[QuantkitError]) -> _Validated:
    require_regular_file(path, fix="a shard must be a regular .safetensors file", error=error)
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            prefix = f.read(8)
            n = header_length(prefix, size, str(path), error)
            raw = f.read(n)
    except FileNotFoundError:
        raise error(f"{path}: file not found; check the checkpoint folder") from None
    except IsADirectoryError:
        raise error(f"{path}: is a folder, expected a .safetensors file") from None
    except PermissionError:
        raise error(f"{path}: permission denied; make the file readable") from None
    except OSError as e:
        raise error(f"{path}: cannot be read ({e.strerror or e}); {REFETCH}") from None
    return _validated_raw(raw, n, size, str(path), error)


def read_header(path: str | Path) -> dict[str, Any]:
    """Parse and validate the JSON header of one safetensors file without reading tensor data, refusing every file
    that safetensors' own loader refuses.

    Returns the header: tensor name -> {dtype, shape, data_offsets}, plus `__metadata__` if present.
    """
    return read_parsed_header(path).header


# --- writing ---------------------------------------------------------------------------------------------------------


def st_dtype(t: torch.Tensor, error: type[Exception] = CheckpointError) -> str:
    """The safetensors dtype name of tensor `t`'s dtype; `error` when the table has none."""
    name = str(t.dtype).removeprefix("torch.")
    for st, info in DTYPES.items():
        if info.torch == name:
            return st
    raise error(f"tensor dtype {t.dtype} has no safetensors name")


def header_bytes(items: list[tuple[str, str, tuple[int, ...], int]]) -> tuple[bytes, list[int]]:
    """safetensors' header for (name, dtype, shape, nbytes) items already in layout order, and the data offsets."""
    header: dict[str, Any] = {}
    offsets = []
    pos = 0
    for name, dtype, shape, nbytes in items:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [pos, pos + nbytes]}
        offsets.append(pos)
        pos += nbytes
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    raw += b" " * ((8 - len(raw) % 8) % 8)
    return len(raw).to_bytes(8, "little") + raw, offsets


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The tensor's bytes in memory order (CPU, contiguous), without a copy."""
    import torch

    flat = t.reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    return memoryview(flat.view(torch.uint8).numpy())  # type: ignore[arg-type]


def serialize_safetensors(
    tensors: dict[str, torch.Tensor],
    path: Path,
    expected: dict[str, bytes] | None = None,
    *,
    error: type[Exception] = CheckpointError,
    mismatch: type[Exception] = CheckpointError,
) -> tuple[int, str]:
    """Write `tensors` to `path` byte-identically to `safetensors.torch.save_file(tensors, path)` (no metadata),
    streaming from each tensor's memory. Returns (bytes written, sha256 of them). `expected` maps tensor names to
    the sha256 digest their bytes must have (checked on the bytes as written; `mismatch` if not). `error`: a tensor
    whose dtype has no safetensors name."""
    order = sorted(tensors, key=lambda k: (ST_ORDER.index(st_dtype(tensors[k], error)), k))
    views = {k: tensor_bytes(tensors[k].contiguous()) for k in order}
    head, _ = header_bytes([(k, st_dtype(tensors[k], error), tuple(tensors[k].shape), views[k].nbytes) for k in order])
    digest = hashlib.sha256(head)
    written = len(head)
    with open(path, "wb") as f:
        f.write(head)
        for k in order:
            mv = views[k]
            if expected is not None and k in expected and hashlib.sha256(mv).digest() != expected[k]:
                raise mismatch(
                    f"{path.name}: kept tensor {k} would be written with bytes that differ "
                    "from the source (internal error)"
                )
            f.write(mv)
            digest.update(mv)
            written += mv.nbytes
    return written, digest.hexdigest()


# --- validation helpers ----------------------------------------------------------------------------------------------


def _plain_entry(value: Any) -> tuple[str, tuple[int, ...], int, int] | None:
    """(dtype, shape, begin, end) of an entry in the form every writer uses, an object of exactly `dtype`, `shape`
    and `data_offsets`, each once and well-typed; None for anything else, which `_entry_fields` then judges (it
    accepts the same entries and returns the same values, and names what is wrong with the others)."""
    if type(value) is not JsonObject or len(value) != 3 or value.shadowed:
        return None
    dtype, shape, offsets = value.get("dtype"), value.get("shape"), value.get("data_offsets")
    if (
        type(dtype) is not str
        or dtype not in DTYPE_BITS
        or type(shape) is not list
        or type(offsets) is not list
        or len(offsets) != 2
    ):
        return None
    for v in (*shape, *offsets):
        if type(v) is not int or not 0 <= v <= _USIZE_MAX:
            return None
    return dtype, tuple(shape), offsets[0], offsets[1]


def _entry_fields(
    name: str, value: Any, where: str, error: type[QuantkitError]
) -> tuple[str, tuple[int, ...], int, int]:
    """(dtype, shape, begin, end) of one tensor entry, typed as safetensors' `TensorInfo` deserializer types it."""
    malformed = f"{where}: tensor {name!r} header entry is malformed (needs dtype, shape, data_offsets)"
    if isinstance(value, list):  # serde fills a struct from a sequence of its fields in order
        if len(value) != 3:
            raise error(f"{malformed}; {REFETCH}")
        value = dict(zip(_FIELDS, value, strict=True))
    elif isinstance(value, dict):
        repeated = sorted({k for k, _ in getattr(value, "shadowed", ()) if k in _FIELDS})
        if repeated:
            raise error(f"{where}: tensor {name!r} gives {repeated[0]} twice; {REFETCH}")
        extra = [v for k, v in value.items() if k not in _FIELDS]
        if extra and (problem := _json_problem(extra, depth=2)):
            raise error(f"{where}: tensor {name!r} header entry {problem}; {REFETCH}")
    else:
        raise error(f"{malformed}; {REFETCH}")
    dtype, shape, offsets = value.get("dtype"), value.get("shape"), value.get("data_offsets")
    if not (
        isinstance(dtype, str)
        and isinstance(shape, list)
        and all(_usize(d) for d in shape)
        and isinstance(offsets, list)
        and len(offsets) == 2
        and all(_usize(o) for o in offsets)
    ):
        raise error(f"{malformed}; {REFETCH}")
    if dtype not in DTYPE_BITS:
        raise error(f"{where}: tensor {name!r} has dtype {dtype[:20]!r}, which safetensors does not define; {REFETCH}")
    return dtype, tuple(shape), offsets[0], offsets[1]


def _usize(v: Any) -> bool:
    return type(v) is int and 0 <= v <= _USIZE_MAX


def _check_metadata(metadata: Any, where: str, error: type[QuantkitError]) -> None:
    if metadata is None:
        return
    values = (
        [*metadata.values(), *(v for _, v in getattr(metadata, "shadowed", ()))] if isinstance(metadata, dict) else None
    )
    if values is None or not all(isinstance(v, str) for v in values):
        raise error(f"{where}: safetensors header's {METADATA_KEY} must map strings to strings; {REFETCH}")


def _json_problem(values: list[Any], depth: int) -> str | None:
    """What serde_json would refuse in ignored fields: nesting beyond its limit, integers beyond float64."""
    stack = [(v, depth + 1) for v in values]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict | list):
            if d > _MAX_DEPTH:
                return f"nests JSON deeper than safetensors' parser allows ({_MAX_DEPTH})"
            stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
        elif type(v) is int and not _I64_MIN <= v <= _USIZE_MAX:
            try:
                float(v)
            except OverflowError:
                return "holds an integer beyond float64's range"
    return None


def _has_lone_surrogate(header: Any) -> bool:
    stack = [header]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return True
    return False


def _kind(value: Any) -> str:
    return {list: "list", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}.get(
        type(value), type(value).__name__
    )


def _short(shape: tuple[int, ...]) -> str:
    text = str(list(shape))
    return text if len(text) <= 80 else text[:77] + "..."
