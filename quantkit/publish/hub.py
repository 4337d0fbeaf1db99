"""Publishing a quantkit output folder to the Hugging Face Hub: the generated model card and a one-commit upload.

The card is made from the folder's quantkit.json (what was quantized, what was kept and why, the command and
versions) and, when given, the gate report (acceptance and eval tables, model-index results). Next to the folder's
files the upload holds what bundle.py generates: README.md (the card), quantkit.json without local paths,
acceptance.json and acceptance.png when the report has figures, deploy.json when the checkpoint can be checked.
Nothing published names a local path: models are named by Hub id (redact.py).
The upload is one `create_commit`, so a failure at any point leaves the repo as it was: LFS blobs uploaded before a
failed commit are not part of any revision.
The token is handed to huggingface_hub and nowhere else: it is never printed, logged, or written.

What is uploaded is an allow-list (folder.is_uploaded: what `apply` writes), and before anything is sent every one of
those files and every generated file is searched for the user's Hub tokens and for anything shaped like one
(tokens.py): a hit is a one-line refusal naming the file, and the Hub sees no request at all. Every message and URL
of the result passes through errors.scrub_secrets (an endpoint's user:password never shows).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantkit import __version__
from quantkit.errors import QuantkitError, register_secret, register_url_secrets, scrub_secrets
from quantkit.io import jsonout
from quantkit.io.checkpoint import HUB_ID, publish_permissions
from quantkit.publish.bundle import DEFAULT_PLATFORM, Publication, prepare
from quantkit.publish.card import build_model_card, render_card
from quantkit.publish.charts import CHART
from quantkit.publish.folder import (
    CARD,
    MANIFEST,
    PublishAuthError,
    PublishError,
    TokenInUploadError,
    UploadFile,
    read_manifest,
    rewritten_text_files,
    skipped_files,
    upload_files,
)
from quantkit.publish.sidecar import SIDECAR
from quantkit.publish.tokens import find_token_in_bytes, user_tokens
from quantkit.results import CandidateReport
from quantkit.results.publish import PublishResult

if TYPE_CHECKING:
    from huggingface_hub import HfApi

UPLOAD_PLAN = "upload-plan.json"
# Remote files that a re-publish replaces as a set: a shard left over from an earlier upload with more shards
# would otherwise be loaded next to the new ones by loaders that read every *.safetensors file.
WEIGHT_FILE = re.compile(r"(^|/)[^/]*\.safetensors$|(^|/)model\.safetensors\.index\.json$")
DEPLOY = "deploy.json"
# Generated files a re-publish removes when it no longer generates them: figures of an earlier report (or a deploy
# manifest of an earlier folder) must not stay next to weights they were not measured on.
GENERATED_FILES = (SIDECAR, CHART, DEPLOY)

__all__ = ["PublishAuthError", "PublishError", "PublishResult", "build_model_card", "publish", "read_manifest"]


# --- publishing ----------------------------------------------------------------------------------------------------


def resolve_token(token: str | None = None) -> str:
    """The token to publish with: the argument, else HF_TOKEN, else the huggingface_hub login."""
    if token:
        return token
    from huggingface_hub import get_token

    found = os.environ.get("HF_TOKEN") or get_token()
    register_secret(found)
    if not found:
        raise PublishAuthError(
            "no Hugging Face token: set HF_TOKEN or run `hf auth login` with a token that can "
            "write to the repo (or use --dry-run to only write the card)"
        )
    return found


def _status(e: BaseException) -> int | None:
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        response = getattr(cur, "response", None)
        code = getattr(response, "status_code", None)
        if isinstance(code, int):
            return code
        cur = cur.__cause__ or cur.__context__
    return None


def _one_line(text: str, secret: str | None) -> str:
    register_secret(secret)
    return scrub_secrets(" ".join(str(text).split()))


@dataclass
class _Stage:
    what: str = "connecting"
    head_before: str | None = None


@contextlib.contextmanager
def _hub_errors(api: HfApi, repo_id: str, revision: str, token: str) -> Iterator[_Stage]:
    """Turn what huggingface_hub raises into one-line PublishErrors that name the repo and the fix, and never
    the token."""
    import httpx

    stage = _Stage()
    try:
        yield stage
    except QuantkitError:
        raise
    except Exception as e:
        endpoint = api.endpoint
        status = _status(e)
        detail = _one_line(str(e).split("\n\n")[-1] if status else str(e), token)[:300]
        if status in (401, 403):
            msg = (
                f"the Hub at {endpoint} refused the token ({status}) while {stage.what} {repo_id}: use a token "
                f"with write access to {repo_id.split('/')[0]} in HF_TOKEN or `hf auth login`"
            )
            raise PublishAuthError(_one_line(msg, token)) from None
        if status is not None and status >= 500 or isinstance(e, httpx.TransportError):
            why = f"failed with {status}" if status else f"could not be reached ({type(e).__name__})"
            msg = f"the Hub at {endpoint} {why} while {stage.what} {repo_id}: " + _after_failure(
                api, repo_id, revision, stage
            )
            raise PublishError(_one_line(msg, token)) from None
        if status == 404:
            raise PublishError(
                _one_line(
                    f"{repo_id} (revision {revision}) not found at {endpoint} while "
                    f"{stage.what}: check --repo-id and --revision ({detail})",
                    token,
                )
            ) from None
        msg = f"publishing to {repo_id} at {endpoint} failed while {stage.what}: {type(e).__name__}: {detail}"
        raise PublishError(_one_line(msg, token)) from None


def _after_failure(api: HfApi, repo_id: str, revision: str, stage: _Stage) -> str:
    """What state the repo is in after a failed upload, checked rather than assumed."""
    if stage.what not in ("uploading files to", "committing to"):
        return "nothing was uploaded; run the same command again"
    try:
        head = _head(api, repo_id, revision)
    except Exception:
        return (
            "nothing was published by this run as far as quantkit knows, but the repo could not be re-read "
            "to confirm; check the repo, then run the same command again"
        )
    if head == stage.head_before:
        return (
            f"nothing was committed, the repo is unchanged at {str(head)[:12]}; run the same command again "
            "(files already uploaded are skipped)"
        )
    return f"the branch moved to {str(head)[:12]} meanwhile; check the repo before publishing again"


def _head(api: HfApi, repo_id: str, revision: str) -> str | None:
    from huggingface_hub.errors import RevisionNotFoundError

    try:
        return api.repo_info(repo_id, revision=revision).sha
    except RevisionNotFoundError:
        return None


def generated_files(pub: Publication, work: Path, folder_files: list[UploadFile] | None = None) -> dict[str, bytes]:
    """The files quantkit writes for the upload ({path in repo: bytes}): the card, the public quantkit.json, the
    acceptance sidecar and chart, deploy.json, and folder text files rewritten without local paths. `work` is a
    scratch folder for the chart; `folder_files` the folder's upload_files when already listed."""
    out: dict[str, bytes] = {
        CARD: str(render_card(pub)).encode(),
        MANIFEST: (jsonout.dumps(pub.manifest_json) + "\n").encode(),
    }
    if pub.sidecar is not None:
        out[SIDECAR] = pub.sidecar.to_json().encode()
    if pub.chart:
        from quantkit.publish.charts import render_acceptance_chart

        rep = pub.report
        path = render_acceptance_chart(rep.acceptance if rep else None, rep.eval if rep else None, work / CHART)
        if path is not None:
            out[CHART] = path.read_bytes()
    if pub.deploy_json is not None:
        out[DEPLOY] = (jsonout.dumps(pub.deploy_json) + "\n").encode()
    listed = folder_files if folder_files is not None else upload_files(pub.folder)
    out.update(
        rewritten_text_files(pub.folder, [f for f in listed if f.path not in out], pub.redactor, own=(SIDECAR, DEPLOY))
    )
    return out


