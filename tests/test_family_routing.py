# tier: integration
"""Routing comes from the family record (issue 37): for every MoE family, the routing method quantkit predicts
equals what vLLM's own selection returns for the arguments vLLM's model file passes to its FusedMoE (read by hand
from the file, cited per row): fused_moe/config.py get_routing_method_type, or, for a custom routing function,
fused_moe/router/custom_routing_router.py CustomRoutingRouter.routing_method_type. GLM-4.5 is DeepSeekV3 by this,
not RenormalizeNaive (what quantkit said when routing was chosen by model_type)."""

from __future__ import annotations

from typing import Any

import pytest

from quantkit.naming.archs import families
from quantkit.rules.kernels import routing_method, routing_method_type
from tests.conftest import require_vllm

# family -> (a published-shape config, the FusedMoE routing arguments vLLM's model file passes for it:
# (scoring_func, renormalize, num_expert_group, has e_score_correction_bias) or ("custom", name))
CASES: dict[str, tuple[dict[str, Any], tuple[Any, ...]]] = {
    # deepseek_v2.py DeepseekV2MoE 327-332, 374-390: norm_topk_prob, grouped n_group, scoring_func, bias if noaux_tc
    "deepseek_v3": ({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2", "n_routed_experts": 384,
                     "scoring_func": "sigmoid", "topk_method": "noaux_tc", "n_group": 1, "norm_topk_prob": True},
                    ("sigmoid", True, 1, True)),
    # models/deepseek_v32/amd/model.py builds deepseek_v2.py's DeepseekV2MoE
    "deepseek_v32": ({"architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32",
                      "n_routed_experts": 256, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "n_group": 8,
                      "norm_topk_prob": True}, ("sigmoid", True, 8, True)),
    # glm4_moe.py Glm4MoE 148-150, 182-199: scoring_func="sigmoid", norm_topk_prob, n_group, bias always
    "glm4_moe": ({"architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "n_routed_experts": 160,
                  "n_group": 1, "norm_topk_prob": True}, ("sigmoid", True, 1, True)),
    # glm4_moe_lite.py Glm4MoeLite(Glm4MoE)
    "glm4_moe_lite": ({"architectures": ["Glm4MoeLiteForCausalLM"], "model_type": "glm4_moe_lite",
                       "n_routed_experts": 64, "n_group": 1, "norm_topk_prob": True}, ("sigmoid", True, 1, True)),
    # gpt_oss.py MLPBlock 390-400: renormalize=True, softmax
    "gpt_oss": ({"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "num_local_experts": 32},
                ("softmax", True, None, False)),
    # llama4.py Llama4MoE 131-145: custom_routing_function=Llama4MoE.custom_routing_function
    "llama4_text": ({"architectures": ["Llama4ForCausalLM"], "model_type": "llama4_text", "num_local_experts": 16},
                    ("custom",)),
    # minimax_m2.py MiniMaxM2MoE 82-105: scoring_func, bias when use_routing_bias, renormalize=True
    "minimax_m2": ({"architectures": ["MiniMaxM2ForCausalLM"], "model_type": "minimax_m2", "num_local_experts": 256,
                    "scoring_func": "sigmoid", "use_routing_bias": True}, ("sigmoid", True, None, True)),
    # mixtral.py MixtralMoE 118-128: renormalize=True, softmax
    "mixtral": ({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "num_local_experts": 8},
                ("softmax", True, None, False)),
    # qwen3_moe.py Qwen3MoeSparseMoeBlock 200-214: renormalize=config.norm_topk_prob
    "qwen3_moe": ({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_experts": 128,
                   "norm_topk_prob": True}, ("softmax", True, None, False)),
    # qwen3_next.py Qwen3NextSparseMoeBlock 225-240: renormalize=getattr(config, "norm_topk_prob", True)
    "qwen3_next": ({"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "num_experts": 512},
                   ("softmax", True, None, False)),
    # qwen3_5.py builds qwen3_next.py's Qwen3NextSparseMoeBlock
    "qwen3_5_moe": ({"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
                     "text_config": {"model_type": "qwen3_5_moe_text", "num_experts": 256, "norm_topk_prob": True}},
                    ("softmax", True, None, False)),
}


def vllms_answer(args: tuple[Any, ...]) -> str:
    require_vllm()
    from vllm.model_executor.layers.fused_moe.config import get_routing_method_type
    from vllm.model_executor.layers.fused_moe.router.custom_routing_router import CustomRoutingRouter
    from vllm.model_executor.models.llama4 import Llama4MoE

    if args[0] == "custom":
        router = CustomRoutingRouter.__new__(CustomRoutingRouter)
        router.custom_routing_function = Llama4MoE.custom_routing_function
        return router.routing_method_type.name
    scoring, renormalize, groups, bias = args
    return get_routing_method_type(scoring_func=scoring, top_k=8, renormalize=renormalize, num_expert_group=groups,
                                   has_e_score_bias=bias).name


def test_every_moe_family_with_a_vllm_model_has_a_case() -> None:
    routed = {f.name for f in families() if f.moe is not None and f.moe.routing is not None}
    assert routed == set(CASES)
    unrouted = {f.name for f in families() if f.moe is not None and f.moe.routing is None}
    assert all(f.draft is not None and f.draft.vllm_refusal for f in families() if f.name in unrouted)


@pytest.mark.parametrize("family", sorted(CASES))
def test_routing_method_is_vllms(family: str) -> None:
    config, args = CASES[family]
    assert routing_method(config) == vllms_answer(args), family


def test_glm45_routes_as_deepseek_v3() -> None:
    assert routing_method(CASES["glm4_moe"][0]) == "DeepSeekV3"


@pytest.mark.parametrize("args", [(s, r, g, b) for s in ("softmax", "sigmoid", "sqrtsoftplus", "other")
                                  for r in (True, False) for g in (None, 0, 1, 8) for b in (True, False)])
def test_the_replay_of_get_routing_method_type_is_exact(args: tuple[Any, ...]) -> None:
    assert routing_method_type(*args) == vllms_answer(args)
