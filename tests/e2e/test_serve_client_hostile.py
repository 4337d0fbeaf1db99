# tier: e2e
"""Issue 35 item 8 for quantkit's own serve client (quantkit.engines.serve_client, used by acceptance and the gate's
serve step): a server's streamed answer is validated chunk by chunk at the boundary. A chunk that is not JSON, not
vLLM's shape, or carries NaN, an infinity or a negative count makes that request's problem (one line; the result is
not ok), never an exception out of `measure`.

The server is a real HTTP server on 127.0.0.1 started here (http.server in a thread); the client is quantkit's own,
unchanged, pointed at it through a VllmServer that was never started (its url is the port's).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from quantkit.engines.serve_client import measure
from quantkit.engines.vllm_server import ServeRequestError, VllmServer

TOKENS = 4


def _chunks(behaviour: str) -> list[bytes]:
    """The SSE payloads one request gets."""
    good = [
        json.dumps(
            {
                "choices": [
                    {
                        "index": 0,
                        "text": f" t{i}",
                        "token_ids": [10 + i],
                        "finish_reason": "length" if i == TOKENS - 1 else None,
                    }
                ]
            }
        )
        for i in range(TOKENS)
    ]
    usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": TOKENS}}
    tail = {
        "good": json.dumps(usage),
        "nan-usage": '{"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": NaN}}',
        "inf-usage": '{"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1e999}}',
        "negative-usage": '{"choices": [], "usage": {"prompt_tokens": -3, "completion_tokens": 4}}',
        "list-chunk": "[1, 2, 3]",
        "garbage": "{not json \x00\xff",
        "wrong-types": '{"choices": [{"text": 5, "token_ids": "abc"}]}',
        "deep": "[" * 100_000 + "]" * 100_000,
    }[behaviour]
    return [f"data: {c}\n\n".encode() for c in [*good, tail, "[DONE]"]]


@contextmanager
def fake(behaviour: str) -> Iterator[int]:
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a: Any) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if behaviour == "http-500":
                body = json.dumps({"error": {"message": "x" * 5000 + "\nsecond line"}}).encode()
                self.send_response(500)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for c in _chunks(behaviour):
                self.wfile.write(c)
                self.wfile.flush()

    server = ThreadingHTTPServer(("127.0.0.1", 0), H)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _measure(port: int):
    return measure(VllmServer("tiny-target", None, port=port), ["hello"], max_tokens=TOKENS, request_timeout_s=20)


def test_a_well_formed_stream_is_measured():
    with fake("good") as port:
        res = _measure(port)
    assert res.ok, res.problems
    assert res.requests[0].token_ids == [10, 11, 12, 13] and res.requests[0].completion_tokens == TOKENS


@pytest.mark.parametrize(
    "behaviour,words",
    [
        ("nan-usage", "usage.completion_tokens"),
        ("inf-usage", "usage.completion_tokens"),
        ("negative-usage", "usage.prompt_tokens"),
        ("list-chunk", "not vLLM's"),
        ("garbage", "not JSON"),
        ("wrong-types", "choices.0"),
        ("deep", "not JSON"),
    ],
)
def test_a_broken_chunk_is_the_request_s_problem_in_one_line(behaviour, words):
    with fake(behaviour) as port:
        res = _measure(port)
    assert not res.ok
    mine = [p for p in res.problems if words in p]
    assert mine, res.problems
    assert all("\n" not in p and len(p) <= 400 for p in res.problems)
    assert all(
        isinstance(v, int) or v is None for v in (res.requests[0].completion_tokens, res.requests[0].prompt_tokens)
    )


def test_an_http_error_is_one_capped_line():
    with fake("http-500") as port, pytest.raises(ServeRequestError) as e:
        _measure(port)
    assert "\n" not in str(e.value) and len(str(e.value)) < 500 and "HTTP 500" in str(e.value)
