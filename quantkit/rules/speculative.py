"""The speculative config: num_speculative_tokens in the range vLLM takes and where it pays off
(vllm/config/speculative.py SpeculativeConfig._verify_args)."""

from __future__ import annotations

from quantkit.results.check import Finding
from quantkit.rules.deploy_context import DeployContext, finding

# Above this many speculative tokens the manifest warns (see `_check_num_speculative_tokens`).
MAX_USEFUL_SPECULATIVE_TOKENS = 8


def check_num_speculative_tokens(ctx: DeployContext) -> list[Finding]:
    k = ctx.num_speculative_tokens
    if k < 1:
        return [
            finding(
                "num-speculative-tokens-range",
                "error",
                "num-speculative-tokens-range",
                "num_speculative_tokens",
                f"num_speculative_tokens {k}: vLLM requires at least 1",
                "use 3 (AMD's recommendation for EAGLE-3 drafts), or serve without a draft",
            )
        ]
    if ctx.max_model_len is not None and k + 1 >= ctx.max_model_len:
        return [
            finding(
                "num-speculative-tokens-range",
                "error",
                "num-speculative-tokens-range",
                "num_speculative_tokens",
                f"num_speculative_tokens {k} does not fit --max-model-len {ctx.max_model_len}",
                "use a few speculative tokens (3)",
            )
        ]
    if k > MAX_USEFUL_SPECULATIVE_TOKENS:
        return [
            finding(
                "num-speculative-tokens-range",
                "warning",
                "num-speculative-tokens-range",
                "num_speculative_tokens",
                f"num_speculative_tokens {k}: an EAGLE-3 draft's acceptance falls with every position, so "
                f"beyond {MAX_USEFUL_SPECULATIVE_TOKENS} the extra draft steps cost more than the tokens "
                "they add",
                "measure acceptance per position (quantkit acceptance) and use the K where "
                "acceptance rate x K peaks; 3 is AMD's recommendation",
            )
        ]
    return []
