"""The serving platform: FP8 E4M3FN converted to E4M3FNUZ on gfx942, and MXFP4 without native kernels
(vllm/model_executor/layers/quantization/quark/quark_moe.py process_weights_after_loading,
vllm/model_executor/layers/fused_moe/oracle/mxfp4.py select_mxfp4_moe_backend).

check's rules (`fp8_fnuz`, `mxfp4_emulated`, split from check's platform_notes) and deploy's
(`check_platform_mxfp4`) are both here until they merge (see rules/tp.py: the same
decision)."""

from __future__ import annotations

from quantkit.results.check import Finding
from quantkit.rules.deploy_context import DeployContext, finding
from quantkit.rules.rule import RuleContext
from quantkit.rules.tensors import mxfp4_weights


def _quantized(ctx: RuleContext, family: str) -> list[str]:
    return [
        lp.name for lp in ctx.subject.layers if lp.quantized and lp.scheme is not None and lp.scheme.family == family
    ]


def fp8_fnuz(ctx: RuleContext) -> None:
    """platform-fp8-fnuz: gfx942 converts OCP FP8 weights at load; nothing to do."""
    fp8 = _quantized(ctx, "fp8")
    if fp8 and ctx.serving.platform == "gfx942":
        ctx.findings.add(
            "info",
            "platform-fp8-fnuz",
            "platform",
            f"gfx942 (MI300) uses FP8 E4M3FNUZ: vLLM converts these OCP E4M3FN weights and doubles their "
            f"scales at load (normalize_e4m3fn_to_e4m3fnuz; {len(fp8)} layer(s)); nothing to do",
            "none needed: keep the checkpoint OCP E4M3FN (vLLM converts it at load; do not ship "
            "pre-converted FNUZ weights)",
        )


def mxfp4_emulated(ctx: RuleContext) -> None:
    """platform-mxfp4: MXFP4 linears run natively only on gfx950 (MXFP4 MoE layers: the kernel-paths rule names the
    backend each gets, quantkit.rules.kernels)."""
    mx = [
        lp.name
        for lp in ctx.subject.layers
        if lp.quantized and lp.scheme is not None and lp.scheme.family == "mxfp4" and lp.kind != "moe"
    ]
    platform = ctx.serving.platform
    if mx and platform != "gfx950":
        ctx.findings.add(
            "warning",
            "platform-mxfp4-emulated",
            "platform",
            f"{len(mx)} MXFP4 linear layer(s): MXFP4 has hardware support only on gfx950 (MI350/MI355); on "
            f"{platform} vLLM picks a fallback backend or emulation (layers/fused_moe/oracle/mxfp4.py), "
            "which is slower",
            "serve on gfx950, or pick an FP8 recipe for this platform",
        )


def check_platform_mxfp4(ctx: DeployContext) -> list[Finding]:
    tensors = [ctx.target_tensors] + ([ctx.draft_tensors] if ctx.draft_tensors else [])
    if not any(mxfp4_weights(t) for t in tensors):
        return []
    if ctx.platform == "gfx942":
        return [
            finding(
                "platform-mxfp4",
                "warning",
                "platform-mxfp4-emulated",
                "platform gfx942",
                "MXFP4 weights on MI300 (gfx942): no native FP4 matrix cores, vLLM dequantizes them "
                "(emulation or W4A16 kernels): the memory saving holds, the FP4 speed-up does not",
                "serve MXFP4 on MI355 (gfx950) for native FP4",
            )
        ]
    if ctx.platform == "cpu":
        return [
            finding(
                "platform-mxfp4",
                "error",
                "platform-mxfp4-cpu",
                "platform cpu",
                "MXFP4 weights on CPU: vLLM 0.32 has no CPU MXFP4 kernel (MoE: 'No MXFP4 MoE backend "
                "supports the deployment configuration')",
                "serve on gfx950 (or gfx942 emulated)",
            )
        ]
    return []
