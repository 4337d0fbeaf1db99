"""Results of precision resolution: what vLLM will run each layer as (filled by WP-A, issue 19)."""

__all__: list[str] = []
