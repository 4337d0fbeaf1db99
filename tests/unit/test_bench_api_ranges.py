# tier: unit
"""Issue 35 item 6 for the Python API: `quantkit.api.bench` takes the same ranges as the CLI's options (one home:
quantkit.bench's MAX_* constants), refused as a SpecError before anything is imported or served."""

from __future__ import annotations

import math
import sys

import pytest

from quantkit.bench import MAX_CONCURRENCY, MAX_K, MAX_LIST
from quantkit.specs import BenchSpec, SpecError


@pytest.mark.parametrize(
    "field,value",
    [
        ("concurrency", [0]),
        ("concurrency", [MAX_CONCURRENCY + 1]),
        ("concurrency", [1_000_000_000]),
        ("concurrency", []),
        ("concurrency", list(range(1, MAX_LIST + 2))),
        ("ks", [-1]),
        ("ks", [MAX_K + 1]),
        ("request_timeout_s", 0),
        ("request_timeout_s", math.nan),
        ("request_timeout_s", math.inf),
        ("request_timeout_s", 1e12),
        ("repeats", 0),
        ("output_len", 10**9),
    ],
)
def test_out_of_range_settings_are_a_spec_error(field, value):
    with pytest.raises(SpecError) as e:
        BenchSpec.build(None, out_dir="o", **{field: value})
    assert "\n" not in str(e.value) and field in str(e.value)


def test_the_edges_are_accepted():
    s = BenchSpec.build(None, out_dir="o", concurrency=[1, MAX_CONCURRENCY], ks=[0, MAX_K], request_timeout_s=1)
    assert s.concurrency == [1, MAX_CONCURRENCY] and s.ks == [0, MAX_K] and s.request_timeout_s == 1


def test_api_bench_refuses_before_importing_vllm(tiny):
    from quantkit import api

    before = "vllm" in sys.modules
    with pytest.raises(SpecError):
        api.bench(tiny / "target", concurrency=[10**9], out_dir="never-written")
    assert ("vllm" in sys.modules) == before
