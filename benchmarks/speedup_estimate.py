"""The estimate from bytes (quantkit.rules.cost) set beside published speculative-decoding results.

Kimi-K2.5 MXFP4 on MI355X, TP 4, concurrency 4, K 3 (AMD's published figures): 1.90x over no speculation with the
BF16 EAGLE-3 draft, 2.00x with a Quark FP8 draft. Acceptance lengths were not published with them, so the ratio of
the two (2.00 / 1.90 = 1.053, where AL cancels if the FP8 draft keeps the BF16 draft's acceptance) is what the
estimate is compared with. The target's shape is Kimi-K2's config (DeepSeek-V3 layout: 61 layers, the first dense,
384 routed experts top-8 with 2048-wide experts, one shared expert, MLA attention with 64 heads, vocabulary 163,840),
experts in MXFP4 (4.25 bits per weight with the E8M0 scales), the rest BF16; the draft is the SpecForge
kimi-k25-eagle3 shape (MLP 18432, 32,000-row lm_head). Each figure is computed, not measured: no GPU is used.

Usage: python benchmarks/speedup_estimate.py [--record]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from quantkit.rules.cost import PATH_FACTOR, TargetShape, expected_distinct_experts, speedup_bound  # noqa: E402

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
