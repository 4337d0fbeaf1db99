"""Serving a checkpoint with a real `vllm serve` process and measuring it (moved to quantkit.engines.vllm_server and
quantkit.engines.serve_client)."""

from quantkit.engines.serve_client import (  # house-move stub (issue 19): deleted at S3
    RequestStats,
    ServedResult,
    measure,
    serve_and_measure,
)
from quantkit.engines.vllm_server import (  # house-move stub (issue 19): deleted at S3
    DEFAULT_CPU_MAX_MODEL_LEN,
    HOST,
    LOG_TAIL_LINES,
    SERVED_MODEL_NAME,
    SPEC_ACCEPTED,
    SPEC_ACCEPTED_PER_POS,
    SPEC_DRAFT_TOKENS,
    SPEC_DRAFTS,
    STOP_GRACE_S,
    ServeError,
    ServerDiedError,
    ServeRequestError,
    ServerStartError,
    VllmServer,
    free_port,
    group_members,
    parse_prometheus,
)
from quantkit.results.serve import SpecDecodeCounters as SpecCounters  # house-move stub (issue 19): deleted at S3

__all__ = ["DEFAULT_CPU_MAX_MODEL_LEN", "HOST", "LOG_TAIL_LINES", "SERVED_MODEL_NAME", "SPEC_ACCEPTED",
           "SPEC_ACCEPTED_PER_POS", "SPEC_DRAFTS", "SPEC_DRAFT_TOKENS", "STOP_GRACE_S", "RequestStats", "ServeError",
           "ServeRequestError", "ServedResult", "ServerDiedError", "ServerStartError", "SpecCounters", "VllmServer",
           "free_port", "group_members", "measure", "parse_prometheus", "serve_and_measure"]
