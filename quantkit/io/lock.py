"""One output, one writer: an OS file lock beside an output folder, held by `apply` from before its first write
until after the final rename, whose file names the holder (pid, host, start time, command line).

The lock file is `.<output name>.quantkit-lock` in the output's parent folder, beside the hidden partial folder
`.<output name>.quantkit-partial` that it protects (a second `--overwrite` would delete that folder, a second
`--resume` adopt it, under the running first run). The lock is `fcntl.flock` on that file: the kernel releases it
when its holder dies, SIGKILL included, so whether a run is live is never guessed from the file's contents; the
contents only name the holder in messages.

- Held by a live process: a second run (plain, --overwrite or --resume) is refused in one line that names it.
- Free, but the file is still there: its holder ended without removing it (killed, crashed, host rebooted). That is
  a stale lock: one warning line explains it, and the new run takes it over.
- Held, but the process it names is dead on this host (same host name, same boot, same PID namespace; the pid is
  gone, a zombie, or reused by a process that started later): a child that inherited the descriptor keeps the
  flock alive after its parent died. Stale too: explained, and replaced by a fresh lock file.

flock works across hosts on local file systems and on NFS (Linux clients map it to NFS byte-range locks), but not
on NFS mounted with `nolock`, where two hosts cannot see each other's locks.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from quantkit.errors import QuantkitError
from quantkit.progress import Progress, or_silent

LOCK_SUFFIX = ".quantkit-lock"
_MAX_LOCK_BYTES = 64 * 1024
_COMMAND_CHARS = 1000  # kept in the file
_SHOWN_COMMAND_CHARS = 160  # shown in a message


class OutputLockedError(QuantkitError):
    """Another quantkit apply is writing the same output (it holds the output's lock)."""


@dataclass(frozen=True)
class LockHolder:
    """Who holds (or held) an output's lock, as its lock file says."""

    pid: int
    host: str
    started: str  # ISO 8601, UTC
    command: str = ""
    boot_id: str | None = None
    pid_namespace: str | None = None
    pid_start: str | None = None  # /proc/<pid>/stat starttime: tells a reused pid from the holder

    def describe(self) -> str:
        command = (
            self.command
            if len(self.command) <= _SHOWN_COMMAND_CHARS
            else self.command[: _SHOWN_COMMAND_CHARS - 3] + "..."
        )
        return f"pid {self.pid} on host {self.host}, since {self.started}" + (f": {command}" if command else "")


def lock_path(output: str | Path) -> Path:
    """The lock file of `output`: `.<name>.quantkit-lock` beside it (symlinks in its parents resolved, so every
    spelling of one output gets one lock)."""
    out = Path(os.path.realpath(Path(output).expanduser()))
    return out.with_name(f".{out.name}{LOCK_SUFFIX}")


@contextlib.contextmanager
def output_lock(output: str | Path, command: str | None = None, progress: Progress | None = None) -> Iterator[Path]:
    """Hold the lock of `output` for the block; OutputLockedError (one line naming the live holder) if another
    process holds it. `command` is recorded for others to see (default: this process's command line); a stale lock
    is reported through `progress` (one `warning:` line) and taken over."""
    path = lock_path(output)
    shown = command if command is not None else " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])
    fd = _acquire(path, Path(output), shown, or_silent(progress))
    try:
        yield path
    finally:
        _release(path, fd)


def _myself(command: str) -> LockHolder:
    return LockHolder(
        pid=os.getpid(),
        host=socket.gethostname(),
        command=command[:_COMMAND_CHARS],
        started=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        boot_id=_boot_id(),
        pid_namespace=_pid_namespace(),
        pid_start=_pid_start(os.getpid()),
    )


def _acquire(path: Path, output: Path, command: str, progress: Progress) -> int:
    for _ in range(10):  # each retry follows a lock file that changed hands between open and flock
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            why = "it is a symbolic link" if e.errno == errno.ELOOP else (e.strerror or str(e))
            raise OutputLockedError(
                f"output {output}: cannot open its lock file {path} ({why}); remove it or pick another output folder"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd, wait=True)
            examined = os.fstat(fd)
            os.close(fd)
            if holder is not None and _dead_here(holder):
                progress(
                    f"warning: taking over the lock {path}: it is still held, but the run that took it "
                    f"({holder.describe()}) is no longer running; a process it left behind keeps the file "
                    "locked"
                )
                with contextlib.suppress(FileNotFoundError):
                    if _same_inode(os.stat(path, follow_symlinks=False), examined):
                        os.unlink(path)
                continue
            who = holder.describe() if holder is not None else f"details not written yet; lock file {path}"
            raise OutputLockedError(
                f"output {output} is being written by another quantkit apply ({who}); wait for "
                "it to finish, or stop it, before writing this output again"
            ) from None
        try:
            if not _same_inode(os.stat(path, follow_symlinks=False), os.fstat(fd)):
                os.close(fd)  # released and removed (or replaced) by its holder between our open and our flock
                continue
        except FileNotFoundError:
            os.close(fd)
            continue
        if os.fstat(fd).st_size:
            holder = _read_holder(fd, wait=False)
            who = f"the run that took it ({holder.describe()})" if holder is not None else "the run that took it"
            progress(
                f"warning: taking over the stale lock {path}: {who} ended without releasing it (killed, "
                "crashed, or its host rebooted)"
            )
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(asdict(_myself(command)), ensure_ascii=False) + "\n").encode(), 0)
        os.fsync(fd)
        return fd
    raise OutputLockedError(
        f"output {output}: its lock file {path} keeps changing hands; another quantkit apply "
        "is starting on it: wait for it, then run again"
    )


