"""The `quantkit` command line: thin Click commands that call library functions and render their results."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from quantkit import __version__
from quantkit.errors import BundledDataError, QuantkitError

if TYPE_CHECKING:  # rich and pydantic cost ~0.2 s to import; commands import them when they render or validate
    from rich.console import Console

    from quantkit.headers import CheckpointSummary
    from quantkit.recipes import Recipe

MAKE_TINY_MODELS = "python examples/make_tiny_models.py"


class QuantkitGroup(click.Group):
    """A Click group that prints a QuantkitError as one line `error: <message>` on stderr and exits with 2."""

    group_class = type  # subgroups use this class too

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except QuantkitError as e:
            message = " ".join(str(e).split("\n"))  # messages are one line by contract; keep it so for `2>&1 | tail`
            click.echo(f"error: {message}", err=True)
            ctx.exit(e.exit_code)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except Exception as e:  # a bug or a failure inside Quark/vLLM: one line unless asked for the traceback
            if os.environ.get("QUANTKIT_DEBUG") == "1":
                raise
            first = " ".join(str(e).split("\n"))[:300]
            click.echo(f"error: unexpected {type(e).__name__}: {first} (set QUANTKIT_DEBUG=1 for the traceback)",
                       err=True)
            ctx.exit(1)


def _json_option(help_text: str = "Print JSON on stdout instead of a table.") -> Any:
    return click.option("--json", "as_json", is_flag=True, help=help_text)


def _print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2))


def _console() -> Console:
    from rich.console import Console

    # markup off: recipe reasons and paths are user text, and `[...]` in them must print as written.
    console = Console(markup=False, highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        # Piped output ends up in files and CI logs, not an 80-column terminal: wrap less, fold fewer names.
        console.width = 120
    return console


@click.group(cls=QuantkitGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="quantkit")
def main() -> None:
    """Quantize MoE targets to MXFP4 and EAGLE-3 drafts to FP8 with AMD Quark, and check them for vLLM.

    A recipe (a built-in name or your own YAML file) says which layers get which Quark scheme and which stay
    BF16, and why. Start with `quantkit recipes list`, `quantkit recipes show fp8-draft` and `quantkit demo`.

    \b
    The pipeline, of which this release has the recipes and the demo:
      apply -> check -> acceptance -> eval -> gate -> publish

    Errors are printed as one line `error: <message>` with exit status 2.
    """


@main.group()
def recipes() -> None:
    """List and inspect quantization recipes.

    Wherever a recipe name is accepted, a path to your own YAML file works too.
    """


@recipes.command("list")
@_json_option("Print a JSON list of recipes (with their source file) instead of a table.")
def recipes_list(as_json: bool) -> None:
    """List the built-in recipes."""
    from quantkit.recipes import list_recipes

    items = list_recipes()
    if as_json:
        _print_json([{**r.to_dict(), "source": str(r.source)} for r in items])
    else:
        _console().print(_recipes_table(items))


@recipes.command("show")
@click.argument("name_or_file")
@_json_option("Print the recipe as JSON (the same keys as the YAML file).")
def recipes_show(name_or_file: str, as_json: bool) -> None:
    """Show one recipe: a built-in NAME or a YAML FILE, validated.

    Use it to check your own recipe file before quantizing with it.
    """
    from quantkit.recipes import load_recipe

    recipe = load_recipe(name_or_file)
    if as_json:
        _print_json(recipe.to_dict())
    else:
        _render_recipe(recipe)


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
@click.option("--overwrite", is_flag=True, help="Replace the output folder if it exists.")
@_json_option("Print the result (what was quantized, what was kept and why, timings) as JSON.")
def apply_command(recipe: str, model: str, output: Path, target: str | None, device: str, run_path: str | None,
                  overwrite: bool, as_json: bool) -> None:
    """Quantize a checkpoint with a recipe, so that vLLM loads it exactly as the recipe intends.

    \b
    quantkit apply --recipe fp8-draft --model DRAFT --output DRAFT-FP8
    quantkit apply --recipe mxfp4-moe --model MOE --output MOE-MXFP4 --path per-shard

    The output holds the quantized safetensors, config.json with a quantization_config whose `exclude` uses
    vLLM's runtime module names (e.g. `model.fc`, not Quark's `fc`), the tokenizer files, and quantkit.json
    (recipe, source hashes, versions, per-layer decisions with reasons, sizes, timings). Kept tensors are checked
    to be byte-identical to the source before the folder is put in place.
    """
    from quantkit.quantize import apply

    result = apply(recipe, model, output, device=device, path=run_path, overwrite=overwrite, target=target)
    if as_json:
        _print_json(result.to_dict())
        return
    _render_apply(result)


@main.command()
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("quantkit-demo"),
    show_default=True,
    envvar="QUANTKIT_DEMO_WORKDIR",
    help="Where the demo's quantized models will go once the quantization steps exist; nothing is written yet.",
)
@_json_option()
def demo(workdir: Path, as_json: bool) -> None:
    """Show the bundled tiny target + EAGLE-3 draft and the recipes to quantize them with.

    The tiny models are made by `python examples/make_tiny_models.py`. Their sizes and tensor counts are read
    from config.json and safetensors headers only. Quantizing, checking and measuring them come in later
    releases.
    """
    from quantkit.headers import summarize_checkpoint
    from quantkit.paths import tiny_models_dir
    from quantkit.recipes import list_recipes

    folder = tiny_models_dir()
    model_dirs = sorted(p for p in folder.iterdir() if (p / "config.json").is_file()) if folder.is_dir() else []
    if not model_dirs:
        raise BundledDataError(f"no tiny models in {folder}; run `{MAKE_TINY_MODELS}` to create them")
    models = [summarize_checkpoint(p) for p in model_dirs]
    items = list_recipes()
    note = "apply, check and acceptance for these models come in later releases"
    if as_json:
        _print_json({
            "tiny_models_dir": str(folder),
            "workdir": str(workdir),
            "models": [m.to_dict() for m in models],
            "recipes": [r.to_dict() for r in items],
            "note": note,
        })
        return
    console = _console()
    console.print(_models_table(models, folder))
    console.print(_recipes_table(items))
    console.print(f"Next: {note}; their outputs will go to {workdir}.")


# --- rendering ----------------------------------------------------------------------------------------------------


def _recipes_table(items: list[Recipe]) -> Any:
    from rich.table import Table

    table = Table(title="Recipes", title_justify="left")
    for column in ("name", "applies_to", "scheme", "path", "description"):
        table.add_column(column, no_wrap=column != "description")
    for r in items:
        table.add_row(r.name, r.applies_to, r.scheme, r.path, r.description)
    return table


def _render_recipe(recipe: Recipe) -> None:
    from rich.table import Table

    facts = recipe.scheme_facts
    summary = Table.grid(padding=(0, 2))
    summary.add_column(style="bold")
    summary.add_column()
    summary.add_row("name", recipe.name)
    summary.add_row("description", recipe.description)
    summary.add_row("applies_to", recipe.applies_to)
    summary.add_row("scheme", f"{recipe.scheme} (weights: {facts.weights}; activations: {facts.activations})")
    summary.add_row("quantize", ", ".join(recipe.quantize) if recipe.quantize else "every linear layer not kept")
    summary.add_row("path", recipe.path)
    calibration = recipe.calibration
    summary.add_row(
        "calibration", "none" if calibration is None else f"{calibration.samples} samples x {calibration.seq_len}"
    )
    summary.add_row("source", str(recipe.source))

    keep = Table(title="Kept in BF16", title_justify="left")
    keep.add_column("layers", no_wrap=True)
    keep.add_column("reason")
    for k in recipe.keep:
        keep.add_row(k.label, k.reason)

    console = _console()
    console.print(summary)
    console.print(keep)
    if recipe.overrides:
        overrides = Table(title="Overrides", title_justify="left")
        overrides.add_column("layers", no_wrap=True)
        overrides.add_column("scheme", no_wrap=True)
        overrides.add_column("reason")
        for o in recipe.overrides:
            overrides.add_row(o.label, o.scheme, o.reason)
        console.print(overrides)


def _render_apply(result: Any) -> None:
    from rich.table import Table

    table = Table(title=f"{result.architecture} ({result.model_kind}) -> {result.output}", title_justify="left")
    table.add_column("vLLM layer", overflow="fold")
    table.add_column("action", no_wrap=True)
    table.add_column("scheme", no_wrap=True)
    table.add_column("why")
    for d in result.layers:
        table.add_row(d.runtime_name, d.action, d.scheme or "bf16", d.reason)
    console = _console()
    console.print(table)
    ratio = result.size_after_bytes / max(result.size_before_bytes, 1)
    console.print(f"exclude (vLLM names): {result.exclude}")
    console.print(f"size {result.size_before_bytes / 1e6:.2f} MB -> {result.size_after_bytes / 1e6:.2f} MB "
                  f"({ratio:.2f}x); {result.path} on {result.device}; {result.timings_s['total']:.1f}s; "
                  f"peak RSS {result.peak_rss_mb:.0f} MB")


def _models_table(models: list[CheckpointSummary], folder: Path) -> Any:
    from rich.table import Table

    table = Table(title=f"Tiny models in {folder}", title_justify="left")
    # Names fold rather than end in '…' when the console is narrow (80 columns when piped): nothing is hidden.
    table.add_column("name", overflow="fold")
    table.add_column("architecture", overflow="fold")
    for column in ("layers", "hidden", "vocab", "MB", "shards", "tensors"):
        table.add_column(column, justify="right", no_wrap=True, min_width=len(column))
    for m in models:
        sizes = (m.num_layers, m.hidden_size, m.vocab_size, f"{m.size_mb:.2f}", m.shards, m.tensors)
        values = (m.name, m.architecture, *sizes)
        table.add_row(*("-" if v is None else str(v) for v in values))
    return table
