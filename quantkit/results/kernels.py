"""Results of the kernel-path prediction (quantkit.rules.kernels): which vLLM kernel every MoE and linear layer of a
checkpoint takes on a platform, with its performance class, and the rule table as `quantkit rules` prints it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from quantkit.results.base import CommandResult, Result

# The performance classes, fastest first: native (AITER MXFP4 CK / ASM FP4 GEMM / AITER FP8 PTPC / CUTLASS, the
# kernel the format was made for); a16w4 (AITER Triton W4A16: MXFP4 weights, BF16 activations); fallback (a generic
# kernel: Triton, Marlin, hipBLASLt / torch _scaled_mm, the CPU kernel, BF16 GEMMs); emulation (weights dequantized
# on the fly, 9-15x slower for MoE on gfx942, vllm-project/vllm#50682); none (no backend: vLLM raises at load).
PerfClass = Literal["native", "a16w4", "fallback", "emulation", "none"]
PERF_CLASSES: tuple[PerfClass, ...] = ("native", "a16w4", "fallback", "emulation", "none")


class KernelPath(Result):
    """The vLLM path one layer (or a group of identical layers) takes on `platform`."""

    layer: str  # the runtime layer name, or the group pattern (model.layers.{0-1}.mlp.experts)
    count: int = 1
    kind: Literal["moe", "linear", "attention"]
    scheme: str  # "w4a4" | "w4a16" | "w4a8" | "fp8-ptpc" | "fp8" | "bf16" | ...
    backend: str  # the backend as vLLM logs it: Mxfp4MoeBackend value / linear kernel class name
    perf_class: PerfClass
    why: str  # the gate that decided, with its vLLM file
    source: str  # the vLLM file(s) and function(s) replayed


class KernelReport(Result):
    """Every MoE and linear layer's path on one platform, the image it assumes, and the per-kind summary that
    deploy.json carries as `predicted_backends`."""

    platform: str
    vllm_version: str
    assumes: dict[str, bool | str]  # the serving image: VLLM_ROCM_USE_AITER, aiter, amd-quark, ...
    paths: list[KernelPath] = Field(default_factory=list)
    predicted_backends: dict[str, str] = Field(default_factory=dict)  # kind -> backend (the slowest layer's)


class RuleRow(Result):
    """One row of the rule table (quantkit.rules.table.RULES) as `quantkit rules` prints it."""

    id: str
    title: str
    severity: str
    codes: list[str]
    commands: list[str]
    platforms: list[str] | None  # None: every platform
    vllm_min: str | None
    vllm_max: str | None  # exclusive
    decided_at: str
    when: str
    needs: str
    reads: str
    source: str
    holds: bool | None = None  # with --platform / --vllm-version: whether it holds there


class RulesResult(CommandResult):
    """`quantkit rules --json`: the rule table, optionally for one platform and vLLM version."""

    platform: str | None = None
    vllm_version: str | None = None
    known_vllm_versions: list[str] = Field(default_factory=list)
    # Set when vllm_version is none of known_vllm_versions: no rule was read from that version's source, and the
    # `holds` column is what the rules' version ranges say, unverified for it.
    version_note: str | None = None
    rules: list[RuleRow] = Field(default_factory=list)


__all__ = ["PERF_CLASSES", "KernelPath", "KernelReport", "PerfClass", "RuleRow", "RulesResult"]
