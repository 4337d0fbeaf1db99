"""EAGLE-3 drafts whose decoder layer is an MoE block (SpecForge Qwen3MoEForCausalLMEagle3, GptOssForCausalLMEagle3):
fc, one midlayer with a router and routed experts, lm_head. No vLLM model builds them, so their layers carry the
checkpoint's own names; apply and `check --vllm off` work, a vLLM load or deploy is refused in one line."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quantkit.io.formats import FusedLayout
from quantkit.naming.archs.gpt_oss import GPT_OSS_FUSED
from quantkit.naming.builder import CheckpointModules, Slot, check_layer_range, decoder_layer, require_modules
from quantkit.naming.family import DraftLayout, Family, MoeLayout
from quantkit.naming.layers import CheckpointLayoutError, RuntimeLayer

# The code the names follow: SpecForge's training models, which save the checkpoint (no vLLM file builds these).
SOURCE = "SpecForge specforge/modeling/draft/qwen3_moe_eagle.py, gpt_oss_eagle.py"

# Layouts, as SpecForge builds and saves them (sgl-project/SpecForge):
# - Qwen3MoEForCausalLMEagle3 (specforge/modeling/draft/qwen3_moe_eagle.py; configs/qwen3-30B-A3B-eagle3-moe-draft.json,
#   model_type qwen3_moe, num_experts 128, num_hidden_layers 1): top-level `embed_tokens`, `fc`, `hidden_norm`, `norm`,
#   `lm_head`, `d2t`, `t2d`; `midlayer` a Qwen3MoeDecoderLayer with Llama attention `self_attn.{q,k,v,o}_proj` (plus
#   `q_norm` / `k_norm`), `input_layernorm`, `post_attention_layernorm`, and `mlp` a SpecForgeQwen3MoeSparseMoeBlock:
#   router `mlp.gate` [E, H] and the experts stacked as `mlp.gate_weight` / `up_weight` / `down_weight` (its per-expert
#   state_dict conversion is commented out). quantkit.io.formats' `fused-experts` source format splits them per expert
#   into `mlp.experts.<e>.{gate,up,down}_proj` as SpecForge's SGLang loader does; a draft re-saved per expert is read
#   as it is.
# - GptOssForCausalLMEagle3 (specforge/modeling/draft/gpt_oss_eagle.py; configs/gpt-oss-20B-eagle3-moe.json,
#   model_type gpt_oss, num_local_experts 16): LlamaForCausalLMEagle3 (llama3_eagle.py: `midlayer.hidden_norm` inside
#   the layer) with `midlayer.mlp = GptOssMLP(config)` from transformers: router `mlp.router` (weight [E, H] and bias)
#   and fused experts `mlp.experts.gate_up_proj` [E, H, 2I] / `down_proj` [E, I, H] with biases, split per expert by
#   the gpt-oss `fused-experts` decoding into `mlp.experts.<e>.gate_up_proj` / `down_proj` (weight and bias).
# Runtime names: vLLM 0.32 maps none of these architectures (vllm/model_executor/models/registry.py
# `_SPECULATIVE_DECODING_MODELS`: its EAGLE-3 drafts are llama_eagle3, qwen3_eagle3 and deepseek_eagle3, all with a
# dense MLP), so there is no vLLM module tree to name them after. The names here are the checkpoint's own modules: the
# ones SpecForge's SGLang loader (specforge/modeling/draft/qwen3_moe_eagle3_sglang_plugin.py
# Qwen3MoEForCausalLMEagle3.load_weights) looks parameters up by, after prepending `model.` and fusing q/k/v into
# qkv_proj. q/k/v stay three layers here, so a recipe keeps or quantizes them together (fp8-draft quantizes every
# attention projection). Not verified: that plugin builds the midlayer with the quant prefix `model` (not
# `model.midlayer`), so the names SGLang's quantization config matches `exclude` against are `model.self_attn.*`,
# `model.mlp.*`, `model.qkv_proj`; the `exclude` apply writes names checkpoint modules, and nothing here replays
# SGLang's matcher.
_ROUTER = {"qwen3_moe": "mlp.gate", "gpt_oss": "mlp.router"}
_STACKED = {"gate_weight", "up_weight", "down_weight"}
_ATTN = tuple(Slot(f"self_attn.{p}_proj", "linear", "attention", (f"self_attn.{p}_proj",)) for p in "qkvo")
NO_VLLM_MODEL = (  # formatted by quantkit.naming.archs.require_vllm_model
    "vLLM 0.32 builds no EAGLE-3 draft with an MoE decoder layer (vllm/model_executor/models/registry.py _SPECULATIVE_DECODING_MODELS has no "
    "{arch}; its EAGLE-3 drafts all have a dense MLP), so it can neither load nor serve this draft; quantkit checks it "
    "structurally only: quantkit check {folder} --vllm off"
)


def moe_draft_layers(config: Mapping[str, Any], ckpt: CheckpointModules, _target: int | None) -> list[RuntimeLayer]:
    model_type = str(config.get("model_type"))
    if model_type not in _ROUTER:
        raise CheckpointLayoutError(
            f"{SOURCE}: an MoE-layer EAGLE-3 draft with model_type {model_type!r}; SpecForge's are qwen3_moe "
            f"(Qwen3MoEForCausalLMEagle3) and gpt_oss (GptOssForCausalLMEagle3): fix config.json's model_type"
        )
    # SpecForge builds one midlayer; its SGLang loader raises "EAGLE3 currently only supports 1 layer"
    require_one_midlayer(config, SOURCE)
    hint = f"{SOURCE} save fc.weight, midlayer.*, lm_head.weight (no model. prefix); re-save the draft in that layout"
    # Both SpecForge classes build fc unconditionally (target hidden states x 3 -> hidden)
    out = draft_inputs(ckpt, SOURCE, hint)
    router = _ROUTER[model_type]
    out += decoder_layer(ckpt, (*_ATTN, Slot(router, "router", "router", (router,))), "midlayer", "midlayer", 0, {},
                         SOURCE, hint=hint)  # fmt: skip
    # The experts: per expert (decoded, or re-saved so), fused 3-D under mlp.experts (gpt-oss as stored), or stacked
    # `mlp.{gate,up,down}_weight` (SpecForge's Qwen3-MoE block as stored: the module `midlayer.mlp` itself)
    experts = ckpt.experts_under("midlayer.mlp.experts")
    if not experts and ckpt.params.get("midlayer.mlp", set()) >= _STACKED:
        experts = ("midlayer.mlp",)
    if not experts:
        raise CheckpointLayoutError(
            f"checkpoint has no experts under midlayer.mlp (experts.<e>.*_proj, experts.gate_up_proj or "
            f"{'/'.join(sorted(_STACKED))}, as {SOURCE} save them); check that config.json belongs to these weights"
        )
    out.append(RuntimeLayer("midlayer.mlp.experts", "moe", "experts", (), ckpt.take(experts), layer_index=0,
                            source=SOURCE))  # fmt: skip
    check_layer_range(ckpt, "layers", 0, SOURCE)  # a layers.<i>.* tensor is not a SpecForge MoE draft's
    out.append(draft_head(ckpt, SOURCE, hint))
    return out


def require_one_midlayer(config: Mapping[str, Any], source: str) -> None:
    """The training classes of MoE-layer EAGLE-3 drafts build exactly one decoder layer (midlayer.*)."""
    n = config.get("num_hidden_layers")
    if n != 1:
        raise CheckpointLayoutError(
            f"draft config.json has num_hidden_layers={n!r}, but {source} build exactly one decoder layer (midlayer.*); "
            "set it to 1"
        )


def draft_inputs(ckpt: CheckpointModules, source: str, hint: str) -> list[RuntimeLayer]:
    """embed_tokens where the draft ships one (without it the target's embedding is shared) and fc, which it must."""
    out: list[RuntimeLayer] = []
    if ckpt.has("embed_tokens"):
        out.append(RuntimeLayer("embed_tokens", "embedding", "embed_tokens", (), ckpt.take(["embed_tokens"]),
                                quantizable=False, source=source))  # fmt: skip
    out.append(RuntimeLayer("fc", "linear", "fc", (), require_modules(ckpt, ["fc"], "layer fc", source, hint),
                            source=source))  # fmt: skip
    return out


def draft_head(ckpt: CheckpointModules, source: str, hint: str) -> RuntimeLayer:
    """lm_head, kept unquantized as for every draft layout (vLLM cannot load a quantized EAGLE-3 draft lm_head)."""
    head = require_modules(ckpt, ["lm_head"], "layer lm_head", source, hint)
    return RuntimeLayer("lm_head", "lm_head", "lm_head", (), head, quantizable=False, source=source)


# Quark's llama template, as for every draft layout (quantkit.naming.archs.eagle3_llama says why): with fp8-draft's
# per-shard path, Quark's file-to-file quantization (apply/quark_engine.py run_per_shard, direct_quantize_checkpoint)
# quantizes the per-expert layout byte-identically to the native executor (tests/test_families_moe_drafts.py). The
# stacked (Qwen3-MoE) and fused (gpt-oss) layouts as SpecForge saves them are a `fused-experts` source, which only the
# native executor decodes: `--engine quark` on them is refused in one line naming `--engine native` (apply/run.py
# plan_apply).
# SpecForge's Qwen3-MoE EAGLE-3 draft (specforge/modeling/draft/qwen3_moe_eagle.py
# SpecForgeQwen3MoeSparseMoeBlock: `gate_weight` / `up_weight` [E, I, H] and `down_weight` [E, H, I] stacked from
# the per-expert Linears, its per-expert state_dict conversion commented out, so the draft saves them stacked).
# SpecForge's SGLang loader (qwen3_moe_eagle3_sglang_plugin.py load_weights, `hard_coded_mapping`) splits them as
# `loaded_weight[expert_id]` into `mlp.experts.<e>.gate_proj.weight` / `up_proj` / `down_proj`: the same split,
# no transpose. The gpt-oss draft stores its experts as gpt-oss does (GPT_OSS_FUSED).
SPECFORGE_STACKED = FusedLayout("qwen3_moe", {
    ".mlp.gate_weight": (("gate_proj", "weight", "all"),),
    ".mlp.up_weight": (("up_proj", "weight", "all"),),
    ".mlp.down_weight": (("down_proj", "weight", "all"),),
}, transposed=False, experts_key="num_experts", container=".mlp.experts")  # fmt: skip


FAMILY = Family(
    "eagle3_moe", ("Qwen3MoEForCausalLMEagle3", "GptOssForCausalLMEagle3"), SOURCE, moe_draft_layers,
    quark_templates={"*": "llama"},
    # no vLLM model builds these drafts, so no router of vLLM's to name (router None: no routing method)
    moe=MoeLayout(("num_experts", "num_local_experts"), router=None, fused=(SPECFORGE_STACKED, GPT_OSS_FUSED)),
    draft=DraftLayout(vllm_refusal=NO_VLLM_MODEL),
)  # fmt: skip
