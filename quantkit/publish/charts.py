"""The acceptance chart (`acceptance.png`): per-position acceptance rates and AL per domain, BF16 vs quantized,
the AL ratio with its 95% CI, and lm-eval deltas with their intervals when there is an eval; for the published card
and the gate's report folder alike.

matplotlib is imported here only, inside the function, with the Agg canvas and no pyplot (no global backend state,
no display needed). The PNG carries no time stamp or version metadata, so the same figures give the same bytes and
re-publishing an unchanged report makes no new commit.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantkit.io.files import write_file_atomic
from quantkit.results import AcceptanceResult, EvalResult

if TYPE_CHECKING:
    from matplotlib.axes import Axes

CHART = "acceptance.png"
BASELINE_COLOR = "#7f7f7f"
CANDIDATE_COLOR = "#d62728"  # AMD red


def _ok(v: float | None) -> bool:
    return v is not None and math.isfinite(v)


def _labels(acceptance: AcceptanceResult) -> tuple[str, str]:
    what = {"draft": "draft", "target": "target", "pair": "pair"}.get(acceptance.candidate_kind or "", "")
    return (f"BF16 {what}".strip(), f"quantized {what}".strip())


def _per_position(acceptance: AcceptanceResult) -> bool:
    return any(
        r is not None and r.acceptance_rate_per_pos and any(_ok(x) for x in r.acceptance_rate_per_pos)
        for r in (acceptance.baseline, acceptance.candidate)
    )


def _domain_rows(acceptance: AcceptanceResult) -> list[tuple[str, float | None, float | None]]:
    b, c = acceptance.baseline, acceptance.candidate
    rows = [("all", b.mean_acceptance_length if b else None, c.mean_acceptance_length if c else None)]
    rows += [(d, b.domain_al(d) if b else None, c.domain_al(d) if c else None) for d in acceptance.domains()]
    return [r for r in rows if _ok(r[1]) or _ok(r[2])]


def _eval_rows(evaluation: EvalResult) -> list[tuple[str, float, float | None, float | None]]:
    """(label, delta, low, high) per task metric with a delta; the interval is delta_ci95, else +-1.96 stderr."""
    rows = []
    for t in evaluation.tasks:
        if not _ok(t.delta):
            continue
        assert t.delta is not None
        low = high = None
        if t.delta_ci95 and len(t.delta_ci95) == 2 and all(_ok(x) for x in t.delta_ci95):
            low, high = t.delta_ci95
        elif _ok(t.delta_stderr):
            assert t.delta_stderr is not None
            low, high = t.delta - 1.96 * t.delta_stderr, t.delta + 1.96 * t.delta_stderr
        rows.append((f"{t.task} {t.metric}", t.delta, low, high))
    return rows


def _heights(values: list[float | None]) -> list[float]:
    """Bar heights: a figure that was not measured is NaN, which draws no bar."""
    return [v if v is not None and math.isfinite(v) else float("nan") for v in values]


def _bars(
    ax: Axes, names: list[str], base: list[float | None], cand: list[float | None], labels: tuple[str, str]
) -> None:
    xs = list(range(len(names)))
    w = 0.38
    ax.bar([x - w / 2 for x in xs], _heights(base), w, label=labels[0], color=BASELINE_COLOR)
    ax.bar([x + w / 2 for x in xs], _heights(cand), w, label=labels[1], color=CANDIDATE_COLOR)
    ax.set_xticks(xs, names, rotation=30 if len(names) > 4 else 0, ha="right" if len(names) > 4 else "center")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)


def _draw_positions(ax: Axes, acceptance: AcceptanceResult, labels: tuple[str, str]) -> None:
    b = (acceptance.baseline.acceptance_rate_per_pos if acceptance.baseline else None) or []
    c = (acceptance.candidate.acceptance_rate_per_pos if acceptance.candidate else None) or []
    k = max(len(b), len(c))
    _bars(ax, [str(i + 1) for i in range(k)], [*b, *[None] * (k - len(b))], [*c, *[None] * (k - len(c))], labels)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate")
    ax.set_title("Acceptance rate per draft position")


def _draw_domains(
    ax: Axes, rows: list[tuple[str, float | None, float | None]], k: int | None, labels: tuple[str, str]
) -> None:
    _bars(ax, [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], labels)
    ax.set_ylabel("mean acceptance length (AL)")
    ax.set_title("AL per domain" + (f" (K={k}, max {k + 1})" if k else ""))
    if k:
        ax.axhline(k + 1, color="black", lw=0.6, ls=":")


def _draw_ratio(ax: Axes, acceptance: AcceptanceResult, rows: list[tuple[str, float | None, float | None]]) -> None:
    names: list[str] = []
    ratios: list[float] = []
    for name, bv, cv in rows:
        if name == "all" and _ok(acceptance.ratio):
            r: float | None = acceptance.ratio
        else:
            r = acceptance.per_domain_ratio.get(name)
            if not _ok(r) and _ok(bv) and _ok(cv) and bv:
                assert bv is not None and cv is not None
                r = cv / bv
        if r is not None and math.isfinite(r):
            names.append(name)
            ratios.append(r)
    ys = list(range(len(names)))[::-1]
    ax.axvline(1.0, color="black", lw=0.8)
    ci = acceptance.ratio_ci
    if ci and len(ci) == 2 and _ok(ci[0]) and _ok(ci[1]):
        assert ci[0] is not None and ci[1] is not None
        ax.axvspan(ci[0], ci[1], color=CANDIDATE_COLOR, alpha=0.12)
        ax.text(
            0.02,
            0.02,
            f"shaded: 95% CI of the overall ratio [{ci[0]:.3f}, {ci[1]:.3f}]",
            fontsize=8,
            transform=ax.transAxes,
        )
        if "all" in names:
            i = names.index("all")
            r_all = ratios[i]
            ax.errorbar(
                [r_all],
                [ys[i]],
                xerr=[[max(r_all - ci[0], 0.0)], [max(ci[1] - r_all, 0.0)]],
                fmt="none",
                ecolor=CANDIDATE_COLOR,
                capsize=4,
                lw=1.5,
            )
    ax.scatter(ratios, ys, color=CANDIDATE_COLOR, zorder=3)
    for r, y in zip(ratios, ys, strict=True):
        ax.annotate(f"{r:.3f}", (r, y), textcoords="offset points", xytext=(6, 4), fontsize=8)
    ax.set_yticks(ys, names)
    ax.set_ylim(-0.8, len(names) - 0.4)
    ax.set_xlabel("AL quantized / AL BF16")
    ax.set_title("AL ratio (1 = no loss)")
    ax.grid(axis="x", alpha=0.3)


def _draw_eval(ax: Axes, rows: list[tuple[str, float, float | None, float | None]]) -> None:
    ys = list(range(len(rows)))[::-1]
    ax.axvline(0.0, color="black", lw=0.8)
    for (_, delta, low, high), y in zip(rows, ys, strict=True):
        if low is not None and high is not None:
            ax.errorbar(
                [delta],
                [y],
                xerr=[[max(delta - low, 0.0)], [max(high - delta, 0.0)]],
                fmt="o",
                color=CANDIDATE_COLOR,
                capsize=4,
            )
        else:
            ax.scatter([delta], [y], color=CANDIDATE_COLOR)
        ax.annotate(f"{delta:+.4f}", (delta, y), textcoords="offset points", xytext=(6, 4), fontsize=8)
    ax.set_yticks(ys, [r[0] for r in rows])
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_xlabel("quantized - baseline (95% interval)")
    ax.set_title("lm-eval delta")
    ax.grid(axis="x", alpha=0.3)


def chart_panels(acceptance: AcceptanceResult | None, eval: EvalResult | None) -> list[tuple[str, Any]]:
    """The panels the chart has for these results (none: no chart): (kind, its data)."""
    panels: list[tuple[str, Any]] = []
    if acceptance is not None:
        labels = _labels(acceptance)
        if _per_position(acceptance):
            panels.append(("positions", labels))
        rows = _domain_rows(acceptance)
        if rows:
            panels.append(("domains", rows))
            panels.append(("ratio", rows))
    eval_rows = _eval_rows(eval) if eval is not None else []
    if eval_rows:
        panels.append(("eval", eval_rows))
    return panels


def render_acceptance_chart(
    acceptance: AcceptanceResult | None, eval: EvalResult | None, path: str | Path
) -> Path | None:
    """Write the chart as a PNG to `path`: per-position acceptance rates, AL per domain (BF16 vs quantized), the
    AL ratio per domain with the overall ratio's 95% CI, and lm-eval deltas with their intervals when `eval` has
    any. Returns `path`, or None (nothing written) when there is no figure to draw."""
    panels = chart_panels(acceptance, eval)
    if not panels:
        return None

    from matplotlib import rc_context
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # Names are data, not TeX: a domain named `$\\foo{$` would make mathtext raise (issue 35, escaping).
    with rc_context({"text.parse_math": False}):
        cols = 2 if len(panels) == 4 else len(panels)
        nrows = math.ceil(len(panels) / cols)
        fig = Figure(figsize=(5.2 * cols, 4.2 * nrows), dpi=100, layout="constrained")
        FigureCanvasAgg(fig)
        axes = fig.subplots(nrows, cols, squeeze=False).flatten()
        for ax, (kind, data) in zip(axes, panels, strict=False):
            assert acceptance is not None or kind == "eval"
            if kind == "positions":
                assert acceptance is not None
                _draw_positions(ax, acceptance, data)
            elif kind == "domains":
                assert acceptance is not None
                _draw_domains(ax, data, acceptance.settings.num_speculative_tokens, _labels(acceptance))
            elif kind == "ratio":
                assert acceptance is not None
                _draw_ratio(ax, acceptance, data)
            else:
                _draw_eval(ax, data)
        for ax in axes[len(panels) :]:
            ax.set_visible(False)
        out = Path(path)
        buf = io.BytesIO()
        # No Software/time metadata: identical figures give identical bytes.
        fig.savefig(buf, format="png", metadata={"Software": None})
    return write_file_atomic(out, buf.getvalue())
