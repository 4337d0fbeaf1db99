"""Streaming per-shard executor: quantize a safetensors checkpoint shard by shard, without Quark, into exactly the
files AMD Quark 0.13's `ModelQuantizer(cfg).direct_quantize_checkpoint(src, dst, device=...)` writes.

Pipeline: reader threads (1 on CPU, where quantizing is the bottleneck; 4 when a GPU quantizes, because one read
stream is slower than a GPU) read each source shard once into a reused host buffer (hashing those bytes: sha256_in)
and expose its tensors as zero-copy views; one worker thread per device quantizes (on CPU a small pool runs one
tensor per core; on a GPU the shard's weights are batched by shape, see `_process_device`); one writer thread
serialises each output shard the way safetensors does, hashing the bytes as it writes (sha256_out), verifies it,
renames it into place and records it in a journal.

Memory bound: there are `readers + workers + 1` source buffers (slots), each the size of the largest shard, and a
shard holds its buffer from its read until its output is written, so host memory stays near slots x (largest shard
+ its output; the output is at most ~0.3x the shard for MXFP4 from bf16 and ~0.5x for FP8) whatever the model's
size. Readers are dropped (down to 1) until the slots fit in half of the available memory. When a GPU is used the
buffers are page-locked (cudaHostRegister, so host-to-device copies are asynchronous DMA) while they fit in a
quarter of the machine's memory; GPU memory per worker is bounded by batches of at most 1 GiB of source bytes.

Replayed from quark/torch/quantization/file2file_quantization.py (Quark 0.13):
- shards are found with os.walk, processed and indexed in that order (`_get_safetensor_files`); a shard's tensors
  come in file order (safetensors `load_file`), each output shard is `save_file(tensors)` (no metadata);
- a tensor is quantized iff its name passes `_is_linear_weight_tensor` (ends in `.weight`, module not ending in
  `norm`, no `embed`), it has 2+ dims, its module does not fnmatch an exclude pattern, and then the first matching
  `layer_config` pattern or the global scheme applies (`_get_layer_quant_config_by_tensor_name`); it is written as
  `<name>` then `<name>_scale` (`_single_stage_quantize_weight`);
- other linear-named float tensors that are not excluded 2-D+ weights in F16/BF16/F32 are cast to the config's
  dtype (`_quantize_and_save_safetensor_shard`, `_get_model_dtype_from_hf_model_config`); all else passes through;
- `exclude` in config.json is every 2-D+ linear module matching a pattern, sorted (`_build_exclude_aware_quant_config`);
- every other file and folder of the source (not *.safetensors, not README*.md) is copied (`_copy_json_and_py_files`),
  then model.safetensors.index.json and config.json are written with json.dump(indent=4, ensure_ascii=False).

Differences from Quark, on purpose: sources that are already quantized (a quantization_config, or `.weight_scale`/
`.weight_packed`/`.weight_shape` tensors) or hold shards in sub-folders are refused instead of being dequantized or
flattened; an existing non-empty `dst` is refused unless resuming (Quark deletes it); NaN/Inf in a weight to be
quantized is an error (Quark writes garbage scales). With model.safetensors.index.json only the shards it names are
read (Quark quantizes every *.safetensors os.walk finds, so a stray `consolidated.safetensors` stores every tensor
twice), no *.safetensors is copied from a folder, and no tensor may be in two shards. Headers are validated with
safetensors' own rules (quantkit.io.safetensors_format). The journal `.quantkit-journal.json` lives in `dst` while
the run is incomplete and is removed when it completes, so a finished folder of a clean source holds exactly Quark's
files; resuming keeps a finished shard only when its output and its source re-hash as the journal recorded.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import hashlib
import json
import math
import os
import queue
import re
import resource
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from quantkit.errors import QuantkitError, UnresumableError
from quantkit.io.checkpoint import sha256_file
from quantkit.io.files import check_entry, check_tree, copy_tree_checked, link_roots, require_regular_file, scan_folder
from quantkit.io.headers import (
    check_index_complete,
    place_tensor,
    read_config,
    read_index,
    safetensors_files,
    unindexed_weight_files,
)
from quantkit.io.safetensors_format import header_length, parse_header

if TYPE_CHECKING:
    import torch

JOURNAL_NAME = ".quantkit-journal.json"
JOURNAL_VERSION = 2  # 2: the run key holds drop, source format, model dtype and quantkit version
_PARTIAL_SUFFIX = ".quantkit-partial"
_READ_CHUNK = 16 * 1024 * 1024
_MB = 1024 * 1024
_GPU_READERS = 4  # read streams when a GPU quantizes: one stream reads ~0.8 GB/s, 4 reach a disk's parallel rate
_DEVICE_BATCH_BYTES = 1 << 30  # source bytes per batched quantize call on a GPU (its temporaries are ~3x that)
_PIN_FRACTION = 0.25  # page-lock the source buffers only while they take at most this share of the memory


class ExecutorError(QuantkitError):
    """The per-shard executor cannot quantize this checkpoint as asked."""


class CorruptShardError(ExecutorError):
    """A source shard is truncated or is not a valid safetensors file."""


class NonFiniteWeightError(ExecutorError):
    """A weight that is to be quantized holds NaN or Inf."""


class ShardVerificationError(ExecutorError):
    """A written shard does not match its source or the scheme's layout (a bug, never a user error)."""


@dataclass
class ShardEvent:
    """Progress of one shard: `kind` is "start" (a worker took it), "done" (written and journaled), "resumed" (a
    previous run's output was kept: its output and source hash as the journal recorded) or "source-changed" (a
    previous run finished it, but its source bytes changed since: it is quantized again)."""

    kind: Literal["start", "done", "resumed", "source-changed"]
    shard: str
    index: int
    total: int
    device: str | None = None
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0


@dataclass
class ShardRecord:
    """One output shard: sizes, hashes (of the bytes read and of the bytes written), who made it and how long."""

    name: str
    bytes_in: int
    bytes_out: int
    sha256_in: str
    sha256_out: str
    tensors: int
    quantized: int
    seconds: float
    device: str
    resumed: bool = False


@dataclass
class ExecutorReport:
    """What `quantize_checkpoint` did; `to_dict()` is JSON-ready."""

    source: str
    output: str
    scheme: str
    devices: list[str]
    exclude: list[str]
    shards: list[ShardRecord] = field(default_factory=list)
    total_seconds: float = 0.0
    mb_per_s: float = 0.0
    peak_rss_mb: float = 0.0
    resumed_shards: int = 0
    source_changed: list[str] = field(default_factory=list)  # finished before an interrupt, redone: source changed
    ignored_files: list[str] = field(default_factory=list)  # *.safetensors the index does not name: not read
    readers: int = 0
    page_locked: bool = False  # the source buffers were page-locked for asynchronous GPU copies

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- safetensors format ----------------------------------------------------------------------------------------------

