"""Speed of the acceptance backends on the bundled pair, as ratios to a baseline run in the same process.

    python benchmarks/acceptance_speed.py [--prompts builtin] [--max-new-tokens 64] [--repeats 2] [--no-vllm]

Baseline: the target's own greedy generation with transformers (HF `generate`, KV cache) on the same prompts.
Measured: the reference engine (target + BF16 EAGLE-3 draft, K=3, greedy) and, when vLLM is installed, the vLLM
backend (engine start excluded and reported separately). Machines here are noisy: read the ratios, not seconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", default="builtin")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--no-vllm", action="store_true")
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from quantkit.engines.reference import ReferenceEngine
    from quantkit.io.prompts import load_prompts

    tiny = ROOT / "examples" / "tiny"
    tok = AutoTokenizer.from_pretrained(tiny / "target")
    model = AutoModelForCausalLM.from_pretrained(tiny / "target", dtype=torch.float32).eval()
    texts = [r.render(tok) for r in load_prompts(args.prompts)]
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    eos = tok.eos_token_id

    def plain() -> int:
        n = 0
        with torch.no_grad():
            for p in ids:
                out = model.generate(
                    torch.tensor([p]),
                    max_new_tokens=args.max_new_tokens,
                    do_sample=False,
                    eos_token_id=eos,
                    pad_token_id=tok.pad_token_id,
                )
                n += out.shape[1] - len(p)
        return n

    engine = ReferenceEngine(model, tiny / "eagle3-draft")

    def reference() -> int:
        return sum(len(engine.generate(p, 3, args.max_new_tokens, eos_token_ids={eos}).output_ids) for p in ids)

    def timed(fn) -> tuple[float, int]:
        times, tokens = [], 0
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            tokens = fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times), tokens

    base_s, base_tokens = timed(plain)
    ref_s, ref_tokens = timed(reference)
    print(f"prompts: {len(ids)}, max_new_tokens: {args.max_new_tokens}, repeats: {args.repeats} (median)")
    print(f"baseline  HF greedy generate      {base_s:7.2f}s  {base_tokens} tokens  ratio 1.00")
    print(f"reference spec decode (K=3)       {ref_s:7.2f}s  {ref_tokens} tokens  ratio {ref_s / base_s:.2f}")

    if not args.no_vllm:
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            print("vllm: not installed")
            return
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from quantkit.engines.vllm_engine import run_spec_decode as run_vllm

        t0 = time.perf_counter()
        from quantkit.engines.vllm_engine import make_llm

        llm = make_llm(tiny / "target", tiny / "eagle3-draft", num_speculative_tokens=3, max_model_len=1024)
        start = time.perf_counter() - t0
        from vllm import SamplingParams

        params = SamplingParams(temperature=0, max_tokens=args.max_new_tokens)

        def vllm_run() -> int:
            outs = llm.generate(texts, params, use_tqdm=False)
            return sum(len(o.outputs[0].token_ids) for o in outs)

        v_s, v_tokens = timed(vllm_run)
        print(
            f"vllm      spec decode (K=3, batch) {v_s:7.2f}s  {v_tokens} tokens  ratio {v_s / base_s:.2f}  "
            f"(engine start {start:.1f}s, not included)"
        )
        del llm, run_vllm


if __name__ == "__main__":
    main()
