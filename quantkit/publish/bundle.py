"""What one `publish` generates next to the folder's own files: the public names of the models involved (Hub ids, never
local paths), the redacted quantkit.json, the acceptance sidecar, the deploy manifest; the card and the upload are
made from this one object so that they agree.

Generated files (they replace any file of the same name in the folder):

| file | what | when |
|---|---|---|
| `README.md` | the model card (card.py) | always |
| `quantkit.json` | the folder's manifest with local paths replaced (redact.py) | always |
| `acceptance.json` | `AcceptanceSidecar` (sidecar.py) | the report has acceptance or bench figures |
| `acceptance.png` | the chart (charts.py) | the report has acceptance or eval figures |
| `deploy.json` | quantkit.deploy's manifest, naming the Hub ids | the checkpoint (and a draft's target) is readable |
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantkit.errors import QuantkitError
from quantkit.io.checkpoint import HUB_ID
from quantkit.io.headers import load_json_file
from quantkit.publish.folder import (
    DEFAULT_NUM_SPECULATIVE_TOKENS,
    MANIFEST,
    TARGET_PLACEHOLDER,
    PublishError,
    read_manifest,
)
from quantkit.publish.redact import Redactor, hub_ref, is_local, public_manifest
from quantkit.publish.sidecar import AcceptanceSidecar, prompt_file
from quantkit.results import ApplyResult, CandidateReport, SpeedupSummary, load_report, parse_report
from quantkit.vocab import EAGLE3_DRAFT

DEFAULT_PLATFORM = "gfx950"


@dataclass
class Publication:
    """The public view of one output folder: what the card says and what the upload holds besides the weights."""

    folder: Path
    repo_id: str
    manifest: ApplyResult  # as published: no local paths
    manifest_json: dict[str, Any]  # the published quantkit.json
    report: CandidateReport | None
    base_ref: str | None  # the base model's Hub id
    target_ref: str | None  # the Hub id of the target a draft is served with: the one the gate measured it on
    redactor: Redactor
    sidecar: AcceptanceSidecar | None
    deploy: Any  # quantkit.results.deploy.DeployManifest | None
    deploy_json: dict[str, Any] | None
    deploy_missing: str  # why there is no deploy manifest ("" when there is one)
    chart: bool  # whether acceptance.png is part of the upload
    num_speculative_tokens: int
    speedup: SpeedupSummary | None = None  # the report's bench, as published (no local paths)
    # the bench's recommended K per batch size, which the serve command carries; [] when none
    k_schedule: tuple[tuple[int, int, int], ...] = ()
    k_schedule_note: str = ""  # why the bench's schedule is not in the serve command ("" when it is, or none)
    # the target the gate's acceptance and serve steps ran the draft on, by public name (Hub id, else folder name);
    # None without a report that names one. deploy.json and the card's serve line describe this pair.
    measured_target: str | None = None
    measured_target_about: str = ""  # what that target is, from its quantkit.json ("MXFP4, recipe mxfp4-moe of X")
    apply_target_ref: str | None = None  # the Hub id of the target `apply` read (quantkit.json's `target`)

    @property
    def redacted(self) -> list[str]:
        value = self.manifest_json.get("redacted")
        return [str(v) for v in value] if isinstance(value, list) else []


def as_report(
    report: CandidateReport | str | Path | dict[str, Any] | None, folder: str | Path | None = None
) -> CandidateReport | None:
    if report is None or isinstance(report, CandidateReport):
        return report
    if isinstance(report, dict):
        return parse_report(report, model=folder)
    return load_report(report, model=folder)


def _hub_id_option(value: str | None, option: str) -> str | None:
    if value is None:
        return None
    if not HUB_ID.match(value) or is_local(value):
        raise PublishError(
            f"{option} {value}: not a Hub id; pass the model's Hub id ORG/NAME (the card and the "
            "published files name models by Hub id, never by local path)"
        )
    return value


def measured_target(report: CandidateReport | None) -> str | None:
    """The target a draft candidate was measured on: the serve step's, else the acceptance step's (in pair mode the
    quantized target), as the gate report records it (a local path or a Hub id); None when the report has neither."""
    if report is None:
        return None
    if report.serve is not None and report.serve.target:
        return report.serve.target
    acc = report.acceptance
    if acc is None:
        return None
    return acc.candidate_target or (acc.candidate.target if acc.candidate is not None else None) or None


def _about_target(path: str) -> str:
    """What a local target folder is, from the quantkit.json `apply` wrote into it ("" when it has none)."""
    folder = Path(path).expanduser()
    if not is_local(path) or not (folder / MANIFEST).is_file():
        return ""
    try:
        made = read_manifest(folder)
    except QuantkitError:
        return ""
    from quantkit.io.markdown import Markup, md_code, md_text

    source = hub_ref(made.source) or Path(made.source or "").name or "its source"
    # Markdown built here, its input parts escaped: the card shows it as it is
    return Markup(
        f"quantized by quantkit recipe {md_code(made.recipe.get('name'))} (Quark scheme "
        f"{md_code(made.recipe.get('scheme'))}) from {md_text(source)}"
    )


def _deploy(
    folder: Path,
    manifest: ApplyResult,
    repo_id: str,
    target_ref: str | None,
    k: int,
    platform: str,
    tp: int,
    k_schedule: tuple[tuple[int, int, int], ...] = (),
    measured: str | None = None,
) -> tuple[Any, str]:
    """quantkit.deploy's manifest naming the Hub ids, or None and why not (one line, no local path). A draft is
    deployed with `measured` (the target the gate measured it on) when given, else with the target `apply` read."""
    from quantkit.deploy.run import run as deploy_manifest

    target_local = None
    if manifest.model_kind == EAGLE3_DRAFT:
        wanted = measured or manifest.target
        if wanted and is_local(wanted) and Path(wanted).expanduser().is_dir():
            target_local = str(Path(wanted).expanduser())
        if target_local is None:
            if measured and measured != manifest.target:
                return None, (
                    "the target the gate measured this draft on is not on this machine, so the pair "
                    "could not be checked"
                )
            return None, (
                "the draft's target checkpoint is not on this machine (quantkit.json's `target` is not a "
                "local folder), so the pair could not be checked"
            )
    try:
        if target_local is not None:
            return deploy_manifest(
                folder,
                target=target_local,
                platform=platform,
                tp=tp,
                num_speculative_tokens=k,
                model_ref=target_ref or TARGET_PLACEHOLDER,
                draft_ref=repo_id,
                k_schedule=list(k_schedule) or None,
            ), ""
        return deploy_manifest(folder, platform=platform, tp=tp, num_speculative_tokens=k, model_ref=repo_id), ""
    except QuantkitError as e:
        return None, f"`quantkit deploy` could not read the checkpoint ({type(e).__name__})"


def prepare(
    folder: str | Path,
    report: CandidateReport | str | Path | dict[str, Any] | None = None,
    repo_id: str | None = None,
    base_model: str | None = None,
    target: str | None = None,
    platform: str = DEFAULT_PLATFORM,
    tp: int = 1,
) -> Publication:
    """Everything publish generates for `folder`, with models named by `repo_id`, `base_model` (default: the
    source's Hub id when it came from the Hub) and `target` (default: the recorded target's Hub id)."""
    from quantkit.publish.charts import chart_panels

    folder = Path(folder).expanduser()
    manifest = read_manifest(folder)
    raw = load_json_file(folder / MANIFEST, "re-run `quantkit apply` to rewrite the folder", PublishError)
    repo = repo_id or "ORG/NAME"
    base_ref = _hub_id_option(base_model, "--base-model") or hub_ref(manifest.source)
    rep = as_report(report, folder)
    # a draft is described with the target the gate measured it on (the demo: the MXFP4 target, not the BF16 one
    # `apply` read); `target` (--target) is that target's Hub id
    measured = measured_target(rep) if manifest.model_kind == EAGLE3_DRAFT else None
    served = measured or manifest.target
    target_ref = _hub_id_option(target, "--target") or hub_ref(served)
    apply_target_ref = target_ref if served == manifest.target else hub_ref(manifest.target)

    redactor = Redactor()
    source_public = base_ref or Path(manifest.source).name or "unknown"
    redactor.add(manifest.source, source_public)
    redactor.add(manifest.target, apply_target_ref or Path(manifest.target or "").name)
    measured_public = None
    if measured is not None:
        measured_public = target_ref or (Path(measured).name if is_local(measured) else measured)
        redactor.add(measured, measured_public)
    for local in (manifest.output, str(folder), str(folder.resolve())):
        redactor.add(local, folder.name)
    if rep is not None:
        redactor.add(rep.model, folder.name)
        redactor.add(rep.baseline_model, base_ref or Path(rep.baseline_model or "").name)
        prompts = rep.acceptance.settings.prompts if rep.acceptance else None
        if prompts and prompt_file(prompts) is not None and prompts != "builtin":
            redactor.add(prompts, Path(prompts).name)
    published = public_manifest(raw, redactor, folder.name, source_public, apply_target_ref)
    public = ApplyResult.model_validate(published)

    acc = rep.acceptance if rep else None
    k = (acc.settings.num_speculative_tokens if acc else None) or DEFAULT_NUM_SPECULATIVE_TOKENS
    summary = rep.bench.speedup_summary() if rep is not None and rep.bench is not None else None
    speedup = SpeedupSummary.model_validate(redactor.deep(summary.to_dict())) if summary is not None else None
    schedule, note = _schedule(speedup, manifest)
    if schedule:
        k = max(x for _, _, x in schedule)
    sidecar = None
    if acc is not None:
        sidecar = AcceptanceSidecar.from_acceptance(acc, model=repo, base_model=base_ref, target=target_ref)
    elif speedup is not None:
        sidecar = AcceptanceSidecar(model=repo, base_model=base_ref, target=target_ref)
    if sidecar is not None:
        sidecar.speedup = speedup
        if not sidecar.has_figures():
            sidecar = None
    chart = bool(chart_panels(acc, rep.eval if rep else None))

    deploy, missing = _deploy(folder, manifest, repo, target_ref, k, platform, tp, schedule, measured)
    deploy_json = redactor.deep(deploy.to_dict()) if deploy is not None else None
    return Publication(
        folder=folder,
        repo_id=repo,
        manifest=public,
        manifest_json=published,
        report=rep,
        base_ref=base_ref,
        target_ref=target_ref,
        redactor=redactor,
        sidecar=sidecar,
        deploy=deploy,
        deploy_json=deploy_json,
        deploy_missing=missing,
        chart=chart,
        num_speculative_tokens=k,
        speedup=speedup,
        k_schedule=schedule,
        k_schedule_note=note,
        measured_target=measured_public,
        measured_target_about=_about_target(measured) if measured else "",
        apply_target_ref=apply_target_ref,
    )


def _schedule(speedup: SpeedupSummary | None, manifest: ApplyResult) -> tuple[tuple[tuple[int, int, int], ...], str]:
    """The bench's K schedule for this draft (results.KSchedule, chosen by measured tok/s) as the serve command
    carries it, or () and why not."""
    if speedup is None or not speedup.num_speculative_tokens_per_batch_size or manifest.model_kind != EAGLE3_DRAFT:
        return (), ""
    ranges = tuple((int(a), int(b), int(k)) for a, b, k in speedup.num_speculative_tokens_per_batch_size)
    if not any(k for _, _, k in ranges):
        return (), (
            "the bench found no speculation (K=0) fastest at every concurrency it measured, so the command "
            "keeps the fixed K"
        )
    return ranges, ""
