"""A PyTorch EAGLE-3 draft with vLLM's forward, loaded from a draft folder (BF16, or Quark FP8 as vLLM runs it)."""

from quantkit.engines.eagle3 import FP8_MAX, DraftStep, Eagle3Draft, Linear  # house-move stub (issue 19): deleted at S3

__all__ = ["FP8_MAX", "DraftStep", "Eagle3Draft", "Linear"]
