"""Every scheme Quark 0.13 knows, as data: listing or validating schemes never imports quark.torch (~30 s)."""

from __future__ import annotations

from quantkit.schemes.record import Scheme

# Quark 0.13's built-in schemes, in the order of quark/torch/quantization/config/template.py
# (QuantizationSchemeCollection._collect_supported_schemes). Block formats (mx6, mx9, bfp16) compute their shared
# exponents on the fly, so they store no input scale; nvfp4 and amdfp4_global* calibrate a per-tensor global input
# scale.
_ROWS = (
    Scheme("int4_wo_32", "INT4 per-group 32", "none (weight-only)"),
    Scheme("int4_wo_64", "INT4 per-group 64", "none (weight-only)"),
    Scheme("int4_wo_128", "INT4 per-group 128", "none (weight-only)"),
    Scheme("int4_wo_per_channel", "INT4 per-channel", "none (weight-only)"),
    Scheme("int4_wa_64", "INT4 per-group 64", "INT4 per-group 64, dynamic"),
    Scheme("uint4_wo_32", "UINT4 per-group 32", "none (weight-only)"),
    Scheme("uint4_wo_64", "UINT4 per-group 64", "none (weight-only)"),
    Scheme("uint4_wo_128", "UINT4 per-group 128", "none (weight-only)"),
    Scheme("uint4_wo_per_channel", "UINT4 per-channel", "none (weight-only)"),
    Scheme("int8", "INT8 per-tensor", "INT8 per-tensor, static", True),
    Scheme("fp8", "FP8 E4M3 per-tensor", "FP8 E4M3 per-tensor, static", True),
    Scheme("ptpc_fp8", "FP8 E4M3 per-channel", "FP8 E4M3 per-token, dynamic"),
    Scheme("mxfp4", "MXFP4 (E8M0 scale per 32)", "MXFP4, dynamic"),
    Scheme("mxfp4_weight_only", "MXFP4 (E8M0 scale per 32)", "none (weight-only)"),
    Scheme("mxfp6_e3m2", "MXFP6 E3M2", "MXFP6 E3M2, dynamic"),
    Scheme("mxfp6_e2m3", "MXFP6 E2M3", "MXFP6 E2M3, dynamic"),
    Scheme("mxfp4_mxfp6_e2m3", "MXFP4", "MXFP6 E2M3, dynamic"),
    Scheme("mxfp4_fp8", "MXFP4", "FP8 E4M3 per-tensor, static", True),
    Scheme("amdfp4", "AMD FP4 per-group 16", "AMD FP4 per-group 16, dynamic"),
    Scheme("amdfp4_g32", "AMD FP4 per-group 32", "AMD FP4 per-group 32, dynamic"),
    Scheme("int4_fp8", "INT4 per-channel via FP8 (W4A8)", "FP8 E4M3 per-tensor, dynamic"),
    Scheme("mx6", "MX6", "MX6, block exponents"),
    Scheme("mx9", "MX9", "MX9, block exponents"),
    Scheme("bfp16", "BFP16 (block 8)", "BFP16, block exponents"),
    Scheme("nvfp4", "FP4 per-group 16, FP8 E4M3 scales", "FP4 per-group 16 + static global scale", True),
    Scheme("amdfp4_global16", "FP4 per-group 16, E5M3 scales", "FP4 per-group 16 + static global scale", True),
    Scheme("amdfp4_global32", "FP4 per-group 32, E5M3 scales", "FP4 per-group 32 + static global scale", True),
)
QUARK_SCHEMES: dict[str, Scheme] = {s.name: s for s in _ROWS}

# Names Quark 0.13 still accepts only for old configs; recipes must use the current name.
QUARK_SCHEME_ALIASES: dict[str, str] = {"fp4_block16_scale_e4m3": "nvfp4"}
