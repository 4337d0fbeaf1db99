"""The types of the source quantization_config keys quantkit reads (fp8, compressed-tensors: quantkit.io.formats),
as pydantic models. A module of its own so that only a quantized source builds them: an unquantized one, the common
case, needs none (building the models costs a few ms per process)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from quantkit.errors import QuantkitError
from quantkit.io.schema import validate


class Typed(BaseModel):
    # strict: 7 is not a list, "false" is not false; keys quantkit does not read are not checked.
    model_config = ConfigDict(extra="allow", strict=True)


class Fp8Config(Typed):
    """The keys of an fp8 quantization_config that quantkit reads (vllm fp8.py Fp8Config.from_config reads the same)."""

    fmt: str | None = None
    weight_block_size: list[int] | None = None
    ignored_layers: list[str] | None = None
    modules_to_not_convert: list[str] | None = None
    activation_scheme: str | None = None
    scale_fmt: str | None = None  # "ue8m0": DeepSeek-V3.2/V4 and MXFP8 scales are powers of two


class CtWeights(Typed):
    num_bits: int | None = None
    type: str | None = None
    symmetric: bool | None = None
    strategy: str | None = None
    group_size: int | None = None
    actorder: Any = None  # compressed-tensors' ActivationOrdering ("group", "weight", ...) or a legacy bool


class CtGroup(Typed):
    format: str | None = None
    targets: list[str] | None = None
    weights: CtWeights | None = None
    input_activations: dict[str, Any] | None = None


class CtConfig(Typed):
    """The keys of a compressed-tensors quantization_config that quantkit reads
    (compressed_tensors/quantization/quant_config.py QuantizationConfig has the same types)."""

    format: str | None = None
    config_groups: dict[str, CtGroup] | None = None
    ignore: list[str] | None = None
    sparsity_config: dict[str, Any] | None = None
    transform_config: dict[str, Any] | None = None


# by quant_method; an mxfp8 config has fp8's keys (vLLM's ModelOptMxFp8Config.from_config reads ignored_layers)
MODELS: dict[str, type[Typed]] = {"fp8": Fp8Config, "mxfp8": Fp8Config, "compressed-tensors": CtConfig}


def check_types(method: str, qcfg: Mapping[str, Any], key: str | None, source: str, error: type[QuantkitError]) -> None:
    """Raise `error`, one line naming the field of `source` (under `key`), where a key of `qcfg` has the wrong type."""
    validate(MODELS[method], dict(qcfg), source, "fix config.json (or re-download it)", error, prefix=key or "")
