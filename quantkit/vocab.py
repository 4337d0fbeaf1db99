"""Closed vocabularies every stage shares: model kinds, finding severities, platforms, vLLM modes and gate steps.

Each vocabulary is written once, as a Literal; the tuple beside it (for `in` tests and error messages) is read from
that Literal, in its order, so the two cannot drift. No imports beyond typing: every module may import this one.
"""

from __future__ import annotations

from typing import Literal, get_args

# What a checkpoint is, as apply, check, acceptance and the gate branch on it.
ModelKind = Literal["eagle3-draft", "moe-target", "dense-target"]
EAGLE3_DRAFT: ModelKind = "eagle3-draft"
MOE_TARGET: ModelKind = "moe-target"
DENSE_TARGET: ModelKind = "dense-target"

# A finding's severity, most severe first (check sorts by this order).
Severity = Literal["error", "warning", "info"]
SEVERITIES: tuple[Severity, ...] = get_args(Severity)

# Where a checkpoint will be served: MI355X (gfx950), MI300X (gfx942), CUDA, CPU.
Platform = Literal["gfx950", "gfx942", "cuda", "cpu"]
PLATFORMS: tuple[Platform, ...] = get_args(Platform)

# `check --vllm` and the gate's check step: whether a real vLLM load runs, and whether its absence is an error.
VllmMode = Literal["auto", "off", "required"]
VLLM_MODES: tuple[VllmMode, ...] = get_args(VllmMode)

# The steps a gate config may list, in the order the gate runs them on each candidate.
StepName = Literal["check", "acceptance", "eval", "serve", "bench"]

__all__ = [
    "DENSE_TARGET",
    "EAGLE3_DRAFT",
    "MOE_TARGET",
    "PLATFORMS",
    "SEVERITIES",
    "VLLM_MODES",
    "ModelKind",
    "Platform",
    "Severity",
    "StepName",
    "VllmMode",
]
