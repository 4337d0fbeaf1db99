"""Pure-torch MXFP4 and PTPC-FP8 weight quantizers byte-identical to Quark 0.13's file-to-file path: moved to
quantkit.schemes (the registry), quantkit.schemes.mxfp4, .ptpc_fp8 and .quark_config."""

from quantkit.schemes import (  # house-move stub (issue 19): deleted at S3
    NonFiniteWeight,
    expected_layout,
    quantize_weight,
)
from quantkit.schemes.mxfp4 import MXFP4_GROUP, quantize_mxfp4  # house-move stub (issue 19): deleted at S3
from quantkit.schemes.ptpc_fp8 import FP8_E4M3_MAX, quantize_ptpc_fp8  # house-move stub (issue 19): deleted at S3
from quantkit.schemes.quark_config import (  # house-move stub (issue 19): deleted at S3
    QUARK_VERSION,
    quark_layer_config,
    quark_quantization_config,
)

__all__ = ["FP8_E4M3_MAX", "MXFP4_GROUP", "QUARK_VERSION", "NonFiniteWeight", "expected_layout", "quantize_mxfp4",
           "quantize_ptpc_fp8", "quantize_weight", "quark_layer_config", "quark_quantization_config"]
