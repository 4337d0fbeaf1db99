# tier: unit
"""A draft step's cost by role (issue 39, quantkit.rules.cost): header-only replicas of Kimi-K2.5's two published
EAGLE-3 draft shapes give the lm_head shares computed by hand here; the expected-experts formula, the bandwidth
table and the speedup bound are checked against hand arithmetic."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest

from quantkit.check.inspect import inspect_checkpoint
from quantkit.rules.cost import (
    BANDWIDTH_TBS,
    TargetShape,
    expected_distinct_experts,
    microseconds,
    speedup_bound,
)

HIDDEN, HEADS, HEAD_DIM = 7168, 64, 128
NBYTES = {"BF16": 2, "I64": 8, "BOOL": 1}


def write_header_only(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    """A valid safetensors file whose data region is a hole (nothing of it is read by inspect)."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        size = NBYTES[dtype] * math.prod(shape)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)


def kimi_draft(folder: Path, intermediate: int, draft_vocab: int, vocab: int = 163840) -> Path:
    """A Kimi-K2.5 EAGLE-3 draft replica (Llama layout, one midlayer), header only."""
    folder.mkdir()
    q = kv = HEADS * HEAD_DIM
    tensors = {
        "fc.weight": ("BF16", [HIDDEN, 3 * HIDDEN]),
        "midlayer.self_attn.q_proj.weight": ("BF16", [q, 2 * HIDDEN]),
        "midlayer.self_attn.k_proj.weight": ("BF16", [kv, 2 * HIDDEN]),
        "midlayer.self_attn.v_proj.weight": ("BF16", [kv, 2 * HIDDEN]),
        "midlayer.self_attn.o_proj.weight": ("BF16", [HIDDEN, q]),
        "midlayer.mlp.gate_proj.weight": ("BF16", [intermediate, HIDDEN]),
        "midlayer.mlp.up_proj.weight": ("BF16", [intermediate, HIDDEN]),
        "midlayer.mlp.down_proj.weight": ("BF16", [HIDDEN, intermediate]),
        "midlayer.input_layernorm.weight": ("BF16", [HIDDEN]),
        "midlayer.hidden_norm.weight": ("BF16", [HIDDEN]),
        "midlayer.post_attention_layernorm.weight": ("BF16", [HIDDEN]),
        "norm.weight": ("BF16", [HIDDEN]),
        "lm_head.weight": ("BF16", [draft_vocab, HIDDEN]),
    }
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": intermediate,
        "num_hidden_layers": 1,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "head_dim": HEAD_DIM,
        "vocab_size": vocab,
        "torch_dtype": "bfloat16",
        "max_position_embeddings": 262144,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
    }
    if draft_vocab != vocab:
        tensors["d2t"] = ("I64", [draft_vocab])
        tensors["t2d"] = ("BOOL", [vocab])
        config["draft_vocab_size"] = draft_vocab
    write_header_only(folder / "model.safetensors", tensors)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def by_hand(intermediate: int, draft_vocab: int) -> dict[str, int]:
    """Bytes per draft token by role, BF16: q, k, v read 2 x hidden; o; gate, up, down; the lm_head's rows."""
    q = kv = HEADS * HEAD_DIM
    return {
        "attention": 2 * (2 * HIDDEN * (q + 2 * kv) + q * HIDDEN),
        "dense_mlp": 2 * 3 * intermediate * HIDDEN,
        "lm_head": 2 * draft_vocab * HIDDEN,
        "fc": 2 * 3 * HIDDEN * HIDDEN,
    }


@pytest.mark.parametrize(
    "name,intermediate,draft_vocab,share",
    [
        ("specforge-kimi-k25-eagle3", 18432, 32000, 0.22),
        ("torchspec-kimi_k25_eagle3", 12288, 163840, 0.635),
    ],
)
def test_lm_head_share_of_the_kimi_drafts(
    tmp_path: Path, name: str, intermediate: int, draft_vocab: int, share: float
) -> None:
    result = inspect_checkpoint(kimi_draft(tmp_path / name, intermediate, draft_vocab))
    cost = result.draft_cost
    assert cost is not None
    hand = by_hand(intermediate, draft_vocab)
    assert {r.role: r.bytes for r in cost.roles} == hand
    token = hand["attention"] + hand["dense_mlp"] + hand["lm_head"]
    assert cost.lm_head_share == pytest.approx(hand["lm_head"] / token)
    assert round(cost.lm_head_share, 3 if share == 0.635 else 2) == share
    # a round of K=3 draft tokens reads fc once: the lm_head's share of the round
    assert cost.round_bytes(3) == pytest.approx(hand["fc"] + 3 * token)


