"""Where quantkit's bundled data lives: built-in recipes, prompts, eval tasks and the demo's tiny models.

All of it is package data under quantkit/data/, in a source checkout and in an installed wheel alike. In the
checkout, data/recipes and data/tiny are symlinks to the top-level recipes/ and examples/tiny/ (the source of
truth); the build copies what they point to into wheels and sdists.
"""

import os
from pathlib import Path

# Env overrides exist so that tests and users can point at other folders.
RECIPES_DIR_ENV = "QUANTKIT_RECIPES_DIR"
TINY_MODELS_DIR_ENV = "QUANTKIT_TINY_MODELS_DIR"


def data_dir() -> Path:
    """quantkit/data: the package's own data folder."""
    return Path(__file__).resolve().parent.parent / "data"


def recipes_dir() -> Path:
    """Folder of built-in recipes (`<name>.yaml`); `$QUANTKIT_RECIPES_DIR` overrides it."""
    override = os.environ.get(RECIPES_DIR_ENV)
    return Path(override) if override else data_dir() / "recipes"


def tiny_models_dir() -> Path:
    """Folder of the bundled tiny models (target, EAGLE-3 draft, MoE target); `$QUANTKIT_TINY_MODELS_DIR` overrides."""
    override = os.environ.get(TINY_MODELS_DIR_ENV)
    return Path(override) if override else data_dir() / "tiny"


def builtin_prompts_file() -> Path:
    return data_dir() / "prompts.jsonl"


def eval_tasks_dir() -> Path:
    return data_dir() / "eval_tasks"
