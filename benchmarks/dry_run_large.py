"""How long `quantkit apply --dry-run` takes on a Kimi-K2.5-shaped BF16 source (61 layers x 384 experts), header-only.

The source is a synthetic DeepSeek-V3-architecture checkpoint (Kimi-K2.5's text model) whose safetensors headers
declare every tensor with its real shape while the data region is a hole (benchmarks/inspect_large.py), so ~2 TB of
apparent size costs no disk. Times `quantkit apply --recipe mxfp4-moe --dry-run --json` as a new process against
a baseline run in the same script: reading the index and json.loads of every shard header. `ratio` is the whole
process against that baseline; `plan_ratio` is the plan alone (apply's own timing), without Python's start and
quantkit's imports. The process's time is split into Python's own start (`python -c pass`), the imports of the
dry-run path (a process that imports them and stops, less that start), the plan, and the rest (the result object,
its JSON and the process's exit). Each figure is the fastest of `--repeat` interleaved runs, so that a busy machine
(this one has 2 shared cores) slows the baseline and the dry run alike. quantkit's modules are byte-compiled first,
as pip does when it installs the wheel: a checkout run with PYTHONDONTWRITEBYTECODE=1 (as on this round's machines)
would otherwise compile every module it imports, in every process, from source (~0.03 s of the plan's own lazy
imports).

    python benchmarks/dry_run_large.py                   # 61 layers x 384 experts, Kimi-K2.5 dimensions
    python benchmarks/dry_run_large.py --layers 8 --experts 64 --small
    python benchmarks/dry_run_large.py --stages          # also the plan's CPU seconds per stage (fresh processes)
    python benchmarks/dry_run_large.py --fast-paths      # also what each fast path saves (fast_path_cpu_ratio)

`--fast-paths` is the row a fast path names to stay (a fast path that saves less than ~5% of a user-visible wall
time is removed): the whole dry-run process's CPU seconds with one fast path switched off, over the same with all
on, fresh processes interleaved with the rest, the fastest of `--repeat` each. A ratio of 1.05 or more pays.
"""

from __future__ import annotations

import argparse
import compileall
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from inspect_large import baseline, write_synthetic_deepseek  # noqa: E402

# The plan in a fresh process with each stage wrapped in a CPU timer (a stage's time includes the stages it calls:
# resolve_source holds the index and the headers). Stages are looked up by name, so a renamed one is left out.
STAGES = """
import json, sys, time
import quantkit.cli, quantkit.apply.run, quantkit.io.formats, quantkit.naming.archs, quantkit.results
import quantkit.apply.run as run, quantkit.io.headers as headers, quantkit.io.formats as formats
import quantkit.naming.archs as archs
spent = {}
def timed(module, name, key):
    orig = getattr(module, name, None)
    if orig is None:
        return
    def wrapper(*a, **k):
        c = time.process_time()
        try:
            return orig(*a, **k)
        finally:
            spent[key] = spent.get(key, 0.0) + time.process_time() - c
    setattr(module, name, wrapper)
for module, name, key in [(headers, "_checked_index", "index"), (headers, "read_header_columns", "headers"),
                          (headers, "read_parsed_header", "headers"), (run, "resolve_source", "resolve_source"),
                          (formats, "detect_format", "detect_format"), (archs, "checkpoint_layers", "layer_builder"),
                          (run, "plan_layers", "plan_layers"), (run, "vllm_exclude", "vllm_exclude"),
                          (archs, "mtp_tensor_names", "mtp_names"), (run, "predicted_output_bytes", "size_prediction"),
                          (run, "versions", "versions"), (run, "ignored_weight_files", "ignored_files")]:
    timed(module, name, key)
c = time.process_time()
run.apply("mxfp4-moe", sys.argv[1], sys.argv[2], devices="cpu", dry_run=True)
spent["plan"] = time.process_time() - c
print(json.dumps(spent))
"""

