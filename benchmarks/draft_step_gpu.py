"""Where an EAGLE-3 draft step's time goes on a GPU, measured, against the estimate from bytes.

The linear layers of one draft step of Kimi-K2.5's two published EAGLE-3 draft shapes (hidden 7168, 64 heads x 128,
one layer; MLP 18432 with a 32,000-row lm_head, and MLP 12288 with the full 163,840-row lm_head), each GEMM timed
alone under CUDA graphs at decode batch sizes, in BF16 and with per-tensor FP8 weights (`torch._scaled_mm`, the
activation already FP8: the ideal fused kernel). Printed beside each measured figure is what the bytes the step
reads predict (time proportional to weight bytes, as in a bandwidth-bound step), so the estimate quantkit reports
(`inspect` / `check` on a draft) is checked against the hardware:

- the lm_head's share of a BF16 draft token's linear time;
- the step-time ratio of pruning the full-vocabulary draft's lm_head to 32,000 rows (body BF16, and body FP8).

Attention over the KV cache, norms and sampling are left out (small at 1K context). Figures are ratios within one
run on the GPU it names. Usage: python benchmarks/draft_step_gpu.py [--batch 1,4,16,64] [--out rows.json]
"""

from __future__ import annotations

import argparse
import json
import statistics

HIDDEN, HEADS, HEAD_DIM = 7168, 64, 128
DRAFTS = {
    "specforge-kimi-k25-eagle3": {"intermediate": 18432, "vocab": 32000},
    "torchspec-kimi-k25-eagle3": {"intermediate": 12288, "vocab": 163840},
    "torchspec-kimi-k25-eagle3, lm_head pruned to 32,000": {"intermediate": 12288, "vocab": 32000},
}


def shapes(intermediate: int, vocab: int) -> dict[str, list[tuple[int, int]]]:
    """(in, out) of each linear of one draft token, by role; EAGLE-3's midlayer attention reads 2 x hidden."""
    q = kv = HEADS * HEAD_DIM
    return {
        "attention": [(2 * HIDDEN, q + 2 * kv), (q, HIDDEN)],
        "mlp": [(HIDDEN, 2 * intermediate), (intermediate, HIDDEN)],
        "lm_head": [(HIDDEN, vocab)],
    }


def time_gemm(torch, m: int, k: int, n: int, fp8: bool, replays: int = 200) -> float:
    """Microseconds per `x[m,k] @ w[k,n]` (BF16, or FP8 per-tensor through _scaled_mm), median of 5 graph replays."""
    dev = "cuda"
    if fp8:
        x = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
        w = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=dev)
        fn = lambda: torch._scaled_mm(x, w, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # noqa: E731
    else:
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
        fn = lambda: x @ w  # noqa: E731
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(replays):
            fn()
    runs = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        runs.append(start.elapsed_time(end) * 1000 / replays)
    return statistics.median(runs)


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", default="1,4,16,64")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args()
    batches = [int(b) for b in args.batch.split(",")]
    gpu = torch.cuda.get_device_name(0)
    rows = []
    measured: dict[tuple[str, int, bool], dict[str, float]] = {}
    for name, cfg in DRAFTS.items():
        by_role = shapes(**cfg)
        for m in batches:
            for fp8 in (False, True):
                t = {
                    role: sum(time_gemm(torch, m, k, n, fp8 and role != "lm_head") for k, n in gemms)
                    for role, gemms in by_role.items()
                }
                measured[(name, m, fp8)] = t
    for name, cfg in DRAFTS.items():
        weights = {role: sum(k * n for k, n in gemms) for role, gemms in shapes(**cfg).items()}
        bytes_share = weights["lm_head"] / sum(weights.values())
        for m in batches:
            t = measured[(name, m, False)]
            rows.append(
                {
                    "what": f"{name}: lm_head share of a BF16 draft token, batch {m}",
                    "figure": f"measured {t['lm_head'] / sum(t.values()):.2f}, bytes estimate {bytes_share:.2f}",
                }
            )
    full, pruned = "torchspec-kimi-k25-eagle3", "torchspec-kimi-k25-eagle3, lm_head pruned to 32,000"
    for body_fp8 in (False, True):
        wf = {r: sum(k * n for k, n in g) for r, g in shapes(**DRAFTS[full]).items()}
        wp = {r: sum(k * n for k, n in g) for r, g in shapes(**DRAFTS[pruned]).items()}
        body = 0.5 if body_fp8 else 1.0
        est = (body * (wp["attention"] + wp["mlp"]) + wp["lm_head"]) / (wf["attention"] + wf["mlp"] + wf["lm_head"])
        for m in batches:
            ratio = sum(measured[(pruned, m, body_fp8)].values()) / sum(measured[(full, m, False)].values())
            rows.append(
                {
                    "what": f"full-vocabulary draft pruned to 32,000 rows, body {'FP8' if body_fp8 else 'BF16'}"
                    f", batch {m}: step time / BF16 full-vocabulary step",
                    "figure": f"measured {ratio:.2f}, bytes estimate {est:.2f}",
                }
            )
    for row in rows:
        row["machine"] = f"1 x {gpu}, torch {torch.__version__}, CUDA graphs, per-tensor FP8 _scaled_mm"
        print(f"{row['what']}: {row['figure']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"benchmark": "draft_step_gpu", "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
