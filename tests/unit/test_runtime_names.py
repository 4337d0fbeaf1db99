# tier: unit
"""naming (the family records in naming/archs, builder, exclude): runtime names per architecture (expected names written from vLLM's model files) and the exclude replay, without vLLM; the replay checked layer by layer against vLLM's own QuarkConfig / should_ignore_layer is in tests/integration/test_vllm_names.py."""

from __future__ import annotations

import fnmatch

import pytest

from quantkit.errors import CheckpointError, QuantkitError
from quantkit.naming.archs import SUPPORTED_ARCHITECTURES, architecture_of, runtime_layers
from quantkit.naming.archs import is_draft as is_draft_config
from quantkit.naming.exclude import (
    ExcludeListError,
    ExcludeMatch,
    PartialFusedExclusion,
    PartialFusedExclusionError,
    checkpoint_exclude_for,
    exclude_entries_for,
    excluded_names,
    is_excluded,
    match_reason,
    quantized_layers,
)
from quantkit.naming.layers import (
    CheckpointLayoutError,
    MissingTargetLayersError,
    RuntimeLayer,
    UnsupportedArchitectureError,
    in_role,
    layers_in_role,
)


def w(*modules: str) -> list[str]:
    return [f"{m}.weight" for m in modules]


def attn(p: str) -> list[str]:
    return w(*(f"{p}.self_attn.{x}_proj" for x in "qkvo"))


def dense_mlp(p: str) -> list[str]:
    return w(f"{p}.mlp.gate_proj", f"{p}.mlp.up_proj", f"{p}.mlp.down_proj")


def norms(p: str) -> list[str]:
    return w(f"{p}.input_layernorm", f"{p}.post_attention_layernorm")


def experts(container: str, n: int, names=("gate_proj", "up_proj", "down_proj")) -> list[str]:
    return w(*(f"{container}.{e}.{x}" for e in range(n) for x in names))


def draft_tensors(layer: str = "midlayer", embed: bool = False) -> list[str]:
    t = ["d2t", "t2d", *w("fc", "norm", "lm_head", f"{layer}.hidden_norm"), *norms(layer)]
    t += attn(layer) + dense_mlp(layer)
    return t + (w("embed_tokens") if embed else [])


