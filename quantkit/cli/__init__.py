"""The `quantkit` command line: one module per command, registered here in pipeline order.

Each command module holds its Click command and its renderer; app.py holds the group and the error contract,
options.py what every command shares.
"""

from quantkit.cli import (  # noqa: F401
    acceptance,
    apply,
    bench,
    check,
    demo,
    deploy,
    eval,
    gate,
    inspect,
    publish,
    recipes,
    rules,
    tune,
)
from quantkit.cli.app import main

__all__ = ["main"]
