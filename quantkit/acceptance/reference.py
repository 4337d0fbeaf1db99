"""Reference speculative-decoding engine in PyTorch: a transformers target verifies an EAGLE-3 draft's chains."""

from quantkit.engines.reference import ReferenceEngine, speculative_accept  # house-move stub (issue 19): deleted at S3

__all__ = ["ReferenceEngine", "speculative_accept"]
