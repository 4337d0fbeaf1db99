"""Issue 22's draft and KV-cache rules (quantkit.rules.serving, quantkit.rules.kv_cache) and the manifest settings they
need: each rule fires on a crafted checkpoint or manifest that breaks it and not on one that keeps it (the firing cases
are also in tests/unit/test_deploy.py CASES), and where vLLM has a function that decides the same thing, quantkit's answer
is compared with vLLM's own (QuarkConfig.from_config + QuarkKVCacheMethod.validate_kv_cache_config for the KV spec,
get_quant_method_target for MLA, ChannelQuantScaleParameter's loader for the FP8 scale shape, map_mxfp4_backend and
MoEBackend for the pin). Those import vLLM's Quark module once (module fixture).
"""

from __future__ import annotations

import copy
import json
from typing import get_args

import pytest

from quantkit.deploy.run import DeployInputError
from quantkit.deploy.run import run as deploy_manifest
from quantkit.rules.kv_cache import kv_spec_problem
from quantkit.rules.serving import ROCM_DRAFT_ATTENTION, ROCM_MXFP4_MOE_PIN
from tests.conftest import require_vllm
from tests.unit.test_deploy import (
    _fp8_down_proj,
    _mla_quark_target_fp8_kv,
    _quark_config,
    codes,
    edit_config,
    mxfp4_moe,
    pair,  # noqa: F401  (fixture)
)

KV = {"dtype": "fp8_e4m3", "qscheme": "per_tensor", "is_dynamic": False, "symmetric": True}


def spec(m) -> dict:
    return json.loads(m.argv[m.argv.index("--speculative-config") + 1])


# --- drafter attention backend, block size, FP8 draft rules (deploy, header-only) ------------------------------


def test_drafter_attention_backend_on_rocm(pair):  # noqa: F811
    t, d = pair
    for platform in ("gfx950", "gfx942"):
        m = deploy_manifest(d, target=t, platform=platform)
        assert spec(m)["attention_backend"] == ROCM_DRAFT_ATTENTION
        assert not [f for f in m.findings if f.code == "draft-attention-backend-rocm"]
    for chosen, fires in (("auto", True), ("rocm_attn", True), ("TRITON_ATTN", False)):
        m = deploy_manifest(d, target=t, platform="gfx950", draft_attention_backend=chosen)
        assert (("warning", "draft-attention-backend-rocm") in codes(m)) == fires, chosen
        assert spec(m).get("attention_backend") == (None if chosen == "auto" else chosen.upper())
    m = deploy_manifest(d, target=t, platform="cpu")  # not a ROCm rule: vLLM's own pick elsewhere
    assert "attention_backend" not in spec(m) and not [f for f in m.findings if f.code.startswith("draft-att")]


def test_block_size_1_only_with_a_draft(pair):  # noqa: F811
    t, d = pair
    m = deploy_manifest(d, target=t, platform="gfx950", block_size=1)
    assert ("error", "draft-block-size-1") in codes(m) and not m.ok
    assert m.argv[m.argv.index("--block-size") + 1] == "1"
    assert ("error", "draft-block-size-1") not in codes(deploy_manifest(d, target=t, platform="gfx950", block_size=16))
    assert ("error", "draft-block-size-1") not in codes(deploy_manifest(t, platform="gfx950", block_size=1))
    with pytest.raises(DeployInputError, match="block_size 0"):
        deploy_manifest(t, block_size=0)
    with pytest.raises(DeployInputError, match="dtype 'fp16'"):
        deploy_manifest(t, dtype="fp16")


def test_fp8_draft_rules_keep_cases(pair):  # noqa: F811
    t, d = pair
    _fp8_down_proj(d, ["out"])
    m = deploy_manifest(d, target=t, platform="gfx950")
    assert not {c for _, c in codes(m)} & {"fp8-channel-scale-1d", "fp8-rowwise-bf16-output", "platform-fp8-fnuz"}
    edit_config(t, torch_dtype="float16")
    assert ("warning", "fp8-rowwise-bf16-output") in codes(deploy_manifest(d, target=t, platform="gfx942"))
    # --dtype bfloat16 is the fix; CUDA and CPU have no hipBLASLt rowwise kernel (rule is ROCm only)
    fixed = deploy_manifest(d, target=t, platform="gfx942", dtype="bfloat16")
    assert ("warning", "fp8-rowwise-bf16-output") not in codes(fixed) and "--dtype" in fixed.argv
    assert ("warning", "fp8-rowwise-bf16-output") not in codes(deploy_manifest(d, target=t, platform="cuda"))
    assert ("info", "platform-fp8-fnuz") in codes(fixed)
    _fp8_down_proj(d, ["out", 1])
    bad = [f for f in deploy_manifest(d, target=t, platform="gfx950").findings if f.code == "fp8-channel-scale-1d"]
    assert [f.layer_or_tensor for f in bad] == ["midlayer.mlp.down_proj.weight_scale"]