# safetensors dtype names <-> torch dtype names, and the order safetensors lays tensors out in: by dtype, this order
# (the Rust Dtype enum, descending), then by name.
_ST_TO_TORCH = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "F8_E5M2": "float8_e5m2", "F8_E4M3": "float8_e4m3fn",
                "F8_E8M0": "float8_e8m0fnu", "I16": "int16", "U16": "uint16", "F16": "float16", "BF16": "bfloat16",
                "I32": "int32", "U32": "uint32", "F32": "float32", "C64": "complex64", "F64": "float64",
                "I64": "int64", "U64": "uint64"}
_ST_ORDER = ["U64", "I64", "F64", "C64", "F32", "U32", "I32", "BF16", "F16", "U16", "I16", "F8_E8M0", "F8_E4M3",
             "F8_E5M2", "I8", "U8", "BOOL"]
_ST_ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2, "F16": 2,
                "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "C64": 8, "F64": 8, "I64": 8, "U64": 8}
_FLOAT_ST = {"F16", "BF16", "F32"}  # file2file_quantization.py _FLOATING_POINT_DTYPE_STRS


def _st_dtype(t: torch.Tensor) -> str:
    name = str(t.dtype).removeprefix("torch.")
    for st, tn in _ST_TO_TORCH.items():
        if tn == name:
            return st
    raise ExecutorError(f"tensor dtype {t.dtype} has no safetensors name")


@dataclass
class _HeaderEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int
    decoded: bool = False  # made by decoding a quantized source (quantkit.io.formats): not a view of the shard


def _parse_header(raw: bytes | bytearray | memoryview, size: int, where: str) -> tuple[int, list[_HeaderEntry]]:
    """(data start, entries in file order) of a safetensors file of `size` bytes whose first bytes are `raw`:
    CorruptShardError for anything safetensors itself would refuse (the rules of quantkit.io.safetensors_format,
    which every header reader of quantkit uses)."""
    parsed = parse_header(raw, size, where, CorruptShardError)
    for e in parsed.entries:
        if e.dtype not in _ST_ITEMSIZE:
            raise ExecutorError(f"{where}: tensor {e.name} has dtype {e.dtype}, which the native executor does not "
                                "handle; use --engine quark")
    return parsed.data_start, [_HeaderEntry(e.name, e.dtype, e.shape, e.begin, e.end) for e in parsed.entries]


def _read_header_file(path: Path) -> list[_HeaderEntry]:
    require_regular_file(path, fix="a shard must be a regular .safetensors file", error=CorruptShardError)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        raw = head + f.read(header_length(head, size, str(path), CorruptShardError))
    return _parse_header(raw, size, str(path))[1]


def _header_bytes(items: list[tuple[str, str, tuple[int, ...], int]]) -> tuple[bytes, list[int]]:
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


def _tensor_bytes(t: torch.Tensor) -> memoryview:
    """The tensor's bytes in memory order (CPU, contiguous), without a copy."""
    import torch

    flat = t.reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    return memoryview(flat.view(torch.uint8).numpy())  # type: ignore[arg-type]


def serialize_safetensors(tensors: dict[str, torch.Tensor], path: Path,
                          expected: dict[str, bytes] | None = None) -> tuple[int, str]:
    """Write `tensors` to `path` byte-identically to `safetensors.torch.save_file(tensors, path)` (no metadata),
    streaming from each tensor's memory. Returns (bytes written, sha256 of them). `expected` maps tensor names to
    the sha256 digest their bytes must have (checked on the bytes as written)."""
    order = sorted(tensors, key=lambda k: (_ST_ORDER.index(_st_dtype(tensors[k])), k))
    views = {k: _tensor_bytes(tensors[k].contiguous()) for k in order}
    head, _ = _header_bytes([(k, _st_dtype(tensors[k]), tuple(tensors[k].shape), views[k].nbytes) for k in order])
    digest = hashlib.sha256(head)
    written = len(head)
    with open(path, "wb") as f:
        f.write(head)
        for k in order:
            mv = views[k]
            if expected is not None and k in expected and hashlib.sha256(mv).digest() != expected[k]:
                raise ShardVerificationError(f"{path.name}: kept tensor {k} would be written with bytes that differ "
                                             "from the source (internal error)")
            f.write(mv)
            digest.update(mv)
            written += mv.nbytes
    return written, digest.hexdigest()


# --- planning --------------------------------------------------------------------------------------------------------


def is_linear_weight_name(name: str) -> bool:
    """file2file_quantization.py `_is_linear_weight_tensor`: `<module>.weight`, module not ending in "norm" and
    without "embed"."""
    if "." not in name:
        return False
    module, param = name.rsplit(".", 1)
    return param == "weight" and not module.endswith("norm") and "embed" not in module


def module_of(name: str) -> str:
    return name.removesuffix(".weight")


@functools.lru_cache(maxsize=64)
def _matcher(patterns: tuple[str, ...]) -> Callable[[str], bool]:
    """`lambda name: any(fnmatch.fnmatch(name, p) for p in patterns)`, in one set lookup and one regex: a recipe's
    exclusions are hundreds of module names, tested against every tensor of the model. (fnmatch.fnmatch is
    fnmatchcase on POSIX, where os.path.normcase changes nothing.)"""
    if os.path.normcase("A") != "A":  # case-insensitive platforms: keep fnmatch's own rule
        return lambda name: any(fnmatch.fnmatch(name, p) for p in patterns)
    literal = {p for p in patterns if not any(c in p for c in "*?[")}
    wild = [p for p in patterns if p not in literal]
    regex = re.compile("|".join(fnmatch.translate(p) for p in wild)) if wild else None
    return lambda name: name in literal or (regex is not None and regex.match(name) is not None)


def scheme_for(name: str, shape: tuple[int, ...], scheme: str, exclude: list[str],
               layer_config: dict[str, str] | None) -> str | None:
    """The scheme Quark's file-to-file path quantizes tensor `name` with, or None if it passes the tensor through."""
    if not is_linear_weight_name(name) or len(shape) < 2:
        return None
    module = module_of(name)
    if _matcher(tuple(exclude))(module):
        return None
    for pattern, s in (layer_config or {}).items():
        if fnmatch.fnmatch(module, pattern):
            return s
    return scheme


def find_shards(src: Path) -> list[str]:
    """Source shards in the order Quark 0.13 processes and indexes them (`_get_safetensor_files`: os.walk).

    With model.safetensors.index.json only the files it names, each of which must exist: the index is the truth, as
    for vLLM and transformers (Quark would quantize a stray `consolidated.safetensors` too, storing every tensor
    twice). Without one, every *.safetensors file, and none may hold a tensor another one holds (checked in _plan).
    """
    found = []
    for root, _dirs, files in os.walk(src):
        for f in files:
            if f.endswith(".safetensors"):
                found.append(os.path.relpath(os.path.join(root, f), src))
    if read_index(src) is not None:
        named = set(safetensors_files(src))
        return [f for f in found if f in named]
    nested = [f for f in found if os.sep in f]
    if nested:
        raise ExecutorError(f"{src}: safetensors files in sub-folders ({nested[0]}); Quark's file-to-file path would "
                            "flatten them into one folder: move them or quantize that folder on its own")
    if not found:
        raise ExecutorError(f"{src}: no *.safetensors files; point to a Hugging Face checkpoint folder")
    return found


