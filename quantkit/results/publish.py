"""Results of `publish`: the files uploaded and the Hub commit (filled by WP-B, issue 19)."""

__all__: list[str] = []
