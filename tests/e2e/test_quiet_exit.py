# tier: e2e
"""Issue 36 item 6: what native extensions print while the interpreter shuts down (nanobind's "leaked N instances!"
from triton/_C/libtriton.so, which vLLM imports) goes to the command's third-party log, not the user's terminal,
for every command that routes third-party output there (quantkit.cli.options.third_party_output: bench, demo).

A child interpreter stands for a command: it enters third_party_output, prints its own last line on the terminal
stream, and something written straight to file descriptor 2 during shutdown (an atexit callback registered before
the command ran: atexit runs callbacks last-in first-out, so it runs after quantkit's; nanobind's handler runs later
still, at the end of Py_Finalize) must land in the log.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import atexit, os, sys
from pathlib import Path
atexit.register(lambda: os.write(2, b"nanobind: leaked 4 instances!\n"))
from quantkit.cli.options import third_party_output
log = Path(sys.argv[1])
with third_party_output(log) as terminal:
    os.write(2, b"a vLLM warning\n")
    terminal.write("[quantkit bench] done\n")
print("the table", flush=True)
"""


def test_output_at_interpreter_exit_goes_to_the_log(tmp_path: Path) -> None:
    log = tmp_path / "out" / "third-party.log"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    r = subprocess.run(
        [sys.executable, "-c", CHILD, str(log)], capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr
    assert r.stderr == "[quantkit bench] done\n" and r.stdout == "the table\n"
    text = log.read_text()
    assert "a vLLM warning" in text and "nanobind: leaked 4 instances!" in text


def test_without_third_party_output_nothing_is_redirected(tmp_path: Path) -> None:
    """The control: the same exit-time write reaches stderr when no command routed third-party output."""
    child = 'import atexit, os; atexit.register(lambda: os.write(2, b"nanobind: leaked 4 instances!\\n"))'
    r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert "nanobind: leaked 4 instances!" in r.stderr
