"""What quantkit opens, copies and uploads from a user's folders: regular files only, links that stay inside their
folder, and the one allow-list of the files a checkpoint carries besides its weights.

A model folder is untrusted input. A link `notes.txt -> ~/.cache/huggingface/token` would carry the publisher's Hub
token into an output and onto the Hub; a link `self -> .` makes a recursive copy run until paths get too long; a
named pipe or a device (`/dev/zero`) makes a read block forever or never end. So:

- every file quantkit opens is checked to be a regular file before it is opened (`require_regular_file`);
- the top level of a checkpoint folder (`scan_folder`) may hold regular files, real sub-folders and links to regular
  files; a link loop, a dangling link, a link to a folder, and anything else (pipe, socket, device) are refused;
- where files are copied or uploaded (`inside=True`), a link must also resolve inside the folder or, for a Hugging
  Face cache snapshot (`.../models--ORG--NAME/snapshots/REV/`), inside that repo's own `blobs/` (`link_roots`);
- `apply` copies, and `publish` uploads, only the files that `AUX_FILES` (plus the weights and config) name; a
  sub-folder (e.g. Meta's `original/`, weights in another format) is never copied.

Hidden entries (`.git`, `.cache`, `.gitattributes`) are tools' metadata: never opened, copied or uploaded, so they
are not checked either.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import os
import shutil
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from quantkit.errors import CheckpointError, QuantkitError

# The files a quantizer reads and rewrites (never copied as they are).
WEIGHT_PATTERNS: tuple[str, ...] = ("*.safetensors", "model.safetensors.index.json", "config.json")
MANIFEST_FILE = "quantkit.json"

# Everything else a checkpoint carries that `apply` copies from the source and `publish` uploads: (pattern, what it
# is). Matched with fnmatch, case-sensitively, on top-level file names. The README's "Safety" section lists it.
AUX_FILES: tuple[tuple[str, str], ...] = (
    ("tokenizer.json", "tokenizer"),
    ("tokenizer_config.json", "tokenizer"),
    ("tokenizer.model", "tokenizer (SentencePiece)"),
    ("special_tokens_map.json", "tokenizer"),
    ("added_tokens.json", "tokenizer"),
    ("vocab.json", "tokenizer vocabulary"),
    ("vocab.txt", "tokenizer vocabulary"),
    ("merges.txt", "tokenizer BPE merges"),
    ("spiece.model", "tokenizer (SentencePiece)"),
    ("sentencepiece.bpe.model", "tokenizer (SentencePiece)"),
    ("tiktoken.model", "tokenizer (tiktoken, e.g. Kimi)"),
    ("*.tiktoken", "tokenizer (tiktoken)"),
    ("tekken.json", "tokenizer (Mistral)"),
    ("chat_template.jinja", "chat template"),
    ("chat_template.json", "chat template"),
    ("generation_config.json", "generation config"),
    ("preprocessor_config.json", "processor config"),
    ("processor_config.json", "processor config"),
    ("video_preprocessor_config.json", "processor config"),
    ("*.py", "model or tokenizer code of an auto_map; copied, run only with --trust-remote-code"),
    ("LICENSE", "licence"),
    ("LICENSE.*", "licence"),
    ("NOTICE", "licence notice"),
    ("NOTICE.*", "licence notice"),
    ("USE_POLICY.md", "use policy (Llama)"),
)
# What a Hub download of a source fetches: the weights, config.json and the files above.
DOWNLOAD_PATTERNS: list[str] = [*WEIGHT_PATTERNS, *(pattern for pattern, _ in AUX_FILES)]


class UnsafeFileError(CheckpointError):
    """A file quantkit would open, copy or upload is not a regular file, or a link loops, dangles, points to a
    folder, or leaves the folder it is in."""


def is_aux_file(name: str) -> bool:
    """Whether a top-level file name is one of AUX_FILES (copied by apply, uploaded by publish)."""
    return any(fnmatch.fnmatchcase(name, pattern) for pattern, _ in AUX_FILES)


def is_weight_file(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in WEIGHT_PATTERNS)


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "folder"
    if stat.S_ISFIFO(mode):
        return "named pipe (FIFO)"
    if stat.S_ISCHR(mode):
        return "character device"
    if stat.S_ISBLK(mode):
        return "block device"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "special file"


def require_regular_file(
    path: str | Path, what: str = "", fix: str = "pass a regular file", error: type[QuantkitError] = CheckpointError
) -> None:
    """Refuse, before anything opens it, a `path` that is a folder, a named pipe, a device, a socket or a link loop.

    A missing path (or a dangling link) passes: each caller says "not found" in its own words. `what` names the
    input in the message (`recipe`, `prompt file`); `fix` is what to do instead.
    """
    shown = f"{what} {path}" if what else str(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise error(f"{shown}: is a symbolic link loop; {fix}") from None
        if e.errno == errno.ENOTDIR:
            return
        raise error(f"{shown}: cannot be read ({e.strerror or e}); {fix}") from None
    if stat.S_ISREG(mode):
        return
    kind = _kind(mode)
    if kind == "folder":
        raise error(f"{shown}: is a folder, not a file; {fix}")
    raise error(
        f"{shown}: is a {kind}, not a regular file (quantkit opens only regular files: a pipe or a device "
        f"can block forever or never end); {fix}"
    )


def link_roots(folder: str | Path) -> list[Path]:
    """Where a link in `folder` may lead when its files are copied or uploaded: the folder itself and, when it is
    a Hugging Face cache snapshot (`<cache>/models--ORG--NAME/snapshots/<rev>`), that repo's `blobs/` folder,
    which the snapshot's files link to (`../../blobs/<hash>`). Links are resolved."""
    real = Path(os.path.realpath(folder))
    roots = [real]
    repo = real.parent.parent
    if (
        real.parent.name == "snapshots"
        and repo.name.startswith(("models--", "datasets--", "spaces--"))
        and (repo / "blobs").is_dir()
    ):
        roots.append(Path(os.path.realpath(repo / "blobs")))
    return roots


