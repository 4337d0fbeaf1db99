"""Errors a user can cause: the CLI prints each as one line `error: <message>` and exits with status 2; and the one
scrubber of secrets (URL credentials, tokens) that every message and log line passes through on its way out."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit


class QuantkitError(Exception):
    """Base for every error caused by user input; the message is one line that names the input and the fix.

    Besides the message it carries what failed as data, for library callers and `--json` runs: `input` (the file,
    field or value at fault), `reason` (what is wrong with it) and `fix` (what to do), each None where the raiser
    gave only the message, and `exit_code` (2 for every error a user can cause)."""

    exit_code = 2

    def __init__(
        self, message: str = "", *, input: str | None = None, reason: str | None = None, fix: str | None = None
    ) -> None:
        if not message:
            message = "; ".join(p for p in (f"{input}: {reason}" if input and reason else (input or reason), fix) if p)
        super().__init__(message)
        if input is None and reason is None and fix is None:
            input, reason, fix = _parts(message)
        self.input = input
        self.reason = reason
        self.fix = fix

    def to_dict(self) -> dict[str, object]:
        """The error as data: its class, the one-line message (secrets scrubbed), input, reason, fix, exit code."""
        return {
            "type": type(self).__name__,
            "message": scrub_secrets(" ".join(str(self).split("\n"))),
            "input": None if self.input is None else scrub_secrets(self.input),
            "reason": None if self.reason is None else scrub_secrets(self.reason),
            "fix": None if self.fix is None else scrub_secrets(self.fix),
            "exit_code": self.exit_code,
        }


# The house form of a message, "INPUT: REASON; FIX": the input is a path, a name or an option with its value.
_LEADING_INPUT = re.compile(r"^((?:--?[\w-]+(?: [^\s:;]+)?)|[^\s:;()'\"]+): (?=\S)")


def _parts(message: str) -> tuple[str | None, str | None, str | None]:
    """(input, reason, fix) read from a message in the house form; the parts it does not show are None."""
    rest, fix = message, None
    head, sep, tail = message.rpartition("; ")
    if sep and head and tail:
        rest, fix = head, tail
    m = _LEADING_INPUT.match(rest)
    if m is None:
        return None, rest or None, fix
    return m.group(1), rest[m.end() :] or None, fix


class RecipeError(QuantkitError):
    """A recipe name or file is unknown, unreadable, or breaks the recipe schema or its rules."""


class CheckpointError(QuantkitError):
    """A checkpoint folder or safetensors file is missing, truncated, or malformed."""


class NonFiniteWeightError(QuantkitError, ValueError):
    """A weight to be quantized, or a decoded source weight, holds NaN or Inf: never quantized silently. The schemes'
    kernels raise it naming the scheme only (a ValueError, as their other refusals); the executor, the decoder and
    the apply verification raise it naming the tensor, its first non-finite index and the fix."""


class BundledDataError(QuantkitError):
    """Data that ships with a source checkout (recipes, tiny example models) is missing or not generated yet."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is (the CLI installs the handler) so that cleanup runs as for Ctrl-C."""


# Signals the CLI's handlers received (name, exit code): an interrupt stays an interrupt even when a library turns it
# into another error, or swallows it (an import that catches every exception around an optional dependency).
RECEIVED: list[tuple[str, int]] = []


def raise_if_signalled() -> None:
    """Raise the interrupt again if a signal arrived and something swallowed it: called before a result is committed
    (an output folder renamed into place), so that a run interrupted mid-import never leaves a complete-looking
    output."""
    if RECEIVED:
        raise Terminated() if RECEIVED[-1][0] == "SIGTERM" else KeyboardInterrupt()


# Files kept on purpose when a run fails or is interrupted (a `vllm serve` log), so that the interrupt line names
# them instead of claiming that every temporary file was removed.
KEPT_FILES: list[str] = []


def keep_file(path: str | Path) -> None:
    """Record that `path` was kept for the user after a failure or interrupt (named by `interrupted_hint`)."""
    if str(path) not in KEPT_FILES:
        KEPT_FILES.append(str(path))


def interrupted_hint(hint: str | None = None) -> str:
    """What the CLI's interrupt line says was left: `hint` (how to resume), or that nothing was left half-written;
    then the files kept on purpose, by name. Never "temporary files removed" when one was kept."""
    kept = ""
    if KEPT_FILES:
        kept = (
            "kept for you: "
            + ", ".join(KEPT_FILES[:3])
            + (f" and {len(KEPT_FILES) - 3} more" if len(KEPT_FILES) > 3 else "")
        )
    if hint:
        return f"{hint}; {kept}" if kept else hint
    return (
        f"nothing was left half-written; {kept}" if kept else "nothing was left half-written (temporary files removed)"
    )


class ResumableInterrupt(KeyboardInterrupt):
    """An interrupt that left a resumable temporary folder; `hint` says how to continue (the CLI prints it)."""

    def __init__(self, hint: str, terminated: bool = False):
        super().__init__(hint)
        self.hint = hint
        self.terminated = terminated


class UnresumableError(QuantkitError):
    """An error after which `--resume` is not the fix: an interrupted run's journal is unreadable or another run's."""


# --- secrets out of every message ---------------------------------------------------------------------------------
# Everything quantkit prints or logs goes through scrub_secrets: the CLI's error line, progress lines, the log
# records and warnings of the libraries it calls (huggingface_hub logs each retried URL), and publish's results. A
# URL's user:password, token-like query parameters, Bearer values, Hub tokens and the secrets registered at run time
# (the publish token, the endpoint's password) never reach a terminal or a CI log.

REDACTED = "***"
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/\s?#]*@")
_QUERY_SECRET = re.compile(
    r"(?i)([?&;](?:access_token|token|api_key|apikey|key|password|passwd|pwd|secret|auth|"
    r"authorization|sig|signature|x-amz-signature|x-amz-credential|x-amz-security-token)=)"
    r"[^&\s#'\"]+"
)
_BEARER = re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=\-]{8,}")
HUB_TOKEN = re.compile(r"(hf_|api_org_)[A-Za-z0-9]{30,}")  # Hugging Face user and (old) organisation tokens
_SECRETS: set[str] = set()


def register_secret(value: str | None) -> None:
    """Scrub `value` (and its URL-encoded forms) from every message from now on: a token, a password. Values under
    6 characters are left to the patterns (replacing a short word everywhere would garble messages)."""
    if value and len(value) >= 6:
        _SECRETS.update(v for v in {value, quote(value, safe=""), unquote(value)} if len(v) >= 6)


def register_url_secrets(url: str | None) -> None:
    """Register the password of a URL's `user:password@` part (the user name is no secret)."""
    try:
        password = urlsplit(url).password if url else None
    except ValueError:
        return
    register_secret(password)


def scrub_secrets(text: str) -> str:
    """`text` with credentials replaced by ***: every registered secret, a URL's `user:password@` (the whole part),
    token-like query parameters, Bearer values and Hub tokens (`hf_***`)."""
    if not text:
        return text
    for secret in sorted(_SECRETS, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, REDACTED)
    text = _USERINFO.sub(lambda m: m.group(1) + REDACTED + "@", text)
    text = _QUERY_SECRET.sub(lambda m: m.group(1) + REDACTED, text)
    text = _BEARER.sub(lambda m: m.group(1) + REDACTED, text)
    return HUB_TOKEN.sub(lambda m: m.group(1) + REDACTED, text)
