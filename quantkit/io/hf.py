"""Loading tokenizers and models through transformers without ever running a model folder's own code unasked.

A folder whose config.json or tokenizer_config.json has an `auto_map` can ship Python files (`modeling_*.py`,
`tokenization_*.py`) that transformers imports when `trust_remote_code` is true, and about which it *asks on the
terminal* when the argument is left unset. quantkit always passes an explicit value: False, unless the user gave
`--trust-remote-code` to the command, which the command's library function turns into `remote_code_allowed(True)`
around its work. A folder that needs its own code then fails with one line that names the folder and the flag.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from quantkit.errors import QuantkitError
from quantkit.io.files import require_regular_file

_TRUST = contextvars.ContextVar("quantkit_trust_remote_code", default=False)
# What a refusal tells the user to do: the flag of a command that takes it, or (set by the CLI for a command that
# does not: bench, gate, deploy, ...) the step that does. The default speaks to the Python API and to commands with
# the flag.
TAKES_FLAG = "pass --trust-remote-code (trust_remote_code=True in the Python API), only for folders you trust"
_HOW = contextvars.ContextVar("quantkit_remote_code_hint", default=TAKES_FLAG)


class TokenizerError(QuantkitError):
    """A model folder has no tokenizer that transformers can load."""


class RemoteCodeError(QuantkitError):
    """Loading a folder would run Python code shipped in it, and the user did not pass --trust-remote-code."""


@contextlib.contextmanager
def remote_code_allowed(allowed: bool) -> Iterator[None]:
    """Within the block, loaders pass `trust_remote_code=allowed` (the default everywhere else is False)."""
    token = _TRUST.set(bool(allowed))
    try:
        yield
    finally:
        _TRUST.reset(token)


@contextlib.contextmanager
def remote_code_hint(how: str) -> Iterator[None]:
    """Within the block, a remote-code refusal ends with `how` (what to do instead) in place of TAKES_FLAG."""
    token = _HOW.set(how)
    try:
        yield
    finally:
        _HOW.reset(token)


def hint_for_command(command: str, takes_flag: bool) -> str:
    """What a refusal of `quantkit COMMAND` tells the user to do: the flag when the command takes it, else the
    commands that do (never a flag the command would reject)."""
    if takes_flag:
        return "pass --trust-remote-code (only for folders you trust)"
    steps = {
        "bench": "serve it yourself with `vllm serve --trust-remote-code` and measure it with vLLM's own "
        "`vllm bench serve`",
        "gate": "run its steps as `quantkit acceptance --trust-remote-code` and `quantkit eval --trust-remote-code`",
    }
    return f"`quantkit {command}` takes no --trust-remote-code and never runs a folder's code; " + steps.get(
        command, "`quantkit check --trust-remote-code` loads such a folder"
    )


def trust_remote_code() -> bool:
    """The value every transformers / vLLM / lm-eval load passes as `trust_remote_code` right now."""
    return _TRUST.get()


def auto_map_modules(folder: str | Path) -> list[str]:
    """The Python modules a local folder's config.json / tokenizer_config.json `auto_map` would import."""
    found: list[str] = []
    for name in ("config.json", "tokenizer_config.json"):
        path = Path(folder) / name
        require_regular_file(path, fix="replace it by the file itself")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError):
            continue
        auto_map = data.get("auto_map") if isinstance(data, dict) else None
        if isinstance(auto_map, dict):
            for ref in auto_map.values():
                for r in ref if isinstance(ref, list) else [ref]:
                    if isinstance(r, str) and "." in r:
                        found.append(r.split("--")[-1].rsplit(".", 1)[0] + ".py")
    return sorted(set(found))


def _refusal(folder: str | Path, e: Exception) -> RemoteCodeError:
    modules = auto_map_modules(folder)
    what = f" ({', '.join(modules)})" if modules else ""
    return RemoteCodeError(
        f"{folder}: loading it would run Python code shipped in the folder{what}; quantkit never "
        f"runs a model folder's code unasked: {_HOW.get()}"
    )


