"""The speedup section as Markdown, one renderer for the gate's report.md and the model card: a candidate's served
speedup per concurrency (results.SpeedupSummary), with the identity line and the labels its figures must carry
(measured off the deployment's hardware; synthetic acceptance)."""

from __future__ import annotations

from quantkit.results.bench import SpeedupSummary
from quantkit.results.cost import DraftStepEstimate

SYNTHETIC_LABEL = (
    "SYNTHETIC acceptance (rejection_sample_method: synthetic): the acceptance and the speedups are not "
    "this draft's; the gate refuses them in a gated figure"
)


def _f(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _ci(ci: list[float | None] | None) -> str:
    return f" ({_f(ci[0])}-{_f(ci[1])})" if ci and len(ci) == 2 and ci[0] is not None and ci[1] is not None else ""


def identity_line(s: SpeedupSummary) -> str:
    """What the figures were measured on and with, in one line."""
    i = s.identity
    backends = ", ".join(f"{k} {v}" for k, v in (i.backends or {}).items()) or f"not known ({i.backends_reason or '-'})"
    return (
        f"Measured on {i.hardware or 'unknown hardware'} ({i.platform or '-'}), TP {i.tensor_parallel_size}, "
        f"{i.vllm_version or 'vLLM version unknown'}; backends: {backends}; KV cache dtype {i.kv_cache_dtype}; "
        f"max_num_seqs {i.max_num_seqs if i.max_num_seqs is not None else '-'}; workload "
        f"{i.workload or '-'}{' (' + i.workload_label + ')' if i.workload_label else ''}; "
        f"{s.repeats} repeats x {s.output_len} output tokens per request, K={s.num_speculative_tokens}."
    )


def hardware_label(s: SpeedupSummary, deployment_platform: str | None = None) -> str:
    """'' when the figures are the deployment hardware's, else the label they must carry."""
    on_it = s.deployment_hardware is True and (
        deployment_platform is None or not s.identity.platform or s.identity.platform == deployment_platform
    )
    if on_it:
        return ""
    where = f" ({deployment_platform})" if deployment_platform else ""
    return (
        f"**Not the deployment's hardware**: measured on {s.identity.hardware or 'unknown hardware'}, not on the "
        f"hardware this checkpoint is deployed on{where}. Speed depends on the hardware: these figures are "
        "hardware_dependent and show the mechanics (every arm served, no request failed), not the speed there."
    )


def speedup_markdown(s: SpeedupSummary, deployment_platform: str | None = None) -> list[str]:
    """The table (per concurrency: output tok/s of no speculation, the BF16 draft and the candidate; speedups with
    their 95% bootstrap CIs; candidate / BF16 draft with its CI; c_step; AL), then crossover, K schedule, identity
    and labels."""
    lines = []
    label = hardware_label(s, deployment_platform)
    if label:
        lines += [label, ""]
    if s.identity.synthetic_acceptance:
        lines += [f"**{SYNTHETIC_LABEL}**", ""]
    lines += [
        "| C | no-spec tok/s | BF16 draft tok/s | candidate tok/s | candidate speedup (95% CI) | "
        "BF16 draft speedup (95% CI) | candidate / BF16 draft (95% CI) | c_step (candidate, BF16) | "
        "AL (candidate, BF16) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in s.rows:
        lines.append(
            f"| {r.concurrency} | {_f(r.no_spec_output_throughput, 1)} | "
            f"{_f(r.bf16_draft_output_throughput, 1)} | {_f(r.candidate_output_throughput, 1)} | "
            f"{_f(r.speedup)}{_ci(r.speedup_ci)} | {_f(r.bf16_draft_speedup)}{_ci(r.bf16_draft_speedup_ci)} | "
            f"{_f(r.vs_bf16_draft)}{_ci(r.vs_bf16_draft_ci)} | {_f(r.c_step)}, {_f(r.bf16_draft_c_step)} | "
            f"{_f(r.acceptance_length, 3)}, {_f(r.bf16_draft_acceptance_length, 3)} |"
        )

    def cross(c: int | None) -> str:
        return (
            f"stops paying at C={c}"
            if c is not None
            else f"pays at every concurrency measured (up to C={s.max_concurrency_measured})"
        )

    lines += [
        "",
        f"Crossover (the concurrency from which speculation stays slower than none): candidate "
        f"{cross(s.crossover)}; BF16 draft {cross(s.bf16_draft_crossover)}.",
    ]
    if s.num_speculative_tokens_per_batch_size:
        lines += [
            "",
            "Recommended K per batch size (vLLM's `num_speculative_tokens_per_batch_size`): "
            f"`{[list(r) for r in s.num_speculative_tokens_per_batch_size]}`.",
        ]
    lines += ["", identity_line(s)]
    if s.draft_costs:
        lines += ["", *draft_cost_markdown(s.draft_costs)]
    return lines


def estimate_line(e: DraftStepEstimate) -> str:
    """A draft's step time on its platform, labelled: an estimate from bytes, the platform and why it, never a
    measurement."""
    rounds = ", ".join(f"a round of K={k} {us:,.1f} us" for k, us in e.round_us.items())
    return (
        f"Estimated on {e.platform} ({e.bandwidth_tbs:g} TB/s, {e.bandwidth_source}; {e.platform_reason}), "
        f"TP {e.tensor_parallel_size}: a draft token {e.token_us:,.1f} us, fc {e.fc_us:,.1f} us once per round"
        + (f", {rounds}" if rounds else "")
        + f". An {e.estimate}."
    )


def draft_cost_markdown(estimates: list[DraftStepEstimate]) -> list[str]:
    """Per draft: the bytes a draft step reads by role and their shares of a draft token (as `quantkit inspect`
    shows them), then its time on the named platform, every figure labelled an estimate from bytes."""
    lines = ["**Draft step cost: an estimate from bytes (weights read over HBM bandwidth), not a measurement.**"]
    for e in estimates:
        lines += ["", f"`{e.draft}`:", "", "| role | runs | MB | share of a draft token |", "|---|---|---|---|"]
        for r in e.cost.roles:
            runs = "once per round" if r.role == "fc" else "per draft token"
            share = "-" if r.share is None else f"{r.share:.2f}"
            lines.append(f"| {r.role} | {runs} | {r.bytes / 1e6:,.2f} | {share} |")
        lines += ["", estimate_line(e)]
    return lines