def model_dtype_name(config: dict[str, Any]) -> str:
    """`_get_model_dtype_from_hf_model_config`: text_config dtype/torch_dtype, then top-level torch_dtype/dtype,
    bfloat16 when none is given or it is "auto"."""
    text: dict[str, Any] = config["text_config"] if isinstance(config.get("text_config"), dict) else {}
    name = text.get("dtype") or text.get("torch_dtype") or config.get("torch_dtype") or config.get("dtype")
    if isinstance(name, str) and name.lower() != "auto":
        return name.lower()
    return "bfloat16"


def _has_quantization_config(config: dict[str, Any]) -> bool:
    return "quantization_config" in config or any(
        isinstance(v, dict) and "quantization_config" in v for v in config.values())


@dataclass
class _Plan:
    shards: list[str]
    exclude_modules: list[str]
    source_floating_excluded: set[str]
    model_dtype: str
    sizes: dict[str, int]
    ignored: list[str] = field(default_factory=list)  # *.safetensors the index does not name


def _plan(src: Path, scheme: str, exclude: list[str], layer_config: dict[str, str] | None,
          decode: Any = None) -> _Plan:
    from quantkit.apply.native import SCHEMES

    for s in [scheme, *(layer_config or {}).values()]:
        if s not in SCHEMES:
            raise ExecutorError(f"scheme {s!r}: the native executor supports {', '.join(SCHEMES)}; use Quark for others")
    cfg_path = src / "config.json"
    require_regular_file(cfg_path, fix="config.json must be a regular file", error=ExecutorError)
    if not cfg_path.is_file():
        raise ExecutorError(f"{src}: no config.json; point to a Hugging Face checkpoint folder")
    config = read_config(src)
    if decode is None and _has_quantization_config(config):
        raise ExecutorError(f"{src}: config.json has a quantization_config (already quantized); quantize the "
                            "unquantized checkpoint, or use Quark's path, which dequantizes first")
    shards = find_shards(src)
    weight_map = read_index(src)
    placed: dict[str, str] = {}
    excluded: set[str] = set()
    floating: set[str] = set()
    sizes = {}
    for shard in shards:
        path = src / shard
        sizes[shard] = path.stat().st_size
        for e in _read_header_file(path):
            place_tensor(src, weight_map, placed, e.name, shard)
            if decode is None and e.name.endswith((".weight_packed", ".weight_shape", ".weight_scale", "_scale_inv")):
                raise ExecutorError(f"{path}: tensor {e.name} is a quantized checkpoint's; quantize the unquantized "
                                    "checkpoint, or use Quark's path, which dequantizes first")
            if is_linear_weight_name(e.name) and len(e.shape) >= 2 and _matcher(tuple(exclude))(module_of(e.name)):
                excluded.add(module_of(e.name))
                if e.dtype in _FLOAT_ST:
                    floating.add(e.name)
    check_index_complete(src, weight_map, placed)
    dtype = model_dtype_name(config)
    import torch

    if not isinstance(getattr(torch, dtype, None), torch.dtype):
        raise ExecutorError(f"{cfg_path}: dtype {dtype!r} is not a torch dtype; set torch_dtype to bfloat16, "
                            "float16 or float32")
    return _Plan(shards, sorted(excluded), floating, dtype, sizes, unindexed_weight_files(src))


# --- journal ---------------------------------------------------------------------------------------------------------


def _run_key(src: Path, scheme: str, exclude: list[str], layer_config: dict[str, str] | None,
             drop: frozenset[str], decode: Any, model_dtype: str) -> dict[str, Any]:
    """Everything besides the source shards' bytes that decides the output's bytes: a journal with another key is
    another run's, and resuming it would mix two runs' shards."""
    from quantkit import __version__

    return {"source": str(src.resolve()), "scheme": scheme, "exclude": list(exclude),
            "layer_config": dict(layer_config or {}), "drop": sorted(drop),
            "source_format": getattr(decode, "name", None) if decode is not None else None,
            "model_dtype": model_dtype, "quantkit_version": __version__}


class JournalError(ExecutorError, UnresumableError):
    """The journal of an interrupted run is unreadable, malformed, or belongs to another run."""


_Size = Annotated[int, Field(ge=0, le=2**63 - 1)]
_Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class _JournalShard(BaseModel):
    """One finished shard as the journal records it (ShardRecord plus what resume checks)."""

    model_config = ConfigDict(strict=True, extra="ignore")
    name: str
    bytes_in: _Size
    bytes_out: _Size
    sha256_in: _Sha256  # of the source bytes this shard was quantized from: resume re-hashes the source against it
    sha256_out: _Sha256
    tensors: _Size
    quantized: _Size
    seconds: float
    device: str
    resumed: bool = False
    weight_map: list[str]


class _Journal(BaseModel):
    """The journal file as read back: the run key is compared separately, field by field."""

    model_config = ConfigDict(strict=True, extra="ignore")
    quantkit_journal: int
    shards: dict[str, _JournalShard] = {}


def _read_journal(path: Path, key: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The finished shards recorded in the journal at `path`, validated at the boundary: JournalError (one line,
    naming the fix) for a journal that cannot be read, is malformed, or is another run's."""
    fix = f"start over with apply --overwrite (or remove {path.parent})"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:  # ValueError: also a 5,000-digit integer
        reason = e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__
        raise JournalError(f"{path}: not a readable quantkit journal ({reason}); {fix}") from None
    if not isinstance(raw, dict):
        raise JournalError(f"{path}: not a quantkit journal (a JSON {type(raw).__name__}, not an object); {fix}")
    version = raw.get("quantkit_journal")
    if version != JOURNAL_VERSION:
        raise JournalError(f"{path}: journal of a different run (journal format {str(version)[:20]}, this quantkit "
                           f"writes {JOURNAL_VERSION}); {fix}")
    try:
        journal = _Journal.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])[:120]
        raise JournalError(f"{path}: malformed journal ({where}: {first['msg']}); {fix}") from None
    for name, shard in journal.shards.items():
        if shard.name != name:
            raise JournalError(f"{path}: malformed journal (shard {name[:80]!r} records name {shard.name[:80]!r}); "
                               f"{fix}")
    differ = [k for k in key if raw.get(k) != key[k]]
    if differ:
        raise JournalError(f"{path}: journal of a different run ({', '.join(differ)} differ"
                           f"{'s' if len(differ) == 1 else ''}: {differ[0]} {_short_json(raw.get(differ[0]))} there, "
                           f"{_short_json(key[differ[0]])} now); {fix}")
    return {name: shard.model_dump() for name, shard in journal.shards.items()}


