"""Tiny source checkpoints in the formats MoE targets really ship, for quantkit.io.formats' tests and demos.

- `deepseek_v3_fp8`: DeepSeek-V3 (MLA with q_lora, 1 dense + 2 MoE layers, shared expert, 4 routed experts) in FP8
  E4M3 with 128x128 `weight_scale_inv` blocks, plus one MTP layer (`model.layers.3.*`, num_nextn_predict_layers 1),
  as deepseek-ai/DeepSeek-V3 ships (router, norms, embeddings, lm_head and the MTP eh_proj stay BF16; the router's
  e_score_correction_bias F32).
- `minimax_m2_fp8`: MiniMax-M2 (`block_sparse_moe.experts.N.w1/w2/w3`) in FP8-block, router and routing bias F32,
  `modules_to_not_convert` as MiniMaxAI/MiniMax-M2 writes it.
- `kimi_k25_int4`: a Kimi-K2.5-style wrapper (KimiK25ForConditionalGeneration, text_config = DeepSeek-V3) whose routed
  experts are INT4 pack-quantized by compressed-tensors' own compressor; vision_tower.* / mm_projector.* BF16.

The text models are transformers' own classes saved in the published per-expert layout (as tests/families.py does),
with configs that quantkit's naming (quantkit/naming/archs/) recognises. Several dims are not multiples of 128
(intermediate 320, moe_intermediate 192, q_lora_rank 96, kv_a 96) so FP8 edge blocks are partial.

Run as a script to write all three: `python tests/source_checkpoints.py OUT_DIR`.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER_FROM = ROOT / "examples" / "tiny" / "target"
FP8_MAX = 448.0  # largest finite float8_e4m3fn
FP8_CONFIG = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}
MINIMAX_FP8_CONFIG = {
    "activation_scheme": "dynamic", "fmt": "float8_e4m3fn", "quant_method": "fp8", "weight_block_size": [128, 128],
    "modules_to_not_convert": ["gate", "e_score_correction_bias", "lm_head"],
}  # fmt: skip
# Kimi-K2-Thinking's ignore list (its config.json), widened to the wrapper's names.
KIMI_IGNORE = [
    "re:.*lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", r"re:.*mlp\.(gate|up|gate_up|down)_proj.*",
    "re:.*vision_tower.*", "re:.*mm_projector.*",
]  # fmt: skip


def fp8_block_quantize(weight: torch.Tensor, block: tuple[int, int] = (128, 128)) -> tuple[torch.Tensor, torch.Tensor]:
    """(float8_e4m3fn weight, float32 scale_inv [ceil(rows/bn), ceil(cols/bk)]) with scale = block amax / 448, as
    DeepSeek's act_quant_kernel scales; partial edge blocks take the amax of the values they hold."""
    bn, bk = block
    rows, cols = weight.shape
    nr, nc = math.ceil(rows / bn), math.ceil(cols / bk)
    padded = torch.zeros(nr * bn, nc * bk, dtype=torch.float32)
    padded[:rows, :cols] = weight.float()
    blocks = padded.view(nr, bn, nc, bk)
    amax = blocks.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (blocks / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.view(nr * bn, nc * bk)[:rows, :cols].contiguous(), scale.contiguous()


def _saved_tensors(model) -> tuple[dict[str, torch.Tensor], dict]:
    """A transformers model's tensors in the published per-expert layout (save_pretrained converts fused experts
    back), BF16 but for the routers' e_score_correction_bias (F32), and its config.json."""
    from safetensors import safe_open

    model = model.to(torch.bfloat16)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        tensors: dict[str, torch.Tensor] = {}
        for f in sorted(Path(tmp).glob("*.safetensors")):
            with safe_open(str(f), "pt") as s:
                for k in s.keys():  # noqa: SIM118 (a safe_open handle, not a dict)
                    tensors[k] = s.get_tensor(k)
        config = json.loads((Path(tmp) / "config.json").read_text())
    for name, t in tensors.items():
        if name.endswith("e_score_correction_bias"):  # F32 in the DeepSeek-V3, Kimi and MiniMax releases
            tensors[name] = t.to(torch.float32)
    return tensors, config


def write_checkpoint(out: Path, tensors: dict[str, torch.Tensor], config: dict, shard_bytes: int = 1 << 20,
                     last_shard_prefixes: tuple[str, ...] = ()) -> Path:  # fmt: skip
    """config.json, safetensors shards of about `shard_bytes` (a module's tensors never split across shards; names
    starting with `last_shard_prefixes` go to a shard of their own at the end), the index, and tokenizer files."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    main = [n for n in tensors if not n.startswith(last_shard_prefixes)] if last_shard_prefixes else list(tensors)
    tail = [n for n in tensors if n not in set(main)]
    shards: list[list[str]] = [[]]
    size, module = 0, None
    for name in main:
        nbytes = tensors[name].numel() * tensors[name].element_size()
        this_module = name.rpartition(".")[0]
        if shards[-1] and size + nbytes > shard_bytes and this_module != module:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
        module = this_module
    if tail:
        shards.append(tail)
    weight_map = {}
    total = 0
    for i, names in enumerate(shards, 1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: tensors[n].contiguous() for n in names}, str(out / file), metadata={"format": "pt"})
        for n in names:
            weight_map[n] = file
            total += tensors[n].numel() * tensors[n].element_size()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (TOKENIZER_FROM / f).is_file():
            shutil.copy(TOKENIZER_FROM / f, out / f)
    return out


def _deepseek_text_model(seed: int):
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(seed)
    cfg = DeepseekV3Config(
        vocab_size=2048, hidden_size=256, intermediate_size=320, moe_intermediate_size=192, num_hidden_layers=3,
        num_attention_heads=2, num_key_value_heads=2, n_shared_experts=1, n_routed_experts=4, num_experts_per_tok=2,
        first_k_dense_replace=1, q_lora_rank=96, kv_lora_rank=64, qk_rope_head_dim=32, qk_nope_head_dim=32,
        v_head_dim=32, n_group=1, topk_group=1, max_position_embeddings=1024, bos_token_id=1, eos_token_id=2,
        pad_token_id=0,
    )
    return DeepseekV3ForCausalLM(cfg)


def _is_decoder_linear(name: str) -> bool:
    """DeepSeek-V3's FP8 set: every projection inside a decoder layer (attention, dense MLP, shared and routed
    experts); the router `mlp.gate`, norms, embeddings and lm_head stay BF16."""
    return ".layers." in name and name.endswith(("_proj.weight", "_mqa.weight")) and not name.endswith("eh_proj.weight")


def _to_fp8(tensors: dict[str, torch.Tensor], select) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if select(name):
            out[name], out[name + "_scale_inv"] = fp8_block_quantize(t)
        else:
            out[name] = t
    return out


def _mtp_layer(tensors: dict[str, torch.Tensor], layers: int, hidden: int, vocab: int) -> dict[str, torch.Tensor]:
    """DeepSeek-V3's MTP module as stored: a full MoE decoder layer at index `layers` plus enorm, hnorm, eh_proj,
    shared_head.{norm,head} and its own embed_tokens (random values, shapes of the last decoder layer)."""
    src, dst = f"model.layers.{layers - 1}.", f"model.layers.{layers}."
    out = {}
    for name, t in tensors.items():
        if name.startswith(src):
            out[dst + name[len(src):]] = (torch.randn(t.shape) * 0.02).to(t.dtype) if t.ndim == 2 else t.clone()
    out.update({
        dst + "enorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
        dst + "hnorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
        dst + "eh_proj.weight": (torch.randn(hidden, 2 * hidden) * 0.02).to(torch.bfloat16),
        dst + "shared_head.norm.weight": torch.ones(hidden, dtype=torch.bfloat16),
        dst + "shared_head.head.weight": (torch.randn(vocab, hidden) * 0.02).to(torch.bfloat16),
        dst + "embed_tokens.weight": (torch.randn(vocab, hidden) * 0.02).to(torch.bfloat16),
    })  # fmt: skip
    return out


def deepseek_v3_fp8(out: Path) -> Path:
    """DeepSeek-V3 FP8-block with one MTP layer (model.layers.3.*) in a shard of its own at the end."""
    model = _deepseek_text_model(seed=0)
    tensors, config = _saved_tensors(model)
    layers = config["num_hidden_layers"]
    tensors.update(_mtp_layer(tensors, layers, config["hidden_size"], config["vocab_size"]))
    tensors = _to_fp8(tensors, _is_decoder_linear)
    config.update(quantization_config=dict(FP8_CONFIG), num_nextn_predict_layers=1)
    return write_checkpoint(out, tensors, config, last_shard_prefixes=(f"model.layers.{layers}.",))


def minimax_m2_fp8(out: Path) -> Path:
    """MiniMax-M2 FP8-block: attention q/k/v/o and experts w1/w2/w3 in FP8; router and routing bias F32."""
    from transformers import MiniMaxM2Config, MiniMaxM2ForCausalLM

    torch.manual_seed(0)
    cfg = MiniMaxM2Config(
        vocab_size=2048, hidden_size=256, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=1024,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    tensors, config = _saved_tensors(MiniMaxM2ForCausalLM(cfg))
    for name in list(tensors):
        if name.endswith("block_sparse_moe.gate.weight"):
            tensors[name] = tensors[name].to(torch.float32)

    def select(name: str) -> bool:
        return name.endswith(("_proj.weight", ".w1.weight", ".w2.weight", ".w3.weight")) and ".layers." in name

    tensors = _to_fp8(tensors, select)
    config["quantization_config"] = dict(MINIMAX_FP8_CONFIG)
    return write_checkpoint(out, tensors, config)


def int4_scheme(group_size: int = 32):
    """compressed-tensors' scheme for Kimi's routed experts: INT4 symmetric, group strategy, weight-only."""
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    args = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=group_size)
    return QuantizationScheme(targets=["Linear"], weights=args)


def int4_quantization_config(ignore: list[str], group_size: int = 32) -> dict:
    """The config.json entry, as compressed-tensors serialises its own QuantizationConfig."""
    from compressed_tensors.quantization import QuantizationConfig

    qc = QuantizationConfig(config_groups={"group_0": int4_scheme(group_size)}, format="pack-quantized",
                            ignore=ignore, quantization_status="compressed")  # fmt: skip
    data = qc.model_dump(mode="json")
    data["quant_method"] = "compressed-tensors"
    return data


def int4_compress(weight: torch.Tensor, group_size: int = 32) -> dict[str, torch.Tensor]:
    """weight_packed / weight_scale / weight_shape for one linear weight, made by compressed-tensors itself:
    calculate_qparams (absmax per group) then PackedQuantizationCompressor.compress."""
    from compressed_tensors.compressors.pack_quantized.base import (
        PackedQuantizationCompressor,
    )
    from compressed_tensors.quantization.utils.helpers import calculate_qparams

    scheme = int4_scheme(group_size)
    rows, cols = weight.shape
    groups = weight.view(rows, cols // group_size, group_size)
    scale, zero_point = calculate_qparams(groups.amin(-1), groups.amax(-1), scheme.weights)
    return PackedQuantizationCompressor.compress(
        {"weight": weight, "weight_scale": scale, "weight_zero_point": zero_point}, scheme
    )


def _is_routed_expert(name: str) -> bool:
    return ".mlp.experts." in name and name.endswith("_proj.weight")


def kimi_k25_int4(out: Path) -> Path:
    """Kimi-K2.5 layout: language_model.model.* / language_model.lm_head.* with INT4 routed experts, BF16 vision
    tower and projector; quantization_config inside text_config (as Kimi-K2.5's config.json has it)."""
    model = _deepseek_text_model(seed=1)
    text_tensors, text_config = _saved_tensors(model)
    tensors: dict[str, torch.Tensor] = {}
    for name, t in text_tensors.items():
        full = "language_model." + name
        if _is_routed_expert(name):
            module = full[: -len(".weight")]
            for part, value in int4_compress(t).items():
                tensors[f"{module}.{part}"] = value
        else:
            tensors[full] = t
    torch.manual_seed(2)
    vision = {
        "vision_tower.patch_embed.proj.weight": (64, 3, 14, 14), "vision_tower.patch_embed.proj.bias": (64,),
        "vision_tower.encoder.blocks.0.norm0.weight": (64,), "vision_tower.encoder.blocks.0.wqkv.weight": (192, 64),
        "vision_tower.encoder.blocks.0.wo.weight": (64, 64), "vision_tower.encoder.blocks.0.mlp.fc0.weight": (128, 64),
        "vision_tower.encoder.blocks.0.mlp.fc1.weight": (64, 128), "mm_projector.pre_norm.weight": (64,),
        "mm_projector.proj.0.weight": (256, 256), "mm_projector.proj.2.weight": (256, 256),
    }  # fmt: skip
    for name, shape in vision.items():
        tensors[name] = (torch.randn(shape) * 0.02).to(torch.bfloat16)
    text_config = {k: v for k, v in text_config.items() if k not in ("transformers_version",)}
    text_config.update(model_type="kimi_k2", architectures=["DeepseekV3ForCausalLM"],
                       quantization_config=int4_quantization_config(KIMI_IGNORE))  # fmt: skip
    config = {
        "architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25", "dtype": "bfloat16",
        "tie_word_embeddings": False, "media_placeholder_token_id": 163605, "text_config": text_config,
        "vision_config": {"patch_size": 14, "init_pos_emb_height": 64, "init_pos_emb_width": 64,
                          "merge_kernel_size": [2, 2], "vt_hidden_size": 64, "vt_num_attention_heads": 2,
                          "vt_num_hidden_layers": 1, "vt_intermediate_size": 128, "text_hidden_size": 256},
    }  # fmt: skip
    return write_checkpoint(out, tensors, config)


BUILDERS = {"deepseek-v3-fp8": deepseek_v3_fp8, "minimax-m2-fp8": minimax_m2_fp8, "kimi-k25-int4": kimi_k25_int4}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/source_checkpoints.py OUT_DIR")
    for folder, build in BUILDERS.items():
        print(build(Path(sys.argv[1]) / folder))
