"""The MXFP4 kernel on CPU in N threads of one process against N processes: why quantkit's CPU-only runs quantize in
child processes (quantkit.apply.shards.cpu_pool).

Quantizes random bf16 expert weights of Qwen3-30B-A3B's shape (768 x 2048) with `quantize_weight(w, "mxfp4")`, torch
at 1 intra-op thread, in a thread pool of each --threads size and in a process pool of each --procs size (fork), and
prints MB/s of bf16 weights for each, in the same run. Also sha256 in 1 and 4 threads (each source and output byte
is hashed). Measured on the H200 box (16 Xeon cores), 2026-12-02: threads 1 / 4 / 16: 404 / 812 / 531 MB/s;
16 processes: 5348 MB/s; sha256 1174 MB/s per thread.

    python benchmarks/cpu_quantize_scaling.py                       # threads 1,4,16; processes 16
    python benchmarks/cpu_quantize_scaling.py --threads 1,2 --procs 1,2
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing as mp
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MB = 1024 * 1024
_WEIGHTS: list = []


def _quantize(w: object) -> None:
    from quantkit.schemes import quantize_weight

    quantize_weight(w, "mxfp4", finite_only=True)  # type: ignore[arg-type]


def _in_process(count: int) -> float:
    import torch

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    for w in _WEIGHTS[:count]:
        _quantize(w)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,4,16")
    ap.add_argument("--procs", default="16")
    ap.add_argument("--tensors", type=int, default=64, help="weights per run (3 MB each)")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    _WEIGHTS.extend((torch.randn(768, 2048) * 0.02).bfloat16() for _ in range(args.tensors))
    nbytes = sum(w.numel() * 2 for w in _WEIGHTS)
    _quantize(_WEIGHTS[0])
    print(f"{len(os.sched_getaffinity(0))} cores, torch {torch.__version__}, {args.tensors} x 768 x 2048 bf16")
    for n in (int(x) for x in args.threads.split(",") if x.strip()):
        with ThreadPoolExecutor(n) as pool:
            list(pool.map(_quantize, _WEIGHTS[:n]))
            t0 = time.perf_counter()
            list(pool.map(_quantize, _WEIGHTS))
            dt = time.perf_counter() - t0
        print(f"threads {n:3d}: {nbytes / MB / dt:7.0f} MB/s")
    per = max(1, args.tensors // 4)
    for n in (int(x) for x in args.procs.split(",") if x.strip()):
        with mp.get_context("fork").Pool(n) as pool:
            pool.map(_in_process, [1] * n)  # warm: imports and first-call tables
            t0 = time.perf_counter()
            pool.map(_in_process, [per] * n)
            dt = time.perf_counter() - t0
        print(f"procs   {n:3d}: {n * per * 768 * 2048 * 2 / MB / dt:7.0f} MB/s")
    data = os.urandom(512 * MB)
    t0 = time.perf_counter()
    hashlib.sha256(data).digest()
    print(f"sha256 1 thread: {512 / (time.perf_counter() - t0):.0f} MB/s")
    view = memoryview(data)
    with ThreadPoolExecutor(4) as pool:
        t0 = time.perf_counter()
        list(pool.map(lambda i: hashlib.sha256(view[i * 128 * MB : (i + 1) * 128 * MB]).digest(), range(4)))
    print(f"sha256 4 threads: {512 / (time.perf_counter() - t0):.0f} MB/s")


if __name__ == "__main__":
    main()