def check_entry(path: Path, roots: list[Path] | None, error: type[QuantkitError] = UnsafeFileError) -> str:
    """ "file" or "folder" for one folder entry that quantkit may read; anything else is refused in one line.

    A link must lead to a regular file (never a folder), and with `roots` somewhere inside one of them."""
    try:
        lmode = os.lstat(path).st_mode
    except OSError as e:
        raise error(f"{path}: cannot be read ({e.strerror or e}); check the folder") from None
    if stat.S_ISLNK(lmode):
        target = os.readlink(path)
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            raise error(
                f"{path}: a symbolic link to {target}, which does not exist; re-download the checkpoint or "
                "remove the link"
            ) from None
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise error(
                    f"{path}: a symbolic link loop ({target}); replace the link by the file it should "
                    "point to, or remove it"
                ) from None
            raise error(
                f"{path}: a symbolic link to {target}, which cannot be read ({e.strerror or e}); remove the link"
            ) from None
        if stat.S_ISDIR(mode):
            raise error(
                f"{path}: a symbolic link to the folder {target}; quantkit follows no link to a folder (a "
                "link such as `self -> .` would copy the folder into itself): remove the link, or put the "
                "folder itself there"
            )
        if not stat.S_ISREG(mode):
            raise error(
                f"{path}: a symbolic link to a {_kind(mode)} ({target}), not a regular file; quantkit opens "
                "only regular files: remove the link"
            )
        if roots is not None:
            real = Path(os.path.realpath(path))
            if not any(real.is_relative_to(root) for root in roots):
                raise error(
                    f"{path}: a symbolic link to {real}, outside the model folder; quantkit never follows "
                    "a link out of a folder it copies or uploads (it could carry a secret such as a Hub "
                    "token): put the file itself in the folder, or remove the link"
                )
        return "file"
    if stat.S_ISREG(lmode):
        return "file"
    if stat.S_ISDIR(lmode):
        return "folder"
    raise error(
        f"{path}: a {_kind(lmode)}, not a regular file; quantkit opens only regular files (a pipe or a "
        "device can block forever or never end): replace it by the file itself, or remove it"
    )


@dataclass
class FolderEntries:
    """The top level of a checked folder: its files (regular, or links to regular files) and real sub-folders."""

    folder: Path
    files: list[str] = field(default_factory=list)
    folders: list[str] = field(default_factory=list)


def scan_folder(
    folder: str | Path, *, inside: bool, hidden: bool = False, error: type[QuantkitError] = UnsafeFileError
) -> FolderEntries:
    """Check every top-level entry of `folder` (hidden ones only with `hidden`) with `check_entry`; with `inside`,
    links must stay inside `link_roots(folder)`. Sub-folders are listed, not entered."""
    folder = Path(folder)
    roots = link_roots(folder) if inside else None
    out = FolderEntries(folder)
    try:
        names = sorted(os.listdir(folder))
    except OSError as e:
        raise error(f"{folder}: cannot list the folder ({e.strerror or e}); check the path") from None
    for name in names:
        if name.startswith(".") and not hidden:
            continue
        kind = check_entry(folder / name, roots, error)
        (out.files if kind == "file" else out.folders).append(name)
    return out


