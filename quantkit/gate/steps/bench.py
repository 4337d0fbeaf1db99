"""The gate's bench step (`Bench`): a draft candidate served on its target next to the target alone and the BF16
draft (quantkit.bench.run_bench: the same server settings for all three, vLLM's own serving benchmark as the load),
as figures.

Speed depends on the hardware. A figure measured elsewhere than on the deployment's hardware is
`hardware_dependent`: it is reported with what its threshold would say, and gated only when the config says that
this runner is the deployment hardware (`bench.runner_is_deployment_hardware`). So CI on CPU checks the mechanics
(every cell ran, no request failed) without pretending its tok/s are MI355X figures. Synthetic acceptance
(`rejection_sample_method: synthetic`) is refused in every gated figure: such figures are infeasible.
"""

from __future__ import annotations

from typing import ClassVar

from quantkit.gate.config import BenchStep
from quantkit.gate.steps.base import GateCandidate, GateContext
from quantkit.gate.verdict import ci_pair, first_line, infeasible, reported, threshold
from quantkit.results.bench import BenchResult
from quantkit.results.gate import CandidateReport, GateCheck
from quantkit.vocab import EAGLE3_DRAFT, StepName

SYNTHETIC = "synthetic acceptance (rejection_sample_method: synthetic) is refused in a gated figure"


class Bench:
    """Per concurrency C: `bench.c<C>.failed_requests` (0, always gated), `bench.c<C>.speedup` (>= min_speedup),
    `bench.c<C>.vs_bf16_draft` (>= 1 - vs_bf16_draft_tolerance); then `bench.crossover` (>= min_crossover). The
    speed figures are hardware_dependent unless runner_is_deployment_hardware."""

    name: ClassVar[StepName] = "bench"

    def applies_to(self, cand: GateCandidate, ctx: GateContext) -> bool:
        return cand.kind == EAGLE3_DRAFT and ctx.draft is not None

    def run(self, cand: GateCandidate, report: CandidateReport, ctx: GateContext) -> list[GateCheck]:
        import tempfile

        from quantkit.bench.run import run_bench

        b, a = ctx.config.bench, ctx.config.acceptance
        k = b.num_speculative_tokens or a.num_speculative_tokens
        served_target = cand.pair_target or ctx.target
        assert ctx.draft is not None
        try:
            with tempfile.TemporaryDirectory(prefix="quantkit-gate-bench-") as tmp:
                res = run_bench(
                    served_target,
                    ctx.draft,
                    [cand.path],
                    concurrency=b.concurrency,
                    output_len=b.output_len,
                    repeats=b.repeats,
                    ks=sorted({k, *b.ks}),
                    prompts=b.prompts or ctx.prompts,
                    max_prompt_texts=b.max_prompt_texts,
                    endpoints=b.endpoints,
                    out_dir=tmp,
                    fast_start=b.fast_start,
                    startup_timeout_s=b.startup_timeout_s,
                    candidate_names={cand.path: cand.name},
                    progress=lambda m: ctx.progress(f"{cand.name}: bench: {m}"),
                )
                res.out_dir = None  # the per-cell files went with the temporary folder
                res.deployment_hardware = b.runner_is_deployment_hardware
        except Exception as e:
            return [infeasible(cand.name, "bench", "bench.error", f"step failed: {first_line(e)}")]
        report.bench = res
        return bench_figures(cand.name, res, b, k)


def bench_figures(name: str, res: BenchResult, b: BenchStep, k: int | None = None) -> list[GateCheck]:
    """The figures of a measured bench for candidate `name` (its arm is the one of kind "candidate", at K `k` when
    given, else at the largest K measured: BenchResult.candidate_arm)."""
    figures: list[GateCheck] = []
    arm = res.candidate_arm(k)
    errors = [x for x in res.arms if x.error]
    if arm is None or errors:
        first = errors[0] if errors else None
        return [
            infeasible(
                name,
                "bench",
                "bench.error",
                f"arm {first.name}: {first.error}" if first else "no candidate arm was measured",
            )
        ]
    gated = b.runner_is_deployment_hardware
    why = (
        f"hardware_dependent: measured on {res.identity.hardware}, which the gate config does not call the "
        "deployment hardware (bench.runner_is_deployment_hardware)"
    )

    def speed(
        fig: str, value: float | None, op: str, limit: float | None, ci: tuple[float, float] | None = None
    ) -> GateCheck:
        if res.identity.synthetic_acceptance and gated:
            return infeasible(name, "bench", fig, SYNTHETIC)
        if not gated:
            label = why + ("; SYNTHETIC acceptance" if res.identity.synthetic_acceptance else "")
            return reported(name, "bench", fig, value, ">=", limit, why=label)
        return threshold(name, "bench", fig, value, ">=", limit, ci=ci)

    for arm_x in res.arms:
        for cell in arm_x.cells:
            failed = float(sum(r.failed for r in cell.repeats))
            figures.append(
                threshold(
                    name,
                    "bench",
                    f"bench.c{cell.concurrency}.{arm_x.name}.failed_requests",
                    failed if cell.repeats else None,
                    "<=",
                    0.0,
                    message=cell.problems[0] if cell.problems else "",
                )
            )
    for cell in arm.cells:
        comp = res.comparison(arm.name, cell.concurrency)
        c = cell.concurrency
        if b.min_speedup is not None:
            figures.append(
                speed(
                    f"bench.c{c}.speedup",
                    comp.speedup if comp else None,
                    ">=",
                    b.min_speedup,
                    ci_pair(comp.speedup_ci) if comp else None,
                )
            )
        if b.vs_bf16_draft_tolerance is not None:
            figures.append(
                speed(
                    f"bench.c{c}.vs_bf16_draft",
                    comp.vs_bf16_draft if comp else None,
                    ">=",
                    1 - b.vs_bf16_draft_tolerance,
                    ci_pair(comp.vs_bf16_draft_ci) if comp else None,
                )
            )
    if b.min_crossover is not None:
        cross = res.crossover.get(arm.name)
        measured = max((c.concurrency for c in arm.cells), default=None)
        # no crossover inside the sweep: speculation pays up to the largest concurrency measured, at least
        value = float(cross) if cross is not None else (float(measured) if measured is not None else None)
        figures.append(speed("bench.crossover", value, ">=", float(b.min_crossover)))
    return figures