def test_pruning_the_full_vocabulary_draft_to_32000_rows(tmp_path: Path) -> None:
    """The step saving pruning shows, by bytes: the body and 32,000 rows over the body and 163,840 rows."""
    full = inspect_checkpoint(kimi_draft(tmp_path / "full", 12288, 163840)).draft_cost
    pruned = inspect_checkpoint(kimi_draft(tmp_path / "pruned", 12288, 32000)).draft_cost
    assert full is not None and pruned is not None
    hand_full, hand_pruned = by_hand(12288, 163840), by_hand(12288, 32000)
    ratio = pruned.per_token_bytes / full.per_token_bytes
    body = hand_full["attention"] + hand_full["dense_mlp"]
    assert ratio == pytest.approx((body + hand_pruned["lm_head"]) / (body + hand_full["lm_head"]))
    assert round(ratio, 2) == 0.49  # the H200 measured 0.45-0.51 (benchmarks/results/draft_step_gpu.json)


def test_fp8_draft_after_the_recipe_counts_the_row_scaled_kernel(tmp_path: Path) -> None:
    """fp8-draft halves the body's bytes, but a row-scaled FP8 GEMM is counted at 1.6x its bytes' time (measured),
    so the estimated step is (0.5 x 1.6 x body + lm_head) / (body + lm_head), not the ideal (0.5 body + lm_head)."""
    cost = inspect_checkpoint(kimi_draft(tmp_path / "d", 18432, 32000)).draft_cost
    assert cost is not None and cost.after_recipe == "fp8-draft"
    hand = by_hand(18432, 32000)
    body = hand["attention"] + hand["dense_mlp"]
    assert cost.step_ratio_after == pytest.approx((0.5 * 1.6 * body + hand["lm_head"]) / (body + hand["lm_head"]))
    assert {r.role: r.bytes for r in cost.after}["lm_head"] == hand["lm_head"]  # kept BF16


def test_expected_distinct_experts() -> None:
    assert expected_distinct_experts(384, 8, 1) == pytest.approx(8)
    assert expected_distinct_experts(384, 8, 4) == pytest.approx(384 * (1 - (1 - 8 / 384) ** 4))
    assert expected_distinct_experts(384, 8, 10_000) == pytest.approx(384)
    assert expected_distinct_experts(0, 8, 4) == 0


def test_bandwidth_table_names_a_source_for_every_platform() -> None:
    assert set(BANDWIDTH_TBS) == {"MI300X", "MI325X", "MI355X", "H100", "H200", "B200"}
    assert all(tbs > 1 and "data sheet" in source for tbs, source in BANDWIDTH_TBS.values())
    # 1 GB at 4.8 TB/s x 0.875 attained: 238 us
    assert microseconds(1e9, "H200") == pytest.approx(1e9 / (4.8e12 * 0.875) * 1e6)


def test_speedup_bound_by_hand() -> None:
    target = TargetShape(always_bytes=10e9, moe_layers=60, num_experts=384, top_k=8, expert_bytes=11e6)
    b = speedup_bound(target, draft_round_bytes=3e9, al=3.0, k=3, batch=1, platform="MI355X")
    bw = 8.0e12 * 0.875
    decode = (10e9 + 60 * 11e6 * 8) / bw
    verify = (10e9 + 60 * 11e6 * expected_distinct_experts(384, 8, 4)) / bw
    assert b.speedup == pytest.approx(3.0 * decode / (decode + 3e9 / bw))
    assert b.speedup_uniform == pytest.approx(3.0 * decode / (verify + 3e9 / bw))
    assert b.speedup_uniform < b.speedup < 3.0
    assert "estimate from bytes" in b.notes[0]


def test_a_quantized_lm_head_is_its_own_rule_ranged_by_vllm_version() -> None:
    """The refusal cites vLLM's reason (QuarkConfig.get_quant_method gives a ParallelLMHead no method) and holds for
    every vLLM the table knows; setting vllm_max lifts it for the release that loads one, and only for that one."""
    import dataclasses

    from quantkit.rules.table import RULES

    rule = next(r for r in RULES if r.id == "lm-head-quantized")
    assert "get_quant_method" in rule.source and "ParallelLMHead" in rule.source
    assert rule.codes == ("lm-head-quantized",) and rule.vllm_max is None and "check" in rule.commands
    assert rule.holds_for_version("0.32.0")
    lifted = dataclasses.replace(rule, vllm_max="0.40")
    assert lifted.holds_for_version("0.32.0") and not lifted.holds_for_version("0.40.0")
    assert all("lm-head-quantized" not in r.codes for r in RULES if r.id != "lm-head-quantized")
