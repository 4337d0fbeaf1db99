"""Prompt sets for acceptance and checks: the built-in chat prompts and user JSONL files.

A record is one JSON object per line with either `messages` (chat turns, rendered with the model's chat
template) or `prompt` (raw text, used as is), plus an optional `domain` (default "default") and `id`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from quantkit.errors import QuantkitError
from quantkit.io.files import require_regular_file
from quantkit.io.paths import builtin_prompts_file

BUILTIN_PROMPTS = builtin_prompts_file()


class PromptFileError(QuantkitError):
    """A prompt file is missing or malformed."""


@dataclass(frozen=True)
class PromptRecord:
    id: str
    domain: str
    messages: tuple[dict[str, str], ...] | None
    prompt: str | None

    def render(self, tokenizer) -> str:
        """The text to feed the model: the chat template applied to `messages`, or the raw `prompt`."""
        if self.prompt is not None:
            return self.prompt
        assert self.messages is not None  # load_prompts gives every record either `prompt` or `messages`
        return tokenizer.apply_chat_template(list(self.messages), tokenize=False, add_generation_prompt=True)


def load_prompts(source: str | Path = "builtin") -> list[PromptRecord]:
    """Load `builtin` or a JSONL file; every error names the file and line."""
    path = BUILTIN_PROMPTS if str(source) == "builtin" else Path(source)
    require_regular_file(path, "prompt file", "pass 'builtin' or a JSONL file", PromptFileError)
    if not path.is_file():
        raise PromptFileError(f"prompt file {path} not found; pass 'builtin' or a JSONL file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise PromptFileError(f"prompt file {path}: not UTF-8 text; save it as UTF-8 JSONL") from None
    except OSError as e:
        raise PromptFileError(f"prompt file {path}: cannot read it ({e.strerror or e})") from None
    records = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise PromptFileError(f"prompt file {path}:{n}: not JSON ({e.msg}); one JSON object per line") from None
        except RecursionError:
            raise PromptFileError(f"prompt file {path}:{n}: JSON nested too deeply; one flat object per line") from None
        if not isinstance(obj, dict) or ("messages" in obj) == ("prompt" in obj):
            raise PromptFileError(f"prompt file {path}:{n}: needs exactly one of 'messages' or 'prompt'")
        if "prompt" in obj and not (isinstance(obj["prompt"], str) and obj["prompt"]):
            raise PromptFileError(f"prompt file {path}:{n}: 'prompt' must be a non-empty string")
        for key in ("id", "domain"):
            if key in obj and not isinstance(obj[key], (str, int)):
                raise PromptFileError(f"prompt file {path}:{n}: '{key}' must be a string")
        messages = obj.get("messages")
        if "messages" in obj and (not isinstance(messages, list) or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages) or not messages):
            raise PromptFileError(f"prompt file {path}:{n}: 'messages' must be a list of {{role, content}} strings")
        records.append(PromptRecord(id=str(obj.get("id", f"{path.stem}-{n}")), domain=str(obj.get("domain", "default")),
                                    messages=tuple(messages) if messages is not None else None,
                                    prompt=obj.get("prompt")))
    if not records:
        raise PromptFileError(f"prompt file {path} has no prompts")
    return records
