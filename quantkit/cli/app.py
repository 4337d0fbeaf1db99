"""The `quantkit` Click group and its exit contract.

Every QuantkitError becomes one line `error: <message>` with exit 2; an interrupt (Ctrl-C or SIGTERM) one line with
130 or 143; a command whose answer is "no" (check found errors, the gate failed) exits 1 through exit_failed()."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import Any

import click

from quantkit import __version__
from quantkit.errors import (
    RECEIVED,
    QuantkitError,
    ResumableInterrupt,
    Terminated,
    interrupted_hint,
    scrub_secrets,
)

MAX_MESSAGE = 600
# `quantkit --help` lists the commands in the order a user runs them.
PIPELINE_ORDER = (
    "recipes",
    "apply",
    "inspect",
    "check",
    "acceptance",
    "tune",
    "eval",
    "gate",
    "deploy",
    "publish",
    "demo",
)


class QuantkitGroup(click.Group):
    """A Click group that prints a QuantkitError as one line `error: <message>` on stderr and exits with 2."""

    group_class = type  # subgroups use this class too

    def list_commands(self, ctx: click.Context) -> list[str]:
        rank = {name: i for i, name in enumerate(PIPELINE_ORDER)}
        return sorted(self.commands, key=lambda name: (rank.get(name, len(rank)), name))

    def main(self, *args: Any, **kwargs: Any) -> Any:
        # SIGTERM (a CI runner's cancel, `kill`) unwinds like Ctrl-C, so temporary folders are cleaned up the same way.
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, raise_terminated)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, raise_interrupted)
        scrub_logs_and_warnings()
        return super().main(*args, **kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        args = [*(getattr(ctx, "_protected_args", None) or []), *ctx.args]
        wants_json = "--json" in args
        try:
            with _remote_code_hint(self, args):
                result = super().invoke(ctx)
            if RECEIVED:  # a library swallowed the interrupt and the command ran on: still the interrupt
                name, code = RECEIVED[-1]
                click.echo(f"error: interrupted by {name}; the command's result is not to be trusted", err=True)
                interrupted_exit(code)
            return result
        except KeyboardInterrupt as e:
            term = isinstance(e, Terminated) or (isinstance(e, ResumableInterrupt) and e.terminated)
            name, code = ("SIGTERM", 143) if term else ("SIGINT", 130)
            hint = interrupted_hint(getattr(e, "hint", None))
            click.echo(scrub_secrets(f"error: interrupted by {name}; {hint}"), err=True)
            interrupted_exit(code)
        except RecursionError:
            click.echo(
                "error: input nested too deeply to read (a hostile or corrupt JSON/YAML file?); check the "
                "files you passed",
                err=True,
            )
            ctx.exit(2)
        except QuantkitError as e:
            # Messages are one line by contract (keep it so for `2>&1 | tail`), and never hold a credential.
            message = scrub_secrets(" ".join(str(e).split("\n")))
            if len(message) > MAX_MESSAGE:  # a message that echoes hostile input must not flood the terminal
                message = message[:MAX_MESSAGE] + f"... ({len(message) - MAX_MESSAGE} more characters)"
            click.echo(f"error: {message}", err=True)
            if wants_json:
                print_json_error(ctx, args, e.to_dict())
            ctx.exit(e.exit_code)
        except click.ClickException as e:
            if wants_json:  # a refused option value: the script parsing stdout gets the error as data too
                print_json_error(
                    ctx,
                    args,
                    {
                        "type": type(e).__name__,
                        "message": scrub_secrets(e.format_message()),
                        "input": None,
                        "reason": None,
                        "fix": None,
                        "exit_code": e.exit_code,
                    },
                )
            raise
        except (click.exceptions.Exit, click.Abort):
            raise
        except BrokenPipeError:
            # the reader stopped reading (`quantkit deploy ... | head`): nothing to report; stdout goes to /dev/null
            # so that the interpreter's final flush does not fail again, and the exit status is SIGPIPE's
            import sys

            try:
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            except (OSError, ValueError, AttributeError):  # stdout is not a file descriptor (a test's runner)
                pass
            ctx.exit(141)
        except Exception as e:  # a bug or a failure inside Quark/vLLM: one line unless asked for the traceback
            if RECEIVED:
                # A library caught the KeyboardInterrupt and raised something else (safetensors' loader turns one
                # into a ValueError): it is still the interrupt, and cleanup already ran on the way here.
                name, code = RECEIVED[-1]
                click.echo(scrub_secrets(f"error: interrupted by {name}; {interrupted_hint()}"), err=True)
                interrupted_exit(code)
            if os.environ.get("QUANTKIT_DEBUG") == "1":
                raise
            first = scrub_secrets(" ".join(str(e).split("\n")))[:300]
            click.echo(
                f"error: unexpected {type(e).__name__}: {first} (set QUANTKIT_DEBUG=1 for the traceback)", err=True
            )
            ctx.exit(1)


def _remote_code_hint(group: click.Group, args: list[str]) -> contextlib.AbstractContextManager[None]:
    """A remote-code refusal names --trust-remote-code only where the command takes it, else the step that does
    (quantkit.io.hf.hint_for_command)."""
    name = args[0] if args and not args[0].startswith("-") else ""
    command = group.commands.get(name)
    if command is None:
        return contextlib.nullcontext()
    from quantkit.io.hf import hint_for_command, remote_code_hint

    takes_flag = any(p.name == "trust_remote_code" for p in command.params)
    return remote_code_hint(hint_for_command(name, takes_flag))


def print_json_error(ctx: click.Context, args: list[str], error: dict[str, Any]) -> None:
    """A failing `--json` run's stdout: one JSON object with the schema version, the command and the error as data
    (the one `error:` line stays on stderr), so that a script parsing stdout always has something to parse."""
    import json

    from quantkit.results.base import SCHEMA_VERSION

    sub = args[0] if args and not args[0].startswith("-") else ""
    names, c = [sub], ctx
    while c.parent is not None:  # the subcommands between the root and this group ("recipes" for `recipes show`)
        names.insert(0, c.info_name or "")
        c = c.parent
    command = " ".join(n for n in names if n) or None
    message = str(error.get("message") or "")
    if len(message) > MAX_MESSAGE:
        error = {**error, "message": message[:MAX_MESSAGE] + f"... ({len(message) - MAX_MESSAGE} more characters)"}
    click.echo(json.dumps({"schema_version": SCHEMA_VERSION, "command": command, "ok": False, "error": error}))


def scrub_logs_and_warnings() -> None:
    """Pass every log record and warning of this process (huggingface_hub logs each URL it retries, httpx each
    request) through scrub_secrets before any handler formats it."""
    import logging
    import warnings

    factory = logging.getLogRecordFactory()
    if getattr(factory, "quantkit_scrubs", False):
        return

    def scrubbed_record(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = factory(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is the logging module's to report
            return record
        record.msg, record.args = scrub_secrets(message), None
        return record

    scrubbed_record.quantkit_scrubs = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(scrubbed_record)
    show = warnings.showwarning

    def scrubbed_warning(
        message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: str | None = None
    ) -> None:
        show(scrub_secrets(str(message)), category, filename, lineno, file, line)

    warnings.showwarning = scrubbed_warning


def interrupted_exit(code: int) -> None:
    """Exit with 128 + signal once cleanup has run (the `finally` blocks did it on the way here).

    os._exit, not sys.exit: a library caught mid-import or mid-kernel can leave the interpreter re-raising the signal
    at shutdown (the process then dies with -2 instead of 130), so nothing after this point may run.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def exit_failed() -> None:
    """The one way a command says "ran, and the answer is no" (check found errors, the gate failed): exit 1."""
    raise click.exceptions.Exit(1)


def raise_terminated(signum: int, frame: Any) -> None:
    RECEIVED.append(("SIGTERM", 143))
    raise Terminated()


def raise_interrupted(signum: int, frame: Any) -> None:
    RECEIVED.append(("SIGINT", 130))
    raise KeyboardInterrupt()


@click.group(cls=QuantkitGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="quantkit")
def main() -> None:
    """Quantize MoE targets to MXFP4 and EAGLE-3 drafts to FP8 with AMD Quark, and check them for vLLM.

    A recipe (a built-in name or your own YAML file) says which layers get which Quark scheme and which stay
    BF16, and why. Start with `quantkit recipes list`, `quantkit recipes show fp8-draft` and `quantkit demo`.

    \b
    The pipeline, one command per step:
      apply -> check -> acceptance -> eval -> gate -> publish
    Beside it: `recipes` lists what apply can do, `inspect` shows the precision
    vLLM will give every layer, `deploy` writes the `vllm serve` command line,
    and `demo` runs the whole pipeline on the bundled tiny models.

    Errors are printed as one line `error: <message>` with exit status 2.
    """
