"""The Python API: one verb per stage, each `verb(inputs, spec=None, *, progress=None, **overrides) -> Result`.

    import quantkit
    r = quantkit.apply("draft", recipe="fp8-draft", target="target", output="out")   # an ApplyResult

Each verb builds its stage's spec (`quantkit.specs`) from `spec` and the keyword overrides, validated by field name,
runs the stage and returns the typed result that the command's `--json` prints. Errors are `QuantkitError`
subclasses carrying `input`, `reason` and `fix`; a bad spec raises `SpecError` naming the field. `progress=None`
is silent; pass `quantkit.progress.stderr_progress("apply")` for the CLI's progress lines. Heavy libraries are
imported by the stage that needs them, when it runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantkit.specs import (
    AcceptanceSpec,
    ApplySpec,
    BenchSpec,
    CheckSpec,
    EvalSpec,
    InspectSpec,
    PublishSpec,
    ServeSpec,
)

if TYPE_CHECKING:
    from quantkit.progress import Progress
    from quantkit.results import (
        AcceptanceResult,
        ApplyResult,
        BenchResult,
        CheckResult,
        DeployManifest,
        EvalResult,
        GateResult,
        InspectResult,
        PublishResult,
    )


def _size(value: int | str | None, field: str) -> int | None:
    from quantkit.apply.run import parse_shard_size, parse_size

    if value is None or isinstance(value, int):
        return value
    return parse_shard_size(value) if field == "max_shard_size" else parse_size(value, field)


def apply(
    model: str | Path, spec: ApplySpec | None = None, *, progress: Progress | None = None, **overrides: Any
) -> ApplyResult:
    """Quantize `model` (a folder or Hub id) with a recipe into `output`; see `ApplySpec` for every setting."""
    from quantkit.apply.run import apply as run_apply
    from quantkit.io.hf import remote_code_allowed

    s = ApplySpec.build(spec, **overrides)
    with remote_code_allowed(s.trust_remote_code):
        return run_apply(
            s.recipe,
            model,
            s.output,
            devices=s.devices,
            path=s.path,
            engine=s.engine,
            overwrite=s.overwrite,
            resume=s.resume,
            dry_run=s.dry_run,
            target=s.target,
            max_memory=_size(s.max_memory, "max_memory"),
            max_shard_size=_size(s.max_shard_size, "max_shard_size"),
            progress=progress,
        )


def inspect(folder: str | Path, spec: InspectSpec | None = None, **overrides: Any) -> InspectResult:
    """The precision vLLM will give every layer of `folder`, read from its headers only (no tensor data)."""
    from quantkit.check.inspect import inspect_checkpoint

    s = InspectSpec.build(spec, **overrides)
    return inspect_checkpoint(
        folder, target_num_layers=s.target_num_layers, platform=s.platform, tp=s.tp, vllm_version=s.vllm_version
    )


def check(
    folder: str | Path, spec: CheckSpec | None = None, *, progress: Progress | None = None, **overrides: Any
) -> CheckResult:
    """Check a quantized folder against vLLM's loader rules, and load it in vLLM when `vllm` allows."""
    from quantkit.check.run import run as run_check

    s = CheckSpec.build(spec, **overrides)
    return run_check(
        folder,
        target=s.target,
        tp=s.tp,
        platform=s.platform,
        vllm=s.vllm,
        numeric=s.numeric,
        source=s.source,
        load_timeout_s=s.load_timeout_s,
        progress=progress,
        vllm_version=s.vllm_version,
    )


def acceptance(
    candidate: str | Path,
    spec: AcceptanceSpec | None = None,
    *,
    target: str | Path,
    draft: str | Path,
    candidate_target: str | Path | None = None,
    progress: Progress | None = None,
    **overrides: Any,
) -> AcceptanceResult:
    """Acceptance of `candidate` (a quantized draft) against the BF16 `draft`, both drafting for `target` (or, in
    pair mode, the candidate on `candidate_target`)."""
    from quantkit.acceptance.run import run_acceptance

    s = AcceptanceSpec.build(spec, **overrides)
    return run_acceptance(
        target, draft, candidate, candidate_target=candidate_target, progress=progress, **s.model_dump()
    )


def evaluate(
    model: str | Path,
    spec: EvalSpec | None = None,
    *,
    baseline: str | Path,
    progress: Progress | None = None,
    **overrides: Any,
) -> EvalResult:
    """lm-eval on `model` and its `baseline` with the same tasks and settings; the result holds the deltas."""
    from quantkit.evaluate.run import run_eval

    s = EvalSpec.build(spec, **overrides)
    return run_eval(model, baseline, progress=progress, **s.model_dump())


def bench(
    target: str | Path, spec: BenchSpec | None = None, *, progress: Progress | None = None, **overrides: Any
) -> BenchResult:
    """Serve `target` without and with each draft through `vllm serve` and measure with vLLM's benchmark client."""
    from quantkit.bench.run import run_bench

    s = BenchSpec.build(spec, **overrides)
    settings = s.model_dump()
    return run_bench(
        target,
        settings.pop("draft"),
        settings.pop("candidates"),
        settings.pop("candidate_target"),
        progress=progress,
        **settings,
    )


def deploy(folder: str | Path, spec: ServeSpec | None = None, **overrides: Any) -> DeployManifest:
    """The checked `vllm serve` command for `folder` (and its target): the manifest `deploy --json` prints."""
    from quantkit.deploy.run import run as run_deploy

    s = ServeSpec.build(spec, **overrides)
    return run_deploy(folder, **s.model_dump())


def gate(config: str | Path, *, progress: Progress | None = None) -> GateResult:
    """Run the steps a gate config names and compare each figure with its threshold (the config is the spec)."""
    from quantkit.gate.run import run as run_gate

    return run_gate(config, progress=progress)


def publish(folder: str | Path, spec: PublishSpec | None = None, **overrides: Any) -> PublishResult:
    """Upload `folder` with a generated model card to a Hub repo (`dry_run=True` writes what would be uploaded)."""
    from quantkit.publish.hub import publish as run_publish

    s = PublishSpec.build(spec, **overrides)
    return run_publish(folder, **s.model_dump())


__all__ = ["acceptance", "apply", "bench", "check", "deploy", "evaluate", "gate", "inspect", "publish"]
