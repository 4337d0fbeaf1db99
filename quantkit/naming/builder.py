"""The kit a family file (quantkit/naming/archs/<family>.py) builds its runtime layers with: the checkpoint's modules,
slots of a decoder layer, the shared attention / MLP slots, and the layout checks every family runs (layer range,
MTP layers vLLM skips, leftover modules vLLM would not load). Public: a test's fake family uses it too."""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, KeysView, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import chain, compress, filterfalse, repeat
from operator import eq, itemgetter
from typing import Any

from quantkit.io.counts import MAX_LAYERS  # the most layers a config may claim (checked before any per-layer loop)
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


class ModuleParams(Mapping[str, frozenset[str]]):
    """CheckpointModules.params: module -> the names of its params (the last components of its tensor names), in
    checkpoint order. Computed on request from the sorted tensor table rather than stored as one set per module (a
    Kimi-K2.5 index has 67k modules, nearly all holding one `weight`)."""

    def __init__(self, ckpt: CheckpointModules):
        self._ckpt = ckpt
        self._unique: dict[str, None] | None = None

    def __getitem__(self, module: str) -> frozenset[str]:
        count = self._ckpt.tensor_count(module)
        if not count:
            raise KeyError(module)
        other = self._ckpt.other_params.get(module, [])
        # a tensor of `module` that is not one of its other params is its `<module>.weight`
        return frozenset(other + ["weight"] if count > len(other) else other)

    def __contains__(self, module: object) -> bool:
        return isinstance(module, str) and self._ckpt.has(module)

    def _modules(self) -> dict[str, None]:
        if self._unique is None:
            self._unique = dict.fromkeys(self._ckpt.tensor_modules)
        return self._unique

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules())

    def __len__(self) -> int:
        return len(self._modules())

    def keys(self) -> KeysView[str]:
        return self._modules().keys()


@dataclass(frozen=True)
class _ExpertLayout:
    """The tensors under one experts container, in checkpoint order, as names relative to it (`<E>.<proj>`), and
    which of them experts_under returns in which order: each module `<number>[.*]` once, stably sorted by number."""

    suffixes: tuple[str, ...]
    picks: tuple[int, ...]

    @classmethod
    def of(cls, suffixes: Sequence[str]) -> _ExpertLayout:
        first: dict[str, int] = {}
        for i, suffix in enumerate(suffixes):
            first.setdefault(suffix, i)
        numbered = []
        for suffix, i in first.items():
            head = suffix.partition(".")[0]
            if is_index(head):
                numbered.append((int(head), i))
        return cls(tuple(suffixes), tuple(map(itemgetter(1), sorted(numbered, key=itemgetter(0)))))

    @property
    def newline_free(self) -> bool:
        return not any("\n" in suffix for suffix in self.suffixes)

    @cached_property
    def _getter(self) -> Callable[[Sequence[str]], Any]:
        return itemgetter(*self.picks) if len(self.picks) > 1 else lambda run: tuple(run[i] for i in self.picks)

    def pick(self, run: Sequence[str]) -> tuple[str, ...]:
        picked: tuple[str, ...] = self._getter(run)
        return picked