def _preview_folder(folder: Path, dry_run_dir: str | Path | None) -> Path:
    """Where a dry run writes, refused in one line unless writing there changes nothing but that folder: never the
    published folder, a folder inside it or one that contains it, a link, or a non-empty folder that is not a
    previous dry run's (`_is_previous_preview`)."""
    out = Path(dry_run_dir).expanduser() if dry_run_dir else folder.parent / f"{folder.name}.publish-preview"
    shown = f"--dry-run-dir {out}" if dry_run_dir else f"dry-run folder {out}"
    if out.is_symlink():
        raise PublishError(f"{shown}: is a symbolic link; pass the folder it points to, or another path")
    real_out, real_folder = Path(os.path.realpath(out)), Path(os.path.realpath(folder))
    relation = (
        "is"
        if real_out == real_folder
        else "lies inside"
        if real_out.is_relative_to(real_folder)
        else "contains"
        if real_folder.is_relative_to(real_out)
        else None
    )
    if relation:
        raise PublishError(
            f"{shown}: {relation} the folder being published ({folder}); a dry run changes nothing "
            "outside its own folder: pass a --dry-run-dir outside it"
        )
    if out.exists():
        if not out.is_dir():
            raise PublishError(f"{shown}: exists and is not a folder; remove it or pass another --dry-run-dir")
        if any(os.scandir(out)) and not _is_previous_preview(out):
            raise PublishError(
                f"{shown}: exists and holds files a dry run did not write; a dry run replaces only "
                "its own previous preview: pass an empty or new --dry-run-dir"
            )
    ancestor = real_out.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
        raise PublishError(f"{shown}: {ancestor} is not a writable folder; pass a --dry-run-dir you can write to")
    return out


