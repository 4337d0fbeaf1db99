"""The bench's charts (matplotlib, Agg canvas, no pyplot): output tok/s against concurrency per arm, and output tok/s
against interactivity (tokens/s per user), the Pareto view InferenceX draws, one line per arm."""

from __future__ import annotations

import io
from pathlib import Path

from quantkit.io.files import write_file_atomic
from quantkit.results.bench import BenchResult


def draw(result: BenchResult, folder: str | Path) -> dict[str, str]:
    """Write throughput.png and pareto.png into `folder`; returns {name: path}."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    ident = result.identity
    subtitle = (
        f"{ident.hardware}, TP {ident.tensor_parallel_size}, {ident.vllm_version or 'vLLM ?'}"
        + (f" — {ident.workload_label}" if ident.workload_label else "")
        + (" — SYNTHETIC acceptance" if ident.synthetic_acceptance else "")
    )
    paths = {}
    for name, xlabel in (("throughput", "concurrency"), ("pareto", "interactivity (tok/s per user)")):
        fig = Figure(figsize=(7, 4.5))
        FigureCanvasAgg(fig)
        ax = fig.add_subplot(1, 1, 1)
        for arm in result.arms:
            per_gpu = ident.tensor_parallel_size > 1
            cells = [c for c in arm.cells if c.ok and c.output_throughput.median is not None]
            if not cells:
                continue
            spreads = [c.output_throughput_per_gpu if per_gpu else c.output_throughput for c in cells]
            ys = [s.median or 0.0 for s in spreads]
            if name == "throughput":
                xs = [float(c.concurrency) for c in cells]
                lo = [y - (s.min if s.min is not None else y) for y, s in zip(ys, spreads)]
                hi = [(s.max if s.max is not None else y) - y for y, s in zip(ys, spreads)]
                ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=arm.name)
                ax.set_xscale("log", base=2)
            else:
                pts = [(c.interactivity, y) for c, y in zip(cells, ys) if c.interactivity is not None]
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=arm.name)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("output tok/s" + (" per GPU" if ident.tensor_parallel_size > 1 else ""))
        ax.set_title(
            ("Throughput vs concurrency" if name == "throughput" else "Throughput vs interactivity") + f"\n{subtitle}",
            fontsize=9,
        )
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / f"{name}.png"
        png = io.BytesIO()
        fig.savefig(png, dpi=100, format="png")
        write_file_atomic(path, png.getvalue())  # never through a link planted in --out
        paths[name] = str(path)
    return paths
