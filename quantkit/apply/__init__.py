"""`quantkit apply`: plan per vLLM runtime layer, quantize (Quark, or the native shard executor), verify, write."""

from quantkit.apply.run import ApplyResult, apply

__all__ = ["ApplyResult", "apply"]
