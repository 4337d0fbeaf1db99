"""CPU quantizer processes: the weights of a CPU-only run quantized by one child process per core, reading each
tensor from and writing its result into the slot buffers, which live in one shared memory file (memfd).

Why processes, not threads: a BF16 MoE checkpoint is thousands of ~3 MB tensors, and `quantize_mxfp4` runs ~35 torch
calls per 256 K elements. Run from threads of one process, every call takes the GIL to parse its arguments and
allocate its outputs. Measured on one H200 box (16 Xeon cores, benchmarks/cpu_quantize_scaling.py): the kernel alone
ran 404 MB/s in 1 thread, 812 in 4, 531 in 16, and 5348 MB/s in 16 processes; the executor with threads reached
166 MB/s with 1 CPU worker and 146 with 4, against a 985 MB/s read+write floor.

Each child runs `serve(FD, SIZE, IN, OUT)`: FD the shared file (inherited), IN and OUT the ends of its two pipes;
tasks and results are small pickled tuples, the tensor bytes never cross a pipe. A child ends at EOF on its task
pipe (the parent closing it, or dying)."""

from __future__ import annotations

import mmap
import os
import pickle
import queue
import select
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from quantkit.apply.shards.errors import ExecutorError
from quantkit.errors import NonFiniteWeightError

if TYPE_CHECKING:
    import torch

# A task: (input offset, input bytes, torch dtype name, shape, scheme, weight offset, weight room, scale offset,
# scale room), offsets into the shared file. A result: ("ok", (weight dtype, shape), (scale dtype, shape), bad scale)
# | ("non-finite", message) | ("value", message) | ("error", message).
Task = tuple[int, int, str, tuple[int, ...], str, int, int, int, int]


@dataclass
class Quantized:
    """Where a child put one tensor's result, and what it is."""

    weight: tuple[str, tuple[int, ...]]  # torch dtype name, shape
    scale: tuple[str, tuple[int, ...]]
    bad_scale: bool


class SharedArena:
    """One anonymous shared memory file (memfd_create) mapped here, split into the run's slot buffers; children map
    the same file through its inherited descriptor."""

    def __init__(self, nbytes: int) -> None:
        import torch

        self.nbytes = max(nbytes, mmap.PAGESIZE)
        self.fd = os.memfd_create("quantkit-slots", 0)
        os.ftruncate(self.fd, self.nbytes)
        self.map = mmap.mmap(self.fd, self.nbytes)
        self.tensor = torch.frombuffer(self.map, dtype=torch.uint8)

    def offset_of(self, t: torch.Tensor) -> int:
        """Byte offset of a view of the arena."""
        off = t.data_ptr() - self.tensor.data_ptr()
        assert 0 <= off <= self.nbytes, "tensor is not in the shared arena"
        return off

    def close(self) -> None:
        del self.tensor
        try:
            self.map.close()
        except BufferError:  # a view still exported (an error path): the mapping goes with the process
            pass
        os.close(self.fd)


