"""Regenerate the bundled tiny models in examples/tiny/ (CPU only, deterministic, ~10 minutes on 2 cores).

    python examples/make_tiny_models.py [--out examples/tiny] [--quick]
    python examples/make_tiny_models.py --only moe-eagle3-draft   # just the MoE target's draft (~5 minutes)

Makes, from nothing but this script and examples/tiny_corpus.py:
  tokenizer        a byte-level BPE tokenizer (2048 tokens) with a chat template, trained on the corpus;
  target/          a 4-layer Llama (LlamaForCausalLM) trained on the synthetic multi-domain chat corpus;
  eagle3-draft/    an EAGLE-3 draft for it in the layout vLLM's EAGLE-3 loader reads
                   (vllm/model_executor/models/llama_eagle3.py: fc over 3 aux hidden states, one decoder layer
                   stored as `midlayer.*`, norm, lm_head over a 1024-token draft vocab, d2t/t2d), trained with
                   test-time training (3 chained steps) on the target's own greedy outputs;
  moe-target/      a 2-layer Qwen3-MoE (8 experts, top-2) trained briefly on the same corpus, in 2+ shards;
  moe-eagle3-draft/ an EAGLE-3 draft for moe-target, trained the same way from moe-target as saved (so
                   `--only moe-eagle3-draft` regenerates it alone, identically); aux ids MOE_AUX_LAYER_IDS;
and quantkit/data/prompts.jsonl, the built-in prompt set (held-out seed).

The draft reproduces vLLM's EAGLE-3 forward exactly (see Eagle3Draft below): step 1 feeds fc(concat of the
target's hidden states entering layers `aux_layer_ids`) with the embedding of the *next* token; steps 2..K
feed the draft's own pre-norm output. Aux layer id i is the residual stream entering target layer i
(vllm/model_executor/models/interfaces.py `_maybe_add_hidden_state`: id 0 = embeddings, id i = after layer i-1).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import tiny_corpus  # noqa: E402

SPECIALS = ["<pad>", "<s>", "<|end|>", "<|user|>", "<|assistant|>", "<|system|>"]
VOCAB = 2048
DRAFT_VOCAB = 1024
HIDDEN = 256
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 64
TARGET_LAYERS = 4
AUX_LAYER_IDS = [1, 2, 3]  # vLLM's default (2, L//2, L-3) repeats a layer when L=4
# The MoE target has 2 layers: vLLM's default (2, 1, -1) is out of range. Ids 0..L are what Qwen3MoeModel.forward
# collects (vllm/model_executor/models/qwen3_moe.py: id 0 = embeddings, id i = residual stream after layer i-1).
MOE_AUX_LAYER_IDS = [0, 1, 2]
MOE_DRAFT_STEPS, MOE_DRAFT_PROMPTS = 120, 800
SEQ = 128
SEED = 1234


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------- tokenizer
def build_tokenizer(docs: list[str], out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIALS,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="<|end|>",
        pad_token="<pad>",
        additional_special_tokens=["<|user|>", "<|assistant|>", "<|system|>"],
    )
    fast.chat_template = tiny_corpus.CHAT_TEMPLATE
    fast.model_max_length = 4096
    fast.save_pretrained(out)
    return fast


def pack(tokenizer, docs: list[str]) -> torch.Tensor:
    ids: list[int] = []
    for d in docs:
        ids.extend(tokenizer(d, add_special_tokens=False)["input_ids"])
    n = len(ids) // SEQ
    return torch.tensor(ids[: n * SEQ]).view(n, SEQ)


# --------------------------------------------------------------------------------------------- training
def train_lm(model: nn.Module, data: torch.Tensor, steps: int, batch: int, lr: float, label: str) -> None:
    gen = torch.Generator().manual_seed(SEED)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.95))
    model.train()
    t0 = time.time()
    for step in range(steps):
        cur = lr * min(1.0, (step + 1) / 30) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))
        for g in opt.param_groups:
            g["lr"] = cur
        idx = torch.randint(0, data.shape[0], (batch,), generator=gen)
        x = data[idx]
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == steps - 1:
            log(f"{label} step {step}/{steps} loss {loss.item():.3f} ({time.time() - t0:.0f}s)")
    model.eval()


# --------------------------------------------------------------------------------------------- EAGLE-3 draft
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Llama (neox-style, rotate-half) rotary embedding; x [..., T, D], pos [T] or [B, T]."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = pos.float()[..., None] * inv
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    if pos.dim() == 2:
        cos, sin = cos[:, None], sin[:, None]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Attention(nn.Module):
    def __init__(self, in_dim: int):
        super().__init__()
        self.q_proj = nn.Linear(in_dim, HEADS * HEAD_DIM, bias=False)
        self.k_proj = nn.Linear(in_dim, KV_HEADS * HEAD_DIM, bias=False)
        self.v_proj = nn.Linear(in_dim, KV_HEADS * HEAD_DIM, bias=False)
        self.o_proj = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)


class MLP(nn.Module):
    def __init__(self, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(HIDDEN, inter, bias=False)
        self.up_proj = nn.Linear(HIDDEN, inter, bias=False)
        self.down_proj = nn.Linear(inter, HIDDEN, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    def __init__(self, inter: int):
        super().__init__()
        self.input_layernorm = RMSNorm(HIDDEN)
        self.hidden_norm = RMSNorm(HIDDEN)
        self.post_attention_layernorm = RMSNorm(HIDDEN)
        self.self_attn = Attention(2 * HIDDEN)
        self.mlp = MLP(inter)


class Eagle3Draft(nn.Module):
    """EAGLE-3 draft with vLLM's forward (llama_eagle3.py, norm_before_residual=False, norm_output=False)."""

    def __init__(self, embed: nn.Embedding, inter: int, theta: float, n_aux: int = len(AUX_LAYER_IDS)):
        super().__init__()
        self.fc = nn.Linear(n_aux * HIDDEN, HIDDEN, bias=False)
        self.midlayer = MidLayer(inter)
        self.norm = RMSNorm(HIDDEN)
        self.lm_head = nn.Linear(HIDDEN, DRAFT_VOCAB, bias=False)
        self.embed = embed  # the target's, frozen and not saved: vLLM shares it when the draft has none
        self.theta = theta

    def qkv(self, tokens, hidden, pos):
        """Per-step projections. Returns q [B,H,T,D], k/v [B,KV,T,D] (rotated) and the residual."""
        layer = self.midlayer
        residual = hidden
        x = torch.cat([layer.input_layernorm(self.embed(tokens)), layer.hidden_norm(hidden)], -1)
        b, t, _ = x.shape
        q = layer.self_attn.q_proj(x).view(b, t, HEADS, HEAD_DIM).transpose(1, 2)
        k = layer.self_attn.k_proj(x).view(b, t, KV_HEADS, HEAD_DIM).transpose(1, 2)
        v = layer.self_attn.v_proj(x).view(b, t, KV_HEADS, HEAD_DIM).transpose(1, 2)
        return rope(q, pos, self.theta), rope(k, pos, self.theta), v, residual

    def finish(self, attn, residual):
        """o_proj, fused add+norm, MLP, final add+norm. Returns (normed, prenorm)."""
        layer = self.midlayer
        b, h, t, d = attn.shape
        out = layer.self_attn.o_proj(attn.transpose(1, 2).reshape(b, t, h * d))
        residual = out + residual
        mlp = layer.mlp(layer.post_attention_layernorm(residual))
        prenorm = mlp + residual
        return self.norm(prenorm), prenorm

    def ttt_forward(self, aux: torch.Tensor, tokens: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Training-time test: logits of `steps` chained drafts for every chain start n.

        Chain start n, step j: input token tokens[n+1+j], hidden = fc(aux[n]) for j=0 else the step j-1
        pre-norm output, position n+j; it attends to the step-0 keys at positions <= n and to its own chain's
        keys of steps 1..j -- exactly the keys in vLLM's draft KV cache when it drafts token j+1 after n.
        """
        b, t, _ = aux.shape
        rep = HEADS // KV_HEADS
        hidden = self.fc(aux)
        base_pos = torch.arange(t)
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        k0 = v0 = None
        diag_k: list[torch.Tensor] = []
        diag_v: list[torch.Tensor] = []
        logits = []
        for j in range(steps):
            tok = torch.roll(tokens, -(1 + j), dims=1)  # wrapped tail positions are masked in the loss
            q, k, v, residual = self.qkv(tok, hidden, base_pos + j)
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            if j == 0:
                k0, v0 = k, v
            else:
                diag_k.append(k)
                diag_v.append(v)
            scale = HEAD_DIM**-0.5
            s0 = (q @ k0.transpose(-1, -2)) * scale
            s0 = s0.masked_fill(~causal, float("-inf"))
            sd = [((q * dk).sum(-1, keepdim=True)) * scale for dk in diag_k]
            p = torch.softmax(torch.cat([s0] + sd, -1), -1)
            attn = p[..., :t] @ v0
            for i, dv in enumerate(diag_v):
                attn = attn + p[..., t + i : t + i + 1] * dv
            normed, hidden = self.finish(attn, residual)
            logits.append(self.lm_head(normed))
        return logits


def target_features(target, seqs: torch.Tensor, aux_ids: list[int] = AUX_LAYER_IDS):
    """Aux hidden states (residual stream entering layers aux_ids; id L = entering the final norm) and greedy
    next tokens."""
    captured: dict[int, torch.Tensor] = {}
    layers = target.model.layers
    hooks = [
        (layers[i] if i < len(layers) else target.model.norm).register_forward_pre_hook(
            lambda mod, args, kwargs, i=i: captured.__setitem__(i, (args[0] if args else kwargs["hidden_states"])),
            with_kwargs=True,
        )
        for i in aux_ids
    ]
    try:
        with torch.no_grad():
            logits = target(input_ids=seqs).logits
    finally:
        for h in hooks:
            h.remove()
    aux = torch.cat([captured[i] for i in aux_ids], -1)
    return aux, logits.argmax(-1)


def greedy_generate(target, tokenizer, prompts: list[str], max_new: int, batch: int = 64) -> list[list[int]]:
    """Target's greedy continuations (prompt + output token ids), batched with left padding."""
    tokenizer.padding_side = "left"
    out: list[list[int]] = []
    for i in range(0, len(prompts), batch):
        enc = tokenizer(prompts[i : i + batch], return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            gen = target.generate(
                **enc,
                max_new_tokens=max_new,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
        for row, mask in zip(gen, enc["attention_mask"]):
            ids = row[int((mask == 0).sum()) :].tolist()
            while ids and ids[-1] == tokenizer.pad_token_id:
                ids.pop()
            out.append(ids)
    tokenizer.padding_side = "right"  # restore the saved default
    return out


def train_draft(
    target, tokenizer, steps: int, n_prompts: int, inter: int, aux_ids: list[int] = AUX_LAYER_IDS, max_new: int = 80
) -> tuple[Eagle3Draft, torch.Tensor]:
    import random

    rng = random.Random(SEED + 7)
    prompts = []
    for _ in range(n_prompts):
        _, user, _ = tiny_corpus.example(rng)
        prompts.append(tiny_corpus.render_chat([{"role": "user", "content": user}], add_generation_prompt=True))
    t0 = time.time()
    seqs = greedy_generate(target, tokenizer, prompts, max_new=max_new)
    log(f"draft data: {len(seqs)} greedy target continuations ({time.time() - t0:.0f}s)")
    length = min(SEQ, max(len(s) for s in seqs))
    pad = tokenizer.pad_token_id
    data = torch.full((len(seqs), length), pad, dtype=torch.long)
    valid = torch.zeros(len(seqs), length, dtype=torch.bool)
    for i, s in enumerate(seqs):
        s = s[:length]
        data[i, : len(s)] = torch.tensor(s)
        valid[i, : len(s)] = True

    # Draft vocab: the most frequent target tokens in what the target writes (as SpecForge does).
    counts = torch.bincount(data[valid], minlength=VOCAB)
    counts[pad] = -1
    d2t_ids = torch.sort(torch.topk(counts, DRAFT_VOCAB).indices).values  # draft id -> target id, ascending
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[d2t_ids] = True
    target_to_draft = torch.full((VOCAB,), -100, dtype=torch.long)
    target_to_draft[d2t_ids] = torch.arange(DRAFT_VOCAB)

    feats, labels = [], []
    for i in range(0, len(data), 64):
        a, g = target_features(target, data[i : i + 64], aux_ids)
        feats.append(a)
        labels.append(g)
    aux, greedy = torch.cat(feats), torch.cat(labels)
    log(
        f"draft features: {tuple(aux.shape)}; draft vocab covers "
        f"{(t2d[greedy[valid]]).float().mean():.3f} of the target's greedy tokens"
    )

    torch.manual_seed(SEED + 1)
    draft = Eagle3Draft(target.model.embed_tokens, inter, target.config.rope_parameters["rope_theta"], len(aux_ids))
    for p in draft.embed.parameters():
        p.requires_grad_(False)
    params = [p for n, p in draft.named_parameters() if not n.startswith("embed")]
    opt = torch.optim.AdamW(params, lr=2e-3, weight_decay=0.0)
    gen = torch.Generator().manual_seed(SEED + 2)
    k_steps, bsz = 3, 32
    t0 = time.time()
    for step in range(steps):
        lr = 2e-3 * min(1.0, (step + 1) / 20) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * step / steps)))
        for g in opt.param_groups:
            g["lr"] = lr
        idx = torch.randint(0, len(data), (bsz,), generator=gen)
        logits = draft.ttt_forward(aux[idx], data[idx], k_steps)
        loss = 0.0
        accs = []
        for j, lg in enumerate(logits):
            # chain start n, step j predicts the target's greedy token after position n+1+j
            lab = torch.roll(greedy[idx], -(1 + j), dims=1)
            ok = torch.roll(valid[idx], -(2 + j), dims=1).clone()
            ok[:, -(2 + j) :] = False
            lab = torch.where(ok, target_to_draft[lab], torch.full_like(lab, -100))
            loss = loss + (0.8**j) * F.cross_entropy(lg.reshape(-1, DRAFT_VOCAB), lab.reshape(-1), ignore_index=-100)
            m = lab != -100
            accs.append((lg.argmax(-1)[m] == lab[m]).float().mean().item())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 100 == 0 or step == steps - 1:
            log(
                f"draft step {step}/{steps} loss {loss.item():.3f} acc/step "
                f"{' '.join(f'{a:.2f}' for a in accs)} ({time.time() - t0:.0f}s)"
            )
    draft.eval()
    d2t = d2t_ids - torch.arange(DRAFT_VOCAB)  # vLLM: target_id = draft_id + d2t[draft_id]
    return draft, (d2t, t2d)


