"""`quantkit check`: the rules of quantkit.rules.table (config, exclusion, tensors, TP, draft, scale data, platform), then the real vLLM load and numeric agreement, gathered into one CheckResult."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from pathlib import Path

from quantkit.check.inspect import draft_step_cost
from quantkit.check.numeric import numeric_agreement, numeric_logits
from quantkit.check.real_load import real_load
from quantkit.errors import QuantkitError
from quantkit.io.checkpoint import target_layer_count
from quantkit.io.headers import read_config
from quantkit.naming.archs import require_vllm_model
from quantkit.naming.precision import LoadedCheckpoint, load_checkpoint
from quantkit.progress import Progress, or_silent
from quantkit.results import CheckResult, Finding, NumericResult, VllmLoad
from quantkit.rules.rule import CheckpointView, Findings, RuleContext, ServingOptions
from quantkit.rules.table import run_rules, source_of
from quantkit.vocab import EAGLE3_DRAFT, PLATFORMS, SEVERITIES, VLLM_MODES

DEFAULT_LOAD_TIMEOUT_S = 900


class CheckInputError(QuantkitError):
    """`check` was called with an option value it cannot use."""


# --- entry point -----------------------------------------------------------------------------------------------


def run(
    folder: str | Path,
    target: str | Path | None = None,
    tp: int = 1,
    platform: str = "gfx950",
    vllm: str = "auto",
    numeric: bool = False,
    source: str | Path | None = None,
    load_timeout_s: float = DEFAULT_LOAD_TIMEOUT_S,
    progress: Progress | None = None,
    vllm_version: str | None = None,
) -> CheckResult:
    """Check the Quark checkpoint in `folder` against what vLLM's Quark loader does with it.

    `target` is the target checkpoint of an EAGLE-3 draft (its layer count names the draft's layers; needed for the
    aux-layer, hidden-size and real-load checks). `tp` is the tensor-parallel size to check divisibility for,
    `platform` the GPU the checkpoint is meant for, `vllm` whether to load it in vLLM (auto: when vLLM is installed),
    `numeric` with `source` compares the dequantized weights with the source checkpoint's. `vllm_version` is the vLLM
    the rules hold for (default: the installed one, else the newest the table knows; quantkit.rules.vllm_versions).
    Raises QuantkitError (CLI exit 2) for input that is not a readable checkpoint.
    """
    from quantkit.rules.kernels import report_for
    from quantkit.rules.vllm_versions import resolve_vllm_version

    t0 = time.perf_counter()
    progress = or_silent(progress)
    version = resolve_vllm_version(vllm_version)
    if platform not in PLATFORMS:
        raise CheckInputError(f"--platform {platform!r}: use one of {', '.join(PLATFORMS)}")
    if vllm not in VLLM_MODES:
        raise CheckInputError(f"--vllm {vllm!r}: use one of {', '.join(VLLM_MODES)}")
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise CheckInputError(f"--tp {tp!r}: must be a positive integer")
    if numeric and source is None:
        raise CheckInputError("--numeric needs --source SRC: the unquantized checkpoint to compare with")
    if numeric:
        assert source is not None
        read_config(source)  # a missing or unreadable --source is bad input, found before any work
    if vllm != "off":  # a layout vLLM builds no model for (an MoE-layer EAGLE-3 draft) cannot be loaded: one line
        require_vllm_model(read_config(folder), str(folder))
    target_config = read_config(target) if target is not None else None
    n_target = target_layer_count(target) if target is not None else None
    ck = load_checkpoint(folder, n_target)
    findings = Findings()
    assumed = _draft_layers_from_exclude(ck) if ck.model_kind == EAGLE3_DRAFT and n_target is None else None
    if assumed is not None:
        ck = load_checkpoint(folder, assumed)
        findings.add(
            "info",
            "target-layers-assumed",
            "--target",
            f"no --target: exclude names model.layers.{assumed}.*, so the draft's decoder layers are taken "
            f"to be numbered from {assumed} (the target's layer count)",
            "pass --target TARGET_DIR",
        )
        findings[-1].source = source_of("draft-target-unknown")  # the rule that lists target-layers-assumed
    view = CheckpointView.of(ck)
    target_view = CheckpointView(target, target_config) if target is not None and target_config is not None else None
    ctx = RuleContext(
        subject=view,
        serving=ServingOptions(platform=platform, tp=tp, vllm_version=version),
        target=target_view,
        draft=view if ck.model_kind == EAGLE3_DRAFT else None,
        target_num_layers=n_target,
        findings=findings,
        progress=progress,
    )
    progress("static contract")
    run_rules(ctx, "check")
    layers, modules = view.layers, view.modules
    kernels = report_for(view, ctx.serving)
    load = real_load(ck, layers, target, n_target, vllm, findings, load_timeout_s, progress)
    numeric_result = (
        numeric_agreement(ck, layers, modules, Path(source), findings, progress) if numeric and source else None
    )
    if numeric_result is not None:
        assert source is not None  # numeric_result is only computed with a source
        numeric_result["logits"] = numeric_logits(ck, Path(source), target, findings, progress)
    return CheckResult(
        path=str(ck.path), architecture=ck.architecture, model_kind=ck.model_kind,
        target=str(target) if target is not None else None, target_num_layers=n_target, tp=tp, platform=platform,
        findings=_ordered(findings), layers=layers, vllm_load=VllmLoad.model_validate(load),
        numeric=NumericResult.model_validate(numeric_result) if numeric_result is not None else None,
        seconds=time.perf_counter() - t0, vllm_version=version, kernels=kernels,
        draft_cost=draft_step_cost(ck.model_kind, layers, kernels),
    )  # fmt: skip


def _draft_layers_from_exclude(ck: LoadedCheckpoint) -> int | None:
    """The target layer count an exact `model.layers.<N>.` exclude entry implies for a draft checked without it."""
    exclude = ck.qc.get("exclude") if ck.qc else None
    numbers = (
        [int(m[1]) for e in exclude if isinstance(e, str) and (m := re.match(r"^model\.layers\.(\d+)\.", e))]
        if isinstance(exclude, list)
        else []
    )
    return min(numbers) if numbers else None


def _ordered(findings: Sequence[Finding]) -> list[Finding]:
    rank = {s: i for i, s in enumerate(SEVERITIES)}
    return sorted(findings, key=lambda f: rank[f.severity])  # stable: checks keep their order within a severity
