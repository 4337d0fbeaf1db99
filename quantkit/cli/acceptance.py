"""`quantkit acceptance`: does the quantized draft still get its tokens accepted?"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from quantkit.cli.app import main
from quantkit.cli.options import (
    JsonObject,
    TokenCounts,
    check_writable_file,
    flags_for_spec_errors,
    json_option,
    make_console,
    print_json,
    trust_option,
)
from quantkit.cli.params import Count, Real
from quantkit.progress import stderr_progress

if TYPE_CHECKING:  # result types only; the modules are imported when the command runs
    from quantkit.results import AcceptanceResult


@main.command("acceptance")
@click.option("--target", required=True, help="The target (verifier) checkpoint: folder or Hub id.")
@click.option("--draft", required=True, help="The BF16 EAGLE-3 draft: the baseline.")
@click.option(
    "--candidate",
    required=True,
    help="The quantized draft to compare (or a quantized target, run with the BF16 draft).",
)
@click.option(
    "--candidate-target",
    default=None,
    help="Pair mode: the quantized target the candidate draft runs on; compares (this + --candidate) "
    "with (--target + --draft), the deployment as served.",
)
@click.option(
    "--prompts",
    default="builtin",
    show_default=True,
    help="'builtin', a JSONL file of {messages|prompt, domain} records, or speed-bench:CONFIG[/CATEGORY] "
    "(CONFIG: qualitative, throughput_1k ... throughput_32k).",
)
@click.option(
    "--speed-bench",
    "speed_bench",
    default=None,
    help="Where SPEED-Bench is read from: a folder laid out as the Hub dataset (CONFIG/test-*.parquet, or "
    "ModelOpt prepare_data.py's data/speed), or a Hub dataset id owner/name[@revision] (default: "
    "nvidia/SPEED-Bench at the revision quantkit pins).",
)
@click.option("--num-speculative-tokens", "k", type=Count(1, 64), default=3, show_default=True)
@click.option(
    "--temperature",
    type=Real(0.0, 100.0),
    default=0.0,
    show_default=True,
    help="0 = greedy (exact match); > 0 = vLLM's rejection sampling (reference backend on CPU).",
)
@click.option("--top-p", type=Real(0.0, 1.0, lo_open=True), default=1.0, show_default=True)
@click.option("--top-k", type=Count(-1, 1_000_000), default=0, show_default=True, help="0 or -1: no top-k.")
@click.option(
    "--draft-sample-method",
    type=click.Choice(["greedy", "probabilistic"]),
    default="greedy",
    show_default=True,
    help="vLLM's speculative_config draft_sample_method: greedy (the default) proposes "
    "the draft's argmax; probabilistic samples the draft and tests p/q.",
)
@click.option(
    "--num-seeds",
    type=Count(1, 1000),
    default=1,
    show_default=True,
    help="With --temperature > 0: run every prompt with seeds SEED ... SEED+N-1.",
)
@click.option(
    "--chat-template-kwargs",
    "chat_template_kwargs",
    type=JsonObject(),
    default="{}",
    help="JSON object passed to the chat template, e.g. '{\"enable_thinking\": false}'.",
)
@click.option("--max-new-tokens", type=Count(1, 1_000_000), default=64, show_default=True)
@click.option(
    "--backend",
    type=click.Choice(["auto", "reference", "vllm"]),
    default="auto",
    show_default=True,
    help="vllm when it can run the checkpoints here, else the PyTorch reference engine.",
)
@click.option(
    "--context-lengths",
    "lengths",
    type=TokenCounts(),
    default="",
    help="Comma-separated prompt lengths in tokens, e.g. 256,1024: "
    "AL against prompt length (prompts lengthened with --context-source, else synthetic notes).",
)
@click.option(
    "--context-source",
    default=None,
    help="Long text the context buckets are cut from (target tokens): speed-bench:throughput_32k (any "
    "SPEED-Bench config, read from --speed-bench) or a UTF-8 text file.",
)
@click.option("--seed", type=Count(0, 2**32 - 1), default=0, show_default=True)
@click.option(
    "--device",
    type=click.Choice(["cpu", "cuda"]),
    default="cpu",
    show_default=True,
    help="Device of the reference engine.",
)
@click.option(
    "--out",
    "out_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the JSON result to this file.",
)
@trust_option()
@json_option("Print the result as JSON.")
def acceptance_command(
    target: str,
    draft: str,
    candidate: str,
    candidate_target: str | None,
    prompts: str,
    speed_bench: str | None,
    k: int,
    temperature: float,
    top_p: float,
    top_k: int,
    draft_sample_method: str,
    num_seeds: int,
    chat_template_kwargs: dict,
    max_new_tokens: int,
    backend: str,
    lengths: list[int],
    context_source: str | None,
    seed: int,
    device: str,
    out_file: Path | None,
    trust_remote_code: bool,
    as_json: bool,
) -> None:
    """Measure whether a quantized draft still gets its tokens accepted: AL of the candidate vs the BF16 draft.

    \b
    quantkit acceptance --target T --draft DRAFT --candidate DRAFT-FP8
    quantkit acceptance --target T --draft DRAFT --candidate DRAFT-FP8 --backend reference --temperature 0.7
    quantkit acceptance --target T --draft DRAFT --candidate DRAFT-FP8 --candidate-target T-MXFP4
    quantkit acceptance ... --prompts speed-bench:qualitative --speed-bench ./speed-bench-resolved
    quantkit acceptance ... --temperature 1.0 --top-p 0.95 --num-seeds 4 --chat-template-kwargs '{"enable_thinking": true}'

    Mean acceptance length AL = 1 + accepted draft tokens / drafts (as vLLM and Quark define it), per-position
    acceptance rates, tokens per target forward, per-domain AL, and the candidate/BF16 ratio with a bootstrap
    95% interval over prompts; pooled AL (vLLM's) and macro AL (mean per request, ModelOpt's), the histogram of
    accepted lengths, conditional acceptance per position and AL by output position. Both drafts run against the same target with the same prompts and settings; with
    --candidate-target, the quantized draft runs on the quantized target (the pair) against the BF16 pair.
    """
    from quantkit.acceptance.run import run_acceptance
    from quantkit.io.files import check_model_folders
    from quantkit.io.hf import remote_code_allowed
    from quantkit.io.jsonout import write

    check_model_folders([target, draft, candidate, candidate_target], out_file)
    if out_file is not None:
        check_writable_file(out_file, "--out")
    with remote_code_allowed(trust_remote_code), flags_for_spec_errors():
        result = run_acceptance(
            target,
            draft,
            candidate,
            prompts=prompts,
            num_speculative_tokens=k,
            temperature=temperature,
            max_new_tokens=max_new_tokens,
            backend=backend,
            context_lengths=lengths,
            seed=seed,
            device=device,
            candidate_target=candidate_target,
            progress=stderr_progress("acceptance"),
            top_p=top_p,
            top_k=top_k,
            draft_sample_method=draft_sample_method,
            num_seeds=num_seeds,
            chat_template_kwargs=chat_template_kwargs,
            speed_bench=speed_bench,
            context_source=context_source,
        )
    data = result.to_dict()
    if out_file is not None:
        out_file.parent.mkdir(parents=True, exist_ok=True)
        write(out_file, data)
    if as_json:
        print_json(data)
    else:
        _render_acceptance(result)


def _f(x: float | None, fmt: str = "{:.3f}") -> str:
    return "-" if x is None else fmt.format(x)


def _render_acceptance(result: AcceptanceResult) -> None:
    from rich.table import Table

    b, c = result.baseline, result.candidate
    assert b is not None and c is not None
    st = result.settings
    sampled = (
        f", top_p={st.top_p}, top_k={st.top_k}, {st.draft_sample_method} draft, {st.num_seeds} seed(s)"
        if st.temperature
        else ""
    )
    table = Table(
        title=f"Acceptance length ({result.backend}, K={st.num_speculative_tokens}, T={st.temperature}"
        f"{sampled}; pooled = 1 + sum accepted / sum drafts, macro = mean of per-request AL)",
        title_justify="left",
    )
    pair = result.candidate_kind == "pair"
    base_name, cand_name = ("BF16 pair", "quantized pair") if pair else ("BF16 draft", "candidate")
    for col in (
        "domain",
        "prompts",
        f"{base_name} AL pooled",
        f"{cand_name} AL pooled",
        "ratio",
        f"{base_name} AL macro",
        f"{cand_name} AL macro",
    ):
        table.add_column(col, justify="left" if col == "domain" else "right")
    for d, v in b.per_domain.items():
        cd = c.per_domain.get(d)
        table.add_row(
            d,
            str(v.prompts),
            _f(v.mean_acceptance_length),
            _f(c.domain_al(d)),
            _f(result.per_domain_ratio.get(d)),
            _f(v.macro_acceptance_length),
            _f(cd.macro_acceptance_length if cd else None),
        )
    table.add_row(
        "all",
        str(st.num_prompts),
        _f(b.mean_acceptance_length),
        _f(c.mean_acceptance_length),
        _f(result.ratio),
        _f(b.macro_acceptance_length),
        _f(c.macro_acceptance_length),
        style="bold",
    )
    console = make_console()
    console.print(table)
    pos = Table(title="Acceptance rate per position", title_justify="left")
    pos.add_column("")
    for i in range(len(b.acceptance_rate_per_pos or [])):
        pos.add_column(f"pos {i + 1}", justify="right")
    pos.add_column("tokens/target fwd", justify="right")
    for name, run in ((base_name, b), (cand_name, c)):
        pos.add_row(
            name, *(_f(x) for x in run.acceptance_rate_per_pos or []), _f(run.tokens_per_target_forward, "{:.2f}")
        )
        pos.add_row("  conditional", *(_f(x) for x in run.conditional_acceptance_per_pos), "")
    console.print(pos)
    for name, run in ((base_name, b), (cand_name, c)):
        console.print(
            f"{name}: drafts by accepted tokens 0..K {run.accepted_length_histogram}; AL by output "
            f"position {run.al_by_output_position or '-'}"
            + (f"; expected AL {_f(run.expected_acceptance_length)}" if st.temperature else "")
        )
    if result.expected_ratio is not None and st.temperature:
        lo_e, hi_e = result.expected_ratio_ci or [None, None]
        console.print(
            f"expected AL ratio {_f(result.expected_ratio, '{:.4f}')} (95% bootstrap CI over (prompt, seed) "
            f"{_f(lo_e, '{:.4f}')}-{_f(hi_e, '{:.4f}')})"
        )
    src = st.prompt_source
    if src is not None and src.kind == "speed-bench":
        console.print(
            f"prompts {src.name} from {src.repo or 'a local folder'}"
            + (f"@{src.revision}" if src.revision else "")
            + f", files sha256 {src.content_sha256}"
        )
    if result.context_length_ratio:
        ctx = Table(title="AL against prompt length", title_justify="left")
        for col in ("tokens", f"{base_name} AL", f"{cand_name} AL", "ratio"):
            ctx.add_column(col, justify="right")
        for n, r in result.context_length_ratio.items():
            ctx.add_row(n, _f(b.by_context_length.get(n)), _f(c.by_context_length.get(n)), _f(r))
        console.print(ctx)
    lo, hi = result.ratio_ci or [None, None]
    console.print(
        f"ratio {cand_name}/{base_name} = {_f(result.ratio, '{:.4f}')} (95% bootstrap CI "
        f"{_f(lo, '{:.4f}')}-{_f(hi, '{:.4f}')}); {b.num_drafts} and {c.num_drafts} drafts"
    )
    if pair:
        console.print(f"pair: {c.draft} on {c.target}; baseline: {b.draft} on {b.target}")
