"""`quantkit tune`: sweep a draft's options (body, draft vocabulary, K) on its pair and recommend one."""

from __future__ import annotations

from pathlib import Path

import click

from quantkit.cli.app import main
from quantkit.cli.options import json_option, make_console, print_json
from quantkit.progress import stderr_progress
from quantkit.rules.cost import GPUS


def _ints(text: str | None) -> list[int] | None:
    return [int(x) for x in text.split(",") if x.strip()] if text else None


@main.command("tune")
@click.option("--target", required=True, help="The target checkpoint folder.")
@click.option("--draft", required=True, help="The BF16 EAGLE-3 draft folder (the baseline every option is measured "
                                             "against).")
@click.option("--workdir", required=True, type=click.Path(path_type=Path),
              help="Where the pruned and FP8 drafts of the sweep are written.")
@click.option("--gpu", "gpu", type=click.Choice(list(GPUS)), default="MI355X", show_default=True,
              help="The GPU whose HBM bandwidth the cost estimate uses (an ESTIMATE FROM BYTES).")
@click.option("--vocab", "vocab", default=None, help="Draft vocabulary sizes to try besides the draft's own, e.g. "
                                                     "768,512.")
@click.option("--k", "ks", default="2,3,4", show_default=True, help="Speculative token counts to try.")
@click.option("--body", "bodies", default="bf16,fp8", show_default=True, help="Body precisions to try.")
@click.option("--vocab-corpus", "corpus", default="builtin", show_default=True,
              help="The corpus that ranks tokens for pruning (a prompts JSONL, builtin, speed-bench:CONFIG).")
@click.option("--prompts", default="builtin", show_default=True, help="The prompts AL is measured on.")
@click.option("--backend", type=click.Choice(["reference", "vllm", "auto"]), default="reference", show_default=True)
@click.option("--max-new-tokens", "max_new_tokens", type=int, default=32, show_default=True)
@click.option("--floor", type=float, default=0.98, show_default=True, help="The AL ratio the recommendation keeps.")
@click.option("--chart", type=click.Path(path_type=Path), default=None, help="Write the Pareto chart (PNG) here.")
@click.option("--apply", "apply_to", type=click.Path(path_type=Path), default=None,
              help="Write the recommended draft to this folder.")
@json_option("Print every option, the Pareto set and the recommendation as JSON.")
def tune_command(target: str, draft: str, workdir: Path, gpu: str, vocab: str | None, ks: str, bodies: str,
                 corpus: str, prompts: str, backend: str, max_new_tokens: int, floor: float, chart: Path | None,
                 apply_to: Path | None, as_json: bool) -> None:
    """Sweep body BF16/FP8 x draft vocabularies x K on a target + draft pair: AL measured against the BF16 draft,
    cost per accepted token an ESTIMATE FROM BYTES on --gpu; prints the table and recommends the cheapest option
    whose AL ratio meets --floor.

    \b
    quantkit tune --target TARGET --draft DRAFT --workdir WORK --vocab 768,512 --gpu MI355X --chart tune.png
    """
    from quantkit.tune.run import run_tune

    result = run_tune(target, draft, workdir, gpu=gpu, vocab_sizes=_ints(vocab), ks=_ints(ks),
                      bodies=tuple(b.strip() for b in bodies.split(",")), corpus=corpus, prompts=prompts,
                      backend=backend, max_new_tokens=max_new_tokens, floor=floor, apply_to=apply_to, chart=chart,
                      progress=stderr_progress("tune"))
    if as_json:
        print_json(result.to_dict())
        return
    from rich.table import Table

    table = Table(title=f"draft options on {result.gpu}: cost is an ESTIMATE FROM BYTES, AL is measured "
                        f"({result.backend})", title_justify="left")
    for col in ("body", "vocab", "K", "AL", "AL ratio", "round us", "us / accepted token", "speedup bound", "pareto"):
        table.add_column(col, justify="right")
    for o in result.options:
        mark = "*" if o is result.recommended or o == result.recommended else ""
        table.add_row(o.body + mark, str(o.draft_vocab), str(o.k), f"{o.al:.3f}" if o.al else "-",
                      f"{o.al_ratio:.3f}" if o.al_ratio else "-", f"{o.round_us:.3g}" if o.round_us else "-",
                      f"{o.us_per_accepted_token:.3g}" if o.us_per_accepted_token else "-",
                      f"{o.speedup_bound:.2f}x" if o.speedup_bound else "-", "yes" if o.pareto else "")
    console = make_console()
    console.print(table)
    r = result.recommended
    console.print(f"recommended (*): body {r.body}, vocabulary {r.draft_vocab}, K {r.k} (AL ratio {r.al_ratio:.3f} >= "
                  f"{result.al_ratio_floor})" if r else f"no option meets the AL-ratio floor {result.al_ratio_floor}")
