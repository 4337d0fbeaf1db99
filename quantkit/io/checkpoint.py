"""Hugging Face checkpoint folders: resolving a source, reading its config and tensor index, and atomic output.

Reads are header-only (quantkit.io.headers) unless a caller asks for tensors; writes go to a hidden temporary
folder beside the output and are renamed into place only when complete, so an interrupted or failed run never
leaves a folder that looks finished.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any

from quantkit.errors import (
    CheckpointError,
    QuantkitError,
    ResumableInterrupt,
    Terminated,
    UnresumableError,
    raise_if_signalled,
)
from quantkit.io.config import num_hidden_layers
from quantkit.io.files import DOWNLOAD_PATTERNS, MANIFEST_FILE, _umask, scan_folder
from quantkit.io.headers import TensorInfo, checkpoint_tensors, read_config
from quantkit.io.lock import output_lock
from quantkit.progress import Progress

_FILE = itemgetter(0)  # of a TensorInfo: its shard, one string shared by the shard's tensors

HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


class OutputExistsError(QuantkitError):
    """The output folder exists and --overwrite was not given."""


@dataclass
class SourceCheckpoint:
    """A checkpoint folder with its config.json and the header-level view of its tensors."""

    path: Path
    config: dict[str, Any]
    tensors: dict[str, TensorInfo]
    hub_id: str | None = None
    files: list[str] = field(default_factory=list)

    @property
    def architecture(self) -> str:
        archs = self.config.get("architectures") or []
        return str(archs[0]) if archs else str(self.config.get("model_type", "unknown"))

    @property
    def size_bytes(self) -> int:
        return sum((self.path / f).stat().st_size for f in self.files)


def _locate(source: str | Path, patterns: list[str]) -> tuple[Path, str | None]:
    """The local folder of `source`, downloading the files matching `patterns` when it is a Hub repo id."""
    path = Path(source).expanduser()
    hub_id = None
    if not path.exists():
        if not HUB_ID.match(str(source)):
            raise CheckpointError(f"model {source}: no such folder; pass a checkpoint folder or a Hub repo id ORG/NAME")
        hub_id = str(source)
        path = _download(hub_id, patterns)
    if not path.is_dir():
        raise CheckpointError(f"model {source}: not a folder; pass the checkpoint folder that holds config.json")
    return path, hub_id


def resolve_config(source: str | Path) -> dict[str, Any]:
    """config.json of a local folder or a Hub repo id, without reading (or downloading) any weights."""
    path, _ = _locate(source, ["config.json"])
    return read_config(path)


def target_layer_count(target: str | Path) -> int:
    """num_hidden_layers of a target (local folder or Hub id), from its config.json only: no weights are read."""
    return num_hidden_layers(resolve_config(target), target)


def resolve_source(source: str | Path, *, copying: bool = False) -> SourceCheckpoint:
    """A local folder, or a Hub repo id downloaded with huggingface_hub (weights, config and io.files.AUX_FILES).

    Its top level is checked before anything is read (io.files.scan_folder): a link loop, a dangling link, a link to
    a folder, a pipe or a device is refused; with `copying` (apply) so is a link that leads out of the folder (or,
    for a Hugging Face cache snapshot, out of its repo's blobs/)."""
    path, hub_id = _locate(source, DOWNLOAD_PATTERNS)
    scan_folder(path, inside=copying)
    config = read_config(path)
    tensors = checkpoint_tensors(path)
    if not tensors:
        raise CheckpointError(f"model {source}: no safetensors weights in {path}; quantkit reads .safetensors only")
    files = sorted(set(map(_FILE, tensors.values())))
    return SourceCheckpoint(path=path, config=config, tensors=tensors, hub_id=hub_id, files=files)


def _download(repo_id: str, patterns: list[str]) -> Path:
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import (
            HfHubHTTPError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
        )
    except ImportError as e:  # pragma: no cover - huggingface_hub is a dependency
        raise CheckpointError(f"model {repo_id}: huggingface_hub is needed to download it ({e})") from None
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns))
    except RepositoryNotFoundError:
        raise CheckpointError(
            f"model {repo_id}: no such Hub repo (or no access); check the id or set HF_TOKEN"
        ) from None
    except LocalEntryNotFoundError:
        raise CheckpointError(
            f"model {repo_id}: not a local folder and the Hub is unreachable; download it first or pass a folder"
        ) from None
    except (HfHubHTTPError, OSError) as e:
        raise CheckpointError(f"model {repo_id}: download failed ({type(e).__name__}); pass a local folder") from None


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


class OutputWriteError(QuantkitError):
    """The output cannot be written: its parent is not a writable folder, or the disk filled up."""


# errno values that mean "the disk (or the file size limit) is full", as OSError or inside a library's message.
_FULL = {
    errno.ENOSPC: "no space left on device",
    errno.EFBIG: "file too large for this file system or limit",
    errno.EDQUOT: "disk quota exceeded",
}


