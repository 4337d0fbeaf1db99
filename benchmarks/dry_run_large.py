"""How long `quantkit apply --dry-run` takes on a Kimi-K2.5-shaped BF16 source (61 layers x 384 experts), header-only.

The source is a synthetic DeepSeek-V3-architecture checkpoint (Kimi-K2.5's text model) whose safetensors headers
declare every tensor with its real shape while the data region is a hole (benchmarks/inspect_large.py), so ~2 TB of
apparent size costs no disk. Times `quantkit apply --recipe mxfp4-moe --dry-run --json` as a new process against
a baseline run in the same script: reading the index and json.loads of every shard header. `ratio` is the whole
process against that baseline; `plan_ratio` is the plan alone (apply's own timing), without Python's start and
quantkit's imports.

    python benchmarks/dry_run_large.py                   # 61 layers x 384 experts, Kimi-K2.5 dimensions
    python benchmarks/dry_run_large.py --layers 8 --experts 64 --small
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from inspect_large import baseline, write_synthetic_deepseek  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=61)
    ap.add_argument("--experts", type=int, default=384)
    ap.add_argument("--small", action="store_true", help="tiny dimensions (for a quick run)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "kimi-k2.5-text-bf16"
        facts = write_synthetic_deepseek(src, args.layers, args.experts, args.small, quantized=False)
        t0 = time.perf_counter()
        baseline(src)
        base_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "quantkit", "apply", "--recipe", "mxfp4-moe", "--model", str(src),
                               "--output", str(Path(tmp) / "out"), "--dry-run", "--devices", "cpu", "--json"],
                              capture_output=True, text=True, check=True)
        dry_s = time.perf_counter() - t0
        plan = json.loads(proc.stdout)
    row = {"layers": args.layers, "experts": args.experts, "tensors": facts["tensors"], "shards": facts["shards"],
           "apparent_gb": round(facts["apparent_bytes"] / 1e9, 1),
           "predicted_output_gb": round(plan["size_after_bytes"] / 1e9, 1),
           "quantized_layers": plan["summary"]["quantized_layers"], "kept_layers": plan["summary"]["kept_layers"],
           "baseline_headers_s": round(base_s, 2), "dry_run_s": round(dry_s, 2), "ratio": round(dry_s / base_s, 1),
           # the plan alone, as apply times it (timings_s.total of the dry run): the process's start and imports
           # (about 0.5 s here, whatever the model) are in dry_run_s but not in the in-process baseline
           "plan_s": round(plan["timings_s"]["total"], 2), "plan_ratio": round(plan["timings_s"]["total"] / base_s, 1)}
    if args.json:
        print(json.dumps(row, indent=2))
    else:
        print(" | ".join(f"{k} {v}" for k, v in row.items()))


if __name__ == "__main__":
    main()
