# tier: unit
"""Issue 36.3: one rule for a bench figure that cannot be measured. A TPOT p50 of 0.0039 ms with an E2EL of 40 ms
for 4 tokens (vLLM merged the stream: the tokens reached the client in one chunk) gave "256,423 tok/s per user" in
pareto.png; it is no measurement: no interactivity, a reason, a warning in bench.json, nothing in the table or the
chart. One repeat gives no interval, and says so."""

from __future__ import annotations

import pytest


def _cell(tpot_ms: float, e2el_ms: float, tputs: list[float], output_len: int = 4):
    from quantkit.bench.figures import fill_cell
    from quantkit.results.bench import BenchCell, BenchRun

    runs = [
        BenchRun(completed=1, output_throughput=t, p50_tpot_ms=tpot_ms, p50_e2el_ms=e2el_ms, output_lens=[output_len])
        for t in tputs
    ]
    return fill_cell(BenchCell(concurrency=1, num_prompts=1, output_len=output_len, repeats=runs))


def test_merged_stream_tpot_gives_no_interactivity_but_a_reason():
    merged = _cell(0.0039, 40.0, [100.0, 101.0, 99.0])
    assert merged.ok and merged.interactivity is None
    assert "merged" in merged.interactivity_reason
    # a real TPOT: 1000 / 9.0 ms, by hand
    real = _cell(9.0, 1.0 + 3 * 9.0, [100.0, 101.0, 99.0])
    assert real.interactivity == pytest.approx(1000 / 9.0) and real.interactivity_reason == ""


def test_unmeasured_figures_are_warnings_and_left_out_of_table_and_chart(tmp_path, capsys):
    from quantkit.bench.charts import draw
    from quantkit.bench.run import unmeasured_warnings
    from quantkit.cli.bench import render
    from quantkit.results.bench import BenchArm, BenchIdentity, BenchResult, BenchSettings

    arm = BenchArm(
        name="target+tiny-eagle3-draft-fp8-with-a-long-name",
        kind="no-spec",
        target="T",
        cells=[_cell(0.0039, 40.0, [100.0])],
    )
    warnings = unmeasured_warnings([arm], repeats=1)
    assert any("one repeat" in w and "no confidence interval" in w for w in warnings)
    assert any("interactivity not measured" in w and "C=1" in w for w in warnings)
    result = BenchResult(
        identity=BenchIdentity(hardware="cpu"),
        arms=[arm],
        warnings=warnings,
        out_dir=str(tmp_path),
        settings=BenchSettings(
            concurrency=[1],
            output_len=4,
            repeats=1,
            num_warmups="2 x C",
            ks=[3],
            prompts="builtin",
            num_prompt_texts=1,
            bootstrap_samples=10,
        ),
    )
    draw(result, tmp_path)  # the pareto chart takes only measured points: it must not fail on an empty line
    render(result)
    out = capsys.readouterr().out
    assert "256" not in out and "not measured" in out
    assert "target+tiny-eagle3-draft-fp8-with-a-long-name" in out  # the arm's name whole
    assert "(min-max)" not in out and "95% CI" not in out  # one repeat: no interval columns


def test_one_repeat_gives_no_confidence_interval():
    from quantkit.bench.figures import compare
    from quantkit.results.bench import BenchArm

    base = BenchArm(name="t", kind="no-spec", target="T", cells=[_cell(9.0, 28.0, [100.0])])
    spec = BenchArm(
        name="t+d",
        kind="bf16-draft",
        target="T",
        draft="D",
        num_speculative_tokens=3,
        cells=[_cell(5.0, 16.0, [150.0])],
    )
    (comp,) = compare([base, spec], samples=100)
    assert comp.speedup == pytest.approx(1.5) and comp.speedup_ci is None
