"""Logits agreement of a quantized checkpoint with its source on a few prompts (`quantkit check --numeric`).

Targets: the source runs in transformers (float32) and the quantized checkpoint through Quark's importer
(quantkit.loading), next-token logits compared at every prompt position. EAGLE-3 drafts: both drafts run step 1
of vLLM's EAGLE-3 forward (quantkit.acceptance.eagle3, FP8 layers as vLLM runs them) on the aux hidden states of
the target (`--target`), draft logits compared at every position.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Below either figure the quantized model no longer computes what its source computes.
MIN_MEAN_COSINE = 0.98
MIN_TOP1_AGREEMENT = 0.9


def _agreement(pairs: list[tuple[Any, Any]]) -> dict[str, Any]:
    import torch

    cos, top1, n = [], 0, 0
    for a, b in pairs:
        cos.append(torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1))
        top1 += int((a.argmax(-1) == b.argmax(-1)).sum())
        n += a.shape[0]
    c = torch.cat(cos)
    return {"positions": n, "mean_cosine": round(float(c.mean()), 5), "min_cosine": round(float(c.min()), 5),
            "top1_agreement": round(top1 / n, 5)}


def _prompt_ids(tokenizer, max_prompts: int) -> list[list[int]]:
    from quantkit.prompts import load_prompts

    records = load_prompts("builtin")
    step = max(1, len(records) // max_prompts)
    return [tokenizer(r.render(tokenizer), add_special_tokens=False)["input_ids"] for r in records[::step][:max_prompts]]


def logits_agreement(quantized: str | Path, source: str | Path, kind: str, target: str | Path | None = None,
                     max_prompts: int = 7) -> dict[str, Any]:
    """Mean/min cosine and top-1 agreement of quantized vs source logits over `max_prompts` built-in prompts."""
    import torch

    from quantkit.hf import load_causal_lm, load_tokenizer

    if kind == "eagle3-draft":
        if target is None:
            raise ValueError("a draft's logits need the target's hidden states: pass --target")
        from transformers import DynamicCache

        from quantkit.acceptance.eagle3 import Eagle3Draft
        from quantkit.acceptance.reference import ReferenceEngine

        tok = load_tokenizer(target)
        tgt = load_causal_lm(target, dtype=torch.float32).eval()
        engine = ReferenceEngine(tgt, source)
        embed = tgt.get_input_embeddings().weight.detach().float()
        drafts = [engine.draft, Eagle3Draft(quantized, embed)]
        pairs = []
        try:
            with torch.no_grad():
                for ids in _prompt_ids(tok, max_prompts):
                    _, aux, _ = engine._forward(ids, DynamicCache())
                    nxt = torch.tensor(ids[1:])
                    outs = []
                    for d in drafts:
                        normed, _, _, _ = d._layer(nxt, d.fc(aux[:-1]), torch.arange(len(ids) - 1), None, None,
                                                   causal=True)
                        outs.append(d.lm_head(normed))
                    pairs.append((outs[0], outs[1]))
        finally:
            engine.close()
        return {"method": "EAGLE-3 step-1 draft logits on the target's aux hidden states", **_agreement(pairs)}

    from quantkit.loading import load_for_torch

    tok = load_tokenizer(source)
    src = load_causal_lm(source, dtype=torch.float32).eval()
    q = load_for_torch(quantized)
    pairs = []
    with torch.no_grad():
        for ids in _prompt_ids(tok, max_prompts):
            x = torch.tensor([ids])
            pairs.append((src(input_ids=x).logits[0], q(input_ids=x).logits[0]))
    return {"method": "next-token logits, source (transformers) vs quantized (Quark's importer)", **_agreement(pairs)}
