"""max_model_len against the length vLLM derives for the target (vllm/config/model.py _get_and_verify_max_len)."""

from __future__ import annotations

from quantkit.io.config import max_model_len as derived_max_model_len
from quantkit.results.check import Finding
from quantkit.rules.deploy_context import DeployContext, finding


def check_max_model_len(ctx: DeployContext) -> list[Finding]:
    limit = derived_max_model_len(ctx.target_config)
    if ctx.max_model_len is None or limit is None or ctx.max_model_len <= limit.tokens:
        return []
    return [
        finding(
            "max-model-len-beyond-positions",
            "error",
            "max-model-len-beyond-positions",
            "--max-model-len",
            f"--max-model-len {ctx.max_model_len}: the target holds {limit}; vLLM refuses a longer "
            "max_model_len unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, and then RoPE positions past it give NaN",
            f"use --max-model-len {limit.tokens} or less",
        )
    ]
