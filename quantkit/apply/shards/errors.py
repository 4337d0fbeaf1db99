"""The errors of the per-shard executor: one line naming the input and the fix (exit 2), except
ShardVerificationError, which is a bug."""

from __future__ import annotations

from quantkit.errors import QuantkitError, UnresumableError


class ExecutorError(QuantkitError):
    """The per-shard executor cannot quantize this checkpoint as asked."""


class CorruptShardError(ExecutorError):
    """A source shard is truncated or is not a valid safetensors file."""


class ShardVerificationError(ExecutorError):
    """A written shard does not match its source or the scheme's layout (a bug, never a user error)."""


class JournalError(ExecutorError, UnresumableError):
    """The journal of an interrupted run is unreadable, malformed, or belongs to another run."""
