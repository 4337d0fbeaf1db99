"""Where quantkit's bundled data lives: built-in recipes and the example tiny models of a source checkout."""

import os
from pathlib import Path

# Env overrides exist so that tests and installs outside a source checkout can point at other folders.
RECIPES_DIR_ENV = "QUANTKIT_RECIPES_DIR"
TINY_MODELS_DIR_ENV = "QUANTKIT_TINY_MODELS_DIR"


def repo_root() -> Path:
    """The source checkout that holds the `quantkit` package folder (recipes/ and examples/ sit beside it)."""
    return Path(__file__).resolve().parent.parent


def recipes_dir() -> Path:
    """Folder of built-in recipes (`<name>.yaml`); `$QUANTKIT_RECIPES_DIR` overrides it."""
    override = os.environ.get(RECIPES_DIR_ENV)
    return Path(override) if override else repo_root() / "recipes"


def examples_dir() -> Path:
    """Folder of examples: the tiny model pair, the script that makes it, gate and CI examples."""
    return repo_root() / "examples"


def tiny_models_dir() -> Path:
    """Folder of the tiny target + EAGLE-3 draft models; `$QUANTKIT_TINY_MODELS_DIR` overrides it."""
    override = os.environ.get(TINY_MODELS_DIR_ENV)
    return Path(override) if override else examples_dir() / "tiny"
