"""config.json as vLLM reads it: the types of the keys quantkit reads, the text model of multimodal wrappers, layer
counts, the dtype of unquantized layers, attention head counts, the longest sequence a model holds (max_model_len),
and an EAGLE-3 draft's config (draft_config, the one reader of it).
Pure functions of the parsed dict; no I/O (the folder reader is quantkit.io.headers.read_config)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from quantkit.errors import CheckpointError

# --- the keys quantkit reads, typed --------------------------------------------------------------------------------

PositiveInt = Annotated[int, Field(ge=1)]
Count = Annotated[int, Field(ge=0)]
# vLLM compares these with min() and multiplies them by a RoPE factor: any positive finite number (some configs
# write model_max_length as a float; a strict float takes JSON integers too).
Length = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class _Typed(BaseModel):
    # strict: "4" is not 4, 4.0 is not 4 and true is not 1; extra keys are the model's own business.
    model_config = ConfigDict(extra="allow", strict=True, protected_namespaces=())


class EagleConfig(_Typed):
    eagle_aux_hidden_state_layer_ids: list[int] | None = None
    use_aux_hidden_state: bool | None = None


class ModelConfig(_Typed):
    """The config.json keys quantkit reads (naming, formats, check, deploy, acceptance), each with its type. Every key is
    optional (a missing one is a missing fact, reported where it is needed); a present one must have its type.
    Values within a type (an aux layer id beyond the target) are the checks' business, with their own findings."""

    architectures: list[str] | None = None
    model_type: str | None = None
    speculators_model_type: str | None = None
    torch_dtype: str | None = None
    dtype: str | None = None
    num_hidden_layers: PositiveInt | None = None
    hidden_size: PositiveInt | None = None
    intermediate_size: PositiveInt | None = None
    moe_intermediate_size: PositiveInt | None = None
    shared_expert_intermediate_size: Count | None = None
    vocab_size: PositiveInt | None = None
    draft_vocab_size: PositiveInt | None = None
    target_hidden_size: PositiveInt | None = None
    num_attention_heads: PositiveInt | None = None
    num_key_value_heads: PositiveInt | None = None
    head_dim: PositiveInt | None = None
    kv_lora_rank: PositiveInt | None = None
    q_lora_rank: PositiveInt | None = None
    qk_nope_head_dim: Count | None = None
    qk_rope_head_dim: Count | None = None
    v_head_dim: PositiveInt | None = None
    num_experts: Count | None = None
    num_local_experts: Count | None = None
    n_routed_experts: Count | None = None
    n_shared_experts: Count | None = None
    num_experts_per_tok: PositiveInt | None = None
    hidden_act: str | None = None
    first_k_dense_replace: Count | None = None
    moe_layer_freq: PositiveInt | list[Count] | None = None  # MiniMax-M3 writes one 0/1 per layer
    decoder_sparse_step: PositiveInt | None = None
    mlp_only_layers: list[Count] | None = None
    num_nextn_predict_layers: Count | None = None
    num_mtp_modules: Count | None = None
    tie_word_embeddings: bool | None = None
    norm_before_residual: bool | None = None
    rms_norm_eps: float | None = None
    rope_theta: float | None = None
    rope_parameters: dict[str, Any] | None = None
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: Length | None = None
    n_positions: Length | None = None
    max_seq_len: Length | None = None
    seq_length: Length | None = None
    model_max_length: Length | None = None
    max_target_positions: Length | None = None
    max_sequence_length: Length | None = None
    max_seq_length: Length | None = None
    seq_len: Length | None = None
    eagle_aux_hidden_state_layer_ids: list[int] | None = None
    eagle_config: EagleConfig | None = None
    quantization_config: dict[str, Any] | None = None  # its structure: quantkit.io.formats (sources), check (Quark)
    compression_config: dict[str, Any] | None = None
    text_config: ModelConfig | None = None
    transformer_layer_config: ModelConfig | None = None


