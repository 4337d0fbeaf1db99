"""Small random safetensors checkpoints with the real tensor names of the families the executor must handle
(Qwen3-MoE, DeepSeek-V3, MiniMax-M2, Mixtral, an EAGLE-3 draft), split into shards the way Hugging Face saves them,
plus the exclusion lists quantkit's recipes give Quark (exact checkpoint module names)."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

TINY = Path(__file__).resolve().parent.parent / "examples" / "tiny"


@dataclass
class Family:
    name: str
    template: str  # Quark LLMTemplate name
    config: dict
    tensors: dict[str, torch.Tensor]
    exclude_roles: tuple[str, ...]  # fnmatch patterns quantkit's recipes resolve into module names


def _rand(g: torch.Generator, *shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return (torch.randn(*shape, generator=g) * 0.02).to(dtype)


def _attention(g, t, p, hidden, heads, kv_heads, head_dim, qk_norm=True):
    t[f"{p}.self_attn.q_proj.weight"] = _rand(g, heads * head_dim, hidden)
    t[f"{p}.self_attn.k_proj.weight"] = _rand(g, kv_heads * head_dim, hidden)
    t[f"{p}.self_attn.v_proj.weight"] = _rand(g, kv_heads * head_dim, hidden)
    t[f"{p}.self_attn.o_proj.weight"] = _rand(g, hidden, heads * head_dim)
    if qk_norm:
        t[f"{p}.self_attn.q_norm.weight"] = torch.ones(head_dim, dtype=torch.bfloat16)
        t[f"{p}.self_attn.k_norm.weight"] = torch.ones(head_dim, dtype=torch.bfloat16)


def qwen3_moe(layers: int = 2, experts: int = 8, hidden: int = 128, inter: int = 64, vocab: int = 512) -> Family:
    g = torch.Generator().manual_seed(10)
    t: dict[str, torch.Tensor] = {"model.embed_tokens.weight": _rand(g, vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}"
        t[f"{p}.input_layernorm.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
        t[f"{p}.post_attention_layernorm.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
        _attention(g, t, p, hidden, 4, 2, 32)
        t[f"{p}.mlp.gate.weight"] = _rand(g, experts, hidden)
        for e in range(experts):
            t[f"{p}.mlp.experts.{e}.gate_proj.weight"] = _rand(g, inter, hidden)
            t[f"{p}.mlp.experts.{e}.up_proj.weight"] = _rand(g, inter, hidden)
            t[f"{p}.mlp.experts.{e}.down_proj.weight"] = _rand(g, hidden, inter)
    t["model.norm.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
    t["lm_head.weight"] = _rand(g, vocab, hidden)
    config = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": hidden,
              "moe_intermediate_size": inter, "num_hidden_layers": layers, "num_experts": experts,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": vocab,
              "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "torch_dtype": "bfloat16", "tie_word_embeddings": False}
    return Family("qwen3_moe", "qwen3_moe", config, t, ("*.mlp.gate", "*self_attn*", "lm_head"))


def deepseek_v3(layers: int = 3, experts: int = 8, hidden: int = 128, inter: int = 256, moe_inter: int = 64,
                vocab: int = 512) -> Family:
    """MLA attention, a dense first layer, shared experts, a router with an F32 e_score_correction_bias."""
    g = torch.Generator().manual_seed(11)
    t: dict[str, torch.Tensor] = {"model.embed_tokens.weight": _rand(g, vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}"
        t[f"{p}.input_layernorm.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
        t[f"{p}.post_attention_layernorm.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
        t[f"{p}.self_attn.q_a_proj.weight"] = _rand(g, 64, hidden)
        t[f"{p}.self_attn.q_a_layernorm.weight"] = torch.ones(64, dtype=torch.bfloat16)
        t[f"{p}.self_attn.q_b_proj.weight"] = _rand(g, 4 * 64, 64)
        t[f"{p}.self_attn.kv_a_proj_with_mqa.weight"] = _rand(g, 32 + 32, hidden)
        t[f"{p}.self_attn.kv_a_layernorm.weight"] = torch.ones(32, dtype=torch.bfloat16)
        t[f"{p}.self_attn.kv_b_proj.weight"] = _rand(g, 4 * 64, 32)
        t[f"{p}.self_attn.o_proj.weight"] = _rand(g, hidden, 4 * 32)
        if i == 0:
            for n, shape in (("gate_proj", (inter, hidden)), ("up_proj", (inter, hidden)), ("down_proj", (hidden, inter))):
                t[f"{p}.mlp.{n}.weight"] = _rand(g, *shape)
            continue
        t[f"{p}.mlp.gate.weight"] = _rand(g, experts, hidden)
        t[f"{p}.mlp.gate.e_score_correction_bias"] = torch.zeros(experts, dtype=torch.float32)
        for n, shape in (("gate_proj", (moe_inter, hidden)), ("up_proj", (moe_inter, hidden)),
                         ("down_proj", (hidden, moe_inter))):
            t[f"{p}.mlp.shared_experts.{n}.weight"] = _rand(g, *shape)
            for e in range(experts):
                t[f"{p}.mlp.experts.{e}.{n}.weight"] = _rand(g, *shape)
    t["model.norm.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
    t["lm_head.weight"] = _rand(g, vocab, hidden)
    config = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": hidden,
              "intermediate_size": inter, "moe_intermediate_size": moe_inter, "num_hidden_layers": layers,
              "n_routed_experts": experts, "n_shared_experts": 1, "first_k_dense_replace": 1, "q_lora_rank": 64,
              "kv_lora_rank": 32, "qk_rope_head_dim": 32, "qk_nope_head_dim": 32, "v_head_dim": 32,
              "num_attention_heads": 4, "vocab_size": vocab, "torch_dtype": "bfloat16"}
    return Family("deepseek_v3", "deepseek_v3", config, t,
                  ("*.mlp.gate", "*self_attn*", "*shared_experts*", "model.layers.0.mlp.*", "lm_head"))


def _block_sparse(name: str, model_type: str, arch: str, seed: int, layers: int = 2, experts: int = 8,
                  hidden: int = 128, inter: int = 64, vocab: int = 512, qk_norm: bool = False) -> Family:
    g = torch.Generator().manual_seed(seed)
    t: dict[str, torch.Tensor] = {"model.embed_tokens.weight": _rand(g, vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}"
        t[f"{p}.input_layernorm.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
        t[f"{p}.post_attention_layernorm.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
        _attention(g, t, p, hidden, 4, 2, 32, qk_norm=qk_norm)
        t[f"{p}.block_sparse_moe.gate.weight"] = _rand(g, experts, hidden)
        if model_type == "minimax_m2":
            t[f"{p}.block_sparse_moe.e_score_correction_bias"] = torch.zeros(experts, dtype=torch.float32)
        for e in range(experts):
            t[f"{p}.block_sparse_moe.experts.{e}.w1.weight"] = _rand(g, inter, hidden)
            t[f"{p}.block_sparse_moe.experts.{e}.w2.weight"] = _rand(g, hidden, inter)
            t[f"{p}.block_sparse_moe.experts.{e}.w3.weight"] = _rand(g, inter, hidden)
    t["model.norm.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
    t["lm_head.weight"] = _rand(g, vocab, hidden)
    config = {"architectures": [arch], "model_type": model_type, "hidden_size": hidden, "intermediate_size": inter,
              "num_hidden_layers": layers, "num_local_experts": experts, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 32, "vocab_size": vocab, "torch_dtype": "bfloat16"}
    return Family(name, model_type, config, t, ("*.block_sparse_moe.gate", "*self_attn*", "lm_head"))


def minimax_m2() -> Family:
    return _block_sparse("minimax_m2", "minimax_m2", "MiniMaxM2ForCausalLM", 12, qk_norm=True)


def mixtral() -> Family:
    return _block_sparse("mixtral", "mixtral", "MixtralForCausalLM", 13)


def eagle3_draft() -> Family:
    """The bundled EAGLE-3 draft's tensors (fc, midlayer.*, lm_head, d2t int64, t2d bool, norms) and config."""
    from safetensors.torch import load_file

    folder = TINY / "eagle3-draft"
    return Family("eagle3_draft", "llama", json.loads((folder / "config.json").read_text()),
                  load_file(str(folder / "model.safetensors")), ("fc", "lm_head"))


