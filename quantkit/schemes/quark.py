"""Every scheme Quark 0.13 knows, as data: listing or validating schemes never imports quark.torch (~30 s)."""

from __future__ import annotations

from quantkit.schemes.mxfp4 import MXFP4_GROUP, mxfp4_bad_scale, mxfp4_layout, quantize_mxfp4
from quantkit.schemes.ptpc_fp8 import ptpc_fp8_bad_scale, ptpc_fp8_layout, quantize_ptpc_fp8
from quantkit.schemes.quark_config import mxfp4_layer_config, ptpc_fp8_layer_config
from quantkit.schemes.record import Scheme

# The weight dtype Quark 0.13 exports for the MXFP4 and FP8 families (the only ones apply's verification checks).
_MX, _F8 = "U8", "F8_E4M3"

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
    Scheme("fp8", "FP8 E4M3 per-tensor", "FP8 E4M3 per-tensor, static", True, weight_dtype=_F8),
    Scheme(
        "ptpc_fp8",
        "FP8 E4M3 per-channel",
        "FP8 E4M3 per-token, dynamic",
        weight_dtype=_F8,
        scale_dtype="F32",
        layout=ptpc_fp8_layout,
        quantize=quantize_ptpc_fp8,
        quark_layer_config=ptpc_fp8_layer_config,
        batching="rows-2d",
        bad_scale=ptpc_fp8_bad_scale,
    ),
    Scheme(
        "mxfp4",
        "MXFP4 (E8M0 scale per 32)",
        "MXFP4, dynamic",
        weight_dtype=_MX,
        scale_dtype="U8",
        group_size=MXFP4_GROUP,
        layout=mxfp4_layout,
        quantize=quantize_mxfp4,
        quark_layer_config=mxfp4_layer_config,
        batching="rows",
        bad_scale=mxfp4_bad_scale,
    ),
    Scheme("mxfp4_weight_only", "MXFP4 (E8M0 scale per 32)", "none (weight-only)", weight_dtype=_MX),
    Scheme("mxfp6_e3m2", "MXFP6 E3M2", "MXFP6 E3M2, dynamic"),
    Scheme("mxfp6_e2m3", "MXFP6 E2M3", "MXFP6 E2M3, dynamic"),
    Scheme("mxfp4_mxfp6_e2m3", "MXFP4", "MXFP6 E2M3, dynamic", weight_dtype=_MX),
    Scheme("mxfp4_fp8", "MXFP4", "FP8 E4M3 per-tensor, static", True, weight_dtype=_MX),
    Scheme("amdfp4", "AMD FP4 per-group 16", "AMD FP4 per-group 16, dynamic"),
    Scheme("amdfp4_g32", "AMD FP4 per-group 32", "AMD FP4 per-group 32, dynamic"),
    Scheme("int4_fp8", "INT4 per-channel via FP8 (W4A8)", "FP8 E4M3 per-tensor, dynamic", weight_dtype=_F8),
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
