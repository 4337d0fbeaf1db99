"""`quantkit apply`: quantize a checkpoint with a recipe."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from quantkit.cli.app import main
from quantkit.cli.options import json_option, make_console, print_json, trust_option
from quantkit.progress import stderr_progress

if TYPE_CHECKING:  # result types only; the modules are imported when the command runs
    from quantkit.results import ApplyResult


@main.command("apply")
@click.option("--recipe", "recipe", required=True, envvar="QUANTKIT_RECIPE",
              help="A built-in recipe name (quantkit recipes list) or a path to your own recipe YAML.")
@click.option("--model", "model", required=True, help="Source checkpoint: a local HF folder or a Hub repo id.")
@click.option("--output", "output", required=True, type=click.Path(path_type=Path),
              help="Output folder; written to a temporary folder beside it and renamed when complete.")
@click.option("--target", "target", default=None,
              help="For EAGLE-3 drafts: the target checkpoint (folder or Hub id). Its layer count gives the draft's "
                   "exact vLLM layer names; without it, kept decoder-layer modules are excluded by `re:` pattern.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="Where Quark runs (cuda also means ROCm GPUs).")
@click.option("--path", "run_path", type=click.Choice(["in-memory", "per-shard"]), default=None,
              help="Quark execution path; default: the recipe's. per-shard handles checkpoints larger than memory.")
@click.option("--overwrite", is_flag=True,
              help="Replace the output folder if a previous `quantkit apply` wrote it (never a source, never a folder "
                   "holding files quantkit did not write).")
@trust_option()
@json_option("Print the result (what was quantized, what was kept and why, timings) as JSON.")
def apply_command(recipe: str, model: str, output: Path, target: str | None, device: str, run_path: str | None,
                  overwrite: bool, trust_remote_code: bool, as_json: bool) -> None:
    """Quantize a checkpoint with a recipe, so that vLLM loads it exactly as the recipe intends.

    \b
    quantkit apply --recipe fp8-draft --model DRAFT --output DRAFT-FP8
    quantkit apply --recipe mxfp4-moe --model MOE --output MOE-MXFP4 --path per-shard

    The output holds the quantized safetensors, config.json with a quantization_config whose `exclude` uses
    vLLM's runtime module names (e.g. `model.fc`, not Quark's `fc`), the tokenizer files, and quantkit.json
    (recipe, source hashes, versions, per-layer decisions with reasons, sizes, timings). Kept tensors are checked
    to be byte-identical to the source before the folder is put in place.
    """
    from quantkit.apply.run import apply
    from quantkit.io.hf import remote_code_allowed

    with remote_code_allowed(trust_remote_code):
        result = apply(recipe, model, output, device=device, path=run_path, overwrite=overwrite, target=target,
                       progress=stderr_progress("apply"))
    if as_json:
        print_json(result.to_dict())
        return
    _render_apply(result)


def _render_apply(result: ApplyResult) -> None:
    from rich.table import Table

    table = Table(title=f"{result.architecture} ({result.model_kind}) -> {result.output}", title_justify="left")
    table.add_column("vLLM layer", overflow="fold")
    table.add_column("action", no_wrap=True)
    table.add_column("scheme", no_wrap=True)
    table.add_column("why")
    for d in result.layers:
        table.add_row(d.runtime_name, d.action, d.scheme or "bf16", d.reason)
    console = make_console()
    console.print(table)
    ratio = result.size_after_bytes / max(result.size_before_bytes, 1)
    console.print(f"exclude (vLLM names): {result.exclude}")
    console.print(f"size {result.size_before_bytes / 1e6:.2f} MB -> {result.size_after_bytes / 1e6:.2f} MB "
                  f"({ratio:.2f}x); {result.path} on {result.device}; {result.timings_s['total']:.1f}s; "
                  f"peak RSS {result.peak_rss_mb:.0f} MB")
