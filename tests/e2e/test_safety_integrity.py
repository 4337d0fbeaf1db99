"""Issue 18, data integrity: one output has one writer (the lock), the index is the truth about which files hold the
weights, `--resume` re-hashes what it keeps, headers are validated as safetensors' own loader validates them, and a
damaged journal is one line.

Bad inputs go through the real CLI in a subprocess and are held to tests/e2e/test_bad_inputs.py's contract: exit 2,
exactly one `error:` line, no traceback (no heavy import either, where the error is in a header or the index), no
output folder that looks complete, and every source byte for byte unchanged. The lock is tested with two real
`quantkit apply` processes on a model large enough to take a few seconds, and with a lock left by a process killed
with SIGKILL. The header rules are tested against `safetensors.safe_open` itself: quantkit's verdict on each
damaged file must be safetensors' verdict.

Header verdicts, index rules and journals without a process are in tests/unit/test_safety_headers.py.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures import checkpoints as ck
from tests.fixtures import hostile
from tests.fixtures.hostile import FORBIDDEN_HEAVY_EXIT, Run, error_lines, run_cli, tree_digest
from tests.unit.test_safety_headers import (
    INDEX,
    JOURNAL,
    MOE,
    SHARD1,
    SHARD2,
    _bad_journal,
    _by_offset,
    _consolidated,
    _safetensors_accepts,
)

ROOT = Path(__file__).resolve().parents[2]
ENV = {"PYTHONPATH": str(ROOT)}


def _apply(src: Path, out: Path, *extra: str, recipe: str = "mxfp4-moe") -> list[str]:
    return ["apply", "--recipe", recipe, "--model", str(src), "--output", str(out), "--devices", "cpu", *extra]


def _cli(args: list[str], cwd: Path, **kw: Any) -> Run:
    return run_cli(args, cwd=cwd, env={**ENV, **kw.pop("env", {})}, **kw)


def _refused(run: Run, *mentions: str, light: bool = False, code: int = 2) -> str:
    """The contract of tests/e2e/test_bad_inputs.py for one run; returns the error line."""
    where = (
        f"\n$ quantkit {' '.join(run.args)[:400]}\nexit {run.returncode} after {run.seconds:.1f}s\n"
        f"stderr: {run.stderr[-3000:]!r}\nstdout: {run.stdout[-500:]!r}"
    )
    assert run.returncode != FORBIDDEN_HEAVY_EXIT, "imported a heavy package before finding the error" + where
    assert "Traceback" not in run.stderr, where
    assert run.returncode == code, where
    lines = error_lines(run.stderr)
    assert len(lines) == 1, "expected exactly one error: line" + where
    if light:
        assert run.stderr == lines[0] + "\n" and run.stdout == "", where
    for text in mentions:
        assert text in lines[0], f"the error line should mention {text!r}" + where
    return lines[0]


def _no_output(out: Path) -> None:
    assert not out.exists(), f"{out} exists"
    leftovers = [
        p.name for p in out.parent.glob(f".{out.name}.quantkit-*") if not (p.is_dir() and (p / JOURNAL).is_file())
    ]
    assert not leftovers, f"left beside the output: {leftovers}"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _weights_and_config(folder: Path) -> dict[str, bytes]:
    """Everything but quantkit.json (which records timings and the command line)."""
    return {k: v for k, v in ck.tree_bytes(folder).items() if k != "quantkit.json"}


# --- headers through the CLI --------------------------------------------------------------------------------------


def _rewrite(path: Path, change: Callable[[dict[str, Any], bytes], tuple[dict[str, Any], bytes]]) -> None:
    header, data = hostile.read_header(path)
    header, data = change(header, data)
    hostile.write_safetensors(path, header, data)


def _alias(a: str, b: str) -> Callable[[dict[str, Any], bytes], tuple[dict[str, Any], bytes]]:
    """Tensor `b` reads `a`'s bytes (same dtype and shape); b's own bytes are cut out, so nothing else is wrong."""

    def change(header: dict[str, Any], data: bytes) -> tuple[dict[str, Any], bytes]:
        assert (header[a]["dtype"], header[a]["shape"]) == (header[b]["dtype"], header[b]["shape"])
        begin, end = header[b]["data_offsets"]
        for k in _by_offset(header):
            if header[k]["data_offsets"][0] >= end:
                header[k]["data_offsets"] = [o - (end - begin) for o in header[k]["data_offsets"]]
        header[b]["data_offsets"] = list(header[a]["data_offsets"])
        return header, data[:begin] + data[end:]

    return change


def _gap(after: str, size: int = 16) -> Callable[[dict[str, Any], bytes], tuple[dict[str, Any], bytes]]:
    def change(header: dict[str, Any], data: bytes) -> tuple[dict[str, Any], bytes]:
        end = header[after]["data_offsets"][1]
        for k in _by_offset(header):
            if header[k]["data_offsets"][0] >= end and k != after:
                header[k]["data_offsets"] = [o + size for o in header[k]["data_offsets"]]
        return header, data[:end] + b"\xaa" * size + data[end:]

    return change


def _past_end(header: dict[str, Any], data: bytes) -> tuple[dict[str, Any], bytes]:
    last = _by_offset(header)[-1]
    shape = header[last]["shape"]
    header[last]["shape"] = [shape[0] + 1, *shape[1:]]  # one row more, consistent with its dtype: past the file
    header[last]["data_offsets"][1] += (header[last]["data_offsets"][1] - header[last]["data_offsets"][0]) // shape[0]
    return header, data


DAMAGED_SHARDS: dict[str, Callable[[Path], None]] = {
    "two-tensors-share-one-byte-range": lambda p: _rewrite(
        p, _alias("model.layers.0.mlp.experts.5.gate_proj.weight", "model.layers.0.mlp.experts.5.up_proj.weight")
    ),
    "gap-between-tensors": lambda p: _rewrite(p, _gap("model.layers.0.mlp.experts.5.gate_proj.weight")),
    "tensor-end-runs-past-the-file": lambda p: _rewrite(p, _past_end),
    "header-claims-2**60-bytes": lambda p: hostile.set_header_length(p, 2**60),
    "trailing-bytes": lambda p: p.write_bytes(p.read_bytes() + b"\0" * 8),
}


@pytest.mark.parametrize("damage", list(DAMAGED_SHARDS))
def test_apply_and_inspect_refuse_a_shard_safetensors_refuses(tmp_path: Path, damage: str) -> None:
    src = hostile.copy_model(MOE, tmp_path / "src")
    DAMAGED_SHARDS[damage](src / SHARD2)
    assert not _safetensors_accepts(src / SHARD2)  # the reference: vLLM could not open it either
    before = tree_digest(src)
    out = tmp_path / "out"
    _refused(_cli(_apply(src, out), tmp_path, forbid_heavy=True), SHARD2, light=True)
    _refused(_cli(["inspect", str(src)], tmp_path, forbid_heavy=True), SHARD2, light=True)
    _no_output(out)
    assert tree_digest(src) == before


@pytest.fixture(scope="module")
def moe_output(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """mxfp4-moe applied to the bundled MoE target (native executor, a few seconds)."""
    out = tmp_path_factory.mktemp("moe-output") / "out"
    run = _cli(_apply(MOE, out), out.parent)
    assert run.returncode == 0, run.stderr[-3000:]
    return out


@pytest.mark.parametrize("damage", ["two-tensors-share-one-byte-range", "gap-between-tensors", "trailing-bytes"])
def test_check_refuses_an_output_safetensors_refuses(moe_output: Path, tmp_path: Path, damage: str) -> None:
    """The issue's case: two tensors share one byte range; check used to exit 0 on a file vLLM cannot open."""
    good = _cli(["check", str(moe_output), "--vllm", "off", "--json"], tmp_path, forbid_heavy=True)
    assert good.returncode == 0 and json.loads(good.stdout)["ok"], good.stderr[-2000:]
    out = hostile.copy_model(moe_output, tmp_path / "out")
    shard = out / SHARD2
    header, _ = hostile.read_header(shard)
    if damage == "two-tensors-share-one-byte-range":  # two MXFP4 expert weights of one shape
        a, b = "model.layers.0.mlp.experts.5.gate_proj.weight", "model.layers.0.mlp.experts.5.up_proj.weight"
        assert header[a]["dtype"] == "U8"  # MXFP4-packed
        _rewrite(shard, _alias(a, b))
    else:
        DAMAGED_SHARDS[damage](shard)
    assert not _safetensors_accepts(shard)
    before = tree_digest(out)
    _refused(_cli(["check", str(out), "--vllm", "off"], tmp_path, forbid_heavy=True), SHARD2, light=True)
    assert tree_digest(out) == before


