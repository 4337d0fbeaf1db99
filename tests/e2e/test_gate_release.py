"""The gate's release side on real models: the serve step (a real `vllm serve` of the bundled deployment pair (conftest's moe_pair), MXFP4
MoE target + FP8 EAGLE-3 draft), the release figures (size against apply's dry-run prediction, tokenizer drift,
unquantized layers), and the verdict with its exit code: pass 0, regression / anomalous / infeasible 1.

Servers: one for the agreement test (42 built-in prompts at batch 1 and 8), one SIGKILLed while requests run, one
stopped by its startup timeout. Each test asserts that nothing of the server's process group is left.

The release figures without a server are in tests/unit/test_gate_release_figures.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import SHARED_SERVERS, require_vllm
from tests.unit.test_gate_release_figures import K, _config, _failures, _gate


@pytest.fixture(scope="module")
def few_prompts(tmp_path_factory) -> Path:
    """Every fourth built-in prompt (11, all domains): for the tests whose server is meant to fail."""
    from quantkit.io.paths import builtin_prompts_file

    lines = builtin_prompts_file().read_text().splitlines()[::4]
    path = tmp_path_factory.mktemp("prompts") / "few.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _servers() -> dict[int, int]:
    """vLLM API servers that are children of this process: pid -> port (from /proc); the session's shared server
    (conftest's served_tiny_pair, started if this worker ran tests/e2e/test_serve.py first) is not one of them."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in SHARED_SERVERS:
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if (
            int(fields[1]) == os.getpid()
            and fields[0] != "Z"
            and "--port" in argv
            and ("vllm.entrypoints.openai.api_server" in argv or "serve" in argv)
        ):
            found[int(entry)] = int(argv[argv.index("--port") + 1])
    return found


def _drop_kept_log(line: str) -> None:
    """A failed server's log is kept for the user (the message ends with `(log PATH)`); the test removes it."""
    import re

    m = re.search(r"\(log (/\S+\.log)\)", line)
    assert m, f"the message names no log file: {line}"
    Path(m.group(1)).unlink()


def _nothing_left(pid: int, port: int) -> None:
    from quantkit.engines.vllm_server import group_members

    assert group_members(pid) == [], f"processes of the server's group {pid} are still alive"
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0, f"something still listens on port {port}"


# --- served AL agrees with in-process AL -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(moe_pair, tmp_path_factory):
    """The gate's serve step alone on the pair: 42 built-in prompts at batch 1 and 8, in-process vLLM reference."""
    require_vllm()
    draft_q, target_q = moe_pair
    tmp = tmp_path_factory.mktemp("served")
    cfg = _config(
        tmp,
        [{"name": "pair", "path": str(draft_q), "target": str(target_q)}],
        ["serve"],
        serve={"batch_sizes": [1, 8], "require_batch_sizes": [1, 8]},
    )
    t0 = time.perf_counter()
    result = _gate(cfg, tmp / "r", "--json")
    print(f"\ngate serve step: {time.perf_counter() - t0:.1f} s")
    return result, tmp / "r"


def test_served_al_agrees_with_in_process(served, moe_pair):
    result, out = served
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["gate"]["verdict"] == "pass" and data["gate"]["passed"] is True and data["gate"]["reasons"] == []
    from quantkit.results import load_report

    rep = load_report(out / "report.json", model=moe_pair[0])
    sr = rep.serve
    assert sr is not None and sr.error is None and sr.in_process_source == "vllm"  # no acceptance step: run here
    assert sr.target == str(moe_pair[1]) and sr.draft == str(moe_pair[0]) and sr.num_prompts == 42
    assert sr.in_process_al is not None and sr.in_process_al > 2.5
    assert [b.batch_size for b in sr.batches] == [1, 8]
    assert len(sr.in_process_per_prompt) == 42
    for b in sr.batches:
        # Greedy, same pair and settings: the rule is prompt by prompt (quantkit.acceptance.agreement). Where the
        # served and in-process tokens are the same the counters are the same, and the AL difference is within what
        # the prompts that differ explain (measured on an AVX2 host: all 42 prompts the same, AL equal).
        a = b.agreement
        assert a is not None and a.prompts == 42 and a.same_output_prompts is not None, b
        assert a.counter_mismatches == [] and a.agree and abs(a.delta) <= a.bound, a
        assert [p.id for p in b.per_prompt] == [p.id for p in sr.in_process_per_prompt]
        assert sum(p.num_drafts for p in b.per_prompt) == b.num_drafts
        assert sum(p.num_accepted for p in b.per_prompt) == b.num_accepted
        assert b.num_requests == 42 and b.well_formed and b.malformed_responses == 0
        assert b.num_drafts and b.num_draft_tokens == K * b.num_drafts
        assert len(b.accepted_per_pos) == K and sum(b.accepted_per_pos) == b.num_accepted
        assert b.mean_acceptance_length == pytest.approx(1 + b.num_accepted / b.num_drafts)
        assert b.tokens_per_s and b.tokens_per_s > 0 and 0 < (b.ttft_s["p50"] or 0) <= (b.ttft_s["max"] or 0)
        print(
            f"batch {b.batch_size}: served AL {b.mean_acceptance_length:.4f} (in-process {sr.in_process_al:.4f}), "
            f"TTFT p50 {1000 * (b.ttft_s['p50'] or 0):.1f} ms, {b.tokens_per_s:.1f} tok/s, up in {sr.startup_s} s; "
            f"{a.same_output_prompts}/42 prompts with the same tokens, p {a.p_value:.3g}"
        )
    names = {c["name"]: c for c in data["gate"]["checks"]}
    for b in (1, 8):
        assert names[f"serve.bs{b}.al_vs_in_process"]["passed"] and names[f"serve.bs{b}.acceptance_length"]["passed"]
        assert names[f"serve.bs{b}.malformed_responses"]["value"] == 0
    md = (out / "report.md").read_text()
    assert "served (`vllm serve`" in md and "| 8 | " in md
    port = int(sr.command[sr.command.index("--port") + 1])
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0
    assert _servers() == {}


# --- a server that dies or does not come up ----------------------------------------------------------------------


def test_server_killed_midway_fails_the_step_cleanly(moe_pair, few_prompts, tmp_path):
    require_vllm()
    import httpx

    from quantkit.engines.vllm_server import parse_prometheus

    draft_q, target_q = moe_pair
    seen: dict = {}
    stop = threading.Event()

    def killer() -> None:
        # find our server, wait until vLLM reports requests running, then SIGKILL it: the kill lands mid-request
        while not stop.is_set():
            servers = _servers()
            if servers:
                pid, port = next(iter(servers.items()))
                seen.update(pid=pid, port=port)
                with httpx.Client(timeout=5) as client:
                    while not stop.is_set():
                        with contextlib.suppress(httpx.HTTPError):
                            metrics = parse_prometheus(client.get(f"http://127.0.0.1:{port}/metrics").text)
                            if sum(v for _, v in metrics.get("vllm:num_requests_running", [])) > 0:
                                seen["running_at_kill"] = True
                                os.kill(pid, signal.SIGKILL)
                                return
                        time.sleep(0.02)
            time.sleep(0.1)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    cfg = _config(
        tmp_path,
        [{"name": "pair", "path": str(draft_q), "target": str(target_q)}],
        ["serve"],
        acceptance={"prompts": str(few_prompts)},
        serve={"batch_sizes": [1]},
    )
    try:
        result = _gate(cfg, tmp_path / "r", "--json")
    finally:
        stop.set()
        thread.join(timeout=10)
    assert seen.get("running_at_kill"), "the kill did not land while requests were running"
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    assert data["gate"]["verdict"] == "infeasible"
    lines = _failures(result)
    print(f"\n{lines}")
    assert len(lines) == 1, lines
    assert lines[0].startswith("gate failed: pair: serve: serve.error: step failed: vllm serve ")
    assert "was killed by signal 9 while serving requests" in lines[0] and "last log lines:" in lines[0]
    assert data["candidates"]["pair"]["serve"]["error"] in lines[0]
    assert data["gate"]["reasons"] == [
        f"infeasible: serve.error: could not run (step failed: {data['candidates']['pair']['serve']['error']})"
    ]
    _nothing_left(seen["pid"], seen["port"])
    _drop_kept_log(lines[0])


def test_server_that_does_not_come_up_is_infeasible(moe_pair, few_prompts, tmp_path):
    require_vllm()
    draft_q, target_q = moe_pair
    cfg = _config(
        tmp_path,
        [{"name": "pair", "path": str(draft_q), "target": str(target_q)}],
        ["serve"],
        acceptance={"prompts": str(few_prompts)},
        serve={"startup_timeout_s": 4},
    )
    result = _gate(cfg, tmp_path / "r", "--json")
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    assert data["gate"]["verdict"] == "infeasible" and data["candidates"]["pair"]["verdict"] == "infeasible"
    lines = _failures(result)
    assert len(lines) == 1 and "did not answer /health within 4 s" in lines[0] and "startup_timeout_s" in lines[0]
    assert "last log lines:" in lines[0] or "the log is empty" in lines[0]
    sr = data["candidates"]["pair"]["serve"]
    assert sr["batches"] == [] and sr["in_process_al"] > 2.5  # the reference ran; the server never answered
    assert _servers() == {}
    assert "gate verdict: infeasible" in result.stderr
    _drop_kept_log(lines[0])


# --- anomalous ---------------------------------------------------------------------------------------------------


def test_candidate_beating_its_baseline_beyond_the_ci_is_anomalous(
    tiny, fp8_draft, broken_fp8_draft, few_prompts, tmp_path
):
    """Swapped paths: the damaged draft given as the BF16 baseline. The good FP8 draft then 'beats' it with a ratio CI
    wholly above 1: no threshold is missed, yet the gate must not pass it."""
    good, _ = fp8_draft
    cfg = _config(
        tmp_path,
        [{"name": "draft-fp8", "path": str(good)}],
        ["acceptance"],
        target=str(tiny / "target"),
        draft=str(broken_fp8_draft),
        acceptance={"backend": "reference", "prompts": str(few_prompts)},
    )
    result = _gate(cfg, tmp_path / "r", "--json")
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    assert data["gate"]["verdict"] == "anomalous", data["gate"]["reasons"]
    acc = data["candidates"]["draft-fp8"]["acceptance"]
    assert acc["ratio_ci"][0] > 1 and acc["ratio"] >= 0.98  # the threshold holds: only the CI makes it anomalous
    ratio = next(c for c in data["gate"]["checks"] if c["name"] == "acceptance.ratio")
    assert not ratio["passed"] and ratio["message"].startswith("anomalous: better than its baseline beyond its CI")
    assert [r.split(": ")[0] for r in data["gate"]["reasons"]] == ["anomalous"]
    assert "gate verdict: anomalous" in result.stderr
    md = (tmp_path / "r" / "report.md").read_text()
    assert "FAILED (verdict: **anomalous**)" in md