# --- KV cache ----------------------------------------------------------------------------------------------------


def _qc(group, lqc):
    qc = _quark_config(kv_cache_group=group)
    qc["layer_quant_config"] = lqc
    return qc


KV_CASES = {
    "no kv_cache_group": _qc([], {}),
    "group = keys": _qc(["*k_proj", "*v_proj"], {"*k_proj": {"output_tensors": KV}, "*v_proj": {"output_tensors": KV}}),
    "runtime-name keys match the patterns": _qc(
        ["*k_proj"], {"model.layers.0.self_attn.k_proj": {"output_tensors": KV}}
    ),
    "group matches no key": _qc(["*k_proj", "*v_proj"], {"*o_proj": {"output_tensors": KV}}),
    "different output_tensors": _qc(
        ["*k_proj", "*v_proj"],
        {"*k_proj": {"output_tensors": KV}, "*v_proj": {"output_tensors": {**KV, "is_dynamic": True}}},
    ),
    "empty KV spec": _qc(["*k_proj"], {"*k_proj": {"output_tensors": None}}),
    "fp8_e5m2 KV spec": _qc(["*k_proj"], {"*k_proj": {"output_tensors": {**KV, "dtype": "fp8_e5m2"}}}),
    "per_channel KV spec": _qc(["*k_proj"], {"*k_proj": {"output_tensors": {**KV, "qscheme": "per_channel"}}}),
}


@pytest.fixture(scope="module")
def vllm_quark():
    require_vllm()
    from vllm.model_executor.layers.attention import Attention
    from vllm.model_executor.layers.attention.mla_attention import MLAAttention
    from vllm.model_executor.layers.quantization.quark.quark import QuarkConfig, QuarkKVCacheMethod

    return QuarkConfig, QuarkKVCacheMethod, Attention, MLAAttention


@pytest.mark.vllm
@pytest.mark.parametrize("case", list(KV_CASES))
def test_kv_spec_agrees_with_vllm(vllm_quark, case):
    """kv_spec_problem against vLLM's QuarkConfig.from_config and QuarkKVCacheMethod.validate_kv_cache_config (which
    each Attention layer runs when it is built)."""
    QuarkConfig, QuarkKVCacheMethod, _, _ = vllm_quark
    qc = KV_CASES[case]
    try:
        QuarkKVCacheMethod.validate_kv_cache_config(QuarkConfig.from_config(copy.deepcopy(qc)).kv_cache_config)
        vllm_error = None
    except (ValueError, NotImplementedError) as e:
        vllm_error = str(e)
    ours = kv_spec_problem(copy.deepcopy(qc))
    assert (ours is None) == (vllm_error is None), (ours, vllm_error)


@pytest.mark.vllm
def test_mla_attention_gets_no_quark_kv_method(vllm_quark):
    """Why an MLA target under Quark cannot carry KV scales, from vLLM: MLAAttention gets no quant method (so no
    QuarkKVCacheMethod: no scale parameters, no validation) and the scale mapper renames only k/v/q_proj scales."""
    QuarkConfig, QuarkKVCacheMethod, Attention, MLAAttention = vllm_quark
    cfg = QuarkConfig.from_config(copy.deepcopy(KV_CASES["group = keys"]))
    assert cfg.get_quant_method_target("model.layers.0.self_attn.attn", MLAAttention) == (None, None, None)
    assert cfg.get_quant_method_target("model.layers.0.self_attn.attn", Attention)[2] is QuarkKVCacheMethod
    mapper = QuarkConfig.get_cache_scale_mapper()
    assert mapper._map_name("model.layers.0.self_attn.k_proj.output_scale") == "model.layers.0.self_attn.attn.k_scale"
    for mla_name in (
        "model.layers.0.self_attn.kv_b_proj.output_scale",
        "model.layers.0.self_attn.kv_a_proj_with_mqa.output_scale",
    ):
        assert mapper._map_name(mla_name) == mla_name  # never becomes an attn.k_scale / v_scale