# The keys the family records read beyond ModelConfig's, each with its type, and the wrapper architectures whose
# language model's config sits under a key (text_config): declared by the records (quantkit.naming.family
# Family.config_keys, Wrapper.text_config_key) and handed down here by the registry (quantkit.naming.archs.register ->
# declare_keys), so the schema of config.json is built from the records and io/ imports nothing above it.
_DECLARED: dict[str, tuple[str, Any]] = {}  # key -> (the record declaring it, its type)
_WRAPPERS: dict[str, str] = {}  # wrapper architecture -> the key of its language model's config
_SCHEMA: list[type[BaseModel]] = []  # the model built from _DECLARED, rebuilt after each declaration


def declare_keys(owner: str, keys: Mapping[str, Any], wrappers: Mapping[str, str] | None = None) -> None:
    """Add a record's config keys (key -> pydantic type) and wrapper architectures to the config.json schema. A key
    that another record declares with another type is a ValueError: one key, one type."""
    for key, typ in keys.items():
        prev = _DECLARED.get(key)
        if prev is not None and prev[1] != typ:
            raise ValueError(f"family {owner!r} declares config key {key!r} as {typ}, family {prev[0]!r} as {prev[1]}")
        if key in ModelConfig.model_fields:
            raise ValueError(
                f"family {owner!r} declares config key {key!r}, which quantkit.io.config.ModelConfig types"
            )
        _DECLARED.setdefault(key, (owner, typ))
    _WRAPPERS.update(wrappers or {})
    _SCHEMA.clear()


def _declared_schema() -> type[BaseModel]:
    from pydantic import create_model

    if not _SCHEMA:
        fields: dict[str, Any] = {k: (typ | None, None) for k, (_o, typ) in _DECLARED.items()}
        inner = create_model("DeclaredKeys", __base__=_Typed, **fields)
        _SCHEMA.append(
            create_model(
                "DeclaredConfig",
                __base__=inner,
                text_config=(inner | None, None),
                transformer_layer_config=(inner | None, None),
            )
        )
    return _SCHEMA[0]


def validate_model_config(config: Any, where: str | Path) -> dict[str, Any]:
    """`config` (parsed config.json) when every key quantkit reads has its type; else one CheckpointError naming the
    file, the key path and what was found."""
    from pydantic import ValidationError

    from quantkit.io.schema import describe_all

    try:
        ModelConfig.model_validate(config)
        _declared_schema().model_validate(config)
    except ValidationError as e:
        raise CheckpointError(f"{where}: {describe_all(e)}; fix config.json (or re-download it)") from None
    archs = config.get("architectures") if isinstance(config, dict) else None
    wrapper = next((a for a in archs or () if a in _WRAPPERS), None)
    if wrapper is not None and not isinstance(config.get(_WRAPPERS[wrapper]), dict):
        raise CheckpointError(
            f"{where}: {_WRAPPERS[wrapper]}: missing; {wrapper} keeps its language model's config "
            f"(layers, experts, quantization_config) under {_WRAPPERS[wrapper]}, which this "
            "config.json lacks: use the release's config.json"
        )
    return config


# --- the text model and its layers ---------------------------------------------------------------------------------


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's config: `text_config` of a multimodal wrapper (e.g. Kimi-K2.5), else the config itself."""
    inner = config.get("text_config")
    return inner if isinstance(inner, dict) else config


def num_hidden_layers(config: dict[str, Any], where: str | Path) -> int:
    """The text model's decoder layer count; a one-line error naming `where` when config.json has no valid one."""
    n = text_config(config).get("num_hidden_layers")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise CheckpointError(
            f"{where}: config.json has no valid num_hidden_layers ({str(n)[:40]!r}); is this the target?"
        )
    from quantkit.io.counts import MAX_LAYERS

    if n > MAX_LAYERS:
        raise CheckpointError(
            f"{where}: config.json has num_hidden_layers {str(n)[:40]}, more than {MAX_LAYERS:,} (no "
            "model has so many); fix config.json"
        )
    return n


# --- dtypes ---------------------------------------------------------------------------------------------------

_MODEL_DTYPES = {"bfloat16": "BF16", "float16": "F16", "half": "F16", "float32": "F32", "float": "F32"}


