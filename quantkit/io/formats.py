"""Source checkpoint formats quantkit accepts (plain BF16/FP16/FP32, FP8 block-scaled, INT4 compressed-tensors), told
apart from config.json and safetensors headers alone, and decoded exactly to BF16 one shard at a time.

Formats, as the target checkpoints ship them:

- `bf16`: no `quantization_config`; every tensor is kept as stored (BF16, FP16 or FP32).
- `fp8-block` (DeepSeek-V3/R1, MiniMax-M2/M2.5): `quantization_config.quant_method == "fp8"` with `weight_block_size`
  [bn, bk]. Each quantized linear stores `<m>.weight` F8_E4M3 [out, in] and `<m>.weight_scale_inv` F32
  [ceil(out/bn), ceil(in/bk)] (edge blocks partial). Decoded weight = float32(weight) * scale_inv of its block, in
  float32, then rounded once to BF16. That is what DeepSeek's `weight_dequant` does (deepseek-ai/DeepSeek-V3
  inference/kernel.py `weight_dequant_kernel`: `x.to(float32) * s`, stored into a `torch.get_default_dtype()` (bf16)
  tensor by inference/fp8_cast_bf16.py), what vLLM does (vllm/model_executor/layers/quantization/utils/quant_utils.py
  `scaled_dequantize`: `(x_q.to(float32) * x_s).to(out_dtype)`; int8_utils.py `block_dequant` for partial blocks) and
  what compressed-tensors does (compressed_tensors/entrypoints/convert/converters/fp8block_dequantizer.py
  `FP8BlockDequantizer._create_dequantized_weight`). Any positive block size is decoded; [128, 128] is what ships.
- `fp8-block` with E8M0 scales: the same arithmetic where a scale is stored as an E8M0 exponent byte (U8 or F8_E8M0:
  value 2**(byte - 127), 255 is NaN per the OCP MX spec) instead of a float. Two releases store theirs so:
  - MXFP8 (MiniMax-M3-MXFP8: `quant_method: "mxfp8"`, `weight_block_size` [1, 32], `scale_fmt` ue8m0): `<m>.weight`
    F8_E4M3 [out, in] and `<m>.weight_scale_inv` U8 [out, ceil(in/32)], which vLLM loads with ModelOpt's MXFP8 config
    (vllm/model_executor/layers/quantization/__init__.py maps "mxfp8" to ModelOptMxFp8Config; models/minimax_m3/amd/
    model.py load_weights renames `weight_scale_inv` -> `weight_scale`). Decoded as vLLM's own
    quantization/utils/mxfp8_utils.py `dequant_mxfp8_to_bf16` does: float32(w) * exp2(float32(s) - 127), then one
    rounding to BF16.
  - DeepSeek-V4 (`quant_method: "fp8"`, `scale_fmt: "ue8m0"`, `weight_block_size` [128, 128]): `<m>.weight` F8_E4M3
    and `<m>.scale` F8_E8M0 [ceil(out/128), ceil(in/128)], DeepSeek's own names (vllm/models/deepseek_v4/cpu/model.py
    `_make_deepseek_v4_weights_mapper` maps `.scale` -> `.weight_scale_inv`). SourceFormat.scale_suffix says which
    name a checkpoint uses. E4M3 has 3 mantissa bits, so w * 2**k is exact in float32 and in BF16 (7 bits) wherever
    the product is a normal BF16 number.
- DeepSeek-V4's routed experts with `expert_dtype: "fp4"` (DeepSeek-V4-Flash): `layers.N.ffn.experts.E.w{1,2,3}.weight`
  I8 [out, in/2] (torch.float4_e2m1fn_x2: two E2M1 codes per byte, the first in the low nibble) and `.scale` F8_E8M0
  [out, in/32] (DeepSeek-V4 inference/model.py `Linear.__init__`: "Scale is [out, in//32] ... 1 scale per 32 fp4
  elements along K"). That is OCP MXFP4 exactly: E2M1 elements, one E8M0 scale per 32 along the input dimension, low
  nibble first, the layout Quark 0.13 stores (quantkit.schemes.mxfp4.quantize_mxfp4) and vLLM's Mxfp4MoEMethod loads
  for DeepSeek-V4 (vllm/models/deepseek_v4/quant_config.py `DeepseekV4FP8Config.get_quant_method`). They are not
  decoded and quantized again (a second rounding): `relayout_fp4_experts` renames them into Quark's
  `<m>.weight` U8 / `<m>.weight_scale` U8, the bytes unchanged. FP4 experts in any other layout (another scale block,
  E4M3 scales as NVFP4 has) are refused as already FP4 (AlreadyFp4Error): serve them as they are.
- `int4-pack-quantized` (Kimi-K2-Thinking, Kimi-K2.5): `quant_method == "compressed-tensors"`, format
  `pack-quantized`, weights symmetric INT4 with strategy `group`. Each quantized linear stores `<m>.weight_packed` I32
  [out, ceil(in/8)] (8 values per int32, lowest nibble first, stored as value + 8), `<m>.weight_scale` (BF16) [out,
  in/group] and `<m>.weight_shape` I32/I64 [2]. Decoding replays compressed-tensors 0.17 bit for bit:
  compressed_tensors/compressors/pack_quantized/base.py `PackedQuantizationCompressor.decompress` ->
  pack_quantized/helpers.py `unpack_from_int32` -> quantization/lifecycle/forward.py `dequantize` ->
  forward_helpers.py `_process_group` / `_dequantize` (`x_q.to(scale.dtype) * scale`, per group of columns), and the
  model-free path entrypoints/convert/converters/ct_dequantizer.py `CompressedTensorsDequantizer.process` (result
  `.to(bfloat16)`).

- `fused-experts` (BF16 re-exports of openai/gpt-oss, e.g. what transformers' Mxfp4 dequantization saves): no
  `quantization_config`, model_type `gpt_oss`, experts stored fused per layer as transformers' GptOssExperts holds
  them: `<p>.mlp.experts.gate_up_proj` [E, H, 2I] (gate and up interleaved along 2I), `..._bias` [E, 2I],
  `<p>.mlp.experts.down_proj` [E, I, H], `..._bias` [E, H]. Decoded (exactly: a transpose and a split, no arithmetic)
  into the per-expert layout vLLM's Quark loader for gpt-oss reads (vllm/model_executor/models/gpt_oss.py
  `_load_weights_quark`, "amd-quark format that each expert is separated", e.g.
  amd/gpt-oss-20b-MoE-Quant-W-MXFP4-A-FP8-KV-FP8): `<p>.mlp.experts.<e>.gate_up_proj.weight` [2I, H] (rows in the
  interleaved order vLLM's swigluoai expects), `.bias` [2I], `<p>.mlp.experts.<e>.down_proj.weight` [H, I], `.bias`
  [H]; Quark's own gpt-oss preparation transposes the same way (quark/torch/utils/llm/module_replacement/
  replacement_utils.py `_moe_experts_sync_weights_to_linear`, `if model_type == "gpt_oss": ....t()`). Biases keep
  their stored bytes. Llama-4 (model_type llama4, `language_model.model.layers.N.feed_forward.experts.gate_up_proj`
  [E, H, 2I] with gate and up as halves, `down_proj` [E, I, H], no biases) decodes likewise into
  `feed_forward.experts.<e>.gate_proj.weight` / `up_proj.weight` [I, H] and `down_proj.weight` [H, I], the
  per-expert names vLLM's llama4.py `load_moe_expert_weights` reads when a checkpoint is not fused (its fused path
  splits `chunk(2, dim=-2)` after the same transpose: the same halves). Qwen3.5-MoE (model_type qwen3_5_moe,
  `model.language_model.layers.N.mlp.experts.gate_up_proj` [E, 2I, H], `down_proj` [E, H, I], counted by
  text_config.num_experts) is stored in vLLM's orientation already: split per expert without a transpose into
  `mlp.experts.<e>.gate_proj.weight` (first half of 2I) / `up_proj.weight` / `down_proj.weight`, as vLLM's
  layers/fused_moe/routed_experts.py `RoutedExperts.load_weights` splits the fused tensor; its MTP block's fused
  experts (`mtp.layers.0.mlp.experts.gate_up_proj`, Qwen3.6's layout) are kept as stored (FusedLayout.stored_prefixes).
  SpecForge's Qwen3-MoE EAGLE-3 draft (model_type qwen3_moe, `midlayer.mlp.gate_weight` / `up_weight` [E, I, H],
  `down_weight` [E, H, I]) is split the same way into `midlayer.mlp.experts.<e>.gate_proj / up_proj / down_proj.weight`,
  as SpecForge's SGLang loader splits it (quantkit.naming.archs.eagle3_moe). Each layout is its family record's
  (quantkit.naming.family MoeLayout.fused), handed to detect_format by the caller.
- OpenAI's MXFP4 release (`quant_method: mxfp4`, `*_blocks` / `*_scales`) is refused as `already MXFP4`: its experts
  are MXFP4 already and the rest BF16 (modules_to_not_convert: self_attn, router, embed_tokens, lm_head), the layout
  quantkit's MoE recipes produce, and vLLM loads it natively (vllm/model_executor/layers/quantization/mxfp4.py
  `GptOssMxfp4Config.override_quantization_method` maps it to `gpt_oss_mxfp4`; gpt_oss.py `_load_weights_mxfp4`).
  Requantizing would only add a second rounding; the refusal names the `vllm serve` command instead.

`quantization_config` is looked up where vLLM and compressed-tensors look: top level, then `text_config` (multimodal
wrappers such as Kimi-K2.5), then the legacy `compression_config` (vllm/transformers_utils/
model_arch_config_convertor.py `get_quantization_config`; compressed_tensors/utils/safetensors_load.py
`get_quantization_config`).

Decoded tensors may be requested in float32 instead of BF16 (`decode_tensors(..., dtype=torch.float32)`): that is what
Quark 0.13's own file-to-file path feeds its quantizer (quark/torch/quantization/file2file_quantization.py
`_weight_dequant_fp8` returns the float32 product; `_recover_compressed_tensors_weights` upcasts `weight_scale` to
float32 before `decompress`), so an MXFP4 result byte-identical to Quark's file-to-file output needs float32 input.

Nothing here imports torch at module level; `detect_format`, `decoded_tensor_names`, `decoded_origins` and
`mtp_tensor_names` read names, dtypes and shapes only.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from itertools import compress, repeat
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Literal

from quantkit.errors import CheckpointError, NonFiniteWeightError, QuantkitError
from quantkit.io.config import quantization_config
from quantkit.io.headers import TensorInfo

if TYPE_CHECKING:
    import torch

FormatName = Literal["bf16", "fp8-block", "int4-pack-quantized", "fused-experts"]
FORMAT_NAMES: tuple[FormatName, ...] = ("bf16", "fp8-block", "int4-pack-quantized", "fused-experts")
SUPPORTED_FORMATS = (
    "bf16/fp16/fp32 (no quantization_config), fp8-block (quant_method fp8 with weight_block_size; float or E8M0 "
    "scales, DeepSeek-V4's with OCP-MXFP4 experts), mxfp8 (quant_method mxfp8, E8M0 scales per 1x32), "
    "int4-pack-quantized (compressed-tensors pack-quantized, symmetric INT4, group strategy), fused-experts (BF16 "
    "gpt-oss / Llama-4 / Qwen3.5-MoE with 3-D experts, SpecForge Qwen3-MoE EAGLE-3 drafts' stacked experts)"
)
# Fused 3-D expert tensors (see the module docstring): fused tensor suffix -> the per-expert tensors it decodes to,
# each (module, param, part of the out dimension: "all", "first half", "second half"), plus the layout's orientation:
# `transposed` weights are stored [E, in, out] (gpt-oss, Llama-4) and decoded transposed to vLLM's [out, in]; the
# others are stored [E, out, in] (Qwen3.5-MoE) and decoded as they are. Biases [E, out] are sliced. Which family stores
# which layout is its record's (quantkit.naming.family MoeLayout.fused); the caller hands detect_format the layouts.
FusedPart = tuple[str, str, str]


@dataclass(frozen=True)
class FusedLayout:
    """How one family stores its experts fused: the tensors, their orientation, the config key counting experts."""

    name: str  # for messages and `inspect` (the model_type that stores it: "gpt_oss")
    parts: dict[str, tuple[FusedPart, ...]]
    transposed: bool  # True: weights [E, in, out]; False: [E, out, in], vLLM's own per-expert orientation
    experts_key: str  # text-config key: experts per fused tensor
    # suffix of the per-expert container the parts are written under, in place of the fused tensor's own parent
    # (SpecForge's `mlp.gate_weight` -> `mlp.experts.<e>.gate_proj`); None: the parent (`mlp.experts.gate_up_proj` ->
    # `mlp.experts.<e>.gate_up_proj`)
    container: str | None = None
    # fused tensors under these prefixes are kept as stored, never split: a block no recipe quantizes whose vLLM model
    # loads the fused tensors itself (Qwen3.5's MTP block)
    stored_prefixes: tuple[str, ...] = ()


_FIX = "start from the model's BF16, FP8-block or INT4 pack-quantized release"

# Tensor-name suffixes that carry a source format and never reach the decoded output.
FP8_SCALE_SUFFIX = ".weight_scale_inv"
DSV4_SCALE_SUFFIX = ".scale"  # DeepSeek-V4's own name for a block scale (and for its FP4 experts' E8M0 scales)
MX_BLOCK = 32  # OCP MX: one E8M0 scale per 32 elements along the input dimension
INT4_PARTS = (".weight_packed", ".weight_scale", ".weight_shape")
_FLOAT_DTYPES = ("BF16", "F16", "F32", "F64")
_SCALE_DTYPES = ("F32", "BF16", "F16")
_E8M0_DTYPES = ("U8", "F8_E8M0")  # an E8M0 exponent byte, as MXFP8 (U8) and DeepSeek-V4 (F8_E8M0) store it
_FP4_DTYPES = ("I8", "U8", "F4")  # two E2M1 codes per byte

# Labels for the compressed-tensors formats quantkit refuses (compressed_tensors/config/base.py CompressionFormat).
_CT_FORMAT_LABELS = {
    "nvfp4-pack-quantized": "NVFP4",
    "mxfp4-pack-quantized": "MXFP4",
    "mxfp8-quantized": "MXFP8",
    "float-quantized": "FP8 (float-quantized)",
    "int-quantized": "INT8 (int-quantized)",
    "naive-quantized": "naive-quantized",
    "marlin-24": "2:4-sparse Marlin (marlin-24)",
    "sparse-24-bitmask": "2:4-sparse (sparse-24-bitmask)",
    "sparse-bitmask": "sparse (sparse-bitmask)",
    "dense": "dense",
}
# quant_method values other libraries write, named in the refusal so a user sees what they have.
_METHOD_LABELS = {
    "gptq": "GPTQ", "awq": "AWQ", "bitsandbytes": "bitsandbytes", "mxfp4": "MXFP4 (gpt-oss style)",
    "modelopt": "ModelOpt", "modelopt_fp4": "ModelOpt NVFP4", "fbgemm_fp8": "FBGEMM FP8", "hqq": "HQQ",
    "torchao": "torchao", "gguf": "GGUF", "eetq": "EETQ", "aqlm": "AQLM", "quanto": "quanto", "auto-round": "AutoRound",
    "fp_quant": "FP-Quant", "higgs": "HIGGS", "bitnet": "BitNet", "vptq": "VPTQ", "spqr": "SpQR",
}  # fmt: skip


class UnsupportedSourceFormatError(QuantkitError):
    """config.json declares a quantization format quantkit cannot decode exactly (raised before any tensor is read)."""


class SourceFormatError(CheckpointError):
    """config.json and the tensors disagree, or a quantized tensor's parts are missing or malformed."""