def save_draft(
    draft: Eagle3Draft,
    d2t: torch.Tensor,
    t2d: torch.Tensor,
    target_cfg,
    out: Path,
    inter: int,
    aux_ids: list[int] = AUX_LAYER_IDS,
):
    from safetensors.torch import save_file

    tensors = {
        n: p.detach().to(torch.bfloat16).contiguous() for n, p in draft.named_parameters() if not n.startswith("embed")
    }
    tensors["d2t"] = d2t.to(torch.int64).contiguous()
    tensors["t2d"] = t2d.contiguous()
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": inter,
        "num_hidden_layers": 1,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": target_cfg.max_position_embeddings,
        "rope_theta": target_cfg.rope_parameters["rope_theta"],
        "rope_scaling": None,
        "vocab_size": VOCAB,
        "draft_vocab_size": DRAFT_VOCAB,
        "target_hidden_size": HIDDEN,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": target_cfg.bos_token_id,
        "eos_token_id": target_cfg.eos_token_id,
        "pad_token_id": target_cfg.pad_token_id,
        # vLLM reads the aux ids from eagle_config (gpu_model_runner.py) and, in newer runners, the top level.
        "eagle_aux_hidden_state_layer_ids": list(aux_ids),
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": list(aux_ids),
            "use_aux_hidden_state": True,
            "use_input_layernorm_in_first_layer": True,
            "use_last_layernorm": True,
        },
    }
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


