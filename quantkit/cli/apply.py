"""`quantkit apply`: quantize a checkpoint with a recipe."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from quantkit.cli.app import main
from quantkit.cli.options import human_bytes, json_option, make_console, print_command, print_json, trust_option
from quantkit.cli.params import Size
from quantkit.progress import stderr_progress
from quantkit.vocab import EAGLE3_DRAFT

if TYPE_CHECKING:  # result types only; the modules are imported when the command runs
    from quantkit.results import ApplyResult


@main.command("apply")
@click.option(
    "--recipe",
    "recipe",
    default=None,
    envvar="QUANTKIT_RECIPE",
    help="A built-in recipe name (quantkit recipes list) or a path to your own recipe YAML. Required "
    "unless --draft-vocab prunes a draft on its own.",
)
@click.option("--model", "model", required=True, help="Source checkpoint: a local HF folder or a Hub repo id.")
@click.option(
    "--output",
    "output",
    required=True,
    type=click.Path(path_type=Path),
    help="Output folder; written to a temporary folder beside it and renamed when complete.",
)
@click.option(
    "--target",
    "target",
    default=None,
    help="For EAGLE-3 drafts: the target checkpoint (folder or Hub id). Its layer count gives the draft's "
    "exact vLLM layer names; without it, kept decoder-layer modules are excluded by `re:` pattern.",
)
@click.option(
    "--devices",
    "devices",
    default="auto",
    show_default=True,
    envvar="QUANTKIT_DEVICES",
    help="Where to quantize: auto (every visible GPU, else the CPU), cpu, cuda (every GPU), or a list "
    "such as cuda:0,cuda:1 (shards are spread over them). cuda also means ROCm GPUs.",
)
@click.option(
    "--device",
    "device",
    type=click.Choice(["auto", "cpu", "cuda"]),
    default=None,
    hidden=True,
    help="Older spelling of --devices with one device.",
)
@click.option(
    "--path",
    "run_path",
    type=click.Choice(["auto", "in-memory", "per-shard"]),
    default=None,
    help="auto (the default): per shard unless the recipe calibrates static activation scales, which "
    "needs the model in memory. Per shard handles checkpoints larger than memory.",
)
@click.option(
    "--engine",
    type=click.Choice(["auto", "native", "quark"]),
    default="auto",
    show_default=True,
    help="native: quantkit's shard executor (mxfp4, ptpc_fp8; byte-identical to Quark 0.13, no Quark "
    "import); quark: Quark itself; auto: native when it can.",
)
@click.option(
    "--resume",
    is_flag=True,
    help="Continue an interrupted run from its temporary folder: finished shards are checked by hash and "
    "kept, the rest redone.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print the plan (layers quantized and kept with reasons, the vLLM exclude list, predicted output "
    "size, devices) without reading tensor data or writing anything.",
)
@click.option(
    "--overwrite",
    is_flag=True,
    help="Replace the output folder if a previous `quantkit apply` wrote it (never a source, never a folder "
    "holding files quantkit did not write); also discards an interrupted run's temporary folder.",
)
@click.option(
    "--max-memory",
    "max_memory",
    type=Size(),
    default=None,
    envvar="QUANTKIT_MAX_MEMORY",
    help="Host memory the native executor may hold, e.g. 8GiB or 500MiB (default: from the machine's "
    "memory and the device count). Memory does not grow with shard size; a budget below one "
    "tensor's work is refused before anything is read.",
)
@click.option(
    "--max-shard-size",
    "max_shard_size",
    type=Size(shard=True),
    default=None,
    help="Rewrite the output into shards of at most this size (5GB, 500MB, 2GiB: read as transformers reads "
    "max_shard_size), named model-00001-of-0000N.safetensors; a tensor larger than that gets a shard of "
    "its own. Default: the source's shards and names. Native engine only.",
)
@click.option(
    "--draft-vocab",
    "draft_vocab",
    type=click.IntRange(1, 10_000_000),
    default=None,
    help="EAGLE-3 drafts: prune the lm_head to the N target tokens --vocab-corpus uses most (special and "
    "EOS tokens always kept), writing d2t, t2d and draft_vocab_size as vLLM reads them; then the "
    "recipe runs on the pruned draft. Needs --target (its tokenizer).",
)
@click.option(
    "--vocab-corpus",
    "vocab_corpus",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The prompts (JSONL, as acceptance --prompts reads them) whose token counts choose the rows.",
)
@trust_option()
@json_option("Print the result (what was quantized, what was kept and why, timings) as JSON.")
def apply_command(
    recipe: str,
    model: str,
    output: Path,
    target: str | None,
    devices: str,
    device: str | None,
    run_path: str | None,
    engine: str,
    resume: bool,
    dry_run: bool,
    overwrite: bool,
    max_memory: int | None,
    max_shard_size: int | None,
    draft_vocab: int | None,
    vocab_corpus: Path | None,
    trust_remote_code: bool,
    as_json: bool,
) -> None:
    """Quantize a checkpoint with a recipe, so that vLLM loads it exactly as the recipe intends.

    \b
    quantkit apply --recipe fp8-draft --model DRAFT --output DRAFT-FP8 --target TARGET
    quantkit apply --recipe mxfp4-moe --model MOE --output MOE-MXFP4 --devices cuda:0,cuda:1
    quantkit apply --recipe mxfp4-moe --model MOE --output MOE-MXFP4 --dry-run
    quantkit apply --recipe mxfp4-moe --model MOE --output MOE-MXFP4 --resume     # after Ctrl-C or a crash

    The output holds the quantized safetensors, config.json with a quantization_config whose `exclude` uses
    vLLM's runtime module names (e.g. `model.fc`, not Quark's `fc`), the tokenizer files, and quantkit.json
    (recipe, source hashes, versions, per-layer decisions with reasons, sizes, timings). Kept tensors are checked
    to be byte-identical to the source before the folder is put in place.
    """
    from quantkit.apply.run import apply
    from quantkit.io.files import check_model_folders
    from quantkit.io.hf import remote_code_allowed

    # the options' combinations are usage errors, as Click reports a missing required option
    if draft_vocab is None and vocab_corpus is not None:
        raise click.UsageError("--vocab-corpus is given without --draft-vocab: add --draft-vocab N (the rows to keep)")
    if draft_vocab is not None and (vocab_corpus is None or target is None):
        raise click.UsageError(
            "--draft-vocab needs --vocab-corpus FILE and --target (whose tokenizer counts the corpus)"
        )
    if recipe is None and draft_vocab is None:
        raise click.UsageError(
            "Missing option '--recipe': give a built-in recipe name (quantkit recipes list) or a "
            "recipe YAML file, or --draft-vocab N to prune a draft's vocabulary alone"
        )
    kwargs: dict[str, Any] = dict(
        devices=device or devices,
        path=run_path,
        engine=engine,
        resume=resume,
        dry_run=dry_run,
        max_memory=max_memory,
        max_shard_size=max_shard_size,
    )
    check_model_folders([model, target], output, "--output", contains=True)
    with remote_code_allowed(trust_remote_code):
        if draft_vocab is not None:
            from quantkit.apply.vocab import apply_with_draft_vocab

            assert vocab_corpus is not None and target is not None
            result = apply_with_draft_vocab(
                recipe,
                model,
                output,
                n=draft_vocab,
                corpus=vocab_corpus,
                target=target,
                overwrite=overwrite,
                progress=stderr_progress("apply"),
                **(kwargs if recipe is not None else {}),
            )
        else:
            assert recipe is not None
            result = apply(
                recipe, model, output, overwrite=overwrite, target=target, progress=stderr_progress("apply"), **kwargs
            )
    if as_json:
        print_json(result.to_dict())
        return
    if not hasattr(result, "layers"):  # the vocabulary pruned alone: its report
        click.echo(
            f"{model} -> {output}: lm_head {result.rows_before} -> {result.rows_after} rows, covering "
            f"{result.coverage:.1%} of {result.corpus_tokens} corpus tokens; d2t, t2d and draft_vocab_size "
            "written (draft_vocab.json)"
        )
        return
    _render_apply(result)


def _layer_rows(result: ApplyResult) -> list[tuple[str, str, str, str]]:
    """One row per layer, or per group of layers that differ only in their layer number (large models)."""
    import re

    rows: list[tuple[str, str, str, str]] = [
        (d.runtime_name, str(d.action), d.scheme or "bf16", d.reason) for d in result.layers
    ]
    if len(rows) <= 40:
        return rows
    groups: dict[tuple[str, str, str, str], list[str]] = {}
    for name, action, scheme, reason in rows:
        m = re.search(r"layers\.(\d+)\.", name)
        key = (re.sub(r"layers\.\d+\.", "layers.{i}.", name), action, scheme, reason)
        groups.setdefault(key, []).append(m.group(1) if m else "")
    out: list[tuple[str, str, str, str]] = []
    for (pattern, action, scheme, reason), nums in groups.items():
        shown = pattern if len(nums) == 1 else f"{pattern} x{len(nums)}"
        out.append((shown, action, scheme, reason))
    return out


def _render_apply(result: ApplyResult) -> None:
    from rich.table import Table

    verb = "would write" if result.dry_run else "->"
    table = Table(title=f"{result.architecture} ({result.model_kind}) {verb} {result.output}", title_justify="left")
    table.add_column("vLLM layer", overflow="fold")
    table.add_column("action", no_wrap=True)
    table.add_column("scheme", no_wrap=True)
    table.add_column("why")
    for row in _layer_rows(result):
        table.add_row(*row)
    console = make_console()
    console.print(table)
    ratio = result.size_after_bytes / max(result.size_before_bytes, 1)
    console.print(f"exclude (vLLM names): {result.exclude}")
    if result.dry_run:
        before, after = human_bytes(result.size_before_bytes, result.size_after_bytes)
        console.print(
            f"plan: {len(result.quantized)} layers quantized, {len(result.kept)} kept; predicted size "
            f"{before} -> {after} ({ratio:.2f}x); engine {result.engine}, {result.path} "
            f"({result.path_reason})"
        )
        for dev, shards in result.device_plan.items():
            console.print(
                f"  {dev}: {len(shards)} shard(s)"
                + (f" ({', '.join(shards[:3])}{', ...' if len(shards) > 3 else ''})" if shards else "")
            )
        console.print(f"planned in {result.timings_s['total']:.2f}s; nothing was read beyond headers, nothing written")
        return
    # the one rate of the run: the executor's (quantized bytes / its wall time); progress lines print none of their own
    speed = f" (quantized at {result.throughput_mb_s:.0f} MB/s)" if result.throughput_mb_s else ""
    resumed = f"; {result.resumed_shards} shard(s) kept from the interrupted run" if result.resumed_shards else ""
    before, after = human_bytes(result.size_before_bytes, result.size_after_bytes)
    console.print(
        f"size {before} -> {after} ({ratio:.2f}x); engine {result.engine}, {result.path} on "
        f"{','.join(result.devices) or result.device}; {result.timings_s['total']:.1f}s in all{speed}"
        f"{resumed}; peak RSS {result.peak_rss_mb:.0f} MB"
    )
    # the next step, as a command that pastes (on stderr: stdout stays the result)
    click.echo("next: check it as vLLM will load it:", err=True)
    next_step = ["quantkit", "check", result.output]
    if result.model_kind == EAGLE3_DRAFT and result.target:
        next_step += ["--target", result.target]
    print_command(next_step, err=True)
