"""`quantkit eval`: lm-eval quality of a quantized model against its baseline."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from quantkit.cli.app import main
from quantkit.cli.options import (
    check_writable_file,
    json_option,
    make_console,
    print_json,
    trust_option,
)
from quantkit.cli.params import Count
from quantkit.progress import stderr_progress

if TYPE_CHECKING:  # result types only; the modules are imported when the command runs
    from quantkit.results import EvalResult


# --- eval ---------------------------------------------------------------------------------------------------------


@main.command("eval")
@click.option("--model", "model", required=True, help="The quantized checkpoint: folder or Hub id.")
@click.option("--baseline", "baseline", required=True, help="The unquantized checkpoint it was made from.")
@click.option(
    "--tasks",
    "tasks",
    required=True,
    envvar="QUANTKIT_EVAL_TASKS",
    help="Comma-separated lm-eval task names: quantkit's local tasks (tiny_french_mc, tiny_french_gen, "
    "tiny_json_gen, for the bundled tiny models) or any lm-eval task whose data is available.",
)
@click.option(
    "--backend",
    type=click.Choice(["hf", "vllm"]),
    default="hf",
    show_default=True,
    help="hf: lm-eval's HF backend (Quark checkpoints through Quark's loader); vllm: lm-eval's vLLM backend.",
)
@click.option("--limit", type=Count(1, 100_000_000), default=None, help="Only the first N items of each task.")
@click.option("--num-fewshot", "num_fewshot", type=Count(0, 1000), default=0, show_default=True)
@click.option(
    "--device",
    type=click.Choice(["cpu", "cuda"]),
    default="cpu",
    show_default=True,
    help="Device of the hf backend (cuda also means ROCm GPUs).",
)
@click.option("--batch-size", "batch_size", type=Count(1, 100_000), default=16, show_default=True)
@click.option(
    "--out",
    "out_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the JSON result to this file.",
)
@trust_option()
@json_option("Print the result (per task and metric: scores, stderrs, delta, recovery, intervals) as JSON.")
def eval_command(
    model: str,
    baseline: str,
    tasks: str,
    backend: str,
    limit: int | None,
    num_fewshot: int,
    device: str,
    batch_size: int,
    out_file: Path | None,
    trust_remote_code: bool,
    as_json: bool,
) -> None:
    """Compare a quantized model's lm-eval scores with its baseline's: same tasks, same settings.

    \b
    quantkit eval --model MOE-MXFP4 --baseline MOE --tasks tiny_french_mc,tiny_french_gen
    quantkit eval --model TARGET-FP8 --baseline TARGET --tasks gsm8k --backend vllm --limit 200 --json

    Per task and metric: both scores with lm-eval's stderr, delta = quantized - baseline, recovery =
    quantized / baseline, and the 95% lower bound of the recovery (delta's stderr paired over items where
    lm-eval gives per-item scores). Quark checkpoints run through Quark's own loader in the hf backend.
    """
    from quantkit.evaluate.run import run_eval, write_result
    from quantkit.io.files import check_model_folders
    from quantkit.io.hf import remote_code_allowed

    check_model_folders([model, baseline], out_file)
    if out_file is not None:
        check_writable_file(out_file, "--out")
    with remote_code_allowed(trust_remote_code):
        result = run_eval(
            model,
            baseline,
            tasks,
            backend=backend,
            limit=limit,
            num_fewshot=num_fewshot,
            device=device,
            batch_size=batch_size,
            progress=stderr_progress("eval"),
        )
    if out_file is not None:
        write_result(result, out_file)
    if as_json:
        print_json(result.to_dict())
    else:
        _render_eval(result)


def _render_eval(result: EvalResult) -> None:
    from rich.table import Table

    def pm(score: float, se: float | None) -> str:
        return f"{score:.4f}" + (f" ± {se:.4f}" if se is not None else "")

    def opt(x: float | None, fmt: str = "{:.4f}") -> str:
        return "-" if x is None else fmt.format(x)

    s = result.settings
    title = (
        f"lm-eval: {result.model} vs {result.baseline_model} ({result.backend}, {result.num_fewshot}-shot"
        + (f", limit {result.limit}" if result.limit else "")
        + ")"
    )
    table = Table(title=title, title_justify="left")
    # Names fold, figures never do: 2 tasks with lm-eval's longest metric keys fit the 120 columns of piped output.
    for col in ("task", "metric"):
        table.add_column(col, overflow="fold")
    for col in ("n", "baseline ± se", "quantized ± se", "delta", "recovery", "95% low"):
        table.add_column(col, justify="right", no_wrap=True)
    for t in result.tasks:
        assert t.baseline is not None and t.candidate is not None  # compare() scores both models on every row
        table.add_row(
            t.task,
            t.metric,
            opt(t.num_items, "{}"),
            pm(t.baseline, t.baseline_stderr),
            pm(t.candidate, t.candidate_stderr),
            f"{t.delta:+.4f}",
            opt(t.recovery),
            opt(t.recovery_lower_bound),
        )
    console = make_console()
    console.print(table)
    versions = ", ".join(f"{k} {v}" for k, v in s["versions"].items())
    console.print(f"{result.timings_s.get('total', 0):.1f}s; {versions}")