def test_kv_rules_fire_and_keep(pair):  # noqa: F811
    t, d = pair
    edit_config(d, quantization_config=KV_CASES["fp8_e5m2 KV spec"])
    assert ("error", "kv-quark-spec") in codes(deploy_manifest(d, target=t, platform="gfx950"))
    edit_config(d, quantization_config=KV_CASES["group = keys"])
    assert ("error", "kv-quark-spec") not in codes(deploy_manifest(d, target=t, platform="gfx950"))
    # an MLA target under Quark: FP8 KV with scale 1.0 (warning), or just "cannot carry scales" (info) with auto KV
    _mla_quark_target_fp8_kv(pair)
    m = deploy_manifest(d, target=t, platform="gfx950", kv_cache_dtype="fp8")
    mla = [f for f in m.findings if f.code == "kv-scales-mla-quark"]
    assert len(mla) == 1 and mla[0].severity == "warning" and "scale 1.0" in mla[0].message
    assert [
        f.severity for f in deploy_manifest(d, target=t, platform="gfx950").findings if f.code == "kv-scales-mla-quark"
    ] == ["info"]
    # vLLM never validates an MLA model's Quark KV spec (no QuarkKVCacheMethod): e5m2 neither raises nor is reported
    qc = json.loads((t / "config.json").read_text())["quantization_config"]
    qc["layer_quant_config"]["*k_proj"]["output_tensors"]["dtype"] = "fp8_e5m2"
    qc["layer_quant_config"]["*v_proj"]["output_tensors"]["dtype"] = "fp8_e5m2"
    edit_config(t, quantization_config=qc)
    edit_config(d, quantization_config=None)
    m = deploy_manifest(d, target=t, platform="gfx950", kv_cache_dtype="fp8_e5m2")
    assert not {c for _, c in codes(m)} & {"kv-quark-spec", "kv-fp8-e5m2-quark"}
    edit_config(t, kv_lora_rank=None)  # the same config on a non-MLA target: vLLM raises for e5m2 KV
    m = deploy_manifest(d, target=t, platform="gfx950", kv_cache_dtype="fp8_e5m2")
    assert ("error", "kv-fp8-e5m2-quark") in codes(m) and ("warning", "kv-scales-mla-quark") not in codes(m)


# --- the MoE backend pin ------------------------------------------------------------------------------------------


def test_pin_backends(tiny, tmp_path):
    folder = mxfp4_moe(tiny, tmp_path / "moe-mxfp4")
    for platform in ("gfx950", "gfx942"):
        m = deploy_manifest(folder, platform=platform, pin_backends=True)
        assert m.argv[m.argv.index("--moe-backend") + 1] == ROCM_MXFP4_MOE_PIN
        assert "--moe-backend" not in deploy_manifest(folder, platform=platform).argv  # opt-in
    assert "--moe-backend" not in deploy_manifest(folder, platform="cpu", pin_backends=True).argv
    assert "--moe-backend" not in deploy_manifest(tiny / "target", platform="gfx950", pin_backends=True).argv


@pytest.mark.vllm
def test_pin_is_a_vllm_moe_backend_that_never_emulates():
    """The pin is a value vLLM 0.32's --moe-backend takes (MoEBackend) and maps to every AITER MXFP4 kernel but not
    EMULATION (oracle/mxfp4.py map_mxfp4_backend)."""
    require_vllm()
    from vllm.config.kernel import MoEBackend
    from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import Mxfp4MoeBackend, map_mxfp4_backend

    assert ROCM_MXFP4_MOE_PIN in get_args(MoEBackend)
    mapped = set(map_mxfp4_backend(ROCM_MXFP4_MOE_PIN))
    assert {Mxfp4MoeBackend.AITER_MXFP4_MXFP4, Mxfp4MoeBackend.AITER_TRITON_MXFP4_BF16} <= mapped
    assert Mxfp4MoeBackend.EMULATION not in mapped


@pytest.mark.vllm
def test_vllm_loader_rejects_a_2d_per_channel_scale(vllm_quark, monkeypatch):
    """fp8-channel-scale-1d against vLLM's own loader: the 1-D ChannelQuantScaleParameter quark_w8a8_fp8.py makes
    takes an [out] tensor and asserts on [out, 1] (TP rank and size stubbed to one rank: no process group here)."""
    import torch
    import vllm.model_executor.parameter as parameter

    monkeypatch.setattr(parameter, "get_tensor_model_parallel_rank", lambda: 0)
    monkeypatch.setattr(parameter, "get_tensor_model_parallel_world_size", lambda: 1)
    p = parameter.ChannelQuantScaleParameter(data=torch.empty(8), output_dim=0, weight_loader=lambda *a, **k: None)
    p.load_column_parallel_weight(torch.ones(8))
    with pytest.raises(AssertionError):
        p.load_column_parallel_weight(torch.ones(8, 1))
