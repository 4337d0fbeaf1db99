"""Result of `quantkit families`: every family and draft layout quantkit names, with what vLLM builds for it and
what quantkit's recipes keep unquantized, each with its reason."""

from __future__ import annotations

from quantkit.results.base import CommandResult, Result


class KeptPart(Result):
    """One part of a family that is never quantized, and why."""

    part: str
    reason: str


class FamilyEntry(Result):
    """One record of quantkit.naming.archs: its name, the config.json architectures it claims (vLLM's registry keys),
    the vLLM model file its runtime names follow, its kind, and what is kept."""

    name: str
    architectures: list[str] = []
    vllm_source: str = ""
    kind: str = ""  # "draft layout", "wrapper", "MoE family", "dense family"
    model_types: list[str] = []
    vllm_builds: bool = True  # False: vLLM has no class for it (apply and `check --vllm off` only)
    # architectures another record claims that this one takes where a config key says so, each with the key
    # ("Eagle3DeepseekV2ForCausalLM with use_moe: true"); vllm_builds speaks for these too
    variants: list[str] = []
    kept: list[KeptPart] = []


class FamilyList(CommandResult):
    """`families --json`: every registered family and draft layout, in name order."""

    families: list[FamilyEntry] = []


__all__ = ["FamilyEntry", "FamilyList", "KeptPart"]
