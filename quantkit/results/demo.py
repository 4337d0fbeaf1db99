"""Results of `demo`: each step of the pipeline on the bundled tiny models (filled by WP-B, issue 19)."""

__all__: list[str] = []