class CheckpointModules:
    """The checkpoint's module names (tensor name minus its last component) and the params each holds.

    Kept as one module name per tensor (checkpoint order) and those positions sorted by module name: a module, or
    every module under a container, is a range of the sorted positions found by bisection, so nothing is built per
    module beyond its name (a set per module cost ~0.1 s on a 67k-tensor Kimi-K2.5 index)."""

    def __init__(self, tensor_names: Iterable[str]):
        names = tensor_names if isinstance(tensor_names, list) else list(tensor_names)  # read, never changed
        # Most tensors are `<module>.weight`; removesuffix leaves every other name equal to itself, and those few are
        # split at their last "." by hand.
        modules = list(map(str.removesuffix, names, repeat(".weight")))
        self.other_params: dict[str, list[str]] = {}  # module -> its params other than `weight`, one per tensor
        self._other_positions = list(compress(range(len(names)), map(eq, modules, names)))  # ascending
        for i in self._other_positions:
            module, _, param = names[i].rpartition(".")
            modules[i] = module
            self.other_params.setdefault(module, []).append(param)
        self.tensor_names = names  # as given, in checkpoint order
        self.tensor_modules = modules  # the module of every tensor, in checkpoint order
        self.params = ModuleParams(self)
        self._used: set[str] = set()
        self._taken_runs: list[tuple[str, ...]] = []  # experts_under answers taken whole, not yet in _used
        self._taken_spans: list[tuple[int, int]] = []  # their positions (start, stop)
        self._by_name: list[int] | None = None
        self._numbered: dict[str, list[tuple[int, str]]] = {}
        self._numbers: dict[str, list[tuple[int, int, int]]] = {}
        self._expert_layouts: list[_ExpertLayout] = []
        # experts_under's answer by its first module -> (the answer, start, stop): the positions start..stop-1 are
        # the answer's `<module>.weight` tensors and no others (each module holds its weight alone)
        self._weight_runs: dict[str, tuple[tuple[str, ...], int, int]] = {}

    def _sorted(self) -> list[int]:
        """Tensor positions sorted by module name (stable: a module's tensors stay in checkpoint order)."""
        if self._by_name is None:
            self._by_name = sorted(range(len(self.tensor_modules)), key=self.tensor_modules.__getitem__)
        return self._by_name

    def _first_from(self, module: str, lo: int = 0, hi: int | None = None) -> int:
        """The first index of _sorted()[lo:hi] whose module name is >= `module`."""
        by_name = self._sorted()
        return bisect_left(by_name, module, lo, len(by_name) if hi is None else hi, key=self.tensor_modules.__getitem__)

    def _under(self, container: str) -> tuple[int, int]:
        # "/" is the character after ".": the names from `container.` up to it are those that start with `container.`
        lo = self._first_from(container + ".")
        return lo, self._first_from(container + "/", lo)

    def tensor_count(self, module: str) -> int:
        """How many tensors `module` holds (0: not a module of this checkpoint)."""
        by_name, key = self._sorted(), self.tensor_modules.__getitem__
        lo = bisect_left(by_name, module, key=key)
        if lo == len(by_name) or key(by_name[lo]) != module:
            return 0
        return bisect_right(by_name, module, lo, key=key) - lo

    def has(self, module: str) -> bool:
        by_name, key = self._sorted(), self.tensor_modules.__getitem__
        lo = bisect_left(by_name, module, key=key)
        return lo < len(by_name) and key(by_name[lo]) == module

    def holds_weight(self, module: str) -> bool:
        """Whether `module` has a `weight` tensor."""
        other = self.other_params.get(module)
        return self.has(module) if other is None else (self.tensor_count(module) > len(other) or "weight" in other)

    def other_tensor_names(self) -> list[str]:
        """The tensor names that are not `<module>.weight` (usually a few of a checkpoint), in checkpoint order."""
        return list(map(self.tensor_names.__getitem__, self._other_positions))

    def positions(self, module: str) -> list[int]:
        """The checkpoint positions of `module`'s tensors, in checkpoint order ([]: not a module here)."""
        by_name, key = self._sorted(), self.tensor_modules.__getitem__
        lo = bisect_left(by_name, module, key=key)
        return by_name[lo : bisect_right(by_name, module, lo, key=key)]

    def weight_run(self, modules: Sequence[str]) -> range | None:
        """The checkpoint positions of the `.weight` tensors of `modules` where they are one run of positions with no
        other tensor among them: `modules` as experts_under answered for a container whose tensors (in checkpoint
        order) are consecutive and are one `weight` per expert module; None otherwise."""
        known = self._weight_runs.get(modules[0]) if modules else None
        if known is None or tuple(modules) != known[0]:  # the answer's own strings: compared by identity first
            return None
        return range(known[1], known[2])

    @property
    def used(self) -> set[str]:
        """The modules a layer took or a layout check marked used. Experts taken as a whole run (weight_run) join it
        when it is first read, so that building the layers hashes none of them (unused() skips them by position)."""
        if self._taken_runs:
            self._used.update(chain.from_iterable(self._taken_runs))
            self._taken_runs.clear()
        return self._used

    def mark_used(self, modules: Iterable[str]) -> None:
        """Add `modules` to `used` (without reading it, which would add the runs taken so far)."""
        self._used.update(modules)

    def take(self, modules: Iterable[str]) -> tuple[str, ...]:
        modules = tuple(modules)
        known = self._weight_runs.get(modules[0]) if modules else None
        if known is not None and modules == known[0]:  # the answer's own strings: compared by identity first
            self._taken_runs.append(modules)
            self._taken_spans.append((known[1], known[2]))
        else:
            self._used.update(modules)
        return modules

    def unused(self) -> list[str]:
        """The modules not in `used`, sorted by name. A run of experts taken whole holds every tensor of its modules,
        so only the tensors outside the taken runs are looked at."""
        modules: Iterable[str] = self.tensor_modules
        if self._taken_spans:
            gaps, at = [], 0
            for start, stop in sorted(self._taken_spans):
                if start > at:
                    gaps.append((at, start))
                at = max(at, stop)
            gaps.append((at, len(self.tensor_modules)))
            modules = chain.from_iterable(self.tensor_modules[start:stop] for start, stop in gaps)
        return sorted(set(filterfalse(self._used.__contains__, modules)))

    def numbered(self, container: str) -> list[tuple[int, str]]:
        """(number, module) of every module `container.<number>[.*]`, in checkpoint order (`<number>` ASCII digits)."""
        found = self._numbered.get(container)
        if found is None:
            lo, hi = self._under(container)
            under = list(dict.fromkeys(map(self.tensor_modules.__getitem__, sorted(self._sorted()[lo:hi]))))
            found = []
            for module in under:
                head = module[len(container) + 1 :].partition(".")[0]
                if is_index(head):
                    found.append((int(head), module))
            self._numbered[container] = found
        return found

    def _number_ranges(self, container: str) -> list[tuple[int, int, int]]:
        """(number, lo, hi) for the modules `container.<number>[.*]`: _sorted()[lo:hi] are modules with that number.

        All modules `container.<head>.*` are one range of the sorted names, so the scan steps from head to head by
        bisection: one step per layer, not per module."""
        found = self._numbers.get(container)
        if found is None:
            found = []
            modules, by_name = self.tensor_modules, self._sorted()
            i, hi = self._under(container)
            start = len(container) + 1
            while i < hi:
                head, dot, _ = modules[by_name[i]][start:].partition(".")
                j = self._first_from(f"{container}.{head}/", i, hi) if dot else i + 1
                if is_index(head):
                    found.append((int(head), i, j))
                i = j
            self._numbers[container] = found
        return found

    def experts_under(self, container: str) -> tuple[str, ...]:
        """Per-expert modules `container.<E>.<proj>` in expert order, plus `container` itself if it holds fused
        3-D expert tensors (transformers v5 layout `experts.gate_up_proj`), which vLLM's MoE loader also reads.

        Within one expert the modules keep their checkpoint order. Every MoE layer of a checkpoint usually stores its
        experts alike: a layer whose tensors are, in checkpoint order, those of an earlier layer (names relative to
        the container) is answered from that layer's order, checked with one string comparison."""
        lo, hi = self._under(container)
        found: tuple[str, ...] = ()
        if lo < hi:
            known = self._known_experts(container, hi - lo)
            if known is not None:
                found, start = known
            else:
                positions = sorted(self._sorted()[lo:hi])
                run = list(map(self.tensor_modules.__getitem__, positions))  # checkpoint order
                layout = _ExpertLayout.of(list(map(itemgetter(slice(len(container) + 1, None)), run)))
                if layout.newline_free and "\n" not in container:
                    self._expert_layouts = [*self._expert_layouts[-3:], layout]
                found = layout.pick(run)
                start = positions[0] if positions[-1] - positions[0] == hi - lo - 1 else -1  # consecutive or not
            # the hi - lo tensors under `container` from `start` on, one per module found and none of them another
            # param than `weight`: the found modules' weights, and nothing else
            if (
                found
                and start >= 0
                and len(found) == hi - lo
                and bisect_left(self._other_positions, start) == bisect_left(self._other_positions, start + hi - lo)
            ):
                self._weight_runs[found[0]] = (found, start, start + hi - lo)
        return (container, *found) if self.has(container) else found

    def _known_experts(self, container: str, count: int) -> tuple[tuple[str, ...], int] | None:
        """experts_under's modules (without `container`) from a layout seen before, and the checkpoint position of
        the first of the `count` consecutive tensors they are in; or None.

        The candidate run starts at the first tensor of the layout's first module; `count` tensors from there that are
        `container.` + the layout's suffixes, one by one, are all `count` tensors under `container`. Joined with
        newlines, which neither the suffixes nor `container` contain, the comparison is exact."""
        if "\n" in container:
            return None
        modules, by_name = self.tensor_modules, self._sorted()
        prefix = container + "."
        for layout in reversed(self._expert_layouts):
            if len(layout.suffixes) != count:
                continue
            first = prefix + layout.suffixes[0]
            i = bisect_left(by_name, first, key=modules.__getitem__)
            if i == len(by_name) or modules[by_name[i]] != first:
                continue
            run = modules[by_name[i] : by_name[i] + count]
            if "\n".join(run) == prefix + ("\n" + prefix).join(layout.suffixes):
                return layout.pick(run), by_name[i]
        return None

    def layer_indices(self, prefix: str) -> set[int]:
        return set(map(itemgetter(0), self._number_ranges(prefix)))

    def numbered_from(self, prefix: str, start: int) -> list[str]:
        """The modules `prefix.<number>[.*]` with number >= start (one entry per tensor)."""
        modules, by_name = self.tensor_modules, self._sorted()
        return [
            modules[by_name[i]]
            for number, lo, hi in self._number_ranges(prefix)
            if number >= start
            for i in range(lo, hi)
        ]


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
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise CheckpointLayoutError(
            f"config.json of this {what} has no valid num_hidden_layers ({str(n)[:40]!r}); fix config.json"
        )
    if n > MAX_LAYERS:
        raise CheckpointLayoutError(
            f"config.json of this {what} has num_hidden_layers {str(n)[:40]}, more than {MAX_LAYERS:,} (no model has "
            "so many); fix config.json"
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
    ckpt.mark_used(ckpt.numbered_from(prefix, start))


def reject_leftovers(ckpt: CheckpointModules, source: str) -> None:
    for module in ckpt.unused():
        if not ckpt.holds_weight(module) or "norm" in module.rsplit(".", 1)[-1]:
            continue
        if LINEAR_LIKE.search(module):
            raise CheckpointLayoutError(
                f"checkpoint module {module} is not a module {source} loads, so vLLM would not load it; "
                f"re-export the checkpoint with the layout that model file expects"
            )


# --- MTP layers numbered after the decoder layers (DeepSeek-V3, GLM-4.5) ---------------------------------------


def mtp_layer_indices(config: Mapping[str, Any], keys: Sequence[str], names: Iterable[str]) -> list[int]:
    """The indices num_hidden_layers + k (k < the first of `keys` set in config.json) of the MTP layers STORED as
    model.layers.<index>.*, as vLLM's MTP models number them (deepseek_mtp.py DeepSeekMultiTokenPredictor:
    mtp_start_layer_idx = num_hidden_layers); empty without MTP layers or a valid num_hidden_layers.

    Bounded by what the checkpoint stores, never by the configured count alone: a config saying
    `num_nextn_predict_layers: 10000000` over one stored MTP layer gives that one layer, at once (issue 35 item 5;
    the count used to drive a loop and a regex of ten million alternatives)."""
    n = config.get("num_hidden_layers")
    count = next((config[k] for k in keys if config.get(k)), 0)
    if not isinstance(n, int) or isinstance(n, bool) or n < 1 or not isinstance(count, int) or count < 1:
        return []
    present = CheckpointModules(names).layer_indices("model.layers")
    return sorted(i for i in present if n <= i < n + count)


def mtp_layers_exclude(config: Mapping[str, Any], keys: Sequence[str], names: Iterable[str]) -> tuple[str, ...]:
    """One `exclude` entry for every module of the stored MTP layers model.layers.<L>.* (L from mtp_layer_indices):
    `re:model\\.layers\\.61\\.` (several: `re:model\\.layers\\.(?:61|62)\\.`). vLLM matches it from the start of the
    name, the final `\\.` keeps layer 6 from matching, and no target layer has such an index (they stop at
    num_hidden_layers - 1)."""
    indices = mtp_layer_indices(config, keys, names)
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
    names = list(names)
    ckpt = CheckpointModules(names)
    out: list[RuntimeLayer] = []
    for i in mtp_layer_indices(config, keys, names):
        slots, mapping = layer(i)
        try:
            built = decoder_layer(ckpt, slots, f"model.layers.{i}", f"model.layers.{i}", i, mapping, source)
        except CheckpointLayoutError:
            continue  # an incomplete MTP layer: vLLM's draft fails to load it whatever `exclude` says
        out += [lay for lay in built if lay.quantizable]
    return out
