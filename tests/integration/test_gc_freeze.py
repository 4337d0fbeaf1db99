# tier: integration
"""paused_gc (quantkit.io.headers) gives the same result after vLLM froze the process's heap as before.

vLLM's serve benchmark calls vllm/utils/gc_utils.py freeze_gc_heap (gc.freeze(), never undone). Run after it,
paused_gc used to skip moving what it made to the oldest generation, and tests/test_headers.py failed in the
`not slow` selection though it passed alone (issue 36, item 4).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from quantkit.io.headers import paused_gc


def _generations_of(obj: object) -> set[int]:
    return {g for g in range(3) if any(o is obj for o in gc.get_objects(generation=g))}


@pytest.fixture
def frozen_by_vllm() -> Iterator[list[object]]:
    """The process as vLLM's serve benchmark leaves it (undone afterwards); yields an object vLLM's call froze."""
    from vllm.utils.gc_utils import freeze_gc_heap

    sentinel: list[object] = [object()]
    assert _generations_of(sentinel)  # tracked, in a generation
    freeze_gc_heap()
    try:
        assert gc.get_freeze_count() > 0 and not _generations_of(sentinel)  # vLLM's own call froze it
        yield sentinel
    finally:
        gc.unfreeze()


def test_paused_gc_after_vllm_froze_the_heap_leaves_what_it_made_in_the_oldest_generation(
    frozen_by_vllm: list[object],
) -> None:
    assert gc.isenabled()
    with paused_gc():
        assert not gc.isenabled()
        made = [{"shape": [i, 2]} for i in range(2000)]
    assert gc.isenabled()
    oldest = {id(o) for o in gc.get_objects(generation=2)}
    assert all(id(o) in oldest for o in made[::97])
    assert not _generations_of(frozen_by_vllm)  # what vLLM froze stays frozen


def test_paused_gc_leaves_the_same_generations_frozen_or_not() -> None:
    # the same build, once on a plain heap and once on a frozen one: the objects made end in the same generation
    def generations_of_made() -> set[int]:
        with paused_gc():
            made = [{"n": [i]} for i in range(500)]  # (a dict of ints alone is not tracked by the collector)
        return _generations_of(made[0]) | _generations_of(made[-1])

    plain = generations_of_made()
    gc.freeze()
    try:
        frozen = generations_of_made()
    finally:
        gc.unfreeze()
    assert plain == frozen == {2}
