"""Throughput of quantkit's native per-shard executor against Quark 0.13's file-to-file path and the disk floor.

Builds a random Qwen3-MoE-shaped bf16 checkpoint (experts, attention, routers, norms, embeddings, lm_head) of about
--size-mb in shards of about --shard-mb in a temporary folder, then measures in this one run:
  (a) the floor: every shard read and written back with safetensors (load_file + save_file), one stream and
      --threads streams at once;
  (b) Quark: `ModelQuantizer(cfg).direct_quantize_checkpoint(src, dst, device=...)` in a fresh process, with the
      `import quark.torch` time reported apart from the work;
  (c) quantkit: `quantkit.apply.shards.quantize_checkpoint` in a fresh process, on --devices;
(b) and (c) once per --devices given (repeat it to compare 1 and 2 GPUs against the same floor), and checks that
(b) and (c) wrote byte-identical folders. Quark given several devices writes model.safetensors.index.json in the
order its device processes finish, which varies run to run; against such a run the index is compared as a mapping
(same metadata and weight_map dict) and every other file byte for byte, and quantkit's folder is also compared byte
for byte, index included, with Quark's single-device folder when the run has one. Each process starts cold: before
each stage the source shards are evicted from the page cache (posix_fadvise DONTNEED; --hot keeps them cached).
Wall time includes the process start and imports; work time is the quantize call alone; MB/s is source bytes / work
seconds; vs_floor is MB/s over the parallel floor's.

Needs only torch, safetensors and amd-quark (no vLLM); run from the repository root:
    python benchmarks/apply_throughput.py                                  # 865 MB, 200 MB shards, CPU, mxfp4
    python benchmarks/apply_throughput.py --size-mb 200 --shard-mb 50
    python benchmarks/apply_throughput.py --devices cuda:0,cuda:1 --size-mb 6900 --json
    python benchmarks/apply_throughput.py --devices cuda:0 --devices cuda:0,cuda:1 --size-mb 6900 --shard-mb 180
    python benchmarks/apply_throughput.py --skip-quark --scheme ptpc_fp8
    python benchmarks/apply_throughput.py --devices cuda:0 --size-mb 24000 --shard-mb 4000 --cli   # + the CLI row
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MB = 1024 * 1024
# Qwen3-30B-A3B dimensions with 64 experts per layer (the last layer gets fewer, to hit --size-mb) and a small
# vocabulary: kept (BF16) tensors are ~12% of the bytes, as in real MoE checkpoints (~5-10%).
HIDDEN, MOE_INTER, HEADS, KV_HEADS, HEAD_DIM, VOCAB, EXPERTS = 2048, 768, 32, 4, 128, 8192, 64

# CPU seconds of the process and of the worker processes it waited for (Quark spawns one per device in a list);
# peak RSS from VmHWM, which, unlike ru_maxrss, does not start from the parent's peak at fork.
CPU_SECONDS = """
def cpu_seconds():
    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))

def peak_rss_mb():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
"""

QUARK_SCRIPT = (
    """
import contextlib, json, os, resource, sys, time
os.environ.setdefault("QUARK_DISABLE_COMPILE", "1")
"""
    + CPU_SECONDS
    + """

def main():
    args = json.loads(sys.argv[1])
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):
        from quark.torch import LLMTemplate, ModelQuantizer
    t1 = time.perf_counter()
    cpu0 = cpu_seconds()
    cfg = LLMTemplate.get("qwen3_moe").get_config(scheme=args["scheme"], exclude_layers=args["exclude"])
    device = args["devices"][0] if len(args["devices"]) == 1 else args["devices"]
    with contextlib.redirect_stdout(sys.stderr):
        ModelQuantizer(cfg).direct_quantize_checkpoint(args["src"], args["dst"], device=device)
    t2 = time.perf_counter()
    print("RESULT " + json.dumps({"import_s": t1 - t0, "work_s": t2 - t1, "peak_rss_mb": peak_rss_mb(),
                                  "cpu_s": cpu_seconds() - cpu0}))

