"""Options and output helpers every command shares: --json, --trust-remote-code, the console, strict JSON."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import click

if TYPE_CHECKING:  # rich and pydantic cost ~0.2 s to import; commands import them when they render or validate
    from rich.console import Console


def trust_option() -> Any:
    return click.option(
        "--trust-remote-code",
        "trust_remote_code",
        is_flag=True,
        help="Allow transformers/vLLM to run Python code shipped in a model folder (auto_map). "
        "Off by default: quantkit never runs a folder's code unless you pass this.",
    )


def vllm_version_option() -> Any:
    from quantkit.cli.params import VllmVersion

    return click.option(
        "--vllm-version",
        "vllm_version",
        type=VllmVersion(),
        default=None,
        metavar="X.Y.Z",
        help="The vLLM version the rules hold for (rules carry a version range). Default: the "
        "installed vLLM, else the newest version the rule table knows.",
    )


def verbose_option(what: str) -> Any:
    return click.option("--verbose", "-v", "verbose", is_flag=True, help=f"Also print {what} (always in --json).")


def verdict_line(ok: bool, findings: Sequence[Any], about: str, failed: str = "FAILED") -> str:
    """THE verdict line, printed first by check and deploy: `OK` or `failed`, the finding counts, then what was
    judged."""

    def n(severity: str) -> str:
        count = sum(f.severity == severity for f in findings)
        return f"{count} {severity}{'' if count == 1 or severity == 'info' else 's'}"

    return f"{'OK' if ok else failed}: {n('error')}, {n('warning')}, {n('info')}; {about}"


def findings_table(findings: Sequence[Any]) -> Any:
    """The findings of check (or any rule run) as one table; a finding's code never wraps."""
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("severity", no_wrap=True)
    table.add_column("code", no_wrap=True, min_width=max((len(f.code) for f in findings), default=4))
    table.add_column("layer / tensor", overflow="fold", ratio=1)
    table.add_column("what", overflow="fold", ratio=3)
    table.add_column("fix", overflow="fold", ratio=2)
    for f in findings:
        table.add_row(f.severity, f.code, f.layer_or_tensor, f.message, f.fix)
    return table


def render_kernels(console: Any, report: Any) -> None:
    """The kernel-path table of a KernelReport (inspect --platform, check)."""
    from rich.table import Table

    table = Table(
        title=f"vLLM {report.vllm_version} kernel path on {report.platform} (assumes "
        + ", ".join(f"{k}={v}" for k, v in report.assumes.items())
        + ")",
        title_justify="left",
    )
    for col in ("layer", "x", "kind", "scheme", "backend", "class", "why"):
        table.add_column(col, overflow="fold", no_wrap=col in ("x", "class"))
    for p in report.paths:
        table.add_row(p.layer, str(p.count), p.kind, p.scheme, p.backend, p.perf_class, p.why)
    console.print(table)


def json_option(help_text: str = "Print JSON on stdout instead of a table.") -> Any:
    return click.option("--json", "as_json", is_flag=True, help=help_text)


def check_writable_file(path: Path, option: str) -> None:
    """Fail before any work when a result file cannot be written where the user asked."""
    from quantkit.errors import QuantkitError

    folder = path.expanduser().resolve().parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if path.is_dir():
        raise QuantkitError(f"{option} {path}: is a folder; give a file path such as {path}/result.json")
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise QuantkitError(f"{option} {path}: {folder} is not a writable folder; pick a path you can write to")


def check_writable_folder(path: Path, option: str) -> None:
    """Fail before any work unless `path` is a folder, or can be made one, that the user can write into."""
    from quantkit.errors import QuantkitError

    if path.exists() and not path.is_dir():
        raise QuantkitError(f"{option} {path}: is a file; give a folder (it is created when missing)")
    folder = path.expanduser().resolve()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise QuantkitError(f"{option} {path}: {folder} is not a writable folder; pick a folder you can write to")


