"""Results of `deploy`: the `vllm serve` manifest and its environment (filled by WP-C, issue 19)."""

__all__: list[str] = []