def _real(path: Path | str) -> Path:
    return Path(os.path.realpath(Path(path).expanduser()))


def _relation(out: Path, src: Path) -> str | None:
    if out == src:
        return "is"
    if out.is_relative_to(src):
        return "lies inside"
    if src.is_relative_to(out):
        return "contains"
    return None


def quantkit_owned_files(folder: Path) -> set[str] | None:
    """The files a previous `quantkit apply` wrote into `folder` (from its quantkit.json), as paths relative to it
    (`a/b` inside sub-folders), or None if it has no quantkit.json.

    Manifests older than the `output_files` field name no files; then every plain top-level file counts as
    quantkit's (such a folder was written whole by quantkit's atomic rename). Older manifests name a sub-folder by its
    name alone; then everything under it counts as quantkit's (see `_owned`).
    """
    manifest = folder / MANIFEST_FILE
    if not manifest.is_file():
        return None
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    files = data.get("output_files")
    if isinstance(files, list) and all(isinstance(f, str) for f in files):
        return set(files) | {MANIFEST_FILE}
    return {p.name for p in folder.iterdir() if p.is_file() and not p.is_symlink()}


def check_output_free(output: Path, overwrite: bool, sources: Sequence[str | Path] = ()) -> None:
    """Fail early, before any work, unless writing `output` is safe.

    Never allowed, --overwrite or not: an output that is, contains, or lies inside one of `sources` (after
    resolving symlinks), an output that is a symlink, and an output whose parent is not a writable folder.
    An existing empty folder is replaced; an existing non-empty one only with --overwrite, only when a previous
    `quantkit apply` wrote it (quantkit.json), and only when it holds nothing but the files quantkit wrote.
    """
    shown = str(output)
    out = _real(output)
    for source in sources:
        if not Path(source).expanduser().exists():
            continue  # a Hub id: its files live in the HF cache, checked below through the resolved folder
        relation = _relation(out, _real(source))
        if relation:
            raise OutputExistsError(
                f"output {shown} {relation} the source {source}; quantkit never writes over or "
                "removes a source: pick an output folder outside it"
            )
    if Path(output).expanduser().is_symlink():
        raise OutputExistsError(f"output {shown} is a symbolic link; pass the folder it points to, or another path")
    ancestor = out.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OutputWriteError(f"output {shown}: {ancestor} is a file, not a folder; pick an output path in a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise OutputWriteError(f"output {shown}: folder {ancestor} is not writable; pick a folder you can write to")
    if not out.exists():
        return
    if not out.is_dir():
        raise OutputExistsError(f"output {shown} exists and is not a folder; remove it or pick another path")
    entries = sorted(p.name for p in out.iterdir())
    if not entries:
        return
    if not overwrite:
        raise OutputExistsError(
            f"output {shown} already exists; pass --overwrite to replace it (only a previous "
            "quantkit output) or pick another folder"
        )
    owned = quantkit_owned_files(out)
    if owned is None:
        raise OutputExistsError(
            f"output {shown} exists and was not written by quantkit apply (no {MANIFEST_FILE}); "
            "--overwrite only replaces quantkit outputs: remove it yourself or pick another folder"
        )
    foreign = [e for e in entries if not _owned(out, e, owned)]
    if foreign:
        listed = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise OutputExistsError(
            f"output {shown} holds files quantkit did not write ({listed}); --overwrite only "
            "removes what quantkit wrote: move them away or pick another folder"
        )


def _owned(out: Path, name: str, owned: set[str]) -> bool:
    """Whether the entry `name` of a previous output (a file, or a sub-folder and everything in it) is quantkit's:
    named in `owned` itself (a file, or a sub-folder as older manifests recorded it), or a real sub-folder whose
    every file is named (`sub/file`). Links are never quantkit's inside a sub-folder: apply writes none."""
    path = out / name
    if not path.is_dir() or path.is_symlink():
        return name in owned
    if name in owned:
        return True
    files = [
        Path(root, f)
        for root, dirs, names in os.walk(path)
        for f in names + [d for d in dirs if Path(root, d).is_symlink()]
    ]
    return bool(files) and all(p.relative_to(out).as_posix() in owned and not p.is_symlink() for p in files)


def written_files(folder: Path) -> list[str]:
    """Every file under `folder`, as sorted paths relative to it (`sub/file`): what apply records as `output_files`."""
    return sorted(Path(root, f).relative_to(folder).as_posix() for root, _, names in os.walk(folder) for f in names)


def full_disk_reason(e: BaseException) -> str | None:
    """'no space left on device' (or the like) if `e` is a write failure for lack of room, else None."""
    if isinstance(e, OSError) and e.errno in _FULL:
        return _FULL[e.errno]
    text = str(e)
    for code, reason in _FULL.items():
        if f"os error {code})" in text or os.strerror(code) in text:
            return reason
    return None


def publish_permissions(folder: Path) -> None:
    """Give `folder` and its files the modes a plain write would (0o777/0o666 less the umask).

    mkdtemp makes 0700 folders and some writers 0600 files; an output is read by other accounts (a server's).
    """
    mask = _umask()
    for p in folder.rglob("*"):
        if not p.is_symlink():
            os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~mask)
    os.chmod(folder, 0o777 & ~mask)


