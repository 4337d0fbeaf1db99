"""Hugging Face checkpoint folders: resolving a source, reading its config and tensor index, and atomic output.

Reads are header-only (quantkit.headers) unless a caller asks for tensors; writes go to a hidden temporary
folder beside the output and are renamed into place only when complete, so an interrupted or failed run never
leaves a folder that looks finished.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantkit.errors import CheckpointError, QuantkitError
from quantkit.headers import TensorInfo, checkpoint_tensors, read_config

# Files that belong to the weights and are rewritten by a quantizer; everything else in a checkpoint folder
# (tokenizer, chat template, generation config, README, ...) is carried over unchanged.
WEIGHT_FILES = re.compile(r".*\.safetensors$|^model\.safetensors\.index\.json$|^config\.json$|^quantkit\.json$")
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


WEIGHTS_AND_TOKENIZER = ["*.safetensors", "*.json", "*.jinja", "*.txt", "*.model", "tokenizer*"]


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


def resolve_source(source: str | Path) -> SourceCheckpoint:
    """A local folder, or a Hub repo id downloaded with huggingface_hub (safetensors, configs, tokenizer)."""
    path, hub_id = _locate(source, WEIGHTS_AND_TOKENIZER)
    config = read_config(path)
    tensors = checkpoint_tensors(path)
    if not tensors:
        raise CheckpointError(f"model {source}: no safetensors weights in {path}; quantkit reads .safetensors only")
    files = sorted({t.file for t in tensors.values()})
    return SourceCheckpoint(path=path, config=config, tensors=tensors, hub_id=hub_id, files=files)


def _download(repo_id: str, patterns: list[str]) -> Path:
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError
    except ImportError as e:  # pragma: no cover - huggingface_hub is a dependency
        raise CheckpointError(f"model {repo_id}: huggingface_hub is needed to download it ({e})") from None
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns))
    except RepositoryNotFoundError:
        raise CheckpointError(f"model {repo_id}: no such Hub repo (or no access); check the id or set HF_TOKEN") from None
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


def copy_aux_files(src: Path, dst: Path) -> list[str]:
    """Copy everything that is not weights or config (tokenizer, chat template, generation config, ...)."""
    copied = []
    for p in sorted(src.iterdir()):
        if p.is_file() and not WEIGHT_FILES.match(p.name) and not p.name.startswith("."):
            shutil.copy2(p, dst / p.name)
            copied.append(p.name)
    return copied


def check_output_free(output: Path, overwrite: bool) -> None:
    """Fail early, before any work, when the output exists and may not be replaced."""
    if output.exists() and not overwrite:
        raise OutputExistsError(f"output {output} already exists; pass --overwrite to replace it or pick another folder")
    if output.exists() and not output.is_dir():
        raise OutputExistsError(f"output {output} exists and is not a folder; remove it or pick another path")


@contextlib.contextmanager
def atomic_output(output: Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary folder beside `output`; rename it to `output` only if the block succeeds."""
    output = output.expanduser().resolve()
    check_output_free(output, overwrite)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.quantkit-", dir=output.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o755)
        if output.exists():
            old = output.with_name(f".{output.name}.quantkit-old-{os.getpid()}")
            output.rename(old)
            tmp.rename(output)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(output)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