class _Child:
    def __init__(self, arena: SharedArena) -> None:
        task_r, task_w = os.pipe()
        res_r, res_w = os.pipe()
        env = dict(os.environ)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # one core each: the parent runs one child per core
            env[var] = "1"
        serve = (
            f"from quantkit.apply.shards.cpu_pool import serve; serve({arena.fd}, {arena.nbytes}, {task_r}, {res_w})"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", serve],
            pass_fds=(arena.fd, task_r, res_w),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )  # a Ctrl-C reaches the parent alone; a child ends when its task pipe closes
        os.close(task_r)
        os.close(res_w)
        self.tasks = os.fdopen(task_w, "wb")
        self.results = os.fdopen(res_r, "rb")
        self.ready = False  # the child says so once it has imported torch

    def poll_ready(self, wait: bool) -> bool:
        """Whether the child is ready; `wait`: wait for it."""
        if not self.ready and (wait or select.select([self.results], [], [], 0)[0]):
            self._read()
            self.ready = True
        return self.ready

    def _read(self) -> Any:
        try:
            return pickle.load(self.results)
        except (EOFError, OSError) as e:
            raise ExecutorError(
                f"a CPU quantizer process exited (code {self.proc.poll()}): {e or 'no result'}; "
                "rerun with --resume, or set QUANTKIT_CPU_PROCESSES=0 to quantize in threads"
            ) from None

    def run(self, task: Task) -> Any:
        try:
            pickle.dump(task, self.tasks)
            self.tasks.flush()
        except OSError as e:
            raise ExecutorError(
                f"a CPU quantizer process exited (code {self.proc.poll()}): {e}; rerun with --resume, "
                "or set QUANTKIT_CPU_PROCESSES=0 to quantize in threads"
            ) from None
        return self._read()

    def close(self) -> None:
        for f in (self.tasks, self.results):
            try:
                f.close()
            except OSError:
                pass
        if not self.ready:  # still importing torch: nothing of its work is wanted
            self.proc.kill()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class CpuQuantizers:
    """`n` child processes over `arena`; `quantize` may be called from up to `n` threads at once (each call takes an
    idle child for one tensor). `wait`: a call waits for a child still starting, rather than returning None."""

    def __init__(self, n: int, arena: SharedArena, wait: bool = False) -> None:
        self.arena = arena
        self.wait = wait
        self.children: list[_Child] = []
        self.idle: queue.Queue[_Child] = queue.Queue()
        self.lock = threading.Lock()
        try:
            for _ in range(max(1, n)):
                child = _Child(arena)
                self.children.append(child)
                self.idle.put(child)
        except BaseException:
            self.close()
            raise

    def holds(self, w: torch.Tensor) -> bool:
        """`w` is a contiguous CPU view of the arena (a misaligned tensor was copied out of its slot)."""
        off = w.data_ptr() - self.arena.tensor.data_ptr()
        return (
            w.device.type == "cpu"
            and w.is_contiguous()
            and off >= 0
            and off + w.numel() * w.element_size() <= self.arena.nbytes
        )

    def quantize(self, w: torch.Tensor, scheme: str, q_out: torch.Tensor, s_out: torch.Tensor) -> Quantized | None:
        """Quantize `w` (a view of the arena) with `scheme` into the arena views `q_out` and `s_out` (uint8, the
        planned sizes). Raises NonFiniteWeightError or ValueError as quantize_weight(finite_only=True) would. None while
        the child it got is still starting (importing torch takes seconds): the caller quantizes that one itself."""
        off = self.arena.offset_of(w)
        task: Task = (
            off,
            w.numel() * w.element_size(),
            str(w.dtype).removeprefix("torch."),
            tuple(w.shape),
            scheme,
            self.arena.offset_of(q_out),
            q_out.numel(),
            self.arena.offset_of(s_out),
            s_out.numel(),
        )
        child = self.idle.get()
        try:
            if not child.poll_ready(self.wait):
                return None
            result = child.run(task)
        finally:
            self.idle.put(child)
        kind = result[0]
        if kind == "ok":
            return Quantized(result[1], result[2], result[3])
        if kind == "non-finite":
            raise NonFiniteWeightError(result[1])
        if kind == "value":
            raise ValueError(result[1])
        raise ExecutorError(f"CPU quantizer process: {result[1]}")

    def close(self) -> None:
        for child in self.children:
            child.close()
        self.children.clear()


def serve(fd: int, size: int, task_fd: int, result_fd: int) -> None:
    """A child's loop: tasks from `task_fd`, results to `result_fd`, tensors in the shared file `fd`."""
    import torch

    import quantkit.schemes  # noqa: F401 - imported before saying ready

    torch.set_num_threads(1)
    shared = mmap.mmap(fd, size)
    buf = torch.frombuffer(shared, dtype=torch.uint8)
    tasks, results = os.fdopen(task_fd, "rb"), os.fdopen(result_fd, "wb")
    try:
        _serve(buf, tasks, results)
    except BrokenPipeError:  # the parent is gone or done
        pass


def _serve(buf: torch.Tensor, tasks: Any, results: Any) -> None:
    import torch

    from quantkit.schemes import SCHEMES, quantize_weight

    pickle.dump(("ready",), results)
    results.flush()
    while True:
        try:
            task: Task = pickle.load(tasks)
        except EOFError:
            return
        in_off, in_len, dtype_name, shape, scheme, q_off, q_room, s_off, s_room = task
        dtype = getattr(torch, dtype_name)
        try:
            raw = buf[in_off : in_off + in_len]
            if in_off % torch.empty((), dtype=dtype).element_size():
                raw = raw.clone()
            w = raw.view(dtype).reshape(shape)
            q, scale = quantize_weight(w, scheme, finite_only=True)
            qb, sb = q.contiguous().reshape(-1).view(torch.uint8), scale.contiguous().reshape(-1).view(torch.uint8)
            if qb.numel() != q_room or sb.numel() != s_room:
                result: Any = (
                    "error",
                    f"{scheme} gave {qb.numel()} + {sb.numel()} bytes for {tuple(shape)}, the "
                    f"plan {q_room} + {s_room} (internal error)",
                )
            else:
                buf[q_off : q_off + q_room].copy_(qb)
                buf[s_off : s_off + s_room].copy_(sb)
                bad_scale = SCHEMES[scheme].bad_scale
                bad = bool(bad_scale(scale)) if bad_scale is not None else False
                result = (
                    "ok",
                    (str(q.dtype).removeprefix("torch."), tuple(q.shape)),
                    (str(scale.dtype).removeprefix("torch."), tuple(scale.shape)),
                    bad,
                )
        except NonFiniteWeightError as e:
            result = ("non-finite", str(e))
        except ValueError as e:
            result = ("value", str(e))
        except Exception as e:  # noqa: BLE001 - reported by the parent as one line
            result = ("error", f"{type(e).__name__}: {e}")
        pickle.dump(result, results)
        results.flush()