RESUMABLE_MARKER = ".quantkit-journal.json"  # quantkit.apply.shards.JOURNAL_NAME: present while a run is resumable


def partial_folder(output: Path) -> Path:
    """Where a resumable run builds `output`: a hidden folder beside it with a fixed name, so `--resume` finds it."""
    return output.with_name(f".{output.name}.quantkit-partial")


@contextlib.contextmanager
def atomic_output(
    output: Path,
    overwrite: bool = False,
    sources: Sequence[str | Path] = (),
    *,
    resumable: bool = False,
    resume: bool = False,
    resume_hint: str = "",
    command: str | None = None,
    progress: Progress | None = None,
) -> Iterator[Path]:
    """Yield a temporary folder beside `output`; rename it to `output` only if the block succeeds.

    The whole block runs under the output's lock (quantkit.io.lock: one writer per output; a second run is refused
    in one line naming the live one, `command` is what the lock file records; a stale lock is reported through
    `progress` and taken over). Every decision about an existing output or partial folder is made under it.

    On any failure or interrupt (SIGINT, and SIGTERM, which the CLI turns into the same KeyboardInterrupt) the
    temporary folder is removed, except a `resumable` run's, which stays while it holds the executor's journal: then
    an interrupt raises ResumableInterrupt and an error gets `resume_hint` appended (unless it is an
    UnresumableError: a journal that resuming cannot use). `resume` continues such a folder; without it an existing
    one is an error (or discarded with `overwrite`). A previous output is replaced only as check_output_free allows.
    """
    check_output_free(output, overwrite, sources)
    output = output.expanduser().resolve()
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputWriteError(
            f"output {output}: cannot create a folder in {output.parent} "
            f"({e.strerror or e}); pick a folder you can write to"
        ) from None
    with (
        output_lock(output, command, progress),
        _atomic_output_locked(output, overwrite, sources, resumable, resume, resume_hint) as tmp,
    ):
        yield tmp


@contextlib.contextmanager
def _atomic_output_locked(
    output: Path, overwrite: bool, sources: Sequence[str | Path], resumable: bool, resume: bool, resume_hint: str
) -> Iterator[Path]:
    check_output_free(output, overwrite, sources)  # again, under the lock: another run may have finished meanwhile
    try:
        if resumable:
            tmp = partial_folder(output)
            if tmp.exists() and not (tmp / RESUMABLE_MARKER).is_file():
                shutil.rmtree(tmp)  # nothing to resume in it (the journal is written before any shard)
            if tmp.exists() and not resume:
                if not overwrite:
                    raise OutputExistsError(
                        f"output {output}: an interrupted run left {tmp.name} beside it; pass "
                        "--resume to continue it, or --overwrite to start over"
                    )
                shutil.rmtree(tmp)
            tmp.mkdir(exist_ok=True)
        else:
            tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.quantkit-", dir=output.parent))
    except OSError as e:
        raise OutputWriteError(
            f"output {output}: cannot create a folder in {output.parent} "
            f"({e.strerror or e}); pick a folder you can write to"
        ) from None
    keep = False
    try:
        try:
            yield tmp
            raise_if_signalled()  # a signal a library swallowed mid-run: the folder is not committed
            publish_permissions(tmp)
        except KeyboardInterrupt as e:
            if resumable and (tmp / RESUMABLE_MARKER).is_file():
                keep = True
                raise ResumableInterrupt(
                    f"the finished shards are kept in {tmp}; {resume_hint}", terminated=isinstance(e, Terminated)
                ) from None
            raise
        except Exception as e:
            reason = full_disk_reason(e)
            keep = resumable and (tmp / RESUMABLE_MARKER).is_file()
            hint = f"; {resume_hint}" if keep and resume_hint else ""
            if reason:
                raise OutputWriteError(
                    f"output {output}: {reason} while writing; free space or pick another "
                    f"folder{hint or ' (nothing was written)'}"
                ) from None
            if keep and isinstance(e, QuantkitError) and not isinstance(e, UnresumableError):
                raise type(e)(f"{e}{hint}") from None
            raise
        if output.exists():
            old = output.with_name(f".{output.name}.quantkit-old-{os.getpid()}")
            output.rename(old)
            tmp.rename(output)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(output)
    finally:
        if tmp.exists() and not keep:
            shutil.rmtree(tmp, ignore_errors=True)
