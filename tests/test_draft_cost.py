# tier: unit
"""The draft cost estimate (quantkit.rules.cost) on header-only replicas of Kimi-K2.5's two published EAGLE-3 drafts,
against shares computed by hand here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantkit.io.headers import checkpoint_tensors
from quantkit.io.safetensors import header_bytes
from quantkit.rules.cost import GPUS, draft_cost, estimate, expected_experts, target_step_bytes

H, HEADS, HEAD_DIM = 7168, 64, 128  # Kimi-K2.5 drafts: hidden 7168, 64 heads x 128, one layer; q/k/v take 2 x hidden


def write_header_only(folder: Path, tensors: dict[str, tuple[str, list[int]]], config: dict) -> Path:
    """A safetensors file whose header declares every tensor with its shape; the data region is sparse (truncate),
    as benchmarks/inspect_large.py builds large checkpoints."""
    folder.mkdir(parents=True, exist_ok=True)
    size = {"BF16": 2, "I64": 8, "BOOL": 1, "F8_E4M3": 1, "F32": 4}
    items = [(n, d, tuple(s), size[d] * (1 if not s else __import__("math").prod(s))) for n, (d, s) in
             tensors.items()]
    head, _ = header_bytes(items)
    with open(folder / "model.safetensors", "wb") as f:
        f.write(head)
        f.truncate(len(head) + sum(i[3] for i in items))
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def kimi_draft(folder: Path, mlp: int, rows: int, vocab: int = 163840) -> Path:
    t = {
        "fc.weight": ("BF16", [H, 3 * H]),
        "midlayer.self_attn.q_proj.weight": ("BF16", [HEADS * HEAD_DIM, 2 * H]),
        "midlayer.self_attn.k_proj.weight": ("BF16", [HEADS * HEAD_DIM, 2 * H]),
        "midlayer.self_attn.v_proj.weight": ("BF16", [HEADS * HEAD_DIM, 2 * H]),
        "midlayer.self_attn.o_proj.weight": ("BF16", [H, HEADS * HEAD_DIM]),
        "midlayer.mlp.gate_proj.weight": ("BF16", [mlp, H]),
        "midlayer.mlp.up_proj.weight": ("BF16", [mlp, H]),
        "midlayer.mlp.down_proj.weight": ("BF16", [H, mlp]),
        "midlayer.input_layernorm.weight": ("BF16", [H]),
        "midlayer.hidden_norm.weight": ("BF16", [H]),
        "norm.weight": ("BF16", [H]),
        "lm_head.weight": ("BF16", [rows, H]),
    }
    if rows != vocab:
        t |= {"d2t": ("I64", [rows]), "t2d": ("BOOL", [vocab])}
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
              "intermediate_size": mlp, "num_hidden_layers": 1, "num_attention_heads": HEADS,
              "num_key_value_heads": HEADS, "head_dim": HEAD_DIM, "vocab_size": vocab, "draft_vocab_size": rows}
    return write_header_only(folder, t, config)


def by_hand(mlp: int, rows: int) -> float:
    """lm_head's share of one draft token's weight reads (fc runs once per round, apart)."""
    attention = 3 * (HEADS * HEAD_DIM) * (2 * H) + H * HEADS * HEAD_DIM
    return rows * H / (attention + 3 * mlp * H + rows * H)


@pytest.mark.parametrize("mlp, rows, share", [(18432, 32000, 0.22), (12288, 163840, 0.635)])
def test_kimi_draft_replicas_lm_head_share(tmp_path, mlp, rows, share):
    folder = kimi_draft(tmp_path / f"d{rows}", mlp, rows)
    cost = draft_cost(json.loads((folder / "config.json").read_text()), checkpoint_tensors(folder))
    roles = {r.role: r for r in cost.roles}
    assert roles["lm_head"].bf16_share == pytest.approx(by_hand(mlp, rows), abs=1e-4)
    assert round(roles["lm_head"].bf16_share, 2 if share == 0.22 else 3) == share
    # fp8-draft: attention and MLP in FP8 (1 byte + a 4-byte scale per output row), fc and lm_head BF16
    assert roles["lm_head"].recipe_bytes == rows * H * 2 and not roles["lm_head"].quantized
    assert roles["mlp"].recipe_bytes == 3 * mlp * H + (2 * mlp + H) * 4
    assert roles["fc"].per == "round" and roles["fc"].bf16_bytes == 3 * H * H * 2


def test_pruning_the_full_vocabulary_draft_shows_the_saving(tmp_path):
    full = kimi_draft(tmp_path / "full", 12288, 163840)
    pruned = kimi_draft(tmp_path / "pruned", 12288, 32000)
    a = draft_cost(json.loads((full / "config.json").read_text()), checkpoint_tensors(full))
    b = draft_cost(json.loads((pruned / "config.json").read_text()), checkpoint_tensors(pruned))
    attention = 3 * (HEADS * HEAD_DIM) * (2 * H) + H * HEADS * HEAD_DIM
    body = attention + 3 * 12288 * H
    assert b.draft_token_bf16_bytes / a.draft_token_bf16_bytes == pytest.approx(
        (body + 32000 * H) / (body + 163840 * H))  # 0.49 of the BF16 step, by bytes
    est = estimate(b, checkpoint_tensors(pruned), "H200", k=3, al=2.5)
    assert est.estimate is not None and "ESTIMATE FROM BYTES" in est.estimate.label
    # H200 at 4.8 TB/s: microseconds = bytes / 4.8e6
    assert est.estimate.draft_token_us_bf16 == pytest.approx(b.draft_token_bf16_bytes / 4.8e6, abs=0.01)


def test_expected_experts_by_hand():
    assert expected_experts(8, 2, 1) == pytest.approx(2.0)
    assert expected_experts(8, 2, 2) == pytest.approx(8 * (1 - 0.75 ** 2))  # 3.5
    assert expected_experts(384, 8, 4) == pytest.approx(384 * (1 - (1 - 8 / 384) ** 4))


def test_target_steps_read_experts_by_expectation(tmp_path):
    t = {"model.embed_tokens.weight": ("BF16", [100, 16]), "model.layers.0.self_attn.q_proj.weight": ("BF16", [16, 16]),
         "lm_head.weight": ("BF16", [100, 16])}
    for e in range(8):
        t[f"model.layers.0.mlp.experts.{e}.down_proj.weight"] = ("BF16", [16, 8])
    folder = write_header_only(tmp_path / "moe", t, {"num_experts": 8, "num_experts_per_tok": 2})
    step = target_step_bytes({"num_experts": 8, "num_experts_per_tok": 2}, checkpoint_tensors(folder), tokens=2)
    assert step.other_bytes == (16 * 16 + 100 * 16) * 2  # the embedding is a lookup: left out
    assert step.expert_bytes == int(8 * 16 * 8 * 2 * 3.5 / 8)


def test_every_gpu_names_its_source():
    assert set(GPUS) == {"MI300X", "MI325X", "MI355X", "H100", "H200", "B200"}
    assert all(g.hbm_tb_s > 0 and any(w in g.source for w in ("product page", "datasheet", "spec page"))
               for g in GPUS.values())


def test_inspect_shows_the_cost_of_a_kimi_replica(tmp_path):
    from click.testing import CliRunner

    from quantkit.cli import main

    folder = kimi_draft(tmp_path / "full", 12288, 163840)
    r = CliRunner().invoke(main, ["inspect", str(folder), "--gpu", "H200", "--k", "3", "--json"])
    assert r.exit_code == 0, r.output
    cost = json.loads(r.stdout)["cost"]
    lm = next(x for x in cost["roles"] if x["role"] == "lm_head")
    assert lm["bf16_share"] == pytest.approx(by_hand(12288, 163840), abs=1e-4)
    assert cost["estimate"]["gpu"] == "H200" and "ESTIMATE FROM BYTES" in cost["estimate"]["label"]
    shown = CliRunner().invoke(main, ["inspect", str(folder), "--gpu", "MI355X"])
    assert "ESTIMATE FROM BYTES on MI355X" in shown.output and "lm_head" in shown.output
