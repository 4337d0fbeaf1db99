"""Moved: vLLM's runtime layer names are quantkit.naming.{layers,builder,exclude,archs} (issue 19)."""

from quantkit.naming.archs import (  # noqa: F401  # house-move stub (issue 19): deleted at S3
    SUPPORTED_ARCHITECTURES,
    architecture_of,
    runtime_layers,
)
from quantkit.naming.archs import is_draft as is_draft_config  # noqa: F401  # house-move stub (issue 19): deleted at S3
from quantkit.naming.builder import vllm_shard_names  # noqa: F401  # house-move stub (issue 19): deleted at S3
from quantkit.naming.exclude import (  # noqa: F401  # house-move stub (issue 19): deleted at S3
    ExcludeListError,
    ExcludeMatch,
    PartialFusedExclusion,
    PartialFusedExclusionError,
    checkpoint_exclude_for,
    exclude_entries_for,
    excluded_names,
    is_excluded,
    match_reason,
    quantized_layers,
    renamed,
)
from quantkit.naming.layers import (  # noqa: F401  # house-move stub (issue 19): deleted at S3
    KINDS,
    ROLES,
    UNKNOWN_TARGET_LAYERS,
    VISION_ROLE,
    CheckpointLayoutError,
    MissingTargetLayersError,
    RuntimeLayer,
    UnsupportedArchitectureError,
    in_role,
    layers_in_role,
)
