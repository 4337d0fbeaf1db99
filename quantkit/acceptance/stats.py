"""Per-prompt speculative-decoding counters, the common output of both acceptance backends (no torch here, so the CLI's validation stays light)."""

from quantkit.engines.stats import SequenceStats  # house-move stub (issue 19): deleted at S3

__all__ = ["SequenceStats"]
