"""One shard through the per-shard executor: read it (hashing it) into a host buffer, decode a quantized
source, decide each tensor's job as Quark's shard loop does, and quantize: per tensor on CPU (`process_cpu`),
batched by shape on a GPU (`process_device`)."""

from __future__ import annotations

import hashlib
import math
import os
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from quantkit.apply.shards.errors import (
    CorruptShardError,
    ExecutorError,
    NonFiniteWeightError,
    ShardVerificationError,
)
from quantkit.apply.shards.f2f import ShardPlan, is_linear_weight_name, parse_shard_header, scheme_for
from quantkit.apply.shards.memory import host_empty
from quantkit.io.safetensors import DTYPES, HeaderEntry, st_dtype, tensor_bytes, tensor_nbytes
from quantkit.schemes import SCHEMES, NonFiniteWeight, expected_layout, quantize_weight

if TYPE_CHECKING:
    import torch

_READ_CHUNK = 16 * 1024 * 1024
_DEVICE_BATCH_BYTES = 1 << 30  # source bytes per batched quantize call on a GPU (its temporaries are ~3x that)


@dataclass
class Loaded:
    index: int
    name: str
    host: torch.Tensor  # the slot's buffer (uint8, at least `size` bytes); goes back to the pool when written
    view: memoryview  # the shard's bytes: host[:size]
    size: int
    sha256: str
    tensors: list[tuple[HeaderEntry, torch.Tensor]]
    data_start: int
    seconds: float


@dataclass
class Output:
    index: int
    name: str
    loaded: Loaded
    tensors: dict[str, torch.Tensor]
    expected: dict[str, bytes]
    quantized: int
    device: str
    seconds: float


def decoded(loaded: Loaded, fmt: Any) -> Loaded:
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
            entry = HeaderEntry(name, st_dtype(t, ExecutorError), tuple(t.shape), 0, nbytes, decoded=True)
            tensors.append((entry, t))
    loaded.tensors = tensors
    return loaded


def load_shard(src: Path, name: str, index: int, host: torch.Tensor) -> Loaded:
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
    start, entries = parse_shard_header(view, size, str(path))
    tensors = []
    for e in entries:
        info = DTYPES[e.dtype]
        assert info.torch is not None  # parse_shard_header refused the dtypes without a torch name
        dtype = getattr(torch, info.torch)
        offset = start + e.begin
        if e.end == e.begin:
            t = torch.empty(e.shape, dtype=dtype)
        elif offset % (info.bits // 8):  # misaligned: copy rather than view
            t = host[offset:start + e.end].clone().view(dtype).reshape(e.shape)
        else:
            t = host[offset:start + e.end].view(dtype).reshape(e.shape)
        tensors.append((e, t))
    return Loaded(index, name, host, view, size, sha, tensors, start, time.perf_counter() - t0)


def _first_non_finite(t: torch.Tensor) -> tuple[list[int], str]:
    import torch

    bad = (~torch.isfinite(t)).nonzero()
    if bad.numel() == 0:
        return [], "finite"
    idx = bad[0].tolist()
    v = t[tuple(idx)].item()
    return idx, "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")


@dataclass
class Settings:
    src: Path
    dst: Path
    scheme: str
    exclude: list[str]
    layer_config: dict[str, str] | None
    plan: ShardPlan
    drop: frozenset[str] = frozenset()


@dataclass
class _Job:
    kind: Literal["quantize", "cast", "keep"]
    entry: HeaderEntry
    tensor: torch.Tensor
    scheme: str | None = None


def _jobs(loaded: Loaded, s: Settings) -> list[_Job]:
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
    layout = expected_layout(shape, scheme)
    for suffix, t in (("", q), ("_scale", scale)):
        dtype = st_dtype(t, ExecutorError)
        if (dtype, tuple(t.shape)) != layout[suffix]:
            raise ShardVerificationError(f"{name}{suffix}: {scheme} gave {dtype} {tuple(t.shape)}, "
                                         f"expected {layout[suffix]} (internal error)")


def _bad_scale(scale: torch.Tensor, scheme: str) -> torch.Tensor:
    """A 0-dim bool tensor on the scale's device: some scale is not finite and positive (the scheme's own test)."""
    bad_scale = SCHEMES[scheme].bad_scale
    assert bad_scale is not None, scheme
    return bad_scale(scale)


def _finish(loaded: Loaded, jobs: list[_Job], results: list[Any], device: str, t0: float) -> Output:
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
    return Output(loaded.index, loaded.name, loaded, tensors, expected, quantized, device, time.perf_counter() - t0)


def _keep_digest(loaded: Loaded, job: _Job) -> bytes:
    """sha256 of the bytes the header names, independently of the tensor view that will be written (a decoded
    tensor has no bytes in the shard: its digest is of the decoded values, so the write is still checked)."""
    e = job.entry
    if e.decoded:
        return hashlib.sha256(tensor_bytes(job.tensor)).digest()
    return hashlib.sha256(loaded.view[loaded.data_start + e.begin:loaded.data_start + e.end]).digest()


def process_cpu(loaded: Loaded, s: Settings, device: str, pool: ThreadPoolExecutor | None) -> Output:
    """Quark's per-shard loop (`_quantize_and_save_safetensor_shard`) on one loaded shard, one tensor at a time
    (the CPU path: `pool` runs one tensor per core)."""
    import torch

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


def process_device(loaded: Loaded, s: Settings, device: str) -> Output:
    """The same shard on a GPU, batched: per-tensor copies, kernel launches and synchronisations cost more than the
    math for the thousands of small expert tensors of an MoE checkpoint.

    The tensors to quantize are grouped by (scheme, dtype, last dim) as the scheme's `batching` allows — any rank
    for MXFP4 ("rows"), 2-D ones only for PTPC-FP8 ("rows-2d"), whose channel is dim 0 — and each group's rows are copied (asynchronously, from the page-locked source buffer) into one device
    tensor, quantized in one call and split back. Both schemes quantize every row on its own (MXFP4: groups of 32
    along the last dim; PTPC-FP8: one scale per output channel), so a stacked tensor's rows give exactly each
    tensor's own bytes. All results are copied into one host buffer; the shard costs one final synchronisation
    (plus the few the quantizers make per batch to check for NaN/Inf). Works on CPU too (for tests).
    """
    import torch

    t0 = time.perf_counter()
    dev = torch.device(device)
    model_dtype = getattr(torch, s.plan.model_dtype)
    jobs = _jobs(loaded, s)
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, job in enumerate(jobs):
        if job.kind == "quantize":
            e = job.entry
            batching = SCHEMES[job.scheme].batching if job.scheme is not None else "whole"
            rowwise = batching == "rows" or (batching == "rows-2d" and len(e.shape) == 2)
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
        return tensor_nbytes(dtype, shape)

    offsets = []
    total = 0
    for _, batch in batches:
        q_off = total
        total += -(-sum(layout_bytes(i, "") for i in batch) // 64) * 64
        s_off = total
        total += -(-sum(layout_bytes(i, "_scale") for i in batch) // 64) * 64
        offsets.append((q_off, s_off))
    out_host = host_empty(total, dev.type == "cuda" and total > 0)
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
