"""Streaming per-shard executor: quantize a safetensors checkpoint without Quark, into exactly the files AMD Quark
0.13's `ModelQuantizer(cfg).direct_quantize_checkpoint(src, dst, device=...)` writes, in memory bounded by a byte
budget (`max_memory`) rather than by the shard.

Work is tensor-granular (quantkit.apply.shards.units): each source shard is cut, from its header, into batches of
consecutive bytes in file order; a batch's modules whose parts live elsewhere (a scale in the shard's F32 region, or
in another shard) fetch those parts by offset. Reader threads (4 when a GPU quantizes, or CPU processes on 8 cores or
more; else 1) take batches in order, read each into a reused slot buffer (page-locked on a GPU run) and hash the
shard's bytes in file order as they arrive (sha256_in); one worker thread per device decodes and quantizes a batch
(on CPU one tensor per core: in child processes that map the slots, quantkit.apply.shards.cpu_pool, or in a
thread pool for small runs; on a GPU the batch's weights are decoded there and quantized in
groups of one shape, see `process_device`); one writer thread writes each output shard as a stream
(quantkit.apply.shards.writer: header first, from the plan, then each tensor at its planned offset, hashed as
written: sha256_out), renames it into place when its last tensor is in, and records it in the journal.

Memory bound: `slots` buffers of one batch each (its source bytes, fetched parts and outputs; quantkit.apply.shards
.memory.plan_memory), a batch holding its slot from its read until its output is written, so host memory stays
within the budget whatever the size of a shard: a few large shards feed every reader and device as many small
ones do. The budget defaults from the machine's memory and the device count (memory.default_max_memory); one
smaller than the largest tensor's work is refused before any work.

The Quark 0.13 rules it replays, and where it differs on purpose: quantkit.apply.shards.f2f.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from quantkit.apply.shards.cpu_pool import CpuQuantizers, SharedArena
from quantkit.apply.shards.errors import ExecutorError
from quantkit.apply.shards.f2f import check_aux_quark, copy_aux_quark, plan_shards, write_quark_config
from quantkit.apply.shards.journal import JOURNAL_NAME, open_journal, run_key
from quantkit.apply.shards.memory import MB, HostBuffers, MemoryPlan, default_max_memory, peak_rss_mb, plan_memory
from quantkit.apply.shards.process import Loaded, Output, Settings, SourceFiles, process_cpu, process_device, read_batch
from quantkit.apply.shards.units import (
    Batch,
    OutputLayout,
    ShardLayout,
    cut_batches,
    output_layouts,
    ratio_out,
    shard_layouts,
)
from quantkit.apply.shards.writer import OutputShard
from quantkit.errors import QuantkitError
from quantkit.results.apply import ExecutorReport, ShardSummary
from quantkit.schemes.quark_config import quark_quantization_config

# What runs once every shard and the index are in place: (source, output, Quark's quantization_config) -> None.
Finish = Callable[[Path, Path, dict[str, Any]], None]

_PARTIAL_SUFFIX = ".quantkit-partial"
_GPU_READERS = 4  # read streams when a GPU quantizes: one stream reads ~0.8 GB/s, 4 reach a disk's parallel rate


@dataclass
class ShardEvent:
    """Progress of one shard: `kind` is "start" (its first batch was taken), "done" (written and journaled),
    "resumed" (a previous run's output was kept: its output and source hash as the journal recorded) or
    "source-changed" (a previous run finished it, but its source bytes changed since: it is quantized again)."""

    kind: Literal["start", "done", "resumed", "source-changed"]
    shard: str
    index: int
    total: int
    device: str | None = None
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0


def _wait(event: threading.Event, stop: threading.Event) -> bool:
    """Wait for `event` unless the run stops first (then False)."""
    while not event.wait(0.05):
        if stop.is_set():
            return False
    return True


def _mib(n: int) -> str:
    return f"{n / MB:.0f} MiB" if n >= 10 * MB else f"{n / MB:.1f} MiB"


def interleave(per_shard: list[list[Batch]], width: int) -> list[Batch]:
    """The read order: round robin over a window of `width` shards, each shard's batches in file order, a shard
    joining the window when one leaves it. A source shard's sha256 is one sequential stream (_SourceHash); read
    shard after shard, a few large shards would leave every reader waiting on that one hash (measured on one H200,
    24 GB in 7 x 4 GB shards: 865 MB/s against 1254 MB/s for the same model in 180 MB shards). With the window,
    `width` hashes run at once whatever the shard size."""
    out: list[Batch] = []
    queue_ = [list(b) for b in per_shard if b]
    window = queue_[:max(1, width)]
    rest = queue_[len(window):]
    while window:
        for batches in list(window):
            out.append(batches.pop(0))
            if not batches:
                window.remove(batches)
                if rest:
                    window.append(rest.pop(0))
    return out


class _SourceHash:
    """sha256 of one source shard, fed by its batches in file order whichever reader finishes first."""

    def __init__(self, batches: int) -> None:
        import hashlib

        self.hasher = hashlib.sha256()
        self.lock = threading.Lock()
        self.next = 0
        self.ready: dict[int, tuple[Loaded, threading.Event]] = {}
        self.busy = False
        self.batches = batches
        self.done = threading.Event()

    def add(self, loaded: Loaded, hashed: threading.Event) -> None:
        with self.lock:
            self.ready[loaded.batch.index] = (loaded, hashed)
            if self.busy:
                return
            self.busy = True
        while True:
            with self.lock:
                item = self.ready.pop(self.next, None)
                if item is None:
                    self.busy = False
                    return
            if len(item[0].view):
                self.hasher.update(item[0].view)
            with self.lock:
                self.next += 1
                last = self.next == self.batches
            if last:  # before the last batch's event: whoever waited for that one finds the shard's hash done
                self.done.set()
            item[1].set()


def quantize_checkpoint(src: Path, dst: Path, *, scheme: str, exclude: list[str],
                        layer_config: dict[str, str] | None, devices: list[str], resume: bool = False,
                        progress: Callable[[ShardEvent], None] | None = None,
                        readers: int | None = None, decode: Any = None,
                        drop: set[str] | None = None, finish: Finish | None = None,
                        max_memory: int | None = None, max_shard_size: int | None = None,
                        cpu_processes: bool | None = None) -> ExecutorReport:
    """Quantize the safetensors checkpoint `src` into `dst`, shard by shard, byte-identical to Quark 0.13's
    `ModelQuantizer(LLMTemplate.get(t).get_config(scheme=scheme, exclude_layers=exclude,
    layer_config=layer_config)).direct_quantize_checkpoint(src, dst, device=...)`.

    `exclude` are Quark's fnmatch patterns on checkpoint module names; `layer_config` maps module patterns to
    schemes (first match wins). `devices`: torch devices, one worker each ("cpu", "cuda:0", ...). With
    `resume=True` the shards a previous, interrupted run recorded in dst's journal (whose output and source both
    still hash as recorded) are kept; all others are redone. Only one process may write `dst` at a time: `apply`
    holds the output's lock (quantkit.io.lock); a direct caller must do the same. `progress` is called in the
    caller's thread. `readers`: read streams (default 1 for CPU-only runs, 4 when a GPU quantizes); fewer are used
    when their slots would not fit the budget. `max_memory`: the host-memory budget in bytes (default: from the
    machine's memory and the device count); below the largest tensor's work it is refused before any work.
    `finish(src, dst, quantization_config)` writes the files beside the shards and the index once every shard is
    in place, given the `quantization_config` Quark's file-to-file path would write (quantkit apply writes its final
    config.json and its own allow-list of files, quantkit.io.files.AUX_FILES, there). None: Quark's own files
    (every other file and folder of the source, and Quark's config.json), byte-identical to Quark.

    `max_shard_size` (bytes): instead of one output shard per source shard under its name (Quark's layout), output
    shards of at most that many bytes each, named as transformers names them (units.output_layouts); the journal
    then records each output shard with the source shards it takes tensors from, and each source shard's hash once
    it is read in full, and a resume keeps an output shard only when it and all its sources re-hash as recorded.

    `cpu_processes`: on a CPU-only run, quantize in one child process per core (quantkit.apply.shards.cpu_pool)
    rather than in threads of this process, whose GIL and heap every tensor shares. None (the default): the
    environment variable QUANTKIT_CPU_PROCESSES: "1" or "0"; "auto", processes when there are at least 4 cores
    and 1 GiB of weights to quantize as stored (below that their start, a few seconds, is not paid back), chosen
    so, the threads quantize while the children start; unset, the same as "auto" (measured end to end on the H200
    box's 16 cores, 24 GB in 4 GB shards: threads 0.49x the disk floor, processes 0.80x). With processes, CPU-only
    runs also read with 4 streams on 8 cores or more, and keep 2 batches in flight. The children number one per core
    below 8 cores, and leave the readers and the writer their cores from 8 on (_cpu_children); QUANTKIT_CPU_CHILDREN=N
    sets their number.
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
    if max_shard_size is not None and max_shard_size < 1:
        raise ExecutorError(f"max_shard_size={max_shard_size}: give a size in bytes, e.g. 5 GB")
    if max_memory is not None and max_memory < 1:
        raise ExecutorError(f"max_memory={max_memory}: give a budget in bytes, e.g. 4 GiB")
    if finish is None:
        check_aux_quark(src)
    plan = plan_shards(src, scheme, exclude, layer_config, decode)
    settings = Settings(src, dst, scheme, list(exclude), layer_config, plan, frozenset(drop or ()), decode)
    layouts = shard_layouts(src, plan, scheme=scheme, exclude=list(exclude), layer_config=layer_config,
                            drop=settings.drop, decode=decode)

    cpu_threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    uses_cpu = any(torch.device(d).type == "cpu" for d in devices)
    uses_gpu = not all(torch.device(d).type == "cpu" for d in devices)
    decode_on_host = decode is not None and uses_cpu
    procs = _use_cpu_processes(cpu_processes, layouts, uses_gpu, cpu_threads)
    # The worker threads: one per device; with CPU processes at least two on CPU, so that the next batch is handed
    # out while the last tensors of one are still being quantized.
    workers = list(devices) + (["cpu"] if procs and len(devices) == 1 else [])
    default_readers = _GPU_READERS if uses_gpu or (procs and cpu_threads >= 8) else 1
    mem = _memory_plan(layouts, max_memory, readers or default_readers, devices, len(workers), uses_cpu,
                       uses_gpu, decode_on_host, cpu_threads)
    n_children = _cpu_children(cpu_threads, mem.readers) if procs else 0  # a bad QUANTKIT_CPU_CHILDREN: before any work

    key = run_key(src, scheme, exclude, layer_config, settings.drop, decode, plan.model_dtype, max_shard_size)
    outs = output_layouts(layouts, plan.shards, max_shard_size) if max_shard_size is not None else None
    out_names = [o.name for o in outs] if outs is not None else plan.shards
    journal = open_journal(dst, key, resume=resume)
    for stale in [*dst.glob("*" + _PARTIAL_SUFFIX), dst / (JOURNAL_NAME + ".tmp")]:
        stale.unlink(missing_ok=True)
    # Shards of an earlier source layout (a shard renamed or removed since the interruption) must not survive.
    for stale in dst.glob("*.safetensors"):
        if stale.name not in out_names:
            stale.unlink()

    total = len(out_names)
    emit_queue: queue.Queue[ShardEvent] = queue.Queue()
    report = ExecutorReport(source=str(src), output=str(dst), scheme=scheme, devices=list(devices),
                            exclude=plan.exclude_modules, ignored_files=plan.ignored)
    out_by_name: dict[str, OutputLayout] = {o.name: o for o in outs or []}
    out_of = {t: o.name for o in outs or [] for t in o.names}
    source_sha: dict[str, str] = {}
    if outs is None:
        depends = {name: layouts[name].depends_on for name in plan.shards}
        records, weight_maps, todo, changed = journal.kept_shards(src, dst, plan.shards, streams=_GPU_READERS,
                                                                  depends_on=depends)
    else:
        records, source_sha, changed = journal.kept_outputs(src, dst, {o.name: (o.names, o.sources) for o in outs},
                                                            streams=_GPU_READERS)
        weight_maps = {o.name: o.names for o in outs}
        need = {s for o in outs if o.name not in records for s in o.sources} | (set(plan.shards) - set(source_sha))
        todo = [(i, name) for i, name in enumerate(plan.shards) if name in need]
    report.source_changed = changed
    for i, name in enumerate(out_names):  # in shard order, as a resume found them
        if name in records:
            r = records[name]
            emit_queue.put(ShardEvent("resumed", name, i, total, r.device, r.bytes_in, r.bytes_out))
    for i, name in enumerate(plan.shards):
        if name in changed:
            emit_queue.put(ShardEvent("source-changed", name, i, total))
    quantized_names = {u.outputs[0].name for lay in layouts.values() for u in lay.units if u.kind == "quantize"}

    for _, name in todo:
        cut_batches(layouts[name], mem.batch_bytes, decode_on_host)
    index_of = {name: i for i, name in enumerate(out_names)}
    index_of.update({name: i for i, name in enumerate(plan.shards) if name not in index_of})
    pending: list[Batch] = interleave([layouts[name].batches for _, name in todo], mem.readers)
    hashes = {name: _SourceHash(len(layouts[name].batches)) for _, name in todo}
    files = SourceFiles(src, plan.sizes)
    saved_threads = torch.get_num_threads()
    pool = ThreadPoolExecutor(max_workers=cpu_threads, thread_name_prefix="quantkit-cpu") if uses_cpu else None
    stop = threading.Event()
    errors: list[BaseException] = []
    n_readers = max(1, min(mem.readers, len(pending)))
    arena: SharedArena | None = None
    quantizers: CpuQuantizers | None = None
    n_procs = 0
    if procs and pending:
        arena = SharedArena(mem.slots * mem.slot_bytes)
        quantizers = CpuQuantizers(n_children, arena, wait=procs == "always")
    buffers = HostBuffers(mem.slots, mem.slot_bytes, mem.pin, arena.tensor if arena is not None else None)
    work: queue.Queue[tuple[Loaded, threading.Event] | None] = queue.Queue()
    results: queue.Queue[tuple[Output, threading.Event] | None] = queue.Queue()

    def fail(e: BaseException) -> None:
        errors.append(e)
        stop.set()

    take_lock = threading.Lock()
    next_batch = [0]
    readers_left = [n_readers]
    started: set[str] = set()
    started_lock = threading.Lock()

    def reader() -> None:
        try:
            while True:
                with take_lock:  # batches take slots in order, so the one the hash waits for always has one
                    if next_batch[0] >= len(pending) or stop.is_set():
                        return
                    host = buffers.acquire(stop)
                    if host is None:
                        return
                    batch = pending[next_batch[0]]
                    next_batch[0] += 1
                layout = layouts[batch.shard]
                try:
                    loaded = read_batch(files, batch, host, layout.data_start, layout.entries)
                except BaseException:
                    buffers.release(host)
                    raise
                buffers.pin_once(host)
                hashed = threading.Event()
                work.put((loaded, hashed))
                hashes[batch.shard].add(loaded, hashed)
                del loaded
        except BaseException as e:  # noqa: BLE001 - reported by the caller's thread
            fail(e)
        finally:
            with take_lock:
                readers_left[0] -= 1
                if readers_left[0] == 0:  # the last reader out tells every worker to finish
                    for _ in workers:
                        work.put(None)

    def worker(device: str) -> None:
        try:
            if torch.device(device).type == "cuda" and torch.device(device).index is not None:
                torch.cuda.set_device(torch.device(device))
            while True:
                item = work.get()
                if item is None:
                    return
                loaded, hashed = item
                if stop.is_set():
                    hashed.wait(1.0)
                    buffers.release(loaded.host)
                    continue
                shard = loaded.batch.shard
                with started_lock:
                    first = shard not in started
                    started.add(shard)
                if first:
                    emit_queue.put(ShardEvent("start", shard, index_of[shard], total, device,
                                              layouts[shard].size))
                try:
                    if torch.device(device).type == "cpu":
                        out = process_cpu(loaded, settings, device, pool, quantizers)
                    else:
                        out = process_device(loaded, settings, device)
                except BaseException:
                    hashed.wait(1.0)
                    buffers.release(loaded.host)
                    raise
                results.put((out, hashed))
                del loaded, out, item  # the writer owns them now
        except BaseException as e:  # noqa: BLE001
            fail(e)
        finally:
            results.put(None)

    open_outputs: dict[str, OutputShard] = {}
    unrecorded = set(hashes) if outs is not None else set()  # re-sharded: source hashes not journaled yet
    progress_of: dict[str, dict[str, Any]] = {}

    def finish_output(name: str) -> None:
        """A re-sharded output shard whose last tensor is in: renamed into place and journaled."""
        shard, layout, info = open_outputs.pop(name), out_by_name[name], progress_of[name]
        nbytes, sha_out = shard.close()
        os.replace(dst / (name + _PARTIAL_SUFFIX), dst / name)
        rec = ShardSummary(name=name, bytes_in=layout.bytes_in, bytes_out=nbytes, sha256_out=sha_out,
                           tensors=len(layout.names), quantized=sum(n in quantized_names for n in layout.names),
                           seconds=round(info["seconds"], 3), device=info["device"])
        journal.record(rec, layout.names, layout.sources)
        records[name] = rec
        emit_queue.put(ShardEvent("done", name, index_of[name], total, rec.device, rec.bytes_in, rec.bytes_out,
                                  rec.seconds))

    def write_tensors(out: Output) -> list[str]:
        """The batch's tensors written at their planned offsets; the output shards they went to, in order."""
        touched: list[str] = []
        for tensor_name, t in out.tensors:
            name = out_of[tensor_name]
            if name in records:
                continue
            shard = open_outputs.get(name)
            if shard is None:
                shard = open_outputs[name] = OutputShard(out_by_name[name], dst / (name + _PARTIAL_SUFFIX))
                progress_of[name] = {"seconds": 0.0, "device": out.device}
            shard.write(tensor_name, t)
            if name not in touched:
                touched.append(name)
        return touched

    def write_resharded(box: list[Output], hashed: threading.Event) -> None:
        """One batch's tensors into the output shards the plan puts them in (those a resume kept are skipped)."""
        out = box.pop()
        t0 = time.perf_counter()
        touched = write_tensors(out)
        if touched:
            progress_of[touched[0]]["seconds"] += out.loaded.seconds + out.seconds + time.perf_counter() - t0
        host = out.loaded.host
        del out  # no view of the slot may outlive this: the next batch is read into it
        if not _wait(hashed, stop):
            return
        buffers.release(host)
        for name in touched:
            if open_outputs[name].complete:
                finish_output(name)
        for name in [n for n in unrecorded if hashes[n].done.is_set()]:
            unrecorded.discard(name)
            source_sha[name] = hashes[name].hasher.hexdigest()
            journal.record_source(name, plan.sizes[name], source_sha[name])

    def writer() -> None:
        finished_workers = 0
        while finished_workers < len(workers):
            item = results.get()
            if item is None:
                finished_workers += 1
                continue
            out, hashed = item
            if stop.is_set():
                host = out.loaded.host
                del out, item
                hashed.wait(1.0)
                buffers.release(host)
                continue
            try:
                if outs is not None:
                    box = [out]
                    del out, item
                    write_resharded(box, hashed)
                    continue
                t0 = time.perf_counter()
                batch = out.loaded.batch
                name = batch.shard
                layout = layouts[name]
                shard = open_outputs.get(name)
                if shard is None:
                    shard = open_outputs[name] = OutputShard(layout, dst / (name + _PARTIAL_SUFFIX))
                    progress_of[name] = {"seconds": 0.0, "quantized": 0, "device": out.device}
                for tensor_name, t in out.tensors:
                    shard.write(tensor_name, t)
                info = progress_of[name]
                info["seconds"] += out.loaded.seconds + out.seconds + time.perf_counter() - t0
                info["quantized"] += out.quantized
                host = out.loaded.host
                del out, item  # no view of the slot may outlive this: the next batch is read into it
                if not _wait(hashed, stop):
                    continue
                buffers.release(host)
                if not shard.complete:
                    continue
                if not _wait(hashes[name].done, stop):
                    continue
                nbytes, sha_out = shard.close()
                os.replace(dst / (name + _PARTIAL_SUFFIX), dst / name)
                del open_outputs[name]
                rec = ShardSummary(name=name, bytes_in=layout.size, bytes_out=nbytes,
                                   sha256_in=hashes[name].hasher.hexdigest(), sha256_out=sha_out,
                                   tensors=len(layout.names), quantized=info["quantized"],
                                   seconds=round(info["seconds"], 3), device=info["device"])
                journal.record(rec, layout.names, layout.depends_on)
                records[name] = rec
                weight_maps[name] = layout.names
                emit_queue.put(ShardEvent("done", name, index_of[name], total, rec.device, rec.bytes_in,
                                          rec.bytes_out, rec.seconds))
            except BaseException as e:  # noqa: BLE001
                fail(e)

    threads = [threading.Thread(target=reader, name=f"quantkit-reader-{k}", daemon=True) for k in range(n_readers)]
    threads.append(threading.Thread(target=writer, name="quantkit-writer", daemon=True))
    threads += [threading.Thread(target=worker, args=(d,), name=f"quantkit-{d}-{k}", daemon=True)
                for k, d in enumerate(workers)]
    try:
        # CPU: parallel across tensors instead, cheaper than intra-op threads per step. GPU only: the CPU does no
        # tensor math but rare casts; many idle intra-op threads only spin after each small CPU op.
        torch.set_num_threads(1 if uses_cpu else min(4, cpu_threads))
        if pending:
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
            if t.is_alive() or t.ident is not None:
                t.join()
        for shard in open_outputs.values():
            shard.abandon()
        files.close()
        if pool is not None:
            pool.shutdown(wait=True)
        if quantizers is not None:
            n_procs = len(quantizers.children)
            quantizers.close()
        page_locked = bool(buffers.pinned)
        buffers.close()
        if arena is not None:
            del buffers
            arena.close()
        torch.set_num_threads(saved_threads)
        host_empty_cache = getattr(torch._C, "_host_emptyCache", None)
        if uses_gpu and host_empty_cache is not None:
            host_empty_cache()  # page-locked staging memory, cached by torch
    if errors:
        first = errors[0]
        if isinstance(first, QuantkitError):
            raise first
        raise ExecutorError(f"quantizing {src} failed: {type(first).__name__}: {first}") from first

    # All shards are in place: the files Quark writes after its shard loop, in its order.
    if finish is None:
        copy_aux_quark(src, dst)
    weight_map: dict[str, str] = {}
    for name in out_names:
        for tensor in weight_maps[name]:
            weight_map[tensor] = name
    if outs is None:  # Quark's index: the sizes of the files that hold tensors
        total_size = sum((dst / name).stat().st_size for name in plan.shards if weight_maps[name])
        source_sha = {name: records[name].sha256_in for name in plan.shards}
    else:  # transformers' index (modeling_utils save_pretrained): the tensors' bytes
        source_sha.update({name: h.hasher.hexdigest() for name, h in hashes.items() if name in unrecorded})
        total_size = sum(o.nbytes for layout in outs for o in layout.outputs)
    with open(dst / "model.safetensors.index.json", "w") as f:
        json.dump({"metadata": {"total_size": total_size}, "weight_map": weight_map}, f, ensure_ascii=False, indent=4)
    report.quantization_config = quark_quantization_config(scheme, plan.exclude_modules, layer_config)
    if finish is None:
        write_quark_config(src, dst, scheme, plan.exclude_modules, layer_config)
    else:
        finish(src, dst, report.quantization_config)
    journal.remove()

    report.shards = [records[name] for name in out_names]
    report.source_sha256 = {name: source_sha[name] for name in plan.shards}
    report.resumed_shards = sum(r.resumed for r in report.shards)
    report.total_seconds = round(time.perf_counter() - t_start, 3)
    done_bytes = sum(r.bytes_in for r in report.shards if not r.resumed)
    report.mb_per_s = round(done_bytes / MB / max(report.total_seconds, 1e-9), 1)
    report.peak_rss_mb = peak_rss_mb()
    report.readers, report.page_locked = n_readers, page_locked
    report.max_memory_mb = round(mem.budget / MB, 1)
    report.slots, report.slot_mb = mem.slots, round(mem.slot_bytes / MB, 1)
    report.cpu_processes = n_procs
    return report


# Auto: processes from 4 cores (threads of one process stop scaling between 4 and 16: 812 and 531 MB/s on the H200
# box) and 1 GiB of weights (each child's torch import costs seconds of CPU; on 2 loaded cores, 600 MB ran at 72 MB/s
# in threads and 36 in processes).
_CPU_PROCESSES_MIN_CORES = 4
_CPU_PROCESSES_MIN_BYTES = 1024 * MB


def _use_cpu_processes(asked: bool | None, layouts: dict[str, ShardLayout], uses_gpu: bool,
                       cpu_threads: int) -> Literal["always", "auto", ""]:
    """Whether this run quantizes in CPU child processes (quantize_checkpoint's `cpu_processes`): "always" (asked
    for: every weight read as stored goes to a child), "auto" (chosen: the threads quantize while the children
    start) or "" (threads only)."""
    if uses_gpu:
        return ""
    if asked is None:
        env = os.environ.get("QUANTKIT_CPU_PROCESSES", "").strip()
        if env in ("0", "1"):
            asked = env == "1"
        elif env and env != "auto":
            raise ExecutorError(f"QUANTKIT_CPU_PROCESSES={env!r}: give 1 (processes), 0 (threads) or auto, or unset "
                                "it")
    if asked is not None:
        return "always" if asked else ""
    weights = sum(u.source_bytes for layout in layouts.values() for u in layout.units
                  if u.kind == "quantize" and not u.decoded)
    return "auto" if cpu_threads >= _CPU_PROCESSES_MIN_CORES and weights >= _CPU_PROCESSES_MIN_BYTES else ""


def _cpu_children(cores: int, readers: int) -> int:
    """How many quantizer processes a CPU-only run starts: one per core below 8 cores; from 8 on, the cores left
    after the readers and the writer (on the H200 box's 16 cores, 24 GB in 4 GB shards, 16 children ran at 0.80x the
    disk floor and 8 at 0.89x: the readers' and the writer's hashing need cores too). QUANTKIT_CPU_CHILDREN=N
    overrides it."""
    env = os.environ.get("QUANTKIT_CPU_CHILDREN", "").strip()
    if env:
        if not env.isdigit() or int(env) < 1:
            raise ExecutorError(f"QUANTKIT_CPU_CHILDREN={env!r}: give a number of processes, 1 or more, or unset it")
        return int(env)
    return cores if cores < 8 else max(4, cores - readers - 2)


def _memory_plan(layouts: dict[str, ShardLayout], max_memory: int | None, readers: int, devices: list[str],
                 workers: int, uses_cpu: bool, uses_gpu: bool, decode_on_host: bool, cpu_threads: int) -> MemoryPlan:
    """The budget cut into slots; a `max_memory` below the largest tensor's work is refused (ExecutorError, one
    line) before any work. Quantizing on CPU keeps up to one float32 temporary per core beside the slots."""
    units = [u for layout in layouts.values() for u in layout.units]
    largest = max(units, key=lambda u: u.source_bytes + u.host_bytes(decode_on_host), default=None)
    largest_read = max((u.source_bytes for u in units), default=1)
    ratio = ratio_out(layouts, decode_on_host)
    reserve = 0
    if uses_cpu:
        biggest_q = max((u.source_bytes for u in units if u.kind == "quantize"), default=0)
        reserve = min(cpu_threads, 8) * biggest_q * 2
    budget = max_memory if max_memory is not None else default_max_memory(devices)
    mem = plan_memory(budget, readers, workers, max(largest_read, 1), ratio, uses_gpu, reserve)
    if mem is None and max_memory is None:  # the default is too small for this model's largest tensor: grow it
        need = int((max(largest_read, 1) * (1 + ratio) * 1.01 + MB + reserve) * 1.05) + MB
        mem = plan_memory(need, readers, workers, max(largest_read, 1), ratio, uses_gpu, reserve)
    if mem is None:
        assert largest is not None
        work = largest.source_bytes + largest.host_bytes(decode_on_host)
        need = int(max(largest_read, 1) * (1 + ratio) * 1.01) + MB + reserve
        raise ExecutorError(f"--max-memory {_mib(budget)} is smaller than the work on one tensor: {largest.name} "
                            f"takes {_mib(work)} ({_mib(largest.source_bytes)} read"
                            f"{', decoded and quantized' if largest.decoded else ''}); give --max-memory "
                            f"{-(-need // MB)}MiB or more")
    return mem
