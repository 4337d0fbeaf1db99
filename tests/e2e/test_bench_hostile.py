# tier: e2e
"""`quantkit bench --endpoint` against endpoints that misbehave on purpose (issue 35 items 1, 2, 3, 6, 7, 8, and the
redirect and timeout cases; issue 36 items 3, 6, 9).

Every fake endpoint is a real HTTP server on 127.0.0.1 started here (http.server in a thread) that speaks enough of
vLLM's OpenAI API for vLLM's own benchmark client (run in-process by bench) to measure it, and breaks one thing. No
`vllm serve` starts. Each case checks what a user sees: the exit code, one `error:` line or a failed cell with one
line, no traceback, the password nowhere (stdout, stderr, any file written), and the model folders unchanged.
"""

from __future__ import annotations

import base64
import json
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.hostile import error_lines, pickle_only_folder, run_cli, tree_digest

PASSWORD = "S3cretPassw0rdXyz"
USER = "alice"


class Fake:
    """A fake OpenAI-compatible server: `model` served, `behaviour` names what it breaks."""

    def __init__(self, model: str, behaviour: str = "good", auth: bool = False) -> None:
        self.model, self.behaviour, self.auth = model, behaviour, auth
        self.requests: list[tuple[str, str]] = []
        self.other: Fake | None = None  # where a redirect points


