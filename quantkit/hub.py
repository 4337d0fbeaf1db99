"""Publishing a quantkit output folder to the Hugging Face Hub: the generated model card and a one-commit upload.

The card is made from the folder's quantkit.json (what was quantized, what was kept and why, the command and
versions) and, when given, the gate report (quantkit.report: acceptance and eval tables, model-index results).
The upload is one `create_commit` holding every file of the folder plus README.md (the card), so a failure at
any point leaves the repo as it was: LFS blobs uploaded before a failed commit are not part of any revision.
The token is handed to huggingface_hub and nowhere else: it is never printed, logged, or written.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantkit import __version__, jsonout
from quantkit.errors import QuantkitError
from quantkit.headers import load_json_file
from quantkit.report import Report, load_report, parse_report

if TYPE_CHECKING:
    from huggingface_hub import HfApi, ModelCard

MANIFEST = "quantkit.json"
CARD = "README.md"
UPLOAD_PLAN = "upload-plan.json"
DEFAULT_NUM_SPECULATIVE_TOKENS = 3
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
# Remote files that a re-publish replaces as a set: a shard left over from an earlier upload with more shards
# would otherwise be loaded next to the new ones by loaders that read every *.safetensors file.
WEIGHT_FILE = re.compile(r"(^|/)[^/]*\.safetensors$|(^|/)model\.safetensors\.index\.json$")
TARGET_PLACEHOLDER = "<TARGET>"
QUARK_URL = "https://quark.docs.amd.com"


class PublishError(QuantkitError):
    """The folder cannot be published as asked, or the Hub refused or failed the upload."""


class PublishAuthError(PublishError):
    """No token, or the Hub rejected it (401/403)."""


@dataclass
class UploadFile:
    """One file of the commit: its path in the repo, size and sha256."""

    path: str
    size: int
    sha256: str


@dataclass
class PublishResult:
    """What `publish` did (or, for a dry run, would do); serialises to `--json`."""

    repo_id: str
    endpoint: str | None
    revision: str
    dry_run: bool
    files: list[UploadFile]
    deleted: list[str] = field(default_factory=list)
    commit_url: str | None = None
    commit_oid: str | None = None
    pr_url: str | None = None
    unchanged: bool = False  # re-publish of identical content: no new commit, commit_* is the existing head
    repo_url: str | None = None
    card_path: str | None = None  # dry run: where the card was written
    plan_path: str | None = None  # dry run: where the file list was written

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total_bytes": self.total_bytes}


# --- the folder ----------------------------------------------------------------------------------------------------


def read_manifest(folder: str | Path) -> dict[str, Any]:
    """quantkit.json of an output folder, after checking the folder is one `quantkit apply` wrote."""
    folder = Path(folder)
    if not folder.is_dir():
        raise PublishError(f"{folder}: no such folder; pass the output folder of `quantkit apply`")
    for name in (MANIFEST, "config.json"):
        if not (folder / name).is_file():
            raise PublishError(f"{folder} has no {name}: publish only folders written by `quantkit apply` "
                               f"(run `quantkit apply --recipe RECIPE --model MODEL --output {folder}` first)")
    fix = "re-run `quantkit apply` to rewrite the folder"
    manifest = load_json_file(folder / MANIFEST, fix, PublishError)
    config = load_json_file(folder / "config.json", fix, PublishError)
    if not isinstance(manifest, dict) or not isinstance(manifest.get("layers"), list):
        raise PublishError(f"{folder / MANIFEST}: not a quantkit manifest (no `layers` list); "
                           "re-run `quantkit apply` to rewrite the folder")
    qc = config.get("quantization_config") if isinstance(config, dict) else None
    if not isinstance(qc, dict) or qc.get("quant_method") != "quark":
        raise PublishError(f"{folder / 'config.json'}: no quantization_config with quant_method quark; "
                           "publish the output of `quantkit apply`, not its source")
    return manifest


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def upload_files(folder: str | Path) -> list[UploadFile]:
    """The folder's files as they go to the repo: every regular file except hidden ones and README.md (the
    generated card replaces it), sorted by path."""
    folder = Path(folder)
    out = []
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if not p.is_file() or rel == CARD:
            continue
        if any(part.startswith(".") and part != ".gitattributes" for part in rel.split("/")):
            continue  # e.g. .cache/huggingface from a local_dir download
        out.append(UploadFile(path=rel, size=p.stat().st_size, sha256=_sha256(p)))
    return out


# --- the model card -----------------------------------------------------------------------------------------------


def _formats(manifest: dict[str, Any]) -> list[str]:
    schemes = {str(d.get("scheme")) for d in manifest.get("layers", []) if d.get("action") == "quantize"}
    schemes.add(str((manifest.get("recipe") or {}).get("scheme", "")))
    found = []
    for fmt in ("mxfp4", "fp8"):
        if any(fmt in s for s in schemes):
            found.append(fmt)
    return found


def _kept_roles(manifest: dict[str, Any]) -> set[str]:
    return {str(d.get("role")) for d in manifest.get("layers", []) if d.get("action") == "keep"}


def card_tags(manifest: dict[str, Any]) -> list[str]:
    tags = ["amd-quark", "quantkit", *_formats(manifest)]
    if manifest.get("model_kind") == "eagle3-draft":
        tags += ["eagle3", "draft-model", "speculative-decoding"]
        if "lm_head" in _kept_roles(manifest):
            tags.append("no-lm-head-quantization")
    elif manifest.get("model_kind") == "moe-target":
        tags.append("moe")
    return tags


def _hub_base_model(manifest: dict[str, Any], base_model: str | None) -> str | None:
    if base_model:
        return base_model
    source = str(manifest.get("source") or "")
    # A local path (absolute, or one that exists here) is not a Hub id even when it has one slash.
    if HUB_ID.match(source) and not Path(source).exists():
        return source
    return None


def _cell(value: Any) -> str:
    text = "" if value is None else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def _command(manifest: dict[str, Any], target: str | None) -> tuple[str, bool]:
    """The recorded command with the executable shortened to `quantkit`, and whether it was a quantkit command
    (apply called through the Python API records the interpreter's argv instead)."""
    recorded = str(manifest.get("command") or "").strip()
    head, _, rest = recorded.partition(" ")
    if Path(head).name == "quantkit":
        return f"quantkit {rest}".strip(), True
    recipe = (manifest.get("recipe") or {}).get("name", "RECIPE")
    cmd = f"quantkit apply --recipe {recipe} --model {manifest.get('source', 'MODEL')} --output OUTPUT"
    if manifest.get("model_kind") == "eagle3-draft" and (target or manifest.get("target_num_layers")):
        cmd += f" --target {target or TARGET_PLACEHOLDER}"
    if manifest.get("path"):
        cmd += f" --path {manifest['path']}"
    return cmd, False


def _layer_groups(layers: list[dict[str, Any]]) -> list[list[Any]]:
    groups: dict[tuple[str, str, str, str], list[str]] = {}
    for d in layers:
        key = (str(d.get("role")), str(d.get("action")), str(d.get("scheme") or "bf16"), str(d.get("reason", "")))
        groups.setdefault(key, []).append(str(d.get("runtime_name")))
    rows = []
    for (role, action, scheme, reason), names in groups.items():
        shown = ", ".join(f"`{n}`" for n in names[:3]) + (f", ... ({len(names)} in all)" if len(names) > 3 else "")
        rows.append([role, action, scheme, shown, reason])
    return rows


def _eval_results(report: Report, model_name: str) -> list[Any]:
    from huggingface_hub import EvalResult

    results = []
    acc = report.acceptance
    if acc is not None and acc.candidate is not None and acc.candidate.mean_acceptance_length is not None:
        k = acc.num_speculative_tokens or DEFAULT_NUM_SPECULATIVE_TOKENS
        dataset = acc.prompts or "quantkit-prompts"
        results.append(EvalResult(
            task_type="text-generation", task_name="EAGLE-3 speculative decoding acceptance",
            dataset_type=dataset, dataset_name=dataset, metric_type="mean_acceptance_length",
            metric_name=f"mean acceptance length (k={k})",
            metric_value=round(acc.candidate.mean_acceptance_length, 4)))
        if acc.ratio is not None:
            results.append(EvalResult(
                task_type="text-generation", task_name="EAGLE-3 speculative decoding acceptance",
                dataset_type=dataset, dataset_name=dataset, metric_type="acceptance_length_ratio",
                metric_name="acceptance length ratio vs the BF16 draft", metric_value=round(acc.ratio, 4)))
    if report.eval is not None:
        for t in report.eval.tasks:
            if t.candidate is None:
                continue
            results.append(EvalResult(
                task_type="text-generation", task_name=t.task, dataset_type=t.task, dataset_name=t.task,
                metric_type=t.metric, metric_value=round(t.candidate, 4)))
    return results


def _as_report(report: Report | str | Path | dict[str, Any] | None, folder: str | Path | None = None) -> Report | None:
    if report is None or isinstance(report, Report):
        return report
    if isinstance(report, dict):
        return parse_report(report, model=folder)
    return load_report(report, model=folder)


def build_model_card(folder: str | Path, report: Report | str | Path | dict[str, Any] | None = None,
                     repo_id: str | None = None, base_model: str | None = None,
                     target: str | None = None) -> ModelCard:
    """The model card (README.md) for an output folder: metadata from quantkit.json and the report, and a body
    that says what was quantized and kept and why, how it was made, how to serve it, and how it measured."""
    from huggingface_hub import ModelCard, ModelCardData

    manifest = read_manifest(folder)
    rep = _as_report(report, folder)
    repo = repo_id or "ORG/NAME"
    name = repo.split("/")[-1]
    kind = str(manifest.get("model_kind", "unknown"))
    recipe = manifest.get("recipe") or {}
    base = _hub_base_model(manifest, base_model)
    target = target or manifest.get("target")
    formats = _formats(manifest)

    data = ModelCardData(
        base_model=base, library_name="transformers", tags=card_tags(manifest),
        pipeline_tag=None if kind == "eagle3-draft" else "text-generation",
        base_model_relation="quantized")
    results = _eval_results(rep, name) if rep else []
    if results:  # model-index needs a model name; without results neither key is written
        data.model_name, data.eval_results = name, results

    what = {"eagle3-draft": "EAGLE-3 draft model", "moe-target": "mixture-of-experts model",
            "dense-target": "model"}.get(kind, "model")
    source_md = f"[{base}](https://huggingface.co/{base})" if base else f"`{manifest.get('source', 'unknown')}`"
    body: list[str] = [f"# {name}", ""]
    body.append(f"{' + '.join(f.upper() for f in formats) or 'Quantized'} {what} ({manifest.get('architecture')}), "
                f"quantized from {source_md} with [AMD Quark]({QUARK_URL}) by quantkit recipe "
                f"`{recipe.get('name')}` (Quark scheme `{recipe.get('scheme')}`)"
                + (f": {str(recipe['description']).rstrip('.')}." if recipe.get("description") else "."))
    before, after = manifest.get("size_before_bytes"), manifest.get("size_after_bytes")
    if isinstance(before, int) and isinstance(after, int) and before > 0:
        body += ["", f"Weights: {before / 1e6:,.2f} MB -> {after / 1e6:,.2f} MB ({after / before:.2f}x)."]

    layers = manifest.get("layers", [])
    n_q = sum(d.get("action") == "quantize" for d in layers)
    body += ["", "## What was quantized and what was kept", "",
             f"{n_q} layers quantized, {len(layers) - n_q} kept in high precision. Layer names are vLLM's runtime "
             "names, which are what config.json's `exclude` lists, so vLLM loads every kept layer unquantized.", ""]
    body += _table(["role", "action", "scheme", "layers (vLLM names)", "why"], _layer_groups(layers))
    body += ["", f"`quantization_config.exclude`: {', '.join(f'`{e}`' for e in manifest.get('exclude', [])) or 'none'}"]
    if len(layers) > 3:
        body += ["", "<details><summary>Every layer</summary>", ""]
        body += _table(["vLLM layer", "checkpoint modules", "action", "scheme"],
                       [[d.get("runtime_name"), ", ".join(d.get("checkpoint_modules") or []), d.get("action"),
                         d.get("scheme") or "bf16"] for d in layers])
        body += ["", "</details>"]

    body += ["", "## Serve with vLLM on ROCm", "",
             "On AMD Instinct GPUs with vLLM's ROCm build (for example AMD's `rocm/vllm` container); vLLM reads the "
             "Quark `quantization_config` from config.json, no extra flag is needed.", ""]
    if kind == "eagle3-draft":
        k = (rep.acceptance.num_speculative_tokens if rep and rep.acceptance else None) or \
            DEFAULT_NUM_SPECULATIVE_TOKENS
        spec = json.dumps({"method": "eagle3", "model": repo, "num_speculative_tokens": k})
        body += ["```bash", f"vllm serve {target or TARGET_PLACEHOLDER} --speculative-config '{spec}'", "```"]
        if not target:
            n = manifest.get("target_num_layers")
            body += ["", f"Replace `{TARGET_PLACEHOLDER}` with the target model this draft was trained for"
                     + (f" ({n} decoder layers)." if n else ".")]
        body += ["", "This repo is a draft: it only runs next to its target model."]
    else:
        body += ["```bash", f"vllm serve {repo}", "```"]

    body += ["", "## Acceptance: BF16 draft vs quantized draft" if kind == "eagle3-draft" else "## Acceptance", ""]
    acc = rep.acceptance if rep else None
    if acc is not None and (acc.baseline or acc.candidate):
        b, c = acc.baseline, acc.candidate
        settings = ", ".join(x for x in (
            f"backend {acc.backend}" if acc.backend else "",
            f"{acc.num_speculative_tokens} speculative tokens" if acc.num_speculative_tokens else "",
            f"{acc.num_prompts} prompts" if acc.num_prompts else "",
            f"prompt set {acc.prompts}" if acc.prompts else "") if x)
        body += ["Mean acceptance length (AL = 1 + accepted / drafts), same target, prompts and settings"
                 + (f" ({settings})" if settings else "") + ".", ""]
        rows = []
        for domain in ["all", *acc.domains()]:
            bv = b.mean_acceptance_length if (b and domain == "all") else (b.per_domain.get(domain) if b else None)
            cv = c.mean_acceptance_length if (c and domain == "all") else (c.per_domain.get(domain) if c else None)
            ratio = acc.ratio if domain == "all" and acc.ratio is not None else \
                (cv / bv if bv and cv is not None else None)
            rows.append([f"**{domain}**" if domain == "all" else domain, _fmt(bv), _fmt(cv), _fmt(ratio)])
        body += _table(["domain", "BF16 draft AL", "quantized draft AL", "ratio"], rows)
        if acc.ratio_ci:
            body += ["", f"AL ratio {_fmt(acc.ratio)}, 95% CI [{_fmt(acc.ratio_ci[0])}, {_fmt(acc.ratio_ci[1])}]."]
    else:
        body += ["Not measured: no gate report was given when this card was made (`quantkit publish --report`)."]

    body += ["", "## Quality (lm-eval)", ""]
    if rep and rep.eval and rep.eval.tasks:
        body += _table(["task", "metric", "baseline", "quantized", "delta", "recovery"],
                       [[t.task, t.metric, _fmt(t.baseline, 4), _fmt(t.candidate, 4), _fmt(t.delta, 4),
                         _fmt(t.recovery, 4)] for t in rep.eval.tasks])
    else:
        body += ["Not measured: the gate report has no eval section." if rep else
                 "Not measured: no gate report was given when this card was made (`quantkit publish --report`)."]
    if rep and rep.gate and rep.gate.passed is not None:
        body += ["", f"## Gate: {'passed' if rep.gate.passed else 'FAILED'}", ""]
        if rep.gate.checks:
            body += _table(["check", "value", "threshold", "passed"],
                           [[ch.name, _fmt(ch.value, 4), f"{ch.op or ''} {_fmt(ch.threshold, 4)}".strip(),
                             {True: "yes", False: "no", None: "-"}[ch.passed]] for ch in rep.gate.checks])

    command, exact = _command(manifest, target)
    body += ["", "## How it was made", "", "```bash", command, "```"]
    if not exact:
        body += ["", "(quantized through quantkit's Python API; the line above is the equivalent command)"]
    versions = manifest.get("versions") or {}
    if versions:
        body += ["", *_table(["package", "version"], [[k, v] for k, v in versions.items()])]
    sources = manifest.get("source_files") or {}
    if sources:
        body += ["", "<details><summary>Source files (sha256)</summary>", ""]
        body += _table(["file", "sha256"], [[f, f"`{h}`"] for f, h in sources.items()])
        body += ["", "</details>"]
    body += ["", f"`{MANIFEST}` in this repo holds the full record: recipe, per-layer decisions, versions, timings.",
             ""]
    yaml_block = data.to_yaml(original_order=["base_model", "base_model_relation", "library_name", "pipeline_tag"])
    return ModelCard(f"---\n{yaml_block}\n---\n\n" + "\n".join(body))


# --- publishing ----------------------------------------------------------------------------------------------------


def resolve_token(token: str | None = None) -> str:
    """The token to publish with: the argument, else HF_TOKEN, else the huggingface_hub login."""
    if token:
        return token
    from huggingface_hub import get_token

    found = os.environ.get("HF_TOKEN") or get_token()
    if not found:
        raise PublishAuthError("no Hugging Face token: set HF_TOKEN or run `hf auth login` with a token that can "
                               "write to the repo (or use --dry-run to only write the card)")
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
    line = " ".join(str(text).split())
    return line.replace(secret, "<token>") if secret else line


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
            msg = (f"the Hub at {endpoint} refused the token ({status}) while {stage.what} {repo_id}: use a token "
                   f"with write access to {repo_id.split('/')[0]} in HF_TOKEN or `hf auth login`")
            raise PublishAuthError(_one_line(msg, token)) from None
        if status is not None and status >= 500 or isinstance(e, httpx.TransportError):
            why = f"failed with {status}" if status else f"could not be reached ({type(e).__name__})"
            msg = f"the Hub at {endpoint} {why} while {stage.what} {repo_id}: " + _after_failure(api, repo_id,
                                                                                                revision, stage)
            raise PublishError(_one_line(msg, token)) from None
        if status == 404:
            raise PublishError(_one_line(f"{repo_id} (revision {revision}) not found at {endpoint} while "
                                         f"{stage.what}: check --repo-id and --revision ({detail})", token)) from None
        msg = f"publishing to {repo_id} at {endpoint} failed while {stage.what}: {type(e).__name__}: {detail}"
        raise PublishError(_one_line(msg, token)) from None


def _after_failure(api: HfApi, repo_id: str, revision: str, stage: _Stage) -> str:
    """What state the repo is in after a failed upload, checked rather than assumed."""
    if stage.what not in ("uploading files to", "committing to"):
        return "nothing was uploaded; run the same command again"
    try:
        head = _head(api, repo_id, revision)
    except Exception:
        return "nothing was published by this run as far as quantkit knows, but the repo could not be re-read " \
               "to confirm; check the repo, then run the same command again"
    if head == stage.head_before:
        return (f"nothing was committed, the repo is unchanged at {str(head)[:12]}; run the same command again "
                "(files already uploaded are skipped)")
    return f"the branch moved to {str(head)[:12]} meanwhile; check the repo before publishing again"


def _head(api: HfApi, repo_id: str, revision: str) -> str | None:
    from huggingface_hub.errors import RevisionNotFoundError

    try:
        return api.repo_info(repo_id, revision=revision).sha
    except RevisionNotFoundError:
        return None


def _write_dry_run(out: Path, card: str, result: PublishResult, folder: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / CARD).write_text(card)
    plan = {"repo_id": result.repo_id, "revision": result.revision, "folder": str(folder.resolve()),
            "files": [asdict(f) for f in result.files], "total_bytes": result.total_bytes}
    (out / UPLOAD_PLAN).write_text(jsonout.dumps(plan) + "\n")


def publish(folder: str | Path, repo_id: str, private: bool = False, revision: str | None = None,
            create_pr: bool = False, report: Report | str | Path | dict[str, Any] | None = None,
            dry_run: bool = False, endpoint: str | None = None, token: str | None = None,
            base_model: str | None = None, target: str | None = None,
            dry_run_dir: str | Path | None = None) -> PublishResult:
    """Upload `folder` and its generated model card to the Hub repo `repo_id` in one commit.

    The repo is created if needed (`private` applies only then); `revision` is a branch, created from main if it
    does not exist; `create_pr` opens a pull request instead of committing to the branch. Re-publishing identical
    content makes no commit and returns `unchanged=True` with the existing head. Weight files on the branch that the
    folder no longer has (*.safetensors, the index) are deleted in the same commit. `dry_run` touches no network:
    it writes README.md and upload-plan.json (every file with size and sha256) to `dry_run_dir` (default: a
    `<folder>.publish-preview` folder beside `folder`).
    """
    folder = Path(folder).expanduser()
    read_manifest(folder)
    if not HUB_ID.match(repo_id):
        raise PublishError(f"--repo-id {repo_id!r}: use ORG/NAME (letters, digits, '-', '_', '.')")
    revision = revision or "main"
    card = str(build_model_card(folder, report, repo_id=repo_id, base_model=base_model, target=target))
    card_bytes = card.encode()
    files = [*upload_files(folder),
             UploadFile(path=CARD, size=len(card_bytes), sha256=hashlib.sha256(card_bytes).hexdigest())]
    files.sort(key=lambda f: f.path)
    result = PublishResult(repo_id=repo_id, endpoint=endpoint, revision=revision, dry_run=dry_run, files=files)
    if dry_run:
        out = Path(dry_run_dir) if dry_run_dir else folder.parent / f"{folder.name}.publish-preview"
        _write_dry_run(out, card, result, folder)
        result.card_path, result.plan_path = str(out / CARD), str(out / UPLOAD_PLAN)
        return result

    token = resolve_token(token)
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi
    from huggingface_hub.hf_api import RepoFile

    api = HfApi(endpoint=endpoint, token=token, library_name="quantkit", library_version=__version__)
    result.endpoint = api.endpoint
    with _hub_errors(api, repo_id, revision, token) as stage:
        stage.what = "creating"
        repo_url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        result.repo_url = str(repo_url)
        stage.what = "reading"
        stage.head_before = _head(api, repo_id, revision)
        if stage.head_before is None:
            stage.what = f"creating branch {revision} of"
            api.create_branch(repo_id, branch=revision, exist_ok=True)
            stage.head_before = _head(api, repo_id, revision)
        local = {f.path for f in files}
        remote = [e.path for e in api.list_repo_tree(repo_id, revision=revision, recursive=True)
                  if isinstance(e, RepoFile)]
        result.deleted = sorted(p for p in remote if WEIGHT_FILE.search(p) and p not in local)
        ops: list[Any] = [CommitOperationAdd(path_in_repo=f.path, path_or_fileobj=str(folder / f.path))
                          for f in files if f.path != CARD]
        ops.append(CommitOperationAdd(path_in_repo=CARD, path_or_fileobj=card_bytes))
        ops += [CommitOperationDelete(path_in_repo=p) for p in result.deleted]
        additions = [op for op in ops if isinstance(op, CommitOperationAdd)]
        # Upload the blobs first, then commit: the same single commit as create_commit alone makes, but a failure
        # is reported against the step it happened in.
        stage.what = "uploading files to"
        api.preupload_lfs_files(repo_id, additions=additions, revision=revision, create_pr=create_pr,
                                free_memory=False)
        stage.what = "committing to"
        recipe = (read_manifest(folder).get("recipe") or {}).get("name", "quantkit")
        info = api.create_commit(
            repo_id, ops, revision=revision, create_pr=create_pr,
            commit_message=f"quantkit publish: {recipe} ({len(files)} files)",
            commit_description=f"Uploaded by quantkit {__version__} from a `quantkit apply` output folder.")
    result.commit_url, result.commit_oid = info.commit_url, info.oid
    result.pr_url = info.pr_url
    result.unchanged = info.oid == stage.head_before and info.pr_url is None
    return result
