"""`quantkit tune`: sweep a draft's options (body precision, draft vocabulary, K) and recommend one."""

from __future__ import annotations

from pathlib import Path

import click

from quantkit.cli.app import main
from quantkit.cli.options import json_option, make_console, print_json, third_party_output
from quantkit.progress import stderr_progress


def _ints(value: str | None, what: str) -> list[int] | None:
    if value is None:
        return None
    try:
        out = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r}: give comma-separated whole numbers", param_hint=what) from None
    if not out or any(v < 1 or v > 10_000_000 for v in out):
        raise click.BadParameter(f"{value!r}: each must be between 1 and 10,000,000", param_hint=what)
    return out


@main.command("tune")
@click.option("--target", required=True, help="The target (verifier): folder or Hub id.")
@click.option("--draft", required=True, help="The BF16 EAGLE-3 draft: the baseline every option is measured against.")
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("quantkit-tune"),
    show_default=True,
    help="Where the draft variants, tune.json and tune.png are written.",
)
@click.option(
    "--vocab",
    "vocabs",
    default=None,
    help="Draft vocabulary sizes (lm_head rows), e.g. 1024,512,256; default: the draft's, a half and a quarter.",
)
@click.option(
    "--vocab-corpus",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Prompts (JSONL) whose token counts choose the kept rows (apply --draft-vocab).",
)
@click.option("--k", "ks", default="2,3,4", show_default=True, help="Numbers of speculative tokens to try.")
@click.option("--body", "bodies", type=click.Choice(["bf16", "fp8", "both"]), default="both", show_default=True)
@click.option("--prompts", default="builtin", show_default=True, help="The acceptance prompts.")
@click.option("--max-new-tokens", type=click.IntRange(1, 4096), default=32, show_default=True)
@click.option("--backend", type=click.Choice(["reference", "vllm"]), default="reference", show_default=True)
@click.option(
    "--platform",
    type=click.Choice(["MI300X", "MI325X", "MI355X", "H100", "H200", "B200"]),
    default="MI355X",
    show_default=True,
    help="Whose HBM bandwidth the cost estimate uses.",
)
@click.option("--tp", type=click.IntRange(1, 1024), default=1, show_default=True)
@click.option(
    "--floor",
    type=click.FloatRange(0.5, 1.5),
    default=0.98,
    show_default=True,
    help="The AL ratio (vs the unpruned BF16 draft) the recommendation must keep.",
)
@click.option(
    "--apply",
    "apply_to",
    type=click.Path(path_type=Path),
    default=None,
    help="Write the recommended draft here (with tune.json holding its K).",
)
@json_option()
def tune_command(
    target: str,
    draft: str,
    workdir: Path,
    vocabs: str | None,
    vocab_corpus: Path | None,
    ks: str,
    bodies: str,
    prompts: str,
    max_new_tokens: int,
    backend: str,
    platform: str,
    tp: int,
    floor: float,
    apply_to: Path | None,
    as_json: bool,
) -> None:
    """Sweep a draft's options and recommend the cheapest that keeps its acceptance.

    \b
    quantkit tune --target TARGET --draft DRAFT --vocab-corpus corpus.jsonl --platform MI355X
    quantkit tune --target T --draft D --vocab 1024,512 --k 3 --body fp8 --apply DRAFT-TUNED

    Each option (body BF16 or FP8, lm_head rows, K) is measured for acceptance against the unpruned BF16 draft and
    costed per accepted token from the bytes its steps read on --platform (an estimate, not a measurement); the
    recommendation is the cheapest option whose AL ratio keeps --floor. Confirm it with `quantkit bench` on the
    deployment GPU.
    """
    from quantkit.tune.run import tune

    log = workdir / "third-party.log"
    click.echo(f"[quantkit tune] vLLM, torch and transformers output goes to {log}", err=True)
    with third_party_output(log) as terminal:
        result = tune(
            target,
            draft,
            workdir,
            vocab_corpus=vocab_corpus,
            vocabs=_ints(vocabs, "--vocab"),
            ks=_ints(ks, "--k") or [3],
            bodies=["bf16", "fp8"] if bodies == "both" else [bodies],
            prompts=prompts,
            max_new_tokens=max_new_tokens,
            backend=backend,
            platform=platform,
            tp=tp,
            floor=floor,
            apply_to=apply_to,
            progress=stderr_progress("tune", stream=terminal),
        )
    (workdir / "tune.json").write_text(result.model_dump_json(indent=2) + "\n")
    if as_json:
        print_json(result.to_dict())
        return
    from rich.table import Table

    table = Table(title=f"Draft options on {platform} (cost: {result.estimate})", title_justify="left")
    for col in ("body", "rows", "K", "AL", "AL ratio", "us / round", "cost / token", "pareto"):
        table.add_column(col, justify="right" if col not in ("body",) else "left", no_wrap=True)
    for o in result.options:
        table.add_row(
            o.body,
            str(o.draft_vocab),
            str(o.k),
            f"{o.al:.3f}" if o.al else "-",
            f"{o.al_ratio:.3f}" if o.al_ratio else (o.error or "-")[:40],
            f"{o.round_us:.1f}" if o.round_us else "-",
            f"{o.cost_ratio:.2f}" if o.cost_ratio else "-",
            "yes" if o.pareto else "",
        )
    console = make_console()
    console.print(table)
    r = result.recommended
    if r is None:
        click.echo(f"no option keeps the AL-ratio floor {floor}; keep the unpruned BF16 draft")
    else:
        click.echo(
            f"recommended: {r.body} body, {r.draft_vocab} rows, K={r.k}: AL ratio {r.al_ratio:.3f} "
            f"(floor {floor}), estimated cost per accepted token {r.cost_ratio:.2f}x the BF16 draft's"
            + (f"; written to {result.applied}" if result.applied else "")
        )
    click.echo(f"chart: {result.chart}; table: {workdir / 'tune.json'}", err=True)
