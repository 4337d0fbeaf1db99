"""The bench's figures, pure functions over measured repeats: a cell's medians and spreads, the speedup over no
speculation and the candidate's ratio over the BF16 draft (bootstrap CIs over repeats, quantkit.engines.stats),
c_step, the crossover concurrency, and the recommended K per batch size.

c_step = TPOT_spec x AL / TPOT_base: the time of one speculative step (draft K tokens, verify K+1) in plain decode
steps, since a spec step emits AL tokens in AL x TPOT_spec. Then speedup ~ AL / c_step. vLLM drafts K tokens and
verifies K+1 at every step whatever is accepted (vllm/v1/spec_decode/llm_base_proposer.py proposes
num_speculative_tokens each step; vllm/v1/core/sched/scheduler.py schedules the draft tokens for verification), so
c_step is a property of the kernels, the K and the batch, not of the acceptance: a damaged draft with the same
kernels has about the same c_step and a lower AL, hence a lower speedup; a draft that keeps its AL and gets a higher
c_step (an emulated FP8 path, say) is the one named "costs more per step".
"""

from __future__ import annotations

from typing import Literal

from quantkit.engines.stats import bootstrap_median_ratio_ci, median, scaled_mad
from quantkit.results.bench import (
    LATENCY_METRICS,
    PERCENTILES,
    BenchArm,
    BenchCell,
    BenchComparison,
    KChoice,
    KSchedule,
    Spread,
)
from quantkit.results.serve import SpecDecodeCounters

CStepFrom = Literal["tpot", "throughput"]

AL_KEPT = 0.98  # a candidate whose AL is at least this fraction of the BF16 draft's keeps its AL
MERGED_TPOT = 0.2  # a TPOT below this fraction of E2EL / output tokens: the stream arrived merged, not measured
COST_TOLERANCE = 0.05  # a c_step more than 5% above the BF16 draft's costs more per step


def spread(values: list[float | None]) -> Spread:
    vals = [v for v in values if v is not None]
    if not vals:
        return Spread()
    return Spread(median=median(vals), min=min(vals), max=max(vals), mad=scaled_mad(vals), n=len(vals))


def fill_cell(cell: BenchCell, tp: int = 1) -> BenchCell:
    """The cell's figures over its repeats. A repeat with a failed request, or with fewer output tokens than asked
    for any request, fails the cell."""
    runs = cell.repeats
    problems = []
    for i, r in enumerate(runs):
        if r.failed or r.completed != cell.num_prompts:
            first = r.errors[0][:200] if r.errors else "no error text"
            problems.append(f"repeat {i}: {r.failed} failed of {cell.num_prompts} requests ({first})")
        short = [n for n in r.output_lens if n != cell.output_len]
        if short:
            problems.append(
                f"repeat {i}: {len(short)} requests returned other than {cell.output_len} tokens "
                f"(e.g. {short[0]}); ignore_eos did not hold"
            )
    cell.problems, cell.ok = problems, not problems and bool(runs)
    cell.output_throughput = spread([r.output_throughput for r in runs])
    cell.output_throughput_per_gpu = spread(
        [r.output_throughput / tp if r.output_throughput is not None else None for r in runs]
    )
    cell.latency_ms = {
        f"{s}_{m}": spread([getattr(r, f"{s}_{m}_ms") for r in runs])
        for m in LATENCY_METRICS
        for s in ("mean", *(f"p{p}" for p in PERCENTILES))
    }
    tpot = cell.latency_ms["p50_tpot"].median
    cell.interactivity, cell.interactivity_reason = (
        (1000.0 / tpot, "") if tpot and _tpot_measured(cell) else (None, unmeasured_tpot_reason(cell))
    )
    counters = [c for r in runs if (c := r.spec) is not None]
    if counters:
        width = max(len(c.accepted_per_pos) for c in counters)
        total = SpecDecodeCounters(
            num_drafts=sum(c.num_drafts for c in counters),
            num_draft_tokens=sum(c.num_draft_tokens for c in counters),
            num_accepted_tokens=sum(c.num_accepted_tokens for c in counters),
            accepted_per_pos=[
                sum(c.accepted_per_pos[i] for c in counters if i < len(c.accepted_per_pos)) for i in range(width)
            ],
        )
        cell.spec = total
        cell.acceptance_length = total.mean_acceptance_length
        cell.per_position_acceptance = [a / total.num_drafts for a in total.accepted_per_pos]
    return cell