def vllm_dtype_label(config: Mapping[str, Any]) -> str:
    """The dtype vLLM builds unquantized layers in (the config's torch_dtype / dtype; BF16 when absent)."""
    raw_layer_cfg = config.get("transformer_layer_config")
    layer_cfg: Mapping[str, Any] = raw_layer_cfg if isinstance(raw_layer_cfg, dict) else config
    for c in (layer_cfg, config, text_config(dict(config))):
        for key in ("torch_dtype", "dtype"):
            value = c.get(key)
            if isinstance(value, str):
                return _MODEL_DTYPES.get(value.replace("torch.", ""), value.upper())
    return "BF16"


def quark_model_dtype(config: Mapping[str, Any]) -> str:
    """Quark's file-to-file reader of the model dtype (file2file_quantization.py `_get_model_dtype_from_hf_model_config`):
    text_config dtype/torch_dtype, then top-level torch_dtype/dtype, bfloat16 when none is given or it is "auto"."""
    text: dict[str, Any] = config["text_config"] if isinstance(config.get("text_config"), dict) else {}
    name = text.get("dtype") or text.get("torch_dtype") or config.get("torch_dtype") or config.get("dtype")
    if isinstance(name, str) and name.lower() != "auto":
        return name.lower()
    return "bfloat16"


def quantization_config(config: Mapping[str, Any]) -> tuple[Any, str | None]:
    """The quantization config vLLM reads, and the key it was found under; (None, None) without one. The one lookup
    order of quantkit: vllm/model_executor/model_loader/weight_utils.py get_quant_config takes hf_config's
    `quantization_config`, else its text_config's (multimodal wrappers such as Kimi-K2.5), else `compression_config`
    (compressed-tensors' legacy key), each when it is not None; a speculators draft's hf_config is its
    `transformer_layer_config` (vllm/transformers_utils/configs/speculators/), so a config found there wins. The
    value is returned as stored (the caller judges its type)."""
    layer = config.get("transformer_layer_config")
    if isinstance(layer, Mapping) and layer.get("quantization_config") is not None:
        return layer["quantization_config"], "transformer_layer_config.quantization_config"
    text = config.get("text_config")
    for key, holder in (("quantization_config", config),
                        ("text_config.quantization_config", text if isinstance(text, Mapping) else {}),
                        ("compression_config", config)):  # fmt: skip
        value = holder.get(key.rpartition(".")[2])
        if value is not None:
            return value, key
    return None, None


def has_quantization_config(config: Mapping[str, Any]) -> bool:
    """Whether Quark's file-to-file path sees a quantization_config: at the top level or in any nested config."""
    return "quantization_config" in config or any(
        isinstance(v, dict) and "quantization_config" in v for v in config.values()
    )


# --- attention -------------------------------------------------------------------------------------------------