# The dry run in a fresh process with one fast path switched off (by name; "none": all on), its CPU seconds from the
# process's start. `results_lazy_loader`: every quantkit.results stage module imported up front, as a plain package
# would; `validate_compact`: every header judged by _validate_plain (json.loads) instead.
FAST_PATHS = ("validate_compact", "results_lazy_loader")
WITHOUT = """
import importlib, json, sys, time
from pathlib import Path
off, src, out = sys.argv[1:4]
if off == "results_lazy_loader":
    import quantkit.results
    for stage in sorted(p.stem for p in Path(quantkit.results.__file__).parent.glob("*.py") if p.stem != "__init__"):
        importlib.import_module("quantkit.results." + stage)
import quantkit.cli, quantkit.apply.run as run, quantkit.io.safetensors as st
if off == "validate_compact":
    st._validate_compact = lambda raw, data_len, n: None
result = run.apply("mxfp4-moe", src, out, devices="cpu", dry_run=True)
result.model_dump_json(indent=2)
print(json.dumps([time.process_time(), result.size_after_bytes]))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=61)
    ap.add_argument("--experts", type=int, default=384)
    ap.add_argument("--small", action="store_true", help="tiny dimensions (for a quick run)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--record",
        action="store_true",
        help="append the row to benchmarks/results/dry_run_large.json (rendered by the docs)",
    )
    ap.add_argument("--repeat", type=int, default=3, help="interleaved runs of each measurement; the fastest counts")
    ap.add_argument("--stages", action="store_true", help="also the plan's CPU seconds per stage (stage_cpu_s)")
    ap.add_argument(
        "--fast-paths",
        action="store_true",
        help="also the process's CPU with each fast path off over all on (fast_path_cpu_ratio)",
    )
    args = ap.parse_args()
    imports = "import quantkit.cli, quantkit.apply.run, quantkit.io.formats, quantkit.naming.archs, quantkit.results"
    wall: dict[str, list[float]] = {k: [] for k in ("base", "start", "imports", "dry", "plan")}
    cpu: dict[str, list[float]] = {k: [] for k in ("base", "start", "imports", "dry", "plan")}
    stages: dict[str, float] = {}  # fastest of the runs, stage by stage
    without: dict[str, list[float]] = {k: [] for k in ("none", *FAST_PATHS)}  # process CPU, one fast path off

    def child(cmd: list[str], key: str) -> subprocess.CompletedProcess[str]:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
        wall[key].append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu[key].append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        return proc

    compileall.compile_dir(str(Path(__file__).resolve().parent.parent / "quantkit"), quiet=1)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "kimi-k2.5-text-bf16"
        facts = write_synthetic_deepseek(src, args.layers, args.experts, args.small, quantized=False)
        out = str(Path(tmp) / "out")
        # the plan alone in a fresh process (no header validated yet), its CPU seconds as well as apply's own timing
        plan_only = (
            "import json, time; from quantkit.apply.run import apply; c = time.process_time(); "
            f"r = apply('mxfp4-moe', {str(src)!r}, {out!r}, devices='cpu', dry_run=True); "
            "print(json.dumps([time.process_time() - c, r.timings_s['total']]))"
        )
        for _ in range(max(1, args.repeat)):
            c0, t0 = time.process_time(), time.perf_counter()
            baseline(src)
            wall["base"].append(time.perf_counter() - t0)
            cpu["base"].append(time.process_time() - c0)
            child([sys.executable, "-c", "pass"], "start")
            child([sys.executable, "-c", imports], "imports")
            proc = child(
                [
                    sys.executable,
                    "-m",
                    "quantkit",
                    "apply",
                    "--recipe",
                    "mxfp4-moe",
                    "--model",
                    str(src),
                    "--output",
                    out,
                    "--dry-run",
                    "--devices",
                    "cpu",
                    "--json",
                ],
                "dry",
            )
            plan = json.loads(proc.stdout)
            wall["plan"].append(plan["timings_s"]["total"])  # apply's own timing: headers, layers, prediction
            cpu_s, _ = json.loads(
                subprocess.run([sys.executable, "-c", plan_only], capture_output=True, text=True, check=True).stdout
            )
            cpu["plan"].append(cpu_s)
            if args.stages:
                got = json.loads(
                    subprocess.run(
                        [sys.executable, "-c", STAGES, str(src), out], capture_output=True, text=True, check=True
                    ).stdout
                )
                for key, value in got.items():
                    stages[key] = min(stages.get(key, value), value)
            if args.fast_paths:
                sizes = set()
                for off in without:
                    cpu_s, size = json.loads(
                        subprocess.run(
                            [sys.executable, "-c", WITHOUT, off, str(src), out],
                            capture_output=True,
                            text=True,
                            check=True,
                        ).stdout
                    )
                    without[off].append(cpu_s)
                    sizes.add(size)
                assert len(sizes) == 1, f"a fast path changed the dry run's answer: {sizes}"
    best = {k: min(v) for k, v in wall.items()}
    best_cpu = {k: min(v) for k, v in cpu.items()}
    base_s, start_s = best["base"], best["start"]
    imports_s = max(best["imports"] - start_s, 0.0)
    row = {
        "layers": args.layers,
        "experts": args.experts,
        "tensors": facts["tensors"],
        "shards": facts["shards"],
        "apparent_gb": round(facts["apparent_bytes"] / 1e9, 1),
        "predicted_output_gb": round(plan["size_after_bytes"] / 1e9, 1),
        "quantized_layers": plan["summary"]["quantized_layers"],
        "kept_layers": plan["summary"]["kept_layers"],
        "baseline_headers_s": round(base_s, 3),
        "dry_run_s": round(best["dry"], 3),
        "ratio": round(best["dry"] / base_s, 1),
        "plan_s": round(best["plan"], 3),
        "plan_ratio": round(best["plan"] / base_s, 1),
        "python_start_s": round(start_s, 3),
        "imports_s": round(imports_s, 3),
        "rest_s": round(max(best["dry"] - start_s - imports_s - best["plan"], 0.0), 3),
        # what the whole process would cost against the baseline if it did nothing but start Python and read headers
        "floor_ratio": round((start_s + base_s) / base_s, 1),
        # the same in CPU seconds (less disturbed by other work on a shared machine)
        "cpu_baseline_s": round(best_cpu["base"], 3),
        "cpu_dry_run_s": round(best_cpu["dry"], 3),
        "cpu_ratio": round(best_cpu["dry"] / best_cpu["base"], 1),
        "cpu_plan_s": round(best_cpu["plan"], 3),
        "cpu_plan_ratio": round(best_cpu["plan"] / best_cpu["base"], 1),
        "cpu_start_s": round(best_cpu["start"], 3),
        "cpu_imports_s": round(max(best_cpu["imports"] - best_cpu["start"], 0.0), 3),
        "repeats": max(1, args.repeat),
    }
    if args.stages:
        row["stage_cpu_s"] = {k: round(v, 3) for k, v in stages.items()}
    if args.fast_paths:
        row["process_cpu_s"] = round(min(without["none"]), 3)
        row["fast_path_cpu_ratio"] = {k: round(min(without[k]) / min(without["none"]), 3) for k in FAST_PATHS}
    if args.record:
        from record import record

        record(
            "dry_run_large",
            [
                {
                    "figure": f"plan / header read {row['plan_ratio']}x (CPU {row['cpu_plan_ratio']}x), "
                    f"whole dry run {row['ratio']}x"
                }
            ],
            what=f"apply --dry-run, {row['tensors']} tensors in {row['shards']} shards",
        )
    if args.json:
        print(json.dumps(row, indent=2))
    else:
        print(" | ".join(f"{k} {v}" for k, v in row.items()))


if __name__ == "__main__":
    main()
