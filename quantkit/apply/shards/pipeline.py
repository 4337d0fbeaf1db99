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

The stages are the methods of one `_Pipeline` per run (read_batches, quantize_batches, write_outputs), their shared
state its attributes; quantize_checkpoint builds it, runs it and returns its report. The Quark 0.13 rules it replays,
and where it differs on purpose: quantkit.apply.shards.f2f.
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
from quantkit.apply.shards.journal import open_journal, run_key
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
    window = queue_[: max(1, width)]
    rest = queue_[len(window) :]
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


def quantize_checkpoint(
    src: Path,
    dst: Path,
    *,
    scheme: str,
    exclude: list[str],
    layer_config: dict[str, str] | None,
    devices: list[str],
    resume: bool = False,
    progress: Callable[[ShardEvent], None] | None = None,
    readers: int | None = None,
    decode: Any = None,
    drop: set[str] | None = None,
    finish: Finish | None = None,
    max_memory: int | None = None,
    max_shard_size: int | None = None,
    cpu_processes: bool | None = None,
) -> ExecutorReport:
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
    t_start = time.perf_counter()
    _check_arguments(Path(src), Path(dst), devices, readers, max_shard_size, max_memory)
    pipeline = _Pipeline(
        Path(src),
        Path(dst),
        scheme=scheme,
        exclude=exclude,
        layer_config=layer_config,
        devices=devices,
        resume=resume,
        readers=readers,
        decode=decode,
        drop=drop,
        finish=finish,
        max_memory=max_memory,
        max_shard_size=max_shard_size,
        cpu_processes=cpu_processes,
    )
    pipeline.run(progress)
    return pipeline.complete(t_start)


def _check_arguments(
    src: Path, dst: Path, devices: list[str], readers: int | None, max_shard_size: int | None, max_memory: int | None
) -> None:
    """quantize_checkpoint's arguments, each refused in one line (ExecutorError) before anything is read."""
    import torch

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