def _short_json(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _finished_shard_verdict(src: Path, dst: Path, name: str, entry: dict[str, Any]) -> str:
    """"kept" when the output shard and the source shard both still hash as the journal recorded; else what changed.

    The source is re-hashed in full, at disk speed: size and mtime prove nothing (a file rewritten with the same
    size and its mtime set back, os.utime, is another file), and a stale shard would make the folder differ from an
    uninterrupted run while quantkit.json recorded a hash the source no longer has."""
    out, source = dst / name, src / name
    if not out.is_file() or out.stat().st_size != entry["bytes_out"]:
        return "output"
    if source.stat().st_size != entry["bytes_in"]:
        return "source"
    if sha256_file(out) != entry["sha256_out"]:
        return "output"
    if sha256_file(source) != entry["sha256_in"]:
        return "source"
    return "kept"


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    # Compact: json's C encoder (indent would use the pure-Python one, holding the GIL for the journal's whole
    # weight map after every shard).
    tmp.write_text(json.dumps(data, separators=(",", ":")))
    os.replace(tmp, path)


# --- the pipeline ----------------------------------------------------------------------------------------------------


@dataclass
class _Loaded:
    index: int
    name: str
    host: torch.Tensor  # the slot's buffer (uint8, at least `size` bytes); goes back to the pool when written
    view: memoryview  # the shard's bytes: host[:size]
    size: int
    sha256: str
    tensors: list[tuple[_HeaderEntry, torch.Tensor]]
    data_start: int
    seconds: float


@dataclass
class _Output:
    index: int
    name: str
    loaded: _Loaded
    tensors: dict[str, torch.Tensor]
    expected: dict[str, bytes]
    quantized: int
    device: str
    seconds: float


class _Stop(Exception):
    pass


def _cuda_host_register(t: torch.Tensor, register: bool) -> bool:
    """Page-lock (or unlock) a CPU tensor's memory for every GPU (cudaHostRegisterPortable) without copying it;
    False if CUDA refuses. A failed CUDA runtime call leaves an error in the calling thread's CUDA state, so callers
    use threads that never launch kernels (the readers; `_HostBuffers.close` uses a throwaway thread)."""
    import torch

    try:
        cudart = torch.cuda.cudart()
        rc = cudart.cudaHostRegister(t.data_ptr(), t.numel(), 1) if register else \
            cudart.cudaHostUnregister(t.data_ptr())
    except Exception:  # noqa: BLE001 - no CUDA runtime binding (ROCm builds, old torch): stay pageable
        return False
    return int(getattr(rc, "value", rc)) == 0


class _HostBuffers:
    """The memory budget: one source buffer per slot, allocated on first use at the largest shard's size and reused
    (no fresh page faults per shard), optionally page-locked so that a GPU copies from it asynchronously."""

    def __init__(self, slots: int, capacity: int, pin: bool) -> None:
        self.free: queue.Queue[torch.Tensor | None] = queue.Queue()
        for _ in range(slots):
            self.free.put(None)
        self.capacity = max(capacity, 1)
        # Below 1 MiB, buffers may share pages, which CUDA refuses to lock twice; such shards copy in no time.
        self.pin = pin and self.capacity >= _MB
        self.pinned: list[torch.Tensor] = []
        self.seen: set[int] = set()
        self.lock = threading.Lock()

    def acquire(self, stop: threading.Event) -> torch.Tensor | None:
        """A free buffer, waiting for one; None once `stop` is set."""
        import torch

        while True:
            try:
                buf = self.free.get(timeout=0.1)
            except queue.Empty:
                if stop.is_set():
                    return None
                continue
            if buf is None:
                buf = torch.empty(self.capacity, dtype=torch.uint8)
            return buf

    def pin_once(self, buf: torch.Tensor) -> None:
        """Page-lock `buf` on its first use, after the read that filled it: CUDA's start-up (about a second, in
        the workers) then overlaps the first reads instead of delaying them."""
        with self.lock:
            if not self.pin or buf.data_ptr() in self.seen:
                return
            self.seen.add(buf.data_ptr())
        if _cuda_host_register(buf, True):
            with self.lock:
                self.pinned.append(buf)
        else:
            self.pin = False  # one refusal is enough: the rest stay pageable (slower, still correct)

    def release(self, buf: torch.Tensor) -> None:
        self.free.put(buf)

    def close(self) -> None:
        def unregister() -> None:
            for buf in self.pinned:
                _cuda_host_register(buf, False)

        if self.pinned:
            t = threading.Thread(target=unregister, name="quantkit-unpin", daemon=True)
            t.start()
            t.join()
            self.pinned.clear()


def _decoded(loaded: _Loaded, fmt: Any) -> _Loaded:
    """A quantized source shard (FP8-block, INT4 pack-quantized) as its decoded BF16 tensors, exactly as
    quantkit.io.formats.decode_tensors decodes them; tensors stored unquantized stay the very views of the shard.
    The decoded tensors live outside the shard buffer, so memory per shard in flight grows by their size."""
    from quantkit.io.formats import decode_tensors

    source = {e.name: t for e, t in loaded.tensors}
    entries = {e.name: e for e, _ in loaded.tensors}
    tensors = []
    for name, t in decode_tensors(fmt, source).items():
        if name in source and t is source[name]:
            tensors.append((entries[name], t))
        else:
            t = t.contiguous()
            nbytes = t.numel() * t.element_size()
            tensors.append((_HeaderEntry(name, _st_dtype(t), tuple(t.shape), 0, nbytes, decoded=True), t))
    loaded.tensors = tensors
    return loaded


def _load_shard(src: Path, name: str, index: int, host: torch.Tensor) -> _Loaded:
    """Read shard `name` into `host` (a uint8 buffer at least its size), hashing it; its tensors as views."""
    import torch

    t0 = time.perf_counter()
    path = src / name
    hasher = hashlib.sha256()
    chunks: queue.Queue[memoryview | None] = queue.Queue()

    def hash_chunks() -> None:  # sha256 of each chunk while the next one is read (both release the GIL)
        while (chunk := chunks.get()) is not None:
            hasher.update(chunk)

    hashing = threading.Thread(target=hash_chunks, name="quantkit-sha256", daemon=True)
    hashing.start()
    got = 0
    try:
        with open(path, "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            if size > host.numel():
                raise CorruptShardError(f"{path}: the file grew from {host.numel()} to {size} bytes after the run "
                                        "started; rerun")
            view = memoryview(host.numpy())[:size]  # type: ignore[arg-type]
            while got < size:
                n = f.readinto(view[got:got + _READ_CHUNK])
                if not n:
                    break
                chunks.put(view[got:got + n])
                got += n
    finally:
        chunks.put(None)
        hashing.join()
    if got != size:
        raise CorruptShardError(f"{path}: read {got} of {size} bytes; the file changed while reading; rerun")
    sha = hasher.hexdigest()
    start, entries = _parse_header(view, size, str(path))
    tensors = []
    for e in entries:
        dtype = getattr(torch, _ST_TO_TORCH[e.dtype])
        offset = start + e.begin
        if e.end == e.begin:
            t = torch.empty(e.shape, dtype=dtype)
        elif offset % _ST_ITEMSIZE[e.dtype]:  # misaligned: copy rather than view
            t = host[offset:start + e.end].clone().view(dtype).reshape(e.shape)
        else:
            t = host[offset:start + e.end].view(dtype).reshape(e.shape)
        tensors.append((e, t))
    return _Loaded(index, name, host, view, size, sha, tensors, start, time.perf_counter() - t0)


def _first_non_finite(t: torch.Tensor) -> tuple[list[int], str]:
    import torch

    bad = (~torch.isfinite(t)).nonzero()
    if bad.numel() == 0:
        return [], "finite"
    idx = bad[0].tolist()
    v = t[tuple(idx)].item()
    return idx, "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")


@dataclass
class _Settings:
    src: Path
    dst: Path
    scheme: str
    exclude: list[str]
    layer_config: dict[str, str] | None
    plan: _Plan
    drop: frozenset[str] = frozenset()


@dataclass
class _Job:
    kind: Literal["quantize", "cast", "keep"]
    entry: _HeaderEntry
    tensor: torch.Tensor
    scheme: str | None = None


def _jobs(loaded: _Loaded, s: _Settings) -> list[_Job]:
    """What Quark's per-shard loop (`_quantize_and_save_safetensor_shard`) does with each tensor, in its order."""
    import torch

    model_dtype = getattr(torch, s.plan.model_dtype)
    jobs = []
    for e, t in loaded.tensors:
        if e.name in s.drop:  # left out of the output on purpose (a recipe's `mtp: drop`)
            continue
        target = scheme_for(e.name, e.shape, s.scheme, s.exclude, s.layer_config)
        if target is not None:
            jobs.append(_Job("quantize", e, t, target))
        elif is_linear_weight_name(e.name) and e.name not in s.plan.source_floating_excluded and \
                t.is_floating_point() and t.dtype != model_dtype:
            jobs.append(_Job("cast", e, t))
        else:
            jobs.append(_Job("keep", e, t))
    return jobs


def _non_finite_error(name: str, w: torch.Tensor, shard: str) -> NonFiniteWeightError:
    idx, kind = _first_non_finite(w)
    return NonFiniteWeightError(f"{name}[{', '.join(map(str, idx))}] is {kind} (shard {shard}); fix or re-download "
                                "the source weights")


def _check_layout(name: str, shape: tuple[int, ...], scheme: str, q: torch.Tensor, scale: torch.Tensor) -> None:
    from quantkit.apply.native import expected_layout

    layout = expected_layout(shape, scheme)
    for suffix, t in (("", q), ("_scale", scale)):
        if (_st_dtype(t), tuple(t.shape)) != layout[suffix]:
            raise ShardVerificationError(f"{name}{suffix}: {scheme} gave {_st_dtype(t)} {tuple(t.shape)}, "
                                         f"expected {layout[suffix]} (internal error)")


def _bad_scale(scale: torch.Tensor, scheme: str) -> torch.Tensor:
    """A 0-dim bool tensor on the scale's device: some scale is not finite and positive (E8M0 0xFF is NaN)."""
    import torch

    return (scale == 0xFF).any() if scheme == "mxfp4" else ~(torch.isfinite(scale) & (scale > 0)).all()


def _finish(loaded: _Loaded, jobs: list[_Job], results: list[Any], device: str, t0: float) -> _Output:
    """The output shard's tensors in Quark's insertion order (it is the index's order): `<name>`, `<name>_scale`."""
    tensors: dict[str, torch.Tensor] = {}
    expected: dict[str, bytes] = {}
    quantized = 0
    for job, result in zip(jobs, results, strict=True):
        name = job.entry.name
        if job.kind == "quantize":
            tensors[name], tensors[name + "_scale"] = result
            quantized += 1
        elif job.kind == "cast":
            tensors[name] = result
        else:
            tensors[name] = job.tensor
            expected[name] = result
    return _Output(loaded.index, loaded.name, loaded, tensors, expected, quantized, device, time.perf_counter() - t0)


def _keep_digest(loaded: _Loaded, job: _Job) -> bytes:
    """sha256 of the bytes the header names, independently of the tensor view that will be written (a decoded
    tensor has no bytes in the shard: its digest is of the decoded values, so the write is still checked)."""
    e = job.entry
    if e.decoded:
        return hashlib.sha256(_tensor_bytes(job.tensor)).digest()
    return hashlib.sha256(loaded.view[loaded.data_start + e.begin:loaded.data_start + e.end]).digest()


def _process(loaded: _Loaded, s: _Settings, device: str, pool: ThreadPoolExecutor | None) -> _Output:
    """Quark's per-shard loop (`_quantize_and_save_safetensor_shard`) on one loaded shard, one tensor at a time
    (the CPU path: `pool` runs one tensor per core)."""
    import torch

    from quantkit.apply.native import NonFiniteWeight, quantize_weight

    t0 = time.perf_counter()
    model_dtype = getattr(torch, s.plan.model_dtype)
    jobs = _jobs(loaded, s)

    def quantize(name: str, w: torch.Tensor, scheme: str) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            q, scale = quantize_weight(w.to(device) if device != "cpu" else w, scheme, finite_only=True)
        except NonFiniteWeight:
            raise _non_finite_error(name, w, loaded.name) from None
        except ValueError as e:
            raise ExecutorError(f"{name} in {loaded.name}: cannot quantize with {scheme}: {e}") from None
        q, scale = q.cpu(), scale.cpu()
        _check_layout(name, tuple(w.shape), scheme, q, scale)
        if bool(_bad_scale(scale, scheme)):
            raise ShardVerificationError(f"{name}_scale: a scale is not finite and positive (internal error)")
        return q.contiguous(), scale.contiguous()

    def run(job: _Job) -> Any:
        if job.kind == "quantize":
            assert job.scheme is not None
            return quantize(job.entry.name, job.tensor, job.scheme)
        if job.kind == "cast":
            return job.tensor.to(model_dtype)
        return _keep_digest(loaded, job)

    results = list(pool.map(run, jobs)) if pool is not None else [run(j) for j in jobs]
    return _finish(loaded, jobs, results, device, t0)


def _host_empty(nbytes: int, pinned: bool) -> torch.Tensor:
    import torch

    if pinned:
        with contextlib.suppress(RuntimeError):
            return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    return torch.empty(nbytes, dtype=torch.uint8)


def _process_device(loaded: _Loaded, s: _Settings, device: str) -> _Output:
    """The same shard on a GPU, batched: per-tensor copies, kernel launches and synchronisations cost more than the
    math for the thousands of small expert tensors of an MoE checkpoint.

    The tensors to quantize are grouped by (scheme, dtype, last dim) — 2-D ones only for PTPC-FP8, whose channel
    is dim 0 — and each group's rows are copied (asynchronously, from the page-locked source buffer) into one device
    tensor, quantized in one call and split back. Both schemes quantize every row on its own (MXFP4: groups of 32
    along the last dim; PTPC-FP8: one scale per output channel), so a stacked tensor's rows give exactly each
    tensor's own bytes. All results are copied into one host buffer; the shard costs one final synchronisation
    (plus the few the quantizers make per batch to check for NaN/Inf). Works on CPU too (for tests).
    """
    import torch

    from quantkit.apply.native import NonFiniteWeight, expected_layout, quantize_weight

    t0 = time.perf_counter()
    dev = torch.device(device)
    model_dtype = getattr(torch, s.plan.model_dtype)
    jobs = _jobs(loaded, s)
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, job in enumerate(jobs):
        if job.kind == "quantize":
            e = job.entry
            rowwise = job.scheme == "mxfp4" or len(e.shape) == 2
            key = (job.scheme, e.dtype, e.shape[-1]) if rowwise else (job.scheme, e.name)
            groups.setdefault(key, []).append(i)
    batches: list[tuple[bool, list[int]]] = []
    for key, members in groups.items():
        batch: list[int] = []
        nbytes = 0
        for i in members:
            n = jobs[i].entry.end - jobs[i].entry.begin
            if batch and nbytes + n > _DEVICE_BATCH_BYTES:
                batches.append((len(key) == 3, batch))
                batch, nbytes = [], 0
            batch.append(i)
            nbytes += n
        batches.append((len(key) == 3, batch))

    # One host buffer for every result, each batch's weights then its scales, 64-byte aligned.
    def layout_bytes(i: int, suffix: str) -> int:
        job = jobs[i]
        assert job.scheme is not None
        dtype, shape = expected_layout(job.entry.shape, job.scheme)[suffix]
        return math.prod(shape) * _ST_ITEMSIZE[dtype]

    offsets = []
    total = 0
    for _, batch in batches:
        q_off = total
        total += -(-sum(layout_bytes(i, "") for i in batch) // 64) * 64
        s_off = total
        total += -(-sum(layout_bytes(i, "_scale") for i in batch) // 64) * 64
        offsets.append((q_off, s_off))
    out_host = _host_empty(total, dev.type == "cuda" and total > 0)
    results: list[Any] = [None] * len(jobs)
    flags = []
    try:
        for (rowwise, batch), (q_off, s_off) in zip(batches, offsets, strict=True):
            first = jobs[batch[0]]
            scheme = first.scheme
            assert scheme is not None
            cols = first.entry.shape[-1]
            if rowwise:
                rows = [math.prod(jobs[i].entry.shape) // max(cols, 1) for i in batch]
                x = torch.empty((sum(rows), cols), dtype=first.tensor.dtype, device=dev)
                r = 0
                for i, n in zip(batch, rows, strict=True):
                    x[r:r + n].copy_(jobs[i].tensor.reshape(n, cols), non_blocking=True)
                    r += n
            else:
                rows = [first.entry.shape[0]]
                x = first.tensor.to(dev, non_blocking=True)
            try:
                q, scale = quantize_weight(x, scheme, finite_only=True)
            except NonFiniteWeight:
                for i in batch:
                    if _first_non_finite(jobs[i].tensor)[0]:
                        raise _non_finite_error(jobs[i].entry.name, jobs[i].tensor, loaded.name) from None
                raise
            except ValueError as e:
                raise ExecutorError(f"{first.entry.name} in {loaded.name}: cannot quantize with {scheme}: {e}") \
                    from None
            del x
            flags.append(_bad_scale(scale, scheme))
            q_bytes, s_bytes = q.reshape(-1).view(torch.uint8), scale.reshape(-1).view(torch.uint8)
            q_host = out_host[q_off:q_off + q_bytes.numel()]
            s_host = out_host[s_off:s_off + s_bytes.numel()]
            q_host.copy_(q_bytes, non_blocking=True)
            s_host.copy_(s_bytes, non_blocking=True)
            q_host, s_host = q_host.view(q.dtype).view(q.shape), s_host.view(scale.dtype).view(scale.shape)
            r = 0
            for i, n in zip(batch, rows, strict=True):
                shape = jobs[i].entry.shape
                if rowwise:
                    qi, si = q_host[r:r + n].reshape(*shape[:-1], q.shape[-1]), s_host[r:r + n]
                else:
                    qi, si = q_host, s_host
                _check_layout(jobs[i].entry.name, shape, scheme, qi, si)
                results[i] = (qi, si)
                r += n
        # CPU work while the last copies run.
        for i, job in enumerate(jobs):
            if job.kind == "cast":
                results[i] = job.tensor.to(model_dtype)
            elif job.kind == "keep":
                results[i] = _keep_digest(loaded, job)
        bad = bool(torch.stack(flags).any().item()) if flags else False  # synchronises: every copy is done
    except BaseException:
        if dev.type == "cuda":  # the source buffer goes back to the pool: no copy may still read it
            torch.cuda.synchronize(dev)
        raise
    if bad:
        raise ShardVerificationError(f"{loaded.name}: a scale is not finite and positive (internal error)")
    return _finish(loaded, jobs, results, device, t0)


def quantize_checkpoint(src: Path, dst: Path, *, scheme: str, exclude: list[str],
                        layer_config: dict[str, str] | None, devices: list[str], resume: bool = False,
                        progress: Callable[[ShardEvent], None] | None = None,
                        readers: int | None = None, decode: Any = None,
                        drop: set[str] | None = None, copy_aux: bool = True) -> ExecutorReport:
    """Quantize the safetensors checkpoint `src` into `dst`, shard by shard, byte-identical to Quark 0.13's
    `ModelQuantizer(LLMTemplate.get(t).get_config(scheme=scheme, exclude_layers=exclude,
    layer_config=layer_config)).direct_quantize_checkpoint(src, dst, device=...)`.

    `exclude` are Quark's fnmatch patterns on checkpoint module names; `layer_config` maps module patterns to
    schemes (first match wins). `devices`: torch devices, one worker each ("cpu", "cuda:0", ...). With
    `resume=True` the shards a previous, interrupted run recorded in dst's journal (whose output and source both
    still hash as recorded) are kept; all others are redone. Only one process may write `dst` at a time: `apply`
    holds the output's lock (quantkit.io.lock); a direct caller must do the same. `progress` is called in the caller's thread. `readers`: read
    streams (default 1 for CPU-only runs, 4 when a GPU quantizes); fewer are used when their buffers would not fit
    in half of the available memory (see the module's memory bound). `copy_aux=False` leaves the source's other
    files out (quantkit apply copies its own allow-list, quantkit.io.files.AUX_FILES).
    """
    import torch

    t_start = time.perf_counter()
    src, dst = Path(src), Path(dst)
    if not devices:
        raise ExecutorError("devices: give at least one, e.g. ['cpu'] or ['cuda:0', 'cuda:1']")
    if readers is not None and readers < 1:
        raise ExecutorError(f"readers={readers}: give at least 1 read stream")
    for d in devices:
        try:
            dev = torch.device(d)
        except RuntimeError:
            raise ExecutorError(f"device {d!r}: not a torch device; use cpu, cuda or cuda:<n>") from None
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ExecutorError(f"device {d}: no CUDA/ROCm GPU visible to torch; use cpu")
    if src.resolve() == dst.resolve():
        raise ExecutorError(f"output {dst} is the source folder; choose another output folder")
    if copy_aux:
        _check_aux_files(src)
    plan = _plan(src, scheme, exclude, layer_config, decode)
    settings = _Settings(src, dst, scheme, list(exclude), layer_config, plan, frozenset(drop or ()))
    key = _run_key(src, scheme, exclude, layer_config, settings.drop, decode, plan.model_dtype)
    journal_path = dst / JOURNAL_NAME
    journal: dict[str, Any] = {"quantkit_journal": JOURNAL_VERSION, **key, "shards": {}}
    if dst.exists() and any(dst.iterdir()):
        if not resume:
            raise ExecutorError(f"output {dst} exists and is not empty; remove it, or pass resume=True to continue "
                                "an interrupted run")
        if not journal_path.is_file():
            raise ExecutorError(f"output {dst} holds no {JOURNAL_NAME}, so it is not an interrupted run to resume; "
                                "remove it or choose another output folder")
        journal["shards"] = _read_journal(journal_path, key)
    dst.mkdir(parents=True, exist_ok=True)
    for stale in [*dst.glob("*" + _PARTIAL_SUFFIX), dst / (JOURNAL_NAME + ".tmp")]:
        stale.unlink(missing_ok=True)
    # Shards of an earlier source layout (a shard renamed or removed since the interruption) must not survive.
    for stale in dst.glob("*.safetensors"):
        if stale.name not in plan.shards:
            stale.unlink()
    journal["shards"] = {k: v for k, v in journal["shards"].items() if k in plan.shards}

    total = len(plan.shards)
    emit_queue: queue.Queue[ShardEvent] = queue.Queue()
    report = ExecutorReport(source=str(src), output=str(dst), scheme=scheme, devices=list(devices),
                            exclude=plan.exclude_modules, ignored_files=plan.ignored)
    records: dict[str, ShardRecord] = {}
    weight_maps: dict[str, list[str]] = {}

    # Resume: keep what a previous run finished only if its output and its source still hash as it recorded (both
    # re-hashed in full, in parallel streams, as the readers read: see _finished_shard_verdict).
    finished = [(i, name, journal["shards"][name]) for i, name in enumerate(plan.shards)
                if resume and name in journal["shards"]]
    with ThreadPoolExecutor(max_workers=max(1, min(_GPU_READERS, len(finished))),
                            thread_name_prefix="quantkit-rehash") as hashers:
        verdicts = dict(zip((name for _, name, _ in finished),
                            hashers.map(lambda f: _finished_shard_verdict(src, dst, f[1], f[2]), finished),
                            strict=True))
    todo = []
    for i, name in enumerate(plan.shards):
        entry = journal["shards"].get(name)
        verdict = verdicts.get(name)
        if entry is not None and verdict == "kept":
            records[name] = ShardRecord(name, entry["bytes_in"], entry["bytes_out"], entry["sha256_in"],
                                        entry["sha256_out"], entry["tensors"], entry["quantized"], 0.0,
                                        entry["device"], resumed=True)
            weight_maps[name] = entry["weight_map"]
            emit_queue.put(ShardEvent("resumed", name, i, total, entry["device"], entry["bytes_in"],
                                      entry["bytes_out"]))
        else:
            if verdict == "source":
                report.source_changed.append(name)
                emit_queue.put(ShardEvent("source-changed", name, i, total))
            journal["shards"].pop(name, None)
            (dst / name).unlink(missing_ok=True)
            todo.append((i, name))
    _write_json_atomic(journal_path, journal)

    cpu_threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    saved_threads = torch.get_num_threads()
    uses_cpu = any(torch.device(d).type == "cpu" for d in devices)
    uses_gpu = not all(torch.device(d).type == "cpu" for d in devices)
    pool = ThreadPoolExecutor(max_workers=cpu_threads, thread_name_prefix="quantkit-cpu") if uses_cpu else None
    stop = threading.Event()
    errors: list[BaseException] = []
    # Memory budget (see the module docstring): one buffer per shard alive at once (being read, queued, quantized
    # or written).
    largest = max((plan.sizes[name] for _, name in todo), default=1)
    n_readers = max(1, min(readers or (_GPU_READERS if uses_gpu else 1), len(todo)))
    half_free = _available_memory() // 2
    while n_readers > 1 and (n_readers + len(devices) + 1) * largest > half_free:
        n_readers -= 1
    slots = n_readers + len(devices) + 1
    pin = uses_gpu and torch.cuda.is_available() and slots * largest <= _PIN_FRACTION * _total_memory()
    buffers = _HostBuffers(slots, largest, pin)
    work: queue.Queue[_Loaded | None] = queue.Queue()
    results: queue.Queue[_Output | None] = queue.Queue()

    def fail(e: BaseException) -> None:
        errors.append(e)
        stop.set()

    pending: queue.Queue[tuple[int, str]] = queue.Queue()
    for item in todo:
        pending.put(item)
    readers_left = [n_readers]
    readers_lock = threading.Lock()

    def reader() -> None:
        try:
            while True:
                host = buffers.acquire(stop)
                if host is None:
                    return
                try:
                    i, name = pending.get_nowait()
                except queue.Empty:
                    buffers.release(host)
                    return
                if stop.is_set():
                    buffers.release(host)
                    return
                try:
                    loaded = _load_shard(src, name, i, host)
                    if decode is not None:
                        loaded = _decoded(loaded, decode)
                    buffers.pin_once(host)
                    work.put(loaded)
                    del loaded
                except BaseException:
                    buffers.release(host)
                    raise
        except BaseException as e:  # noqa: BLE001 - reported by the caller's thread
            fail(e)
        finally:
            with readers_lock:
                readers_left[0] -= 1
                if readers_left[0] == 0:  # the last reader out tells every worker to finish
                    for _ in devices:
                        work.put(None)

    def worker(device: str) -> None:
        try:
            if torch.device(device).type == "cuda" and torch.device(device).index is not None:
                torch.cuda.set_device(torch.device(device))
            while True:
                loaded = work.get()
                if loaded is None:
                    return
                if stop.is_set():
                    buffers.release(loaded.host)
                    continue
                emit_queue.put(ShardEvent("start", loaded.name, loaded.index, total, device, loaded.size))
                try:
                    if torch.device(device).type == "cpu":
                        out = _process(loaded, settings, device, pool)
                    else:
                        out = _process_device(loaded, settings, device)
                except BaseException:
                    buffers.release(loaded.host)
                    raise
                results.put(out)
                del loaded, out  # the writer owns them now: holding them here would keep the shard in memory
        except BaseException as e:  # noqa: BLE001
            fail(e)
        finally:
            results.put(None)

    def writer() -> None:
        finished_workers = 0
        while finished_workers < len(devices):
            out = results.get()
            if out is None:
                finished_workers += 1
                continue
            try:
                t0 = time.perf_counter()
                final = dst / out.name
                partial = dst / (out.name + _PARTIAL_SUFFIX)
                try:
                    nbytes, sha_out = serialize_safetensors(out.tensors, partial, out.expected)
                except BaseException:
                    partial.unlink(missing_ok=True)
                    raise
                os.replace(partial, final)
                loaded = out.loaded
                seconds = loaded.seconds + out.seconds + time.perf_counter() - t0
                rec = ShardRecord(out.name, loaded.size, nbytes, loaded.sha256, sha_out, len(out.tensors),
                                  out.quantized, round(seconds, 3), out.device)
                names = list(out.tensors)
                host = loaded.host
                del out, loaded  # no view of the buffer may outlive this: the next shard is read into it
                buffers.release(host)
                journal["shards"][rec.name] = {**asdict(rec), "weight_map": names}
                _write_json_atomic(journal_path, journal)
                records[rec.name] = rec
                weight_maps[rec.name] = names
                emit_queue.put(ShardEvent("done", rec.name, plan.shards.index(rec.name), total, rec.device,
                                          rec.bytes_in, rec.bytes_out, rec.seconds))
            except BaseException as e:  # noqa: BLE001
                fail(e)

    threads = [threading.Thread(target=reader, name=f"quantkit-reader-{k}", daemon=True) for k in range(n_readers)]
    threads.append(threading.Thread(target=writer, name="quantkit-writer", daemon=True))
    threads += [threading.Thread(target=worker, args=(d,), name=f"quantkit-{d}", daemon=True) for d in devices]
    try:
        # CPU: parallel across tensors instead, cheaper than intra-op threads per step. GPU only: the CPU does no
        # tensor math but rare casts; many idle intra-op threads only spin after each small CPU op.
        torch.set_num_threads(1 if uses_cpu else min(4, cpu_threads))
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads) or not emit_queue.empty():
            with contextlib.suppress(queue.Empty):
                event = emit_queue.get(timeout=0.05)
                if progress is not None:
                    progress(event)
    finally:
        stop.set()  # no-op after a clean run; after an error or an interrupt it winds the threads down
        for t in threads:
            t.join()
        if pool is not None:
            pool.shutdown(wait=True)
        page_locked = bool(buffers.pinned)
        buffers.close()
        torch.set_num_threads(saved_threads)
        host_empty_cache = getattr(torch._C, "_host_emptyCache", None)
        if uses_gpu and host_empty_cache is not None:
            host_empty_cache()  # the output shards' page-locked memory, cached by torch
    if errors:
        first = errors[0]
        if isinstance(first, QuantkitError):
            raise first
        raise ExecutorError(f"quantizing {src} failed: {type(first).__name__}: {first}") from first

    # All shards are in place: the files Quark writes after its shard loop, in its order.
    if copy_aux:
        _copy_aux_files(src, dst)
    weight_map: dict[str, str] = {}
    for name in plan.shards:
        for tensor in weight_maps[name]:
            weight_map[tensor] = name
    total_size = sum((dst / name).stat().st_size for name in plan.shards if weight_maps[name])
    with open(dst / "model.safetensors.index.json", "w") as f:
        json.dump({"metadata": {"total_size": total_size}, "weight_map": weight_map}, f, ensure_ascii=False, indent=4)
    _write_config(src, dst, scheme, plan.exclude_modules, layer_config)
    journal_path.unlink(missing_ok=True)

    report.shards = [records[name] for name in plan.shards]
    report.resumed_shards = sum(r.resumed for r in report.shards)
    report.total_seconds = round(time.perf_counter() - t_start, 3)
    done_bytes = sum(r.bytes_in for r in report.shards if not r.resumed)
    report.mb_per_s = round(done_bytes / _MB / max(report.total_seconds, 1e-9), 1)
    report.peak_rss_mb = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    report.readers, report.page_locked = n_readers, page_locked
    return report


def _meminfo(key: str) -> int | None:
    with contextlib.suppress(OSError, ValueError, StopIteration), open("/proc/meminfo") as f:
        return int(next(line for line in f if line.startswith(key + ":")).split()[1]) * 1024
    return None


def _total_memory() -> int:
    total = _meminfo("MemTotal")
    return total if total is not None else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _available_memory() -> int:
    """MemAvailable (free plus reclaimable page cache), not MemFree: the source's own pages fill the cache."""
    available = _meminfo("MemAvailable")
    return available if available is not None else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def _copy_aux_files(src: Path, dst: Path) -> None:
    """file2file_quantization.py `_copy_json_and_py_files`: every folder and every file but *.safetensors and
    README*.md, in os.listdir order. Unlike Quark, no *.safetensors inside a folder either: only the index's shards
    are weights of the output (a stray copy of them would be loaded by anything that globs the folder).

    Unlike Quark, nothing that could leak or hang is copied: every entry, and every entry of every folder copied, is
    checked first (quantkit.io.files.check_entry), and a link that leaves the source (or its HF cache repo's blobs),
    a link to a folder or a link loop, a pipe or a device is refused (Quark follows links: `self -> .` copies the
    folder into itself until paths get too long, `notes.txt -> ~/.cache/huggingface/token` copies the token)."""
    roots = link_roots(src)
    for name in os.listdir(src):
        s, d = src / name, dst / name
        if check_entry(s, roots, ExecutorError) == "folder":
            copy_tree_checked(s, d, roots, ExecutorError, skip="*.safetensors")
            continue
        if name.endswith(".safetensors") or name == JOURNAL_NAME:
            continue
        if name.lower().endswith(".md") and "readme" in name.lower():
            continue
        shutil.copy2(os.path.realpath(s), d)


def _check_aux_files(src: Path) -> None:
    """Before any work: what `_copy_aux_files` will copy, checked as it will be (the source's top level and every
    folder in it), so that a link out of the source or a pipe is refused before the first shard."""
    roots = link_roots(src)
    entries = scan_folder(src, inside=True, hidden=True, error=ExecutorError)
    for name in entries.folders:
        check_tree(src / name, roots, ExecutorError)


def _remove_quantization_config(config: dict[str, Any]) -> None:
    """file2file_quantization.py `_remove_quantization_config`."""
    for key in [k for k in config if k == "quantization_config"]:
        del config[key]
    for value in config.values():
        if isinstance(value, dict):
            _remove_quantization_config(value)


def _write_config(src: Path, dst: Path, scheme: str, exclude_modules: list[str],
                  layer_config: dict[str, str] | None) -> None:
    """file2file_quantization.py `_export_quant_config`."""
    from quantkit.apply.native import quark_quantization_config

    config = read_config(src)
    _remove_quantization_config(config)
    config["quantization_config"] = quark_quantization_config(scheme, exclude_modules, layer_config)
    with open(dst / "config.json", "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=4)
