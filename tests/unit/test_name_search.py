"""names_ending / names_starting (quantkit.io.formats) search all names joined by newlines before looking at any one:
whatever the names hold (newlines, a suffix shared in part, the empty suffix), they answer as str.endswith /
str.startswith name by name."""

from __future__ import annotations

import random

from quantkit.io.formats import names_ending, names_starting

PARTS = ["a", ".", "\n", "weight", "_scale_inv", ".weight_packed", "mtp.", "x", ".weight_", "mtp"]


def test_name_search_answers_as_name_by_name() -> None:
    rng = random.Random(1)
    for _ in range(5000):
        names = ["".join(rng.choice(PARTS) for _ in range(rng.randrange(0, 5))) for _ in range(rng.randrange(0, 5))]
        for suffixes in (
            (".weight_scale_inv", ".weight_packed"),
            (".gate_up_proj", ".down_proj"),
            ("x",),
            (".weight_",),
            ("a", "a."),
            ("x", ""),
        ):
            assert names_ending(names, suffixes) == [n for n in names if n.endswith(suffixes)], (names, suffixes)
        for prefixes in (("mtp.",), ("mtp.", "a"), ("\nmtp",), ("x", "")):
            assert names_starting(names, prefixes) == [n for n in names if n.startswith(prefixes)], (names, prefixes)
