"""Prompt sets for acceptance and checks: the built-in chat prompts and user JSONL files.

A record is one JSON object per line with either `messages` (chat turns, rendered with the model's chat
template) or `prompt` (raw text, used as is), plus an optional `domain` (default "default") and `id`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from quantkit.errors import QuantkitError
from quantkit.io.files import require_regular_file
from quantkit.io.jsonin import JsonInputError, parse_json
from quantkit.io.paths import builtin_prompts_file
from quantkit.io.schema import validate

BUILTIN_PROMPTS = builtin_prompts_file()


class PromptFileError(QuantkitError):
    """A prompt file is missing or malformed."""


@dataclass(frozen=True)
class PromptRecord:
    id: str
    domain: str
    messages: tuple[dict[str, str], ...] | None
    prompt: str | None
    # later user turns of a multi-turn conversation (SPEED-Bench `turns[1:]`): each is sent after the model's reply
    # to the previous one, as ModelOpt specdec_bench's run_loop does
    followups: tuple[str, ...] = ()

    def render(self, tokenizer, chat_template_kwargs: dict[str, Any] | None = None) -> str:
        """The text to feed the model: the chat template applied to `messages` (with the template's own keyword
        arguments, e.g. enable_thinking), or the raw `prompt`."""
        if self.prompt is not None:
            return self.prompt
        assert self.messages is not None  # load_prompts gives every record either `prompt` or `messages`
        return tokenizer.apply_chat_template(
            list(self.messages), tokenize=False, add_generation_prompt=True, **(chat_template_kwargs or {})
        )


def _label(value: Any) -> Any:
    # `id` and `domain` are labels: a string, or an integer written without quotes (never a boolean or a list)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise ValueError("should be a string or an integer")
    return value


Label = Annotated[str, BeforeValidator(_label)]


class _Message(BaseModel):
    # strict: a chat turn's role and content are strings as written (5 is not "5"); other keys (name, ...) are passed
    # to the chat template as they are.
    model_config = ConfigDict(extra="allow", strict=True)
    role: str
    content: str


class _Record(BaseModel):
    """One line of a prompts file (unknown keys are the user's own metadata and are ignored)."""

    model_config = ConfigDict(extra="ignore", strict=True)
    messages: list[_Message] | None = Field(default=None, min_length=1)
    prompt: str | None = Field(default=None, min_length=1)
    id: Label | None = None
    domain: Label | None = None

    @model_validator(mode="before")
    @classmethod
    def _one_of(cls, data: Any) -> Any:
        if isinstance(data, dict) and ("messages" in data) == ("prompt" in data):
            raise ValueError("needs exactly one of 'messages' or 'prompt'")
        return data


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
    fix = "one JSON object per line with 'prompt' (text) or 'messages' ([{role, content}]), and optional id, domain"
    records = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = parse_json(line)
        except JsonInputError as e:
            raise PromptFileError(f"prompt file {path}:{n}: {e}; {fix}") from None
        if not isinstance(obj, dict):
            raise PromptFileError(f"prompt file {path}:{n}: a JSON {type(obj).__name__}, not an object; {fix}")
        rec = validate(_Record, obj, f"prompt file {path}:{n}", fix, PromptFileError)
        messages = tuple(m.model_dump() for m in rec.messages) if rec.messages is not None else None
        records.append(
            PromptRecord(
                id=str(rec.id if rec.id is not None else f"{path.stem}-{n}"),
                domain=str(rec.domain if rec.domain is not None else "default"),
                messages=messages,
                prompt=rec.prompt,
            )
        )
    if not records:
        raise PromptFileError(f"prompt file {path} has no prompts")
    return records