def print_command(argv: Sequence[str], *, err: bool = False) -> None:
    """THE way to print a command a user pastes: shell-quoted (shlex), alone on its line, never wrapped.

    It goes to the plain stream (click.echo), not through rich, whose console hard-wraps long lines at the terminal
    width: a wrapped `vllm serve` command split its --speculative-config JSON mid-word, and the pasted first line
    ran the target without the draft (issue 36). `shlex.split` of the line gives `argv` back."""
    import shlex

    click.echo(shlex.join(argv), err=err)


def default_out(command: str, model: str | Path) -> Path:
    """The default output folder of a command that writes files: ./quantkit-out/<command>-<model name>/, never the
    current folder itself (a result left beside the user's files, and silently replaced by the next run)."""
    path = Path(str(model)).expanduser()
    name = (path.resolve().name if path.exists() else path.name) or "model"  # `deploy .` is named after the folder
    return Path("quantkit-out") / f"{command}-{name}"


def check_file_free(path: Path, overwrite: bool, option: str = "--out") -> None:
    """Refuse, before any work, to replace a result file that an earlier run wrote, unless --overwrite is given."""
    from quantkit.errors import QuantkitError

    if path.exists() and not overwrite:
        raise QuantkitError(
            f"{option} {path.parent}: {path.name} exists (from an earlier run); pass --overwrite "
            f"to replace it, or another {option}"
        )


def human_bytes(*sizes: int) -> list[str]:
    """Byte counts in one decimal unit (B, KB, MB, GB, TB) chosen by the largest, with the digits that show how they
    differ: 2,345,678 and 2,101,000 read "2.35 MB" and "2.10 MB", never "0.002 GB" twice."""
    units = ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "KB"), (1.0, "B"))
    largest = max(sizes, default=0)
    scale, unit = next(((f, u) for f, u in units if largest >= f), (1.0, "B"))
    if unit == "B":
        return [f"{n} B" for n in sizes]
    digits = 2
    while digits < 6 and len({f"{n / scale:.{digits}f}" for n in sizes}) < len(set(sizes)):
        digits += 1
    return [f"{n / scale:,.{digits}f} {unit}" for n in sizes]


@contextmanager
def third_party_output(log: Path) -> Iterator[TextIO]:
    """Send what other libraries write on stderr (vLLM's and torch's warnings and logs, lm-eval's and tqdm's bars:
    ~155 lines in the demo, which buried its 21 progress lines) to `log`, at the file-descriptor level so that C++
    and child-process output goes there too; yield a stream to the real stderr for quantkit's own lines. The real
    stderr is back when the block ends, also on an error (whose one line the CLI then prints there)."""
    import sys

    log.parent.mkdir(parents=True, exist_ok=True)
    quiet_interpreter_exit(log)
    sys.stderr.flush()
    saved = os.dup(2)
    terminal = os.fdopen(os.dup(saved), "w", buffering=1, encoding="utf-8", errors="replace")
    python_stderr = sys.stderr
    # quantkit's own file: a link planted at its name is replaced, never appended through (as write_file_atomic does)
    if log.is_symlink():
        log.unlink()
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with open(fd, "ab") as sink:
        os.dup2(sink.fileno(), 2)
        # Python-level writers too (warnings, a logging handler made now), wherever sys.stderr pointed
        sys.stderr = open(os.dup(sink.fileno()), "w", buffering=1, encoding="utf-8", errors="replace")  # noqa: SIM115
        try:
            yield terminal
        finally:
            sys.stderr.close()
            sys.stderr = python_stderr
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            terminal.close()


_QUIET_EXIT: list[Path] = []


def quiet_interpreter_exit(log: Path) -> None:
    """From interpreter exit on (after the command's last line and its exit status are decided), send what is still
    written on stderr to `log`. Triton's extension (triton/_C/libtriton.so, imported by vLLM) is built with nanobind,
    whose cleanup handler runs at the very end of Py_Finalize (a Py_AtExit function, after every atexit callback)
    and prints "nanobind: leaked N instances! ... leaked 514 functions!" for the objects vLLM still holds: it read
    like a crash after a run that exited 0 (issue 36). nanobind's switch (set_leak_warnings) is C++ only, so the
    file descriptor is what changes. Registered once per process (the first log wins)."""
    if _QUIET_EXIT:
        return
    _QUIET_EXIT.append(log)
    import atexit

    def redirect() -> None:
        import sys

        try:
            sys.stderr.flush()
            fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.dup2(fd, 2)
            os.close(fd)
        except (OSError, ValueError):
            pass

    atexit.register(redirect)


