"""Bounds on the counts and sizes a config.json states, checked when the config is read (quantkit.io.headers
.read_config), before any of them drives a loop, a size estimate or a manifest.

Each bound is far above every released model (the deepest, Llama-3.1-405B, has 126 layers; the widest MoE, Kimi-K2,
384 experts; the largest vocabulary ~256k), so no valid config is blamed; a config beyond one is refused in one line
naming the file and the key (issue 35 item 5: `num_hidden_layers: 1e9` made deploy size a KV cache of 7.8 million
GiB; 400 digits ended in an OverflowError). Counts of things the checkpoint stores (MTP layers, experts) are also
bounded by what it stores where they drive a loop (quantkit.naming.builder.mtp_layer_indices).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quantkit.errors import CheckpointError

MAX_LAYERS = 10_000
MAX_EXPERTS = 65_536
MAX_HEADS = 65_536
MAX_WIDTH = 2**20  # hidden, intermediate and head sizes
MAX_VOCAB = 2**24

# config key -> the largest value quantkit accepts. MTP layer counts (num_nextn_predict_layers, num_mtp_modules) are
# not refused: they only ever select among the layers the checkpoint stores, so a huge one plans as the stored ones.
COUNT_BOUNDS: dict[str, int] = {
    "num_hidden_layers": MAX_LAYERS,
    "n_routed_experts": MAX_EXPERTS,
    "num_experts": MAX_EXPERTS,
    "num_local_experts": MAX_EXPERTS,
    "n_shared_experts": MAX_EXPERTS,
    "num_experts_per_tok": MAX_EXPERTS,
    "num_attention_heads": MAX_HEADS,
    "num_key_value_heads": MAX_HEADS,
    "hidden_size": MAX_WIDTH,
    "intermediate_size": MAX_WIDTH,
    "moe_intermediate_size": MAX_WIDTH,
    "head_dim": MAX_WIDTH,
    "vocab_size": MAX_VOCAB,
    "draft_vocab_size": MAX_VOCAB,
}


def check_config_counts(config: dict[str, Any], path: str | Path) -> None:
    """Refuse, in one line naming `path` and the key, an integer count of COUNT_BOUNDS above its bound, at the top
    level or in a wrapper's text_config. Types are ModelConfig's business (a string count is refused there)."""
    for where, cfg in (("", config), ("text_config.", config.get("text_config"))):
        if not isinstance(cfg, dict):
            continue
        for key, bound in COUNT_BOUNDS.items():
            value = cfg.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > bound:
                digits = len(str(value))
                shown = str(value) if digits <= 20 else f"a {digits}-digit number"
                raise CheckpointError(
                    f"{path}: {where}{key} is {shown}, more than {bound:,} (no released model comes "
                    "near); fix config.json"
                )
