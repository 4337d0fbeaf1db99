"""The kit a family file (quantkit/naming/archs/<family>.py) builds its runtime layers with: the checkpoint's modules,
slots of a decoder layer, the shared attention / MLP slots, and the layout checks every family runs (layer range,
MTP layers vLLM skips, leftover modules vLLM would not load). Public: a test's fake family uses it too."""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from operator import and_, ge, itemgetter
from typing import Any

from quantkit.naming.layers import CheckpointLayoutError, RuntimeLayer


def vllm_shard_names(name: str, fused_mapping: Mapping[str, Sequence[str]]) -> tuple[str, ...]:
    """The shard names vLLM's find_matching_patterns derives for `name` (none if it is not a fused name).

    vLLM uses `str.replace` on the whole name, so every occurrence of the last component is replaced; copied as is.
    """
    proj = name.split(".")[-1]
    if proj not in fused_mapping:
        return ()
    return tuple(name.replace(proj, shard) for shard in fused_mapping[proj])



# --- slots and shared layouts ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Slot:
    """A module inside one decoder layer: runtime suffix, what it is, and its checkpoint modules (suffixes)."""

    suffix: str
    kind: str
    role: str
    ckpt: tuple[str, ...]
    quantizable: bool = True




QKV = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
GATE_UP = ("mlp.gate_proj", "mlp.up_proj")
QKV_MAP = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}
DENSE_MAP = {**QKV_MAP, "gate_up_proj": ["gate_proj", "up_proj"]}
ATTN_SLOTS = (
    Slot("self_attn.qkv_proj", "fused_linear", "attention", QKV),
    Slot("self_attn.o_proj", "linear", "attention", ("self_attn.o_proj",)),
)
DENSE_MLP_SLOTS = (
    Slot("mlp.gate_up_proj", "fused_linear", "dense_mlp", GATE_UP),
    Slot("mlp.down_proj", "linear", "dense_mlp", ("mlp.down_proj",)),
)
# A module holding a `weight` whose name looks like a matmul; such a module that no layout slot consumes means the
# checkpoint is not in the layout vLLM loads (e.g. a draft saved as `model.fc.weight`, which vLLM would not find).
LINEAR_LIKE = re.compile(r"(^|\.)(\w*_proj\w*|w[123]|fc|gate|lm_head|head)$")



class CheckpointModules:
    """The checkpoint's module names (tensor name minus its last component) and the params each holds."""

    def __init__(self, tensor_names: Iterable[str]):
        parts = list(map(str.rpartition, tensor_names, repeat(".")))
        modules, _, params = zip(*parts) if parts else ((), (), ())
        self.params: dict[str, set[str]] = {}
        single = dict(zip(modules, params))  # most modules hold one tensor: their sets are made without a loop
        if len(single) == len(modules):
            self.params = dict(zip(single, map(set, zip(single.values()))))
        else:
            for module, param in zip(modules, params, strict=True):
                self.params.setdefault(module, set()).add(param)
        self.used: set[str] = set()
        self._modules = list(self.params)
        self._by_name: list[int] | None = None
        self._numbered: dict[str, list[tuple[int, str]]] = {}

    def numbered(self, container: str) -> list[tuple[int, str]]:
        """(number, module) of every module `container.<number>[.*]`, in checkpoint order (`<number>` ASCII digits).

        The modules under `container.` are one range of the modules sorted by name (found by bisection), matched in
        one C-level pass and put back in checkpoint order: asking per layer stays cheap (a scan of every module per
        MoE layer cost 58 x 68k prefix tests on a Kimi-K2.5 index, and a table of every container 68k regex scans)."""
        found = self._numbered.get(container)
        if found is None:
            modules = self._modules
            if self._by_name is None:
                self._by_name = sorted(range(len(modules)), key=modules.__getitem__)
            # "/" is the character after ".": the names from `container.` up to it all start with `container.`
            lo = bisect_left(self._by_name, container + ".", key=modules.__getitem__)
            hi = bisect_left(self._by_name, container + "/", lo, key=modules.__getitem__)
            under = list(map(modules.__getitem__, sorted(self._by_name[lo:hi])))
            # the component after `container.`, up to the next "." (or the end): a number if it is ASCII digits
            heads = list(map(itemgetter(0), map(str.partition, map(itemgetter(slice(len(container) + 1, None)), under),
                                                repeat("."))))
            numbers = list(map(and_, map(str.isascii, heads), map(str.isdigit, heads)))
            found = list(zip(map(int, compress(heads, numbers)), compress(under, numbers)))
            self._numbered[container] = found
        return found

    def has(self, module: str) -> bool:
        return module in self.params

    def take(self, modules: Iterable[str]) -> tuple[str, ...]:
        modules = tuple(modules)
        self.used.update(modules)
        return modules

    def experts_under(self, container: str) -> tuple[str, ...]:
        """Per-expert modules `container.<E>.<proj>` in expert order, plus `container` itself if it holds fused
        3-D expert tensors (transformers v5 layout `experts.gate_up_proj`), which vLLM's MoE loader also reads."""
        found = self.numbered(container)
        modules = list(map(itemgetter(1), sorted(found, key=itemgetter(0))))  # stable: projections keep their order
        if container in self.params:
            modules.insert(0, container)
        return tuple(modules)

    def layer_indices(self, prefix: str) -> set[int]:
        return set(map(itemgetter(0), self.numbered(prefix)))


