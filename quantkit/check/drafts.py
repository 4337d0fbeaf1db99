"""EAGLE-3 draft checks: vocabulary maps, aux hidden-state layer ids, and the fit with the target (models/llama_eagle3.py, models/llama.py, v1/worker/gpu_model_runner.py)."""

from quantkit.rules.draft import (  # house-move stub (issue 19): deleted at S3  # noqa: F401
    aux_layers,
    target_fit,
    target_unknown,
    vocab_maps,
)
