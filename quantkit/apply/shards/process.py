"""One batch through the per-shard executor: read its consecutive source bytes (and the parts of its modules that
live elsewhere, by offset) into a slot, decode a quantized source, and quantize, exactly as Quark's shard loop does
with each tensor: per tensor on CPU (`process_cpu`), batched by shape on a GPU (`process_device`, which also decodes
there)."""

from __future__ import annotations

import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantkit.apply.shards.errors import (
    CorruptShardError,
    ExecutorError,
    ShardVerificationError,
)
from quantkit.apply.shards.f2f import ShardPlan, parse_shard_header
from quantkit.apply.shards.units import Batch, Unit
from quantkit.errors import NonFiniteWeightError
from quantkit.io.safetensors import DTYPES, REFETCH, st_dtype, tensor_nbytes
from quantkit.schemes import SCHEMES, expected_layout, quantize_weight

if TYPE_CHECKING:
    import torch

    from quantkit.apply.shards.cpu_pool import CpuQuantizers

_READ_CHUNK = 16 * 1024 * 1024
_DEVICE_BATCH_BYTES = 1 << 30  # source bytes per batched quantize call on a GPU (its temporaries are ~3x that)


@dataclass
class Settings:
    src: Path
    dst: Path
    scheme: str
    exclude: list[str]
    layer_config: dict[str, str] | None
    plan: ShardPlan
    drop: frozenset[str] = frozenset()
    decode: Any = None  # quantkit.io.formats.SourceFormat of a quantized source, else None


@dataclass
class Loaded:
    """One batch read into its slot: `tensors` maps every part of its units (by name) to a view of the slot."""

    batch: Batch
    host: torch.Tensor  # the slot's buffer (uint8); goes back to the pool when the batch is written
    view: memoryview  # the batch's source range: host[:end - begin]
    tensors: dict[str, torch.Tensor]
    used: int  # slot bytes taken by the range and the side parts (outputs may be staged after them)
    seconds: float


@dataclass
class Output:
    loaded: Loaded
    tensors: list[tuple[str, torch.Tensor]]  # every output tensor of the batch's units
    quantized: int
    device: str
    seconds: float


class SourceFiles:
    """Open source shards (one descriptor each, shared by every reader: pread needs no seek) and their sizes,
    checked against the plan on first use."""

    def __init__(self, src: Path, sizes: dict[str, int]) -> None:
        self.src = src
        self.sizes = sizes
        self.fds: dict[str, int] = {}
        self.lock = threading.Lock()

    def fd(self, shard: str) -> int:
        with self.lock:
            fd = self.fds.get(shard)
            if fd is None:
                path = self.src / shard
                try:
                    fd = os.open(path, os.O_RDONLY)
                except OSError as e:
                    raise CorruptShardError(f"{path}: cannot be read ({e.strerror or e}); {REFETCH}") from None
                size = os.fstat(fd).st_size
                if size != self.sizes[shard]:
                    os.close(fd)
                    raise CorruptShardError(
                        f"{path}: {size} bytes now, {self.sizes[shard]} when the run was planned: "
                        f"the file changed or is truncated; {REFETCH}, then rerun"
                    )
                self.fds[shard] = fd
            return fd

    def read_into(self, shard: str, view: memoryview, offset: int) -> None:
        fd = self.fd(shard)
        got = 0
        while got < len(view):
            n = os.preadv(fd, [view[got : got + _READ_CHUNK]], offset + got)
            if n <= 0:
                raise CorruptShardError(
                    f"{self.src / shard}: read {offset + got} of {self.sizes[shard]} bytes; the "
                    f"file changed while reading; {REFETCH}, then rerun"
                )
            got += n

    def close(self) -> None:
        with self.lock:
            for fd in self.fds.values():
                os.close(fd)
            self.fds.clear()


