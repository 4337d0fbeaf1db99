"""`quantkit check`: will vLLM load this checkpoint as intended? Exit 0 clean, 1 errors found, 2 bad input."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from quantkit.cli.app import exit_failed, main
from quantkit.cli.options import (
    findings_table,
    json_option,
    make_console,
    print_json,
    render_draft_cost,
    render_kernels,
    trust_option,
    verbose_option,
    verdict_line,
    vllm_version_option,
)
from quantkit.cli.params import Count, Real
from quantkit.progress import stderr_progress
from quantkit.vocab import PLATFORMS, VLLM_MODES

if TYPE_CHECKING:  # result types only; the modules are imported when the command runs
    from quantkit.results.check import CheckResult


@main.command("check")
@click.argument("folder", type=click.Path(path_type=Path))
@click.option(
    "--target",
    "target",
    default=None,
    type=click.Path(path_type=Path),
    help="For an EAGLE-3 draft: its target checkpoint (layer names, aux layer ids, hidden sizes, real load).",
)
@click.option(
    "--tp",
    "tp",
    type=Count(1, 1024),
    default=1,
    show_default=True,
    envvar="QUANTKIT_TP",
    help="Tensor-parallel size to check per-shard divisibility for.",
)
@click.option(
    "--platform",
    "platform",
    type=click.Choice(PLATFORMS),
    default="gfx950",
    show_default=True,
    envvar="QUANTKIT_PLATFORM",
    help="Where the checkpoint will be served.",
)
@click.option(
    "--vllm",
    "vllm_mode",
    type=click.Choice(VLLM_MODES),
    default="auto",
    show_default=True,
    envvar="QUANTKIT_CHECK_VLLM",
    help="Load it in vLLM (in a subprocess) and generate: auto = when vLLM is installed; required = a "
    "skipped or failed load is an error.",
)
@click.option(
    "--load-timeout",
    "load_timeout",
    type=Real(0, 86400, lo_open=True),
    default=900,
    show_default=True,
    help="Seconds the vLLM load and generation may take.",
)
@click.option("--numeric", is_flag=True, help="Also compare dequantized weights with --source (reads all weights).")
@click.option(
    "--source",
    "source",
    default=None,
    type=click.Path(path_type=Path),
    help="The unquantized checkpoint this one was made from (for --numeric).",
)
@vllm_version_option()
@click.option(
    "--list-rules",
    "list_rules",
    is_flag=True,
    is_eager=True,
    expose_value=False,
    callback=lambda ctx, _p, v: _list_rules(ctx) if v else None,
    help="Print the rule table (as `quantkit rules`) and exit.",
)
@trust_option()
@verbose_option("the predicted kernel path of every layer group")
@json_option("Print the findings, per-layer precisions and the vLLM load as JSON.")
def check_command(
    folder: Path,
    target: Path | None,
    tp: int,
    platform: str,
    vllm_mode: str,
    load_timeout: float,
    numeric: bool,
    source: Path | None,
    vllm_version: str | None,
    trust_remote_code: bool,
    verbose: bool,
    as_json: bool,
) -> None:
    """Check that vLLM will load a Quark checkpoint as intended, before any GPU time is spent.

    \b
    quantkit check DRAFT-FP8 --target TARGET
    quantkit check MODEL-MXFP4 --tp 8 --platform gfx950 --vllm off

    Replays vLLM's Quark loader: required quantization_config keys, exclude entries (vLLM matches runtime names
    or `re:` only), fused and MoE layers, weight and scale tensors (dtype, shape, finite and positive values), TP
    divisibility, EAGLE-3 draft specifics, platform notes; then loads the checkpoint in vLLM when it can.

    The verdict comes first, then the vLLM load and the findings; --verbose adds the predicted kernel of every
    layer group.

    Exit status: 0 no errors, 1 errors found, 2 bad input (not a checkpoint, unreadable file).
    """
    import sys

    from quantkit.check.run import run as check_checkpoint
    from quantkit.io.files import check_model_folders
    from quantkit.io.hf import remote_code_allowed

    check_model_folders([folder, target, source])
    progress = stderr_progress("check") if not as_json else None
    with remote_code_allowed(trust_remote_code):
        result = check_checkpoint(
            folder,
            target=target,
            tp=tp,
            platform=platform,
            vllm=vllm_mode,
            numeric=numeric,
            source=source,
            load_timeout_s=load_timeout,
            progress=progress,
            vllm_version=vllm_version,
        )
    if as_json:
        print_json(result.to_dict())
    else:
        _render_check(result, verbose)
    sys.stdout.flush()
    if not result.ok:
        exit_failed()


def _list_rules(ctx: click.Context) -> None:
    from quantkit.cli.rules import render_rules

    render_rules(None, None, as_json=False)  # JSON: `quantkit rules --json`
    ctx.exit(0)


def _render_check(result: CheckResult, verbose: bool = False) -> None:
    """Verdict first; then the vLLM load, the findings, and the kernel paths in one line (the per-layer table with
    --verbose, and in --json)."""
    console = make_console()
    console.print(
        verdict_line(
            result.ok,
            result.findings,
            f"check of {result.path} ({result.architecture}, "
            f"{result.model_kind}, tp {result.tp}, {result.platform}) in {result.seconds:.1f}s",
        )
    )
    load = result.vllm_load
    line = f"vLLM load: {load.status}"
    if load.status == "loaded":
        compared = load.layers or {}
        bad = sum(not v["as_predicted"] for v in compared.values())
        line += (
            f" in {load.engine} ({load.mode}, {load.seconds}s); {len(compared)} layers compared, {bad} "
            f"mismatched; generated {load.generated_text!r}"
        )
        if load.spec_decode is not None:
            sd = load.spec_decode
            line += f"; speculative decoding: {sd.num_drafts} drafts, {sd.num_accepted_tokens} tokens accepted"
    elif load.reason or load.error:
        line += f": {load.reason or load.error}"
    console.print(line)
    if result.numeric is not None:
        worst = max((v.relative_error or 0.0 for v in result.numeric.layers.values()), default=0.0)
        console.print(
            f"numeric: {len(result.numeric.layers)} layers vs {result.numeric.source}, worst relative error {worst:.4g}"
        )
    if result.findings:
        console.print(findings_table(result.findings))
    kernels = result.kernels
    if kernels is not None and kernels.paths:
        if verbose:
            render_kernels(console, kernels)
        else:
            predicted = ", ".join(f"{k}={v}" for k, v in kernels.predicted_backends.items())
            console.print(
                f"kernels vLLM {kernels.vllm_version} is predicted to take on {kernels.platform}: "
                f"{predicted or '-'} ({len(kernels.paths)} layer groups: --verbose, or --json)"
            )
    cost = result.draft_cost
    if cost is not None:
        if verbose:
            render_draft_cost(console, cost)
        elif cost.lm_head_share is not None:
            after = (
                f"; {cost.after_recipe} would take a draft token's time to {cost.step_ratio_after:.2f}"
                if cost.step_ratio_after is not None
                else ""
            )
            console.print(
                f"draft step ({cost.estimate}): lm_head {cost.lm_head_share:.2f} of a draft token's reads"
                f"{after} (--verbose for every role)"
            )