FAMILIES = {"qwen3_moe": qwen3_moe, "deepseek_v3": deepseek_v3, "minimax_m2": minimax_m2, "mixtral": mixtral,
            "eagle3_draft": eagle3_draft}


def write_checkpoint(family: Family, out: Path, shard_bytes: int = 200_000, aux: bool = True) -> Path:
    """Save `family` as HF does: shards of about `shard_bytes`, metadata {"format": "pt"}, an index, config.json;
    with aux=True also tokenizer files, a README.md (which Quark does not copy) and a sub-folder (which it does)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in family.tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t.contiguous()
        size += nbytes
    weight_map = {}
    for i, tensors in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" if len(shards) > 1 else "model.safetensors"
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in tensors})
    if len(shards) > 1:
        total = sum(t.numel() * t.element_size() for t in family.tensors.values())
        (out / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    (out / "config.json").write_text(json.dumps(family.config, indent=2))
    if aux:
        for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            shutil.copy(TINY / "eagle3-draft" / f, out / f)
        (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
        (out / "README.md").write_text("# a model card Quark does not copy\n")
        (out / "extra").mkdir()
        (out / "extra" / "notes.txt").write_text("copied as a folder\n")
    return out


def exclude_modules(family: Family) -> list[str]:
    """What quantkit's recipes hand Quark: the exact checkpoint module names of the kept linear layers."""
    import fnmatch

    modules = {n.removesuffix(".weight") for n, t in family.tensors.items() if n.endswith(".weight") and t.dim() == 2}
    return sorted(m for m in modules if any(fnmatch.fnmatchcase(m, p) for p in family.exclude_roles))