def unmeasured_tpot_reason(cell: BenchCell) -> str:
    """Why a cell's TPOT (and so its interactivity, 1000 / TPOT) is not a measurement: THE one rule for it, used by
    the table, the charts and bench.json's warnings (a TPOT of 0 once became "256,423 tok/s per user")."""
    tpot = cell.latency_ms.get("p50_tpot", Spread()).median
    if tpot is None:
        return "no TPOT measured (no repeat finished)"
    return (
        f"TPOT p50 {tpot:.3g} ms is not a measurement: the server sent the stream's tokens merged in one or two "
        "chunks (below a fifth of E2EL per token)"
    )


def _tputs(cell: BenchCell) -> list[float]:
    return [r.output_throughput for r in cell.repeats if r.output_throughput is not None]


def _ratio(a: BenchCell, b: BenchCell, samples: int) -> tuple[float | None, list[float | None] | None]:
    na, nb = a.output_throughput.median, b.output_throughput.median
    if na is None or not nb:
        return None, None
    if len(_tputs(a)) < 2 or len(_tputs(b)) < 2:  # one repeat gives no interval (not "0.90 (0.90-0.90)")
        return na / nb, None
    ci = bootstrap_median_ratio_ci(_tputs(a), _tputs(b), samples=samples)
    return na / nb, list(ci) if ci else None


def c_step(spec: BenchCell, base: BenchCell) -> float | None:
    """TPOT_spec x AL / TPOT_base (see the module docstring); quantkit.bench.figures.c_step_measured says how."""
    return c_step_measured(spec, base)[0]


def c_step_measured(spec: BenchCell, base: BenchCell) -> tuple[float | None, CStepFrom | None]:
    """c_step and where its TPOTs came from: "tpot", TPOT_spec x AL / TPOT_base from the median TPOTs (p50 over
    requests, median over repeats); or "throughput", AL x tok/s_base / tok/s_spec, when a TPOT was not measured:
    a TPOT p50 near 0 in some repeat (below MERGED_TPOT x E2EL p50 / output_len) means the median request's tokens
    reached the client in one or two chunks (vLLM merges
    a stream's pending deltas when the API server falls behind the engine, vllm/v1/engine/output_processor.py
    RequestOutputCollector; seen on 2 shared cores), so (E2EL - TTFT) / (n - 1) is 0 and says nothing. In a closed
    loop at the same concurrency tok/s is n / E2EL per stream, so the throughput form is the same step cost with the
    prefill folded in, and speedup = AL / c_step exactly."""
    al = spec.acceptance_length
    if al is None:
        return None, None
    if _tpot_measured(spec) and _tpot_measured(base):
        return spec.latency_ms["p50_tpot"].median * al / base.latency_ms["p50_tpot"].median, "tpot"  # type: ignore[operator]
    ns, nb = spec.output_throughput.median, base.output_throughput.median
    if ns and nb:
        return al * nb / ns, "throughput"
    return None, None


def _tpot_measured(cell: BenchCell) -> bool:
    tpot, e2el = cell.latency_ms.get("p50_tpot", Spread()), cell.latency_ms.get("p50_e2el", Spread())
    if not tpot.median or not e2el.median or not cell.output_len:
        return False
    return (tpot.min or 0.0) >= MERGED_TPOT * e2el.median / cell.output_len


def compare(arms: list[BenchArm], samples: int = 2000) -> list[BenchComparison]:
    """Every speculative arm against the no-speculation arm of its target, and every candidate against the BF16
    draft on the same target at the same K, per concurrency."""
    base = {a.target: a for a in arms if a.kind == "no-spec" and a.error is None}
    bf16 = {(a.target, a.num_speculative_tokens): a for a in arms if a.kind == "bf16-draft" and a.error is None}
    out = []
    for arm in arms:
        if arm.kind == "no-spec" or arm.error is not None:
            continue
        for cell in arm.cells:
            comp = BenchComparison(arm=arm.name, concurrency=cell.concurrency, acceptance_length=cell.acceptance_length)
            b = base.get(arm.target)
            bc = b.cell(cell.concurrency) if b else None
            if bc is not None and bc.ok and cell.ok:
                comp.speedup, comp.speedup_ci = _ratio(cell, bc, samples)
                if arm.num_speculative_tokens:
                    comp.c_step, comp.c_step_from = c_step_measured(cell, bc)
            ref = bf16.get((arm.target, arm.num_speculative_tokens)) if arm.kind == "candidate" else None
            rc = ref.cell(cell.concurrency) if ref else None
            if rc is not None and rc.ok and cell.ok:
                comp.vs_bf16_draft, comp.vs_bf16_draft_ci = _ratio(cell, rc, samples)
                if bc is not None:
                    comp.cost_named = name_cost(cell, rc, bc)
            out.append(comp)
    return out


