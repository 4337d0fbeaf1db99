"""A PyTorch EAGLE-3 draft with vLLM's forward, loaded from a draft folder (BF16, or Quark FP8 as vLLM runs it).

Follows vllm/model_executor/models/llama_eagle3.py (Eagle3LlamaForCausalLM, LlamaDecoderLayer, LlamaModel) and the
proposer in vllm/v1/spec_decode/llm_base_proposer.py:
  step 1: hidden = fc(concat of the target's aux hidden states at position n); input token = the token after n;
  the decoder layer takes cat(input_layernorm(embed(token)), hidden_norm(hidden)) into attention;
  steps 2..K: hidden = the previous step's pre-norm output, token = the previous draft token, position + 1.
Draft logits cover the draft vocab; draft id d is target id d + d2t[d] (Eagle3LlamaForCausalLM.compute_logits).

Quark ptpc_fp8 layers are run as vLLM runs them: FP8 E4M3 weights times per-channel scales, and inputs
quantized to FP8 per token on the fly (dynamic, scale = amax/448).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from quantkit.io.headers import checkpoint_tensors, read_config
from quantkit.naming.drafts import draft_info

FP8_MAX = 448.0


def _fake_fp8_per_token(x: torch.Tensor) -> torch.Tensor:
    scale = x.abs().amax(-1, keepdim=True).clamp(min=1e-12) / FP8_MAX
    return (x / scale).to(torch.float8_e4m3fn).to(x.dtype) * scale


class Linear:
    """y = x W^T, with W dequantized from Quark FP8 (weight * weight_scale) when the checkpoint holds FP8."""

    def __init__(self, weight: torch.Tensor, scale: torch.Tensor | None):
        if weight.dtype == torch.float8_e4m3fn:
            if scale is None:
                raise ValueError("FP8 weight without weight_scale")
            s = scale.float().reshape(-1, 1) if scale.numel() == weight.shape[0] else scale.float().reshape(1, 1)
            self.weight = weight.float() * s
            self.fp8_input = True
        else:
            self.weight = weight.float()
            self.fp8_input = False

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(_fake_fp8_per_token(x) if self.fp8_input else x, self.weight)


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = pos.float()[:, None] * inv
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Eagle3Draft:
    """Inference-only EAGLE-3 draft (one decoder layer), float32 compute."""

    def __init__(self, folder: str | Path, target_embed: torch.Tensor):
        folder = Path(folder)
        config = read_config(folder)
        tensors_info = checkpoint_tensors(folder)
        info = draft_info(config, tensors_info, str(folder))
        from safetensors import safe_open

        t: dict[str, torch.Tensor] = {}
        for f in sorted({i.file for i in tensors_info.values()}):
            with safe_open(str(folder / f), "pt") as s:
                for k in s.keys():
                    t[k] = s.get_tensor(k)
        lc: dict[str, Any] = info.layer_config
        self.hidden_size = info.hidden_size
        self.heads = int(lc["num_attention_heads"])
        self.kv_heads = int(lc.get("num_key_value_heads") or self.heads)
        self.head_dim = int(lc.get("head_dim") or self.hidden_size // self.heads)
        self.eps = float(lc.get("rms_norm_eps", 1e-6))
        rope = lc.get("rope_parameters") or {}
        self.theta = float(lc.get("rope_theta") or rope.get("rope_theta") or 10000.0)
        # speculators drafts default to norm_before_residual=True (transformers_utils/configs/speculators/algos.py)
        default_nbr = info.format == "speculators"
        self.norm_before_residual = bool(
            config.get("norm_before_residual", lc.get("norm_before_residual", default_nbr))
        )
        self.aux_layer_ids = info.aux_layer_ids
        p = info.layer_prefix

        def lin(name: str) -> Linear:
            return Linear(t[f"{name}.weight"], t.get(f"{name}.weight_scale"))

        self.fc = lin("fc")
        self.q, self.k, self.v, self.o = (lin(f"{p}self_attn.{x}_proj") for x in "qkvo")
        self.gate, self.up, self.down = (lin(f"{p}mlp.{x}_proj") for x in ("gate", "up", "down"))
        self.input_norm = t[f"{p}input_layernorm.weight"].float()
        self.hidden_norm = t[f"{p}hidden_norm.weight"].float()
        self.post_norm = t[f"{p}post_attention_layernorm.weight"].float()
        self.norm = t["norm.weight"].float()
        self.lm_head = lin("lm_head")
        self.embed = (t["embed_tokens.weight"] if "embed_tokens.weight" in t else target_embed).float()
        vocab = info.vocab_size or self.embed.shape[0]
        if "d2t" in t:
            self.draft_to_target = torch.arange(info.draft_vocab_size) + t["d2t"].long()
        else:
            self.draft_to_target = torch.arange(vocab)
        self.target_vocab = vocab

    # -- one layer over a block of positions, attending to a cache of keys/values ----------------------------------
    def _layer(
        self,
        tokens: torch.Tensor,
        hidden: torch.Tensor,
        pos: torch.Tensor,
        cache_k: torch.Tensor | None,
        cache_v: torch.Tensor | None,
        causal: bool,
    ):
        emb = _rms(self.embed[tokens], self.input_norm, self.eps)
        if self.norm_before_residual:
            hidden = _rms(hidden, self.hidden_norm, self.eps)
            residual = hidden
            x = torch.cat([emb, hidden], -1)
        else:
            residual = hidden
            x = torch.cat([emb, _rms(hidden, self.hidden_norm, self.eps)], -1)
        n = x.shape[0]
        q = self.q(x).view(n, self.heads, self.head_dim).transpose(0, 1)
        k = self.k(x).view(n, self.kv_heads, self.head_dim).transpose(0, 1)
        v = self.v(x).view(n, self.kv_heads, self.head_dim).transpose(0, 1)
        q, k = _rope(q, pos, self.theta), _rope(k, pos, self.theta)
        keys = k if cache_k is None else torch.cat([cache_k, k], 1)
        values = v if cache_v is None else torch.cat([cache_v, v], 1)
        rep = self.heads // self.kv_heads
        kk, vv = keys.repeat_interleave(rep, 0), values.repeat_interleave(rep, 0)
        scores = (q @ kk.transpose(-1, -2)) * self.head_dim**-0.5
        if causal:
            past = 0 if cache_k is None else cache_k.shape[1]
            mask = torch.ones(n, past + n, dtype=torch.bool).tril(past)
            scores = scores.masked_fill(~mask, float("-inf"))
        attn = (torch.softmax(scores, -1) @ vv).transpose(0, 1).reshape(n, -1)
        residual = self.o(attn) + residual
        mlp_in = _rms(residual, self.post_norm, self.eps)
        prenorm = self.down(F.silu(self.gate(mlp_in)) * self.up(mlp_in)) + residual
        return _rms(prenorm, self.norm, self.eps), prenorm, keys, values

    @torch.no_grad()
    def step1_logits(self, next_tokens: torch.Tensor, aux: torch.Tensor) -> torch.Tensor:
        """The draft's first-step logits at every position, in its own vocab ([n, draft_vocab]): position t sees the
        target's aux hidden states `aux[t]` and the token after it `next_tokens[t]`, causally over positions 0..t
        (the prefill pass of vLLM's Eagle3LlamaForCausalLM, vllm/model_executor/models/llama_eagle3.py)."""
        n = aux.shape[0]
        normed, _, _, _ = self._layer(next_tokens, self.fc(aux.float()), torch.arange(n), None, None, causal=True)
        return self.lm_head(normed)

    @torch.no_grad()
    def propose(
        self, aux: torch.Tensor, next_tokens: torch.Tensor, k: int, pick
    ) -> tuple[list[int], list[torch.Tensor]]:
        """Draft k tokens after the last position.

        aux [n, n_aux*H]: the target's aux hidden states at positions 0..n-1; next_tokens [n]: the token after each
        position (the last one is the token just produced by the target). `pick(target_logits) -> token id` chooses
        each draft token (argmax, or a sample). Returns the draft tokens (target ids) and their target-vocab logits.
        """
        n = aux.shape[0]
        hidden = self.fc(aux.float())
        normed, prenorm, keys, values = self._layer(next_tokens, hidden, torch.arange(n), None, None, causal=True)
        tokens, logits = [], []
        h, out = prenorm[-1:], normed[-1:]
        for j in range(k):
            lg = self.target_logits(out[0])
            tok = int(pick(lg))
            tokens.append(tok)
            logits.append(lg)
            if j == k - 1:
                break
            out, h, keys, values = self._layer(
                torch.tensor([tok]), h, torch.tensor([n + j]), keys, values, causal=False
            )
        return tokens, logits

    def target_logits(self, normed_row: torch.Tensor) -> torch.Tensor:
        """Draft logits scattered into the target vocab (-inf outside the draft vocab), as vLLM does."""
        d = self.lm_head(normed_row[None])[0]
        out = torch.full((self.target_vocab,), float("-inf"))
        out[self.draft_to_target] = d
        return out
