"""The native per-shard executor: quantize a safetensors checkpoint shard by shard, without Quark, into exactly the
files AMD Quark 0.13's file-to-file path writes (pipeline.py). Split by job: the Quark f2f replay (f2f.py), the
journal of an interrupted run (journal.py), host memory and buffers (memory.py), one shard's read and quantization
(process.py), and the errors (errors.py); the safetensors format itself is quantkit.io.safetensors."""

from quantkit.apply.shards.errors import (
    CorruptShardError,
    ExecutorError,
    JournalError,
    ShardVerificationError,
)
from quantkit.apply.shards.journal import JOURNAL_NAME
from quantkit.apply.shards.pipeline import Finish, ShardEvent, quantize_checkpoint
from quantkit.errors import NonFiniteWeightError
from quantkit.results.apply import ExecutorReport, ShardSummary

__all__ = [
    "JOURNAL_NAME",
    "CorruptShardError",
    "ExecutorError",
    "ExecutorReport",
    "Finish",
    "JournalError",
    "NonFiniteWeightError",
    "ShardEvent",
    "ShardSummary",
    "ShardVerificationError",
    "quantize_checkpoint",
]