def config_int(value: Any) -> int | None:
    """`value` when it is an int (a JSON true is not one), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def attention_heads(cfg: Mapping[str, Any]) -> tuple[int | None, int | None, int | None]:
    """(attention heads, KV heads, head size); KV heads default to the attention heads (vllm/config/model.py)."""
    heads = config_int(cfg.get("num_attention_heads"))
    kv = config_int(cfg.get("num_key_value_heads")) or heads
    head_dim = config_int(cfg.get("head_dim"))
    hidden = config_int(cfg.get("hidden_size"))
    if head_dim is None and hidden and heads:
        head_dim = hidden // heads
    return heads, kv, head_dim


# --- the longest sequence ----------------------------------------------------------------------------------------

# vLLM's keys for a model's maximum length; the smallest present wins, and model_max_length overrides them all
# (vllm/transformers_utils/model_arch_config_convertor.py ModelArchConfigConvertorBase.derive_max_model_len_and_key,
# read from the text config: vllm/transformers_utils/config.py get_hf_text_config).
MAX_LEN_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
# RoPE types whose max_position_embeddings is already the scaled length, so `factor` is not applied again
# (vllm/config/model.py _get_and_verify_max_len).
_PRESCALED_ROPE = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")


@dataclass(frozen=True)
class MaxModelLen:
    """The longest sequence (prompt + generated tokens) vLLM lets a model run, and the config key it comes from."""

    tokens: int
    key: str  # e.g. "max_position_embeddings", "text_config.max_position_embeddings x rope factor 4.0"

    def __str__(self) -> str:
        return f"{self.tokens} positions ({self.key} in config.json, as vLLM reads it)"


def _rope_parameters(text: dict[str, Any]) -> list[dict[str, Any]]:
    # transformers reads a legacy `rope_scaling` in place of `rope_parameters` when both are there
    # (modeling_rope_utils.py convert_rope_params_to_dict: `rope_scaling or self.rope_parameters`), `type` standing
    # for `rope_type`; either may be nested one level per layer type (vllm/transformers_utils/config.py
    # iter_rope_parameters).
    rope = text.get("rope_scaling") or text.get("rope_parameters")
    if not isinstance(rope, dict):
        return []
    if rope and all(isinstance(v, dict) for v in rope.values()):
        return [v for v in rope.values() if v]
    return [rope]


# Bounds on what a config may say about positions: no model holds 2^31 positions (vLLM keeps max_model_len in an
# int32 in places), and no RoPE scaling factor of a released model is near 10^6 (they are 2 to 64). Beyond them a
# config is refused in one line naming the key, before a 300-digit --max-model-len reaches a manifest.
MAX_POSITIONS = 2**31
MAX_ROPE_FACTOR = 1e6


def _check_rope_factors(text: dict[str, Any], where: str, file: str | Path) -> None:
    key = "rope_scaling" if text.get("rope_scaling") else "rope_parameters"
    for rp in _rope_parameters(text):
        f = rp.get("factor")
        if isinstance(f, (int, float)) and not isinstance(f, bool) and not 0 < f <= MAX_ROPE_FACTOR:
            raise CheckpointError(
                f"{file} {where}{key}.factor {f:g}: outside (0, {MAX_ROPE_FACTOR:g}] (released "
                "models scale RoPE by 2 to 64); fix config.json (or re-download it)"
            )


def max_model_len(config: dict[str, Any], file: str | Path = "config.json") -> MaxModelLen | None:
    """vLLM's derived max_model_len of a model from its config.json (vllm/config/model.py _get_and_verify_max_len: the
    smallest length key of the text config, times the RoPE scaling factor of non-prescaled RoPE types); None when no
    key is present (vLLM then assumes 2048 but accepts any explicit max_model_len). A RoPE factor beyond
    MAX_ROPE_FACTOR, or a length beyond MAX_POSITIONS, is one CheckpointError naming `file` and the key."""
    text = text_config(config)
    where = "text_config." if text is not config else ""
    _check_rope_factors(text, where, file)
    found = [
        (text[k], k)
        for k in MAX_LEN_KEYS
        if isinstance(text.get(k), (int, float)) and not isinstance(text.get(k), bool) and text[k] > 0
    ]
    if not found:
        return None
    value, key = min(found, key=lambda f: f[0])
    if isinstance(text.get("model_max_length"), (int, float)) and text["model_max_length"]:
        value, key = text["model_max_length"], "model_max_length"
    factor: float = 1.0
    if "gemma3" not in str(text.get("model_type") or ""):  # Gemma 3's length is already scaled (same function)
        for rp in _rope_parameters(text):
            kind = rp.get("rope_type", rp.get("type"))
            f = rp.get("factor")
            if kind not in _PRESCALED_ROPE and isinstance(f, (int, float)) and not isinstance(f, bool) and f > 0:
                factor = float(f)
    label = f"{where}{key}" + (f" x rope factor {factor:g}" if factor != 1.0 else "")
    if not value * factor <= MAX_POSITIONS:
        raise CheckpointError(
            f"{file} {label}: {value:g}"
            + (f" x {factor:g}" if factor != 1.0 else "")
            + f" positions, more than {MAX_POSITIONS} (no model holds that many); fix config.json "
            "(or re-download it)"
        )
    return MaxModelLen(int(value * factor), label)


def fit_max_model_len(config: dict[str, Any], wanted: int) -> int:
    """`wanted` (an engine's max_model_len with slack), capped at the model's own length: vLLM refuses a longer one
    ("User-specified max_model_len ... is greater than the derived max_model_len", same function)."""
    limit = max_model_len(config)
    return min(wanted, limit.tokens) if limit is not None else wanted


# --- EAGLE-3 drafts --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DraftConfig:
    """An EAGLE-3 draft's config.json as vLLM reads it: THE draft-config reader (naming.drafts, the eagle3 layouts).

    `layer` is the Llama/Qwen3-style decoder-layer config vLLM builds the draft from: a speculators eagle3 draft's
    `transformer_layer_config` (vllm/transformers_utils/configs/speculators/base.py
    extract_transformers_pre_trained_config), else the config itself (an EAGLE/SpecForge draft). `aux_layer_ids` are the top-level
    eagle_aux_hidden_state_layer_ids, else eagle_config's, else the layer config's (vLLM reads the hf_config's
    attribute first, then its eagle_config: v1/worker/gpu_model_runner.py _get_eagle3_aux_layers_from_config; update_eagle3
    in speculators/algos.py copies the top-level ids into it). `use_aux_hidden_state` is eagle_config's, True when
    absent (llama_eagle3.py LlamaModel.__init__)."""

    format: str  # "eagle" | "speculators"
    layer: Mapping[str, Any]
    eagle_config: Mapping[str, Any]
    aux_layer_ids: tuple[int, ...] | None
    aux_layer_ids_top: tuple[int, ...] | None
    aux_layer_ids_eagle_config: tuple[int, ...] | None
    use_aux_hidden_state: Any  # as written (check reports a non-bool); True when absent
    num_hidden_layers: Any  # as written: the layout refuses a missing or bad one in its own words
    hidden_size: int | None
    vocab_size: int | None
    draft_vocab_size: int | None  # top level, then the layer config, else vocab_size


def _ids(value: Any) -> tuple[int, ...] | None:
    return tuple(value) if isinstance(value, (list, tuple)) and value else None


def draft_config(config: Mapping[str, Any]) -> DraftConfig:
    """The EAGLE-3 draft's config as vLLM reads it (see DraftConfig); pure, never raises on a bad value."""
    raw_layer = config.get("transformer_layer_config")
    speculators = config.get("speculators_model_type") == "eagle3"
    layer: Mapping[str, Any] = raw_layer if speculators and isinstance(raw_layer, dict) else config
    top_eagle, layer_eagle = config.get("eagle_config"), layer.get("eagle_config")
    eagle: Mapping[str, Any] = (top_eagle if isinstance(top_eagle, dict) and top_eagle else
                                layer_eagle if isinstance(layer_eagle, dict) else {})  # fmt: skip
    # A DFlash draft's dflash_config overrides its eagle_config and names the target layers it reads as
    # target_layer_ids (vllm/model_executor/models/qwen3_dflash.py DFlashQwen3Model: `drafter_config =
    # eagle_config; drafter_config.update(dflash_config)`; the fc input is len(target_layer_ids) x target hidden)
    dflash = config.get("dflash_config")
    if isinstance(dflash, dict) and dflash:
        eagle = {**eagle, **dflash}
        if _ids(dflash.get("target_layer_ids")):
            eagle["eagle_aux_hidden_state_layer_ids"] = dflash["target_layer_ids"]
    top_ids, eagle_ids = (
        _ids(config.get("eagle_aux_hidden_state_layer_ids")),
        _ids(eagle.get("eagle_aux_hidden_state_layer_ids")),
    )
    vocab = config_int(layer.get("vocab_size"))
    draft_vocab = config_int(config.get("draft_vocab_size")) or config_int(layer.get("draft_vocab_size")) or vocab
    return DraftConfig(
        format="speculators" if speculators else "eagle", layer=layer, eagle_config=eagle,
        aux_layer_ids=top_ids or eagle_ids or _ids(layer.get("eagle_aux_hidden_state_layer_ids")),
        aux_layer_ids_top=top_ids, aux_layer_ids_eagle_config=eagle_ids,
        use_aux_hidden_state=eagle.get("use_aux_hidden_state", True),
        num_hidden_layers=layer.get("num_hidden_layers"), hidden_size=config_int(layer.get("hidden_size")),
        vocab_size=vocab, draft_vocab_size=draft_vocab,
    )  # fmt: skip
