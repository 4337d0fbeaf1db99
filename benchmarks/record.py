"""Benchmark rows on record: each script appends its result rows, with the machine, the commit and the date, to
benchmarks/results/<name>.json, which the docs' benchmark page renders (docs/hooks.py). No figure is pasted by hand."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> str:
    """`<N> cores, <CPU model>` (and the GPU, when torch sees one): the hardware every figure must name."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    text = f"{os.cpu_count()} cores, {model}"
    try:
        import torch

        if torch.cuda.is_available():
            text += f", {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    except ImportError:
        pass
    return text


def commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=RESULTS.parent, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def record(name: str, rows: list[dict[str, Any]], *, what: str) -> Path:
    """Append `rows` (each: `what` it measured and its `figure`, a ratio against the same run's baseline) to
    benchmarks/results/<name>.json, stamped with this machine, commit and date."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    doc = json.loads(path.read_text()) if path.is_file() else {"benchmark": name, "rows": []}
    stamp = {"date": datetime.date.today().isoformat(), "machine": machine(), "commit": commit()}
    doc["rows"] += [{**stamp, "what": what, **row} for row in rows]
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path
