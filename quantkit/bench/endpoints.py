"""`bench --endpoint ARM=URL`: the URL read once, its credentials kept apart, and every answer of the server checked
against a schema before anything is read from it.

- A URL's `user:password@` never leaves this module: the arm records (and bench.json, `--json` and the progress
  lines show) the URL without it; the credentials travel as an `Authorization: Basic` header, given to httpx here
  and to vLLM's benchmark client through its `--header` option, which vLLM redacts from its own argument dump
  (vllm/benchmarks/serve.py `_SENSITIVE_ARG_FIELDS`). The password is also registered with
  quantkit.errors.register_secret, so a library message that quotes it is scrubbed on its way out.
- What a server says is input: /v1/models, /server_info and the figures of vLLM's client are validated (pydantic,
  finite numbers) and everything echoed from them is cut to ECHO_CAP characters on one line.
"""

from __future__ import annotations

import base64
import math
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, ValidationError

from quantkit.errors import QuantkitError, register_secret, scrub_secrets

ECHO_CAP = 600  # the CLI's cap on a message that echoes input (quantkit.cli.app.MAX_MESSAGE), for server text too


class BenchError(QuantkitError):
    """The bench could not be run as asked (bad arms, endpoints, or an endpoint serving something else)."""


class EndpointError(BenchError):
    """An --endpoint value is malformed, or its server answered something that is not a vLLM server's answer."""


def echo(value: Any, cap: int = ECHO_CAP) -> str:
    """`value` as text fit to print or store: one line, secrets scrubbed, at most `cap` characters (+ a count)."""
    text = scrub_secrets(" ".join(str(value).split()))
    if len(text) > cap:
        return text[:cap] + f"... ({len(text) - cap} more characters)"
    return text


@dataclass(frozen=True)
class Endpoint:
    """A parsed --endpoint URL: `url` without credentials (what is shown and stored), `authorization` the header
    value that carries them (None without userinfo)."""

    url: str
    authorization: str | None = None

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": self.authorization} if self.authorization else {}


def parse_endpoint(value: str, option: str = "--endpoint") -> Endpoint:
    """An http(s) URL with a host, split into the URL without `user:password@` and its Basic credentials; anything
    else (no scheme, `http://[::1`, a port out of range, a path that is not a base URL) is refused in one line."""
    shown = echo(value, 200)
    try:
        parts = urlsplit(value)
        port = parts.port  # raises ValueError for a port out of range or not a number
        host = parts.hostname
    except ValueError as e:
        raise EndpointError(
            f"{option} {shown}: not a valid URL ({echo(e, 120)}); give a base URL such as http://node:8000"
        ) from None
    if parts.scheme not in ("http", "https") or not host:
        raise EndpointError(
            f"{option} {shown}: give an http:// or https:// base URL with a host, such as http://node:8000"
        )
    if parts.query or parts.fragment:
        raise EndpointError(f"{option} {shown}: a base URL has no ?query or #fragment; give e.g. http://node:8000")
    if any(c.isspace() or ord(c) < 32 for c in value):
        raise EndpointError(f"{option} {shown}: holds whitespace or control characters; give a plain base URL")
    auth = None
    if parts.username is not None or parts.password is not None:
        from urllib.parse import unquote

        user, password = unquote(parts.username or ""), unquote(parts.password or "")
        register_secret(password)
        auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
        register_secret(auth.split(" ", 1)[1])
    netloc = (f"[{host}]" if ":" in host else host) + (f":{port}" if port is not None else "")
    url = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
    return Endpoint(url=url, authorization=auth)


def parse_endpoints(values: tuple[str, ...] | list[str]) -> dict[str, Endpoint]:
    """`ARM=URL` values of --endpoint, by arm."""
    out: dict[str, Endpoint] = {}
    for v in values:
        arm, sep, url = v.partition("=")
        if not sep or not arm or not url:
            raise EndpointError(
                f"--endpoint {echo(v, 200)}: give ARM=URL, e.g. target+bf16=http://node:8000 (the arm "
                "names are printed by a run without endpoints)"
            )
        if arm in out:
            raise EndpointError(f"--endpoint {echo(arm, 100)}=...: given twice; give one URL per arm")
        out[arm] = parse_endpoint(url, f"--endpoint {echo(arm, 100)}=")
    return out


# --- what a server answers ----------------------------------------------------------------------------------------


class _Answer(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class ModelCard(_Answer):
    id: str
    root: str | None = None


class ModelList(_Answer):
    """/v1/models of an OpenAI-compatible server (vllm/entrypoints/openai/protocol.py ModelList)."""

    data: list[ModelCard]


class SpeculativeInfo(_Answer):
    model: str | None = None
    num_speculative_tokens: int | None = None


class VllmConfigInfo(_Answer):
    speculative_config: SpeculativeInfo | None = None


class ServerInfo(_Answer):
    """The part of vLLM's /server_info (config_format=json) that bench reads."""

    vllm_config: VllmConfigInfo | None = None


def validated(model: type[_Answer], data: Any, what: str) -> Any:
    """`data` (parsed JSON) as `model`, or an EndpointError naming `what` and the first problem."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        first: dict[str, Any] = dict(e.errors()[0]) if e.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ())) or "answer"
        raise EndpointError(f"{what}: not a vLLM server's answer ({where}: {echo(first.get('msg', e), 120)})") from None


def nonfinite(data: Any, path: str = "") -> str | None:
    """The path of the first NaN or infinity in `data` (dicts, lists, numbers), or None."""
    if isinstance(data, float) and not math.isfinite(data):
        return path or "value"
    if isinstance(data, dict):
        for k, v in data.items():
            if (found := nonfinite(v, f"{path}.{k}" if path else str(k))) is not None:
                return found
    elif isinstance(data, (list, tuple)):
        for i, v in enumerate(data):
            if (found := nonfinite(v, f"{path}[{i}]")) is not None:
                return found
    return None