def print_json(data: Any) -> None:
    from quantkit.io.jsonout import dumps

    click.echo(dumps(data))


def make_console() -> Console:
    from rich.console import Console

    # markup off: recipe reasons and paths are user text, and `[...]` in them must print as written.
    console = Console(markup=False, highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        # Piped output ends up in files and CI logs, not an 80-column terminal: wrap less, fold fewer names.
        console.width = 120
    return console


class JsonObject(click.ParamType):
    """A JSON object on the command line (e.g. chat template keyword arguments); anything else is a usage error."""

    name = "JSON"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> dict[str, Any]:
        if isinstance(value, dict):
            return value
        import json

        try:
            obj = json.loads(str(value))
        except json.JSONDecodeError as e:
            self.fail(
                f"{str(value)[:80]!r} is not JSON ({e.msg}); give an object such as '{{\"enable_thinking\": false}}'",
                param,
                ctx,
            )
        if not isinstance(obj, dict):
            self.fail(f"{str(value)[:80]!r} is a JSON {type(obj).__name__}, not an object", param, ctx)
        return obj


class TokenCounts(click.ParamType):
    """A comma-separated list of token counts, each 1 to 1,000,000 (e.g. 256,1024); bad values are usage errors."""

    name = "N,N,..."

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> list[int]:
        if isinstance(value, list):
            return value
        try:
            counts = [int(x) for x in str(value).split(",") if x.strip()]
        except ValueError:
            self.fail(f"{str(value)[:80]!r} is not a list of integers such as 256,1024", param, ctx)
        if any(not 1 <= n <= 1_000_000 for n in counts):
            self.fail(f"{str(value)[:80]!r}: each length must be 1 to 1000000 tokens", param, ctx)
        return counts


@contextlib.contextmanager
def flags_for_spec_errors() -> Iterator[None]:
    """A SpecError raised under the block names the command's flag (`--num-seeds`) instead of the spec's field
    (`AcceptanceSpec.num_seeds`): the command line speaks in flags, the library in fields."""
    from quantkit.specs import SpecError

    try:
        yield
    except SpecError as e:
        field = (e.input or "").rpartition(".")[2]
        flag = "--" + field.replace("_", "-") if field else None
        raise SpecError(input=flag, reason=e.reason, fix="see --help") from None


def _megabytes(n: float) -> str:
    return f"{n / 1e6:,.2f}"


def render_draft_cost(console: Any, cost: Any) -> None:
    """Bytes a draft step reads by role, and their shares of a draft token, as stored and after the recipe."""
    from rich.table import Table

    table = Table(title=f"Draft step by role ({cost.estimate})", title_justify="left")
    table.add_column("role", no_wrap=True)
    table.add_column("runs", no_wrap=True)
    table.add_column("MB", justify="right")
    table.add_column("share", justify="right")
    after = {r.role: r for r in cost.after}
    if after:
        table.add_column(f"after {cost.after_recipe}: MB", justify="right")
        table.add_column("share", justify="right")
    for r in cost.roles:
        share = "-" if r.share is None else f"{r.share:.2f}"
        row = [r.role, "once per round" if r.role == "fc" else "per draft token", _megabytes(r.bytes), share]
        if after:
            a = after[r.role]
            row += [_megabytes(a.bytes), "-" if a.share is None else f"{a.share:.2f}"]
        table.add_row(*row)
    console.print(table)
    if cost.step_ratio_after is not None:
        console.print(
            f"{cost.after_recipe} would take a draft token's time to {cost.step_ratio_after:.2f} of this "
            f"({cost.estimate}; row-scaled FP8 counted at its measured speed, not the ideal 0.5)"
        )
