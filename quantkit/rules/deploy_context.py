"""The deploy rules' view of a deployment (both checkpoints' config and tensor headers, the serving options), the
config readers they share with deploy's environment, and the vLLM source of each deploy rule.

Three deploy rules (TP split, platform MXFP4, vocabulary) still run on this view beside check's implementations of
the same facts: merging them changes what deploy reports on a checkpoint without a quantization_config, so it waits
for that decision. The config readers are quantkit.io.config's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from quantkit.io.config import text_config
from quantkit.io.headers import TensorInfo
from quantkit.results.check import Finding


@dataclass
class DeployContext:
    """What the known-bad rules look at: both checkpoints (config + tensor headers) and the serving options."""

    target_path: str
    target_config: dict[str, Any]
    target_tensors: dict[str, TensorInfo]
    draft_path: str | None
    draft_config: dict[str, Any] | None
    draft_tensors: dict[str, TensorInfo] | None
    platform: str
    tp: int
    kv_cache_dtype: str
    num_speculative_tokens: int
    max_model_len: int | None

    @property
    def target_text(self) -> dict[str, Any]:
        return text_config(self.target_config)

    @property
    def draft_layer(self) -> dict[str, Any]:
        assert self.draft_config is not None
        return draft_layer_config(self.draft_config)


# --- config helpers ----------------------------------------------------------------------------------------------


def draft_layer_config(config: dict[str, Any]) -> dict[str, Any]:
    """The Llama-style layer config of an EAGLE-3 draft (speculators format keeps it in transformer_layer_config)."""
    layer = config.get("transformer_layer_config")
    return layer if isinstance(layer, dict) else config


# --- the deploy rules' sources -----------------------------------------------------------------------------------


def finding(rule: str, severity: str, code: str, where: str, message: str, fix: str) -> Finding:
    return Finding(severity=severity, code=code, layer_or_tensor=where, message=message, fix=fix, source=SOURCES[rule])


SOURCES: dict[str, str] = {
    "multi-node": "vllm/distributed/utils.py get_pp_indices; docs/serving/parallelism_scaling.md (TP = GPUs per node, "
    "PP = nodes, --distributed-executor-backend ray); examples/online_serving/multi-node-serving.sh",
    "tp-mxfp4-group": "vllm/model_executor/layers/quantization/quark/schemes/quark_ocp_mx.py create_weights (input "
    "per partition % 32); vllm/model_executor/layers/quantization/quark/quark_moe.py "
    "QuarkOCP_MX_MoEMethod.create_weights (intermediate_size_per_partition // 32 scales); "
    "vllm/model_executor/layers/linear.py RowParallelLinear",
    "kv-fp8-e5m2-quark": 'vllm/model_executor/layers/attention/attention.py _init_kv_cache_quant ("fp8_e5m2 '
    "kv-cache is not supported with fp8 checkpoints\", for any KV method but compressed-tensors'; "
    "vllm/model_executor/layers/quantization/quark/quark.py get_quant_method_target gives every "
    "Attention layer a QuarkKVCacheMethod); vllm/config/speculative.py SpeculativeConfig."
    'kv_cache_dtype ("When `None`, the draft inherits the target model\'s `--kv-cache-dtype`")',
    "kv-fp8-draft-unscaled": "vllm/config/speculative.py SpeculativeConfig.kv_cache_dtype and "
    "vllm/v1/spec_decode/llm_base_proposer.py _create_draft_vllm_config (the draft inherits "
    "the target's KV dtype); vllm/model_executor/layers/quantization/kv_cache.py "
    'BaseKVCacheMethod.process_weights_after_loading ("Using KV cache scaling factor 1.0 for '
    'fp8_e4m3"); history: vllm-project/vllm issue #21177 (EAGLE-3 with fp8 KV cache failed '
    "with a dtype mismatch), fixed by PR #24505",
    "kv-fp8-cpu-head-size": 'vllm/v1/attention/backends/cpu_attn.py _get_attn_isa ("FP8 KV cache requires head_size '
    'divisible by 32 on CPU", "FP8 KV cache on CPU requires x86 with AVX-512 or AMX")',
    "tp-heads": 'vllm/config/model.py ModelConfig.verify_with_parallel_config ("must be divisible by tensor parallel '
    'size"); vllm/model_executor/models/llama.py LlamaAttention.__init__ (KV heads % tp, or tp % KV heads '
    "when replicated); vllm/config/speculative.py draft_tensor_parallel_size (1 or the target's)",
    "num-speculative-tokens-range": 'vllm/config/speculative.py SpeculativeConfig._verify_args ("Expected '
    'num_speculative_tokens to be greater"); ROCm/ATOM PR #631 (Kimi-K2.5 EAGLE-3: '
    "--num-speculative-tokens, recommended: 3)",
    "draft-vocab-mismatch": "vllm/model_executor/models/llama_eagle3.py Eagle3LlamaForCausalLM (draft_id_to_target_id "
    "from d2t when draft_vocab_size != the target's vocab; compute_logits maps "
    "arange(draft_vocab) + d2t into the target vocabulary)",
    "max-model-len-beyond-positions": 'vllm/config/model.py _get_and_verify_max_len ("User-specified max_model_len'
    "\" greater than the derived one, from the text config's length keys times "
    "the RoPE factor: vllm/transformers_utils/model_arch_config_convertor.py "
    "derive_max_model_len_and_key)",
    "platform-mxfp4": "vllm/model_executor/layers/fused_moe/oracle/mxfp4.py select_mxfp4_moe_backend (native AITER "
    'W4A4 on gfx950, W4A16 or emulation elsewhere, no CPU backend: "No MXFP4 MoE backend supports '
    'the deployment configuration")',
}