def _handler(fake: Fake) -> type[BaseHTTPRequestHandler]:
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a: Any) -> None:
            pass

        def _send(
            self, code: int, body: bytes, ctype: str = "application/json", extra: dict[str, str] | None = None
        ) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def _authorised(self) -> bool:
            if not fake.auth:
                return True
            want = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
            if self.headers.get("Authorization") != want:
                self._send(401, b'{"error": "unauthorised"}')
                return False
            return True

        def _redirect(self) -> bool:
            if fake.behaviour == "redirect-all" or (
                fake.behaviour == "redirect-completions" and self.path.startswith("/v1/completions")
            ):
                assert fake.other is not None
                self._send(307, b"", extra={"Location": f"{fake.other.url}{self.path}"})  # type: ignore[attr-defined]
                return True
            return False

        def do_GET(self) -> None:  # noqa: N802
            fake.requests.append(("GET", self.path))
            if not self._authorised() or self._redirect():
                return
            if self.path.startswith("/v1/models"):
                if fake.behaviour == "models-list":
                    self._send(200, json.dumps([{"id": fake.model}]).encode())
                elif fake.behaviour == "endless":  # a JSON list that never ends
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(b'{"data": [')
                    try:
                        while True:
                            self.wfile.write(b'{"id": "x"},' * 10_000)
                    except OSError:
                        self.close_connection = True
                elif fake.behaviour == "huge-id":
                    self._send(200, json.dumps({"data": [{"id": "M" * 2_000_000, "root": "M" * 2_000_000}]}).encode())
                else:
                    self._send(
                        200, json.dumps({"object": "list", "data": [{"id": fake.model, "root": fake.model}]}).encode()
                    )
            elif self.path.startswith("/metrics"):
                self._send(200, b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n", "text/plain")
            else:
                self._send(404, b'{"error": "not found"}')

        def do_POST(self) -> None:  # noqa: N802
            n = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(n) or b"{}")
            fake.requests.append(("POST", self.path))
            if not self._authorised() or self._redirect():
                return
            if not self.path.startswith("/v1/completions"):
                self._send(404, b'{"error": "not found"}')
                return
            if fake.behaviour == "stall":
                time.sleep(30)
                return
            max_tokens = int(body.get("max_tokens") or 4)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            if fake.behaviour == "garbage-sse":
                self.wfile.write(b"data: {not json at all\n\ndata: \x00\xff garbage\n\n")
                self.wfile.flush()
                self.close_connection = True
                return
            merged = fake.behaviour == "merged"
            for i in range(max_tokens):
                chunk = {"choices": [{"index": 0, "text": f" t{i}", "finish_reason": None}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                if not merged:
                    self.wfile.flush()
                    time.sleep(0.002)
            tokens: Any = max_tokens
            if fake.behaviour == "nan-usage":
                tokens = "NaN"
            elif fake.behaviour == "inf-usage":
                tokens = "1e999"
            usage = f'{{"choices": [], "usage": {{"prompt_tokens": 5, "completion_tokens": {tokens}}}}}'
            self.wfile.write(f"data: {usage}\n\ndata: [DONE]\n\n".encode())
            self.wfile.flush()
            self.close_connection = True

    return H


@contextmanager
def serve(fake: Fake) -> Iterator[Fake]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    server.daemon_threads = True
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def models(tiny, tmp_path_factory) -> dict[str, Path]:
    """Copies of the bundled target and draft (the sources whose digests must not change)."""
    root = tmp_path_factory.mktemp("bench-hostile-models")
    target = shutil.copytree(tiny / "target", root / "target")
    draft = shutil.copytree(tiny / "eagle3-draft", root / "draft")
    return {"target": target, "draft": draft, "root": root}


def _prompts(tmp: Path) -> Path:
    from tests.conftest import ROOT

    lines = (ROOT / "quantkit" / "data" / "prompts.jsonl").read_text().splitlines()
    path = tmp / "p2.jsonl"
    path.write_text("\n".join(lines[:2]) + "\n")
    return path


def bench(
    models: dict[str, Path], tmp: Path, url: str, *extra: str, out: Path | None = None, arm: str = "target"
) -> Any:
    """`quantkit bench` of the target alone through `url`: one concurrency, one repeat, 4 tokens."""
    before = {k: tree_digest(models[k]) for k in ("target", "draft")}
    out = out or tmp / "out"
    r = run_cli(
        [
            "bench",
            "--target",
            str(models["target"]),
            "--endpoint",
            f"{arm}={url}",
            "--concurrency",
            "1",
            "--repeats",
            "1",
            "--output-len",
            "4",
            "--prompts",
            str(_prompts(tmp)),
            "--out",
            str(out),
            "--request-timeout",
            "5",
            *extra,
        ],
        cwd=tmp,
        timeout=300,
    )
    after = {k: tree_digest(models[k]) for k in ("target", "draft")}
    assert before == after, "a model folder changed"
    assert "Traceback" not in r.stderr + r.stdout, r.stderr[-3000:]
    everything = (
        r.stdout
        + r.stderr
        + "".join(
            p.read_text(errors="replace")
            for p in tmp.rglob("*")
            if p.is_file() and p.suffix in (".json", ".log", ".jsonl", ".txt")
        )
    )
    assert PASSWORD not in everything
    assert base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode() not in everything
    return r


def _with_password(url: str) -> str:
    return url.replace("http://", f"http://{USER}:{PASSWORD}@")


def test_password_in_endpoint_never_printed_or_written_and_still_used(models, tmp_path):
    with serve(Fake(str(models["target"]), auth=True)) as fake:
        r = bench(models, tmp_path, _with_password(fake.url), "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    data = json.loads(r.stdout)
    assert data["arms"][0]["endpoint"] == fake.url  # stored without userinfo
    assert json.loads((tmp_path / "out" / "bench.json").read_text())["arms"][0]["endpoint"] == fake.url
    assert data["arms"][0]["cells"][0]["ok"]
    # the server saw the credentials (every request authorised: none answered 401)
    assert ("POST", "/v1/completions") in fake.requests
    # vLLM's argument dump and results block went to the log named once, not to the terminal
    assert "Namespace(" not in r.stderr and "Serving Benchmark Result" not in r.stderr
    log = tmp_path / "out" / "third-party.log"
    assert "Namespace(" in log.read_text() and str(log) in r.stderr
    assert all(line.startswith("[quantkit bench]") for line in r.stderr.splitlines()), r.stderr[-2000:]


@pytest.mark.parametrize("behaviour", ["nan-usage", "inf-usage", "garbage-sse"])
def test_broken_answers_fail_the_cell_in_one_line(models, tmp_path, behaviour):
    with serve(Fake(str(models["target"]), behaviour)) as fake:
        r = bench(models, tmp_path, fake.url, "--json")
    assert r.returncode == 1, r.stderr[-2000:]  # a failed cell: the answer is "no", not an error
    cell = json.loads(r.stdout)["arms"][0]["cells"][0]
    assert not cell["ok"] and cell["problems"]
    assert all("\n" not in p and len(p) <= 700 for p in cell["problems"])
    failed = [line for line in r.stderr.splitlines() if "FAILED" in line or "failed" in line]
    assert failed and all(len(line) <= 800 for line in r.stderr.splitlines())


@pytest.mark.parametrize(
    "behaviour,words",
    [
        ("models-list", "not a vLLM server's answer"),
        ("huge-id", "more characters"),
        ("endless", "more than 32 MB"),
        ("redirect-all", "redirect"),
    ],
)
def test_broken_server_fails_its_arm_in_one_line(models, tmp_path, behaviour, words):
    with serve(Fake(str(models["target"]))) as other, serve(Fake(str(models["target"]), behaviour)) as fake:
        fake.other = other
        r = bench(models, tmp_path, fake.url, "--json")
    assert r.returncode == 1, r.stderr[-2000:]
    arm = json.loads(r.stdout)["arms"][0]
    assert arm["error"] and words in arm["error"] and len(arm["error"]) <= 800
    assert all(len(line) <= 800 for line in r.stderr.splitlines())
    assert len((tmp_path / "out" / "bench.json").read_text()) < 100_000
    if behaviour == "redirect-all":
        assert other.requests == []  # nothing measured at the other host


def test_redirect_of_requests_is_not_followed(models, tmp_path):
    with (
        serve(Fake(str(models["target"]))) as other,
        serve(Fake(str(models["target"]), "redirect-completions")) as fake,
    ):
        fake.other = other
        r = bench(models, tmp_path, fake.url, "--json")
    assert r.returncode == 1
    assert not json.loads(r.stdout)["arms"][0]["cells"][0]["ok"]
    assert not any(m == "POST" for m, _ in other.requests)


def test_stalled_endpoint_fails_the_cell_after_the_request_timeout(models, tmp_path):
    with serve(Fake(str(models["target"]), "stall")) as fake:
        t0 = time.perf_counter()
        r = bench(models, tmp_path, fake.url, "--json")
        took = time.perf_counter() - t0
    assert r.returncode == 1 and not json.loads(r.stdout)["arms"][0]["cells"][0]["ok"]
    assert took < 250  # the 5 s request timeout, not vLLM's 6 hours


def test_merged_stream_gives_no_interactivity_and_says_why(models, tmp_path):
    """A TPOT of 0 (the tokens reached the client in one chunk) is no TPOT: no interactivity, a warning, one
    repeat named as giving no interval."""
    with serve(Fake(str(models["target"]), "merged")) as fake:
        r = bench(models, tmp_path, fake.url, "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    data = json.loads(r.stdout)
    cell = data["arms"][0]["cells"][0]
    assert cell["interactivity"] is None and cell["interactivity_reason"]
    assert any("interactivity" in w for w in data["warnings"])
    assert any("one repeat" in w for w in data["warnings"])


@pytest.mark.parametrize("url", ["http://[::1", "http://127.0.0.1:99999", "ftp://x", "http://", "http://a b"])
def test_malformed_endpoint_url_is_one_error_line(models, tmp_path, url):
    r = bench(models, tmp_path, url.replace("://", f"://{USER}:{PASSWORD}@", 1) if "//" in url else url)
    assert r.returncode == 2 and len(error_lines(r.stderr)) == 1, r.stderr[-2000:]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["--concurrency", "0"],
        ["--concurrency", "1000000000"],
        ["--k", "99"],
        ["--repeats", "0"],
        ["--output-len", "10000000"],
        ["--request-timeout", "0"],
        ["--tp", "0"],
        ["--concurrency", "1-100000"],
    ],
)
def test_numeric_options_out_of_range_are_refused_before_any_work(models, tmp_path, args):
    r = run_cli(
        ["bench", "--target", str(models["target"]), "--out", str(tmp_path / "out"), *args],
        cwd=tmp_path,
        forbid_heavy=True,
        timeout=60,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["target", "target/sub", "draft"])
def test_out_inside_a_model_folder_is_refused(models, tmp_path, where):
    out = models["root"] / where
    r = bench(models, tmp_path, "http://127.0.0.1:9", "--draft", str(models["draft"]), out=out, arm="target+bf16")
    assert r.returncode == 2 and len(error_lines(r.stderr)) == 1 and "model folder" in r.stderr, r.stderr
    assert not (models["root"] / "target" / "sub").exists()


def test_pickle_only_draft_is_refused_before_any_server(models, tmp_path):
    marker = tmp_path / "pwned"
    draft = pickle_only_folder(models["draft"], tmp_path / "pickled", marker)
    r = run_cli(
        ["bench", "--target", str(models["target"]), "--draft", str(draft), "--out", str(tmp_path / "out")],
        cwd=tmp_path,
        timeout=120,
    )
    assert r.returncode == 2 and len(error_lines(r.stderr)) == 1 and "pickle" in r.stderr, r.stderr
    assert not marker.exists() and not (tmp_path / "out").exists()
    assert "vllm serve" not in r.stderr


def test_default_out_and_no_silent_overwrite(models, tmp_path):
    with serve(Fake(str(models["target"]))) as fake:
        argv = [
            "bench",
            "--target",
            str(models["target"]),
            "--endpoint",
            f"target={fake.url}",
            "--concurrency",
            "1",
            "--repeats",
            "1",
            "--output-len",
            "4",
            "--prompts",
            str(_prompts(tmp_path)),
        ]
        first = run_cli(argv, cwd=tmp_path, timeout=300)
        assert first.returncode == 0, first.stderr[-2000:]
        out = tmp_path / "quantkit-out" / "bench-target"
        assert (out / "bench.json").is_file() and not (tmp_path / "bench-out").exists()
        again = run_cli(argv, cwd=tmp_path, timeout=120)
        assert again.returncode == 2 and "--overwrite" in again.stderr and len(error_lines(again.stderr)) == 1
        third = run_cli([*argv, "--overwrite"], cwd=tmp_path, timeout=300)
        assert third.returncode == 0, third.stderr[-2000:]
    assert "nanobind" not in first.stderr + third.stderr
    assert "target" in first.stdout  # the arm's name, whole, in the table


def test_remote_code_target_refused_naming_a_flag_bench_takes(models, tmp_path):
    """Issue 35.11: the refusal names --trust-remote-code, and bench takes it (no folder code runs without it)."""
    from tests.fixtures.hostile import add_remote_code, copy_model

    marker = tmp_path / "ran"
    target = copy_model(models["target"], tmp_path / "kimi")
    add_remote_code(target, marker)
    before = tree_digest(target)
    r = run_cli(
        ["bench", "--target", str(target), "--endpoint", "target=http://127.0.0.1:9", "--out", str(tmp_path / "out")],
        cwd=tmp_path,
        timeout=300,
    )
    assert r.returncode == 2 and len(error_lines(r.stderr)) == 1, r.stderr[-2000:]
    assert "--trust-remote-code" in error_lines(r.stderr)[0] and "Traceback" not in r.stderr
    assert not marker.exists() and tree_digest(target) == before
    helped = run_cli(["bench", "--help"], cwd=tmp_path, timeout=60)
    assert "--trust-remote-code" in helped.stdout


def test_links_planted_in_out_are_replaced_not_written_through(models, tmp_path):
    """Issue 35.4's class for bench: bench.json, the charts and the per-cell files are written atomically (temp
    file, rename): a link planted in --out is replaced, the file it pointed to is untouched."""
    outside = tmp_path / "outside.txt"
    outside.write_text("mine")
    out = tmp_path / "out"
    out.mkdir()
    for name in ("bench.json", "pareto.png", "throughput.png"):
        (out / name).symlink_to(outside)
    (out / "target").mkdir()
    (out / "target" / "c1-r0.json").symlink_to(outside)
    (out / "target" / "prompts-c1.jsonl").symlink_to(outside)
    with serve(Fake(str(models["target"]))) as fake:
        r = bench(models, tmp_path, fake.url, "--overwrite", out=out)
    assert r.returncode == 0, r.stderr[-2000:]
    assert outside.read_text() == "mine"
    assert json.loads((out / "bench.json").read_text())["arms"][0]["cells"][0]["ok"]
    assert not (out / "bench.json").is_symlink() and not (out / "pareto.png").is_symlink()