# --- the index is the truth ---------------------------------------------------------------------------------------


def _tensor_names_in(folder: Path) -> list[str]:
    names = []
    for f in folder.rglob("*.safetensors"):
        names += [n for n in hostile.read_header(f)[0] if n != "__metadata__"]
    return names


@pytest.mark.parametrize("engine", ["native", "quark"])
def test_a_shard_the_index_does_not_name_is_neither_quantized_nor_copied(
    moe_output: Path, tmp_path: Path, engine: str
) -> None:
    """A Mistral-style `consolidated.safetensors` (every tensor again) beside the indexed shards, and one more in a
    sub-folder: the output holds each tensor once, equals the output of the clean source, and one warning names
    the ignored files."""
    src = hostile.copy_model(MOE, tmp_path / "src")
    hostile.write_safetensors(src / "consolidated.safetensors", *_consolidated(src))
    (src / "original").mkdir()
    shutil.copy(src / "consolidated.safetensors", src / "original" / "consolidated.safetensors")
    assert _safetensors_accepts(src / "consolidated.safetensors")
    before = tree_digest(src)
    out = tmp_path / "out"
    run = _cli(_apply(src, out, "--engine", engine), tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    # (a second warning, from the copy allow-list, names the `original/` folder as not copied)
    warnings = [line for line in run.stderr.splitlines() if "[quantkit apply] warning:" in line and INDEX in line]
    assert (
        len(warnings) == 1
        and "consolidated.safetensors" in warnings[0]
        and "original/consolidated.safetensors" in warnings[0]
    ), run.stderr
    names = _tensor_names_in(out)
    assert len(names) == len(set(names)) and names.count("lm_head.weight") == 1
    assert not [p for p in out.rglob("*.safetensors") if "consolidated" in p.name]
    index = json.loads((out / INDEX).read_text())["weight_map"]
    assert sorted(index) == sorted(names)
    manifest = json.loads((out / "quantkit.json").read_text())
    assert manifest["ignored_weight_files"] == ["consolidated.safetensors", "original/consolidated.safetensors"]
    assert sorted(manifest["source_files"]) == [SHARD1, SHARD2]
    assert tree_digest(src) == before
    if engine == "native":
        assert _weights_and_config(out) == _weights_and_config(moe_output)


def test_check_warns_about_a_file_the_index_does_not_name(moe_output: Path, tmp_path: Path) -> None:
    out = hostile.copy_model(moe_output, tmp_path / "out")
    run = _cli(["check", str(out), "--vllm", "off", "--json"], tmp_path, forbid_heavy=True)
    assert "unindexed-weight-file" not in run.stdout
    shutil.copy(out / SHARD1, out / "consolidated.safetensors")
    run = _cli(["check", str(out), "--vllm", "off", "--json"], tmp_path, forbid_heavy=True)
    result = json.loads(run.stdout)
    found = [f for f in result["findings"] if f["code"] == "unindexed-weight-file"]
    assert run.returncode == 0 and result["ok"], run.stderr[-2000:]  # vLLM skips the file: a warning, not an error
    assert len(found) == 1 and found[0]["severity"] == "warning" and "consolidated.safetensors" in found[0]["message"]


def _index(folder: Path) -> dict[str, Any]:
    return json.loads((folder / INDEX).read_text())


BAD_INDEXES: dict[str, tuple[Callable[[Path], None], tuple[str, ...]]] = {
    "names-a-missing-shard": (lambda s: (s / SHARD2).unlink(), (SHARD2, "missing")),
    "names-a-shard-outside-the-folder": (
        lambda s: (s / INDEX).write_text(
            json.dumps({"weight_map": {**_index(s)["weight_map"], "lm_head.weight": f"../{s.name}/{SHARD1}"}})
        ),
        ("not a .safetensors file",),
    ),
    "names-a-tensor-twice": (
        lambda s: (s / INDEX).write_text(
            (s / INDEX).read_text().replace('"weight_map": {', f'"weight_map": {{"lm_head.weight": "{SHARD2}", ', 1)
        ),
        ("'lm_head.weight' twice",),
    ),
    "names-a-file-that-is-not-safetensors": (
        lambda s: (s / INDEX).write_text(
            json.dumps({"weight_map": {**_index(s)["weight_map"], "lm_head.weight": "config.json"}})
        ),
        ("config.json",),
    ),
    "a-shard-holds-a-tensor-the-index-places-elsewhere": (
        lambda s: _rewrite(
            s / SHARD2,
            lambda h, d: (
                {**h, "lm_head.weight": {**h[_by_offset(h)[0]], "data_offsets": [len(d), len(d) + 65536]}},
                d + d[:65536],
            ),
        ),
        (SHARD2, "'lm_head.weight'", SHARD1),
    ),
    "a-shard-holds-a-tensor-the-index-does-not-list": (
        lambda s: _rewrite(
            s / SHARD2,
            lambda h, d: (
                {**h, "extra.weight": {"dtype": "BF16", "shape": [4], "data_offsets": [len(d), len(d) + 8]}},
                d + b"\0" * 8,
            ),
        ),
        ("'extra.weight'", "does not list"),
    ),
    "no-index-and-two-shards-overlap": (
        lambda s: ((s / INDEX).unlink(), hostile.write_safetensors(s / "consolidated.safetensors", *_consolidated(s))),
        ("is in both", "consolidated.safetensors"),
    ),
}


@pytest.mark.parametrize("case", list(BAD_INDEXES))
def test_index_problems_are_one_line(tmp_path: Path, case: str) -> None:
    damage, mentions = BAD_INDEXES[case]
    src = hostile.copy_model(MOE, tmp_path / "src")
    damage(src)
    before = tree_digest(src)
    out = tmp_path / "out"
    _refused(_cli(_apply(src, out), tmp_path, forbid_heavy=True), *mentions, light=True)
    _refused(_cli(["inspect", str(src)], tmp_path, forbid_heavy=True), *mentions, light=True)
    _no_output(out)
    assert tree_digest(src) == before


# --- a damaged journal is one line ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case", ["a-json-list", "shards-a-list", "entry-without-bytes_out", "5000-digit-integer", "from-a-different-source"]
)
def test_a_bad_journal_through_the_cli(tmp_path: Path, case: str) -> None:
    out, partial, before = _bad_journal(tmp_path, case)
    line = _refused(_cli(_apply(MOE, out, "--resume"), tmp_path), JOURNAL, "--overwrite")
    assert "resume with" not in line
    assert not out.exists()
    assert {p: tree_digest(p) for p in before} == before


