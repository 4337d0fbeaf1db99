"""Starting vLLM engines (target alone or target + EAGLE-3 draft) and reading their spec-decode counters."""

from quantkit.engines.platform import (  # house-move stub (issue 19): deleted at S3
    VllmUnavailableError,
    is_vllm_cpu,
    vllm_available,
)
from quantkit.engines.vllm_engine import (  # house-move stub (issue 19): deleted at S3
    make_llm,
    read_spec_counters,
)
from quantkit.engines.vllm_inspect import (  # house-move stub (issue 19): deleted at S3
    PROBE_ROWS,
    _byte_difference,
    compare_mx_bytes,
    loaded_draft_layers,
    loaded_mx_bytes,
    loaded_target_layers,
    probe_input,
)
from quantkit.results.serve import SpecDecodeCounters  # house-move stub (issue 19): deleted at S3

__all__ = ["PROBE_ROWS", "SpecDecodeCounters", "VllmUnavailableError", "_byte_difference", "compare_mx_bytes",
           "is_vllm_cpu", "loaded_draft_layers", "loaded_mx_bytes", "loaded_target_layers", "make_llm",
           "probe_input", "read_spec_counters", "vllm_available"]
