"""The folder `publish` uploads: it must be one `quantkit apply` wrote (quantkit.json + a Quark config.json); the
files of it that are uploaded (an allow-list: what apply writes), with their sizes and SHA-256, each searched for Hub
tokens first."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from quantkit.errors import QuantkitError
from quantkit.io.checkpoint import sha256_file
from quantkit.io.files import is_aux_file, is_weight_file, scan_folder
from quantkit.io.headers import load_json_file
from quantkit.publish.tokens import hash_and_find_token
from quantkit.results import ApplyResult, ResultFileError, load_manifest
from quantkit.results.publish import PublishedFile

if TYPE_CHECKING:
    from quantkit.publish.redact import Redactor


MANIFEST = "quantkit.json"
CARD = "README.md"


DEFAULT_NUM_SPECULATIVE_TOKENS = 3


TARGET_PLACEHOLDER = "<TARGET>"
QUARK_URL = "https://quark.docs.amd.com"


class PublishError(QuantkitError):
    """The folder cannot be published as asked, or the Hub refused or failed the upload."""


class PublishAuthError(PublishError):
    """No token, or the Hub rejected it (401/403)."""


UploadFile = PublishedFile  # one file of the commit (quantkit.results.publish)


# --- the folder ----------------------------------------------------------------------------------------------------


def read_manifest(folder: str | Path) -> ApplyResult:
    """quantkit.json of an output folder, after checking the folder is one `quantkit apply` wrote."""
    folder = Path(folder)
    if not folder.is_dir():
        raise PublishError(f"{folder}: no such folder; pass the output folder of `quantkit apply`")
    for name in (MANIFEST, "config.json"):
        if not (folder / name).is_file():
            raise PublishError(
                f"{folder} has no {name}: publish only folders written by `quantkit apply` "
                f"(run `quantkit apply --recipe RECIPE --model MODEL --output {folder}` first)"
            )
    fix = "re-run `quantkit apply` to rewrite the folder"
    raw = load_json_file(folder / MANIFEST, fix, PublishError)
    config = load_json_file(folder / "config.json", fix, PublishError)
    if not isinstance(raw, dict) or not isinstance(raw.get("layers"), list):
        raise PublishError(
            f"{folder / MANIFEST}: not a quantkit manifest (no `layers` list); "
            "re-run `quantkit apply` to rewrite the folder"
        )
    try:
        manifest = load_manifest(folder)
    except ResultFileError as e:
        raise PublishError(str(e)) from None
    qc = config.get("quantization_config") if isinstance(config, dict) else None
    if not isinstance(qc, dict) or qc.get("quant_method") != "quark":
        raise PublishError(
            f"{folder / 'config.json'}: no quantization_config with quant_method quark; "
            "publish the output of `quantkit apply`, not its source"
        )
    return manifest


class TokenInUploadError(PublishError):
    """A file that would be uploaded holds a Hub token (the user's own, or one shaped like hf_...)."""


def is_uploaded(name: str) -> bool:
    """Whether a top-level file of the folder goes to the repo: what `apply` writes there (the weights, the index,
    config.json, quantkit.json and io.files.AUX_FILES). README.md is not: the generated card replaces it."""
    return name != CARD and (is_weight_file(name) or name == MANIFEST or is_aux_file(name))


def upload_files(folder: str | Path, tokens: list[str] | None = None) -> list[UploadFile]:
    """The folder's files as they go to the repo (`is_uploaded`), sorted, with sizes and sha256.

    The folder is checked first (io.files.scan_folder): a link that leaves it, a link loop, a link to a folder, a
    pipe or a device is refused. With `tokens` (publish.tokens.user_tokens) each file is also searched, in the same
    read, for those tokens and for anything shaped like a Hub token; the first file holding one is refused."""
    folder = Path(folder)
    entries = scan_folder(folder, inside=True)
    out = []
    for name in entries.files:
        if not is_uploaded(name):
            continue
        if tokens is None:
            p = folder / name
            out.append(UploadFile(path=name, size=p.stat().st_size, sha256=sha256_file(p)))
            continue
        size, sha, found = hash_and_find_token(folder / name, tokens)
        if found:
            raise TokenInUploadError(
                f"{folder / name}: holds {found}; publish uploads no file with a token in it, "
                "and nothing was uploaded: remove the token from the file (and revoke it if "
                "it was ever shared)"
            )
        out.append(UploadFile(path=name, size=size, sha256=sha))
    return out


def skipped_files(folder: str | Path) -> list[str]:
    """What the folder holds that is not uploaded (hidden entries aside): files `is_uploaded` rejects and every
    sub-folder (as `name/`). README.md is not listed: the generated card takes its place."""
    entries = scan_folder(folder, inside=True)
    names = [n for n in entries.files if not is_uploaded(n) and n != CARD]
    return sorted(names + [f"{n}/" for n in entries.folders])


# Text files of a checkpoint that may record where they were written (tokenizer and config files, notes): checked for
# the known local paths of a publish and uploaded with them replaced. Weights are never rewritten.
TEXT_SUFFIXES = (".json", ".jinja", ".txt", ".md", ".yaml", ".yml", ".py")
MAX_TEXT_BYTES = 64 << 20


def rewritten_text_files(
    folder: str | Path, files: list[UploadFile], redactor: Redactor, own: tuple[str, ...] = ()
) -> dict[str, bytes]:
    """Folder files whose text names a known local path, with those paths replaced: {path in repo: new bytes}.
    Files in `own` (quantkit's own JSON: deploy.json, acceptance.json) also lose any other absolute path."""
    import json

    folder = Path(folder)
    out: dict[str, bytes] = {}
    for f in files:
        if not f.path.endswith(TEXT_SUFFIXES) or f.size > MAX_TEXT_BYTES:
            continue
        data = (folder / f.path).read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if f.path in own:
            try:
                obj = json.loads(text)
                cleaned = redactor.deep(obj)
                new = text if cleaned == obj else json.dumps(cleaned, indent=2) + "\n"
            except ValueError:
                new = redactor.text(text)
        else:
            new = redactor.known(text)
        if new != text:
            out[f.path] = new.encode("utf-8")
    return out
