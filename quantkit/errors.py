"""Errors a user can cause: the CLI prints each as one line `error: <message>` and exits with status 2."""


class QuantkitError(Exception):
    """Base for every error caused by user input; the message is one line that names the input and the fix."""

    exit_code = 2


class RecipeError(QuantkitError):
    """A recipe name or file is unknown, unreadable, or breaks the recipe schema or its rules."""


class CheckpointError(QuantkitError):
    """A checkpoint folder or safetensors file is missing, truncated, or malformed."""


class BundledDataError(QuantkitError):
    """Data that ships with a source checkout (recipes, tiny example models) is missing or not generated yet."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is (the CLI installs the handler) so that cleanup runs as for Ctrl-C."""


class ResumableInterrupt(KeyboardInterrupt):
    """An interrupt that left a resumable temporary folder; `hint` says how to continue (the CLI prints it)."""

    def __init__(self, hint: str, terminated: bool = False):
        super().__init__(hint)
        self.hint = hint
        self.terminated = terminated


class UnresumableError(QuantkitError):
    """An error after which `--resume` is not the fix: an interrupted run's journal is unreadable or another run's."""
