"""Tiny random checkpoints of the MoE families quantkit supports besides the bundled Qwen3-MoE.

Made with transformers' own classes and saved in the published per-expert layout (transformers 5 converts its
fused in-memory experts back on save), split into 2+ shards like real releases.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

TOKENIZER_FROM = "examples/tiny/target"


def _save(model, out: Path, vocab_src: Path) -> Path:
    import shutil

    model = model.to(torch.bfloat16)
    model.save_pretrained(out, max_shard_size="400KB")
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(vocab_src / f, out / f)
    return out


def deepseek_v3(out: Path, tiny: Path) -> Path:
    """DeepSeek-V3 layout (the Kimi-K2.5 text model): MLA with q_lora, 1 dense layer, shared experts, a router
    with e_score_correction_bias."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(0)
    cfg = DeepseekV3Config(
        vocab_size=2048, hidden_size=128, intermediate_size=256, moe_intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8, num_experts_per_tok=2,
        first_k_dense_replace=1, q_lora_rank=64, kv_lora_rank=32, qk_rope_head_dim=32, qk_nope_head_dim=32,
        v_head_dim=32, n_group=1, topk_group=1, max_position_embeddings=1024, bos_token_id=1, eos_token_id=2,
        pad_token_id=0,
    )
    return _save(DeepseekV3ForCausalLM(cfg), out, tiny / "target")


def minimax_m2(out: Path, tiny: Path) -> Path:
    """MiniMax-M2 layout: `block_sparse_moe` experts named w1/w2/w3 (as Mixtral), router `block_sparse_moe.gate`."""
    from transformers import MiniMaxM2Config, MiniMaxM2ForCausalLM

    torch.manual_seed(0)
    cfg = MiniMaxM2Config(
        vocab_size=2048, hidden_size=128, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=1024,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    return _save(MiniMaxM2ForCausalLM(cfg), out, tiny / "target")


def tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), "pt") as s:
            for k in s.keys():
                out[k] = s.get_tensor(k)
    return out


def index_files(folder: Path) -> set[str]:
    return set(json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"].values())