def _is_previous_preview(out: Path) -> bool:
    """Whether `out` holds nothing but what a dry run wrote: its upload-plan.json and files that plan lists."""
    from quantkit.io.headers import load_json_file

    plan_path = out / UPLOAD_PLAN
    if plan_path.is_symlink() or not plan_path.is_file():
        return False
    try:
        plan = load_json_file(plan_path, "", PublishError)
        listed = {f["path"] for f in plan["files"]} | {UPLOAD_PLAN}
    except (QuantkitError, KeyError, TypeError):
        return False
    for root, dirs, names in os.walk(out):
        for name in names + [d for d in dirs if Path(root, d).is_symlink()]:
            p = Path(root, name)
            if p.is_symlink() or not p.is_file() or p.relative_to(out).as_posix() not in listed:
                return False
    return True


def _write_dry_run(out: Path, generated: dict[str, bytes], result: PublishResult, folder: Path) -> None:
    """Write the preview into a new folder beside `out`, then put it in place of `out` (a previous preview)."""
    import shutil

    plan = {
        "repo_id": result.repo_id,
        "revision": result.revision,
        "folder": str(folder.resolve()),
        "files": [f.to_dict() for f in result.files],
        "total_bytes": result.total_bytes,
        "generated": result.generated,
        "not_uploaded": result.skipped,
    }
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.quantkit-", dir=out.parent))
    except OSError as e:
        raise PublishError(
            f"dry-run folder {out}: cannot be created ({e.strerror or e}); pass a --dry-run-dir you can write to"
        ) from None
    try:
        for path, data in generated.items():
            (tmp / path).parent.mkdir(parents=True, exist_ok=True)
            (tmp / path).write_bytes(data)
        (tmp / UPLOAD_PLAN).write_text(jsonout.dumps(plan) + "\n")
        publish_permissions(tmp)  # mkdtemp makes a 0700 folder
        if out.exists():
            old = out.with_name(f".{out.name}.quantkit-old-{os.getpid()}")
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
    except OSError as e:
        raise PublishError(
            f"dry-run folder {out}: cannot be written ({e.strerror or e}); pass a --dry-run-dir you can write to"
        ) from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def publish(
    folder: str | Path,
    repo_id: str,
    private: bool = False,
    revision: str | None = None,
    create_pr: bool = False,
    report: CandidateReport | str | Path | dict[str, Any] | None = None,
    dry_run: bool = False,
    endpoint: str | None = None,
    token: str | None = None,
    base_model: str | None = None,
    target: str | None = None,
    dry_run_dir: str | Path | None = None,
    platform: str = DEFAULT_PLATFORM,
    tp: int = 1,
) -> PublishResult:
    """Upload `folder` and its generated model card to the Hub repo `repo_id` in one commit.

    The repo is created if needed (`private` applies only then); `revision` is a branch, created from main if it
    does not exist; `create_pr` opens a pull request instead of committing to the branch. Re-publishing identical
    content makes no commit and returns `unchanged=True` with the existing head. Weight files on the branch that the
    folder no longer has (*.safetensors, the index) are deleted in the same commit. `dry_run` touches no network:
    it writes the generated files (README.md, quantkit.json, ...) and upload-plan.json (every file with size and
    sha256) to `dry_run_dir` (default: a `<folder>.publish-preview` folder beside `folder`), which must not be, hold
    or lie inside `folder` and may replace only a previous preview. `platform` and `tp` are those of the card's
    `vllm serve` command and deploy.json.

    Only what `apply` writes is uploaded (folder.is_uploaded; the rest is listed in `skipped`), and a file holding a
    Hub token (`token`, HF_TOKEN, the login's token file, stored tokens, or anything shaped like hf_...) is refused
    before anything is sent (TokenInUploadError), in a dry run too.
    """
    folder = Path(folder).expanduser()
    register_url_secrets(endpoint)
    register_url_secrets(os.environ.get("HF_ENDPOINT"))
    read_manifest(folder)
    if not HUB_ID.match(repo_id):
        raise PublishError(f"--repo-id {repo_id!r}: use ORG/NAME (letters, digits, '-', '_', '.')")
    revision = revision or "main"
    preview = _preview_folder(folder, dry_run_dir) if dry_run else None
    own = user_tokens(token)
    folder_files = upload_files(folder, own)
    pub = prepare(folder, report, repo_id=repo_id, base_model=base_model, target=target, platform=platform, tp=tp)
    with tempfile.TemporaryDirectory(prefix="quantkit-publish-") as work:
        generated = generated_files(pub, Path(work), folder_files)
    for path, data in sorted(generated.items()):
        found = find_token_in_bytes(data, own)
        if found:
            origin = "quantkit.json and --report" if report is not None else "quantkit.json"
            raise TokenInUploadError(
                f"{path}, which publish generates from the folder's {origin}, would hold "
                f"{found}; nothing was uploaded: remove the token from {origin}"
            )
    files = [f for f in folder_files if f.path not in generated]
    files += [UploadFile(path=p, size=len(d), sha256=hashlib.sha256(d).hexdigest()) for p, d in generated.items()]
    files.sort(key=lambda f: f.path)
    result = PublishResult(
        repo_id=repo_id,
        endpoint=scrub_secrets(endpoint) if endpoint else None,
        revision=revision,
        dry_run=dry_run,
        files=files,
        generated=sorted(generated),
        skipped=skipped_files(folder),
    )
    if preview is not None:
        _write_dry_run(preview, generated, result, folder)
        result.card_path, result.plan_path = str(preview / CARD), str(preview / UPLOAD_PLAN)
        return result

    token = resolve_token(token)
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi
    from huggingface_hub.hf_api import RepoFile

    api = HfApi(endpoint=endpoint, token=token, library_name="quantkit", library_version=__version__)
    register_url_secrets(api.endpoint)
    result.endpoint = scrub_secrets(api.endpoint)
    with _hub_errors(api, repo_id, revision, token) as stage:
        stage.what = "creating"
        repo_url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        result.repo_url = scrub_secrets(str(repo_url))
        stage.what = "reading"
        stage.head_before = _head(api, repo_id, revision)
        if stage.head_before is None:
            stage.what = f"creating branch {revision} of"
            api.create_branch(repo_id, branch=revision, exist_ok=True)
            stage.head_before = _head(api, repo_id, revision)
        local = {f.path for f in files}
        remote = [
            e.path for e in api.list_repo_tree(repo_id, revision=revision, recursive=True) if isinstance(e, RepoFile)
        ]
        result.deleted = sorted(p for p in remote if (WEIGHT_FILE.search(p) or p in GENERATED_FILES) and p not in local)
        ops: list[Any] = [
            CommitOperationAdd(
                path_in_repo=f.path, path_or_fileobj=generated[f.path] if f.path in generated else str(folder / f.path)
            )
            for f in files
        ]
        ops += [CommitOperationDelete(path_in_repo=p) for p in result.deleted]
        additions = [op for op in ops if isinstance(op, CommitOperationAdd)]
        # Upload the blobs first, then commit: the same single commit as create_commit alone makes, but a failure
        # is reported against the step it happened in.
        stage.what = "uploading files to"
        api.preupload_lfs_files(repo_id, additions=additions, revision=revision, create_pr=create_pr, free_memory=False)
        stage.what = "committing to"
        recipe = pub.manifest.recipe.get("name", "quantkit")
        info = api.create_commit(
            repo_id,
            ops,
            revision=revision,
            create_pr=create_pr,
            commit_message=f"quantkit publish: {recipe} ({len(files)} files)",
            commit_description=f"Uploaded by quantkit {__version__} from a `quantkit apply` output folder.",
        )
    result.commit_url, result.commit_oid = scrub_secrets(info.commit_url), info.oid
    result.pr_url = scrub_secrets(info.pr_url) if info.pr_url else None
    result.unchanged = info.oid == stage.head_before and info.pr_url is None
    return result
