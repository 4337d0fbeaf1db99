"""EAGLE-3 drafts from TorchSpec whose midlayer MLP is an MoE block (`use_moe: true`): Glm4MoeForCausalLMEagle3 (GQA
attention) and the Kimi-K2.5 MoE draft (Eagle3DeepseekV2ForCausalLM with MLA attention), or any LlamaForCausalLMEagle3
config with `use_moe: true`. fc, one midlayer with a DeepSeek-V3-style router, fused routed experts and a shared
expert, lm_head. No vLLM class builds them: apply and `check --vllm off` work, a vLLM load or deploy is refused in one
line."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quantkit.io.formats import FusedLayout
from quantkit.naming.archs.eagle3_moe import draft_head, draft_inputs, require_one_midlayer
from quantkit.naming.builder import CheckpointModules, Slot, check_layer_range, decoder_layer
from quantkit.naming.family import DraftLayout, Family, Key, MoeLayout, Variant
from quantkit.naming.layers import CheckpointLayoutError, RuntimeLayer

# The code the names follow: TorchSpec's training models, which save the checkpoint (no vLLM file builds these).
SOURCE = "TorchSpec torchspec/models/draft/moe.py, llama3_eagle.py, deepseek_eagle.py, glm4_moe_eagle.py"

# What TorchSpec (lightseekorg/TorchSpec, branch dev/dpsk-mtp, commit 3bd756e7) builds and saves:
# - configs/draft_models/glm4_moe_eagle3.json: architectures ["Glm4MoeForCausalLMEagle3"], model_type glm4_moe,
#   use_moe true, n_routed_experts 128, num_experts_per_tok 8, moe_intermediate_size 1408, n_shared_experts 1, n_group,
#   topk_group, routed_scaling_factor, scoring_func sigmoid, num_attention_heads 96, num_key_value_heads 8, head_dim
#   128, num_hidden_layers 1. torchspec/models/draft/glm4_moe_eagle.py: `class Glm4MoeForCausalLMEagle3(
#   LlamaForCausalLMEagle3)` with config_class Glm4MoeConfig ("GQA attention + MoE FFN (set use_moe: true)").
# - configs/draft_models/kimi_k25_eagle3_moe.json: architectures ["Eagle3DeepseekV2ForCausalLM"], model_type
#   kimi_k2, use_moe true, q_lora_rank 1536, kv_lora_rank 512, n_routed_experts 384, n_shared_experts 1: TorchSpec's
#   Eagle3DeepseekV2ForCausalLM (deepseek_eagle.py), whose midlayer attention is DeepSeekMLAAttention (q_a_proj,
#   q_a_layernorm, q_b_proj (q_proj without q_lora_rank), kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj).
#   The same architecture string without use_moe is the dense MLA draft vLLM builds (quantkit.naming.archs.eagle3_mla).
# - The top level (llama3_eagle.py LlamaForCausalLMEagle3, deepseek_eagle.py Eagle3DeepseekV2ForCausalLM):
#   `embed_tokens`, `midlayer` (self_attn with 2 x hidden inputs, `hidden_norm`, `input_layernorm`,
#   `post_attention_layernorm`, `mlp`), `fc` [hidden, 3 x target_hidden], `norm`, `lm_head` [draft_vocab, hidden], and
#   the buffers `t2d` / `d2t` where draft_vocab_size differs from vocab_size.
# - `use_moe: true` makes `midlayer.mlp` a DeepseekV3MoEBlock (torchspec/models/draft/moe.py; the switch is in
#   llama3_eagle.py and deepseek_eagle.py, tests/test_moe_draft.py asserts type(model.midlayer.mlp).__name__ ==
#   "DeepseekV3MoEBlock"): `gate` a DeepseekV3TopkRouter (`weight` [E, H] and the persistent buffer
#   `e_score_correction_bias` [E]), `experts` a MoEExperts with `gate_up_proj` [E, H, 2 x moe_intermediate] (gate and
#   up fused, split after the GEMM: gate the first half, up the second) and `down_proj` [E, moe_intermediate, H], and
#   `shared_experts` a SwiGLUMLP (gate_proj / up_proj / down_proj, intermediate moe_intermediate x n_shared_experts)
#   when n_shared_experts > 0. training/ep_utils.py gather_ep_full_state_dict saves expert-parallel experts whole
#   ([E, ...]).
# - tools/convert_to_hf.py writes `hf_model.state_dict()` as it is (`midlayer.*`), or with --export-for-vllm renames
#   `midlayer.` to `layers.0.`; with vocabulary pruning it adds d2t / t2d.
# Runtime names: vLLM 0.32 builds none of these (vllm/model_executor/models/registry.py _SPECULATIVE_DECODING_MODELS has
# no Glm4MoeForCausalLMEagle3; it maps LlamaForCausalLMEagle3 to llama_eagle3.py and Eagle3DeepseekV2ForCausalLM to
# deepseek_eagle3.py, whose decoder layers build a dense LlamaMLP / DeepseekV2MLP: "Always uses MLP (not MoE)"), so the
# layers carry the checkpoint's own names, as quantkit.naming.archs.eagle3_moe's do.
NO_VLLM_MODEL = (  # formatted by quantkit.naming.archs.require_vllm_model
    "vLLM 0.32 has no class for {arch} with an MoE midlayer (TorchSpec's use_moe: true): vllm/model_executor/models/"
    "registry.py maps no Glm4MoeForCausalLMEagle3, and the classes it maps LlamaForCausalLMEagle3 and "
    "Eagle3DeepseekV2ForCausalLM to (llama_eagle3.py, deepseek_eagle3.py) build a dense MLP, so it can neither load "
    "nor serve this draft; quantkit checks it structurally only: quantkit check {folder} --vllm off"
)
USE_MOE = Key("use_moe", False, equals=True)  # the switch of llama3_eagle.py / deepseek_eagle.py
_MLA = "Eagle3DeepseekV2ForCausalLM"  # TorchSpec's AutoEagle3DraftModel maps DeepseekV3Config to it: MLA attention
_GQA = tuple(Slot(f"self_attn.{p}_proj", "linear", "attention", (f"self_attn.{p}_proj",)) for p in "qkvo")
_ROUTER = Slot("mlp.gate", "router", "router", ("mlp.gate",))  # weight and e_score_correction_bias: one module
_SHARED = tuple(Slot(f"mlp.shared_experts.{p}_proj", "linear", "shared_experts", (f"mlp.shared_experts.{p}_proj",))
                for p in ("gate", "up", "down"))  # fmt: skip


def _attention(config: Mapping[str, Any]) -> tuple[Slot, ...]:
    """DeepSeekMLAAttention's projections for the DeepSeek class (q_a/q_b with q_lora_rank, else q_proj), Llama's
    q/k/v/o for the others. q/k/v stay separate layers: no vLLM packed mapping fuses them for a model vLLM lacks."""
    if _MLA not in (config.get("architectures") or ()):
        return _GQA
    q = ("q_a_proj", "q_b_proj") if config.get("q_lora_rank") is not None else ("q_proj",)
    return tuple(Slot(f"self_attn.{p}", "linear", "attention", (f"self_attn.{p}",))
                 for p in (*q, "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"))  # fmt: skip


def torchspec_moe_layers(config: Mapping[str, Any], ckpt: CheckpointModules, _t: int | None) -> list[RuntimeLayer]:
    archs = ", ".join(str(a) for a in config.get("architectures") or ())
    if not USE_MOE.of(config):  # only Glm4MoeForCausalLMEagle3 reaches here without it
        raise CheckpointLayoutError(
            f"config.json says {archs} without use_moe: true, so TorchSpec builds its midlayer MLP dense "
            "(glm4_moe_eagle.py: 'set use_moe: true'); add \"use_moe\": true for an MoE-layer draft, or for a dense "
            'one set architectures to ["LlamaForCausalLMEagle3"], which vLLM builds'
        )
    require_one_midlayer(config, SOURCE)  # LlamaForCausalLMEagle3 / Eagle3DeepseekV2ForCausalLM build one midlayer
    # tools/convert_to_hf.py saves `midlayer.*`, or `layers.0.*` with --export-for-vllm
    prefix = "midlayer" if any(m.startswith("midlayer.") for m in ckpt.params) else "layers.0"
    hint = f"{SOURCE} save fc.weight, midlayer.* (or layers.0.*), lm_head.weight (no model. prefix); re-save the draft in that layout"
    out = draft_inputs(ckpt, SOURCE, hint)
    # n_shared_experts absent: transformers' Glm4MoeConfig / DeepseekV3Config default it to 1, a LlamaConfig has none;
    # the checkpoint then says whether the block was built with one
    shared = config.get("n_shared_experts")
    has_shared = ckpt.has(f"{prefix}.mlp.shared_experts.down_proj") if shared is None else bool(shared)
    slots = (*_attention(config), _ROUTER, *(_SHARED if has_shared else ()))
    out += decoder_layer(ckpt, slots, prefix, prefix, 0, {}, SOURCE, hint=hint)
    experts = ckpt.experts_under(f"{prefix}.mlp.experts")
    if not experts:
        raise CheckpointLayoutError(
            f"checkpoint has no experts under {prefix}.mlp.experts (gate_up_proj and down_proj, as {SOURCE} save them, "
            "or experts.<e>.*_proj); check that config.json belongs to these weights"
        )
    out.append(RuntimeLayer(f"{prefix}.mlp.experts", "moe", "experts", (), ckpt.take(experts), layer_index=0,
                            source=SOURCE))  # fmt: skip
    check_layer_range(ckpt, "layers", 1 if prefix == "layers.0" else 0, SOURCE)  # one midlayer, nothing after it
    out.append(draft_head(ckpt, SOURCE, hint))
    return out


# MoEExperts (torchspec/models/draft/moe.py): `(E, in, out)` weights for torch._grouped_mm, gate_up_proj chunked into
# gate (first half) and up (second half) after the GEMM. Decoded per expert by quantkit.io.formats' `fused-experts`
# format into `mlp.experts.<e>.{gate,up,down}_proj` [out, in]: a transpose and a slice, no arithmetic.
TORCHSPEC_FUSED = FusedLayout("torchspec_moe", {
    ".mlp.experts.gate_up_proj": (("gate_proj", "weight", "first half"), ("up_proj", "weight", "second half")),
    ".mlp.experts.down_proj": (("down_proj", "weight", "all"),),
}, transposed=True, experts_key="n_routed_experts")  # fmt: skip


# Quark's llama template, as for every draft layout (quantkit.naming.archs.eagle3_llama says why); the fused experts are
# a `fused-experts` source, which only the native executor decodes (`--engine quark` is refused in one line naming
# `--engine native`: apply/run.py plan_apply).
FAMILY = Family(
    "eagle3_torchspec_moe", ("Glm4MoeForCausalLMEagle3",), SOURCE, torchspec_moe_layers,
    quark_templates={"*": "llama"},
    # no vLLM model builds these drafts, so no router of vLLM's to name (router None: no routing method)
    moe=MoeLayout(("n_routed_experts",), router=None, fused=(TORCHSPEC_FUSED,)),
    draft=DraftLayout(vllm_refusal=NO_VLLM_MODEL),
    # the same strings without use_moe are the dense drafts vLLM builds (eagle3_llama, eagle3_mla)
    variant=Variant(("LlamaForCausalLMEagle3", _MLA), USE_MOE),
    config_keys={"use_moe": bool},
)  # fmt: skip