class _Pipeline:
    """One quantize_checkpoint run: three stages joined by two queues,

        read_batches (reader threads) --work--> quantize_batches (one thread per worker device)
            --results--> write_outputs (one writer thread),

    with the caller's thread relaying progress events (`events`). Built in three steps: the plan (__init__: shards,
    layouts, the memory plan, the journal and what a resume keeps, the batches in read order), the run (`run`: the
    slots and other resources, the stage threads, their teardown), the files after the shards (`complete`).

    State the stages share, and who may touch it: `next_batch` and `readers_left` under `take_lock` (readers);
    `started` under `started_lock` (workers); `hashes` (a reader feeds a shard's, the writer reads it once done);
    `open_outputs`, `progress_of`, `records`, `weight_maps`, `source_sha` and `unrecorded` (the writer alone while
    the threads run); `stop` and `errors` (any thread, through `fail`); `buffers` (the slots: acquired by a reader,
    released by whoever drops the batch)."""

    def __init__(
        self,
        src: Path,
        dst: Path,
        *,
        scheme: str,
        exclude: list[str],
        layer_config: dict[str, str] | None,
        devices: list[str],
        resume: bool,
        readers: int | None,
        decode: Any,
        drop: set[str] | None,
        finish: Finish | None,
        max_memory: int | None,
        max_shard_size: int | None,
        cpu_processes: bool | None,
    ) -> None:
        if finish is None:
            check_aux_quark(src)
        self.src, self.dst, self.scheme, self.layer_config, self.finish = src, dst, scheme, layer_config, finish
        self.plan = plan_shards(src, scheme, exclude, layer_config, decode)
        self.settings = Settings(
            src, dst, scheme, list(exclude), layer_config, self.plan, frozenset(drop or ()), decode
        )
        self.layouts = shard_layouts(
            src,
            self.plan,
            scheme=scheme,
            exclude=list(exclude),
            layer_config=layer_config,
            drop=self.settings.drop,
            decode=decode,
        )
        self._plan_machine(devices, readers, decode, max_memory, cpu_processes)

        key = run_key(
            src, scheme, exclude, layer_config, self.settings.drop, decode, self.plan.model_dtype, max_shard_size
        )
        self.outs = (
            output_layouts(self.layouts, self.plan.shards, max_shard_size) if max_shard_size is not None else None
        )
        self.out_names = [o.name for o in self.outs] if self.outs is not None else self.plan.shards
        self.out_by_name: dict[str, OutputLayout] = {o.name: o for o in self.outs or []}
        self.out_of = {t: o.name for o in self.outs or [] for t in o.names}
        self.journal = open_journal(dst, key, resume=resume)
        self._remove_stale()
        self.events: queue.Queue[ShardEvent] = queue.Queue()
        self.report = ExecutorReport(
            source=str(src),
            output=str(dst),
            scheme=scheme,
            devices=list(devices),
            exclude=self.plan.exclude_modules,
            ignored_files=self.plan.ignored,
        )
        self._keep_finished()
        self.quantized_names = {
            u.outputs[0].name for lay in self.layouts.values() for u in lay.units if u.kind == "quantize"
        }

        for _, name in self.todo:
            cut_batches(self.layouts[name], self.mem.batch_bytes, self.decode_on_host)
        self.index_of = {name: i for i, name in enumerate(self.out_names)}
        self.index_of.update({name: i for i, name in enumerate(self.plan.shards) if name not in self.index_of})
        self.pending: list[Batch] = interleave([self.layouts[name].batches for _, name in self.todo], self.mem.readers)
        self.hashes = {name: _SourceHash(len(self.layouts[name].batches)) for _, name in self.todo}
        self.n_readers = max(1, min(self.mem.readers, len(self.pending)))

        # The run's shared state (see the class docstring).
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.take_lock = threading.Lock()
        self.next_batch = 0
        self.readers_left = self.n_readers
        self.started: set[str] = set()
        self.started_lock = threading.Lock()
        self.open_outputs: dict[str, OutputShard] = {}
        self.progress_of: dict[str, dict[str, Any]] = {}
        self.unrecorded = set(self.hashes) if self.outs is not None else set()  # re-sharded: sources not journaled
        self.work: queue.Queue[tuple[Loaded, threading.Event] | None] = queue.Queue()
        self.results: queue.Queue[tuple[Output, threading.Event] | None] = queue.Queue()
        self.n_procs = 0
        self.page_locked = False

    def _plan_machine(
        self, devices: list[str], readers: int | None, decode: Any, max_memory: int | None, cpu_processes: bool | None
    ) -> None:
        """Where the work runs: the worker threads, CPU processes or not, the read streams and the memory plan."""
        import torch

        self.cpu_threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        self.uses_cpu = any(torch.device(d).type == "cpu" for d in devices)
        self.uses_gpu = not all(torch.device(d).type == "cpu" for d in devices)
        self.decode_on_host = decode is not None and self.uses_cpu
        self.procs = _use_cpu_processes(cpu_processes, self.layouts, self.uses_gpu, self.cpu_threads)
        # The worker threads: one per device; with CPU processes at least two on CPU, so that the next batch is handed
        # out while the last tensors of one are still being quantized.
        self.workers = list(devices) + (["cpu"] if self.procs and len(devices) == 1 else [])
        default_readers = _GPU_READERS if self.uses_gpu or (self.procs and self.cpu_threads >= 8) else 1
        self.mem = _memory_plan(
            self.layouts,
            max_memory,
            readers or default_readers,
            devices,
            len(self.workers),
            self.uses_cpu,
            self.uses_gpu,
            self.decode_on_host,
            self.cpu_threads,
        )
        # a bad QUANTKIT_CPU_CHILDREN: before any work
        self.n_children = _cpu_children(self.cpu_threads, self.mem.readers) if self.procs else 0

    def _remove_stale(self) -> None:
        """Partial files of an interrupted run, and shards of an earlier source layout (a shard renamed or removed
        since the interruption): none may survive."""
        for stale in [*self.dst.glob("*" + _PARTIAL_SUFFIX), *self.dst.glob(".*.quantkit-tmp")]:
            stale.unlink(missing_ok=True)
        for stale in self.dst.glob("*.safetensors"):
            if stale.name not in self.out_names:
                stale.unlink()

    def _keep_finished(self) -> None:
        """What a resume keeps (`records`, `weight_maps`, `source_sha`) and what is left to do (`todo`: (index, name)
        of the source shards to read), with a "resumed" or "source-changed" event for each shard it looked at."""
        plan, total = self.plan, len(self.out_names)
        self.source_sha: dict[str, str] = {}
        if self.outs is None:
            depends = {name: self.layouts[name].depends_on for name in plan.shards}
            self.records, self.weight_maps, self.todo, changed = self.journal.kept_shards(
                self.src, self.dst, plan.shards, streams=_GPU_READERS, depends_on=depends
            )
        else:
            self.records, self.source_sha, changed = self.journal.kept_outputs(
                self.src, self.dst, {o.name: (o.names, o.sources) for o in self.outs}, streams=_GPU_READERS
            )
            self.weight_maps = {o.name: o.names for o in self.outs}
            need = {s for o in self.outs if o.name not in self.records for s in o.sources} | (
                set(plan.shards) - set(self.source_sha)
            )
            self.todo = [(i, name) for i, name in enumerate(plan.shards) if name in need]
        self.report.source_changed = changed
        for i, name in enumerate(self.out_names):  # in shard order, as a resume found them
            if name in self.records:
                r = self.records[name]
                self.events.put(ShardEvent("resumed", name, i, total, r.device, r.bytes_in, r.bytes_out))
        for i, name in enumerate(plan.shards):
            if name in changed:
                self.events.put(ShardEvent("source-changed", name, i, total))

    # --- the run ---------------------------------------------------------------------------------------------------

    def run(self, progress: Callable[[ShardEvent], None] | None) -> None:
        """Start the stages, relay their events to `progress` in this thread until all are done, tear down; the first
        error of any stage raised here (a QuantkitError as it is, anything else as one ExecutorError line)."""
        import torch

        self.files = SourceFiles(self.src, self.plan.sizes)
        saved_threads = torch.get_num_threads()
        self.pool = (
            ThreadPoolExecutor(max_workers=self.cpu_threads, thread_name_prefix="quantkit-cpu")
            if self.uses_cpu
            else None
        )
        self.arena: SharedArena | None = None
        self.quantizers: CpuQuantizers | None = None
        if self.procs and self.pending:
            self.arena = SharedArena(self.mem.slots * self.mem.slot_bytes)
            self.quantizers = CpuQuantizers(self.n_children, self.arena, wait=self.procs == "always")
        self.buffers = HostBuffers(
            self.mem.slots, self.mem.slot_bytes, self.mem.pin, self.arena.tensor if self.arena is not None else None
        )

        threads = [
            threading.Thread(target=self.read_batches, name=f"quantkit-reader-{k}", daemon=True)
            for k in range(self.n_readers)
        ]
        threads.append(threading.Thread(target=self.write_outputs, name="quantkit-writer", daemon=True))
        threads += [
            threading.Thread(target=self.quantize_batches, args=(d,), name=f"quantkit-{d}-{k}", daemon=True)
            for k, d in enumerate(self.workers)
        ]
        try:
            # CPU: parallel across tensors instead, cheaper than intra-op threads per step. GPU only: the CPU does no
            # tensor math but rare casts; many idle intra-op threads only spin after each small CPU op.
            torch.set_num_threads(1 if self.uses_cpu else min(4, self.cpu_threads))
            if self.pending:
                for t in threads:
                    t.start()
            while any(t.is_alive() for t in threads) or not self.events.empty():
                with contextlib.suppress(queue.Empty):
                    event = self.events.get(timeout=0.05)
                    if progress is not None:
                        progress(event)
        finally:
            self.stop.set()  # no-op after a clean run; after an error or an interrupt it winds the threads down
            for t in threads:
                if t.is_alive() or t.ident is not None:
                    t.join()
            self._close(saved_threads)
        if self.errors:
            first = self.errors[0]
            if isinstance(first, QuantkitError):
                raise first
            raise ExecutorError(f"quantizing {self.src} failed: {type(first).__name__}: {first}") from first

    def _close(self, saved_threads: int) -> None:
        """Every resource of the run released, whatever state the threads left it in."""
        import torch

        for shard in self.open_outputs.values():
            shard.abandon()
        self.files.close()
        if self.pool is not None:
            self.pool.shutdown(wait=True)
        if self.quantizers is not None:
            self.n_procs = len(self.quantizers.children)
            self.quantizers.close()
        self.page_locked = bool(self.buffers.pinned)
        self.buffers.close()
        del self.buffers  # the slots are views of the arena, which cannot close while they live
        if self.arena is not None:
            self.arena.close()
        torch.set_num_threads(saved_threads)
        host_empty_cache = getattr(torch._C, "_host_emptyCache", None)
        if self.uses_gpu and host_empty_cache is not None:
            host_empty_cache()  # page-locked staging memory, cached by torch

    def fail(self, e: BaseException) -> None:
        """A stage's error: kept for the caller's thread, and every stage told to stop."""
        self.errors.append(e)
        self.stop.set()

    # --- reader stage ----------------------------------------------------------------------------------------------

    def read_batches(self) -> None:
        """A reader thread: the next batch in read order into a free slot, handed to the workers and to its shard's
        hash; the last reader out tells every worker to finish."""
        try:
            while True:
                with self.take_lock:  # batches take slots in order, so the one the hash waits for always has one
                    if self.next_batch >= len(self.pending) or self.stop.is_set():
                        return
                    host = self.buffers.acquire(self.stop)
                    if host is None:
                        return
                    batch = self.pending[self.next_batch]
                    self.next_batch += 1
                layout = self.layouts[batch.shard]
                try:
                    loaded = read_batch(self.files, batch, host, layout.data_start, layout.entries)
                except BaseException:
                    self.buffers.release(host)
                    raise
                self.buffers.pin_once(host)
                hashed = threading.Event()
                self.work.put((loaded, hashed))
                self.hashes[batch.shard].add(loaded, hashed)
                del loaded
        except BaseException as e:  # noqa: BLE001 - reported by the caller's thread
            self.fail(e)
        finally:
            with self.take_lock:
                self.readers_left -= 1
                if self.readers_left == 0:
                    for _ in self.workers:
                        self.work.put(None)

    # --- worker stage ----------------------------------------------------------------------------------------------

    def quantize_batches(self, device: str) -> None:
        """A worker thread of `device`: each batch it takes decoded and quantized (process_cpu / process_device) and
        handed to the writer; after a stop, batches are dropped and their slots released."""
        import torch

        try:
            if torch.device(device).type == "cuda" and torch.device(device).index is not None:
                torch.cuda.set_device(torch.device(device))
            while True:
                item = self.work.get()
                if item is None:
                    return
                loaded, hashed = item
                if self.stop.is_set():
                    hashed.wait(1.0)
                    self.buffers.release(loaded.host)
                    continue
                shard = loaded.batch.shard
                with self.started_lock:
                    first = shard not in self.started
                    self.started.add(shard)
                if first:
                    self.events.put(
                        ShardEvent(
                            "start", shard, self.index_of[shard], len(self.out_names), device, self.layouts[shard].size
                        )
                    )
                try:
                    if torch.device(device).type == "cpu":
                        out = process_cpu(loaded, self.settings, device, self.pool, self.quantizers)
                    else:
                        out = process_device(loaded, self.settings, device)
                except BaseException:
                    hashed.wait(1.0)
                    self.buffers.release(loaded.host)
                    raise
                self.results.put((out, hashed))
                del loaded, out, item  # the writer owns them now
        except BaseException as e:  # noqa: BLE001
            self.fail(e)
        finally:
            self.results.put(None)

    # --- writer stage ----------------------------------------------------------------------------------------------

    def write_outputs(self) -> None:
        """The writer thread: each quantized batch written into its output shard(s) until every worker is done; a
        batch's slot is released once its tensors are written and its source bytes hashed."""
        finished_workers = 0
        while finished_workers < len(self.workers):
            item = self.results.get()
            if item is None:
                finished_workers += 1
                continue
            out, hashed = item
            if self.stop.is_set():
                host = out.loaded.host
                del out, item
                hashed.wait(1.0)
                self.buffers.release(host)
                continue
            box = [out]
            del out, item  # the write methods own the batch: no view of its slot may outlive them
            try:
                if self.outs is None:
                    self._write_shard(box, hashed)
                else:
                    self._write_resharded(box, hashed)
            except BaseException as e:  # noqa: BLE001
                self.fail(e)

    def _write_shard(self, box: list[Output], hashed: threading.Event) -> None:
        """One batch into the output shard of its source shard (Quark's layout), which is renamed into place and
        journaled once its last tensor is in and its source hash is done."""
        out = box.pop()
        t0 = time.perf_counter()
        name = out.loaded.batch.shard
        layout = self.layouts[name]
        shard = self.open_outputs.get(name)
        if shard is None:
            shard = self.open_outputs[name] = OutputShard(layout, self.dst / (name + _PARTIAL_SUFFIX))
            self.progress_of[name] = {"seconds": 0.0, "quantized": 0, "device": out.device}
        for tensor_name, t in out.tensors:
            shard.write(tensor_name, t)
        info = self.progress_of[name]
        info["seconds"] += out.loaded.seconds + out.seconds + time.perf_counter() - t0
        info["quantized"] += out.quantized
        host = out.loaded.host
        del out  # no view of the slot may outlive this: the next batch is read into it
        if not _wait(hashed, self.stop):
            return
        self.buffers.release(host)
        if not shard.complete or not _wait(self.hashes[name].done, self.stop):
            return
        nbytes, sha_out = shard.close()
        os.replace(self.dst / (name + _PARTIAL_SUFFIX), self.dst / name)
        del self.open_outputs[name]
        rec = ShardSummary(
            name=name,
            bytes_in=layout.size,
            bytes_out=nbytes,
            sha256_in=self.hashes[name].hasher.hexdigest(),
            sha256_out=sha_out,
            tensors=len(layout.names),
            quantized=info["quantized"],
            seconds=round(info["seconds"], 3),
            device=info["device"],
        )
        self.journal.record(rec, layout.names, layout.depends_on)
        self.records[name] = rec
        self.weight_maps[name] = layout.names
        self.events.put(
            ShardEvent(
                "done",
                name,
                self.index_of[name],
                len(self.out_names),
                rec.device,
                rec.bytes_in,
                rec.bytes_out,
                rec.seconds,
            )
        )

    def _write_resharded(self, box: list[Output], hashed: threading.Event) -> None:
        """One batch's tensors into the output shards the plan puts them in (those a resume kept are skipped); each
        output shard whose last tensor is in is finished, each source shard hashed in full is journaled."""
        out = box.pop()
        t0 = time.perf_counter()
        touched: list[str] = []
        for tensor_name, t in out.tensors:
            name = self.out_of[tensor_name]
            if name in self.records:
                continue
            shard = self.open_outputs.get(name)
            if shard is None:
                shard = self.open_outputs[name] = OutputShard(
                    self.out_by_name[name], self.dst / (name + _PARTIAL_SUFFIX)
                )
                self.progress_of[name] = {"seconds": 0.0, "device": out.device}
            shard.write(tensor_name, t)
            if name not in touched:
                touched.append(name)
        if touched:
            self.progress_of[touched[0]]["seconds"] += out.loaded.seconds + out.seconds + time.perf_counter() - t0
        host = out.loaded.host
        del out  # no view of the slot may outlive this: the next batch is read into it
        if not _wait(hashed, self.stop):
            return
        self.buffers.release(host)
        for name in touched:
            if self.open_outputs[name].complete:
                self._finish_output(name)
        for name in [n for n in self.unrecorded if self.hashes[n].done.is_set()]:
            self.unrecorded.discard(name)
            self.source_sha[name] = self.hashes[name].hasher.hexdigest()
            self.journal.record_source(name, self.plan.sizes[name], self.source_sha[name])

    def _finish_output(self, name: str) -> None:
        """A re-sharded output shard whose last tensor is in: renamed into place and journaled."""
        shard, layout, info = self.open_outputs.pop(name), self.out_by_name[name], self.progress_of[name]
        nbytes, sha_out = shard.close()
        os.replace(self.dst / (name + _PARTIAL_SUFFIX), self.dst / name)
        rec = ShardSummary(
            name=name,
            bytes_in=layout.bytes_in,
            bytes_out=nbytes,
            sha256_out=sha_out,
            tensors=len(layout.names),
            quantized=sum(n in self.quantized_names for n in layout.names),
            seconds=round(info["seconds"], 3),
            device=info["device"],
        )
        self.journal.record(rec, layout.names, layout.sources)
        self.records[name] = rec
        self.events.put(
            ShardEvent(
                "done",
                name,
                self.index_of[name],
                len(self.out_names),
                rec.device,
                rec.bytes_in,
                rec.bytes_out,
                rec.seconds,
            )
        )

    # --- after the shards ------------------------------------------------------------------------------------------

    def complete(self, t_start: float) -> ExecutorReport:
        """All shards are in place: the files Quark writes after its shard loop, in its order (or `finish`'s), the
        journal removed, and the report."""
        src, dst, plan, report = self.src, self.dst, self.plan, self.report
        if self.finish is None:
            copy_aux_quark(src, dst)
        weight_map: dict[str, str] = {}
        for name in self.out_names:
            for tensor in self.weight_maps[name]:
                weight_map[tensor] = name
        if self.outs is None:  # Quark's index: the sizes of the files that hold tensors
            total_size = sum((dst / name).stat().st_size for name in plan.shards if self.weight_maps[name])
            source_sha = {name: self.records[name].sha256_in for name in plan.shards}
        else:  # transformers' index (modeling_utils save_pretrained): the tensors' bytes
            source_sha = self.source_sha
            source_sha.update(
                {name: h.hasher.hexdigest() for name, h in self.hashes.items() if name in self.unrecorded}
            )
            total_size = sum(o.nbytes for layout in self.outs for o in layout.outputs)
        with open(dst / "model.safetensors.index.json", "w") as f:
            json.dump(
                {"metadata": {"total_size": total_size}, "weight_map": weight_map}, f, ensure_ascii=False, indent=4
            )
        report.quantization_config = quark_quantization_config(self.scheme, plan.exclude_modules, self.layer_config)
        if self.finish is None:
            write_quark_config(src, dst, self.scheme, plan.exclude_modules, self.layer_config)
        else:
            self.finish(src, dst, report.quantization_config)
        self.journal.remove()

        report.shards = [self.records[name] for name in self.out_names]
        report.source_sha256 = {name: source_sha[name] for name in plan.shards}
        report.resumed_shards = sum(r.resumed for r in report.shards)
        report.total_seconds = round(time.perf_counter() - t_start, 3)
        done_bytes = sum(r.bytes_in for r in report.shards if not r.resumed)
        report.mb_per_s = round(done_bytes / MB / max(report.total_seconds, 1e-9), 1)
        report.peak_rss_mb = peak_rss_mb()
        report.readers, report.page_locked = self.n_readers, self.page_locked
        report.max_memory_mb = round(self.mem.budget / MB, 1)
        report.slots, report.slot_mb = self.mem.slots, round(self.mem.slot_bytes / MB, 1)
        report.cpu_processes = self.n_procs
        return report


