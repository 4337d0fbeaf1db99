"""A fake MoE family that quantkit's package does not know: its own router and expert names, no Quark template.
Built from its record alone with quantkit.naming.builder; tests register it (naming.archs.registered) or hand it to
CLI subprocesses through QUANTKIT_FAMILY_MODULES=tests.toy_family."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from quantkit.naming.builder import (
    ATTN_SLOTS,
    QKV_MAP,
    CheckpointModules,
    Slot,
    check_layer_range,
    decoder_layer,
    embed_and_head,
    num_layers,
)
from quantkit.naming.family import Family, MoeLayout
from quantkit.naming.layers import RuntimeLayer

SOURCE = "toy_moe (a test family: tests/toy_family.py)"
ARCHITECTURE = "ToyMoeForCausalLM"
EXPERTS = 4
LAYERS = 2
HIDDEN = 64


def toy_layers(config: Mapping[str, Any], ckpt: CheckpointModules, _target: int | None) -> list[RuntimeLayer]:
    """Llama attention; each layer an MoE block `mlp.router` (quantizable, like Qwen3-MoE's gate) and
    `mlp.experts.<e>.w_in / w_out`."""
    n = num_layers(config, "model")
    slots = ATTN_SLOTS + (
        Slot("mlp.router", "router", "router", ("mlp.router",)),
        Slot("mlp.experts", "moe", "experts", ("mlp.experts",)),
    )
    embed, head = embed_and_head(ckpt, config, SOURCE)
    out = [embed]
    for i in range(n):
        out += decoder_layer(ckpt, slots, f"model.layers.{i}", f"model.layers.{i}", i, QKV_MAP, SOURCE)
    check_layer_range(ckpt, "model.layers", n, SOURCE)
    return out + [head]


FAMILY = Family("toy_moe", (ARCHITECTURE,), SOURCE, toy_layers, quark_templates={},
                moe=MoeLayout(("num_toy_experts",)))  # fmt: skip

CONFIG = {
    "architectures": [ARCHITECTURE], "model_type": "toy_moe", "num_hidden_layers": LAYERS, "hidden_size": HIDDEN,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 256,
    "num_toy_experts": EXPERTS, "torch_dtype": "bfloat16", "max_position_embeddings": 512,
    "tie_word_embeddings": False,
}  # fmt: skip


def modules() -> dict[str, tuple[int, ...]]:
    """Every tensor of the toy checkpoint and its shape (weights [out, in])."""
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (256, HIDDEN), "model.norm.weight": (HIDDEN,),
                                          "lm_head.weight": (256, HIDDEN)}  # fmt: skip
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        shapes |= {f"{p}.input_layernorm.weight": (HIDDEN,), f"{p}.post_attention_layernorm.weight": (HIDDEN,),
                   f"{p}.self_attn.q_proj.weight": (64, HIDDEN), f"{p}.self_attn.k_proj.weight": (32, HIDDEN),
                   f"{p}.self_attn.v_proj.weight": (32, HIDDEN), f"{p}.self_attn.o_proj.weight": (HIDDEN, 64),
                   f"{p}.mlp.router.weight": (EXPERTS, HIDDEN)}  # fmt: skip
        for e in range(EXPERTS):
            shapes |= {f"{p}.mlp.experts.{e}.w_in.weight": (64, HIDDEN), f"{p}.mlp.experts.{e}.w_out.weight": (HIDDEN, 64)}
    return shapes


def write_checkpoint(out: Path, seed: int = 0) -> Path:
    """The toy checkpoint (random BF16, ~0.2 MB): config.json and one model.safetensors."""
    import json

    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {name: (torch.randn(*shape, generator=g) * 0.05).to(torch.bfloat16) for name, shape in modules().items()}
    save_file(tensors, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(CONFIG, indent=2))
    return out
