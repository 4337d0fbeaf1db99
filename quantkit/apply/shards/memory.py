"""Host memory of the per-shard executor: the machine's memory, the byte budget (`--max-memory`) and how it is
cut into slots, and the reused (optionally page-locked) slot buffers that bound what a run holds.

A slot holds one batch from its read until its output is written: the batch's source bytes, the parts fetched by
offset, and room for its outputs (and, when the CPU decodes, the decoded values). Everything a run holds besides
torch itself lives in `slots x slot bytes`, which stays within the budget whatever the size of a shard."""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

MB = 1024 * 1024
PIN_FRACTION = 0.25  # page-lock the source buffers only while they take at most this share of the memory


def _cuda_host_register(t: torch.Tensor, register: bool) -> bool:
    """Page-lock (or unlock) a CPU tensor's memory for every GPU (cudaHostRegisterPortable) without copying it;
    False if CUDA refuses. A failed CUDA runtime call leaves an error in the calling thread's CUDA state, so callers
    use threads that never launch kernels (the readers; `HostBuffers.close` uses a throwaway thread)."""
    import torch

    try:
        cudart = torch.cuda.cudart()
        rc = (
            cudart.cudaHostRegister(t.data_ptr(), t.numel(), 1) if register else cudart.cudaHostUnregister(t.data_ptr())
        )
    except Exception:  # noqa: BLE001 - no CUDA runtime binding (ROCm builds, old torch): stay pageable
        return False
    return int(getattr(rc, "value", rc)) == 0


class HostBuffers:
    """The slots: one buffer each, allocated on first use at the slot size and reused (no fresh page faults per
    batch), optionally page-locked so that a GPU copies from and to it asynchronously."""

    def __init__(self, slots: int, capacity: int, pin: bool, shared: torch.Tensor | None = None) -> None:
        """`shared`: a uint8 buffer of at least slots x capacity bytes to cut the slots from (the shared memory that
        CPU quantizer processes map: quantkit.apply.shards.cpu_pool) instead of allocating them."""
        self.free: queue.Queue[torch.Tensor | None] = queue.Queue()
        self.capacity = max(capacity, 1)
        for k in range(slots):
            self.free.put(None if shared is None else shared[k * self.capacity : (k + 1) * self.capacity])
        # Below 1 MiB, buffers may share pages, which CUDA refuses to lock twice; such shards copy in no time.
        self.pin = pin and self.capacity >= MB
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


def host_empty(nbytes: int, pinned: bool) -> torch.Tensor:
    import torch

    if pinned:
        with contextlib.suppress(RuntimeError):
            return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    return torch.empty(nbytes, dtype=torch.uint8)


def _meminfo(key: str) -> int | None:
    with contextlib.suppress(OSError, ValueError, StopIteration), open("/proc/meminfo") as f:
        return int(next(line for line in f if line.startswith(key + ":")).split()[1]) * 1024
    return None


def peak_rss_mb() -> float:
    """This process's peak resident memory in MiB: VmHWM, which, unlike ru_maxrss, does not start from the
    parent's peak when the process was forked (a 24 GB parent made a small child report 38 GB)."""
    import resource

    with contextlib.suppress(OSError, ValueError, StopIteration), open("/proc/self/status") as f:
        return round(int(next(line for line in f if line.startswith("VmHWM:")).split()[1]) / 1024, 1)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def total_memory() -> int:
    total = _meminfo("MemTotal")
    return total if total is not None else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def available_memory() -> int:
    """MemAvailable (free plus reclaimable page cache), not MemFree: the source's own pages fill the cache."""
    available = _meminfo("MemAvailable")
    return available if available is not None else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


GIB = 1024 * MB
_GPU_BATCH_CAP = 512 * MB  # source bytes per batch on a GPU run: large enough for batched kernels
_CPU_BATCH_CAP = 128 * MB  # on CPU, one tensor per core: a batch only needs to keep the cores busy


def default_max_memory(devices: list[str]) -> int:
    """The budget without --max-memory: 1 GiB plus 1 GiB per CPU worker and 1.5 GiB per GPU, at most half of the
    available memory (at least 256 MiB)."""
    gpus = sum(d != "cpu" for d in devices)
    want = GIB + GIB * (len(devices) - gpus) + int(1.5 * GIB) * gpus
    return max(256 * MB, min(want, available_memory() // 2))


@dataclass(frozen=True)
class MemoryPlan:
    """How the budget is cut: `slots` buffers of `slot_bytes`, batches of at most `batch_bytes` read, `readers`
    read streams, buffers page-locked or not."""

    budget: int
    slots: int
    slot_bytes: int
    batch_bytes: int
    readers: int
    pin: bool


def plan_memory(
    budget: int, readers: int, devices: int, largest_read: int, out_ratio: float, uses_gpu: bool, reserve: int = 0
) -> MemoryPlan | None:
    """Slots for `readers` streams and `devices` workers within `budget` bytes (less `reserve`, what quantizing
    temporaries take), each slot one batch of at most `batch_bytes` read plus `out_ratio` times that for its
    outputs. None when not even one slot for the largest unit (`largest_read` bytes) fits. Fewer readers (down to
    1), then fewer slots (down to 1), are used before a batch is made smaller than the largest unit."""
    import torch

    usable = budget - reserve

    def slot_bytes(batch: int) -> int:  # 1% + 1 MiB: room for the 64-byte alignment of every piece
        return -(-int(batch * (1.0 + out_ratio) * 1.01 + MB) // 64) * 64

    if slot_bytes(largest_read) > usable:
        return None
    cap = max(_GPU_BATCH_CAP if uses_gpu else _CPU_BATCH_CAP, largest_read)
    n_readers = max(1, readers)
    slots = n_readers + devices + 1
    while slots > 1 and slot_bytes(largest_read) * slots > usable:
        if n_readers > 1:
            n_readers -= 1
        slots -= 1
    batch = largest_read
    while batch < cap and slot_bytes(min(cap, batch * 2)) * slots <= usable:
        batch = min(cap, batch * 2)
    lo, hi = batch, cap  # the largest batch that still fits, to within 1 MiB
    while hi - lo > MB:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if slot_bytes(mid) * slots <= usable else (lo, mid)
    batch = lo
    size = slot_bytes(batch)
    pin = uses_gpu and torch.cuda.is_available() and slots * size <= PIN_FRACTION * total_memory()
    return MemoryPlan(budget, slots, size, batch, min(n_readers, slots), pin)