class AlreadyMxfp4Error(UnsupportedSourceFormatError):
    """The source is OpenAI's MXFP4 gpt-oss release: its experts are MXFP4 already and vLLM serves it as it is."""


class AlreadyFp4Error(UnsupportedSourceFormatError):
    """The source's experts are FP4 already in a layout that is not OCP MXFP4: requantizing them would add a second
    rounding; vLLM serves the checkpoint as it is."""


class SplitModuleError(SourceFormatError):
    """A quantized module's parts lie in different shards and no lookup for the missing part was given."""


@dataclass(frozen=True)
class SourceFormat:
    """A checkpoint's storage format, from config.json and its headers.

    `config_key` is where the quantization_config was found ("quantization_config", "text_config.quantization_config",
    "compression_config"), None for bf16. `block_size` is fp8-block's [rows, cols] per scale; `group_size` and
    `num_bits` are INT4's; `ignore` is the config's list of modules it left unquantized (`ignored_layers` /
    `modules_to_not_convert` for fp8, `ignore` for compressed-tensors), kept for provenance: decoding goes by the
    tensors themselves, not by this list. `stored_dtypes` are the safetensors dtypes found in the checkpoint.
    """

    name: FormatName
    config_key: str | None = None
    block_size: tuple[int, int] | None = None
    group_size: int | None = None
    num_bits: int | None = None
    ignore: tuple[str, ...] = ()
    stored_dtypes: tuple[str, ...] = ()
    experts: int | None = None  # fused-experts: experts per fused tensor (config num_local_experts)
    fused: FusedLayout | None = None  # fused-experts: the layout, from the family's record
    method: str | None = None  # fp8-block: the quant_method ("fp8", "mxfp8")
    scale_suffix: str = FP8_SCALE_SUFFIX  # fp8-block: `<m>.weight_scale_inv`, or DeepSeek-V4's `<m>.scale`
    e8m0_scales: bool = False  # fp8-block: scales are E8M0 exponent bytes (U8 / F8_E8M0), not floats
    fp4_experts: int = 0  # fp8-block: DeepSeek-V4 OCP-MXFP4 expert modules, re-laid out without arithmetic

    @property
    def description(self) -> str:
        """One line for `inspect`."""
        if self.name == "fp8-block":
            assert self.block_size is not None
            scales = "E8M0 " if self.e8m0_scales else ""
            label = "MXFP8: " if self.method == "mxfp8" else ""
            fp4 = (
                (
                    f"; {self.fp4_experts} expert linears already OCP MXFP4 (E2M1, E8M0 per 32), re-laid out into "
                    "Quark's layout with their bytes unchanged"
                )
                if self.fp4_experts
                else ""
            )
            return (
                f"{label}FP8 E4M3 weights with {self.block_size[0]}x{self.block_size[1]} {scales}block scales "
                f"({self.scale_suffix.lstrip('.')}, quant_method {self.method or 'fp8'}); decoded to BF16{fp4}"
            )
        if self.name == "fused-experts" and self.fused is not None and self.fused.container is not None:
            stacked = ", ".join(s.lstrip(".") for s in self.fused.parts)
            return (
                f"{self.fused.name} with {self.experts} experts stacked per layer ({stacked} [E, out, in]); "
                "split per expert into mlp.experts.<e>.*, values unchanged"
            )
        if self.name == "fused-experts" and self.fused is not None:
            transposed = self.fused.transposed
            return (
                f"{self.fused.name} with {self.experts} experts fused per layer (experts.gate_up_proj "
                f"{'[E, H, 2I]' if transposed else '[E, 2I, H]'}); split per expert"
                f"{' and transposed' if transposed else ''}, values unchanged"
            )
        if self.name == "int4-pack-quantized":
            return (f"INT4 symmetric, group {self.group_size}, compressed-tensors pack-quantized "
                    f"(weight_packed/weight_scale/weight_shape); decoded to BF16")  # fmt: skip
        return f"unquantized ({', '.join(self.stored_dtypes) or 'no tensors'}); tensors kept as stored"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["description"] = self.description
        return out