def _release(path: Path, fd: int) -> None:
    try:
        with contextlib.suppress(OSError):
            if _same_inode(os.stat(path, follow_symlinks=False), os.fstat(fd)):
                os.unlink(path)  # before closing: a waiting run then finds no file, or a fresh one, never ours
    finally:
        os.close(fd)


def _same_inode(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _read_holder(fd: int, wait: bool) -> LockHolder | None:
    """The holder a lock file names; with `wait`, give a holder that has just taken the lock a moment to write."""
    deadline = time.monotonic() + (1.0 if wait else 0.0)
    while True:
        raw = os.pread(fd, _MAX_LOCK_BYTES, 0)
        holder = _parse_holder(raw)
        if holder is not None or time.monotonic() >= deadline:
            return holder
        time.sleep(0.05)


def _parse_holder(raw: bytes) -> LockHolder | None:
    try:
        data = json.loads(raw.decode("utf-8"))
        return (
            LockHolder(**{k: data[k] for k in LockHolder.__dataclass_fields__ if k in data})
            if isinstance(data, dict) and isinstance(data.get("pid"), int) and isinstance(data.get("host"), str)
            else None
        )
    except (ValueError, TypeError, RecursionError):
        return None


def _dead_here(holder: LockHolder) -> bool:
    """The holder is a process of this very host, boot and PID namespace that no longer runs (or whose pid now
    belongs to a later process). Anything else (another host, another container) cannot be checked: not dead."""
    if (holder.host, holder.boot_id, holder.pid_namespace) != (socket.gethostname(), _boot_id(), _pid_namespace()):
        return False
    if holder.boot_id is None or holder.pid_namespace is None:
        return False  # no /proc: a pid of another namespace would look dead
    stat = _proc_stat(holder.pid)
    if stat is None:
        return True
    state, start = stat
    return state in ("Z", "X") or (holder.pid_start is not None and start != holder.pid_start)


def _proc_stat(pid: int) -> tuple[str, str] | None:
    """(state, starttime) of a process from /proc/<pid>/stat, or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (fields[0], fields[19]) if len(fields) > 19 else None


def _pid_start(pid: int) -> str | None:
    stat = _proc_stat(pid)
    return stat[1] if stat is not None else None


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
