"""The gate's serve step, moved to quantkit.gate.steps.serve."""

from quantkit.gate.steps.serve import (  # house-move stub (issue 19): deleted at S3  # noqa: F401
    MAX_PROBLEMS,
    in_process_run,
    mean_al,
    measure_served,
    prompt_set,
    prompt_texts,
    reusable_acceptance,
    served_batch,
)
