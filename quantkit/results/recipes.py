"""Results of `recipes list` and `recipes show`: the recipes as their YAML layout, with the file each came from."""

from __future__ import annotations

from typing import Any

from pydantic import model_serializer, model_validator

from quantkit.recipes import Recipe
from quantkit.results.base import CommandResult, Result


class RecipeEntry(Result):
    """One recipe of `recipes list`: the recipe's keys as in its YAML file (Recipe.to_dict), plus `source`, flat."""

    recipe: Recipe
    source: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_flat(cls, data: Any) -> Any:
        if isinstance(data, dict) and "recipe" not in data:
            rest = dict(data)
            return {"source": rest.pop("source", None), "recipe": rest}
        return data

    @model_serializer(mode="plain")
    def _flat(self) -> dict[str, Any]:
        return {**self.recipe.to_dict(), "source": self.source}


class RecipeList(CommandResult):
    """`recipes list --json`: every built-in recipe (or those of QUANTKIT_RECIPES_DIR), in name order."""

    recipes: list[RecipeEntry] = []


class RecipeDocument(CommandResult):
    """`recipes show --json`: one recipe, validated, in its YAML layout, and the file it was read from."""

    recipe: Recipe
    source: str | None = None

    @model_serializer(mode="wrap")
    def _recipe_as_yaml(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        data["recipe"] = self.recipe.to_dict()  # the YAML layout: no null selectors, calibration "none"
        return data


__all__ = ["RecipeDocument", "RecipeEntry", "RecipeList"]
