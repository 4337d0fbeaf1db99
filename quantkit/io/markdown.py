"""THE escaping of text that comes from input (prompt domains, recipe reasons, candidate and task names, error
messages, paths) into Markdown that quantkit writes: the gate's report.md (rendered in GitHub's step summary) and
the model card (README.md, rendered on the Hugging Face Hub).

Input is data, never markup. So:
- control characters (NUL, ESC and the other C0/C1 controls, DEL) become visible text (`\\x1b`): a terminal
  showing the file never runs an escape sequence, and a NUL never truncates it;
- a newline, carriage return, tab or Unicode line/paragraph separator becomes a space: a value stays on its line
  and inside its table row;
- HTML is shown, not rendered: `&`, `<`, `>` become entities (`<script>`, `<img onerror=...>`, `<!--`);
- Markdown's inline punctuation is backslash-escaped (`\\`, `` ` ``, `*`, `_` at a word's edge, `[`, `]`, `|`, `~`): no emphasis,
  code, link, image or strike-through can be injected, and a value never splits a table row.

`md_code` is for a value shown as code (`` `name` ``): inside a code span nothing is rendered (HTML neither) and
backslash escapes do not apply, so it keeps the characters but drops the line breaks and controls, turns a
backtick into `'`, and escapes `|` (GitHub splits table rows on `|` before it sees code spans).
"""

from __future__ import annotations

import html
import re
from typing import Any

_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_BREAK = re.compile("[\t\n\r\u2028\u2029]")
# Markdown's inline punctuation. Line-start markers (`#`, `-`, `+`, `1.`) need no escape: quantkit never starts a
# line with a value; `(` and `!` form a link or image only next to `[` or `]`, which are escaped.
# `_` between two letters or digits is left alone: CommonMark never opens or closes emphasis inside a word
# (flanking rules), so identifiers such as lm_head and VLLM_ROCM_USE_AITER stay as written.
_MD_PUNCT = re.compile(r"([\\`*\[\]|~]|(?<![0-9A-Za-z])_|_(?![0-9A-Za-z]))")
MAX_CELL = 600  # characters: what a message echoing input may take (README's cap), in a report as on a terminal


def _visible_controls(text: str) -> str:
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _cap(text: str, limit: int | None) -> str:
    if limit is None or len(text) <= limit:
        return text
    return text[:limit] + f"... ({len(text) - limit} more characters)"


class Markup(str):
    """Text quantkit built as Markdown itself (`**all**`, a list of code spans already escaped): md_text leaves it
    as it is. Never wrap input in it."""


def md_text(value: Any, limit: int | None = MAX_CELL) -> str:
    """`value` as plain Markdown text, safe in a paragraph, a list item, a heading or a table cell."""
    if isinstance(value, Markup):
        return str(value)
    text = _cap("" if value is None else str(value), limit)
    text = _BREAK.sub(" ", text)
    text = _MD_PUNCT.sub(r"\\\1", _visible_controls(text))  # backslashes first: a control's \x1b stays visible
    return html.escape(text, quote=False)


def md_code(value: Any, limit: int | None = MAX_CELL) -> str:
    """`value` as an inline code span (with its backticks), safe in a table cell."""
    text = _cap("" if value is None else str(value), limit)
    text = _visible_controls(_BREAK.sub(" ", text)).replace("`", "'").replace("|", "\\|")
    return f"`{text}`" if text.strip() else "` `"
