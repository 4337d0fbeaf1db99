"""Output shards written as streams: the header first (known from the plan: quantkit.apply.shards.units), then each
tensor's bytes at its planned offset as soon as its batch is done, whatever the order batches finish in; the
SHA-256 of the file follows the written prefix (bytes written in order are hashed from memory, the rest read back
from the page cache when the prefix reaches them), so no shard is ever held whole and no second pass is made."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

from quantkit.apply.shards.errors import ShardVerificationError
from quantkit.apply.shards.units import OutputLayout, ShardLayout
from quantkit.io.safetensors import st_dtype, tensor_bytes

if TYPE_CHECKING:
    import torch

_CHUNK = 16 * 1024 * 1024


class OutputShard:
    """One output shard being written to `path` (a partial file, renamed into place by the caller): a source shard's
    own output (ShardLayout, the default) or one shard of a re-sharded output (OutputLayout, `--max-shard-size`)."""

    def __init__(self, layout: ShardLayout | OutputLayout, path: Path) -> None:
        self.layout = layout
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self.expected = {o.name: o for o in layout.outputs}
        self.left = set(self.expected)
        self.hasher = hashlib.sha256()
        self.frontier = 0
        self.later: dict[int, int] = {}  # offset -> bytes written there beyond the hashed prefix
        self._write(0, memoryview(layout.head))

    def _write(self, offset: int, mv: memoryview) -> None:
        n = len(mv)
        done = 0
        while done < n:
            done += os.pwrite(self.fd, mv[done : done + _CHUNK], offset + done)
        if offset == self.frontier:
            self.hasher.update(mv)
            self.frontier += n
            while self.frontier in self.later:  # the prefix reached bytes written earlier: read them back
                size = self.later.pop(self.frontier)
                pos = self.frontier
                while pos < self.frontier + size:
                    chunk = os.pread(self.fd, min(_CHUNK, self.frontier + size - pos), pos)
                    self.hasher.update(chunk)
                    pos += len(chunk)
                self.frontier += size
        elif n:
            self.later[offset] = n

    def write(self, name: str, t: torch.Tensor) -> None:
        """Tensor `name` of this shard, checked against the planned header (a mismatch is a bug)."""
        o = self.expected.get(name)
        if o is None or name not in self.left:
            raise ShardVerificationError(
                f"{self.layout.name}: tensor {name} is not in the planned output, or was written twice (internal error)"
            )
        if (st_dtype(t, ShardVerificationError), tuple(t.shape)) != (o.dtype, o.shape):
            raise ShardVerificationError(
                f"{self.layout.name}: tensor {name} is {st_dtype(t)} {tuple(t.shape)}, the "
                f"plan says {o.dtype} {o.shape} (internal error)"
            )
        self.left.discard(name)
        self._write(self.layout.offsets[name], tensor_bytes(t.contiguous()))

    @property
    def complete(self) -> bool:
        return not self.left

    def close(self) -> tuple[int, str]:
        """(bytes, sha256) of the finished file."""
        os.close(self.fd)
        self.fd = -1
        if self.frontier != self.layout.out_size or self.later:
            raise ShardVerificationError(
                f"{self.layout.name}: wrote {self.frontier} of {self.layout.out_size} bytes in order (internal error)"
            )
        return self.frontier, self.hasher.hexdigest()

    def abandon(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.path.unlink(missing_ok=True)
