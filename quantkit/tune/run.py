"""`quantkit tune`: sweep the draft options for a target and draft pair (body BF16 or FP8, draft vocabulary sizes,
K), measure each option's acceptance against the unpruned BF16 draft, estimate its cost per accepted token from
bytes on a platform (quantkit.rules.cost), and recommend the cheapest option that keeps an AL-ratio floor.

Acceptance is measured (the reference engine or vLLM, as `quantkit acceptance`); cost is an estimate from bytes,
never a measurement: a bench on the deployment GPU confirms the recommendation.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from quantkit.errors import QuantkitError
from quantkit.progress import Progress, or_silent
from quantkit.results.tune import TuneOption, TuneResult


class TuneError(QuantkitError):
    """tune was asked for options it cannot build (a vocabulary above the draft's, no K)."""


def _target_shape(target: str | Path) -> Any:
    """What the target's decode step reads, from its headers (quantkit.rules.cost.TargetShape)."""
    from quantkit.check.inspect import inspect_checkpoint
    from quantkit.io.checkpoint import resolve_config
    from quantkit.rules.cost import TargetShape

    result = inspect_checkpoint(target)
    experts = [layer for layer in result.layers if layer.role == "experts" and layer.experts]
    always = sum(layer.bytes for layer in result.layers if layer.role not in ("experts", "embedding"))
    if not experts:
        return TargetShape(always_bytes=always)
    config = resolve_config(target)
    text = config.get("text_config") or config
    top_k = int(text.get("num_experts_per_tok") or text.get("moe_topk") or 1)
    per_expert = experts[0].bytes / max(experts[0].experts or 1, 1)
    return TargetShape(
        always_bytes=always,
        moe_layers=len(experts),
        num_experts=int(experts[0].experts or 0),
        top_k=top_k,
        expert_bytes=per_expert,
    )


def _draft_rows(draft: str | Path) -> int:
    from quantkit.io.checkpoint import resolve_source

    src = resolve_source(draft)
    return int(src.tensors["lm_head.weight"].shape[0])


def _pareto(options: list[TuneOption]) -> None:
    """Mark the options no other option beats on both AL ratio (higher) and cost per accepted token (lower)."""
    done = [(o, o.al_ratio, o.us_per_token) for o in options if o.al_ratio is not None and o.us_per_token is not None]
    for o, ratio, cost in done:
        o.pareto = not any(p is not o and r >= ratio and c <= cost and (r > ratio or c < cost) for p, r, c in done)


def tune(
    target: str | Path,
    draft: str | Path,
    workdir: str | Path,
    *,
    vocab_corpus: str | Path | None = None,
    vocabs: Sequence[int] | None = None,
    ks: Sequence[int] = (2, 3, 4),
    bodies: Sequence[str] = ("bf16", "fp8"),
    prompts: str = "builtin",
    max_new_tokens: int = 32,
    backend: str = "reference",
    platform: str = "MI355X",
    tp: int = 1,
    batch: int = 1,
    floor: float = 0.98,
    apply_to: str | Path | None = None,
    progress: Progress | None = None,
) -> TuneResult:
    """Every combination of `bodies` x `vocabs` (lm_head rows; default: full, 1/2, 1/4) x `ks`, measured and
    estimated; the recommendation is the lowest estimated cost per accepted token with AL ratio >= `floor`."""
    from quantkit.acceptance.run import run_acceptance
    from quantkit.apply.run import apply
    from quantkit.apply.vocab import prune_draft
    from quantkit.check.inspect import inspect_checkpoint
    from quantkit.rules.cost import BANDWIDTH_TBS, draft_cost, microseconds

    progress = or_silent(progress)
    if platform not in BANDWIDTH_TBS:
        raise TuneError(
            input=f"--platform {platform}",
            reason="no bandwidth on record",
            fix=f"use one of {', '.join(BANDWIDTH_TBS)}",
        )
    if not ks:
        raise TuneError(input="--k", reason="no K given", fix="give at least one K")
    full = _draft_rows(draft)
    sizes = sorted(set(vocabs or [full, full // 2, full // 4]), reverse=True)
    if sizes[0] > full:
        raise TuneError(input=f"--vocab {sizes[0]}", reason=f"above the draft's {full} rows", fix=f"at most {full}")
    if any(v < full for v in sizes) and vocab_corpus is None:
        raise TuneError(
            input="--vocab-corpus",
            reason="missing: pruned vocabularies are chosen from a corpus",
            fix="give --vocab-corpus FILE, or only --vocab " + str(full),
        )
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    shape = _target_shape(target)
    variants: dict[tuple[str, int], Path] = {}
    options: list[TuneOption] = []
    for rows in sizes:
        pruned = Path(draft) if rows == full else work / f"draft-v{rows}"
        if rows != full:
            progress(f"draft vocabulary {rows}: pruning")
            prune_draft(draft, pruned, target=target, corpus=vocab_corpus, n=rows, overwrite=True)  # type: ignore[arg-type]
        for body in bodies:
            folder = pruned
            if body == "fp8":
                folder = work / f"draft-v{rows}-fp8"
                progress(f"draft vocabulary {rows}, FP8 body: applying fp8-draft")
                apply("fp8-draft", pruned, folder, target=target, overwrite=True)
            variants[(body, rows)] = folder
    for (body, rows), folder in variants.items():
        cost = draft_cost(inspect_checkpoint(folder).layers)
        for k in ks:
            option = TuneOption(body=body, draft_vocab=rows, k=k)
            progress(f"{body} body, {rows} rows, K={k}: acceptance")
            try:
                acc = run_acceptance(
                    target,
                    draft,
                    folder,
                    num_speculative_tokens=k,
                    prompts=prompts,
                    max_new_tokens=max_new_tokens,
                    backend=backend,
                )
            except QuantkitError as e:
                option.error = str(e)
                options.append(option)
                continue
            option.al = acc.candidate.mean_acceptance_length if acc.candidate else None
            option.baseline_al = acc.baseline.mean_acceptance_length if acc.baseline else None
            option.al_ratio = acc.ratio
            option.round_us = microseconds(shape.step_bytes(batch * (k + 1)), platform, tp) + microseconds(
                cost.round_bytes(k), platform, tp
            )
            option.us_per_token = option.round_us / option.al if option.al else None
            options.append(option)
    reference = [o.us_per_token for o in options if o.body == "bf16" and o.draft_vocab == full and o.us_per_token]
    for o in options:
        if reference and o.us_per_token:
            o.cost_ratio = o.us_per_token / min(reference)
    _pareto(options)
    keeping = [o for o in options if o.al_ratio is not None and o.al_ratio >= floor and o.us_per_token]
    best = min(keeping, key=lambda o: o.us_per_token) if keeping else None  # type: ignore[arg-type,return-value]
    result = TuneResult(
        target=str(target), draft=str(draft), platform=platform, tp=tp, floor=floor, options=options, recommended=best
    )
    result.chart = str(_chart(result, work / "tune.png"))
    if apply_to is not None and best is not None:
        out = Path(apply_to)
        if out.exists():
            raise TuneError(input=f"--apply {out}", reason="exists", fix="pick a new folder")
        shutil.copytree(variants[(best.body, best.draft_vocab)], out)
        (out / "tune.json").write_text(best.model_dump_json(indent=2) + "\n")
        result.applied = str(out)
    return result


def _chart(result: TuneResult, path: Path) -> Path:
    """AL ratio against estimated cost per accepted token, one point per option, the recommendation ringed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for o in result.options:
        if o.al_ratio is None or o.cost_ratio is None:
            continue
        ax.scatter(o.cost_ratio, o.al_ratio, color="tab:red" if o.body == "fp8" else "tab:blue")
        ax.annotate(f"{o.draft_vocab}/K{o.k}", (o.cost_ratio, o.al_ratio), fontsize=7)
    if result.recommended and result.recommended.cost_ratio is not None and result.recommended.al_ratio is not None:
        ax.scatter(
            result.recommended.cost_ratio, result.recommended.al_ratio, s=200, facecolors="none", edgecolors="black"
        )
    ax.axhline(result.floor, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel(f"estimated cost per accepted token vs BF16 draft ({result.platform}; estimate from bytes)")
    ax.set_ylabel("AL ratio vs unpruned BF16 draft (measured)")
    ax.set_title("quantkit tune (blue: BF16 body, red: FP8 body)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


__all__ = ["TuneError", "tune"]