def refuse_remote_code(folder: str | Path) -> None:
    """THE check, before a loader runs in another process (check's vLLM load), that loading `folder`'s config and
    tokenizer needs none of the folder's own code, or that the user allowed it; one RemoteCodeError line naming
    the files otherwise. Only a folder whose config.json or tokenizer_config.json has an auto_map is probed, with
    transformers and trust_remote_code=False (as vLLM would load it: its config aliases registered). A folder
    without a tokenizer, or one transformers fails on for another reason, is left to the load itself."""
    if trust_remote_code() or not Path(folder).is_dir() or not auto_map_modules(folder):
        return
    from transformers import AutoConfig

    register_vllm_config_aliases()
    try:
        AutoConfig.from_pretrained(str(folder), trust_remote_code=False)
    except (ValueError, OSError, TypeError, KeyError) as e:
        if _needs_remote_code(e):
            raise _refusal(folder, e) from None
    with contextlib.suppress(TokenizerError):
        load_tokenizer(folder)


def _needs_remote_code(e: Exception) -> bool:
    return "trust_remote_code" in str(e)


# model_type -> the transformers config class vLLM reads it with, without remote code: vLLM's _CONFIG_REGISTRY
# (vllm/transformers_utils/config.py: `kimi_k2="DeepseekV3Config",  # Kimi K2 uses same architecture as DeepSeek V3`),
# which get_config registers with AutoConfig before AutoTokenizer runs. transformers 5 does not know `kimi_k2`, so
# without this AutoTokenizer / AutoModel build a bare PreTrainedConfig, whose RoPE check (Kimi-K2's yarn
# rope_scaling) dies with "AttributeError: 'PreTrainedConfig' object has no attribute 'max_position_embeddings'".
VLLM_CONFIG_ALIASES: dict[str, str] = {"kimi_k2": "DeepseekV3Config"}


def register_vllm_config_aliases() -> None:
    """Register every VLLM_CONFIG_ALIASES model_type with transformers' AutoConfig as vLLM does, through a subclass
    per model_type (vLLM's _register_config_class sets `model_type` on transformers' own class; a subclass leaves
    DeepseekV3Config as it is). Once registered, a config.json whose auto_map names remote config code loads with the
    local class and trust_remote_code=False, as in vLLM ("it is not considered remote code anymore")."""
    import transformers
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    for model_type, class_name in VLLM_CONFIG_ALIASES.items():
        if model_type in CONFIG_MAPPING:
            continue
        base = getattr(transformers, class_name)
        alias = type(f"Quantkit_{model_type}_{class_name}", (base,), {"model_type": model_type})
        AutoConfig.register(model_type, alias, exist_ok=True)


def load_tokenizer(folder: str | Path, **kwargs: Any) -> Any:
    """AutoTokenizer.from_pretrained with an explicit trust_remote_code; custom code refused in one line."""
    from transformers import AutoTokenizer

    register_vllm_config_aliases()
    try:
        return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=trust_remote_code(), **kwargs)
    except (ValueError, OSError, TypeError) as e:
        if _needs_remote_code(e):
            raise _refusal(folder, e) from None
        first = " ".join(str(e).split())[:160]
        raise TokenizerError(
            f"{folder}: no tokenizer transformers can load ({first}); copy the model's tokenizer "
            "files (tokenizer.json, tokenizer_config.json) into the folder"
        ) from None


def load_causal_lm(folder: str | Path, **kwargs: Any) -> Any:
    """AutoModelForCausalLM.from_pretrained with an explicit trust_remote_code; custom code refused in one line."""
    from transformers import AutoModelForCausalLM

    register_vllm_config_aliases()
    try:
        return AutoModelForCausalLM.from_pretrained(str(folder), trust_remote_code=trust_remote_code(), **kwargs)
    except (ValueError, OSError) as e:
        if _needs_remote_code(e):
            raise _refusal(folder, e) from None
        raise