DRAFT_CONFIG = {"architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1, "hidden_size": 64}


SPECULATORS_CONFIG = {
    "speculators_model_type": "eagle3",
    "architectures": ["Eagle3Speculator"],
    "transformer_layer_config": {"model_type": "llama", "num_hidden_layers": 1},
    "speculators_config": {"verifier": {"name_or_path": "x"}, "proposal_methods": [{"speculative_tokens": 3}]},
}


def llama_tensors(n: int) -> list[str]:
    t = w("model.embed_tokens", "model.norm", "lm_head")
    for i in range(n):
        p = f"model.layers.{i}"
        t += attn(p) + dense_mlp(p) + norms(p)
    return t


def qwen3_moe_config(n=3, **kw):
    return {"architectures": ["Qwen3MoeForCausalLM"], "num_hidden_layers": n, "num_experts": 4,
            "decoder_sparse_step": 1, "mlp_only_layers": [], **kw}  # fmt: skip


def qwen3_moe_tensors(n: int, dense: set[int], n_experts: int = 4) -> list[str]:
    t = w("model.embed_tokens", "model.norm", "lm_head")
    for i in range(n):
        p = f"model.layers.{i}"
        t += attn(p) + norms(p) + w(f"{p}.self_attn.q_norm", f"{p}.self_attn.k_norm")
        t += dense_mlp(p) if i in dense else w(f"{p}.mlp.gate") + experts(f"{p}.mlp.experts", n_experts)
    return t


def deepseek_config(**kw):
    return {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2", "num_hidden_layers": 3,
            "first_k_dense_replace": 1, "moe_layer_freq": 1, "n_routed_experts": 4, "n_shared_experts": 1,
            "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8,
            "num_nextn_predict_layers": 0, "topk_method": "noaux_tc", **kw}  # fmt: skip


def deepseek_tensors(n: int = 3, first_dense: int = 1, q_lora: bool = True, mtp_layers: int = 0) -> list[str]:
    t = w("model.embed_tokens", "model.norm", "lm_head")
    for i in range(n + mtp_layers):
        p = f"model.layers.{i}"
        a = f"{p}.self_attn"
        t += norms(p) + w(f"{a}.kv_a_proj_with_mqa", f"{a}.kv_a_layernorm", f"{a}.kv_b_proj", f"{a}.o_proj")
        t += w(f"{a}.q_a_proj", f"{a}.q_a_layernorm", f"{a}.q_b_proj") if q_lora else w(f"{a}.q_proj")
        if i < first_dense:
            t += dense_mlp(p)
        else:
            t += w(f"{p}.mlp.gate") + [f"{p}.mlp.gate.e_score_correction_bias"] + experts(f"{p}.mlp.experts", 4)
            t += w(f"{p}.mlp.shared_experts.gate_proj", f"{p}.mlp.shared_experts.up_proj",
                   f"{p}.mlp.shared_experts.down_proj")  # fmt: skip
        if i >= n:  # DeepSeek-V3's MTP layer: vLLM's target model skips these tensors
            t += w(f"{p}.enorm", f"{p}.hnorm", f"{p}.eh_proj", f"{p}.shared_head.head", f"{p}.shared_head.norm")
    return t


def block_sparse_tensors(n: int, minimax: bool = False, mtp: int = 0) -> list[str]:
    t = w("model.embed_tokens", "model.norm", "lm_head")
    for i in range(n + mtp):
        p = f"model.layers.{i}"
        t += attn(p) + norms(p) + w(f"{p}.block_sparse_moe.gate")
        t += experts(f"{p}.block_sparse_moe.experts", 4, ("w1", "w2", "w3"))
        if minimax:
            t += [f"{p}.block_sparse_moe.e_score_correction_bias"] + w(f"{p}.self_attn.q_norm", f"{p}.self_attn.k_norm")
    return t


def by_name(layers: list[RuntimeLayer]) -> dict[str, RuntimeLayer]:
    return {layer.name: layer for layer in layers}


def test_eagle3_draft_runtime_names_follow_the_target_layer_count():
    layers = runtime_layers(DRAFT_CONFIG, draft_tensors(), target_num_layers=61)
    assert [(lay.name, lay.kind, lay.role) for lay in layers] == [
        ("model.fc", "linear", "fc"),
        ("model.layers.61.self_attn.qkv_proj", "fused_linear", "attention"),
        ("model.layers.61.self_attn.o_proj", "linear", "attention"),
        ("model.layers.61.mlp.gate_up_proj", "fused_linear", "dense_mlp"),
        ("model.layers.61.mlp.down_proj", "linear", "dense_mlp"),
        ("lm_head", "lm_head", "lm_head"),
    ]
    named = by_name(layers)
    assert named["model.fc"].checkpoint_modules == ("fc",)
    assert named["model.layers.61.self_attn.qkv_proj"].checkpoint_modules == (
        "midlayer.self_attn.q_proj", "midlayer.self_attn.k_proj", "midlayer.self_attn.v_proj",
    )  # fmt: skip
    # The draft's QuarkConfig never gets a packed_modules_mapping, so vLLM expands no shards for draft layers.
    assert all(lay.shards == () for lay in layers)
    assert named["lm_head"].quantizable is False and named["model.fc"].quantizable is True
    assert is_draft_config(DRAFT_CONFIG) and not is_draft_config(qwen3_moe_config())


def test_speculators_eagle3_draft_with_layers_0_and_embed_tokens():
    layers = runtime_layers(SPECULATORS_CONFIG, draft_tensors("layers.0", embed=True), target_num_layers=36)
    assert architecture_of(SPECULATORS_CONFIG) == "Eagle3LlamaForCausalLM"
    assert [lay.name for lay in layers] == [
        "model.embed_tokens", "model.fc", "model.layers.36.self_attn.qkv_proj", "model.layers.36.self_attn.o_proj",
        "model.layers.36.mlp.gate_up_proj", "model.layers.36.mlp.down_proj", "lm_head",
    ]  # fmt: skip
    assert by_name(layers)["model.layers.36.mlp.down_proj"].checkpoint_modules == ("layers.0.mlp.down_proj",)
    assert by_name(layers)["model.embed_tokens"].quantizable is False


def test_qwen3_eagle3_draft_qkv_proj_has_no_self_attn_in_its_runtime_name():
    # qwen3_eagle3.py rebuilds qkv_proj with maybe_prefix(prefix, "qkv_proj") on the decoder layer's prefix.
    config = {**SPECULATORS_CONFIG, "transformer_layer_config": {"model_type": "qwen3", "num_hidden_layers": 1}}
    names = [lay.name for lay in runtime_layers(config, draft_tensors("layers.0"), target_num_layers=48)]
    assert "model.layers.48.qkv_proj" in names and "model.layers.48.self_attn.o_proj" in names
    assert "model.layers.48.self_attn.qkv_proj" not in names


def test_draft_without_target_layer_count_is_a_user_error():
    with pytest.raises(MissingTargetLayersError, match="target") as e:
        runtime_layers(DRAFT_CONFIG, draft_tensors())
    assert isinstance(e.value, QuantkitError) and "\n" not in str(e.value)
    with pytest.raises(MissingTargetLayersError):
        runtime_layers(DRAFT_CONFIG, draft_tensors(), target_num_layers=0)


def test_draft_saved_with_model_prefix_is_rejected_because_vllm_would_not_load_it():
    tensors = [f"model.{t}" if t not in ("d2t", "t2d", "lm_head.weight") else t for t in draft_tensors()]
    with pytest.raises(CheckpointLayoutError, match="fc") as e:
        runtime_layers(DRAFT_CONFIG, tensors, target_num_layers=61)
    assert isinstance(e.value, CheckpointError)


def test_llama_and_qwen3_dense_targets():
    for arch in ("LlamaForCausalLM", "Qwen3ForCausalLM"):
        layers = runtime_layers({"architectures": [arch], "num_hidden_layers": 2}, llama_tensors(2))
        assert [lay.name for lay in layers] == [
            "model.embed_tokens",
            "model.layers.0.self_attn.qkv_proj", "model.layers.0.self_attn.o_proj",
            "model.layers.0.mlp.gate_up_proj", "model.layers.0.mlp.down_proj",
            "model.layers.1.self_attn.qkv_proj", "model.layers.1.self_attn.o_proj",
            "model.layers.1.mlp.gate_up_proj", "model.layers.1.mlp.down_proj",
            "lm_head",
        ]  # fmt: skip
        named = by_name(layers)
        assert named["model.layers.1.self_attn.qkv_proj"].shards == (
            "model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.k_proj", "model.layers.1.self_attn.v_proj",
        )  # fmt: skip
        assert named["model.layers.0.mlp.gate_up_proj"].shards == (
            "model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj",
        )  # fmt: skip
        assert named["model.layers.0.mlp.gate_up_proj"].role == "dense_mlp"


def test_tied_embeddings_target_has_an_lm_head_without_tensors():
    tensors = [t for t in llama_tensors(1) if not t.startswith("lm_head")]
    layers = runtime_layers({"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 1,
                             "tie_word_embeddings": True}, tensors)  # fmt: skip
    assert by_name(layers)["lm_head"].checkpoint_modules == ()
    with pytest.raises(CheckpointLayoutError, match="lm_head"):
        runtime_layers({"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 1}, tensors)


def test_qwen3_moe_sparse_and_dense_layers():
    layers = runtime_layers(qwen3_moe_config(mlp_only_layers=[0]), qwen3_moe_tensors(3, dense={0}))
    assert [(lay.name, lay.kind, lay.role) for lay in layers] == [
        ("model.embed_tokens", "embedding", "embed_tokens"),
        ("model.layers.0.self_attn.qkv_proj", "fused_linear", "attention"),
        ("model.layers.0.self_attn.o_proj", "linear", "attention"),
        ("model.layers.0.mlp.gate_up_proj", "fused_linear", "dense_mlp"),
        ("model.layers.0.mlp.down_proj", "linear", "dense_mlp"),
        ("model.layers.1.self_attn.qkv_proj", "fused_linear", "attention"),
        ("model.layers.1.self_attn.o_proj", "linear", "attention"),
        ("model.layers.1.mlp.gate", "router", "router"),
        ("model.layers.1.mlp.experts", "moe", "experts"),
        ("model.layers.2.self_attn.qkv_proj", "fused_linear", "attention"),
        ("model.layers.2.self_attn.o_proj", "linear", "attention"),
        ("model.layers.2.mlp.gate", "router", "router"),
        ("model.layers.2.mlp.experts", "moe", "experts"),
        ("lm_head", "lm_head", "lm_head"),
    ]
    named = by_name(layers)
    # qwen3_moe.py builds the gate WITH quant_config: vLLM quantizes the router unless it is excluded.
    assert named["model.layers.1.mlp.gate"].quantizable is True
    # gate_up_proj joins the class mapping only in __init__, after SupportsQuant.__new__ copied it: no shards.
    assert named["model.layers.0.mlp.gate_up_proj"].shards == ()
    assert named["model.layers.1.mlp.experts"].checkpoint_modules[:3] == (
        "model.layers.1.mlp.experts.0.gate_proj", "model.layers.1.mlp.experts.0.up_proj",
        "model.layers.1.mlp.experts.0.down_proj",
    )  # fmt: skip
    assert len(named["model.layers.1.mlp.experts"].checkpoint_modules) == 12

    stepped = runtime_layers(qwen3_moe_config(n=4, decoder_sparse_step=2), qwen3_moe_tensors(4, dense={0, 2}))
    assert [lay.name for lay in stepped if lay.kind == "moe"] == [
        "model.layers.1.mlp.experts",
        "model.layers.3.mlp.experts",
    ]


def test_qwen3_moe_fused_expert_tensors_feed_the_experts_layer():
    tensors = [t for t in qwen3_moe_tensors(1, dense=set()) if ".experts." not in t]
    tensors += ["model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj"]
    layers = runtime_layers(qwen3_moe_config(n=1), tensors)
    assert by_name(layers)["model.layers.0.mlp.experts"].checkpoint_modules == ("model.layers.0.mlp.experts",)


def test_config_that_disagrees_with_the_weights_is_rejected():
    with pytest.raises(CheckpointLayoutError, match=r"no tensors for model\.layers\.0\.mlp\.gate "):
        runtime_layers(qwen3_moe_config(n=2), qwen3_moe_tensors(2, dense={0}))
    with pytest.raises(CheckpointLayoutError, match="num_hidden_layers=2"):
        runtime_layers(qwen3_moe_config(n=2), qwen3_moe_tensors(3, dense=set()))


def test_deepseek_v3_mla_fused_qkv_a_and_moe_layout():
    layers = runtime_layers(deepseek_config(num_nextn_predict_layers=1), deepseek_tensors(mtp_layers=1))
    names = [lay.name for lay in layers]
    assert names[:9] == [
        "model.embed_tokens",
        "model.layers.0.self_attn.fused_qkv_a_proj", "model.layers.0.self_attn.q_b_proj",
        "model.layers.0.self_attn.kv_b_proj", "model.layers.0.self_attn.o_proj",
        "model.layers.0.mlp.gate_up_proj", "model.layers.0.mlp.down_proj",
        "model.layers.1.self_attn.fused_qkv_a_proj", "model.layers.1.self_attn.q_b_proj",
    ]  # fmt: skip
    assert names[9:] == [
        "model.layers.1.self_attn.kv_b_proj", "model.layers.1.self_attn.o_proj",
        "model.layers.1.mlp.gate", "model.layers.1.mlp.shared_experts.gate_up_proj",
        "model.layers.1.mlp.shared_experts.down_proj", "model.layers.1.mlp.experts",
        "model.layers.2.self_attn.fused_qkv_a_proj", "model.layers.2.self_attn.q_b_proj",
        "model.layers.2.self_attn.kv_b_proj", "model.layers.2.self_attn.o_proj",
        "model.layers.2.mlp.gate", "model.layers.2.mlp.shared_experts.gate_up_proj",
        "model.layers.2.mlp.shared_experts.down_proj", "model.layers.2.mlp.experts",
        "lm_head",
    ]  # fmt: skip
    assert not any(".layers.3." in n for n in names)  # the MTP layer is not part of vLLM's target model
    named = by_name(layers)
    qkv_a = named["model.layers.1.self_attn.fused_qkv_a_proj"]
    assert qkv_a.shards == ("model.layers.1.self_attn.q_a_proj", "model.layers.1.self_attn.kv_a_proj_with_mqa")
    assert qkv_a.checkpoint_modules == qkv_a.shards
    # deepseek_v2.py builds the gate without quant_config: vLLM never quantizes it.
    assert named["model.layers.1.mlp.gate"].quantizable is False
    assert named["model.layers.1.mlp.shared_experts.gate_up_proj"].role == "shared_experts"
    assert named["model.layers.1.mlp.shared_experts.gate_up_proj"].shards == (
        "model.layers.1.mlp.shared_experts.gate_proj", "model.layers.1.mlp.shared_experts.up_proj",
    )  # fmt: skip


def test_deepseek_without_q_lora_has_separate_q_proj_and_kv_a_proj():
    layers = runtime_layers(deepseek_config(q_lora_rank=None, num_hidden_layers=1, first_k_dense_replace=1),
                            deepseek_tensors(n=1, q_lora=False))  # fmt: skip
    assert [lay.name for lay in layers if lay.role == "attention"] == [
        "model.layers.0.self_attn.kv_a_proj_with_mqa", "model.layers.0.self_attn.q_proj",
        "model.layers.0.self_attn.kv_b_proj", "model.layers.0.self_attn.o_proj",
    ]  # fmt: skip


def test_mixtral_block_sparse_moe():
    layers = runtime_layers({"architectures": ["MixtralForCausalLM"], "num_hidden_layers": 1},
                            block_sparse_tensors(1))  # fmt: skip
    assert [(lay.name, lay.kind, lay.quantizable) for lay in layers] == [
        ("model.embed_tokens", "embedding", False),
        ("model.layers.0.self_attn.qkv_proj", "fused_linear", True),
        ("model.layers.0.self_attn.o_proj", "linear", True),
        ("model.layers.0.block_sparse_moe.gate", "router", False),
        ("model.layers.0.block_sparse_moe.experts", "moe", True),
        ("lm_head", "lm_head", False),
    ]
    assert by_name(layers)["model.layers.0.block_sparse_moe.experts"].checkpoint_modules[:3] == (
        "model.layers.0.block_sparse_moe.experts.0.w1", "model.layers.0.block_sparse_moe.experts.0.w2",
        "model.layers.0.block_sparse_moe.experts.0.w3",
    )  # fmt: skip


def test_minimax_m2_runtime_moe_prefix_is_mlp_not_block_sparse_moe():
    # minimax_m2.py: self.block_sparse_moe = MiniMaxM2MoE(..., prefix=f"{prefix}.mlp")
    config = {"architectures": ["MiniMaxM2ForCausalLM"], "num_hidden_layers": 2, "num_mtp_modules": 1}
    layers = runtime_layers(config, block_sparse_tensors(2, minimax=True, mtp=1))
    named = by_name(layers)
    assert "model.layers.1.mlp.experts" in named and "model.layers.1.mlp.gate" in named
    assert not any("block_sparse_moe" in n for n in named)
    assert named["model.layers.1.mlp.experts"].checkpoint_modules[0] == "model.layers.1.block_sparse_moe.experts.0.w1"
    assert named["model.layers.1.mlp.gate"].checkpoint_modules == ("model.layers.1.block_sparse_moe.gate",)
    assert not any(".layers.2." in n for n in named)


def test_unsupported_architecture_names_it_and_the_supported_ones():
    with pytest.raises(UnsupportedArchitectureError) as e:
        runtime_layers({"architectures": ["JambaForCausalLM"], "num_hidden_layers": 1}, [])
    msg = str(e.value)
    # issue 38: the nearest family and the `quantkit families` listing, not every supported name on one line
    assert "JambaForCausalLM" in msg and "nearest supported is family" in msg and "quantkit families" in msg
    assert "Qwen3MoeForCausalLM" not in msg
    assert isinstance(e.value, QuantkitError) and "\n" not in msg
    with pytest.raises(UnsupportedArchitectureError, match="peagle"):
        architecture_of({**SPECULATORS_CONFIG, "speculators_model_type": "peagle"})
    assert set(SUPPORTED_ARCHITECTURES) >= {"Eagle3LlamaForCausalLM", "LlamaForCausalLMEagle3", "LlamaForCausalLM",
                                            "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "DeepseekV3ForCausalLM",
                                            "MixtralForCausalLM", "MiniMaxM2ForCausalLM"}  # fmt: skip


def test_roles_and_decoder_linears():
    draft = runtime_layers(DRAFT_CONFIG, draft_tensors(), target_num_layers=61)
    assert [lay.name for lay in layers_in_role(draft, "decoder_linears")] == [
        "model.layers.61.self_attn.qkv_proj", "model.layers.61.self_attn.o_proj",
        "model.layers.61.mlp.gate_up_proj", "model.layers.61.mlp.down_proj",
    ]  # fmt: skip
    moe = by_name(runtime_layers(deepseek_config(), deepseek_tensors()))
    gate = moe["model.layers.1.mlp.gate"]
    assert in_role(gate, "router") and in_role(gate, "decoder_linears")
    assert in_role(moe["model.layers.1.mlp.experts"], "experts")
    assert not in_role(moe["model.layers.1.mlp.experts"], "decoder_linears")
    assert not in_role(moe["lm_head"], "decoder_linears") and not in_role(moe["model.embed_tokens"], "attention")
    with pytest.raises(ValueError):
        in_role(moe["lm_head"], "heads")


@pytest.fixture
def draft61():
    return runtime_layers(DRAFT_CONFIG, draft_tensors(), target_num_layers=61)


def test_amd_kimi_k25_draft_quark_exclude_leaves_fc_quantized(draft61):
    named = by_name(draft61)
    quark_export = ["fc", "lm_head"]
    assert is_excluded(named["model.fc"], quark_export) is False  # vLLM quantizes model.fc
    assert is_excluded(named["lm_head"], quark_export) is True
    assert [lay.name for lay in quantized_layers(draft61, quark_export)] == [
        "model.fc", "model.layers.61.self_attn.qkv_proj", "model.layers.61.self_attn.o_proj",
        "model.layers.61.mlp.gate_up_proj", "model.layers.61.mlp.down_proj",
    ]  # fmt: skip

    entries = exclude_entries_for([named["model.fc"], named["lm_head"]], draft61)
    assert entries == ["model.fc", "lm_head"]
    assert excluded_names(draft61, entries) == {"model.fc", "lm_head"}
    assert not any(is_excluded(lay, entries) for lay in layers_in_role(draft61, "decoder_linears"))
    assert checkpoint_exclude_for([named["model.fc"], named["lm_head"]]) == ["fc", "lm_head"]


def test_a_wrong_fnmatch_rule_disagrees_with_the_replay(draft61):
    fc = by_name(draft61)["model.fc"]

    def fnmatch_rule(layer: RuntimeLayer, exclude: list[str]) -> bool:  # what one might assume: Quark's rule
        names = (layer.name, *layer.checkpoint_modules)
        return any(fnmatch.fnmatchcase(n, e) for n in names for e in exclude)

    for exclude in (["fc", "lm_head"], ["*fc"], ["*.fc"]):
        assert fnmatch_rule(fc, exclude) is True
        assert is_excluded(fc, exclude) is False, exclude


def test_re_entries_are_matched_from_the_start_but_not_anchored_at_the_end():
    layers = by_name(runtime_layers(qwen3_moe_config(n=11), qwen3_moe_tensors(11, dense=set())))
    draft = by_name(runtime_layers(DRAFT_CONFIG, draft_tensors(), target_num_layers=61))
    assert not is_excluded(draft["model.fc"], ["re:fc"])  # regex.match starts at the beginning
    assert is_excluded(draft["model.fc"], ["re:.*fc"])
    assert is_excluded(draft["model.fc"], ["re:model"])  # ... and does not need to reach the end
    assert is_excluded(layers["model.layers.10.self_attn.o_proj"], [r"re:model\.layers\.1"])
    assert not is_excluded(layers["model.layers.10.self_attn.o_proj"], [r"re:model\.layers\.1\."])
    assert not is_excluded(layers["model.layers.1.mlp.gate"], [r"model.layers.1.mlp.gat"])  # exact means equal
    assert match_reason(layers["model.layers.1.mlp.gate"], [r"re:.*mlp\.gate$"]) == ExcludeMatch(
        "model.layers.1.mlp.gate", True, (r"re:.*mlp\.gate$",), "direct"
    )


def test_partially_excluded_fused_layer_is_reported_not_crashed():
    layers = by_name(runtime_layers({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1}, llama_tensors(1)))
    qkv = layers["model.layers.0.self_attn.qkv_proj"]
    result = match_reason(qkv, ["model.layers.0.self_attn.q_proj"])
    assert isinstance(result, PartialFusedExclusion)
    assert result.matched_shards == ("model.layers.0.self_attn.q_proj",)
    assert result.unmatched_shards == ("model.layers.0.self_attn.k_proj", "model.layers.0.self_attn.v_proj")
    with pytest.raises(PartialFusedExclusionError, match="qkv_proj") as e:
        is_excluded(qkv, ["model.layers.0.self_attn.q_proj"])
    assert isinstance(e.value, QuantkitError) and "\n" not in str(e.value) and e.value.partial == result

    all_shards = [f"model.layers.0.self_attn.{x}_proj" for x in "qkv"]
    assert match_reason(qkv, all_shards) == ExcludeMatch(qkv.name, True, tuple(all_shards), "all_shards")
    # A direct match on the fused name wins over the shards (no partial error).
    assert match_reason(qkv, [qkv.name, "model.layers.0.self_attn.q_proj"]).rule == "direct"
    assert is_excluded(layers["model.layers.0.mlp.gate_up_proj"], [r"re:.*\.(gate|up)_proj$"])


def test_draft_layers_ignore_shard_names_entirely(draft61):
    qkv = by_name(draft61)["model.layers.61.self_attn.qkv_proj"]
    shards = [f"model.layers.61.self_attn.{x}_proj" for x in "qkv"]
    assert match_reason(qkv, shards[:1]) == ExcludeMatch(qkv.name, False)  # no partial error either
    assert not is_excluded(qkv, shards)


def test_one_excluded_expert_excludes_the_whole_experts_layer():
    layers = by_name(runtime_layers(qwen3_moe_config(n=3), qwen3_moe_tensors(3, dense=set())))
    one = ["model.layers.1.mlp.experts.0.down_proj"]
    assert match_reason(layers["model.layers.1.mlp.experts"], one) == ExcludeMatch(
        "model.layers.1.mlp.experts", True, tuple(one), "moe_child"
    )
    assert not is_excluded(layers["model.layers.2.mlp.experts"], one)
    # The child rule ignores re: entries, and a re: entry is matched against the experts layer's own name.
    assert not is_excluded(layers["model.layers.1.mlp.experts"], [r"re:model\.layers\.1\.mlp\.experts\.0\..*"])
    assert is_excluded(layers["model.layers.1.mlp.experts"], [r"re:model\.layers\.1\.mlp\.experts"])
    # "model.layers.1.mlp.experts_x" is not a child: the rule needs the name itself or name + "."
    assert not is_excluded(layers["model.layers.1.mlp.experts"], ["model.layers.1.mlp.experts_x"])


# Matches o_proj as written, but Mixtral's exclude renames turn ".up_proj." into ".w3." first, dropping the "j".
RENAMED_AWAY = r"re:model\.layers\.0\.self_attn\.o_pro[.up_proj.]"


def test_mixtral_renames_exclude_entries_before_matching_and_reports_them_as_written():
    layers = by_name(runtime_layers({"architectures": ["MixtralForCausalLM"], "num_hidden_layers": 1},
                                    block_sparse_tensors(1)))  # fmt: skip
    experts = layers["model.layers.0.block_sparse_moe.experts"]
    written = "model.layers.0.block_sparse_moe.experts.0.gate_proj.weight"
    assert match_reason(experts, [written]) == ExcludeMatch(experts.name, True, (written,), "moe_child")
    assert experts.exclude_renames[0] == (".gate_proj.", ".w1.")
    o_proj = layers["model.layers.0.self_attn.o_proj"]
    assert not is_excluded(o_proj, [RENAMED_AWAY])  # rewritten to ...o_pro[.w3.] before matching
    llama = by_name(runtime_layers({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1}, llama_tensors(1)))
    assert is_excluded(llama["model.layers.0.self_attn.o_proj"], [RENAMED_AWAY])


def test_malformed_exclude_lists_are_user_errors():
    layer = RuntimeLayer("model.fc", "linear", "fc")
    with pytest.raises(ExcludeListError, match='"exclude": \\[\\]'):
        is_excluded(layer, None)  # type: ignore[arg-type]
    with pytest.raises(ExcludeListError, match="not a valid regular expression"):
        is_excluded(layer, ["re:model\\.(fc"])
    with pytest.raises(ExcludeListError, match="strings"):
        is_excluded(layer, ["lm_head", 3])  # type: ignore[list-item]
    with pytest.raises(ExcludeListError, match="list of strings"):
        is_excluded(layer, "model.fc")


def test_quantized_layers_leaves_out_what_vllm_never_quantizes():
    layers = runtime_layers(deepseek_config(), deepseek_tensors())
    names = {lay.name for lay in quantized_layers(layers, [])}
    assert "model.layers.1.mlp.gate" not in names and "lm_head" not in names and "model.embed_tokens" not in names
    assert "model.layers.1.mlp.experts" in names and "model.layers.0.self_attn.fused_qkv_a_proj" in names


def test_exclude_entries_compress_whole_groups_into_anchored_patterns():
    layers = runtime_layers(qwen3_moe_config(n=4, mlp_only_layers=[0]), qwen3_moe_tensors(4, dense={0}))
    kept = [lay for lay in layers if lay.role in ("attention", "router", "lm_head", "embed_tokens")]
    entries = exclude_entries_for(kept, layers)
    assert entries == [
        "model.embed_tokens",
        r"re:model\.layers\.\d+\.self_attn\.qkv_proj$",
        r"re:model\.layers\.\d+\.self_attn\.o_proj$",
        r"re:model\.layers\.\d+\.mlp\.gate$",
        "lm_head",
    ]
    assert excluded_names(layers, entries) == {lay.name for lay in kept}
    # Without the $, the router pattern would also take the dense layer's mlp.gate_up_proj.
    assert is_excluded(by_name(layers)["model.layers.0.mlp.gate_up_proj"], [r"re:model\.layers\.\d+\.mlp\.gate"])


def test_exclude_entries_use_exact_names_for_part_of_a_group():
    layers = runtime_layers(qwen3_moe_config(n=4), qwen3_moe_tensors(4, dense=set()))
    kept = [
        lay for lay in layers if lay.name in ("model.layers.0.mlp.experts", "model.layers.3.mlp.experts", "lm_head")
    ]
    entries = exclude_entries_for(kept, layers)
    assert entries == ["model.layers.0.mlp.experts", "model.layers.3.mlp.experts", "lm_head"]
    assert excluded_names(layers, entries) == {lay.name for lay in kept}
    assert checkpoint_exclude_for(kept)[:2] == ["model.layers.0.mlp.experts.0.gate_proj",
                                                "model.layers.0.mlp.experts.0.up_proj"]  # fmt: skip


def test_exclude_entries_fall_back_to_exact_names_when_a_pattern_would_catch_more():
    # Hand-made layers: a fused layer with one shard named like the kept group, so the group pattern would
    # also exclude it through shard expansion while exact names do not.
    kept = [RuntimeLayer(f"model.layers.{i}.x.a", "linear", "attention") for i in (0, 1)]
    fused = RuntimeLayer("model.layers.5.x.ab", "fused_linear", "attention", shards=("model.layers.5.x.a",))
    layers = [*kept, fused]
    assert is_excluded(fused, [r"re:model\.layers\.\d+\.x\.a$"])
    entries = exclude_entries_for(kept, layers)
    assert entries == ["model.layers.0.x.a", "model.layers.1.x.a"]
    assert excluded_names(layers, entries) == {"model.layers.0.x.a", "model.layers.1.x.a"}