if __name__ == "__main__":
    main()
"""
)

NATIVE_SCRIPT = (
    """
import json, os, resource, sys, time
from pathlib import Path
"""
    + CPU_SECONDS
    + """

def main():
    args = json.loads(sys.argv[1])
    if args.get("cores"):  # before torch sizes its thread pool and quantkit counts its cores
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:args["cores"]])
    t0 = time.perf_counter()
    import torch  # noqa: F401
    from quantkit.apply.shards import quantize_checkpoint
    t1 = time.perf_counter()
    cpu0 = cpu_seconds()
    report = quantize_checkpoint(Path(args["src"]), Path(args["dst"]), scheme=args["scheme"], exclude=args["exclude"],
                                 layer_config=None, devices=args["devices"], max_memory=args.get("max_memory"))
    t2 = time.perf_counter()
    print("RESULT " + json.dumps({"import_s": t1 - t0, "work_s": t2 - t1, "peak_rss_mb": peak_rss_mb(),
                                  "cpu_s": cpu_seconds() - cpu0,
                                  "quark_loaded": any(m == "quark" or m.startswith("quark.") for m in sys.modules),
                                  "shards": len(report.shards), "readers": report.readers,
                                  "page_locked": report.page_locked, "max_memory_mb": report.max_memory_mb,
                                  "slots": report.slots, "slot_mb": report.slot_mb,
                                  "cpu_processes": report.cpu_processes}))

if __name__ == "__main__":
    main()
