"""The `quantkit` command line: thin Click commands that call library functions and render their results."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from quantkit import __version__
from quantkit.errors import QuantkitError

if TYPE_CHECKING:  # rich and pydantic cost ~0.2 s to import; commands import them when they render or validate
    from rich.console import Console

    from quantkit.recipes import Recipe



MAX_MESSAGE = 600


class QuantkitGroup(click.Group):
    """A Click group that prints a QuantkitError as one line `error: <message>` on stderr and exits with 2."""

    group_class = type  # subgroups use this class too

    def main(self, *args: Any, **kwargs: Any) -> Any:
        # SIGTERM (a CI runner's cancel, `kill`) unwinds like Ctrl-C, so temporary folders are cleaned up the same way.
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _raise_terminated)
        return super().main(*args, **kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as e:
            name, code = ("SIGTERM", 143) if isinstance(e, Terminated) else ("SIGINT", 130)
            click.echo(f"error: interrupted by {name}; nothing was left half-written (temporary files removed)",
                       err=True)
            ctx.exit(code)
        except RecursionError:
            click.echo("error: input nested too deeply to read (a hostile or corrupt JSON/YAML file?); check the "
                       "files you passed", err=True)
            ctx.exit(2)
        except QuantkitError as e:
            message = " ".join(str(e).split("\n"))  # messages are one line by contract; keep it so for `2>&1 | tail`
            if len(message) > MAX_MESSAGE:  # a message that echoes hostile input must not flood the terminal
                message = message[:MAX_MESSAGE] + f"... ({len(message) - MAX_MESSAGE} more characters)"
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


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is so that cleanup runs as for Ctrl-C."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated()


def _trust_option() -> Any:
    return click.option("--trust-remote-code", "trust_remote_code", is_flag=True,
                        help="Allow transformers/vLLM to run Python code shipped in a model folder (auto_map). "
                             "Off by default: quantkit never runs a folder's code unless you pass this.")


def _json_option(help_text: str = "Print JSON on stdout instead of a table.") -> Any:
    return click.option("--json", "as_json", is_flag=True, help=help_text)


def _check_writable_file(path: Path, option: str) -> None:
    """Fail before any work when a result file cannot be written where the user asked."""
    from quantkit.errors import QuantkitError

    folder = path.expanduser().resolve().parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if path.is_dir():
        raise QuantkitError(f"{option} {path}: is a folder; give a file path such as {path}/result.json")
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise QuantkitError(f"{option} {path}: {folder} is not a writable folder; pick a path you can write to")


def _print_json(data: Any) -> None:
    from quantkit.jsonout import dumps

    click.echo(dumps(data))


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
@click.option("--overwrite", is_flag=True,
              help="Replace the output folder if a previous `quantkit apply` wrote it (never a source, never a folder "
                   "holding files quantkit did not write).")
@_trust_option()
@_json_option("Print the result (what was quantized, what was kept and why, timings) as JSON.")
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
    from quantkit.hf import remote_code_allowed
    from quantkit.quantize import apply

    with remote_code_allowed(trust_remote_code):
        result = apply(recipe, model, output, device=device, path=run_path, overwrite=overwrite, target=target)
    if as_json:
        _print_json(result.to_dict())
        return
    _render_apply(result)


@main.command("acceptance")
@click.option("--target", required=True, help="The target (verifier) checkpoint: folder or Hub id.")
@click.option("--draft", required=True, help="The BF16 EAGLE-3 draft: the baseline.")
@click.option("--candidate", required=True,
              help="The quantized draft to compare (or a quantized target, run with the BF16 draft).")
@click.option("--prompts", default="builtin", show_default=True,
              help="'builtin' or a JSONL file of {messages|prompt, domain} records.")
@click.option("--num-speculative-tokens", "k", type=click.IntRange(1, 64), default=3, show_default=True)
@click.option("--temperature", type=click.FloatRange(0.0, 100.0), default=0.0, show_default=True,
              help="0 = greedy (exact match); > 0 = speculative sampling (reference backend on CPU).")
@click.option("--max-new-tokens", type=click.IntRange(1, 1_000_000), default=64, show_default=True)
@click.option("--backend", type=click.Choice(["auto", "reference", "vllm"]), default="auto", show_default=True,
              help="vllm when it can run the checkpoints here, else the PyTorch reference engine.")
@click.option("--context-lengths", default="", help="Comma-separated prompt lengths in tokens, e.g. 256,1024: "
              "AL against prompt length (prompts padded with reference notes).")
@click.option("--seed", type=click.IntRange(0, 2**32 - 1), default=0, show_default=True)
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="Device of the reference engine.")
@click.option("--out", "out_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the JSON result to this file.")
@_trust_option()
@_json_option("Print the result as JSON.")
def acceptance_command(target: str, draft: str, candidate: str, prompts: str, k: int, temperature: float,
                       max_new_tokens: int, backend: str, context_lengths: str, seed: int, device: str,
                       out_file: Path | None, trust_remote_code: bool, as_json: bool) -> None:
    """Measure whether a quantized draft still gets its tokens accepted: AL of the candidate vs the BF16 draft.

    \b
    quantkit acceptance --target T --draft DRAFT --candidate DRAFT-FP8
    quantkit acceptance --target T --draft DRAFT --candidate DRAFT-FP8 --backend reference --temperature 0.7

    Mean acceptance length AL = 1 + accepted draft tokens / drafts (as vLLM and Quark define it), per-position
    acceptance rates, tokens per target forward, per-domain AL, and the candidate/BF16 ratio with a bootstrap
    95% interval over prompts. Both drafts run against the same target with the same prompts and settings.
    """
    from quantkit.acceptance.run import AcceptanceError, run_acceptance
    from quantkit.hf import remote_code_allowed
    from quantkit.jsonout import write

    try:
        lengths = [int(x) for x in context_lengths.split(",") if x.strip()]
    except ValueError:
        raise AcceptanceError(f"--context-lengths {context_lengths[:80]!r}: give positive integers, e.g. 256,1024") \
            from None
    if any(n < 1 or n > 1_000_000 for n in lengths):
        raise AcceptanceError(f"--context-lengths {context_lengths[:80]!r}: each length must be 1 to 1000000 tokens")
    if out_file is not None:
        _check_writable_file(out_file, "--out")
    with remote_code_allowed(trust_remote_code):
        result = run_acceptance(target, draft, candidate, prompts=prompts, num_speculative_tokens=k,
                                temperature=temperature, max_new_tokens=max_new_tokens, backend=backend,
                                context_lengths=lengths, seed=seed, device=device)
    data = result.to_dict()
    if out_file is not None:
        out_file.parent.mkdir(parents=True, exist_ok=True)
        write(out_file, data)
    if as_json:
        _print_json(data)
    else:
        _render_acceptance(result)


def _render_acceptance(result: Any) -> None:
    from rich.table import Table

    b, c = result.baseline, result.candidate
    table = Table(title=f"Acceptance length ({result.backend}, K={result.settings['num_speculative_tokens']}, "
                        f"T={result.settings['temperature']})", title_justify="left")
    for col in ("domain", "prompts", "BF16 draft AL", "candidate AL", "ratio"):
        table.add_column(col, justify="left" if col == "domain" else "right")
    for d, v in b.per_domain.items():
        cv = c.per_domain[d]
        table.add_row(d, str(v["prompts"]), f"{v['mean_acceptance_length']:.3f}", f"{cv['mean_acceptance_length']:.3f}",
                      f"{result.per_domain_ratio[d]:.3f}")
    table.add_row("all", str(result.settings["num_prompts"]), f"{b.mean_acceptance_length:.3f}",
                  f"{c.mean_acceptance_length:.3f}", f"{result.ratio:.3f}", style="bold")
    console = _console()
    console.print(table)
    pos = Table(title="Acceptance rate per position", title_justify="left")
    pos.add_column("")
    for i in range(len(b.acceptance_rate_per_pos)):
        pos.add_column(f"pos {i + 1}", justify="right")
    pos.add_column("tokens/target fwd", justify="right")
    pos.add_row("BF16 draft", *(f"{x:.3f}" for x in b.acceptance_rate_per_pos), f"{b.tokens_per_target_forward:.2f}")
    pos.add_row("candidate", *(f"{x:.3f}" for x in c.acceptance_rate_per_pos), f"{c.tokens_per_target_forward:.2f}")
    console.print(pos)
    if result.context_length_ratio:
        ctx = Table(title="AL against prompt length", title_justify="left")
        for col in ("tokens", "BF16 draft AL", "candidate AL", "ratio"):
            ctx.add_column(col, justify="right")
        for n, r in result.context_length_ratio.items():
            ctx.add_row(n, f"{b.by_context_length[n]:.3f}", f"{c.by_context_length[n]:.3f}", f"{r:.3f}")
        console.print(ctx)
    lo, hi = result.ratio_ci
    console.print(f"ratio candidate/BF16 = {result.ratio:.4f} (95% bootstrap CI {lo:.4f}-{hi:.4f}); "
                  f"{b.num_drafts} and {c.num_drafts} drafts")


@main.command("gate")
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("quantkit-gate"),
              show_default=True, help="Folder for report.json, report.md, junit.xml and report-<candidate>.json.")
@click.option("--junit", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Where to write the JUnit XML (default: OUT/junit.xml).")
@_json_option("Print the report JSON on stdout.")
def gate_command(config: Path, out_dir: Path, junit: Path | None, as_json: bool) -> None:
    """Run a pre-deployment gate: check, acceptance and eval on candidates, each figure against its threshold.

    \b
    quantkit gate examples/gate-tiny.yaml --out gate-report --junit junit.xml

    Exit 0 when every threshold holds; 1 when any is missed, any step fails or errors, or a configured step
    produced no result (the gate fails closed); 2 for a bad config. Writes the report as JSON (versioned), Markdown
    and JUnit XML, and appends the Markdown to $GITHUB_STEP_SUMMARY when it is set.
    """
    from quantkit.gate import run_gate, write_reports

    result = run_gate(config)
    write_reports(result, out_dir, junit)
    if as_json:
        _print_json(result.to_dict())
    else:
        _render_gate(result)
    for c in result.failures:
        click.echo(f"gate failed: {c.line()}{': ' + c.message if c.message and c.value is not None else ''}",
                   err=True)
    if not result.passed:
        raise SystemExit(1)


def _render_gate(result: Any) -> None:
    from rich.table import Table

    table = Table(title=f"gate {result.name}: {'PASSED' if result.passed else 'FAILED'}", title_justify="left")
    for col in ("candidate", "step", "figure", "value", "threshold", "result"):
        table.add_column(col, overflow="fold")
    for c in result.checks:
        table.add_row(c.candidate, c.step, c.name, "-" if c.value is None else f"{c.value:.4g}",
                      "-" if c.threshold is None else f"{c.op} {c.threshold:.4g}",
                      "pass" if c.passed else f"FAIL {c.message}".strip())
    console = _console()
    console.print(table)
    console.print(f"reports: {', '.join(result.outputs.values())}")


@main.command()
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("quantkit-demo"),
    show_default=True,
    envvar="QUANTKIT_DEMO_WORKDIR",
    help="Where the demo writes its quantized models, gate report and model card preview.",
)
@_json_option()
def demo(workdir: Path, as_json: bool) -> None:
    """Run the whole pipeline on the bundled tiny models (a few minutes on 2 CPU cores).

    \b
    1. apply fp8-draft to the EAGLE-3 draft and mxfp4-moe to the Qwen3-MoE target
    2. gate: check both (vLLM contract; real vLLM load where it can run), acceptance of the FP8 draft
       against the BF16 draft (vLLM when installed, else the reference engine), eval of MXFP4 vs BF16 MoE
    3. publish --dry-run of the FP8 draft: the model card and the file list, no network
    """
    from quantkit.demo import run_demo

    result = run_demo(workdir)
    if as_json:
        _print_json(result.to_dict())
        return
    _render_demo(result)


def _render_demo(result: Any) -> None:
    from rich.table import Table

    table = Table(title=f"quantkit demo: {result.seconds:.0f}s, gate {'PASSED' if result.gate_passed else 'FAILED'}",
                  title_justify="left")
    table.add_column("step")
    table.add_column("seconds", justify="right")
    table.add_column("result", overflow="fold")
    for s in result.steps:
        info = {k: v for k, v in s.items() if k not in ("step", "seconds")}
        if "quantized" in info:
            text = (f"{info['quantized']} layers quantized, {info['kept']} kept; {info['size_mb'][0]} -> "
                    f"{info['size_mb'][1]} MB; vLLM exclude {info['exclude']}")
        elif "passed" in info:
            text = f"{'passed' if info['passed'] else 'FAILED'}: {info['checks']} checks" + (
                "; " + "; ".join(info["failures"]) if info["failures"] else "")
        else:
            text = f"card + file list in {info.get('dry_run_dir')}"
        table.add_row(s["step"], f"{s['seconds']:.1f}", text)
    console = _console()
    console.print(table)
    report = Path(result.outputs["gate_report"]) / "report.json"
    try:
        data = json.loads(report.read_text())
        acc = data["candidates"]["draft-fp8"].get("acceptance")
        ev = data["candidates"]["moe-mxfp4"].get("eval")
    except (OSError, KeyError, json.JSONDecodeError):
        acc = ev = None
    if acc:
        console.print(f"acceptance ({acc['backend']}): BF16 draft AL {acc['baseline']['mean_acceptance_length']:.3f}, "
                      f"FP8 draft AL {acc['candidate']['mean_acceptance_length']:.3f}, ratio {acc['ratio']:.3f} "
                      f"(95% CI {acc['ratio_ci'][0]:.3f}-{acc['ratio_ci'][1]:.3f})")
    if ev:
        for t in ev["tasks"]:
            console.print(f"eval {t['task']} {t['metric']}: BF16 {t['baseline']:.3f}, MXFP4 {t['candidate']:.3f}, "
                          f"recovery {t['recovery'] if t['recovery'] is None else round(t['recovery'], 3)}")
    for name, path in result.outputs.items():
        console.print(f"{name}: {path}")


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


# --- publish -------------------------------------------------------------------------------------------------------


@main.command("publish")
@click.argument("folder", type=click.Path(path_type=Path))
@click.option("--repo-id", "repo_id", required=True, envvar="QUANTKIT_REPO_ID",
              help="Hub repo ORG/NAME; created if needed.")
@click.option("--private", is_flag=True, help="Create the repo private (an existing repo keeps its visibility).")
@click.option("--revision", default=None, help="Branch to commit to (default main); created from main if missing.")
@click.option("--create-pr", is_flag=True,
              help="Open a pull request with the commit instead of committing to the branch.")
@click.option("--report", "report", type=click.Path(path_type=Path), default=None,
              help="Gate report JSON (quantkit gate): its acceptance and eval tables go into the card and model-index.")
@click.option("--base-model", default=None,
              help="Hub id of the unquantized model for the card's base_model (default: quantkit.json's source, "
                   "when it is a Hub id).")
@click.option("--target", "target", default=None,
              help="For drafts: the target model's Hub id, used in the card's `vllm serve` line.")
@click.option("--dry-run", is_flag=True, help="Write the card and the file list (sizes, sha256); no network.")
@click.option("--dry-run-dir", type=click.Path(path_type=Path), default=None,
              help="Where --dry-run writes README.md and upload-plan.json (default: FOLDER.publish-preview beside it).")
@click.option("--endpoint", envvar="HF_ENDPOINT", default=None, help="Hub URL (default https://huggingface.co).")
@_json_option("Print the result (files, commit URL, or the dry-run plan) as JSON.")
def publish_command(folder: Path, repo_id: str, private: bool, revision: str | None, create_pr: bool,
                    report: Path | None, base_model: str | None, target: str | None, dry_run: bool,
                    dry_run_dir: Path | None, endpoint: str | None, as_json: bool) -> None:
    """Upload a `quantkit apply` output FOLDER and a generated model card to a Hub repo, in one commit.

    \b
    quantkit publish DRAFT-FP8 --repo-id ORG/NAME --report gate-report.json --target ORG/TARGET
    quantkit publish DRAFT-FP8 --repo-id ORG/NAME --dry-run

    The token comes from HF_TOKEN or `hf auth login` and is never printed or written. The card (README.md) says
    what was quantized and kept and why, the exact command and versions, how to serve the model with vLLM on ROCm,
    and the acceptance and eval tables from --report. Publishing identical content again makes no new commit.
    """
    from quantkit.hub import publish

    result = publish(folder, repo_id, private=private, revision=revision, create_pr=create_pr, report=report,
                     dry_run=dry_run, endpoint=endpoint, base_model=base_model, target=target, dry_run_dir=dry_run_dir)
    if as_json:
        _print_json(result.to_dict())
        return
    where = f"{result.repo_id}@{result.revision}"
    size = f"{len(result.files)} files, {result.total_bytes / 1e6:.2f} MB"
    if result.dry_run:
        from rich.table import Table

        click.echo(f"would upload to {where} ({size}):")
        table = Table()
        table.add_column("file", overflow="fold")
        table.add_column("bytes", justify="right", no_wrap=True)
        table.add_column("sha256", no_wrap=True)
        for f in result.files:
            table.add_row(f.path, str(f.size), f.sha256[:16])
        _console().print(table)
        click.echo(f"dry run, nothing uploaded: card {result.card_path}, file list {result.plan_path}")
    elif result.pr_url:
        click.echo(f"opened pull request on {where} ({size}): {result.pr_url} (commit {result.commit_url})")
    elif result.unchanged:
        click.echo(f"unchanged: {where} already holds these {len(result.files)} files: {result.commit_url}")
    else:
        deleted = f"; deleted stale {', '.join(result.deleted)}" if result.deleted else ""
        click.echo(f"published {size} to {where}{deleted}: {result.commit_url}")


# --- inspect and check --------------------------------------------------------------------------------------------


@main.command("inspect")
@click.argument("folder", type=click.Path(path_type=Path))
@click.option("--target", "target", default=None, type=click.Path(path_type=Path),
              help="For an EAGLE-3 draft: the target checkpoint folder (only its config.json is read). Its layer "
                   "count gives the draft's vLLM layer names; without it they show as model.layers.{N}.*.")
@click.option("--layers", "show_layers", is_flag=True, help="One row per layer instead of groups of layers.")
@_json_option("Print every layer and group with precision, reason and bytes as JSON.")
def inspect_command(folder: Path, target: Path | None, show_layers: bool, as_json: bool) -> None:
    """Show the precision vLLM will give every layer of a checkpoint, and why.

    \b
    quantkit inspect MODEL-MXFP4
    quantkit inspect DRAFT-FP8 --target TARGET

    Layers are named as vLLM names them at run time (`model.fc`, `model.layers.4.self_attn.qkv_proj`); the reason
    is the exclude entry, layer_quant_config key or global_quant_config that decided, replaying vLLM's Quark loader.
    Layers that differ only in their decoder-layer number are grouped (`model.layers.{0-59}.mlp.experts` x60).
    Reads config.json and safetensors headers only.
    """
    from quantkit.inspect import inspect_checkpoint, target_layer_count

    n = target_layer_count(target) if target is not None else None
    result = inspect_checkpoint(folder, n)
    if as_json:
        _print_json(result.to_dict())
        return
    _render_inspect(result, show_layers)


@main.command("check")
@click.argument("folder", type=click.Path(path_type=Path))
@click.option("--target", "target", default=None, type=click.Path(path_type=Path),
              help="For an EAGLE-3 draft: its target checkpoint (layer names, aux layer ids, hidden sizes, real load).")
@click.option("--tp", "tp", type=click.IntRange(min=1), default=1, show_default=True, envvar="QUANTKIT_TP",
              help="Tensor-parallel size to check per-shard divisibility for.")
@click.option("--platform", "platform", type=click.Choice(["gfx950", "gfx942", "cuda", "cpu"]), default="gfx950",
              show_default=True, envvar="QUANTKIT_PLATFORM", help="Where the checkpoint will be served.")
@click.option("--vllm", "vllm_mode", type=click.Choice(["auto", "off", "required"]), default="auto",
              show_default=True, envvar="QUANTKIT_CHECK_VLLM",
              help="Load it in vLLM (in a subprocess) and generate: auto = when vLLM is installed; required = a "
                   "skipped or failed load is an error.")
@click.option("--load-timeout", "load_timeout", type=click.FloatRange(0, 86400, min_open=True), default=900,
              show_default=True,
              help="Seconds the vLLM load and generation may take.")
@click.option("--numeric", is_flag=True, help="Also compare dequantized weights with --source (reads all weights).")
@click.option("--source", "source", default=None, type=click.Path(path_type=Path),
              help="The unquantized checkpoint this one was made from (for --numeric).")
@_trust_option()
@_json_option("Print the findings, per-layer precisions and the vLLM load as JSON.")
def check_command(folder: Path, target: Path | None, tp: int, platform: str, vllm_mode: str, load_timeout: float,
                  numeric: bool, source: Path | None, trust_remote_code: bool, as_json: bool) -> None:
    """Check that vLLM will load a Quark checkpoint as intended, before any GPU time is spent.

    \b
    quantkit check DRAFT-FP8 --target TARGET
    quantkit check MODEL-MXFP4 --tp 8 --platform gfx950 --vllm off

    Replays vLLM's Quark loader: required quantization_config keys, exclude entries (vLLM matches runtime names
    or `re:` only), fused and MoE layers, weight and scale tensors (dtype, shape, finite and positive values), TP
    divisibility, EAGLE-3 draft specifics, platform notes; then loads the checkpoint in vLLM when it can.

    Exit status: 0 no errors, 1 errors found, 2 bad input (not a checkpoint, unreadable file).
    """
    import sys

    from quantkit.check import check_checkpoint
    from quantkit.hf import remote_code_allowed

    progress = (lambda m: click.echo(f"[quantkit check] {m}", err=True)) if not as_json else None
    with remote_code_allowed(trust_remote_code):
        result = check_checkpoint(folder, target=target, tp=tp, platform=platform, vllm=vllm_mode, numeric=numeric,
                                  source=source, load_timeout_s=load_timeout, progress=progress)
    if as_json:
        _print_json(result.to_dict())
    else:
        _render_check(result)
    sys.stdout.flush()
    if not result.ok:
        raise click.exceptions.Exit(1)


def _mb(n: int) -> str:
    return f"{n / 1e6:,.2f}"


def _render_inspect(result: Any, show_layers: bool) -> None:
    from rich.table import Table

    console = _console()
    n = result.target_num_layers
    title = f"{result.path}: {result.architecture} ({result.model_kind})" + (f", target layers {n}" if n else "")
    table = Table(title=title, title_justify="left")
    table.add_column("vLLM layer", overflow="fold")
    table.add_column("x", justify="right", no_wrap=True)
    table.add_column("precision", no_wrap=True)
    table.add_column("why", overflow="fold")
    table.add_column("MB", justify="right", no_wrap=True)
    if show_layers:
        rows = [(lp.name, 1, lp.precision, lp.reason, lp.bytes, lp.experts) for lp in result.layers]
    else:
        rows = [(g.pattern, g.count, g.precision, g.reason, g.bytes, g.experts) for g in result.groups]
    for name, count, precision, reason, size, experts in rows:
        label = f"{name} ({experts} experts)" if experts else name
        table.add_row(label, str(count), precision, reason, _mb(size))
    console.print(table)
    sizes = Table(title="Bytes by precision", title_justify="left")
    sizes.add_column("precision")
    sizes.add_column("MB", justify="right")
    sizes.add_column("share", justify="right")
    total = max(result.total_bytes, 1)
    for precision, size in sorted(result.bytes_by_precision.items(), key=lambda kv: -kv[1]):
        sizes.add_row(precision, _mb(size), f"{size / total:.1%}")
    sizes.add_row("(not in a layer: norms, maps, ...)", _mb(result.other_bytes), f"{result.other_bytes / total:.1%}")
    sizes.add_row("total", _mb(result.total_bytes), "100%")
    console.print(sizes)
    for problem in result.config_problems:
        console.print(f"note: {problem}")
    console.print(f"{result.num_tensors} tensors, {len(result.layers)} layers, {result.seconds:.2f}s")


def _render_check(result: Any) -> None:
    from rich.table import Table

    console = _console()
    if result.findings:
        table = Table(title=f"check {result.path} ({result.architecture}, {result.model_kind}, tp {result.tp}, "
                            f"{result.platform})", title_justify="left")
        table.add_column("severity", no_wrap=True)
        table.add_column("code", no_wrap=True)
        table.add_column("layer / tensor", overflow="fold")
        table.add_column("what", overflow="fold")
        table.add_column("fix", overflow="fold")
        for f in result.findings:
            table.add_row(f.severity, f.code, f.layer_or_tensor, f.message, f.fix)
        console.print(table)
    load = result.vllm_load
    status = load.get("status")
    line = f"vLLM load: {status}"
    if status == "loaded":
        bad = sum(not v["as_predicted"] for v in load["layers"].values())
        line += (f" in {load.get('engine')} ({load.get('mode')}, {load.get('seconds')}s); "
                 f"{len(load['layers'])} layers compared, {bad} mismatched; generated {load.get('generated_text')!r}")
    elif load.get("reason") or load.get("error"):
        line += f": {load.get('reason') or load.get('error')}"
    console.print(line)
    if result.numeric is not None:
        worst = max((v["relative_error"] for v in result.numeric["layers"].values()), default=0.0)
        console.print(f"numeric: {len(result.numeric['layers'])} layers vs {result.numeric['source']}, worst "
                      f"relative error {worst:.4g}")
    counts = {s: sum(f.severity == s for f in result.findings) for s in ("error", "warning", "info")}
    verdict = "OK" if result.ok else "FAILED"
    console.print(f"{verdict}: {counts['error']} error(s), {counts['warning']} warning(s), {counts['info']} info; "
                  f"{result.seconds:.1f}s")


# --- eval ---------------------------------------------------------------------------------------------------------


@main.command("eval")
@click.option("--model", "model", required=True, help="The quantized checkpoint: folder or Hub id.")
@click.option("--baseline", "baseline", required=True, help="The unquantized checkpoint it was made from.")
@click.option("--tasks", "tasks", required=True, envvar="QUANTKIT_EVAL_TASKS",
              help="Comma-separated lm-eval task names: quantkit's local tasks (tiny_french_mc, tiny_french_gen, "
                   "tiny_json_gen, for the bundled tiny models) or any lm-eval task whose data is available.")
@click.option("--backend", type=click.Choice(["hf", "vllm"]), default="hf", show_default=True,
              help="hf: lm-eval's HF backend (Quark checkpoints through Quark's loader); vllm: lm-eval's vLLM backend.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Only the first N items of each task.")
@click.option("--num-fewshot", "num_fewshot", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="Device of the hf backend (cuda also means ROCm GPUs).")
@click.option("--batch-size", "batch_size", type=click.IntRange(min=1), default=16, show_default=True)
@click.option("--out", "out_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the JSON result to this file.")
@_trust_option()
@_json_option("Print the result (per task and metric: scores, stderrs, delta, recovery, intervals) as JSON.")
def eval_command(model: str, baseline: str, tasks: str, backend: str, limit: int | None, num_fewshot: int,
                 device: str, batch_size: int, out_file: Path | None, trust_remote_code: bool, as_json: bool) -> None:
    """Compare a quantized model's lm-eval scores with its baseline's: same tasks, same settings.

    \b
    quantkit eval --model MOE-MXFP4 --baseline MOE --tasks tiny_french_mc,tiny_french_gen
    quantkit eval --model TARGET-FP8 --baseline TARGET --tasks gsm8k --backend vllm --limit 200 --json

    Per task and metric: both scores with lm-eval's stderr, delta = quantized - baseline, recovery =
    quantized / baseline, and the 95% lower bound of the recovery (delta's stderr paired over items where
    lm-eval gives per-item scores). Quark checkpoints run through Quark's own loader in the hf backend.
    """
    from quantkit.evaluate import run_eval, write_result
    from quantkit.hf import remote_code_allowed

    if out_file is not None:
        _check_writable_file(out_file, "--out")
    with remote_code_allowed(trust_remote_code):
        result = run_eval(model, baseline, tasks, backend=backend, limit=limit, num_fewshot=num_fewshot,
                          device=device, batch_size=batch_size)
    if out_file is not None:
        write_result(result, out_file)
    if as_json:
        _print_json(result.to_dict())
    else:
        _render_eval(result)


def _render_eval(result: Any) -> None:
    from rich.table import Table

    def pm(score: float, se: float | None) -> str:
        return f"{score:.4f}" + (f" ± {se:.4f}" if se is not None else "")

    def opt(x: float | None, fmt: str = "{:.4f}") -> str:
        return "-" if x is None else fmt.format(x)

    s = result.settings
    title = (f"lm-eval: {result.model} vs {result.baseline_model} ({result.backend}, {result.num_fewshot}-shot"
             + (f", limit {result.limit}" if result.limit else "") + ")")
    table = Table(title=title, title_justify="left")
    # Names fold, figures never do: 2 tasks with lm-eval's longest metric keys fit the 120 columns of piped output.
    for col in ("task", "metric"):
        table.add_column(col, overflow="fold")
    for col in ("n", "baseline ± se", "quantized ± se", "delta", "recovery", "95% low"):
        table.add_column(col, justify="right", no_wrap=True)
    for t in result.tasks:
        table.add_row(t.task, t.metric, opt(t.num_items, "{}"), pm(t.baseline, t.baseline_stderr),
                      pm(t.candidate, t.candidate_stderr), f"{t.delta:+.4f}", opt(t.recovery),
                      opt(t.recovery_lower_bound))
    console = _console()
    console.print(table)
    versions = ", ".join(f"{k} {v}" for k, v in s["versions"].items())
    console.print(f"{result.timings_s.get('total', 0):.1f}s; {versions}")