def name_cost(cand: BenchCell, bf16: BenchCell, base: BenchCell) -> str:
    """What the candidate's ratio over the BF16 draft comes from: its AL, its per-step cost, or both."""
    ca, ra = cand.acceptance_length, bf16.acceptance_length
    cc, rc = c_step(cand, base), c_step(bf16, base)
    if ca is None or ra is None or cc is None or rc is None:
        return ""
    kept = ca >= AL_KEPT * ra
    dearer, cheaper = cc > (1 + COST_TOLERANCE) * rc, cc < (1 - COST_TOLERANCE) * rc
    if kept and dearer:
        return "keeps its AL but costs more per step"
    if kept and cheaper:
        return "keeps its AL and its steps are cheaper"
    if kept:
        return "keeps its AL at the same per-step cost"
    return "loses acceptance" + (" and costs more per step" if dearer else "")


def crossover(comparisons: list[BenchComparison], arm: str) -> int | None:
    """The concurrency from which speculation stops paying: the lowest measured C at which `arm`'s median speedup
    is below 1 and stays below 1 at every higher measured C. None when it pays at the largest measured C (a loss
    only at low concurrency, a CPU artefact of process overhead, is no crossover: not_paying lists it)."""
    speedups = sorted((c.concurrency, c.speedup) for c in comparisons if c.arm == arm and c.speedup is not None)
    cross = None
    for conc, sp in reversed(speedups):
        if sp >= 1:
            break
        cross = conc
    return cross


def not_paying(comparisons: list[BenchComparison], arm: str) -> list[int]:
    """Every measured concurrency at which `arm`'s median speedup is below 1."""
    return sorted(c.concurrency for c in comparisons if c.arm == arm and c.speedup is not None and c.speedup < 1)


def k_schedule(target: str, draft: str, prefix: str, arms: list[BenchArm], max_num_seqs: int) -> KSchedule | None:
    """The K with the highest median output tok/s at each concurrency among `arms` (one draft at several K; K=0
    is the no-speculation arm or the draft with nothing drafted), as vLLM's inclusive batch-size ranges: each
    measured concurrency C_i covers (C_{i-1} + 1 .. C_i), the last up to max_num_seqs; neighbours with the same K
    are merged."""
    concurrencies = sorted({c.concurrency for a in arms for c in a.cells})
    choices = []
    for conc in concurrencies:
        by_k: dict[int, float | None] = {}
        for a in arms:
            cell = a.cell(conc)
            k = a.num_speculative_tokens or 0
            if cell is not None and cell.ok and a.error is None:
                by_k[k] = cell.output_throughput.median
        measured = {k: v for k, v in by_k.items() if v is not None}
        if not measured:
            continue
        best = max(measured, key=lambda k: (measured[k], -k))
        choices.append(KChoice(concurrency=conc, k=best, output_throughput=measured[best], by_k=by_k))
    if not choices:
        return None
    ranges: list[tuple[int, int, int]] = []
    start = 1
    for i, ch in enumerate(choices):
        end = max_num_seqs if i == len(choices) - 1 else ch.concurrency
        end = max(end, start)
        if ranges and ranges[-1][2] == ch.k:
            ranges[-1] = (ranges[-1][0], end, ch.k)
        else:
            ranges.append((start, end, ch.k))
        start = end + 1
    return KSchedule(
        target=target,
        draft=draft,
        arm_prefix=prefix,
        choices=choices,
        num_speculative_tokens_per_batch_size=ranges,
        num_speculative_tokens=max(k for _, _, k in ranges),
    )
