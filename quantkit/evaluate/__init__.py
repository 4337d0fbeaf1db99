"""`quantkit eval`: lm-eval on the quantized model and its baseline, same tasks and settings, with deltas."""

from quantkit.evaluate.run import run_eval

__all__ = ["run_eval"]