def not_copied(entries: FolderEntries) -> list[str]:
    """What `copy_aux_files` leaves out of an output: top-level files that are neither weights, config, the manifest
    nor AUX_FILES, and every sub-folder (as `name/`)."""
    files = [n for n in entries.files if not is_aux_file(n) and not is_weight_file(n) and n != MANIFEST_FILE]
    return sorted(files + [f"{n}/" for n in entries.folders])


def describe_not_copied(names: list[str], limit: int = 8) -> str:
    """`a, b/ and 3 more` for one warning line."""
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def copy_aux_files(src: Path, dst: Path) -> tuple[list[str], list[str]]:
    """Copy the source's AUX_FILES (tokenizer, chat template, generation config, ...) into `dst`: (copied, not
    copied). Only regular files; a link only when it stays inside the source (or its HF cache repo)."""
    entries = scan_folder(src, inside=True)
    copied = []
    for name in entries.files:
        if is_aux_file(name):
            # The resolved path: the link was checked to stay inside, so copy what it points to, not a new lookup.
            shutil.copy2(os.path.realpath(src / name), dst / name)
            copied.append(name)
    return copied, not_copied(entries)


def check_tree(src: Path, roots: list[Path], error: type[QuantkitError] = UnsafeFileError) -> list[Path]:
    """Every file under the folder `src` after `check_entry` passed on each entry of the tree (links stay inside
    `roots` and lead to regular files; no pipes, devices or links to folders). Links to folders are not entered."""
    files: list[Path] = []
    for root, dirs, names in os.walk(src):
        here = Path(root)
        for name in sorted(dirs + names):
            if check_entry(here / name, roots, error) == "file":
                files.append(here / name)
    return files


def copy_tree_checked(
    src: Path, dst: Path, roots: list[Path], error: type[QuantkitError] = UnsafeFileError, skip: str | None = None
) -> None:
    """shutil.copytree for a source's sub-folder, with the whole tree checked (`check_tree`) before anything is
    copied, and the files that links point to copied as regular files; files whose name matches the fnmatch
    pattern `skip` are left out."""
    files = check_tree(src, roots, error)
    if skip:
        files = [f for f in files if not fnmatch.fnmatch(f.name, skip)]
    dst.mkdir(parents=True, exist_ok=True)
    for root, dirs, _ in os.walk(src):
        for name in dirs:
            (dst / (Path(root) / name).relative_to(src)).mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copy2(os.path.realpath(f), dst / f.relative_to(src))


def write_file_atomic(path: str | Path, data: str | bytes, error: type[QuantkitError] | None = QuantkitError) -> Path:
    """THE way quantkit writes a result file (report, manifest, card, chart, JSON): the bytes go to a temporary file
    in the same folder, which then replaces `path` in one rename (os.replace).

    So a reader never sees half a file, an interrupt leaves the previous file (or none), and a symbolic link planted
    at `path` is itself replaced: the file it pointed to, outside the output, is never written. A folder at `path`
    is refused in one line. The file gets the usual permissions (0666 less the umask), not mkstemp's 0600. An OSError
    (a full disk) becomes one `error` line, or, with error=None, goes up as it is (apply's output turns it into its
    own message)."""
    import tempfile

    raw = error is None
    path = Path(path)
    blob = data.encode("utf-8") if isinstance(data, str) else data
    if error is None:
        error = QuantkitError
    elif path.is_dir() and not path.is_symlink():
        raise error(f"{path}: is a folder; remove it or pick another output")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:100]}.", suffix=".quantkit-tmp", dir=path.parent)
    except OSError as e:
        if raw:
            raise
        raise error(f"{path}: cannot be written ({e.strerror or e}); pick a folder you can write to") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError) and not raw:
            raise error(
                f"{path}: cannot be written ({e.strerror or e}); free space or pick a folder you can write to"
            ) from None
        raise
    return path