def _align(n: int) -> int:
    return -(-n // 64) * 64


def _as_tensor(host: torch.Tensor, offset: int, entry: Any) -> torch.Tensor:
    import torch

    info = DTYPES[entry.dtype]
    assert info.torch is not None  # parse_shard_header refused the dtypes without a torch name
    dtype = getattr(torch, info.torch)
    n = entry.end - entry.begin
    if n == 0:
        return torch.empty(entry.shape, dtype=dtype)
    if offset % max(1, info.bits // 8):  # misaligned: copy rather than view
        return host[offset : offset + n].clone().view(dtype).reshape(entry.shape)
    return host[offset : offset + n].view(dtype).reshape(entry.shape)


def read_batch(files: SourceFiles, batch: Batch, host: torch.Tensor, data_start: int, entries: list[Any]) -> Loaded:
    """Read `batch` into `host`: its range, then each side part at a 64-byte aligned place after it. The first batch
    of a shard re-reads the header and must find the planned one (the file was not rewritten since)."""
    t0 = time.perf_counter()
    n = batch.end - batch.begin
    if host.numel() < batch.read_bytes:
        raise ExecutorError(f"internal: batch of {batch.read_bytes} bytes for a {host.numel()}-byte slot")
    mv = memoryview(host.numpy())  # type: ignore[arg-type]
    files.read_into(batch.shard, mv[:n], batch.begin)
    if batch.begin == 0:
        where = str(files.src / batch.shard)
        start, now = parse_shard_header(mv[:n], files.sizes[batch.shard], where)
        if start != data_start or now != entries:
            raise CorruptShardError(f"{where}: its header changed since the run was planned; {REFETCH}, then rerun")
    tensors: dict[str, torch.Tensor] = {}
    pos = _align(n)
    side_at: dict[str, int] = {}
    for p in batch.side:
        files.read_into(p.shard, mv[pos : pos + p.nbytes], p.offset)
        side_at[p.entry.name] = pos
        pos = _align(pos + p.nbytes)
    for u in batch.units:
        for p in u.parts:
            at = side_at.get(p.entry.name)
            if at is None:
                at = p.offset - batch.begin
            tensors[p.entry.name] = _as_tensor(host, at, p.entry)
    return Loaded(batch, host, mv[:n], tensors, pos, time.perf_counter() - t0)


def _first_non_finite(t: torch.Tensor) -> tuple[list[int], str]:
    import torch

    bad = (~torch.isfinite(t)).nonzero()
    if bad.numel() == 0:
        return [], "finite"
    idx = bad[0].tolist()
    v = t[tuple(idx)].item()
    return idx, "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")


def _non_finite_error(name: str, w: torch.Tensor, shard: str) -> NonFiniteWeightError:
    idx, kind = _first_non_finite(w)
    return NonFiniteWeightError(
        f"{name}[{', '.join(map(str, idx))}] is {kind} (shard {shard}); fix or re-download the source weights"
    )


def _check_layout(name: str, shape: tuple[int, ...], scheme: str, q: torch.Tensor, scale: torch.Tensor) -> None:
    layout = expected_layout(shape, scheme)
    for suffix, t in (("", q), ("_scale", scale)):
        dtype = st_dtype(t, ExecutorError)
        if (dtype, tuple(t.shape)) != layout[suffix]:
            raise ShardVerificationError(
                f"{name}{suffix}: {scheme} gave {dtype} {tuple(t.shape)}, expected {layout[suffix]} (internal error)"
            )


def _bad_scale(scale: torch.Tensor, scheme: str) -> torch.Tensor:
    """A 0-dim bool tensor on the scale's device: some scale is not finite and positive (the scheme's own test)."""
    bad_scale = SCHEMES[scheme].bad_scale
    assert bad_scale is not None, scheme
    return bad_scale(scale)


def _model_dtype(s: Settings) -> torch.dtype:
    import torch

    return getattr(torch, s.plan.model_dtype)


def _decode(s: Settings, u: Unit, loaded: Loaded, device: Any = None, check_finite: bool = True) -> torch.Tensor:
    """The unit's tensor as the quantizer sees it: the stored view, or the decoded module (on `device`)."""
    from quantkit.io.formats import decode_module

    parts = [loaded.tensors[p.entry.name] for p in u.parts]
    if not u.decoded:
        return parts[0]
    if u.fused is not None:  # one expert of a fused tensor, cut on the host (a transpose and a slice, no arithmetic)
        from quantkit.io.formats import fused_expert_tensor

        t = fused_expert_tensor(s.decode, parts[0], u.fused[0], u.name, u.fused[1])
        return t.to(device, non_blocking=True) if device is not None else t
    if device is not None:  # weight_shape stays on the host: its two values are read there
        parts = [t.to(device, non_blocking=True) if i < 2 else t for i, t in enumerate(parts)]
    return decode_module(s.decode, u.name, parts, check_finite=check_finite)


def _relayout(u: Unit, loaded: Loaded) -> list[tuple[str, torch.Tensor]]:
    """An already-MXFP4 module (DeepSeek-V4's FP4 experts) in Quark's layout: byte views of its stored parts."""
    from quantkit.io.formats import relayout_fp4_experts

    weight, scale = (loaded.tensors[p.entry.name] for p in u.parts)
    return list(relayout_fp4_experts(u.name, weight, scale).items())


def process_cpu(
    loaded: Loaded, s: Settings, device: str, pool: ThreadPoolExecutor | None, quantizers: CpuQuantizers | None = None
) -> Output:
    """Quark's per-shard loop (`_quantize_and_save_safetensor_shard`) on one batch, one tensor at a time (the CPU
    path: `pool` runs one tensor per core; a quantized source is decoded tensor by tensor there too).

    With `quantizers` (the slot is in their shared memory), each weight read as stored is quantized by a child
    process (quantkit.apply.shards.cpu_pool), which writes the result into the slot after the batch's source bytes,
    as the GPU path stages its results; `pool` then only waits on them. Decoded weights are quantized in the thread."""
    t0 = time.perf_counter()
    model_dtype = _model_dtype(s)
    shard = loaded.batch.shard
    units = [u for u in loaded.batch.units if u.kind != "drop"]
    room: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    if quantizers is not None:
        pos = loaded.used
        for u in units:
            if u.kind != "quantize" or u.decoded or u.scheme is None:
                continue
            layout = expected_layout(u.shape, u.scheme)
            q_len, s_len = (tensor_nbytes(*layout[sfx]) for sfx in ("", "_scale"))
            end = _align(_align(pos + q_len) + s_len)
            if end > loaded.host.numel():
                break  # no room left in the slot: the rest are quantized in the thread
            room[u.name] = (
                loaded.host[pos : pos + q_len],
                loaded.host[_align(pos + q_len) : _align(pos + q_len) + s_len],
            )
            pos = end

    def in_child(u: Unit, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        import torch

        assert quantizers is not None and u.scheme is not None
        q_out, s_out = room[u.name]
        got = quantizers.quantize(w, u.scheme, q_out, s_out)  # NonFiniteWeightError: named by the caller
        if got is None:
            return None
        q = q_out.view(getattr(torch, got.weight[0])).view(got.weight[1])
        scale = s_out.view(getattr(torch, got.scale[0])).view(got.scale[1])
        _check_layout(u.name, tuple(w.shape), u.scheme, q, scale)
        if got.bad_scale:
            raise ShardVerificationError(f"{u.name}_scale: a scale is not finite and positive (internal error)")
        return q, scale

    def run(u: Unit) -> list[tuple[str, torch.Tensor]]:
        if u.kind == "relayout":
            return _relayout(u, loaded)
        w = _decode(s, u, loaded)
        if u.kind == "quantize":
            assert u.scheme is not None
            try:
                if u.name in room and quantizers is not None and quantizers.holds(w):
                    done = in_child(u, w)
                    if done is not None:
                        return [(u.name, done[0]), (u.name + "_scale", done[1])]
                q, scale = quantize_weight(w.to(device) if device != "cpu" else w, u.scheme, finite_only=True)
            except NonFiniteWeightError:
                raise _non_finite_error(u.name, w, shard) from None
            except ValueError as e:
                raise ExecutorError(f"{u.name} in {shard}: cannot quantize with {u.scheme}: {e}") from None
            q, scale = q.cpu(), scale.cpu()
            _check_layout(u.name, tuple(w.shape), u.scheme, q, scale)
            if bool(_bad_scale(scale, u.scheme)):
                raise ShardVerificationError(f"{u.name}_scale: a scale is not finite and positive (internal error)")
            return [(u.name, q.contiguous()), (u.name + "_scale", scale.contiguous())]
        if u.kind == "cast":
            return [(u.name, w.to(model_dtype))]
        return [(u.name, w.contiguous())]

    results = list(pool.map(run, units)) if pool is not None else [run(u) for u in units]
    tensors = [t for r in results for t in r]
    quantized = sum(u.kind == "quantize" for u in units)
    return Output(loaded, tensors, quantized, device, time.perf_counter() - t0)


class _Stage:
    """Host room for results copied back from the GPU: the slot after its source bytes when it fits (page-locked,
    so the copies are asynchronous), else one fresh buffer."""

    def __init__(self, loaded: Loaded, need: int, pinned: bool) -> None:
        from quantkit.apply.shards.memory import host_empty

        if loaded.used + need <= loaded.host.numel():
            self.buf, self.pos = loaded.host, loaded.used
        else:
            self.buf, self.pos = host_empty(need, pinned and need > 0), 0

    def take(self, nbytes: int) -> torch.Tensor:
        t = self.buf[self.pos : self.pos + nbytes]
        self.pos = _align(self.pos + nbytes)
        return t


def process_device(loaded: Loaded, s: Settings, device: str) -> Output:
    """The same batch on a GPU, batched: per-tensor copies, kernel launches and synchronisations cost more than the
    math for the thousands of small expert tensors of an MoE checkpoint.

    A quantized source is decoded on the GPU (quantkit.io.formats.decode_module, bit-exact with the CPU decode).
    The tensors to quantize are grouped by (scheme, dtype, last dim) as the scheme's `batching` allows — any rank
    for MXFP4 ("rows"), 2-D ones only for PTPC-FP8 ("rows-2d"), whose channel is dim 0 — and each group's rows are
    copied (asynchronously, from the page-locked slot) into one device tensor, quantized in one call and split back.
    Both schemes quantize every row on its own (MXFP4: groups of 32 along the last dim; PTPC-FP8: one scale per
    output channel), so a stacked tensor's rows give exactly each tensor's own bytes. Results are copied back into
    the slot; the batch costs one final synchronisation (plus the few the quantizers make per group to check for
    NaN/Inf). Works on CPU too (for tests).
    """
    import torch

    t0 = time.perf_counter()
    dev = torch.device(device)
    model_dtype = _model_dtype(s)
    shard = loaded.batch.shard
    units = [u for u in loaded.batch.units if u.kind != "drop"]
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, u in enumerate(units):
        if u.kind == "quantize":
            batching = SCHEMES[u.scheme].batching if u.scheme is not None else "whole"
            rowwise = batching == "rows" or (batching == "rows-2d" and len(u.shape) == 2)
            key = (u.scheme, u.dtype, u.shape[-1]) if rowwise else (u.scheme, u.name)
            groups.setdefault(key, []).append(i)
    batches: list[tuple[bool, list[int]]] = []
    for key, members in groups.items():
        batch: list[int] = []
        nbytes = 0
        for i in members:
            n = tensor_nbytes(units[i].dtype, units[i].shape)
            if batch and nbytes + n > _DEVICE_BATCH_BYTES:
                batches.append((len(key) == 3, batch))
                batch, nbytes = [], 0
            batch.append(i)
            nbytes += n
        batches.append((len(key) == 3, batch))

    def out_bytes(i: int, suffix: str) -> int:
        u = units[i]
        assert u.scheme is not None
        dtype, shape = expected_layout(u.shape, u.scheme)[suffix]
        return tensor_nbytes(dtype, shape)

    need = sum(_align(sum(out_bytes(i, sfx) for i in b)) for _, b in batches for sfx in ("", "_scale"))
    need += sum(
        _align(o.nbytes) for u in units if u.kind != "quantize" and (u.decoded or u.kind == "cast") for o in u.outputs
    )
    stage = _Stage(loaded, need, dev.type == "cuda")
    results: list[Any] = [None] * len(units)
    flags: list[torch.Tensor] = []
    decoded_flags: list[tuple[int, torch.Tensor]] = []

    def source(i: int) -> torch.Tensor:
        u = units[i]
        if u.decoded:
            t = _decode(s, u, loaded, dev, check_finite=False)
            decoded_flags.append((i, ~torch.isfinite(t).all()))
            return t
        return loaded.tensors[u.parts[0].entry.name]

    try:
        for rowwise, batch in batches:
            first = units[batch[0]]
            scheme = first.scheme
            assert scheme is not None
            cols = first.shape[-1]
            if rowwise:
                rows = [math.prod(units[i].shape) // max(cols, 1) for i in batch]
                x = torch.empty(
                    (sum(rows), cols), dtype=getattr(torch, DTYPES[first.dtype].torch or "bfloat16"), device=dev
                )
                r = 0
                for i, n in zip(batch, rows, strict=True):
                    x[r : r + n].copy_(source(i).reshape(n, cols), non_blocking=True)
                    r += n
            else:
                rows = [first.shape[0]]
                x = source(batch[0]).to(dev, non_blocking=True)
            try:
                q, scale = quantize_weight(x, scheme, finite_only=True)
            except NonFiniteWeightError:
                for i in batch:
                    u = units[i]
                    w = _decode(s, u, loaded) if u.decoded else loaded.tensors[u.parts[0].entry.name]
                    if _first_non_finite(w)[0]:
                        raise _non_finite_error(u.name, w, shard) from None
                raise
            except ValueError as e:
                raise ExecutorError(f"{first.name} in {shard}: cannot quantize with {scheme}: {e}") from None
            del x
            flags.append(_bad_scale(scale, scheme))
            q_bytes, s_bytes = q.reshape(-1).view(torch.uint8), scale.reshape(-1).view(torch.uint8)
            q_host, s_host = stage.take(q_bytes.numel()), stage.take(s_bytes.numel())
            q_host.copy_(q_bytes, non_blocking=True)
            s_host.copy_(s_bytes, non_blocking=True)
            q_host, s_host = q_host.view(q.dtype).view(q.shape), s_host.view(scale.dtype).view(scale.shape)
            r = 0
            for i, n in zip(batch, rows, strict=True):
                shape = units[i].shape
                if rowwise:
                    qi, si = q_host[r : r + n].reshape(*shape[:-1], q.shape[-1]), s_host[r : r + n]
                else:
                    qi, si = q_host, s_host
                _check_layout(units[i].name, shape, scheme, qi, si)
                results[i] = [(units[i].name, qi), (units[i].name + "_scale", si)]
                r += n
        # CPU work (and the decoded tensors that are kept) while the last copies run.
        for i, u in enumerate(units):
            if u.kind == "quantize":
                continue
            if u.kind == "relayout":
                results[i] = _relayout(u, loaded)
            elif u.decoded:
                t = source(i)
                t = t.to(model_dtype) if u.kind == "cast" else t
                host = stage.take(t.numel() * t.element_size()).view(t.dtype).view(t.shape)
                host.copy_(t, non_blocking=True)
                results[i] = [(u.name, host)]
            elif u.kind == "cast":
                results[i] = [(u.name, loaded.tensors[u.parts[0].entry.name].to(model_dtype))]
            else:
                results[i] = [(u.name, loaded.tensors[u.parts[0].entry.name])]
        bad = bool(torch.stack(flags).any().item()) if flags else False  # synchronises: every copy is done
        bad_decoded = [i for i, f in decoded_flags if bool(f.item())] if decoded_flags else []
    except BaseException:
        if dev.type == "cuda":  # the slot goes back to the pool: no copy may still read or write it
            torch.cuda.synchronize(dev)
        raise
    if bad_decoded:  # the CPU decode names the tensor and its first NaN/Inf
        _decode(s, units[bad_decoded[0]], loaded)
        raise ShardVerificationError(
            f"{units[bad_decoded[0]].name}: the GPU decode gave NaN/Inf, the CPU decode did not (internal error)"
        )
    if bad:
        raise ShardVerificationError(f"{shard}: a scale is not finite and positive (internal error)")
    tensors = [t for r in results for t in r]
    return Output(loaded, tensors, sum(u.kind == "quantize" for u in units), device, time.perf_counter() - t0)
