"""The estimate from bytes (quantkit.rules.cost) set beside published speculative-decoding results.

Kimi-K2.5 MXFP4 on MI355X, TP 4, concurrency 4, K 3 (AMD's published figures): 1.90x over no speculation with the
BF16 EAGLE-3 draft, 2.00x with a Quark FP8 draft. Acceptance lengths were not published with them, so the ratio of
the two (2.00 / 1.90 = 1.053, where AL cancels if the FP8 draft keeps the BF16 draft's acceptance) is what the
estimate is compared with. The target's shape is Kimi-K2's config (DeepSeek-V3 layout: 61 layers, the first dense,
384 routed experts top-8 with 2048-wide experts, one shared expert, MLA attention with 64 heads, vocabulary 163,840),
experts in MXFP4 (4.25 bits per weight with the E8M0 scales), the rest BF16; the draft is the SpecForge
kimi-k25-eagle3 shape (MLP 18432, 32,000-row lm_head). Each figure is computed, not measured: no GPU is used.

MiniMax-M3 MXFP4 with its EAGLE-3.1 draft (AMD's figures): 1.683x over no speculation at concurrency 1 with AL
2.716. The bound from bytes must be at least that (it leaves out everything but weight reads), and the ratio
bound / measured is reported. Where each number comes from is written beside it in `M3_TEXT_CONFIG` and
`m3_eagle31_round`.

Usage: python benchmarks/speedup_estimate.py [--record]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from typing import Any, cast  # noqa: E402

from quantkit.rules.cost import (  # noqa: E402
    PATH_FACTOR,
    SpeedupBound,
    TargetShape,
    expected_distinct_experts,
    speedup_bound,
)

H, LAYERS, DENSE, EXPERTS, TOPK, MOE_I, DENSE_I, VOCAB = 7168, 61, 1, 384, 8, 2048, 18432, 163840
HEADS, Q_LORA, KV_LORA, NOPE, ROPE, V = 64, 1536, 512, 128, 64, 128


def kimi_k25_mxfp4() -> TargetShape:
    attention = (
        H * Q_LORA
        + Q_LORA * HEADS * (NOPE + ROPE)
        + H * (KV_LORA + ROPE)
        + KV_LORA * HEADS * (NOPE + V)
        + HEADS * V * H
    )
    dense_mlp = 3 * H * DENSE_I
    shared = 3 * H * MOE_I
    router = H * EXPERTS
    always = 2 * (LAYERS * attention + DENSE * dense_mlp + (LAYERS - DENSE) * (shared + router) + VOCAB * H)
    return TargetShape(
        always_bytes=always,
        moe_layers=LAYERS - DENSE,
        num_experts=EXPERTS,
        top_k=TOPK,
        expert_bytes=3 * H * MOE_I * 4.25 / 8,
    )


def draft_round(k: int, fp8: bool, intermediate: int = 18432, draft_vocab: int = 32000) -> float:
    q = kv = 64 * 128
    body = 2 * (2 * H * (q + 2 * kv) + q * H + 3 * intermediate * H)
    if fp8:  # fp8-draft: the body row-scaled FP8, counted at its measured speed
        body = body / 2 * PATH_FACTOR["row_scaled"]
    return 2 * 3 * H * H + k * (body + 2 * draft_vocab * H)


# MiniMaxAI/MiniMax-M3 config.json, `text_config` (the keys quantkit.naming.archs.minimax_m3 reads). Values as
# published: hidden 6144, 60 layers of which the first 3 dense (moe_layer_freq [0]*3 + [1]*57; also vLLM's
# configs/minimax_m3.py default), GQA 64 query / 4 KV heads of 128, routed experts 128 x 3072 top-4 plus one 3072-wide
# shared expert, dense MLP 12288, vocabulary 200,064, MSA indexer of 4 heads x 128 on the 57 sparse layers with
# sparse_disable_index_value set there (no index value projection). Two independent public copies of the config.json
# agree on every key (found with the find_string tool: a C++ config-adapter test and a Python test fixture quoting
# MiniMaxAI/MiniMax-M3); NVIDIA's TensorRT-LLM deployment guide confirms "top-4 of 128 routed experts plus one shared
# expert" with dense first layers; and the shape reproduces the published size, 427B total / 26B active (vLLM
# recipes page for MiniMaxAI/MiniMax-M3), within 0.5% (tests/unit/test_speedup_estimate_m3.py).
M3_TEXT_CONFIG: dict[str, object] = {
    "model_type": "minimax_m3",
    "hidden_size": 6144,
    "num_hidden_layers": 60,
    "num_attention_heads": 64,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "intermediate_size": 3072,
    "dense_intermediate_size": 12288,
    "shared_intermediate_size": 3072,
    "n_shared_experts": 1,
    "num_local_experts": 128,
    "num_experts_per_tok": 4,
    "vocab_size": 200064,
    "tie_word_embeddings": False,
    "moe_layer_freq": [0] * 3 + [1] * 57,
    "sparse_attention_config": {
        "use_sparse_attention": True,
        "sparse_index_dim": 128,
        "sparse_num_index_heads": 4,
        "sparse_attention_freq": [0] * 3 + [1] * 57,
        "sparse_disable_index_value": [0] * 3 + [1] * 57,
    },
}
MXFP4_BYTES = 4.25 / 8  # E2M1 weights plus one E8M0 scale per 32


def minimax_m3_mxfp4(text: dict[str, object] | None = None) -> TargetShape:
    """What a MiniMax-M3 MXFP4 decode step reads. amd/MiniMax-M3-MXFP4 (AMD Quark, its model card's exclude list)
    keeps `*self_attn*` (attention and the MSA indexer), the dense `*mlp.*_proj`, the router
    `*block_sparse_moe.gate` and `*lm_head` unquantized; the routed and shared experts are MXFP4. Routers are FP32
    (vLLM's GateLinear), the rest BF16. Embedding reads are a row per token and left out."""
    c = cast(dict[str, Any], text or M3_TEXT_CONFIG)
    h, heads, kv, hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    sparse = c["sparse_attention_config"]
    moe = [bool(f) for f in c["moe_layer_freq"]]
    attention = h * (heads * hd + 2 * kv * hd) + heads * hd * h  # q, k, v, o
    indexer = 0
    for on, no_value in zip(sparse["sparse_attention_freq"], sparse["sparse_disable_index_value"], strict=True):
        if on:  # index_q (heads x dim), index_k (one head), index_v unless disabled
            indexer += h * sparse["sparse_index_dim"] * (sparse["sparse_num_index_heads"] + 1 + (0 if no_value else 1))
    dense = 3 * h * c["dense_intermediate_size"]
    shared = c["n_shared_experts"] * 3 * h * c["shared_intermediate_size"]
    n_moe = sum(moe)
    bf16 = len(moe) * attention + indexer + (len(moe) - n_moe) * dense + c["vocab_size"] * h
    always = 2 * bf16 + n_moe * (shared * MXFP4_BYTES + 4 * c["num_local_experts"] * h)
    return TargetShape(
        always_bytes=always,
        moe_layers=n_moe,
        num_experts=c["num_local_experts"],
        top_k=c["num_experts_per_tok"],
        expert_bytes=3 * h * c["intermediate_size"] * MXFP4_BYTES,
    )


def m3_eagle31_round(k: int, intermediate: int = 24576, draft_vocab: int = 200064) -> float:
    """Bytes of one drafting round of amd/MiniMax-M3-EAGLE3.1 (BF16): fc once, then K x (attention over 2 x hidden,
    MLP, lm_head). Shape: a one-layer Llama EAGLE-3 head at the target's hidden 6144 with 64-head MHA of 128 and a
    200,064-row lm_head (the public cards of MiniMax-M3's EAGLE-3 drafts: Inferact/MiniMax-M3-EAGLE3 "1-layer dense
    Llama, ~3.3 B params, hidden_size=6144 / vocab_size=200064"; Sebesky/MiniMax-M3-EAGLE3-RTN-INT4 "hidden 6144,
    64-head full MHA, head_dim 128, own embed_tokens and lm_head (vocab 200,064)"). Its MLP width is in no source found:
    4 x hidden (24576) is taken, the widest usual width, which makes the draft dearest and so the bound lowest (and
    gives ~3.4B parameters with the embedding, the cards' ~3.3B)."""
    h = int(cast(int, M3_TEXT_CONFIG["hidden_size"]))
    q = kv = 64 * 128
    body = 2 * (2 * h * (q + 2 * kv) + q * h + 3 * intermediate * h)
    return 2 * 3 * h * h + k * (body + 2 * draft_vocab * h)


M3_MEASURED, M3_AL, M3_K, M3_BATCH = 1.683, 2.716, 3, 1


def m3_estimate(platform: str = "MI355X", tp: int = 8) -> SpeedupBound:
    """The bound for MiniMax-M3 MXFP4 + EAGLE-3.1 at AMD's point: concurrency 1, K 3, AL 2.716; MI355X, TP 8 (the
    vLLM blog's serve command; the bound is the same at any TP: every read is split alike)."""
    return speedup_bound(minimax_m3_mxfp4(), m3_eagle31_round(M3_K), M3_AL, M3_K, M3_BATCH, platform, tp)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", action="store_true", help="append the rows to benchmarks/results/")
    args = ap.parse_args()
    target, k, batch, al = kimi_k25_mxfp4(), 3, 4, 3.0
    rows = []
    for fp8_factor in (PATH_FACTOR["row_scaled"], 1.0):
        PATH_FACTOR["row_scaled"] = fp8_factor
        bf16 = speedup_bound(target, draft_round(k, False), al, k, batch, "MI355X", tp=4)
        fp8 = speedup_bound(target, draft_round(k, True), al, k, batch, "MI355X", tp=4)
        kernel = "row-scaled FP8 at its measured speed" if fp8_factor > 1 else "ideal FP8 (half the bytes' time)"
        rows.append(
            {
                "what": f"Kimi-K2.5 MXFP4, MI355X TP 4, c=4, K=3: FP8-draft / BF16-draft throughput, {kernel}",
                "figure": f"bound {fp8.speedup / bf16.speedup:.3f}, uniform routing "
                f"{fp8.speedup_uniform / bf16.speedup_uniform:.3f}; published 2.00/1.90 = 1.053",
            }
        )
    PATH_FACTOR["row_scaled"] = 1.6
    distinct = expected_distinct_experts(EXPERTS, TOPK, batch * (k + 1))
    rows.append(
        {
            "what": "Kimi-K2.5 MXFP4, c=4, K=3: experts a verify step reads per layer, uniform routing",
            "figure": f"{distinct:.1f} of {EXPERTS} (decode of 4 tokens: "
            f"{expected_distinct_experts(EXPERTS, TOPK, batch):.1f})",
        }
    )
    m3 = m3_estimate()
    rows.append(
        {
            "what": "MiniMax-M3 MXFP4 + EAGLE-3.1, MI355X, c=1, K=3, AL 2.716: speedup over no speculation",
            "figure": f"bound {m3.speedup:.3f}, uniform routing {m3.speedup_uniform:.3f}; measured {M3_MEASURED}; "
            f"bound / measured {m3.speedup / M3_MEASURED:.3f}",
        }
    )
    for row in rows:
        row["machine"] = "computed (estimate from bytes), no hardware"
        print(f"{row['what']}: {row['figure']}")
    if args.record:
        from record import record

        record(
            "speedup_estimate",
            [{"figure": r["figure"], "machine": r["machine"]} for r in rows],
            what="estimate from bytes beside published figures",
        )


if __name__ == "__main__":
    main()