# --------------------------------------------------------------------------------------------- MoE
def split_experts_for_save(state: dict[str, torch.Tensor], num_experts: int) -> dict[str, torch.Tensor]:
    """transformers 5 keeps Qwen3-MoE experts fused in memory; checkpoints (and vLLM) use per-expert tensors."""
    out = {}
    for name, t in state.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            prefix = name[: -len("gate_up_proj")]
            inter = t.shape[1] // 2
            for e in range(num_experts):
                out[f"{prefix}{e}.gate_proj.weight"] = t[e, :inter].clone()
                out[f"{prefix}{e}.up_proj.weight"] = t[e, inter:].clone()
        elif name.endswith("mlp.experts.down_proj"):
            prefix = name[: -len("down_proj")]
            for e in range(num_experts):
                out[f"{prefix}{e}.down_proj.weight"] = t[e].clone()
        else:
            out[name] = t
    return out


def save_sharded(state: dict[str, torch.Tensor], out: Path, max_bytes: int) -> None:
    from safetensors.torch import save_file

    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in sorted(state):
        t = state[name].contiguous()
        nbytes = t.numel() * t.element_size()
        if size + nbytes > max_bytes and shards[-1]:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / fname), metadata={"format": "pt"})
        for name, t in shard.items():
            weight_map[name] = fname
            total += t.numel() * t.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def make_moe_draft(moe_dir: Path, out: Path, quick: bool) -> None:
    """The EAGLE-3 draft of the MoE target, trained from the target folder as saved (bf16 weights, run in float32).

    Same recipe as the Llama target's draft (greedy target continuations, 3-step test-time training, draft vocab of
    the most frequent output tokens), with aux ids MOE_AUX_LAYER_IDS for the 2-layer target and a smaller budget.
    """
    from transformers import AutoTokenizer, Qwen3MoeForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(moe_dir)
    target = Qwen3MoeForCausalLM.from_pretrained(moe_dir, dtype=torch.float32).eval()
    inter = 512
    draft, (d2t, t2d) = train_draft(
        target,
        tokenizer,
        steps=30 if quick else MOE_DRAFT_STEPS,
        n_prompts=256 if quick else MOE_DRAFT_PROMPTS,
        inter=inter,
        aux_ids=MOE_AUX_LAYER_IDS,
    )
    save_draft(draft, d2t, t2d, target.config, out, inter, MOE_AUX_LAYER_IDS)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):  # the target's, byte for byte
        shutil.copyfile(moe_dir / name, out / name)
    for f in out.iterdir():
        f.chmod(0o644)