def tree_bytes(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` by relative path, with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


_PEAK_RSS = """
import json, sys, threading, time, torch
from pathlib import Path
from quantkit.apply import shards
from quantkit.schemes import mxfp4

def rss():  # resident memory now, in bytes
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096

mxfp4.quantize_mxfp4(torch.zeros(64, 64, dtype=torch.bfloat16))  # warm up torch's allocator and kernels
base, peak, running = rss(), [0], [True]

def sample():
    while running[0]:
        peak[0] = max(peak[0], rss())
        time.sleep(0.002)

sampler = threading.Thread(target=sample)
sampler.start()
src, out, exclude, max_memory = json.loads(sys.argv[1])
shards.quantize_checkpoint(Path(src), Path(out), scheme="mxfp4", exclude=exclude, layer_config=None, devices=["cpu"],
                           max_memory=max_memory)
running[0] = False
sampler.join()
print(json.dumps({"base": base, "peak": max(peak[0], rss())}))
"""


def peak_rss_growth(src: Path, out: Path, exclude: list[str], max_memory: int | None = None) -> int:
    """Peak RSS growth in bytes of `quantize_checkpoint(src, out, scheme="mxfp4", devices=["cpu"])` in a fresh
    process, sampled every 2 ms from /proc/self/statm, over the process's resident memory after torch warmed up."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    args = json.dumps([str(src), str(out), exclude, max_memory])
    proc = subprocess.run([sys.executable, "-c", _PEAK_RSS, args], cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
                          check=False, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    m = json.loads(proc.stdout.strip().splitlines()[-1])
    return int(m["peak"] - m["base"])
