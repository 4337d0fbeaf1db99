"""`quantkit check`: the static contract, scale data, draft and platform checks, then the real vLLM load and numeric agreement, gathered into one CheckResult (see quantkit.check.contract for the rules and the vLLM code each replays)."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from pathlib import Path

from quantkit.check.contract import static_contract
from quantkit.check.drafts import draft_checks
from quantkit.check.findings import (
    DEFAULT_LOAD_TIMEOUT_S,
    CheckInputError,
    CheckResult,
    Finding,
    Findings,
)
from quantkit.check.numeric import numeric_agreement, numeric_logits
from quantkit.check.real_load import real_load
from quantkit.check.scales import platform_notes, scale_data
from quantkit.io.checkpoint import target_layer_count
from quantkit.io.headers import INDEX_FILE, read_config, unindexed_weight_files
from quantkit.naming.precision import LoadedCheckpoint, load_checkpoint, modules_of
from quantkit.progress import Progress, or_silent
from quantkit.results import NumericResult, VllmLoad
from quantkit.vocab import EAGLE3_DRAFT, PLATFORMS, SEVERITIES, VLLM_MODES

# --- entry point -----------------------------------------------------------------------------------------------


def check_checkpoint(folder: str | Path, target: str | Path | None = None, tp: int = 1, platform: str = "gfx950",
                     vllm: str = "auto", numeric: bool = False, source: str | Path | None = None,
                     load_timeout_s: float = DEFAULT_LOAD_TIMEOUT_S,
                     progress: Progress | None = None) -> CheckResult:
    """Check the Quark checkpoint in `folder` against what vLLM's Quark loader does with it.

    `target` is the target checkpoint of an EAGLE-3 draft (its layer count names the draft's layers; needed for the
    aux-layer, hidden-size and real-load checks). `tp` is the tensor-parallel size to check divisibility for,
    `platform` the GPU the checkpoint is meant for, `vllm` whether to load it in vLLM (auto: when vLLM is installed),
    `numeric` with `source` compares the dequantized weights with the source checkpoint's.
    Raises QuantkitError (CLI exit 2) for input that is not a readable checkpoint.
    """
    t0 = time.perf_counter()
    progress = or_silent(progress)
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
    target_config = read_config(target) if target is not None else None
    n_target = target_layer_count(target) if target is not None else None
    ck = load_checkpoint(folder, n_target)
    findings = Findings()
    assumed = _draft_layers_from_exclude(ck) if ck.model_kind == EAGLE3_DRAFT and n_target is None else None
    if assumed is not None:
        ck = load_checkpoint(folder, assumed)
        findings.add("info", "target-layers-assumed", "--target",
                     f"no --target: exclude names model.layers.{assumed}.*, so the draft's decoder layers are taken "
                     f"to be numbered from {assumed} (the target's layer count)", "pass --target TARGET_DIR")
    stray = unindexed_weight_files(ck.path)
    if stray:
        shown = ", ".join(stray[:3]) + (f" and {len(stray) - 3} more" if len(stray) > 3 else "")
        findings.add("warning", "unindexed-weight-file", stray[0],
                     f"{INDEX_FILE} does not name {shown}: vLLM skips such files "
                     "(model_loader/weight_utils.py filter_duplicate_safetensors_files), but a tool that reads every "
                     "*.safetensors file of the folder loads their tensors as well",
                     "remove them, or regenerate the index if they hold weights of this model")
    modules = modules_of(ck.tensors)
    progress("static contract")
    layers = static_contract(ck, modules, tp, findings)
    if ck.model_kind == EAGLE3_DRAFT:
        draft_checks(ck, target, target_config, n_target, findings)
    progress("scale tensors")
    scale_data(ck, layers, modules, findings, progress)
    platform_notes(layers, platform, findings)
    load = real_load(ck, layers, target, n_target, vllm, findings, load_timeout_s, progress)
    numeric_result = numeric_agreement(ck, layers, modules, Path(source), findings, progress) if numeric and source else None
    if numeric_result is not None:
        assert source is not None  # numeric_result is only computed with a source
        numeric_result["logits"] = numeric_logits(ck, Path(source), target, findings, progress)
    return CheckResult(
        path=str(ck.path), architecture=ck.architecture, model_kind=ck.model_kind,
        target=str(target) if target is not None else None, target_num_layers=n_target, tp=tp, platform=platform,
        findings=_ordered(findings), layers=layers, vllm_load=VllmLoad.model_validate(load),
        numeric=NumericResult.model_validate(numeric_result) if numeric_result is not None else None,
        seconds=time.perf_counter() - t0,
    )  # fmt: skip


def _draft_layers_from_exclude(ck: LoadedCheckpoint) -> int | None:
    """The target layer count an exact `model.layers.<N>.` exclude entry implies for a draft checked without it."""
    exclude = ck.qc.get("exclude") if ck.qc else None
    numbers = [int(m[1]) for e in exclude if isinstance(e, str) and (m := re.match(r"^model\.layers\.(\d+)\.", e))] \
        if isinstance(exclude, list) else []
    return min(numbers) if numbers else None


def _ordered(findings: Sequence[Finding]) -> list[Finding]:
    rank = {s: i for i, s in enumerate(SEVERITIES)}
    return sorted(findings, key=lambda f: rank[f.severity])  # stable: checks keep their order within a severity