def test_overwrite_starts_over_from_a_bad_journal(tmp_path: Path, moe_output: Path) -> None:
    out = tmp_path / "out"
    partial = tmp_path / ".out.quantkit-partial"
    partial.mkdir()
    (partial / JOURNAL).write_bytes(b"[]")
    run = _cli(_apply(MOE, out, "--overwrite"), tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert not partial.exists() and _weights_and_config(out) == _weights_and_config(moe_output)


# --- a model big enough to take a few seconds -----------------------------------------------------------------------


class _Apply:
    """A `quantkit apply` running in the background, its stderr read line by line."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "quantkit", *args],
            cwd=cwd,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "QUARK_DISABLE_COMPILE": "1", **ENV},
        )
        self.lines: list[str] = []
        self.done_shards = 0
        self.progressed = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self.progressed:
                self.lines.append(line)
                if re.search(r"shard \d+/\d+ ", line):
                    self.done_shards += 1
                self.progressed.notify_all()

    def wait_for_shards(self, n: int, timeout: float = 300) -> None:
        with self.progressed:
            ok = self.progressed.wait_for(lambda: self.done_shards >= n or self.proc.poll() is not None, timeout)
        assert ok and self.done_shards >= n, f"apply did not reach {n} shards: {''.join(self.lines)[-3000:]}"

    def finish(self, timeout: float = 600) -> tuple[int, str]:
        code = self.proc.wait(timeout=timeout)
        self.reader.join(timeout=30)
        return code, "".join(self.lines)


# --- one output, one writer -----------------------------------------------------------------------------------------


def test_a_second_run_on_a_live_output_is_refused_naming_it(big_moe: Path, big_moe_mxfp4: Path, tmp_path: Path) -> None:
    """Two real processes: while the first writes, a plain, an --overwrite and a --resume run on the same output are
    each refused in one line naming the first (pid, host, since), touch nothing, and the first finishes intact."""
    out = tmp_path / "out"
    first = _Apply(_apply(big_moe, out), tmp_path)
    stopped = False
    try:
        first.wait_for_shards(1)
        os.kill(first.proc.pid, signal.SIGSTOP)  # keeps it live (and its lock held) for as long as the test needs
        stopped = True
        partial = tmp_path / ".out.quantkit-partial"
        lock = tmp_path / ".out.quantkit-lock"
        holder = json.loads(lock.read_text())
        assert (
            holder["pid"] == first.proc.pid and holder["host"] == socket.gethostname() and "apply" in holder["command"]
        )
        before = tree_digest(partial)
        for extra in ([], ["--overwrite"], ["--resume"]):
            line = _refused(
                _cli(_apply(big_moe, out, *extra), tmp_path),
                f"pid {first.proc.pid}",
                f"on host {socket.gethostname()}",
                "since",
                "being written by another quantkit apply",
            )
            assert "--overwrite" not in line and "--resume" not in line, line  # no advice that would break the run
            assert tree_digest(partial) == before and not out.exists()
        # Another spelling of the same output (through a symlinked parent) is the same output.
        (tmp_path / "alias").symlink_to(tmp_path)
        _refused(_cli(_apply(big_moe, tmp_path / "alias" / "out", "--overwrite"), tmp_path), f"pid {first.proc.pid}")
        os.kill(first.proc.pid, signal.SIGCONT)
        stopped = False
        code, stderr = first.finish()
    finally:
        if stopped:
            os.kill(first.proc.pid, signal.SIGCONT)
        if first.proc.poll() is None:
            first.proc.kill()
            first.proc.wait()
    assert code == 0, stderr[-3000:]
    # no stale-lock or takeover warning (the copy allow-list's "not copied" line names the model's README and extra/)
    assert not [line for line in stderr.splitlines() if "warning" in line and "not copied from the source" not in line]
    assert _weights_and_config(out) == _weights_and_config(big_moe_mxfp4)
    assert not (tmp_path / ".out.quantkit-lock").exists() and not (tmp_path / ".out.quantkit-partial").exists()


def test_a_lock_left_by_a_killed_run_is_explained_and_taken_over(
    big_moe: Path, big_moe_mxfp4: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    first = _Apply(_apply(big_moe, out), tmp_path)
    try:
        first.wait_for_shards(2)
        os.kill(first.proc.pid, signal.SIGKILL)
        code, _ = first.finish()
    finally:
        if first.proc.poll() is None:
            first.proc.kill()
    assert code == -signal.SIGKILL
    lock = tmp_path / ".out.quantkit-lock"
    assert json.loads(lock.read_text())["pid"] == first.proc.pid  # left behind: the kernel released only the flock
    run = _cli(_apply(big_moe, out, "--resume"), tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    warnings = [
        line for line in run.stderr.splitlines() if "warning:" in line and "not copied from the source" not in line
    ]
    assert len(warnings) == 1 and "stale lock" in warnings[0] and f"pid {first.proc.pid}" in warnings[0], run.stderr
    assert "kept from the interrupted run" in run.stderr
    assert _weights_and_config(out) == _weights_and_config(big_moe_mxfp4)
    assert not lock.exists()


def test_a_lock_held_by_an_orphan_of_a_dead_run_is_taken_over(tmp_path: Path, moe_output: Path) -> None:
    """The run forked a helper that inherited the lock's descriptor, then was killed: the flock stays held by the
    helper, but the run it names is dead on this host."""
    out = tmp_path / "out"
    script = f"""
import os, signal, sys, time
from pathlib import Path
from quantkit.io.lock import output_lock
held = output_lock(Path({str(out)!r}), command="quantkit apply (forks a helper)")
held.__enter__()
child = os.fork()
if child == 0:
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    time.sleep(300)
    os._exit(0)
print(child, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **ENV},
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    orphan = int(done.stdout.strip())
    try:
        lock = tmp_path / ".out.quantkit-lock"
        dead = json.loads(lock.read_text())["pid"]
        fd = os.open(lock, os.O_RDONLY)
        with pytest.raises(BlockingIOError):  # the orphan still holds the flock
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(fd)
        run = _cli(_apply(MOE, out), tmp_path)
        assert run.returncode == 0, run.stderr[-3000:]
        warnings = [line for line in run.stderr.splitlines() if "warning:" in line]
        assert len(warnings) == 1 and f"pid {dead}" in warnings[0] and "no longer running" in warnings[0]
        assert _weights_and_config(out) == _weights_and_config(moe_output)
    finally:
        os.kill(orphan, signal.SIGKILL)


def test_a_live_holder_on_another_host_is_never_taken_over(tmp_path: Path) -> None:
    """A lock file naming another host (whose pids this host cannot check), held by a live process: refused."""
    out = tmp_path / "out"
    lock = tmp_path / ".out.quantkit-lock"
    holder = {
        "pid": 4242,
        "host": "gpu-node-7",
        "started": "2026-12-01 09:00:00 UTC",
        "command": "quantkit apply --recipe mxfp4-moe --model /models/x --output /shared/out",
    }
    script = f"""
import fcntl, json, os, sys, time
fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, json.dumps({holder!r}).encode())
print("locked", flush=True)
time.sleep(300)
"""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
        line = _refused(
            _cli(_apply(MOE, out, "--overwrite"), tmp_path),
            "pid 4242 on host gpu-node-7",
            "since 2026-12-01 09:00:00 UTC",
            "--output /shared/out",
        )
        assert len(line) < 600
        assert not out.exists() and not (tmp_path / ".out.quantkit-partial").exists()
    finally:
        proc.kill()
        proc.wait()
    assert json.loads(lock.read_text()) == holder  # never rewritten while held


# --- --resume re-hashes what it keeps ---------------------------------------------------------------------------------


def _flip_signs(path: Path, tensor: str, count: int = 64) -> None:
    """Negate the first `count` BF16 values of `tensor` in place (sign bit), keeping the file's size."""
    header, _ = hostile.read_header(path)
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
    start = 8 + n + header[tensor]["data_offsets"][0]
    with open(path, "r+b") as f:
        f.seek(start)
        values = bytearray(f.read(2 * count))
        for i in range(1, len(values), 2):
            values[i] ^= 0x80
        f.seek(start)
        f.write(values)


def test_resume_redoes_a_finished_shard_whose_source_changed_with_the_same_size_and_mtime(
    big_moe: Path, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    shutil.copytree(big_moe, src)
    out = tmp_path / "out"
    first = _Apply(_apply(src, out), tmp_path)
    try:
        first.wait_for_shards(3)
        first.proc.send_signal(signal.SIGTERM)
        code, stderr = first.finish()
    finally:
        if first.proc.poll() is None:
            first.proc.kill()
    assert code == 128 + signal.SIGTERM, stderr[-3000:]
    partial = tmp_path / ".out.quantkit-partial"
    finished = sorted(json.loads((partial / JOURNAL).read_text())["shards"])
    changed = next(
        f
        for f in finished
        if any(".mlp.experts." in n and n.endswith(".weight") for n in hostile.read_header(src / f)[0])
    )
    touched = next(f for f in finished if f != changed)
    expert = next(n for n in hostile.read_header(src / changed)[0] if ".mlp.experts." in n and n.endswith(".weight"))
    stale = (partial / changed).read_bytes()

    st = os.stat(src / changed)
    _flip_signs(src / changed, expert)
    os.utime(src / changed, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (os.stat(src / changed).st_size, os.stat(src / changed).st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    os.utime(src / touched)  # a new mtime, the same bytes: still the same source

    run = _cli(_apply(src, out, "--resume"), tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"shard {changed}: its source bytes changed since the interrupted run" in run.stderr
    assert re.search(rf"{re.escape(touched)}: kept from the interrupted run", run.stderr), run.stderr
    clean = tmp_path / "clean"
    done = _cli(_apply(src, clean), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out / changed).read_bytes() != stale  # the stale shard would have been kept before
    assert _weights_and_config(out) == _weights_and_config(clean)
    manifest = json.loads((out / "quantkit.json").read_text())
    real = {f.name: _sha256(f) for f in src.glob("*.safetensors")}
    assert manifest["source_files"] == real
    by_name = {s["name"]: s for s in manifest["shards"]}
    assert {n: s["sha256_in"] for n, s in by_name.items()} == real
    assert not by_name[changed]["resumed"] and by_name[touched]["resumed"]
    assert manifest["resumed_shards"] == len(finished) - 1
