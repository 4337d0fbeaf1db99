"""Local paths out of what `publish` uploads: the folder's quantkit.json names the source, output and target folders
and the command line as they were on the machine that ran `apply`; the published copy names the Hub ids instead.

A `Redactor` knows each local path involved (as recorded, absolute and resolved) and the public name that replaces
it: the base model's Hub id for the source, the `--target` id for a draft's target, the folder's base name for the
output. Known paths are replaced wherever they occur (as a whole path, or as the prefix of a longer one); in files
quantkit writes itself, any other absolute path left is replaced by its base name. A user name or host name
reaches a published file only inside such a path, so the same replacement removes them. The published manifest's
`redacted` key lists the fields that changed (the card says the same), never the local values.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantkit.io.checkpoint import HUB_ID

# Characters that end a path inside text: whitespace, quotes and the punctuation around paths in messages and JSON.
_STOP = r"""\s'"`,;()\[\]{}<>|=*"""
# An absolute POSIX path (or ~/...) of at least one component, at the start of a string or after a space, quote,
# bracket, `=` or `,`: never part of a URL (`https://a/b`), a relative path (`a/b`) or markup (`</s>`).
ABS_PATH = re.compile(rf"""(?:^|(?<=[\s'"`(\[{{=,]))~?/(?:[^{_STOP}/]+/)*[^{_STOP}/]+""")


def is_local(value: str | Path | None) -> bool:
    """Whether a recorded model reference is a local path rather than a Hub id: absolute, ~ or ./-relative, or an
    existing file or folder here (a local folder with one slash looks like a Hub id)."""
    if value is None or str(value) == "":
        return False
    text = str(value)
    if text.startswith(("/", "~", "./", "../")) or "\\" in text:
        return True
    if Path(text).exists():
        return True
    return not HUB_ID.match(text) and ("/" in text or os.sep in text)


def hub_ref(value: str | Path | None) -> str | None:
    """`value` when it is a Hub id (ORG/NAME) that is not a local path here, else None."""
    if value is None:
        return None
    text = str(value)
    return text if HUB_ID.match(text) and not is_local(text) else None


def _variants(local: str) -> list[str]:
    """The ways a local path can appear: as recorded, without a trailing slash, absolute, with links resolved."""
    out = {local, local.rstrip("/")}
    expanded = os.path.expanduser(local)
    out.add(os.path.abspath(expanded))
    try:
        out.add(str(Path(expanded).resolve()))
    except OSError:
        pass
    return [v for v in out if v and v not in ("/", ".", "~")]


def _constant(value: str) -> Callable[[re.Match[str]], str]:
    return lambda _match: value


@dataclass
class Redactor:
    """Replaces the local paths of one publish by public names (Hub ids or base names)."""

    # (local path, public name), longest first: a path is replaced before any of its parents.
    pairs: list[tuple[str, str]] = field(default_factory=list)
    # A whole token equal to a recorded local path, relative ones included (`--output out`).
    tokens: dict[str, str] = field(default_factory=dict)
    others: int = 0  # other absolute paths replaced by their base names

    def add(self, local: str | Path | None, public: str) -> None:
        """Replace the local path `local` (when it is one) by `public`."""
        if local is None or not is_local(local):
            return
        text = str(local)
        self.tokens[text] = public
        for v in _variants(text):
            self.tokens.setdefault(v, public)
            if v.startswith("/") or "/" in v:
                self.pairs.append((v, public))
        self.pairs.sort(key=lambda p: -len(p[0]))

    def known(self, text: str) -> str:
        """`text` with every known local path (whole, or as the start of a longer path) replaced."""
        for local, public in self.pairs:
            if local in text:
                # A function, not a replacement string: a public name is never read as a template.
                text = re.sub(re.escape(local) + r"(?![\w.-])", _constant(public), text)
        return text

    def text(self, text: str) -> str:
        """Known local paths replaced, then any other absolute path replaced by its base name (for quantkit's
        own files: JSON fields and messages, where no legitimate value is an absolute path)."""
        text = self.known(text)

        def base(m: re.Match[str]) -> str:
            self.others += 1
            return Path(m.group(0)).name or "<path>"

        return ABS_PATH.sub(base, text)

    def token(self, token: str) -> str:
        """One command-line argument: a recorded local path becomes its public name, any other path its base name
        (`--opt=value` forms too)."""
        if token in self.tokens:
            return self.tokens[token]
        if token.startswith("--") and "=" in token:
            opt, _, value = token.partition("=")
            return f"{opt}={self.token(value)}"
        if token.startswith(("/", "~")) or (
            ("/" in token or os.sep in token) and not HUB_ID.match(token) and not token.startswith("re:")
        ):
            replaced = self.known(token)
            if replaced != token:
                return replaced
            self.others += 1
            return Path(token).name or token
        return token

    def command(self, command: str) -> str:
        """A recorded command line with local paths replaced, the executable shortened to its name (`quantkit`)."""
        try:
            parts = shlex.split(command)
        except ValueError:
            return self.text(command)
        if not parts:
            return command
        head = Path(parts[0]).name if parts[0].startswith(("/", "~", ".")) or "/" in parts[0] else parts[0]
        return " ".join([head, *(self.token(p) for p in parts[1:])])

    def deep(self, obj: Any) -> Any:
        """Every string (values and keys) of decoded JSON through `text`."""
        if isinstance(obj, str):
            return self.text(obj)
        if isinstance(obj, dict):
            return {self.text(k): self.deep(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [self.deep(v) for v in obj]
        return obj


def public_manifest(
    raw: dict[str, Any], redactor: Redactor, folder_name: str, source_ref: str, target_ref: str | None
) -> dict[str, Any]:
    """The quantkit.json that is uploaded: `source`, `output` and `target` as public names, the command rewritten
    with them, every other string free of absolute paths; `redacted` lists what changed (no local path)."""
    out = dict(raw)
    changed: list[str] = []
    source = raw.get("source")
    if isinstance(source, str) and is_local(source):
        out["source"] = source_ref
        changed.append("source")
    output = raw.get("output")
    if isinstance(output, str) and output and output != folder_name:
        out["output"] = folder_name
        changed.append("output")
    target = raw.get("target")
    if isinstance(target, str) and is_local(target):
        out["target"] = target_ref or Path(target).name
        changed.append("target")
    command = raw.get("command")
    if isinstance(command, str) and command:
        rewritten = redactor.command(command)
        if rewritten != command:
            out["command"] = rewritten
            changed.append("command")
    before = redactor.others
    rest = {k: v for k, v in out.items() if k not in ("source", "output", "target", "command")}
    cleaned = redactor.deep(rest)
    out.update(cleaned)
    if redactor.others > before:
        changed.append("other absolute paths (base names)")
    if changed:
        out["redacted"] = changed
    return out