"""
)


def build_checkpoint(out: Path, size_mb: float, shard_mb: float) -> tuple[list[str], int]:
    """Random Qwen3-MoE layers until ~size_mb, saved in ~shard_mb shards; returns (kept modules, bytes)."""
    import torch
    from safetensors.torch import save_file

    out.mkdir(parents=True)
    g = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)

    def layer(i: int, experts: int) -> dict[str, torch.Tensor]:
        p = f"model.layers.{i}"
        t = {
            f"{p}.input_layernorm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16),
            f"{p}.self_attn.q_proj.weight": rand(HEADS * HEAD_DIM, HIDDEN),
            f"{p}.self_attn.k_proj.weight": rand(KV_HEADS * HEAD_DIM, HIDDEN),
            f"{p}.self_attn.v_proj.weight": rand(KV_HEADS * HEAD_DIM, HIDDEN),
            f"{p}.self_attn.o_proj.weight": rand(HIDDEN, HEADS * HEAD_DIM),
            f"{p}.self_attn.q_norm.weight": torch.ones(HEAD_DIM, dtype=torch.bfloat16),
            f"{p}.self_attn.k_norm.weight": torch.ones(HEAD_DIM, dtype=torch.bfloat16),
            f"{p}.post_attention_layernorm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16),
            f"{p}.mlp.gate.weight": rand(EXPERTS, HIDDEN),
        }
        for e in range(experts):
            t[f"{p}.mlp.experts.{e}.gate_proj.weight"] = rand(MOE_INTER, HIDDEN)
            t[f"{p}.mlp.experts.{e}.up_proj.weight"] = rand(MOE_INTER, HIDDEN)
            t[f"{p}.mlp.experts.{e}.down_proj.weight"] = rand(HIDDEN, MOE_INTER)
        return t

    target = size_mb * MB
    dense = 2 * (HEADS * HEAD_DIM * HIDDEN * 2 + 2 * KV_HEADS * HEAD_DIM * HIDDEN) + EXPERTS * HIDDEN * 2
    expert = 3 * MOE_INTER * HIDDEN * 2
    shard: dict[str, torch.Tensor] = {}
    shards: list[dict[str, torch.Tensor]] = []
    kept: list[str] = ["lm_head"]
    total = 0

    def add(name: str, t: torch.Tensor) -> None:
        nonlocal shard, total
        if shard and sum(x.numel() * 2 for x in shard.values()) + t.numel() * 2 > shard_mb * MB:
            shards.append(shard)
            shard = {}
        shard[name] = t
        total += t.numel() * 2

    add("model.embed_tokens.weight", rand(VOCAB, HIDDEN))
    layers = 0
    while layers == 0 or total + VOCAB * HIDDEN * 2 + dense + expert <= target:
        experts = int(max(1, min(EXPERTS, (target - total - VOCAB * HIDDEN * 2 - dense) // expert)))
        for name, t in layer(layers, experts).items():
            add(name, t)
            if (".self_attn." in name and name.endswith("_proj.weight")) or name.endswith(".mlp.gate.weight"):
                kept.append(name.removesuffix(".weight"))
        layers += 1
    add("model.norm.weight", torch.ones(HIDDEN, dtype=torch.bfloat16))
    add("lm_head.weight", rand(VOCAB, HIDDEN))
    shards.append(shard)
    written = 0
    weight_map = {}
    for i, tensors in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in tensors})
        written += (out / fname).stat().st_size
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": written}, "weight_map": weight_map}, indent=2)
    )
    (out / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["Qwen3MoeForCausalLM"],
                "model_type": "qwen3_moe",
                "hidden_size": HIDDEN,
                "moe_intermediate_size": MOE_INTER,
                "num_hidden_layers": layers,
                "num_experts": EXPERTS,
                "num_attention_heads": HEADS,
                "num_key_value_heads": KV_HEADS,
                "head_dim": HEAD_DIM,
                "vocab_size": VOCAB,
                "torch_dtype": "bfloat16",
            },
            indent=2,
        )
    )
    return sorted(kept), written


def parse_size(text: str) -> int:
    sys.path.insert(0, str(ROOT))
    from quantkit.apply.run import parse_size as parse

    return parse(text, "--max-memory")


def evict(folder: Path) -> None:
    """Flush earlier stages' writes (so no stage pays for another's writeback) and drop the folder's pages from the
    page cache, so the next reader starts from disk."""
    os.sync()
    for p in folder.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def floor(src: Path, dst: Path, threads: int) -> float:
    """safetensors load_file + save_file of every shard, `threads` at a time; seconds."""
    from safetensors.torch import load_file, save_file

    dst.mkdir()
    shards = sorted(src.glob("*.safetensors"))

    def copy(p: Path) -> None:
        save_file(load_file(str(p)), str(dst / p.name))

    t0 = time.perf_counter()
    if threads == 1:
        for p in shards:
            copy(p)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(copy, shards))
    return time.perf_counter() - t0


def run_child(script: str, args: dict, env_extra: dict[str, str] | None = None) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(textwrap.dedent(script))
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env_extra or {})}
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, f.name, json.dumps(args)], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    wall = time.perf_counter() - t0
    os.unlink(f.name)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return {**json.loads(lines[-1][len("RESULT ") :]), "wall_s": wall}


def run_cli(src: Path, dst: Path, devices: list[str], max_memory: str | None) -> dict:
    """`quantkit apply --recipe mxfp4-moe` as a user runs it, in a fresh process: wall time (process start, plan,
    quantize, verify, final files), its own timings, and the process's peak RSS (as apply reports it)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [
        sys.executable,
        "-m",
        "quantkit",
        "apply",
        "--recipe",
        "mxfp4-moe",
        "--model",
        str(src),
        "--output",
        str(dst),
        "--devices",
        ",".join(devices),
        "--json",
    ]
    if max_memory:
        cmd += ["--max-memory", max_memory]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd,
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=float(os.environ.get("APPLY_CLI_TIMEOUT", "86400")),
        )
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else str(e.stderr or "")
        return {
            "wall_s": time.perf_counter() - t0,
            "work_s": time.perf_counter() - t0,
            "failed": "timed out; last progress: " + err[-800:],
        }
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        print(f"quantkit apply failed ({proc.returncode}):\n{proc.stderr[-3000:]}", file=sys.stderr)
        return {"wall_s": wall, "work_s": wall, "failed": proc.stderr[-500:]}
    result = json.loads(proc.stdout)
    return {
        "wall_s": wall,
        "work_s": wall,
        "timings_s": result.get("timings_s"),
        "peak_rss_mb": result.get("peak_rss_mb"),
    }