# Auto: processes from 4 cores (threads of one process stop scaling between 4 and 16: 812 and 531 MB/s on the H200
# box) and 1 GiB of weights (each child's torch import costs seconds of CPU; on 2 loaded cores, 600 MB ran at 72 MB/s
# in threads and 36 in processes).
_CPU_PROCESSES_MIN_CORES = 4
_CPU_PROCESSES_MIN_BYTES = 1024 * MB


def _use_cpu_processes(
    asked: bool | None, layouts: dict[str, ShardLayout], uses_gpu: bool, cpu_threads: int
) -> Literal["always", "auto", ""]:
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
            raise ExecutorError(f"QUANTKIT_CPU_PROCESSES={env!r}: give 1 (processes), 0 (threads) or auto, or unset it")
    if asked is not None:
        return "always" if asked else ""
    weights = sum(
        u.source_bytes for layout in layouts.values() for u in layout.units if u.kind == "quantize" and not u.decoded
    )
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


def _memory_plan(
    layouts: dict[str, ShardLayout],
    max_memory: int | None,
    readers: int,
    devices: list[str],
    workers: int,
    uses_cpu: bool,
    uses_gpu: bool,
    decode_on_host: bool,
    cpu_threads: int,
) -> MemoryPlan:
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
        raise ExecutorError(
            f"--max-memory {_mib(budget)} is smaller than the work on one tensor: {largest.name} "
            f"takes {_mib(work)} ({_mib(largest.source_bytes)} read"
            f"{', decoded and quantized' if largest.decoded else ''}); give --max-memory "
            f"{-(-need // MB)}MiB or more"
        )
    return mem