def _umask() -> int:
    """The process's umask (read by setting it and putting it back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


class OutputInModelError(QuantkitError):
    """An output path is, contains, or lies inside a model folder the command reads."""


# Weight files that are Python pickles: torch.save's formats. A folder whose weights are only these is refused by
# every command (refuse_pickle_only): quantkit reads safetensors only and never unpickles a file.
PICKLE_WEIGHT_PATTERNS: tuple[str, ...] = ("*.bin", "*.pt", "*.pth")


def refuse_output_in_models(
    output: str | Path | None,
    models: Iterable[str | Path | None],
    option: str = "--out",
    error: type[QuantkitError] = OutputInModelError,
    *,
    contains: bool = False,
) -> None:
    """THE check every command that writes makes before any work: its output (a folder or a file) must not be, or
    lie inside, any model folder it reads (after resolving links, so a link to a source counts as the source). With
    `contains`, for a command that replaces its whole output folder, an output that contains a model folder is
    refused too; files written into a folder that merely holds a model (`deploy ./model --out .`) touch no model
    file. A Hub id (no such local path) is skipped: its files live in the HF cache, which quantkit never writes
    into. One line, naming the option, the output and the model."""
    if output is None:
        return
    out = Path(os.path.realpath(Path(output).expanduser()))
    for model in models:
        if model is None or str(model) == "":
            continue
        path = Path(model).expanduser()
        if not path.is_dir():
            continue
        src = Path(os.path.realpath(path))
        relation = (
            "is"
            if out == src
            else "lies inside"
            if out.is_relative_to(src)
            else "contains"
            if contains and src.is_relative_to(out)
            else None
        )
        if relation:
            raise error(
                f"{option} {shown_path(output)}: {relation} the model folder {shown_path(model)}, which this "
                "command reads; quantkit never writes into a model folder: pick an output outside it"
            )


def pickle_only_weights(folder: str | Path) -> list[str]:
    """The pickle weight files (*.bin, *.pt, *.pth) of a folder that holds no *.safetensors, sorted; empty when it
    has safetensors weights or no pickles (or is not a folder)."""
    folder = Path(folder)
    try:
        names = [e.name for e in os.scandir(folder) if not e.name.startswith(".")]
    except OSError:
        return []
    if any(n.endswith(".safetensors") for n in names):
        return []
    return sorted(n for n in names if any(fnmatch.fnmatchcase(n, p) for p in PICKLE_WEIGHT_PATTERNS))


def refuse_pickle_only(folder: str | Path, what: str = "", error: type[QuantkitError] = CheckpointError) -> None:
    """THE refusal of a model folder whose weights are only pickles (no safetensors), made by every command that
    takes a model folder before it reads a tensor or starts a server: quantkit never unpickles a file, and a pickle
    handed to vLLM or transformers would be (their weights-only loader is the last line, not the first). A Hub id or
    a missing path is left to the command's own resolution."""
    pickles = pickle_only_weights(folder)
    if not pickles:
        return
    from quantkit.io.headers import bin_conversion

    shown = ", ".join(shown_path(p, 80) for p in pickles[:4]) + (
        f" and {len(pickles) - 4} more" if len(pickles) > 4 else ""
    )
    raise error(
        f"{what + ' ' if what else ''}{shown_path(folder)}: weights only as {shown} (pickle); quantkit reads "
        f"safetensors only, never unpickling a file: convert them first with {bin_conversion(folder)}"
    )


def shown_path(path: str | Path, limit: int = 300) -> str:
    """A path as an error line echoes it: as it is when printable, else its repr (a newline or an ESC in a folder
    name never breaks the one line or reaches the terminal raw); longer than `limit` characters, cut with its
    length."""
    s = str(path)
    s = s if s.isprintable() else repr(s)
    return s if len(s) <= limit else f"{s[:limit]}... ({len(s):,} characters)"


def check_model_folders(
    models: Iterable[str | Path | None],
    output: str | Path | None = None,
    option: str = "--out",
    extra_outputs: Iterable[tuple[str, str | Path | None]] = (),
    *,
    contains: bool = False,
) -> None:
    """Both input checks of a command, before any work: no model folder is pickle-only, and no output (`option`
    OUTPUT, then each (option, path) of `extra_outputs`) is or lies inside one of them (or, with `contains`, for a
    command that replaces its whole output folder, contains one)."""
    given = [m for m in models if m is not None]
    for m in given:
        refuse_pickle_only(m)
    refuse_output_in_models(output, given, option, contains=contains)
    for opt, path in extra_outputs:
        refuse_output_in_models(path, given, opt, contains=contains)
