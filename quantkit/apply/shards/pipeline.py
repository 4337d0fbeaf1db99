"""Streaming per-shard executor: quantize a safetensors checkpoint shard by shard, without Quark, into exactly the
files AMD Quark 0.13's `ModelQuantizer(cfg).direct_quantize_checkpoint(src, dst, device=...)` writes.

Pipeline: reader threads (1 on CPU, where quantizing is the bottleneck; 4 when a GPU quantizes, because one read
stream is slower than a GPU) read each source shard once into a reused host buffer (hashing those bytes: sha256_in)
and expose its tensors as zero-copy views; one worker thread per device quantizes (on CPU a small pool runs one
tensor per core; on a GPU the shard's weights are batched by shape, see `process_device`); one writer thread
serialises each output shard the way safetensors does, hashing the bytes as it writes (sha256_out), verifies it,
renames it into place and records it in a journal.

Memory bound: there are `readers + workers + 1` source buffers (slots), each the size of the largest shard, and a
shard holds its buffer from its read until its output is written, so host memory stays near slots x (largest shard
+ its output; the output is at most ~0.3x the shard for MXFP4 from bf16 and ~0.5x for FP8) whatever the model's
size. Readers are dropped (down to 1) until the slots fit in half of the available memory. When a GPU is used the
buffers are page-locked (cudaHostRegister, so host-to-device copies are asynchronous DMA) while they fit in a
quarter of the machine's memory; GPU memory per worker is bounded by batches of at most 1 GiB of source bytes.

The Quark 0.13 rules it replays, and where it differs on purpose: quantkit.apply.shards.f2f.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import resource
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from quantkit.apply.shards.errors import ExecutorError, ShardVerificationError
from quantkit.apply.shards.f2f import check_aux_quark, copy_aux_quark, plan_shards, write_quark_config
from quantkit.apply.shards.journal import JOURNAL_NAME, open_journal, run_key
from quantkit.apply.shards.memory import MB, HostBuffers, reader_budget
from quantkit.apply.shards.process import Loaded, Output, Settings, decoded, load_shard, process_cpu, process_device
from quantkit.errors import QuantkitError
from quantkit.io.safetensors import serialize_safetensors
from quantkit.results.apply import ExecutorReport, ShardSummary
from quantkit.schemes.quark_config import quark_quantization_config

# What runs once every shard and the index are in place: (source, output, Quark's quantization_config) -> None.
Finish = Callable[[Path, Path, dict[str, Any]], None]

_PARTIAL_SUFFIX = ".quantkit-partial"
_GPU_READERS = 4  # read streams when a GPU quantizes: one stream reads ~0.8 GB/s, 4 reach a disk's parallel rate


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


def quantize_checkpoint(src: Path, dst: Path, *, scheme: str, exclude: list[str],
                        layer_config: dict[str, str] | None, devices: list[str], resume: bool = False,
                        progress: Callable[[ShardEvent], None] | None = None,
                        readers: int | None = None, decode: Any = None,
                        drop: set[str] | None = None, finish: Finish | None = None) -> ExecutorReport:
    """Quantize the safetensors checkpoint `src` into `dst`, shard by shard, byte-identical to Quark 0.13's
    `ModelQuantizer(LLMTemplate.get(t).get_config(scheme=scheme, exclude_layers=exclude,
    layer_config=layer_config)).direct_quantize_checkpoint(src, dst, device=...)`.

    `exclude` are Quark's fnmatch patterns on checkpoint module names; `layer_config` maps module patterns to
    schemes (first match wins). `devices`: torch devices, one worker each ("cpu", "cuda:0", ...). With
    `resume=True` the shards a previous, interrupted run recorded in dst's journal (whose output and source both
    still hash as recorded) are kept; all others are redone. Only one process may write `dst` at a time: `apply`
    holds the output's lock (quantkit.io.lock); a direct caller must do the same. `progress` is called in the
    caller's thread. `readers`: read streams (default 1 for CPU-only runs, 4 when a GPU quantizes); fewer are used
    when their buffers would not fit in half of the available memory (see the module's memory bound).
    `finish(src, dst, quantization_config)` writes the files beside the shards and the index once every shard is
    in place, given the `quantization_config` Quark's file-to-file path would write (quantkit apply writes its final
    config.json and its own allow-list of files, quantkit.io.files.AUX_FILES, there). None: Quark's own files
    (every other file and folder of the source, and Quark's config.json), byte-identical to Quark.
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
    if finish is None:
        check_aux_quark(src)
    plan = plan_shards(src, scheme, exclude, layer_config, decode)
    settings = Settings(src, dst, scheme, list(exclude), layer_config, plan, frozenset(drop or ()))
    key = run_key(src, scheme, exclude, layer_config, settings.drop, decode, plan.model_dtype)
    journal = open_journal(dst, key, resume=resume)
    for stale in [*dst.glob("*" + _PARTIAL_SUFFIX), dst / (JOURNAL_NAME + ".tmp")]:
        stale.unlink(missing_ok=True)
    # Shards of an earlier source layout (a shard renamed or removed since the interruption) must not survive.
    for stale in dst.glob("*.safetensors"):
        if stale.name not in plan.shards:
            stale.unlink()

    total = len(plan.shards)
    emit_queue: queue.Queue[ShardEvent] = queue.Queue()
    report = ExecutorReport(source=str(src), output=str(dst), scheme=scheme, devices=list(devices),
                            exclude=plan.exclude_modules, ignored_files=plan.ignored)
    records, weight_maps, todo, changed = journal.kept_shards(src, dst, plan.shards, streams=_GPU_READERS)
    report.source_changed = changed
    for i, name in enumerate(plan.shards):  # in shard order, as a resume found them
        if name in records:
            r = records[name]
            emit_queue.put(ShardEvent("resumed", name, i, total, r.device, r.bytes_in, r.bytes_out))
        elif name in changed:
            emit_queue.put(ShardEvent("source-changed", name, i, total))

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
    n_readers, pin = reader_budget(min(readers or (_GPU_READERS if uses_gpu else 1), len(todo)), len(devices),
                                   largest, uses_gpu)
    buffers = HostBuffers(n_readers + len(devices) + 1, largest, pin)
    work: queue.Queue[Loaded | None] = queue.Queue()
    results: queue.Queue[Output | None] = queue.Queue()

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
                    loaded = load_shard(src, name, i, host)
                    if decode is not None:
                        loaded = decoded(loaded, decode)
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
                        out = process_cpu(loaded, settings, device, pool)
                    else:
                        out = process_device(loaded, settings, device)
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
                    nbytes, sha_out = serialize_safetensors(out.tensors, partial, out.expected, error=ExecutorError,
                                                          mismatch=ShardVerificationError)
                except BaseException:
                    partial.unlink(missing_ok=True)
                    raise
                os.replace(partial, final)
                loaded = out.loaded
                seconds = loaded.seconds + out.seconds + time.perf_counter() - t0
                rec = ShardSummary(name=out.name, bytes_in=loaded.size, bytes_out=nbytes, sha256_in=loaded.sha256,
                                   sha256_out=sha_out, tensors=len(out.tensors), quantized=out.quantized,
                                   seconds=round(seconds, 3), device=out.device)
                names = list(out.tensors)
                host = loaded.host
                del out, loaded  # no view of the buffer may outlive this: the next shard is read into it
                buffers.release(host)
                journal.record(rec, names)
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
    if finish is None:
        copy_aux_quark(src, dst)
    weight_map: dict[str, str] = {}
    for name in plan.shards:
        for tensor in weight_maps[name]:
            weight_map[tensor] = name
    total_size = sum((dst / name).stat().st_size for name in plan.shards if weight_maps[name])
    with open(dst / "model.safetensors.index.json", "w") as f:
        json.dump({"metadata": {"total_size": total_size}, "weight_map": weight_map}, f, ensure_ascii=False, indent=4)
    report.quantization_config = quark_quantization_config(scheme, plan.exclude_modules, layer_config)
    if finish is None:
        write_quark_config(src, dst, scheme, plan.exclude_modules, layer_config)
    else:
        finish(src, dst, report.quantization_config)
    journal.remove()

    report.shards = [records[name] for name in plan.shards]
    report.resumed_shards = sum(r.resumed for r in report.shards)
    report.total_seconds = round(time.perf_counter() - t_start, 3)
    done_bytes = sum(r.bytes_in for r in report.shards if not r.resumed)
    report.mb_per_s = round(done_bytes / MB / max(report.total_seconds, 1e-9), 1)
    report.peak_rss_mb = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    report.readers, report.page_locked = n_readers, page_locked
    return report
