# tier: integration
"""Issue 35 ("server logs left behind", "the wrong cause"): where the log of a `vllm serve` that failed or was
interrupted goes, and what the interrupt line says about it; a SPEED-Bench parquet that is a FIFO.

The server is a real child process started by quantkit.engines.vllm_server.VllmServer's own lifecycle code (start,
/health polling, process-group stop, log handling); only its command is a small Python program instead of vLLM,
so that a failure and an interrupt can be made on purpose in a second.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from quantkit.engines.vllm_server import ServerStartError, VllmServer
from quantkit.errors import KEPT_FILES, interrupted_hint

FAILS = "import sys; print('ValueError: no model named nowhere', flush=True); sys.exit(3)"
SERVES = r"""
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a): pass
print("INFO serving on", sys.argv[1], flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


class _Program(VllmServer):
    """A VllmServer whose process is `program` (argv[1]: the port) instead of `vllm serve`."""

    def __init__(self, program: str, **kw: object) -> None:
        super().__init__("tiny-target", None, startup_timeout_s=60, **kw)  # type: ignore[arg-type]
        self.program = program

    def build_command(self) -> list[str]:
        return [sys.executable, "-c", self.program, str(self.port)]


@pytest.fixture(autouse=True)
def _no_kept_files():
    KEPT_FILES.clear()
    yield
    KEPT_FILES.clear()


def test_failed_start_keeps_the_log_and_names_it(tmp_path):
    with pytest.raises(ServerStartError) as e:
        _Program(FAILS).start()
    message = str(e.value)
    log = Path(message.rsplit("(log ", 1)[1].split(")")[0])
    assert log.is_file() and "no model named nowhere" in log.read_text()
    assert "no model named nowhere" in message and "\n" not in message
    assert interrupted_hint() == f"nothing was left half-written; kept for you: {log}"
    assert "removed" not in interrupted_hint()
    log.unlink()


def test_interrupted_server_keeps_its_log_and_the_interrupt_line_names_it(tmp_path):
    server = _Program(SERVES)
    with pytest.raises(KeyboardInterrupt), server:
        assert server.running()
        raise KeyboardInterrupt
    assert not server.running()
    assert server.log_path is not None and server.log_path.is_file()
    assert "INFO serving on" in server.log_path.read_text()
    hint = interrupted_hint()
    assert str(server.log_path) in hint and "removed" not in hint
    # a resumable interrupt's own hint keeps the kept file too
    assert interrupted_hint("resume with --resume") == f"resume with --resume; kept for you: {server.log_path}"
    server.log_path.unlink()


def test_clean_stop_removes_a_temporary_log_and_says_nothing_was_kept():
    with _Program(SERVES) as server:
        log = server.log_path
        assert log is not None and log.is_file()
    assert not log.exists()
    assert interrupted_hint() == "nothing was left half-written (temporary files removed)"


def test_a_log_folder_of_the_user_keeps_every_log_there(tmp_path):
    logs = tmp_path / "server-logs"
    with _Program(SERVES, log_dir=logs) as server:
        log = server.log_path
    assert log is not None and log.parent == logs and log.is_file() and log.name.startswith("vllm-serve-")
    with pytest.raises(ServerStartError) as e:
        _Program(FAILS, log_dir=logs).start()
    failed = Path(str(e.value).rsplit("(log ", 1)[1].split(")")[0])
    assert failed.parent == logs and "no model named nowhere" in failed.read_text()
    assert not list(Path(os.environ.get("TMPDIR", "/tmp")).glob(f"quantkit-vllm-serve-*{failed.name}"))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this platform")
def test_speed_bench_parquet_that_is_a_fifo_is_refused_for_what_it_is(tmp_path):
    from quantkit.io.speed_bench import SpeedBenchError, load_speed_bench

    folder = tmp_path / "speed" / "qualitative"
    folder.mkdir(parents=True)
    os.mkfifo(folder / "test-00000-of-00001.parquet")
    with pytest.raises(SpeedBenchError) as e:
        load_speed_bench("speed-bench:qualitative", tmp_path / "speed")
    message = str(e.value)
    assert "named pipe" in message or "pipe" in message, message
    assert "fetch it again" not in message and "FileNotFoundError" not in message
    assert "qualitative/test-00000-of-00001.parquet" in message
