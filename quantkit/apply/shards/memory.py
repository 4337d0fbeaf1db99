"""Host memory of the per-shard executor: the machine's memory, and the reused (optionally page-locked)
source buffers, one per slot, that bound what a run holds."""

from __future__ import annotations

import contextlib
import os
import queue
import threading
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
        rc = cudart.cudaHostRegister(t.data_ptr(), t.numel(), 1) if register else \
            cudart.cudaHostUnregister(t.data_ptr())
    except Exception:  # noqa: BLE001 - no CUDA runtime binding (ROCm builds, old torch): stay pageable
        return False
    return int(getattr(rc, "value", rc)) == 0


class HostBuffers:
    """The memory budget: one source buffer per slot, allocated on first use at the largest shard's size and reused
    (no fresh page faults per shard), optionally page-locked so that a GPU copies from it asynchronously."""

    def __init__(self, slots: int, capacity: int, pin: bool) -> None:
        self.free: queue.Queue[torch.Tensor | None] = queue.Queue()
        for _ in range(slots):
            self.free.put(None)
        self.capacity = max(capacity, 1)
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


def total_memory() -> int:
    total = _meminfo("MemTotal")
    return total if total is not None else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def available_memory() -> int:
    """MemAvailable (free plus reclaimable page cache), not MemFree: the source's own pages fill the cache."""
    available = _meminfo("MemAvailable")
    return available if available is not None else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def reader_budget(readers: int, devices: int, largest: int, uses_gpu: bool) -> tuple[int, bool]:
    """(read streams, page-lock the buffers) for `readers` asked streams, `devices` workers and shards of at most
    `largest` bytes: one buffer per shard alive at once (being read, queued, quantized or written), so readers are
    dropped (down to 1) until readers + devices + 1 buffers fit in half of the available memory, and the buffers are
    page-locked only on a GPU run where they take at most PIN_FRACTION of the machine's memory."""
    import torch

    n_readers = max(1, readers)
    half_free = available_memory() // 2
    while n_readers > 1 and (n_readers + devices + 1) * largest > half_free:
        n_readers -= 1
    slots = n_readers + devices + 1
    pin = uses_gpu and torch.cuda.is_available() and slots * largest <= PIN_FRACTION * total_memory()
    return n_readers, pin
