"""`quantkit publish`: a Hub repo with a generated model card, in one commit."""

from __future__ import annotations

from pathlib import Path

import click

from quantkit.cli.app import main
from quantkit.cli.options import json_option, make_console, print_json
from quantkit.cli.params import Count
from quantkit.vocab import PLATFORMS

# --- publish -------------------------------------------------------------------------------------------------------


@main.command("publish")
@click.argument("folder", type=click.Path(path_type=Path))
@click.option(
    "--repo-id", "repo_id", required=True, envvar="QUANTKIT_REPO_ID", help="Hub repo ORG/NAME; created if needed."
)
@click.option("--private", is_flag=True, help="Create the repo private (an existing repo keeps its visibility).")
@click.option("--revision", default=None, help="Branch to commit to (default main); created from main if missing.")
@click.option(
    "--create-pr", is_flag=True, help="Open a pull request with the commit instead of committing to the branch."
)
@click.option(
    "--report",
    "report",
    type=click.Path(path_type=Path),
    default=None,
    help="Gate report JSON (quantkit gate): its acceptance and eval tables go into the card and model-index.",
)
@click.option(
    "--base-model",
    default=None,
    help="Hub id of the unquantized model for the card's base_model (default: quantkit.json's source, "
    "when it is a Hub id).",
)
@click.option(
    "--target",
    "target",
    default=None,
    help="For drafts: the target model's Hub id, used in the card's `vllm serve` line.",
)
@click.option("--dry-run", is_flag=True, help="Write the card and the file list (sizes, sha256); no network.")
@click.option(
    "--dry-run-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Where --dry-run writes README.md and upload-plan.json (default: FOLDER.publish-preview beside it).",
)
@click.option("--endpoint", envvar="HF_ENDPOINT", default=None, help="Hub URL (default https://huggingface.co).")
@click.option(
    "--platform",
    type=click.Choice(PLATFORMS),
    default="gfx950",
    show_default=True,
    envvar="QUANTKIT_PLATFORM",
    help="Platform of the card's `vllm serve` command and deploy.json.",
)
@click.option(
    "--tp",
    type=Count(1, 64),
    default=1,
    show_default=True,
    help="Tensor-parallel size of the card's `vllm serve` command and deploy.json.",
)
@json_option("Print the result (files, commit URL, or the dry-run plan) as JSON.")
def publish_command(
    folder: Path,
    repo_id: str,
    private: bool,
    revision: str | None,
    create_pr: bool,
    report: Path | None,
    base_model: str | None,
    target: str | None,
    dry_run: bool,
    dry_run_dir: Path | None,
    endpoint: str | None,
    platform: str,
    tp: int,
    as_json: bool,
) -> None:
    """Upload a `quantkit apply` output FOLDER and a generated model card to a Hub repo, in one commit.

    \b
    quantkit publish DRAFT-FP8 --repo-id ORG/NAME --report gate-report.json --target ORG/TARGET
    quantkit publish DRAFT-FP8 --repo-id ORG/NAME --dry-run

    The token comes from HF_TOKEN or `hf auth login` and is never printed or written. Only what `quantkit apply`
    writes is uploaded (weights, index, config, quantkit.json, tokenizer and the like), and a file holding a Hub
    token is refused before anything is sent. The card (README.md) says
    what was quantized and kept and why, the exact command and versions, how to serve the model with vLLM on ROCm,
    and the acceptance and eval tables from --report. Publishing identical content again makes no new commit.
    """
    from quantkit.io.files import check_model_folders
    from quantkit.publish.hub import publish

    check_model_folders([folder, target, base_model], dry_run_dir if dry_run else None, "--dry-run-dir")
    result = publish(
        folder,
        repo_id,
        private=private,
        revision=revision,
        create_pr=create_pr,
        report=report,
        dry_run=dry_run,
        endpoint=endpoint,
        base_model=base_model,
        target=target,
        dry_run_dir=dry_run_dir,
        platform=platform,
        tp=tp,
    )
    if result.skipped:
        from quantkit.io.files import describe_not_copied
        from quantkit.progress import stderr_progress

        stderr_progress("publish")(
            f"warning: not uploaded (publish uploads only what `quantkit apply` writes, see "
            f"the README's Safety section): {describe_not_copied(result.skipped)}"
        )
    if as_json:
        print_json(result.to_dict())
        return
    where = f"{result.repo_id}@{result.revision}"
    size = f"{len(result.files)} files, {result.total_bytes / 1e6:.2f} MB"
    if result.dry_run:
        from rich.table import Table

        click.echo(f"would upload to {where} ({size}):")
        table = Table()
        table.add_column("file", overflow="fold")
        table.add_column("bytes", justify="right", no_wrap=True)
        table.add_column("sha256", no_wrap=True)
        for f in result.files:
            table.add_row(f.path, str(f.size), f.sha256[:16])
        make_console().print(table)
        click.echo(f"dry run, nothing uploaded: card {result.card_path}, file list {result.plan_path}")
    elif result.pr_url:
        click.echo(f"opened pull request on {where} ({size}): {result.pr_url} (commit {result.commit_url})")
    elif result.unchanged:
        click.echo(f"unchanged: {where} already holds these {len(result.files)} files: {result.commit_url}")
    else:
        deleted = f"; deleted stale {', '.join(result.deleted)}" if result.deleted else ""
        click.echo(f"published {size} to {where}{deleted}: {result.commit_url}")