INDEX = "model.safetensors.index.json"


def same_tree(a: Path, b: Path, index_as_mapping: bool = False) -> tuple[bool, int, list[str]]:
    """Same files with the same bytes; with index_as_mapping the index only needs the same metadata and weight_map
    dict (key order aside)."""
    fa = {str(p.relative_to(a)) for p in a.rglob("*") if p.is_file()}
    fb = {str(p.relative_to(b)) for p in b.rglob("*") if p.is_file()}

    def same(n: str) -> bool:
        x, y = (a / n).read_bytes(), (b / n).read_bytes()
        if x == y:
            return True
        return index_as_mapping and n == INDEX and json.loads(x) == json.loads(y)

    differ = sorted(fa ^ fb) + sorted(n for n in fa & fb if not same(n))
    return not differ, len(fa), differ


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=float, default=865)
    ap.add_argument("--shard-mb", type=float, default=200)
    ap.add_argument(
        "--devices",
        action="append",
        default=None,
        help="cpu | cuda | cuda:0,cuda:1 (Quark gets the same list); repeat to measure several sets",
    )
    ap.add_argument("--scheme", default="mxfp4", choices=["mxfp4", "ptpc_fp8"])
    ap.add_argument("--threads", type=int, default=4, help="streams for the parallel floor")
    ap.add_argument("--skip-quark", action="store_true")
    ap.add_argument("--skip-floor1", action="store_true", help="skip the one-stream floor")
    ap.add_argument("--quark-once", action="store_true", help="run Quark for the first --devices set only")
    ap.add_argument("--max-memory", default=None, help="quantkit's --max-memory (e.g. 3GiB); default: its own")
    ap.add_argument(
        "--cli",
        action="store_true",
        help="also time `quantkit apply` end to end (CLI, first device set) against the same floor",
    )
    ap.add_argument(
        "--cpu-scaling",
        default=None,
        metavar="N,N,...",
        help="the first device set, if CPU-only: also run quantkit quantizing in threads (QUANTKIT_CPU_PROCESSES=0, "
        "the pre-process path) and in processes on the first N cores only, each compared byte for "
        "byte with the full run, e.g. 1,4,8,16",
    )
    ap.add_argument(
        "--cpu-children",
        default=None,
        metavar="N,N,...",
        help="with --cpu-scaling: also run processes on every core with N quantizer children "
        "(QUANTKIT_CPU_CHILDREN=N), e.g. 8,16",
    )
    ap.add_argument("--hot", action="store_true", help="keep the source in the page cache between stages")
    ap.add_argument("--workdir", type=Path, default=None, help="where to build the checkpoint (default: a tmp dir)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON on stdout")
    ap.add_argument(
        "--record",
        action="store_true",
        help="append the rows to benchmarks/results/apply_throughput.json (rendered by the docs)",
    )
    args = ap.parse_args()
    device_sets = [[d.strip() for d in spec.split(",") if d.strip()] for spec in (args.devices or ["cpu"])]

    def log(msg: str) -> None:
        print(f"[apply_throughput] {msg}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        root = Path(tmp)
        src = root / "src"
        t0 = time.perf_counter()
        kept, size = build_checkpoint(src, args.size_mb, args.shard_mb)
        shards = len(list(src.glob("*.safetensors")))
        log(f"built {size / MB:.0f} MB in {shards} shards in {time.perf_counter() - t0:.1f}s; {len(kept)} kept modules")
        rows: dict[str, dict] = {}

        def prepare() -> None:
            if not args.hot:
                evict(src)

        if not args.skip_floor1:
            prepare()
            rows["floor, 1 stream"] = {"wall_s": floor(src, root / "floor1", 1)}
            shutil.rmtree(root / "floor1")
        prepare()
        parallel = f"floor, {args.threads} streams"
        rows[parallel] = {"wall_s": floor(src, root / "floorN", args.threads)}
        shutil.rmtree(root / "floorN")
        for r in rows.values():
            r["work_s"] = r["wall_s"]
        identity: dict[str, dict] = {}

        def dump() -> None:  # rows so far, for a run cut short
            if os.environ.get("APPLY_PARTIAL"):
                Path(os.environ["APPLY_PARTIAL"]).write_text(
                    json.dumps({"rows": rows, "identity": identity}, default=str)
                )

        dump()
        several = len(device_sets) > 1
        single_quark: Path | None = None  # a single-device Quark folder: deterministic, compared byte for byte
        for k, devices in enumerate(device_sets):
            tag = f" [{','.join(devices)}]" if several else ""
            child_args = {
                "src": str(src),
                "scheme": args.scheme,
                "exclude": kept,
                "devices": devices,
                "max_memory": parse_size(args.max_memory) if args.max_memory else None,
            }
            quark_dst, native_dst = root / f"quark-{k}", root / f"native-{k}"
            quark_here = not args.skip_quark and not (args.quark_once and k > 0)
            if quark_here:
                prepare()
                log(f"running Quark direct_quantize_checkpoint on {','.join(devices)}")
                rows["quark f2f" + tag] = run_child(QUARK_SCRIPT, {**child_args, "dst": str(quark_dst)})
                dump()
            prepare()
            log(f"running quantkit's executor on {','.join(devices)}")
            rows["quantkit native" + tag] = run_child(NATIVE_SCRIPT, {**child_args, "dst": str(native_dst)})
            dump()
            check: dict[str, dict] = {}
            if quark_here:
                mapping = len(devices) > 1
                same, files, differ = same_tree(quark_dst, native_dst, index_as_mapping=mapping)
                check["vs_quark_same_devices"] = {
                    "identical": same,
                    "files": files,
                    "differ": differ,
                    "index": "as mapping (Quark's multi-device index order varies)" if mapping else "bytes",
                }
            if single_quark is not None:
                same, files, differ = same_tree(single_quark, native_dst)
                check["vs_quark_single_device_bytes"] = {"identical": same, "files": files, "differ": differ}
            if quark_here:
                if len(devices) == 1 and single_quark is None:
                    single_quark = quark_dst
                else:
                    shutil.rmtree(quark_dst)
            if args.cpu_scaling and k == 0 and all(d == "cpu" for d in devices):
                variants: list[tuple[str, dict[str, str], int | None]] = [
                    ("threads", {"QUANTKIT_CPU_PROCESSES": "0"}, None)
                ]
                variants += [
                    (f"processes, {n} cores", {"QUANTKIT_CPU_PROCESSES": "1"}, int(n))
                    for n in args.cpu_scaling.split(",")
                    if n.strip()
                ]
                variants += [
                    (f"processes, {n} children", {"QUANTKIT_CPU_PROCESSES": "1", "QUANTKIT_CPU_CHILDREN": n}, None)
                    for n in (args.cpu_children or "").split(",")
                    if n.strip()
                ]
                for label, env_extra, cores in variants:
                    prepare()
                    log(f"running quantkit's executor on {','.join(devices)}, {label}")
                    dst = root / "native-variant"
                    rows[f"quantkit {label}{tag}"] = run_child(
                        NATIVE_SCRIPT, {**child_args, "dst": str(dst), "cores": cores}, env_extra
                    )
                    same, files, differ = same_tree(native_dst, dst)
                    check[f"{label}_vs_default_bytes"] = {"identical": same, "files": files, "differ": differ}
                    shutil.rmtree(dst)
                    dump()
            shutil.rmtree(native_dst)
            for name, c in check.items():
                log(
                    f"{','.join(devices)} {name}: identical {c['identical']} ({c['files']} files)"
                    f"{'' if c['identical'] else ' differ: ' + str(c['differ'])}"
                )
            identity[",".join(devices)] = check
            dump()
        if args.cli:
            prepare()
            log(f"running quantkit apply (CLI) on {','.join(device_sets[0])}")
            rows[f"quantkit apply CLI, end to end [{','.join(device_sets[0])}]"] = run_cli(
                src, root / "cli", device_sets[0], args.max_memory
            )
            shutil.rmtree(root / "cli", ignore_errors=True)
        for r in rows.values():
            r["mb_per_s"] = size / MB / r["work_s"]
        floor_mb_s = rows[parallel]["mb_per_s"]
        for name, r in rows.items():
            r["vs_floor"] = r["mb_per_s"] / floor_mb_s
            quark = rows.get("quark f2f" + (name[name.index(" [") :] if " [" in name else ""))
            if quark:
                r["wall_vs_quark"] = r["wall_s"] / quark["wall_s"]
                r["throughput_vs_quark"] = r["mb_per_s"] / quark["mb_per_s"]
    checks = [c["identical"] for check in identity.values() for c in check.values()]
    result = {
        "size_mb": round(size / MB, 1),
        "shards": shards,
        "scheme": args.scheme,
        "devices": device_sets,
        "cpu_cores": len(os.sched_getaffinity(0)),
        "page_cache": "hot" if args.hot else "evicted per stage",
        "byte_identical": all(checks) if checks else None,
        "identity": identity,
        "rows": rows,
    }
    if args.record:
        from record import record

        what = f"{size / MB:.0f} MB bf16 in {shards} shards, {args.scheme}, devices {device_sets}"
        record(
            "apply_throughput",
            [
                {
                    "figure": f"{name}: "
                    + ", ".join(
                        f"{k} {r[k]:.2f}" for k in ("mb_per_s", "vs_floor", "throughput_vs_quark", "wall_s") if k in r
                    )
                }
                for name, r in rows.items()
            ],
            what=what,
        )
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"{size / MB:.0f} MB bf16 in {shards} shards, {args.scheme}, devices "
        f"{' and '.join(','.join(d) for d in device_sets)}, {result['cpu_cores']} CPU cores, page cache "
        f"{result['page_cache']}"
    )
    print(
        f"{'':44s} {'wall s':>8s} {'import s':>9s} {'work s':>8s} {'CPU s':>7s} {'MB/s':>8s} {'vs floor':>9s} "
        f"{'wall/Quark':>11s} {'MB/s / Quark':>13s} {'peak RSS MB':>12s} {'procs':>6s}"
    )
    for name, r in rows.items():

        def f(key: str, fmt: str, r: dict = r) -> str:
            return format(r[key], fmt) if key in r else "-"

        print(
            f"{name:44s} {f('wall_s', '8.2f')} {f('import_s', '9.2f')} {f('work_s', '8.2f')} {f('cpu_s', '7.2f')} "
            f"{f('mb_per_s', '8.0f')} {f('vs_floor', '9.2f')} {f('wall_vs_quark', '11.2f')} "
            f"{f('throughput_vs_quark', '13.2f')} {f('peak_rss_mb', '12.0f')} {f('cpu_processes', '6d')}"
        )
    for device_set, check in identity.items():
        for name, c in check.items():
            extra = f", index {c['index']}" if "index" in c else ""
            print(f"quantkit on {device_set} {name}: {'identical' if c['identical'] else 'DIFFERENT'}{extra}")


if __name__ == "__main__":
    main()
