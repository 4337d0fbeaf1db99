"""`quantkit tune`: the draft options of a target + draft pair, swept and ranked.

Options: body BF16 or FP8 (the fp8-draft recipe) x draft vocabularies (the draft's own, and each smaller N pruned by
quantkit.apply.prune from a corpus) x K. Each option's AL is measured against the BF16 draft at the same K on the
same prompts (quantkit.acceptance.run_acceptance: reference engine or vLLM); its cost per round and per accepted
token is an ESTIMATE FROM BYTES on `gpu` (quantkit.rules.cost). The Pareto set is the options no other beats on
both AL ratio and cost per accepted token; the recommendation is the cheapest per accepted token whose AL ratio
meets the floor (default 0.98).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from quantkit.errors import QuantkitError
from quantkit.io.headers import checkpoint_tensors, read_config
from quantkit.progress import Progress, or_silent
from quantkit.results.tune import TuneOption, TuneResult
from quantkit.rules.cost import GPUS, draft_cost, estimate


class TuneError(QuantkitError):
    """`tune` cannot run as asked."""


def _pareto(options: list[TuneOption]) -> None:
    scored = [o for o in options if o.al_ratio is not None and o.us_per_accepted_token is not None]
    for o in scored:
        assert o.al_ratio is not None and o.us_per_accepted_token is not None
        o.pareto = not any(
            p is not o and p.al_ratio is not None and p.us_per_accepted_token is not None
            and p.al_ratio >= o.al_ratio and p.us_per_accepted_token <= o.us_per_accepted_token
            and (p.al_ratio > o.al_ratio or p.us_per_accepted_token < o.us_per_accepted_token)
            for p in scored)


def run_tune(target: str | Path, draft: str | Path, workdir: str | Path, *, gpu: str = "MI355X",
             vocab_sizes: list[int] | None = None, ks: list[int] | None = None, bodies: tuple[str, ...] = ("bf16", "fp8"),
             corpus: str = "builtin", prompts: str = "builtin", backend: str = "reference", max_new_tokens: int = 32,
             floor: float = 0.98, apply_to: str | Path | None = None, chart: str | Path | None = None,
             progress: Progress | None = None) -> TuneResult:
    """Sweep, measure, estimate, recommend; `apply_to` writes the recommended draft there (through `apply`)."""
    from quantkit.acceptance.run import run_acceptance
    from quantkit.apply.prune import prune_draft
    from quantkit.apply.run import apply

    progress = or_silent(progress)
    if gpu not in GPUS:
        raise TuneError(f"--gpu {gpu!r}: use one of {', '.join(GPUS)}")
    if not 0 < floor <= 1.5:
        raise TuneError(f"--floor {floor}: an AL ratio such as 0.98")
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    dcfg = read_config(draft)
    full = int(dcfg.get("draft_vocab_size") or dcfg.get("vocab_size") or 0)
    sizes = sorted({full, *(vocab_sizes or [])}, reverse=True)
    if any(n > full or n < 1 for n in sizes):
        raise TuneError(f"--vocab {','.join(map(str, sizes))}: the draft has {full} lm_head rows; give sizes up to it")
    pair = (read_config(target), checkpoint_tensors(target))
    folders: dict[tuple[str, int], Path] = {}
    for n in sizes:
        base = Path(draft) if n == full else work / f"bf16-v{n}"
        if n != full and not base.exists():
            progress(f"pruning the draft's vocabulary to {n}")
            prune_draft(draft, base, n, corpus, target)
        for body in bodies:
            if body == "bf16":
                folders[body, n] = base
            else:
                out = work / f"fp8-v{n}"
                if not out.exists():
                    progress(f"fp8-draft on the {n}-token draft")
                    apply("fp8-draft", base, out, target=target)
                folders[body, n] = out
    options: list[TuneOption] = []
    for k in ks or [2, 3, 4]:
        for (body, n), folder in folders.items():
            progress(f"AL of body {body}, vocabulary {n}, K {k} ({backend})")
            acc = run_acceptance(target, draft, folder, backend=backend, num_speculative_tokens=k,
                                 max_new_tokens=max_new_tokens, prompts=prompts)
            al = acc.candidate.mean_acceptance_length if acc.candidate else None
            base_al = acc.baseline.mean_acceptance_length if acc.baseline else None
            tensors = checkpoint_tensors(folder)
            cost = estimate(draft_cost(read_config(folder), tensors), tensors, gpu, k=k, al=al or 0.0, target=pair)
            e = cost.estimate
            assert e is not None
            # a BF16 body is costed in BF16; an FP8 one as stored (its kernel path predicted on the GPU)
            fp8 = body != "bf16"
            round_us = e.round_us_recipe if fp8 else e.round_us_bf16
            options.append(TuneOption(
                body=body, draft_vocab=n, k=k, al=al, baseline_al=base_al, al_ratio=acc.ratio, round_us=round_us,
                us_per_accepted_token=round(round_us / al, 4) if round_us and al else None,
                speedup_bound=e.speedup_bound_recipe if fp8 else e.speedup_bound_bf16, meets_floor=acc.ratio is not None and acc.ratio >= floor))
    _pareto(options)
    fit = [o for o in options if o.meets_floor and o.us_per_accepted_token is not None]
    best = min(fit, key=lambda o: o.us_per_accepted_token or 0.0) if fit else None
    result = TuneResult(target=str(target), draft=str(draft), gpu=gpu, corpus=corpus, backend=backend,
                        al_ratio_floor=floor, options=options, recommended=best)
    if chart is not None:
        result.chart = str(_chart(result, Path(chart)))
    if apply_to is not None and best is not None:
        src = folders[best.body, best.draft_vocab]
        shutil.copytree(src, Path(apply_to))
        result.applied_to = str(apply_to)
    return result


def _chart(result: TuneResult, path: Path) -> Path:
    """AL ratio against estimated cost per accepted token, one point per option, the Pareto set joined."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    pts = [(o, float(o.us_per_accepted_token), float(o.al_ratio)) for o in result.options
           if o.al_ratio is not None and o.us_per_accepted_token is not None]
    for o, x, y in pts:
        ax.scatter(x, y, marker="o" if o.body == "bf16" else "s", color="tab:blue" if o.pareto else "tab:gray")
        ax.annotate(f"{o.body} v{o.draft_vocab} K{o.k}", (x, y), fontsize=7)
    front = sorted((x, y) for o, x, y in pts if o.pareto)
    ax.plot([x for x, _ in front], [y for _, y in front], color="tab:blue", linewidth=1)
    ax.axhline(result.al_ratio_floor, color="tab:red", linestyle="--", linewidth=1)
    ax.set_xlabel(f"us per accepted token on {result.gpu} (ESTIMATE FROM BYTES)")
    ax.set_ylabel("AL ratio vs BF16 full-vocabulary draft (measured)")
    fig.tight_layout()
    fig.savefig(path)
    return path
