"""`quantkit recipes list|show`: the built-in recipes, or your own YAML validated."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from quantkit.cli.app import main
from quantkit.cli.options import json_option, make_console, print_json

if TYPE_CHECKING:  # result types only; the modules are imported when the command runs
    from quantkit.recipes import Recipe


@main.group()
def recipes() -> None:
    """List and inspect quantization recipes.

    Wherever a recipe name is accepted, a path to your own YAML file works too.
    """


@recipes.command("list")
@json_option("Print the recipes as JSON (results.RecipeList: each recipe's keys and its source file).")
def recipes_list(as_json: bool) -> None:
    """List the built-in recipes."""
    from quantkit.recipes import list_recipes

    items = list_recipes()
    if as_json:
        from quantkit.results.recipes import RecipeEntry, RecipeList

        print_json(RecipeList(recipes=[RecipeEntry(recipe=r, source=str(r.source)) for r in items]).to_dict())
    else:
        make_console().print(_recipes_table(items))


@recipes.command("show")
@click.argument("name_or_file")
@json_option("Print the recipe as JSON (results.RecipeDocument: the YAML file's keys under `recipe`, and its source).")
def recipes_show(name_or_file: str, as_json: bool) -> None:
    """Show one recipe: a built-in NAME or a YAML FILE, validated.

    Use it to check your own recipe file before quantizing with it.
    """
    from quantkit.recipes import load_recipe

    recipe = load_recipe(name_or_file)
    if as_json:
        from quantkit.results.recipes import RecipeDocument

        source = str(recipe.source) if recipe.source is not None else None
        print_json(RecipeDocument(recipe=recipe, source=source).to_dict())
    else:
        _render_recipe(recipe)


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

    console = make_console()
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
