"""The rule record (one thing vLLM rejects or runs wrong, replayed), the context every rule reads, and the findings
list the rules add to. The table of every rule is quantkit.rules.table.

A rule is data plus one check function: its id, every finding code it may emit, its worst severity, the vLLM source
it replays, which commands run it (check, inspect, deploy), what it needs (one checkpoint, a draft, a draft with its
target, a deployment's serving options), whether it is decided from the checkpoint alone ("static") or only when a
model is loaded, compared or served, whether it reads tensor data or headers only, the platforms it holds for
(None: every one) and the vLLM versions it holds for (`vllm_min` inclusive, `vllm_max` exclusive, compared with
packaging.version; None: unbounded), and whether it is decided from the checkpoint (and serving options) alone or only
once the model is served (`decided_at`: "checkpoint" | "serve"; a "serve" rule's findings come from the served step's
log, never from check, inspect or deploy).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, get_args

from packaging.version import Version

from quantkit.io.headers import TensorInfo, checkpoint_tensors
from quantkit.naming.precision import LoadedCheckpoint, load_checkpoint, modules_of, resolve_layers
from quantkit.progress import Progress, or_silent
from quantkit.results.check import Finding
from quantkit.results.precision import LayerPrecision
from quantkit.rules.deploy_context import DeployContext
from quantkit.vocab import PLATFORMS, SEVERITIES, Severity

Command = Literal["check", "inspect", "deploy"]
# When a rule is decided: from the checkpoint (and serving options) alone, or only once vLLM loads, compares or serves.
When = Literal["static", "load", "numeric", "serve"]
# What a rule needs: one checkpoint; an EAGLE-3 draft; a draft with its target; a deployment's serving options.
Needs = Literal["checkpoint", "draft", "pair", "deployment"]
# "data": the rule reads tensor data (numpy); deploy, which reads headers only, skips such rules.
Reads = Literal["headers", "data"]
COMMANDS: tuple[Command, ...] = get_args(Command)
# Whether a rule can be decided before serving (from the checkpoint, the serving options, a load at check time) or only
# from what the server does (its log: the backends vLLM actually chose).
DecidedAt = Literal["checkpoint", "serve"]
DECIDED_AT: tuple[DecidedAt, ...] = get_args(DecidedAt)


def parse_vllm_version(v: str) -> Version:
    """A vLLM version as the rules compare it: the release with pre/dev/local parts dropped (0.32.0+cpu and 0.32.0rc1
    both count as 0.32.0); InvalidVersion for a string that is not one."""
    return Version(Version(v).base_version)


class Findings(list[Finding]):
    """The findings of one run, in the order the rules add them."""

    def add(self, severity: str, code: str, where: str, message: str, fix: str = "") -> None:
        self.append(Finding(severity=severity, code=code, layer_or_tensor=where, message=message, fix=fix))


@dataclass(frozen=True)
class ServingOptions:
    """How the checkpoint will be served: what the rules check it against."""

    platform: str = "gfx950"  # a quantkit.vocab.Platform
    tp: int = 1
    tp_option: str = "--tp"  # how the command spells TP in fixes (deploy: "--tensor-parallel-size")
    kv_cache_dtype: str = "auto"
    num_speculative_tokens: int | None = None
    max_model_len: int | None = None
    vllm_version: str | None = None  # issue 22 (--vllm-version); None: every version the table knows
    block_size: int | None = None  # vLLM --block-size; None: vLLM's default
    draft_attention_backend: str | None = None  # speculative_config.attention_backend; None: not set ("auto")
    dtype: str | None = None  # vLLM --dtype; None: the target config's


class CheckpointView:
    """One checkpoint as the rules see it: its folder (as given: findings quote it) and config.json; its tensor
    headers, runtime layers and the precision vLLM gives each layer are read or replayed once, on first use, so a
    rule that needs only the config reads nothing else (deploy reads headers only)."""

    def __init__(
        self,
        path: str | Path,
        config: dict[str, Any],
        *,
        tensors: dict[str, TensorInfo] | None = None,
        loaded: LoadedCheckpoint | None = None,
        target_num_layers: int | None = None,
    ) -> None:
        self.path = path
        self.config = config
        self.target_num_layers = target_num_layers  # a draft's: names its decoder layers (load_checkpoint)
        if tensors is not None:
            self.__dict__["tensors"] = tensors
        if loaded is not None:
            self.__dict__["loaded"] = loaded

    @classmethod
    def of(cls, ck: LoadedCheckpoint) -> CheckpointView:
        """The view of a checkpoint already loaded (check loads it itself, to number a draft's layers)."""
        return cls(ck.path, ck.config, tensors=ck.tensors, loaded=ck, target_num_layers=ck.target_num_layers)

    @cached_property
    def tensors(self) -> dict[str, TensorInfo]:
        return checkpoint_tensors(self.path)

    @cached_property
    def loaded(self) -> LoadedCheckpoint:
        """Config, tensors and the runtime layers vLLM builds (raises for an architecture quantkit cannot name)."""
        return load_checkpoint(self.path, self.target_num_layers)

    @cached_property
    def modules(self) -> dict[str, list[tuple[str, TensorInfo]]]:
        return modules_of(self.tensors)

    @cached_property
    def _resolution(self) -> tuple[list[LayerPrecision], list[str]]:
        ck = self.loaded
        return resolve_layers(ck.config, ck.qc, ck.layers, self.modules)

    @property
    def layers(self) -> list[LayerPrecision]:
        """Every runtime layer with the precision vLLM's Quark loader gives it (quantkit.check.inspect)."""
        return self._resolution[0]

    @property
    def config_problems(self) -> list[str]:
        """What the replay found vLLM ignores in the config (layer_type_quant_config entries)."""
        return self._resolution[1]

    @cached_property
    def runtime_layers(self) -> dict[str, Any]:
        """Runtime layer name -> the layer vLLM builds (quantkit.naming.layers.RuntimeLayer)."""
        return {layer.name: layer for layer in self.loaded.layers}

    @property
    def qc(self) -> dict[str, Any] | None:
        return self.loaded.qc

    @property
    def is_quark(self) -> bool:
        return self.qc is not None and self.qc.get("quant_method") == "quark"

    @property
    def replayed(self) -> bool:
        """Whether vLLM's Quark loader is replayed for it: no quantization_config (all BF16), or a Quark one. Another
        quant_method is reported once (not-quark) and its layers are not checked."""
        return self.qc is None or self.is_quark

    @cached_property
    def quantized_routers(self) -> set[str]:
        return {lp.name for lp in self.layers if lp.role == "router" and lp.quantized}


@dataclass
class RuleContext:
    """What the rules of one command run look at, and the findings they add."""

    subject: CheckpointView  # the folder the command was given
    serving: ServingOptions = field(default_factory=ServingOptions)
    target: CheckpointView | None = None  # a draft's target (check --target, deploy --target), or None
    draft: CheckpointView | None = None  # the subject when it is an EAGLE-3 draft, else None
    target_num_layers: int | None = None  # check --target: the target's decoder layer count
    findings: Findings = field(default_factory=Findings)
    progress: Progress = field(default_factory=lambda: or_silent(None))

    @property
    def served(self) -> CheckpointView:
        """The model vLLM serves: a draft's target, or the subject itself."""
        return self.target if self.draft is not None and self.target is not None else self.subject

    @cached_property
    def deploy(self) -> DeployContext:
        """The deploy rules' view of this context (rules/deploy_context.py), for the three deploy rules that still have
        their own implementation beside check's (TP split, platform MXFP4, vocabulary)."""
        served, draft, s = self.served, self.draft, self.serving
        return DeployContext(
            target_path=str(served.path), target_config=served.config, target_tensors=served.tensors,
            draft_path=str(draft.path) if draft is not None else None,
            draft_config=draft.config if draft is not None else None,
            draft_tensors=draft.tensors if draft is not None else None,
            platform=s.platform, tp=s.tp, kv_cache_dtype=s.kv_cache_dtype,
            num_speculative_tokens=s.num_speculative_tokens if s.num_speculative_tokens is not None else 3,
            max_model_len=s.max_model_len,
        )  # fmt: skip


@dataclass(frozen=True)
class Rule:
    """One rule of the table: see the module docstring. Exactly one of `check` (the whole context) and `check_layer`
    (one runtime layer at a time; consecutive layer rules run layer by layer, so their findings come in layer order)
    is set, or neither for a rule whose findings another step emits (the real load, the numeric comparison): it is
    listed so that `quantkit rules` shows it and its codes are known."""

    id: str  # stable
    title: str
    severity: Severity  # the most severe finding it can emit
    codes: tuple[str, ...]  # every finding code it may emit
    source: str  # the vLLM file and function it replays (or a PR / issue URL)
    commands: frozenset[Command]
    check: Callable[[RuleContext], None] | None = None
    check_layer: Callable[[RuleContext, LayerPrecision], None] | None = None
    needs: Needs = "checkpoint"
    # What it needs when deploy runs it, where that differs: layer-tensors checks only the draft of a served pair
    # (deploy is not asked to check a target's tensors; `quantkit check TARGET` is).
    deploy_needs: Needs | None = None
    when: When = "static"
    reads: Reads = "headers"
    platforms: frozenset[str] | None = None  # the quantkit.vocab.Platform values it holds on; None: every platform
    vllm_min: str | None = None  # the first vLLM version it holds for (inclusive); None: every earlier one
    vllm_max: str | None = None  # the first vLLM version it no longer holds for (exclusive: the fix); None: unbounded
    decided_at: DecidedAt = "checkpoint"  # "serve": only the served step's log decides it (when="serve")

    def __post_init__(self) -> None:
        if self.check is not None and self.check_layer is not None:
            raise ValueError(f"rule {self.id}: give check or check_layer, not both")
        if self.severity not in SEVERITIES or not self.codes or not self.commands <= set(COMMANDS):
            raise ValueError(f"rule {self.id}: severity, codes or commands out of range")
        if self.platforms is not None and (not self.platforms or not self.platforms <= set(PLATFORMS)):
            raise ValueError(f"rule {self.id}: platforms {sorted(self.platforms)} not in {PLATFORMS}")
        if self.decided_at not in DECIDED_AT or (self.decided_at == "serve") != (self.when == "serve"):
            raise ValueError(
                f"rule {self.id}: decided_at {self.decided_at!r} with when {self.when!r} "
                "(a serve-time rule has both 'serve')"
            )
        lo, hi = self.vllm_range  # InvalidVersion for a malformed version: the table fails at import
        if lo is not None and hi is not None and lo >= hi:
            raise ValueError(f"rule {self.id}: vllm_min {self.vllm_min} is not below vllm_max {self.vllm_max}")

    @property
    def vllm_range(self) -> tuple[Version | None, Version | None]:
        """(first version it holds for, first it no longer holds for), as packaging Versions (None: unbounded)."""
        return (
            parse_vllm_version(self.vllm_min) if self.vllm_min else None,
            parse_vllm_version(self.vllm_max) if self.vllm_max else None,
        )

    @property
    def vllm_spec(self) -> str:
        """The version range as a PEP 440 specifier (">=0.20,<0.26"; "" for every version)."""
        return ",".join(
            p
            for p in (f">={self.vllm_min}" if self.vllm_min else "", f"<{self.vllm_max}" if self.vllm_max else "")
            if p
        )

    def holds_for_version(self, vllm_version: str | None) -> bool:
        """Whether the rule holds for `vllm_version` (None: every version)."""
        if vllm_version is None:
            return True
        v = parse_vllm_version(vllm_version)
        lo, hi = self.vllm_range
        return (lo is None or v >= lo) and (hi is None or v < hi)

    @property
    def runs(self) -> bool:
        """Whether the rule table runs it (False: its findings come from the load or numeric step)."""
        return self.check is not None or self.check_layer is not None

    def holds_for(self, serving: ServingOptions) -> bool:
        """Whether the rule holds on `serving`'s platform and vLLM version (no version given: every version)."""
        if self.platforms is not None and serving.platform not in self.platforms:
            return False
        return self.holds_for_version(serving.vllm_version)

    def applies(self, command: Command, ctx: RuleContext) -> bool:
        """Whether `command` runs this rule on `ctx`: the command, the platform, the vLLM version and what it needs."""
        if command not in self.commands or not self.holds_for(ctx.serving):
            return False
        needs = self.deploy_needs if command == "deploy" and self.deploy_needs is not None else self.needs
        if needs == "draft":
            return ctx.draft is not None
        if needs == "pair":
            return ctx.draft is not None and ctx.target is not None
        return True
