# tier: unit
"""`quantkit bench`'s figures worked out by hand (speedup, c_step, crossover) and its CLI's refusals; the
served arms are in tests/e2e/test_bench.py, the K schedule against vLLM's own config in
tests/integration/test_bench_schedule.py."""

from __future__ import annotations

import pytest


def _cell(conc, tputs, tpot, al=None, k=3):
    from quantkit.results.bench import BenchCell, BenchRun

    # E2EL as a streamed request's: TTFT 1 ms + 3 more tokens at the TPOT (a TPOT of 0: one chunk, E2EL 10 ms)
    runs = [
        BenchRun(
            completed=1,
            output_throughput=t,
            p50_tpot_ms=tpot,
            p50_e2el_ms=1.0 + 3 * tpot if tpot else 10.0,
            output_lens=[4],
            spec_decode_num_drafts=100 if al else None,
            spec_decode_draft_tokens=100 * k if al else None,
            spec_decode_accepted_tokens=round((al - 1) * 100) if al else None,
            spec_decode_per_position_acceptance_rates=[0.5] * k if al else [],
        )
        for t in tputs
    ]
    from quantkit.bench.figures import fill_cell

    return fill_cell(BenchCell(concurrency=conc, num_prompts=1, output_len=4, repeats=runs))


def test_c_step_and_speedup_by_hand():
    from quantkit.bench.figures import compare
    from quantkit.results.bench import BenchArm

    base = BenchArm(name="t", kind="no-spec", target="T", cells=[_cell(1, [100, 110, 90], 10.0)])
    spec = BenchArm(
        name="t+d",
        kind="bf16-draft",
        target="T",
        draft="D",
        num_speculative_tokens=3,
        cells=[_cell(1, [200, 190, 210], 6.0, al=2.5)],
    )
    cand = BenchArm(
        name="t+q",
        kind="candidate",
        target="T",
        draft="Q",
        num_speculative_tokens=3,
        cells=[_cell(1, [180, 170, 190], 7.0, al=2.5)],
    )
    comps = {c.arm: c for c in compare([base, spec, cand], samples=500)}
    assert comps["t+d"].speedup == pytest.approx(200 / 100)
    assert comps["t+d"].c_step == pytest.approx(6.0 * 2.5 / 10.0)
    assert comps["t+q"].vs_bf16_draft == pytest.approx(180 / 200)
    lo, hi = comps["t+d"].speedup_ci
    assert 190 / 110 <= lo <= 2.0 <= hi <= 210 / 90
    assert comps["t+q"].cost_named == "keeps its AL but costs more per step"
    assert comps["t+d"].c_step_from == "tpot"


def test_c_step_without_a_measured_tpot_comes_from_throughput():
    """A TPOT p50 of 0 (the server sent the stream in one chunk) is no TPOT: c_step = AL x tok/s_base / tok/s_spec."""
    from quantkit.bench.figures import compare
    from quantkit.results.bench import BenchArm

    base = BenchArm(name="t", kind="no-spec", target="T", cells=[_cell(1, [100, 100, 100], 0.0)])
    spec = BenchArm(
        name="t+d",
        kind="bf16-draft",
        target="T",
        draft="D",
        num_speculative_tokens=3,
        cells=[_cell(1, [150, 150, 150], 6.0, al=3.0)],
    )
    (comp,) = compare([base, spec], samples=200)
    assert comp.c_step_from == "throughput"
    assert comp.c_step == pytest.approx(3.0 * 100 / 150)
    assert comp.c_step == pytest.approx(comp.acceptance_length / comp.speedup)


def test_crossover_is_where_speculation_stops_paying_for_good():
    from quantkit.bench.figures import crossover, not_paying
    from quantkit.results.bench import BenchComparison

    def comps(sp):
        return [BenchComparison(arm="a", concurrency=c, speedup=v) for c, v in sp.items()]

    gpu_like = comps({1: 1.9, 4: 1.6, 16: 1.1, 32: 0.95, 64: 0.8})  # gains shrink with batch, then lose
    assert crossover(gpu_like, "a") == 32 and not_paying(gpu_like, "a") == [32, 64]
    low_only = comps({1: 0.98, 2: 1.4, 4: 2.5})  # loses at C=1 only: no crossover, but listed
    assert crossover(low_only, "a") is None and not_paying(low_only, "a") == [1]
    dip = comps({1: 1.5, 4: 0.9, 8: 1.2, 16: 0.7})
    assert crossover(dip, "a") == 16 and not_paying(dip, "a") == [4, 16]


def test_cli_rejects_bad_lists_and_endpoints(tiny, tmp_path):
    from click.testing import CliRunner

    from quantkit.cli import main

    r = CliRunner().invoke(
        main, ["bench", "--target", str(tiny / "target"), "--concurrency", "1,x", "--out", str(tmp_path)]
    )
    assert r.exit_code == 2 and "comma-separated" in r.output
    r = CliRunner().invoke(
        main, ["bench", "--target", str(tiny / "target"), "--endpoint", "nope", "--out", str(tmp_path)]
    )
    assert r.exit_code == 2 and "ARM=URL" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(
        main, ["bench", "--target", str(tiny / "target"), "--candidate", "x", "--out", str(tmp_path)]
    )
    assert r.exit_code == 2 and "--candidate needs --draft" in r.output