def is_index(part: str) -> bool:
    # A layer or expert number as vLLM's loaders write it: ASCII digits. str.isdigit() alone also takes '²' (which
    # int() refuses) and '٣' (which int() reads as 3); a tensor name is header text anyone can write.
    return part.isascii() and part.isdigit()


def require_modules(
    ckpt: CheckpointModules, modules: Sequence[str], what: str, source: str, hint: str = ""
) -> tuple[str, ...]:
    missing = [m for m in modules if not ckpt.has(m)]
    if missing:
        raise CheckpointLayoutError(
            f"checkpoint has no tensors for {', '.join(missing)} ({what}, as {source} loads it); "
            + (hint or "check that config.json belongs to these weights")
        )
    return ckpt.take(modules)


def decoder_layer(
    ckpt: CheckpointModules, slots: Sequence[Slot], runtime_prefix: str, ckpt_prefix: str, index: int,
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
            modules = require_modules(ckpt, ckpt_modules, f"runtime layer {name}", source, hint)
        out.append(RuntimeLayer(
            name=name, kind=slot.kind, role=slot.role, shards=vllm_shard_names(name, fused_mapping),
            checkpoint_modules=modules, quantizable=slot.quantizable, layer_index=index, exclude_renames=renames,
            source=source,
        ))  # fmt: skip
    return out


def embed_and_head(
    ckpt: CheckpointModules, config: Mapping[str, Any], source: str, renames: tuple[tuple[str, str], ...] = ()
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
        require_modules(ckpt, ["lm_head"], "runtime layer lm_head", source)
    head = RuntimeLayer(
        "lm_head", "lm_head", "lm_head", checkpoint_modules=ckpt.take(head_modules), quantizable=False,
        exclude_renames=renames, source=source,
    )  # fmt: skip
    return embed, head


def num_layers(config: Mapping[str, Any], what: str) -> int:
    n = config.get("num_hidden_layers")
    if not isinstance(n, int) or n < 1:
        raise CheckpointLayoutError(
            f"config.json of this {what} has no valid num_hidden_layers ({n!r}); fix config.json"
        )
    return n


def check_layer_range(ckpt: CheckpointModules, prefix: str, n: int, source: str, extra: int = 0) -> None:
    """Layers beyond num_hidden_layers (+ `extra` MTP layers vLLM skips) mean config and weights disagree."""
    beyond = sorted(i for i in ckpt.layer_indices(prefix) if i >= n + extra)
    if beyond:
        raise CheckpointLayoutError(
            f"checkpoint has {prefix}.{beyond[0]}.* but config.json says num_hidden_layers={n} ({source} builds only "
            f"those); check that config.json belongs to these weights"
        )


def skip_layers(ckpt: CheckpointModules, prefix: str, start: int) -> None:
    """Mark the tensors of layers >= start (MTP / next-token-prediction layers vLLM's target model skips) as used."""
    found = ckpt.numbered(prefix)
    ckpt.used.update(compress(map(itemgetter(1), found), map(ge, map(itemgetter(0), found), repeat(start))))


def reject_leftovers(ckpt: CheckpointModules, source: str) -> None:
    for module in sorted(ckpt.params.keys() - ckpt.used):
        if module in ckpt.used or "weight" not in ckpt.params[module] or "norm" in module.rsplit(".", 1)[-1]:
            continue
        if LINEAR_LIKE.search(module):
            raise CheckpointLayoutError(
                f"checkpoint module {module} is not a module {source} loads, so vLLM would not load it; "
                f"re-export the checkpoint with the layout that model file expects"
            )



# --- MTP layers numbered after the decoder layers (DeepSeek-V3, GLM-4.5) ---------------------------------------


def mtp_layer_indices(config: Mapping[str, Any], keys: Sequence[str]) -> range:
    """The indices num_hidden_layers + k (k < the first of `keys` set in config.json) of the MTP layers stored as
    model.layers.<index>.*, as vLLM's MTP models number them (deepseek_mtp.py DeepSeekMultiTokenPredictor:
    mtp_start_layer_idx = num_hidden_layers); empty without MTP layers or a valid num_hidden_layers."""
    n = config.get("num_hidden_layers")
    count = next((config[k] for k in keys if config.get(k)), 0)
    if not isinstance(n, int) or isinstance(n, bool) or n < 1 or not isinstance(count, int) or count < 1:
        return range(0)
    return range(n, n + count)


def mtp_layers_exclude(config: Mapping[str, Any], keys: Sequence[str]) -> tuple[str, ...]:
    """One `exclude` entry for every module of the MTP layers model.layers.<L>.* (L from mtp_layer_indices):
    `re:model\\.layers\\.61\\.` (several: `re:model\\.layers\\.(?:61|62)\\.`). vLLM matches it from the start of the
    name, the final `\\.` keeps layer 6 from matching, and no target layer has such an index (they stop at
    num_hidden_layers - 1)."""
    indices = mtp_layer_indices(config, keys)
    if not indices:
        return ()
    alt = str(indices[0]) if len(indices) == 1 else "(?:" + "|".join(str(i) for i in indices) + ")"
    return (rf"re:model\.layers\.{alt}\.",)


def mtp_decoder_layers(
    config: Mapping[str, Any], names: Iterable[str], keys: Sequence[str],
    layer: Callable[[int], tuple[Sequence[Slot], Mapping[str, Sequence[str]]]], source: str,
) -> list[RuntimeLayer]:  # fmt: skip
    """The quantizable layers of an MTP draft whose MTP block is the family's own decoder layer, built under the
    layer's own prefix model.layers.<L> (DeepSeekMTP, Glm4MoeMTP pass `prefix` to the decoder layer unchanged, so
    their runtime names are the checkpoint's, fused as the target's packed_modules_mapping fuses them): `layer(L)`
    gives the slots and fused mapping of decoder layer L. A layer without stored tensors (dropped) is left out."""
    ckpt = CheckpointModules(names)
    present = ckpt.layer_indices("model.layers")
    out: list[RuntimeLayer] = []
    for i in mtp_layer_indices(config, keys):
        if i not in present:
            continue
        slots, mapping = layer(i)
        try:
            built = decoder_layer(ckpt, slots, f"model.layers.{i}", f"model.layers.{i}", i, mapping, source)
        except CheckpointLayoutError:
            continue  # an incomplete MTP layer: vLLM's draft fails to load it whatever `exclude` says
        out += [lay for lay in built if lay.quantizable]
    return out
