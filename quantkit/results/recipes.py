"""Results of `recipes list` and `recipes show` (filled by WP-B, issue 19)."""

__all__: list[str] = []