# --- config -------------------------------------------------------------------------------------------------------


def _typed(method: str, qcfg: Mapping[str, Any], key: str | None, source: str) -> None:
    """A quantization_config whose keys have the wrong type (`ignored_layers: 7`, a string among config_groups) is a
    broken config.json, refused in one line before anything is decoded (the types: quantkit.io.quant_configs, imported
    only for a quantized source)."""
    from quantkit.io.quant_configs import check_types

    check_types(method, qcfg, key, source, SourceFormatError)


def quantization_config_of(config: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """The quantization config and where it was found, in vLLM's one lookup order (quantkit.io.config
    .quantization_config); an empty one is none, and one that is not an object is refused."""
    value, key = quantization_config(config)
    if not value:
        return None, None
    if not isinstance(value, Mapping):
        raise UnsupportedSourceFormatError(f"config.json {key} is not an object; {_FIX}")
    return dict(value), key


_DTYPE_OF, _DTYPE_SHAPE = itemgetter(1), itemgetter(1, 2)  # of a TensorInfo


def _info(value: Any) -> tuple[str, tuple[int, ...]]:
    """(dtype, shape) from a headers.TensorInfo-like object or a (dtype, shape) pair."""
    if type(value) is TensorInfo:  # from the headers: already a str and a tuple of ints
        return value.dtype, value.shape
    if hasattr(value, "dtype") and hasattr(value, "shape"):
        return str(value.dtype), tuple(int(d) for d in value.shape)
    dtype, shape = value
    return str(dtype), tuple(int(d) for d in shape)


def detect_format(
    config: Mapping[str, Any],
    tensors: Mapping[str, Any],
    *,
    source: str = "config.json",
    fused: Sequence[FusedLayout] = (),
) -> SourceFormat:
    """The checkpoint's SourceFormat, from config.json and its tensors' (dtype, shape), without reading tensor data.

    `tensors` maps every tensor name of the checkpoint (all shards) to a `(dtype, shape)` pair in safetensors dtype
    names ("BF16", "F8_E4M3", "I32", ...) or to an object with `.dtype` and `.shape` (quantkit.io.headers.TensorInfo).
    Raises UnsupportedSourceFormatError for a format quantkit does not decode, and SourceFormatError naming the first
    tensor that contradicts the config (e.g. fp8 config but a weight without weight_scale_inv). `source` names the
    config in messages.
    """
    if set(map(type, tensors.values())) == {TensorInfo}:  # from the headers: (dtype, shape) already typed
        qcfg, key = quantization_config_of(config)
        if qcfg is None and not fused:
            # An unquantized source (the common case) needs only its dtypes and names, checked in C-level passes;
            # the general path below reads the same and names the first offending tensor.
            dtypes = set(map(_DTYPE_OF, tensors.values()))
            if not any(d.startswith("F8_") or d == "F4" for d in dtypes) and not names_ending(
                tensors, (FP8_SCALE_SUFFIX, ".weight_packed")
            ):
                return SourceFormat("bf16", stored_dtypes=tuple(sorted(dtypes)))
        infos = dict(zip(tensors, map(_DTYPE_SHAPE, tensors.values())))
    else:
        infos = {name: _info(v) for name, v in tensors.items()}
        qcfg, key = quantization_config_of(config)
    stored = tuple(sorted(set(map(itemgetter(0), infos.values()))))
    if qcfg is None:
        _check_plain(infos, source)
        inner = config.get("text_config")
        text: Mapping[str, Any] = inner if isinstance(inner, dict) else config
        for layout in fused:
            if any(n.endswith(tuple(layout.parts)) and not n.startswith(layout.stored_prefixes) for n in infos):
                return _fused_experts_format(layout, text, infos, source, stored)
        return SourceFormat("bf16", stored_dtypes=stored)
    where = f"{source} {key}"
    method = str(qcfg.get("quant_method", "")).lower()
    if key == "compression_config" and not method:
        method = "compressed-tensors"  # the legacy key predates quant_method
    if method in ("fp8", "mxfp8"):
        _typed(method, qcfg, key, source)
        fmt = _fp8_format(qcfg, key, where, stored, method, infos, _fp4_experts_declared(config, qcfg))
        _check_fp8(fmt, infos, where)
    elif method == "compressed-tensors":
        _typed("compressed-tensors", qcfg, key, source)
        fmt = _ct_format(qcfg, key, where, stored)
        _check_int4(fmt, infos, where)
    elif method == "mxfp4":  # vLLM's Mxfp4Config loads it as it is
        folder = source.removesuffix("config.json").rstrip("/") or "."
        raise AlreadyMxfp4Error(
            f"{where}: already MXFP4 (quant_method 'mxfp4', gpt-oss *_blocks/*_scales experts; attention, router, "
            f"embeddings and lm_head BF16), the layout an MXFP4 MoE recipe makes and one vLLM loads natively: serve it "
            f"as it is: vllm serve {folder}"
        )
    elif method == "quark":
        raise UnsupportedSourceFormatError(
            f"{where}: quant_method 'quark': the checkpoint is already quantized by Quark; quantize from the source "
            f"checkpoint it was made from (supported: {SUPPORTED_FORMATS})"
        )
    else:
        label = _METHOD_LABELS.get(method)
        what = f"quant_method {method!r}" + (f" ({label})" if label and label.lower() != method else "")
        raise _unsupported(where, what)
    return fmt


def _fused_experts_format(
    layout: FusedLayout,
    text: Mapping[str, Any],
    infos: Mapping[str, tuple[str, tuple[int, ...]]],
    source: str,
    stored: tuple[str, ...],
) -> SourceFormat:
    """The fused-experts format, each fused tensor checked against the layout's expert count (num_local_experts,
    num_experts)."""
    model_type = layout.name
    key = layout.experts_key
    experts = text.get(key)
    if not _positive_int(experts):
        raise SourceFormatError(f"{source}: {model_type} experts are fused but {key} is {experts!r}; fix config.json")
    for name, (dtype, shape) in infos.items():
        suffix = next((s for s in layout.parts if name.endswith(s)), None)
        if suffix is None:
            continue
        want = 2 if layout.parts[suffix][0][1] == "bias" else 3
        halves = layout.parts[suffix][0][2] != "all"
        rows = shape[-1 if layout.transposed else 1] if len(shape) == want == 3 else 0
        if len(shape) != want or shape[0] != experts or dtype not in _FLOAT_DTYPES or (halves and rows % 2):
            raise SourceFormatError(
                f"{name}: {dtype} {list(shape)}, but a fused {model_type} expert tensor is a float "
                f"[{experts}, ...] tensor of {want} dims ({key} {experts}"
                f"{', gate and up halves' if halves else ''}); check that config.json belongs to "
                "these weights"
            )
    assert isinstance(experts, int)
    return SourceFormat("fused-experts", stored_dtypes=stored, experts=experts, fused=layout)


def fused_expert_parts(
    fmt: SourceFormat, name: str, shape: tuple[int, ...]
) -> list[tuple[str, int, str, tuple[int, ...]]]:
    """(per-expert tensor name, expert, part, its shape) for each tensor a fused expert tensor of `shape` decodes to
    (none for other tensors): the plan of `decode_tensors`' fused-experts path, from a header alone."""
    decoded_parts = _fused_parts(fmt, name)
    if not decoded_parts or not fmt.experts:
        return []
    per_expert = len(decoded_parts) // fmt.experts
    assert fmt.fused is not None
    transposed = fmt.fused.transposed
    out = []
    for i, (decoded, part) in enumerate(decoded_parts):
        if decoded.endswith(".bias"):
            out_shape = tuple(shape[1:])
        else:  # [E, in, out] (transposed) or [E, out, in] -> vLLM's [out, in], halves along out
            out_dim, in_dim = (shape[2], shape[1]) if transposed else (shape[1], shape[2])
            out_shape = (out_dim // (1 if part == "all" else 2), in_dim)
        out.append((decoded, i // per_expert, part, out_shape))
    return out


def fused_expert_tensor(
    fmt: SourceFormat, fused: torch.Tensor, expert: int, decoded: str, part: str, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """One per-expert tensor of a fused expert tensor (`fused_expert_parts`): a bias as stored (a view), a weight in
    vLLM's [out, in] (transposed from [in, out] where the layout is transposed) cut to its half; no arithmetic."""
    expert_t = fused[expert]
    if decoded.endswith(".bias"):
        return expert_t
    value = expert_t.t() if fmt.fused is not None and fmt.fused.transposed else expert_t
    half = value.shape[0] // 2
    value = {"all": value, "first half": value[:half], "second half": value[half:]}[part].contiguous()
    return value if dtype is None else value.to(dtype)


def _fused_parts(fmt: SourceFormat, name: str) -> list[tuple[str, str]]:
    """(per-expert tensor name, part) a fused expert tensor decodes to, expert by expert (none for other tensors)."""
    layout = fmt.fused
    suffix = next((s for s in layout.parts if name.endswith(s)), None) if layout is not None else None
    if layout is None or suffix is None or fmt.experts is None or name.startswith(layout.stored_prefixes):
        return []
    container = name[: -len(suffix)] + (layout.container or suffix.rsplit(".", 1)[0])
    return [
        (f"{container}.{e}.{module}.{param}", part)
        for e in range(fmt.experts)
        for module, param, part in layout.parts[suffix]
    ]


def _unsupported(where: str, what: str) -> UnsupportedSourceFormatError:
    return UnsupportedSourceFormatError(
        f"{where}: {what} is not a supported source format; supported: {SUPPORTED_FORMATS}; {_FIX}"
    )


def _check_plain(infos: Mapping[str, tuple[str, tuple[int, ...]]], source: str) -> None:
    for name, (dtype, _) in infos.items():
        if dtype.startswith("F8_") or dtype == "F4" or name.endswith((FP8_SCALE_SUFFIX, ".weight_packed")):
            raise SourceFormatError(
                f"{source} has no quantization_config, but tensor {name} is {dtype} (a quantized checkpoint's "
                f"tensor); restore the checkpoint's config.json or use an unquantized checkpoint"
            )


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _fp8_format(
    qcfg: Mapping[str, Any],
    key: str | None,
    where: str,
    stored: tuple[str, ...],
    method: str,
    infos: Mapping[str, tuple[str, tuple[int, ...]]],
    fp4_declared: bool,
) -> SourceFormat:
    fmt = str(qcfg.get("fmt") or "e4m3").lower()
    if "e4m3" not in fmt:
        raise _unsupported(where, f"FP8 fmt {fmt!r}")
    block = qcfg.get("weight_block_size")
    if block is None and method == "mxfp8":
        block = [1, MX_BLOCK]  # the OCP MX block vLLM's MXFP8 path assumes (mxfp8_utils.py MXFP8_BLOCK_SIZE)
    if block is None:
        raise _unsupported(where, "per-tensor FP8 (quant_method fp8 without weight_block_size)")
    if not (isinstance(block, (list, tuple)) and len(block) == 2 and all(_positive_int(b) for b in block)):
        raise _unsupported(where, f"FP8 weight_block_size {block!r} (expected two positive integers)")
    if method == "mxfp8" and list(block) != [1, MX_BLOCK]:
        raise _unsupported(where, f"MXFP8 with weight_block_size {list(block)} (OCP MXFP8 is [1, {MX_BLOCK}])")
    ignore = qcfg.get("ignored_layers") or qcfg.get("modules_to_not_convert") or ()  # vllm fp8.py Fp8Config.from_config
    # DeepSeek-V4 names a block scale `<m>.scale`; every other release `<m>.weight_scale_inv`.
    dsv4 = not names_ending(infos, (FP8_SCALE_SUFFIX,)) and bool(names_ending(infos, (DSV4_SCALE_SUFFIX,)))
    suffix = DSV4_SCALE_SUFFIX if dsv4 else FP8_SCALE_SUFFIX
    e8m0 = method == "mxfp8" or any(
        infos[n][0] in _E8M0_DTYPES
        for n in names_ending(infos, (suffix,))
        if infos.get(_scaled_weight(suffix, n), ("",))[0] == "F8_E4M3"
    )
    fp4 = _fp4_expert_modules(infos, suffix, where) if (fp4_declared or dsv4) else []
    return SourceFormat("fp8-block", key, block_size=(int(block[0]), int(block[1])), ignore=tuple(ignore),
                        stored_dtypes=stored, method=method, scale_suffix=suffix, e8m0_scales=e8m0,
                        fp4_experts=len(fp4))  # fmt: skip


def _scaled_weight(suffix: str, scale_name: str) -> str:
    """The weight a block scale belongs to: `x.weight` for `x.weight_scale_inv` and for DeepSeek-V4's `x.scale`."""
    return scale_name[: -len(suffix)] + ".weight" if suffix == DSV4_SCALE_SUFFIX else scale_name[: -len("_scale_inv")]


def scaled_weight_of(fmt: SourceFormat, scale_name: str) -> str:
    """The weight whose block scale is `scale_name` (a name ending in fmt.scale_suffix)."""
    return _scaled_weight(fmt.scale_suffix, scale_name)


def fp8_scale_name(fmt: SourceFormat, weight_name: str) -> str:
    """The block scale of FP8 weight `x.weight` in this checkpoint: `x.weight_scale_inv`, or DeepSeek-V4's `x.scale`."""
    if fmt.scale_suffix == DSV4_SCALE_SUFFIX:
        return weight_name[: -len(".weight")] + DSV4_SCALE_SUFFIX
    return weight_name + "_scale_inv"


def _fp4_experts_declared(config: Mapping[str, Any], qcfg: Mapping[str, Any]) -> bool:
    """DeepSeek-V4's `expert_dtype: "fp4"`: top level, in text_config or in quantization_config, where vLLM and
    DeepSeek's own loaders read it (vllm/transformers_utils/configs/deepseek_v41.py copies it from the latter)."""
    text = config.get("text_config")
    places = (config, text if isinstance(text, Mapping) else {}, qcfg)
    return any(str(p.get("expert_dtype", "")).lower() == "fp4" for p in places)


def _fp4_expert_modules(infos: Mapping[str, tuple[str, tuple[int, ...]]], suffix: str, where: str) -> list[str]:
    """The modules whose `.weight` is packed FP4 beside a scale; each checked to be OCP MXFP4 (E2M1 two per byte, one
    E8M0 scale per 32 along the input dimension) or refused as already FP4 (AlreadyFp4Error)."""
    out = []
    for name, (dtype, shape) in infos.items():
        if dtype not in _FP4_DTYPES or not name.endswith(".weight") or len(shape) != 2:
            continue
        scale_name = name[: -len(".weight")] + suffix if suffix == DSV4_SCALE_SUFFIX else name + "_scale_inv"
        scale = infos.get(scale_name)
        if scale is None:
            continue  # a plain integer tensor, not a quantized module
        rows, packed = shape
        mx = [rows, math.ceil(packed * 2 / MX_BLOCK)]
        if scale[0] not in _E8M0_DTYPES or list(scale[1]) != mx:
            raise AlreadyFp4Error(
                f"{where}: {name} is packed FP4 ({dtype} {list(shape)}) with {scale_name} {scale[0]} "
                f"{list(scale[1])}, not OCP MXFP4 (E8M0 {mx}: one scale per {MX_BLOCK}); already FP4: serve it as it "
                "is with vLLM, or start from the model's BF16 release"
            )
        out.append(name[: -len(".weight")])
    return out


def _ct_format(qcfg: Mapping[str, Any], key: str | None, where: str, stored: tuple[str, ...]) -> SourceFormat:
    if qcfg.get("sparsity_config"):
        raise _unsupported(where, "sparse compressed-tensors (sparsity_config)")
    if qcfg.get("transform_config"):
        # Rotated (SpinQuant/QuIP-style) weights decode to the rotated basis, not the model's weights.
        raise _unsupported(where, "compressed-tensors with transform_config (rotated weights)")
    groups = qcfg.get("config_groups") or {}
    if not isinstance(groups, Mapping) or not groups:
        raise _unsupported(where, "compressed-tensors without config_groups")
    top = qcfg.get("format")
    group_sizes = set()
    for gname, group in groups.items():
        gfmt = (group.get("format") if isinstance(group, Mapping) else None) or top
        if gfmt != "pack-quantized":
            label = _CT_FORMAT_LABELS.get(str(gfmt))
            what = f"compressed-tensors format {gfmt!r}" + (f" ({label})" if label and label != gfmt else "")
            raise _unsupported(where, what + (f" in config_groups.{gname}" if gfmt != top else ""))
        w = group.get("weights")
        if not isinstance(w, Mapping):
            raise _unsupported(where, f"compressed-tensors config_groups.{gname} without weights")
        wtype, bits = str(w.get("type", "int")), w.get("num_bits")
        if wtype != "int":
            raise _unsupported(where, f"pack-quantized {wtype} weights (num_bits {bits})")
        if bits != 4:
            raise _unsupported(where, f"INT{bits} pack-quantized weights")
        if not w.get("symmetric", True):
            raise _unsupported(where, "asymmetric INT4 (symmetric: false, weight_zero_point)")
        if w.get("strategy") != "group":
            raise _unsupported(where, f"INT4 with strategy {w.get('strategy')!r} (only 'group' is supported)")
        if w.get("actorder") == "group":
            raise _unsupported(where, "INT4 with actorder 'group' (weight_g_idx)")
        if group.get("input_activations"):
            raise _unsupported(where, "INT4 weights with quantized activations (input_activations)")
        gs = w.get("group_size")
        if not isinstance(gs, int) or not _positive_int(gs):
            raise _unsupported(where, f"INT4 group_size {gs!r}")
        group_sizes.add(gs)
    if len(group_sizes) != 1:
        raise _unsupported(where, f"INT4 config_groups with different group sizes {sorted(group_sizes)}")
    return SourceFormat("int4-pack-quantized", key, group_size=group_sizes.pop(), num_bits=4,
                        ignore=tuple(qcfg.get("ignore") or ()), stored_dtypes=stored)  # fmt: skip


def _check_fp8(fmt: SourceFormat, infos: Mapping[str, tuple[str, tuple[int, ...]]], where: str) -> None:
    assert fmt.block_size is not None
    bn, bk = fmt.block_size
    suffix = fmt.scale_suffix
    scale_dtypes, scale_kind = (_E8M0_DTYPES, "E8M0 (U8 or F8_E8M0)") if fmt.e8m0_scales else (_SCALE_DTYPES, "F32")
    found = False
    for name, (dtype, shape) in infos.items():
        if dtype == "F8_E4M3":
            if not name.endswith(".weight") or len(shape) != 2:
                raise SourceFormatError(f"{where}: tensor {name} is F8_E4M3 {list(shape)} but not a 2-D .weight; "
                                        f"the checkpoint does not match its fp8-block config")  # fmt: skip
            scale_name = fp8_scale_name(fmt, name)
            scale = infos.get(scale_name)
            if scale is None:
                raise SourceFormatError(f"{where}: {name} is F8_E4M3 but {scale_name} is missing; the checkpoint "
                                        f"is incomplete or not fp8-block, re-download it")  # fmt: skip
            want = [math.ceil(shape[0] / bn), math.ceil(shape[1] / bk)]
            if scale[0] not in scale_dtypes or list(scale[1]) != want:
                raise SourceFormatError(
                    f"{where}: {scale_name} is {scale[0]} {list(scale[1])}, expected {scale_kind} {want} for {name} "
                    f"{list(shape)} with weight_block_size [{bn}, {bk}]; the checkpoint does not match its config"
                )
            found = True
        elif name.endswith(suffix):
            weight_name = _scaled_weight(suffix, name)
            weight = infos.get(weight_name)
            if weight is None or weight[0] not in ("F8_E4M3", *(_FP4_DTYPES if fmt.fp4_experts else ())):
                what = "F8_E4M3 weight" + (" (or packed FP4 expert weight)" if fmt.fp4_experts else "")
                raise SourceFormatError(f"{where}: {name} has no {what} {weight_name} beside it; the checkpoint does "
                                        f"not match its fp8-block config")  # fmt: skip
        elif dtype.startswith("F8_") or dtype == "F4":
            raise SourceFormatError(f"{where}: tensor {name} is {dtype}, neither an F8_E4M3 weight nor a block scale "
                                    f"named *{suffix} beside one; the checkpoint does not match its fp8-block "
                                    "config")  # fmt: skip
        elif name.endswith(".input_scale"):
            raise SourceFormatError(f"{where}: tensor {name} is a static activation scale, which fp8-block "
                                    f"checkpoints (activation_scheme dynamic) do not have")  # fmt: skip
    if not found:
        raise SourceFormatError(f"{where} says {fmt.method or 'fp8'}, but no F8_E4M3 weight with {suffix.lstrip('.')} "
                                f"is in the checkpoint; the config does not match the weights")  # fmt: skip


def _check_int4(fmt: SourceFormat, infos: Mapping[str, tuple[str, tuple[int, ...]]], where: str) -> None:
    assert fmt.group_size is not None
    found = False
    for name, (dtype, shape) in infos.items():
        module, _, suffix = name.rpartition(".")
        if suffix == "weight_packed":
            if dtype != "I32" or len(shape) != 2:
                raise SourceFormatError(f"{where}: {name} is {dtype} {list(shape)}, expected 2-D I32 (8 INT4 values "
                                        f"per int32); the checkpoint does not match its config")  # fmt: skip
            scale, wshape = infos.get(f"{module}.weight_scale"), infos.get(f"{module}.weight_shape")
            if scale is None or wshape is None:
                missing = f"{module}.weight_scale" if scale is None else f"{module}.weight_shape"
                raise SourceFormatError(f"{where}: {name} has no {missing}; the checkpoint is incomplete, "
                                        f"re-download it")  # fmt: skip
            groups = math.ceil(shape[1] * 8 / fmt.group_size)
            if scale[0] not in _SCALE_DTYPES or len(scale[1]) != 2 or scale[1][0] != shape[0] or scale[1][1] != groups:
                raise SourceFormatError(
                    f"{where}: {module}.weight_scale is {scale[0]} {list(scale[1])}, expected [{shape[0]}, {groups}] "
                    f"for {name} {list(shape)} with group_size {fmt.group_size}; the checkpoint does not match its "
                    f"config"
                )
            if wshape[0] not in ("I32", "I64") or list(wshape[1]) != [2]:
                raise SourceFormatError(f"{where}: {module}.weight_shape is {wshape[0]} {list(wshape[1])}, expected "
                                        f"I32 or I64 [2]")  # fmt: skip
            if f"{module}.weight" in infos:
                raise SourceFormatError(f"{where}: both {module}.weight and {name} are stored; the checkpoint is "
                                        f"ambiguous")  # fmt: skip
            found = True
        elif suffix in ("weight_scale", "weight_shape"):
            if f"{module}.weight_packed" not in infos:
                raise SourceFormatError(f"{where}: {name} has no {module}.weight_packed beside it; the checkpoint "
                                        f"does not match its pack-quantized config")  # fmt: skip
        elif suffix in ("weight_zero_point", "weight_g_idx"):
            raise SourceFormatError(f"{where}: tensor {name} ({suffix}) is not part of symmetric INT4 without "
                                    f"activation ordering; the checkpoint does not match its config")  # fmt: skip
        elif dtype.startswith("F8_") or dtype == "F4":
            raise SourceFormatError(f"{where}: tensor {name} is {dtype}; a pack-quantized INT4 checkpoint keeps "
                                    f"unquantized tensors in BF16/FP16/FP32")  # fmt: skip
    if not found:
        raise SourceFormatError(f"{where} says pack-quantized, but no .weight_packed tensor is in the checkpoint; "
                                f"the config does not match the weights")  # fmt: skip


# --- names --------------------------------------------------------------------------------------------------------


def names_ending(names: Collection[str], suffixes: tuple[str, ...]) -> list[str]:
    """The names that end with one of `suffixes`, in their order.

    The names joined by newlines are searched first: a name ending so puts `suffix` + newline in that text (or ends
    it), so where none is found (the usual case) no name is looked at one by one; a name holding a newline can only
    make a match that the exact pass then settles. Several suffixes sharing a beginning are first searched for that
    alone (one search of the ~3 MB of a Kimi-K2.5 index's names instead of one per suffix)."""
    text = "\n".join(names)
    shared = os.path.commonprefix(suffixes)  # what every suffix holds (".weight_" for FP8 scales and INT4 packs)
    if len(suffixes) > 1 and shared and shared not in text:  # one search instead of one per suffix
        return []
    if not any(s + "\n" in text or text.endswith(s) for s in suffixes):
        return []
    return list(compress(names, map(str.endswith, names, repeat(suffixes))))


def names_starting(names: Collection[str], prefixes: tuple[str, ...]) -> list[str]:
    """The names that start with one of `prefixes`, in their order (searched like `names_ending`)."""
    text = "\n".join(names)
    if not any(text.startswith(p) or "\n" + p in text for p in prefixes):
        return []
    return list(compress(names, map(str.startswith, names, repeat(prefixes))))


def _primary_of(fmt: SourceFormat, name: str) -> str | None:
    """For a secondary part (scale, shape), the name of the part that anchors its module; None otherwise."""
    if fmt.name == "fp8-block" and name.endswith(fmt.scale_suffix):
        return _scaled_weight(fmt.scale_suffix, name)
    if fmt.name == "int4-pack-quantized" and name.endswith((".weight_scale", ".weight_shape")):
        return name.rpartition(".")[0] + ".weight_packed"
    return None


def _parts_of(fmt: SourceFormat, name: str, present: Callable[[str], bool]) -> tuple[str, list[str]] | None:
    """(decoded name, source parts) when `name` anchors a quantized module, else None."""
    if fmt.name == "fp8-block" and name.endswith(".weight") and present(fp8_scale_name(fmt, name)):
        return name, [name, fp8_scale_name(fmt, name)]
    if fmt.name == "int4-pack-quantized" and name.endswith(".weight_packed"):
        module = name[: -len(".weight_packed")]
        return module + ".weight", [name, module + ".weight_scale", module + ".weight_shape"]
    return None


def decoded_tensor_names(fmt: SourceFormat, names: Iterable[str]) -> dict[str, list[str]]:
    """Decoded tensor name -> the source tensors it is made from, for a whole checkpoint's (or one shard's) names.

    Kept tensors map to themselves (`{n: [n]}`); `x.weight` <- [`x.weight`, `x.weight_scale_inv`] for fp8-block;
    `x.weight` <- [`x.weight_packed`, `x.weight_scale`, `x.weight_shape`] for INT4. Order follows `names`, each decoded
    tensor at its anchor's place. Raises SourceFormatError for a part whose module is incomplete in `names` (give all
    of a checkpoint's names for a plan; for one shard, `decode_tensors` handles modules split across shards).
    """
    names = list(names)
    present = set(names)
    out: dict[str, list[str]] = {}
    for name in names:
        if fmt.name == "fused-experts":
            for decoded, _ in _fused_parts(fmt, name) or [(name, "all")]:
                out[decoded] = [name]
            continue
        parts = _parts_of(fmt, name, present.__contains__)
        if parts is not None:
            missing = [p for p in parts[1] if p not in present]
            if missing:
                raise SourceFormatError(f"{name} has no {missing[0]} among the given tensor names; give every "
                                        f"tensor name of the checkpoint")  # fmt: skip
            out[parts[0]] = parts[1]
        elif (anchor := _primary_of(fmt, name)) is not None:
            if anchor not in present:
                raise SourceFormatError(f"{name} has no {anchor} among the given tensor names; give every tensor "
                                        f"name of the checkpoint")  # fmt: skip
        else:
            out[name] = [name]
    return out


def decoded_origins(fmt: SourceFormat, names: Iterable[str]) -> dict[str, str]:
    """Decoded tensor name -> where its values come from, for provenance: the format name ("fp8-block",
    "int4-pack-quantized") for decoded weights, "stored" for tensors kept as they are in the source."""
    return origins_of(fmt, decoded_tensor_names(fmt, names))


def origins_of(fmt: SourceFormat, decoded: Mapping[str, list[str]]) -> dict[str, str]:
    """`decoded_origins` from a `decoded_tensor_names` result already at hand."""
    return {name: (fmt.name if parts != [name] else "stored") for name, parts in decoded.items()}


# --- decoding -----------------------------------------------------------------------------------------------------


def decode_tensors(
    fmt: SourceFormat,
    tensors: Mapping[str, torch.Tensor],
    *,
    lookup: Callable[[str], torch.Tensor] | None = None,
    dtype: torch.dtype | None = None,
) -> dict[str, torch.Tensor]:
    """One shard's tensors with every quantized module decoded: a new dict, the input left untouched.

    Decoded weights are `dtype` (default torch.bfloat16; torch.float32 gives the unrounded products Quark's own
    file-to-file path quantizes from) under the module's `.weight` name; their source parts (weight_scale_inv,
    weight_packed, weight_scale, weight_shape) are gone. Every other tensor is passed through as the very same object
    (same bytes, same dtype: an F32 router stays F32). Order follows the shard, each decoded weight at its anchor's
    place (`.weight` for fp8-block, `.weight_packed` for INT4).

    Modules split across shards: a module is decoded in the shard that holds its anchor. A missing part of it is
    fetched with `lookup(name)` (e.g. a reader over the whole checkpoint, as DeepSeek's fp8_cast_bf16.py does); parts
    whose anchor lives in another shard are dropped when `lookup` is given (that shard decodes them). Without
    `lookup`, either case raises SplitModuleError naming the module.

    Raises NonFiniteWeightError naming the tensor and the first NaN/Inf index of a decoded weight, SourceFormatError
    for parts whose dtype or shape do not fit the format.
    """
    import torch

    out_dtype = torch.bfloat16 if dtype is None else dtype
    if fmt.name == "bf16":
        return dict(tensors)
    out: dict[str, torch.Tensor] = {}
    if fmt.name == "fused-experts":
        for name, tensor in tensors.items():
            decoded_parts = _fused_parts(fmt, name)
            if not decoded_parts:
                out[name] = tensor
            for decoded, expert, part, _shape in fused_expert_parts(fmt, name, tuple(tensor.shape)):
                out[decoded] = fused_expert_tensor(
                    fmt, tensor, expert, decoded, part, None if dtype is None else out_dtype
                )
        return out
    for name, tensor in tensors.items():
        if fmt.name == "fp8-block":
            # An FP8 weight anchors its module even when its scale is in another shard (lookup or SplitModuleError);
            # a non-E4M3 weight, or a BF16 one beside a scale_inv, is refused by _decode_fp8_block.
            is_fp8 = tensor.is_floating_point() and tensor.element_size() == 1
            scale_name = fp8_scale_name(fmt, name) if name.endswith(".weight") else ""
            anchored = name.endswith(".weight") and (is_fp8 or scale_name in tensors)
            parts = (name, [name, scale_name]) if anchored else None
        else:
            parts = _parts_of(fmt, name, tensors.__contains__)
        if parts is not None:
            decoded, sources = parts
            values = [tensors[p] if p in tensors else _fetch(p, decoded, lookup) for p in sources]
            if fmt.name == "fp8-block" and _is_packed_fp4(values[0]):
                out.update(relayout_fp4_experts(decoded, values[0], values[1]))
                continue
            if fmt.name == "fp8-block":
                result = _decode_fp8_block(decoded, values[0], values[1], fmt, out_dtype)
            else:
                result = _decode_int4(decoded, values[0], values[1], values[2], fmt, out_dtype)
            _check_finite(decoded, result, sources)
            out[decoded] = result
            continue
        anchor = _primary_of(fmt, name)
        if anchor is not None:
            if anchor in tensors:
                continue  # consumed by its anchor
            if lookup is None:
                raise SplitModuleError(f"{name} is in this shard but {anchor} is not; decode with a lookup over the "
                                       f"whole checkpoint (decode_tensors(..., lookup=...))")  # fmt: skip
            continue  # decoded with its anchor's shard
        out[name] = tensor
    return out


def decode_module(
    fmt: SourceFormat,
    name: str,
    parts: list[torch.Tensor],
    *,
    dtype: torch.dtype | None = None,
    check_finite: bool = True,
) -> torch.Tensor:
    """One quantized module's decoded weight `name` from its parts in `decoded_tensor_names` order (FP8-block:
    weight, weight_scale_inv; INT4: weight_packed, weight_scale, weight_shape), on the parts' device: the very
    arithmetic of `decode_tensors`, so a GPU decode is bit-exact with the CPU one (elementwise IEEE products, one
    rounding). `check_finite=False` leaves the NaN/Inf test to the caller (a GPU caller batches it)."""
    import torch

    out_dtype = torch.bfloat16 if dtype is None else dtype
    if fmt.name == "fp8-block":
        result = _decode_fp8_block(name, parts[0], parts[1], fmt, out_dtype)
        sources = [name, fp8_scale_name(fmt, name)]
    elif fmt.name == "int4-pack-quantized":
        result = _decode_int4(name, parts[0], parts[1], parts[2], fmt, out_dtype)
        module = name.removesuffix(".weight")
        sources = [module + p for p in INT4_PARTS]
    else:
        raise SourceFormatError(f"{name}: format {fmt.name} has no quantized modules to decode")
    if check_finite:
        _check_finite(name, result, sources)
    return result


def _fetch(part: str, decoded: str, lookup: Callable[[str], torch.Tensor] | None) -> torch.Tensor:
    if lookup is None:
        raise SplitModuleError(f"{decoded}: {part} is not in this shard; decode with a lookup over the whole "
                               f"checkpoint (decode_tensors(..., lookup=...))")  # fmt: skip
    try:
        return lookup(part)
    except KeyError:
        raise SourceFormatError(f"{decoded}: {part} is in no shard of the checkpoint; re-download it") from None


def _decode_fp8_block(
    name: str, weight: torch.Tensor, scale_inv: torch.Tensor, fmt: SourceFormat, out_dtype: torch.dtype
) -> torch.Tensor:
    import torch

    assert fmt.block_size is not None
    bn, bk = fmt.block_size
    if weight.dtype != torch.float8_e4m3fn or weight.ndim != 2:
        raise SourceFormatError(f"{name} is {weight.dtype} {list(weight.shape)}, expected 2-D float8_e4m3fn")
    rows, cols = weight.shape
    want = [math.ceil(rows / bn), math.ceil(cols / bk)]
    e8m0 = scale_inv.dtype in (torch.uint8, torch.float8_e8m0fnu)
    if list(scale_inv.shape) != want or not (e8m0 or scale_inv.is_floating_point()):
        raise SourceFormatError(f"{fp8_scale_name(fmt, name)} is {scale_inv.dtype} {list(scale_inv.shape)}, expected "
                                f"float32 or E8M0 {want} for weight_block_size [{bn}, {bk}]")  # fmt: skip
    if e8m0:
        scale_inv = e8m0_to_float32(scale_inv)
    # float32(w) * float32(scale) per element, one rounding to out_dtype: DeepSeek weight_dequant_kernel, vLLM
    # scaled_dequantize / block_dequant, compressed-tensors FP8BlockDequantizer. Scales are expanded along columns
    # only and applied one row block at a time, so no weight-sized scale tensor is built.
    result = weight.to(torch.float32)
    col_scales = scale_inv.to(torch.float32).repeat_interleave(bk, dim=1)[:, :cols]
    for i in range(want[0]):
        result[i * bn : (i + 1) * bn].mul_(col_scales[i])
    return result if out_dtype == torch.float32 else result.to(out_dtype)


def e8m0_to_float32(scale: torch.Tensor) -> torch.Tensor:
    """E8M0 exponent bytes (uint8 or float8_e8m0fnu) as float32 2**(byte - 127); 255 is NaN (OCP MX spec), so a
    decoded block under it is refused as non-finite. The powers of two are exact in float32 (2**-127 is subnormal)."""
    import torch

    codes = scale.view(torch.uint8) if scale.dtype == torch.float8_e8m0fnu else scale
    values = torch.exp2(codes.to(torch.float32) - 127.0)
    return torch.where(codes == 255, torch.full_like(values, float("nan")), values)


def _is_packed_fp4(weight: torch.Tensor) -> bool:
    import torch

    return weight.dtype in (torch.int8, torch.uint8) or str(weight.dtype) == "torch.float4_e2m1fn_x2"


def relayout_fp4_experts(name: str, weight: torch.Tensor, scale: torch.Tensor) -> dict[str, torch.Tensor]:
    """DeepSeek-V4's OCP-MXFP4 expert `name` (`x.weight` packed E2M1 [out, in/2], its E8M0 `x.scale` [out, in/32]) in
    Quark 0.13's MXFP4 layout: `x.weight` uint8 [out, in/2] (low nibble first) and `x.weight_scale` uint8 [out, in/32].
    Both are byte views of the stored tensors: no arithmetic, so no second rounding. SourceFormatError where the
    shapes are not MXFP4's."""
    import torch

    packed = weight.view(torch.uint8)
    codes = scale.view(torch.uint8)
    if (
        packed.ndim != 2
        or codes.ndim != 2
        or list(codes.shape) != [packed.shape[0], math.ceil(packed.shape[1] * 2 / MX_BLOCK)]
    ):
        raise SourceFormatError(
            f"{name}: packed FP4 {list(packed.shape)} with scale {list(codes.shape)} is not OCP "
            f"MXFP4 (one E8M0 scale per {MX_BLOCK} values); re-download the checkpoint"
        )
    return {name: packed, name + "_scale": codes}


def _decode_int4(
    name: str, packed: torch.Tensor, scale: torch.Tensor, shape: torch.Tensor, fmt: SourceFormat,
    out_dtype: torch.dtype,
) -> torch.Tensor:  # fmt: skip
    import torch

    assert fmt.group_size is not None
    gs = fmt.group_size
    dims = [int(v) for v in shape.reshape(-1).tolist()]
    if packed.dtype != torch.int32 or packed.ndim != 2 or len(dims) != 2:
        raise SourceFormatError(f"{name}: weight_packed {packed.dtype} {list(packed.shape)} with weight_shape {dims} "
                                f"is not a 2-D int32 packing of a 2-D weight")  # fmt: skip
    rows, cols = dims
    if list(packed.shape) != [rows, math.ceil(cols / 8)]:
        raise SourceFormatError(f"{name}: weight_packed is {list(packed.shape)}, expected [{rows}, "
                                f"{math.ceil(cols / 8)}] for weight_shape {dims}")  # fmt: skip
    if cols % gs:
        # compressed-tensors refuses it too (quantization/lifecycle/forward_helpers.py _process_group).
        raise SourceFormatError(f"{name}: {cols} input columns are not a multiple of group_size {gs}")
    if list(scale.shape) != [rows, cols // gs] or not scale.is_floating_point():
        raise SourceFormatError(f"{name}: weight_scale is {scale.dtype} {list(scale.shape)}, expected "
                                f"[{rows}, {cols // gs}] floating point")  # fmt: skip
    # unpack_from_int32: value i of an int32 is bits [4i, 4i+4), stored as q + 8.
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)
    q = ((packed.unsqueeze(-1) >> shifts) & 0xF).reshape(rows, -1)[:, :cols] - 8
    # _dequantize: x_q.to(scale.dtype) * scale (the product's dtype is the scale's); float32 on request, as Quark's
    # file-to-file path upcasts the scale first.
    compute = torch.float32 if out_dtype == torch.float32 else scale.dtype
    values = q.to(compute).view(rows, cols // gs, gs) * scale.to(compute).unsqueeze(-1)
    return values.reshape(rows, cols).to(out_dtype)


def _check_finite(name: str, tensor: torch.Tensor, sources: list[str]) -> None:
    import torch

    bad = ~torch.isfinite(tensor)
    if bool(bad.any()):
        index = tuple(int(i) for i in bad.nonzero()[0].tolist())
        raise NonFiniteWeightError(
            f"{name}: decoded value at index {list(index)} is {float(tensor[index])} (from {', '.join(sources[:2])}); "
            f"the source checkpoint is corrupt, re-download it"
        )


# --- model views --------------------------------------------------------------------------------------------------


def mtp_tensor_names(
    text: Mapping[str, Any],
    names: Iterable[str],
    *,
    count_keys: Sequence[str],
    prefix: str = "",
    stored_prefix: str | None = None,
) -> list[str]:
    """Names of the multi-token-prediction layers' tensors, as the family's record places them (its caller,
    quantkit.naming.archs.mtp_tensor_names, hands the record's facts): under `stored_prefix` when the family keeps its
    MTP block apart (Qwen3-Next's and Qwen3.5's `mtp.`), else `{prefix}model.layers.{L+i}.*` for i < the first
    positive `count_keys` value of the text config `text` (DeepSeek-V3's num_nextn_predict_layers, MiniMax-M2's
    num_mtp_modules), L = num_hidden_layers, `prefix` the wrapper's text-model prefix.

    vLLM never loads them into the target model: DeepseekV2Model.load_weights skips every weight for which
    get_spec_layer_idx_from_weight_name (vllm/model_executor/models/utils.py) returns a layer (deepseek_v2.py,
    `if spec_layer is not None: continue  # skip spec decode layers for main model`), and MiniMaxM2Model maps
    `layers.{L+i}.` to None (minimax_m2.py __init__). They are read only by the MTP draft model (DeepSeekMTP).
    Qwen3-Next and Qwen3.5 store theirs under a top-level `mtp.` (mtp.fc, mtp.layers.0.*), which their
    hf_to_vllm_mapper drops ({"mtp.": None}: qwen3_next.py Qwen3NextForCausalLM, qwen3_5.py) and qwen3_next_mtp.py /
    qwen3_5_mtp.py load.
    """
    names = list(names)
    if stored_prefix is not None:
        return names_starting(names, (stored_prefix,))
    n = next((v for v in (text.get(k) for k in count_keys) if isinstance(v, int) and v > 0), 0)
    if n <= 0:
        return []
    base = text.get("num_hidden_layers")
    if isinstance(base, bool) or not isinstance(base, int) or base < 1:
        raise SourceFormatError(
            f"config.json has {str(n)[:40]} MTP layer(s) but no valid num_hidden_layers "
            f"({str(base)[:40]!r}) to number them from; fix config.json"
        )
    # The layers STORED in [base, base + n), never a loop over the configured count: `num_nextn_predict_layers:
    # 10000000` over one stored MTP layer is that one layer, found at once (issue 35 item 5).
    head = f"{prefix}model.layers."
    stored = {
        int(part)
        for part in {name[len(head) :].partition(".")[0] for name in names_starting(names, (head,))}
        if part.isascii() and part.isdigit() and len(part) < 10
    }
    starts = tuple(f"{head}{i}." for i in sorted(stored) if base <= i < base + n)
    return names_starting(names, starts) if starts else []