def only_moe_draft(out_root: Path, quick: bool) -> None:
    """--only moe-eagle3-draft: regenerate out_root/moe-eagle3-draft from out_root/moe-target; nothing else changes."""
    moe_dir = out_root / "moe-target"
    if not (moe_dir / "config.json").is_file():
        raise SystemExit(f"{moe_dir}: no MoE target; run this script without --only first")
    tmp = Path(tempfile.mkdtemp(prefix=".moe-draft-", dir=out_root))
    try:
        make_moe_draft(moe_dir, tmp, quick)
        final = out_root / "moe-eagle3-draft"
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        os.chmod(final, 0o755)  # mkdtemp made it private
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


# --------------------------------------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE / "tiny")
    ap.add_argument("--prompts-out", type=Path, default=HERE.parent / "quantkit" / "data" / "prompts.jsonl")
    ap.add_argument("--quick", action="store_true", help="few steps, for checking the script itself")
    ap.add_argument(
        "--only",
        choices=["moe-eagle3-draft"],
        default=None,
        help="regenerate only this model from the bundled ones already in --out",
    )
    args = ap.parse_args()

    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(SEED)
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    quick = args.quick
    t_start = time.time()
    if args.only == "moe-eagle3-draft":
        only_moe_draft(args.out, quick)
        log(f"done in {time.time() - t_start:.0f}s: {args.out / 'moe-eagle3-draft'}")
        return
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-", dir=args.out.parent))
    try:
        docs = tiny_corpus.corpus(4000 if quick else 40000, seed=SEED)
        tok_dir = tmp / "tokenizer"
        tokenizer = build_tokenizer(docs, tok_dir)
        data = pack(tokenizer, docs)
        log(f"corpus: {len(docs)} documents, {data.numel()} tokens in {data.shape[0]} windows of {SEQ}")

        # ---- target
        cfg = LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=HIDDEN,
            intermediate_size=512,
            num_hidden_layers=TARGET_LAYERS,
            num_attention_heads=HEADS,
            num_key_value_heads=KV_HEADS,
            head_dim=HEAD_DIM,
            max_position_embeddings=4096,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            tie_word_embeddings=False,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        torch.manual_seed(SEED)
        target = LlamaForCausalLM(cfg)
        train_lm(target, data, steps=30 if quick else 600, batch=16, lr=3e-3, label="target")
        # Continue with the bf16-rounded weights: that is what gets shipped and served.
        target = target.to(torch.bfloat16).to(torch.float32)
        target.generation_config.eos_token_id = tokenizer.eos_token_id
        target.generation_config.pad_token_id = tokenizer.pad_token_id
        target.generation_config.bos_token_id = tokenizer.bos_token_id
        target.generation_config.do_sample = False
        tdir = tmp / "target"
        target.to(torch.bfloat16).save_pretrained(tdir)
        target.to(torch.float32)
        tokenizer.save_pretrained(tdir)

        # ---- EAGLE-3 draft
        inter = 512
        draft, (d2t, t2d) = train_draft(
            target, tokenizer, steps=30 if quick else 500, n_prompts=256 if quick else 3000, inter=inter
        )
        save_draft(draft, d2t, t2d, target.config, tmp / "eagle3-draft", inter)
        tokenizer.save_pretrained(tmp / "eagle3-draft")

        # ---- MoE target (Qwen3-MoE)
        mcfg = Qwen3MoeConfig(
            vocab_size=VOCAB,
            hidden_size=HIDDEN,
            intermediate_size=512,
            moe_intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=HEADS,
            num_key_value_heads=KV_HEADS,
            head_dim=HEAD_DIM,
            num_experts=8,
            num_experts_per_tok=2,
            decoder_sparse_step=1,
            norm_topk_prob=True,
            max_position_embeddings=4096,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            tie_word_embeddings=False,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        torch.manual_seed(SEED + 3)
        moe = Qwen3MoeForCausalLM(mcfg)
        train_lm(moe, data, steps=20 if quick else 250, batch=16, lr=3e-3, label="moe")
        mdir = tmp / "moe-target"
        mdir.mkdir()
        moe = moe.to(torch.bfloat16)
        state = split_experts_for_save({k: v.detach() for k, v in moe.state_dict().items()}, mcfg.num_experts)
        save_sharded(state, mdir, max_bytes=3 * 1024 * 1024)
        mcfg.torch_dtype = "bfloat16"
        mcfg.architectures = ["Qwen3MoeForCausalLM"]
        mcfg.save_pretrained(mdir)
        # transformers 5 writes `num_local_experts`; published Qwen3-MoE configs (and older readers) use `num_experts`.
        cfg_json = json.loads((mdir / "config.json").read_text())
        cfg_json["num_experts"] = cfg_json.pop("num_local_experts")
        (mdir / "config.json").write_text(json.dumps(cfg_json, indent=2, sort_keys=True) + "\n")
        moe.generation_config.eos_token_id = tokenizer.eos_token_id
        moe.generation_config.pad_token_id = tokenizer.pad_token_id
        moe.generation_config.save_pretrained(mdir)
        tokenizer.save_pretrained(mdir)
        del moe
        make_moe_draft(mdir, tmp / "moe-eagle3-draft", quick)

        shutil.rmtree(tok_dir)
        # ---- built-in prompt set (held-out seed)
        args.prompts_out.parent.mkdir(parents=True, exist_ok=True)
        with open(args.prompts_out, "w") as f:
            for rec in tiny_corpus.prompt_set(per_domain=6, seed=SEED + 99):
                f.write(json.dumps(rec) + "\n")

        if args.out.exists():
            shutil.rmtree(args.out)
        tmp.rename(args.out)
        os.chmod(args.out, 0o755)  # mkdtemp made it private
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    size = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    log(f"done in {time.time() - t_start:.0f}s: {args.out} ({size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
