"""`quantkit inspect`: every layer under vLLM's runtime names with the precision vLLM will give it (headers only)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from quantkit.cli.app import main
from quantkit.cli.options import (
    json_option,
    make_console,
    print_command,
    print_json,
    render_draft_cost,
    render_kernels,
    vllm_version_option,
)
from quantkit.cli.params import Count
from quantkit.vocab import EAGLE3_DRAFT, PLATFORMS

if TYPE_CHECKING:  # result types only; the modules are imported when the command runs
    from quantkit.results.check import InspectResult


@main.command("inspect")
@click.argument("folder", type=click.Path(path_type=Path))
@click.option(
    "--target",
    "target",
    default=None,
    type=click.Path(path_type=Path),
    help="For an EAGLE-3 draft: the target checkpoint folder (only its config.json is read). Its layer "
    "count gives the draft's vLLM layer names; without it they show as model.layers.{N}.*.",
)
@click.option("--layers", "show_layers", is_flag=True, help="One row per layer instead of groups of layers.")
@click.option(
    "--platform",
    "platform",
    type=click.Choice(PLATFORMS),
    default=None,
    help="Also say which vLLM kernel every MoE and linear layer takes there (gfx950 = MI355X, gfx942 = "
    "MI300X, cuda = SM90, cpu), with its performance class and why.",
)
@click.option(
    "--tp",
    "tp",
    type=Count(1, 1024),
    default=1,
    show_default=True,
    help="Tensor-parallel size for --platform (per-rank shapes and padding).",
)
@vllm_version_option()
@json_option("Print every layer and group with precision, reason and bytes as JSON.")
def inspect_command(
    folder: Path,
    target: Path | None,
    show_layers: bool,
    platform: str | None,
    tp: int,
    vllm_version: str | None,
    as_json: bool,
) -> None:
    """Show the precision vLLM will give every layer of a checkpoint, and why.

    \b
    quantkit inspect MODEL-MXFP4
    quantkit inspect DRAFT-FP8 --target TARGET
    quantkit inspect MODEL-MXFP4 --platform gfx942 --tp 8

    Layers are named as vLLM names them at run time (`model.fc`, `model.layers.4.self_attn.qkv_proj`); the reason
    is the exclude entry, layer_quant_config key or global_quant_config that decided, replaying vLLM's Quark loader.
    Layers that differ only in their decoder-layer number are grouped (`model.layers.{0-59}.mlp.experts` x60).
    Reads config.json and safetensors headers only.
    """
    from quantkit.check.inspect import inspect_checkpoint
    from quantkit.io.checkpoint import target_layer_count
    from quantkit.io.files import check_model_folders

    check_model_folders([folder, target])
    n = target_layer_count(target) if target is not None else None
    result = inspect_checkpoint(folder, n, platform=platform, tp=tp, vllm_version=vllm_version)
    if as_json:
        print_json(result.to_dict())
        return
    _render_inspect(result, show_layers)


def _mb(n: int) -> str:
    return f"{n / 1e6:,.2f}"


def _render_inspect(result: InspectResult, show_layers: bool) -> None:
    from rich.table import Table

    console = make_console()
    n = result.target_num_layers
    title = f"{result.path}: {result.architecture} ({result.model_kind})" + (f", target layers {n}" if n else "")
    table = Table(title=title, title_justify="left")
    table.add_column("vLLM layer", overflow="fold")
    table.add_column("x", justify="right", no_wrap=True)
    table.add_column("precision", no_wrap=True)
    table.add_column("why", overflow="fold")
    table.add_column("MB", justify="right", no_wrap=True)
    if show_layers:
        rows = [(lp.name, 1, lp.precision, lp.reason, lp.bytes, lp.experts) for lp in result.layers]
    else:
        rows = [(g.pattern, g.count, g.precision, g.reason, g.bytes, g.experts) for g in result.groups]
    for name, count, precision, reason, size, experts in rows:
        label = f"{name} ({experts} experts)" if experts else name
        table.add_row(label, str(count), precision, reason, _mb(size))
    console.print(table)
    sizes = Table(title="Bytes by precision", title_justify="left")
    sizes.add_column("precision")
    sizes.add_column("MB", justify="right")
    sizes.add_column("share", justify="right")
    total = max(result.total_bytes, 1)
    for precision, size in sorted(result.bytes_by_precision.items(), key=lambda kv: -kv[1]):
        sizes.add_row(precision, _mb(size), f"{size / total:.1%}")
    sizes.add_row("(not in a layer: norms, maps, ...)", _mb(result.other_bytes), f"{result.other_bytes / total:.1%}")
    sizes.add_row("total", _mb(result.total_bytes), "100%")
    console.print(sizes)
    for problem in result.config_problems:
        console.print(f"note: {problem}")
    if result.source_format:
        console.print(f"source format: {result.source_format}")
    if result.kernels is not None:
        render_kernels(console, result.kernels)
    if result.draft_cost is not None:
        render_draft_cost(console, result.draft_cost)
    console.print(f"{result.num_tensors} tensors, {len(result.layers)} layers, {result.seconds:.2f}s")
    if result.quantization is None:
        _suggest_recipes(result)


def _suggest_recipes(result: InspectResult) -> None:
    """For an unquantized model: the bundled recipes made for its kind, and the command (on stderr: stdout stays
    the result)."""
    from quantkit.recipes import list_recipes

    fits = [r for r in list_recipes() if r.applies_to == result.model_kind]
    if not fits:
        return
    click.echo(
        f"next: quantize it with a recipe for its kind ({result.model_kind}): "
        + "; ".join(f"{r.name} ({r.description.rstrip('.')})" for r in fits),
        err=True,
    )
    argv = [
        "quantkit",
        "apply",
        "--recipe",
        fits[0].name,
        "--model",
        result.path,
        "--output",
        f"{Path(result.path).name}-{fits[0].name}",
    ]
    if result.model_kind == EAGLE3_DRAFT:
        argv += ["--target", "TARGET"]
    print_command(argv, err=True)
