"""The `quantization_config` AMD Quark 0.13's file-to-file path writes into config.json for the native schemes,
replayed without importing Quark."""

from __future__ import annotations

import copy
from typing import Any

# The quark package version Quark 0.13 writes into quantization_config["version"].
QUARK_VERSION = "0.13"


def _tensor_spec(**fields: Any) -> dict[str, Any]:
    """quark/torch/quantization/config/config.py `QTensorConfig.to_dict`, key order included."""
    spec = {
        "dtype": None,
        "is_dynamic": None,
        "qscheme": None,
        "ch_axis": None,
        "group_size": None,
        "block_size": None,
        "symmetric": None,
        "round_method": "half_even",
        "scale_type": "float",
        "zero_point_type": "int32",
        "scale_format": None,
        "scale_calculation_mode": None,
        "mx_element_dtype": None,
        "observer_cls": None,
        "is_scale_quant": False,
        "enable_buffer_reuse": False,
        "max_input_numel": 4194304,
    }
    unknown = set(fields) - set(spec)
    assert not unknown, unknown
    spec.update(fields)
    return spec


def _layer(weight: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
    return {"input_tensors": inputs, "output_tensors": None, "weight": weight, "bias": None, "target_device": None}


def mxfp4_layer_config() -> dict[str, Any]:
    """template.py `MXFP4Scheme` (OCP_MXFP4Spec: static weight, dynamic input) as `QLayerConfig.to_dict` writes it."""

    def mx(dynamic: bool) -> dict[str, Any]:
        return _tensor_spec(
            dtype="fp4",
            is_dynamic=dynamic,
            qscheme="per_group",
            ch_axis=-1,
            group_size=32,
            scale_format="e8m0",
            scale_calculation_mode="even",
            observer_cls="PerBlockMXObserver",
        )

    return _layer(mx(False), mx(True))


def ptpc_fp8_layer_config() -> dict[str, Any]:
    """template.py `PTPCFP8Scheme` (per-channel weight, dynamic per-token input) as `QLayerConfig.to_dict` writes
    it."""

    def fp8(dynamic: bool, axis: int) -> dict[str, Any]:
        return _tensor_spec(
            dtype="fp8_e4m3",
            is_dynamic=dynamic,
            qscheme="per_channel",
            ch_axis=axis,
            symmetric=True,
            observer_cls="PerChannelMinMaxObserver",
        )

    return _layer(fp8(False, 0), fp8(True, 1))


def quark_layer_config(scheme: str) -> dict[str, Any]:
    """`LLMTemplate` scheme `scheme` as `QLayerConfig.to_dict` writes it (the registry's `quark_layer_config`)."""
    from quantkit.schemes import SCHEMES, native_schemes  # the registry imports this module: import it when used

    record = SCHEMES.get(scheme)
    if record is None or record.quark_layer_config is None:
        raise ValueError(f"scheme {scheme!r}: the native quantizer supports {', '.join(native_schemes())}")
    return record.quark_layer_config()


def quark_quantization_config(scheme: str, exclude: list[str], layer_config: dict[str, str] | None) -> dict[str, Any]:
    """The `quantization_config` Quark 0.13's file-to-file path writes into config.json.

    `exclude` are the module names the run left unquantized (Quark resolves its patterns against the checkpoint's
    linear weights and writes the sorted names); `layer_config` maps module-name patterns to scheme names, as given
    to `LLMTemplate.get_config(layer_config=...)`. Replays `QConfig.to_dict` (config/config.py) and
    file2file_quantization.py `_export_quant_config` (adds `export`, replaces `exclude` by the sorted names).
    """
    config: dict[str, Any] = {
        "global_quant_config": quark_layer_config(scheme),
        "exclude": sorted(exclude),
        "algo_config": None,
        "softmax_quant_spec": None,
        "quant_method": "quark",
        "layer_type_quant_config": {},
        "layer_quant_config": {pattern: quark_layer_config(s) for pattern, s in (layer_config or {}).items()},
        "kv_cache_quant_config": {},
        "kv_cache_post_rope": False,
        "quant_mode": "eager_mode",
        "version": QUARK_VERSION,
        "export": {
            "kv_cache_group": [],
            "min_kv_scale": 0.0,
            "pack_method": "reorder",
            "weight_format": "real_quantized",
            "weight_merge_groups": None,
        },
    }
    return copy.deepcopy(config)
