"""MiniMax-M2 targets (MiniMaxM2ForCausalLM): Mixtral's block_sparse_moe layout under runtime prefix `mlp`, MTP
modules dropped (the vLLM comment block is in quantkit.naming.archs.mixtral)."""

from __future__ import annotations

from quantkit.naming.archs.mixtral import block_sparse_moe_layers
from quantkit.naming.family import Family, MoeLayout

SOURCE = "vllm/model_executor/models/minimax_m2.py"

FAMILY = Family(
    "minimax_m2", ("MiniMaxM2ForCausalLM",), SOURCE,
    lambda c, k, t: block_sparse_moe_layers(c, k, t, runtime_moe="mlp", renames=(), extra_layers_key="num_mtp_modules",
                                            source=SOURCE),
    model_types=("minimax_m2",), quark_templates={"minimax_m2": "minimax_m2"},
    moe=MoeLayout(("num_local_experts",), checkpoint_prefix="block_sparse_moe"),
    mtp_layer_keys=("num_mtp_modules",),
)  # fmt: skip
