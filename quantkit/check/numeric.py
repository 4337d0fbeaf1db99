"""Logits agreement of a quantized checkpoint with its source on a few prompts (`quantkit check --numeric`).

Targets: the source runs in transformers (float32) and the quantized checkpoint through Quark's importer
(quantkit.io.loading), next-token logits compared at every prompt position. EAGLE-3 drafts: both drafts run step 1
of vLLM's EAGLE-3 forward (quantkit.engines.eagle3, FP8 layers as vLLM runs them) on the aux hidden states of
the target (`--target`), draft logits compared at every position.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from quantkit.io.headers import TensorInfo
from quantkit.naming.precision import LoadedCheckpoint
from quantkit.progress import Progress
from quantkit.results.precision import LayerPrecision
from quantkit.rules.rule import Findings
from quantkit.rules.tensors import NUMERIC_BOUNDS
from quantkit.vocab import EAGLE3_DRAFT

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
    return {
        "positions": n,
        "mean_cosine": round(float(c.mean()), 5),
        "min_cosine": round(float(c.min()), 5),
        "top1_agreement": round(top1 / n, 5),
    }


def _prompt_ids(tokenizer, max_prompts: int) -> list[list[int]]:
    from quantkit.io.prompts import load_prompts

    records = load_prompts("builtin")
    step = max(1, len(records) // max_prompts)
    return [
        tokenizer(r.render(tokenizer), add_special_tokens=False)["input_ids"] for r in records[::step][:max_prompts]
    ]


def logits_agreement(
    quantized: str | Path, source: str | Path, kind: str, target: str | Path | None = None, max_prompts: int = 7
) -> dict[str, Any]:
    """Mean/min cosine and top-1 agreement of quantized vs source logits over `max_prompts` built-in prompts."""
    import torch

    from quantkit.io.hf import load_causal_lm, load_tokenizer

    if kind == EAGLE3_DRAFT:
        if target is None:
            raise ValueError("a draft's logits need the target's hidden states: pass --target")
        from quantkit.engines.eagle3 import Eagle3Draft
        from quantkit.engines.reference import ReferenceEngine

        tok = load_tokenizer(target)
        tgt = load_causal_lm(target, dtype=torch.float32).eval()
        engine = ReferenceEngine(tgt, source)
        embed = tgt.get_input_embeddings().weight.detach().float()
        drafts = [engine.draft, Eagle3Draft(quantized, embed)]
        pairs = []
        try:
            with torch.no_grad():
                for ids in _prompt_ids(tok, max_prompts):
                    aux = engine.aux_hidden_states(ids)[:-1]  # the last position has no next token
                    nxt = torch.tensor(ids[1:])
                    pairs.append((drafts[0].step1_logits(nxt, aux), drafts[1].step1_logits(nxt, aux)))
        finally:
            engine.close()
        return {"method": "EAGLE-3 step-1 draft logits on the target's aux hidden states", **_agreement(pairs)}

    from quantkit.io.loading import load_for_torch

    tok = load_tokenizer(source)
    src = load_causal_lm(source, dtype=torch.float32).eval()
    q = load_for_torch(quantized)
    pairs = []
    with torch.no_grad():
        for ids in _prompt_ids(tok, max_prompts):
            x = torch.tensor([ids])
            pairs.append((src(input_ids=x).logits[0], q(input_ids=x).logits[0]))
    return {"method": "next-token logits, source (transformers) vs quantized (Quark's importer)", **_agreement(pairs)}


# --- 3. numeric ------------------------------------------------------------------------------------------------


def numeric_logits(
    ck: LoadedCheckpoint, source: Path, target: str | Path | None, findings: Findings, progress: Progress
) -> dict[str, Any] | None:
    """Logits of the quantized checkpoint vs its source on a few built-in prompts (quantkit.check.numeric)."""
    if ck.model_kind == EAGLE3_DRAFT and target is None:
        findings.add(
            "info",
            "numeric-logits-skipped",
            "--target",
            "a draft's logits need its target's hidden states",
            "pass --target TARGET_DIR",
        )
        return None
    progress("numeric: logits on built-in prompts")
    try:
        res = logits_agreement(ck.path, source, ck.model_kind, target)
    except Exception as e:
        findings.add(
            "error",
            "numeric-logits-failed",
            str(ck.path),
            f"{type(e).__name__}: {str(e).splitlines()[0]}",
            "check that --source is the checkpoint this was quantized from",
        )
        return None
    if res["mean_cosine"] < MIN_MEAN_COSINE or res["top1_agreement"] < MIN_TOP1_AGREEMENT:
        findings.add(
            "error",
            "numeric-logits-disagreement",
            str(ck.path),
            f"logits vs the source: mean cosine {res['mean_cosine']}, top-1 agreement "
            f"{res['top1_agreement']} (need >= {MIN_MEAN_COSINE} and >= {MIN_TOP1_AGREEMENT})",
            "find the layer with `quantkit check --numeric` weight errors; re-quantize it or keep it BF16",
        )
    return res


def numeric_agreement(
    ck: LoadedCheckpoint,
    layers: Sequence[LayerPrecision],
    modules: dict[str, list[tuple[str, TensorInfo]]],
    source: Path,
    findings: Findings,
    progress: Progress,
) -> dict[str, Any]:
    """Dequantize each quantized weight and compare it with the source's: relative Frobenius error per layer."""
    import numpy as np

    from quantkit.io.headers import checkpoint_tensors
    from quantkit.io.tensordata import TensorReader, dequantize_fp8, dequantize_mxfp4

    src_tensors = checkpoint_tensors(source)
    src, out = TensorReader(source), TensorReader(ck.path)
    per_layer: dict[str, Any] = {}
    for lp in layers:
        if not lp.quantized or lp.scheme is None or lp.problem or lp.scheme.family not in NUMERIC_BOUNDS:
            continue
        num = den = 0.0
        for m in lp.checkpoint_modules:
            ps = dict(modules.get(m, []))
            w, s = ps.get(f"{m}.weight"), ps.get(f"{m}.weight_scale")
            ref = src_tensors.get(f"{m}.weight")
            if w is None or s is None or ref is None:
                continue
            wa, sa = out.array(w.file, f"{m}.weight"), out.array(s.file, f"{m}.weight_scale")
            deq = dequantize_mxfp4(wa, sa) if lp.scheme.family == "mxfp4" else dequantize_fp8(wa, sa)
            r = src.array(ref.file, f"{m}.weight")
            if r.shape != deq.shape:
                findings.add(
                    "error",
                    "numeric-shape",
                    f"{m}.weight",
                    f"dequantized {list(deq.shape)} vs source {list(r.shape)}",
                    "is --source the source?",
                )
                continue
            num += float(np.sum((deq - r) ** 2))
            den += float(np.sum(r**2))
        if den == 0:
            continue
        rel = float(np.sqrt(num / den)) if np.isfinite(num) else float("inf")
        bound = NUMERIC_BOUNDS[lp.scheme.family]
        per_layer[lp.name] = {"relative_error": round(rel, 5), "bound": bound, "precision": lp.precision}
        if not rel <= bound:
            findings.add(
                "error",
                "numeric-disagreement",
                lp.name,
                f"dequantized weights differ from the source by {rel:.3g} (relative Frobenius), above "
                f"{bound} for {lp.precision}: wrong scales, packing or source",
                "re-quantize the layer; check --source is the checkpoint it was made from",
            )
    progress(f"numeric: {len(per_layer)} layers compared")
    return {
        "source": str(source),
        "method": "dequantized weights vs source weights (relative Frobenius error)",
        "layers": per_layer,
    }
