"""Moved: config.json accessors are quantkit.io.config, target_layer_count is quantkit.io.checkpoint (issue 19)."""

from quantkit.io.checkpoint import target_layer_count  # noqa: F401  # house-move stub (issue 19): deleted at S3
from quantkit.io.config import (  # noqa: F401  # house-move stub (issue 19): deleted at S3
    MAX_LEN_KEYS,
    TEXT_CONFIG_WRAPPERS,
    Count,
    EagleConfig,
    Length,
    MaxModelLen,
    ModelConfig,
    PositiveInt,
    fit_max_model_len,
    max_model_len,
    num_hidden_layers,
    text_config,
    validate_model_config,
)
