# tier: integration
"""`quantkit bench`'s K schedule and the deploy.json that carries it, against vLLM's own config classes
(validate_and_normalize_dynamic_sd_schedule, SpeculativeConfig)."""

from __future__ import annotations

import json

from tests.conftest import require_vllm
from tests.unit.test_bench_figures import _cell


def test_k_schedule_ranges_are_vllm_valid():
    from vllm.v1.spec_decode.dynamic.utils import validate_and_normalize_dynamic_sd_schedule

    from quantkit.bench.figures import k_schedule
    from quantkit.results.bench import BenchArm

    arms = [
        BenchArm(
            name=f"a@k{k}",
            kind="bf16-draft",
            target="T",
            draft="D",
            num_speculative_tokens=k,
            cells=[_cell(c, [t], 1.0) for c, t in zip([1, 4, 16], tp)],
        )
        for k, tp in [(0, [10, 30, 90]), (1, [14, 40, 95]), (3, [20, 45, 80])]
    ]
    s = k_schedule("T", "D", "a", arms, 64)
    assert [(c.concurrency, c.k) for c in s.choices] == [(1, 3), (4, 3), (16, 1)]
    assert s.num_speculative_tokens_per_batch_size == [(1, 4, 3), (5, 64, 1)]
    assert (
        validate_and_normalize_dynamic_sd_schedule([list(r) for r in s.num_speculative_tokens_per_batch_size])
        == s.num_speculative_tokens_per_batch_size
    )


def test_deploy_json_carries_the_schedule(tiny, tmp_path):
    require_vllm()
    from vllm.config.speculative import SpeculativeConfig

    from quantkit.deploy.run import run as deploy

    m = deploy(
        tiny / "eagle3-draft", target=tiny / "target", num_speculative_tokens=3, k_schedule=[(1, 4, 3), (5, 64, 1)]
    )
    spec = json.loads(m.argv[m.argv.index("--speculative-config") + 1])
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 4, 3], [5, 64, 1]]
    cfg = SpeculativeConfig(
        method="ngram",
        num_speculative_tokens=spec["num_speculative_tokens"],
        num_speculative_tokens_per_batch_size=[tuple(r) for r in spec["num_speculative_tokens_per_batch_size"]],
    )
    assert cfg.num_speculative_tokens_per_batch_size == [(1, 4, 3), (5, 64, 1)]
