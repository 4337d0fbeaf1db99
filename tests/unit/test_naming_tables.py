"""The fast tables of quantkit.naming against the plain rules they stand for: CheckpointModules (module -> params,
experts and layer numbers by bisection) against a dict of sets built name by name, and excluded_names (entries
prepared once, digit-blind regexes asked per name template) against is_excluded on every layer, errors included.
Random names from a small alphabet that has the awkward cases: numbers with leading zeros, non-ASCII digits, heads
that only start with a number, modules that are also containers, params other than `weight`, repeated names."""

from __future__ import annotations

import random
from operator import itemgetter

import pytest

from quantkit.naming.builder import CheckpointModules, skip_layers
from quantkit.naming.exclude import ExcludeListError, excluded_names, is_excluded
from quantkit.naming.layers import RuntimeLayer

HEADS = ["0", "1", "2", "10", "01", "٣", "²", "x", "1-a", "", "3"]
TAILS = ["a", "b", "a.b", "gate_proj", "up_proj"]
PARAMS = ["weight", "weight", "weight", "bias", "weight_scale"]


def _random_names(rng: random.Random) -> list[str]:
    names = []
    for _ in range(rng.randrange(1, 60)):
        shape = rng.randrange(6)
        head, tail, param = rng.choice(HEADS), rng.choice(TAILS), rng.choice(PARAMS)
        if shape == 0:
            names.append(f"m.l.{head}.{param}")
        elif shape == 1:
            names.append(f"m.l.{head}.e.{rng.choice(HEADS)}.{tail}.{param}")
        elif shape == 2:
            names.append(f"m.l.{head}.e.{param}")
        elif shape == 3:
            names.append(f"m.l.{head}.{tail}.{param}")
        elif shape == 4:
            names.append(rng.choice(["weight", "m.l", "m.l.weight", ".weight", "m.l-x.weight", "m.l/x.weight"]))
        else:
            names.append(f"m.l.{head}\n.{param}")
    return names


def _plain_params(names: list[str]) -> dict[str, set[str]]:
    params: dict[str, set[str]] = {}
    for name in names:
        module, _, param = name.rpartition(".")
        params.setdefault(module, set()).add(param)
    return params


def _plain_numbered(params: dict[str, set[str]], container: str) -> list[tuple[int, str]]:
    out = []
    for module in params:
        if module.startswith(container + "."):
            head = module[len(container) + 1 :].partition(".")[0]
            if head.isascii() and head.isdigit():
                out.append((int(head), module))
    return out


@pytest.mark.parametrize("seed", range(300))
def test_checkpoint_modules_answer_as_a_dict_of_sets(seed: int) -> None:
    rng = random.Random(seed)
    names = _random_names(rng)
    rng.shuffle(names)
    plain = _plain_params(names)
    ckpt = CheckpointModules(iter(names))
    assert list(ckpt.params) == list(plain) and len(ckpt.params) == len(plain)
    assert {m: set(ckpt.params[m]) for m in ckpt.params} == plain
    assert ckpt.params.keys() - {"m.l"} == plain.keys() - {"m.l"}
    for module in [*plain, "m", "m.l.1.e", "m.l.9", "", "zz"]:
        assert (module in ckpt.params) == ckpt.has(module) == (module in plain), module
        assert ckpt.holds_weight(module) == ("weight" in plain.get(module, ())), module
    containers = ["m.l", "m", "m.l.1.e", "m.l.01.e", "m.l.10.e", "m.l.x.e", "m.l.٣.e", "m.l.\n"]
    for container in containers:
        numbered = _plain_numbered(plain, container)
        assert ckpt.numbered(container) == numbered, container
        experts = [m for _, m in sorted(numbered, key=itemgetter(0))]
        assert ckpt.experts_under(container) == tuple(([container] if container in plain else []) + experts)
        assert ckpt.layer_indices(container) == {i for i, _ in numbered}, container
    start = rng.randrange(4)
    skip_layers(ckpt, "m.l", start)
    used = {m for i, m in _plain_numbered(plain, "m.l") if i >= start}
    assert ckpt.used == used
    assert ckpt.unused() == sorted(plain.keys() - used)


ENTRIES = [
    "m.l.1.a",
    "m.l.1.e",
    "m.l.10.e.2",
    "m.l",
    "m.l.1.qkv",
    "m.l.1.q",
    "m.l.2.k",
    "lm",
    r"re:m\.l\.\d+\.a$",
    r"re:m\.l\.\d\.q",
    r"re:m\.l\.\d+\.(?:q|k)$",
    r"re:.*\.v$",
    r"re:m\.l\.1\.",
    r"re:m\.l\.1\d\.",
    r"re:m\.l\.(\d)\1\.",
    r"re:m\.l\.(?P<n>\d)(?P=n)",
    r"re:m\.l\.[0-4]\.",
    r"re:m\.l\.\d{2}\.",
    r"re:m\.\w+\.\d+\.e",
    r"re:m\.l\.\d+\.e\.\d+$",
    r"re:(?i)M\.L\.2",
    r"re:m\.l\.\d+\.qkv",
    r"re:m\.l\.\D",
    r"re:m\.l\.٣",
]
BAD = [r"re:m\.l\.(", r"re:[z-a]"]


def _random_layers(rng: random.Random) -> list[RuntimeLayer]:
    layers = []
    for i in rng.sample(range(14), rng.randrange(1, 8)) + ["٣", "01"]:
        renames = rng.choice([(), (("m.l.1", "m.l.2"),), (("x", "y"),)])
        layers.append(RuntimeLayer(f"m.l.{i}.a", "linear", "attention", exclude_renames=renames))
        layers.append(
            RuntimeLayer(
                f"m.l.{i}.qkv",
                "fused_linear",
                "attention",
                shards=(f"m.l.{i}.q", f"m.l.{i}.k", f"m.l.{i}.v"),
                exclude_renames=renames,
            )
        )
        layers.append(RuntimeLayer(f"m.l.{i}.e", "moe", "experts", exclude_renames=renames))
    layers.append(RuntimeLayer("lm", "lm_head", "lm_head", quantizable=False))
    rng.shuffle(layers)
    return layers


def _outcome(fn):
    try:
        return fn()
    except ExcludeListError as e:
        return (type(e).__name__, str(e))


@pytest.mark.parametrize("seed", range(400))
def test_excluded_names_answers_as_is_excluded_on_every_layer(seed: int) -> None:
    rng = random.Random(seed)
    layers = _random_layers(rng)
    exclude = rng.sample(ENTRIES, rng.randrange(0, 6)) + (rng.sample(BAD, 1) if rng.random() < 0.1 else [])
    rng.shuffle(exclude)
    plain = _outcome(lambda: {layer.name for layer in layers if is_excluded(layer, exclude)})
    assert _outcome(lambda: excluded_names(layers, exclude)) == plain


def test_excluded_names_refuses_what_match_reason_refuses() -> None:
    layer = RuntimeLayer("m.l.1.a", "linear", "attention")
    assert excluded_names([], None) == set()  # type: ignore[arg-type]  # no layer: nothing is asked, as before
    for bad in (None, "m.l.1.a", [3], [r"re:("]):
        with pytest.raises(ExcludeListError) as fast:
            excluded_names([layer], bad)  # type: ignore[arg-type]
        with pytest.raises(ExcludeListError) as plain:
            is_excluded(layer, bad)  # type: ignore[arg-type]
        assert str(fast.value) == str(plain.value)


@pytest.mark.parametrize("seed", range(100))
def test_experts_of_alike_layers_answer_as_a_dict_of_sets(seed: int) -> None:
    """Layers stored alike (the order of one reused for the next), with one layer now and then stored otherwise:
    other projection order, one expert fewer, a module name that only looks alike, a second param, a newline."""
    rng = random.Random(seed)
    names = ["m.embed.weight"]
    for layer in range(rng.randrange(1, 12)):
        experts = [f"m.l.{layer}.e.{e}.{p}" for e in range(rng.choice([3, 3, 3, 12])) for p in ("g", "u", "d")]
        change = rng.randrange(8)
        if change == 0:
            rng.shuffle(experts)
        elif change == 1:
            experts = experts[:-3]
        elif change == 2:
            experts[-1] = f"m.l.{layer}.e.{layer}x.d"
        elif change == 3:
            experts[1] += "\n"
        tensors = [f"{m}.weight" for m in experts]
        if change == 4:
            tensors.insert(rng.randrange(len(tensors)), f"{rng.choice(experts)}.bias")
        names += [f"m.l.{layer}.a.weight", *tensors, f"m.l.{layer}.n.weight"]
    names = list(dict.fromkeys(names))
    plain = _plain_params(names)
    ckpt = CheckpointModules(names)
    for layer in range(12):
        container = f"m.l.{layer}.e"
        experts = [m for _, m in sorted(_plain_numbered(plain, container), key=itemgetter(0))]
        assert ckpt.experts_under(container) == tuple(experts), container


def test_a_layout_with_a_newline_is_not_reused() -> None:
    """Layer 0's names joined with newlines read like layer 1's run, split elsewhere: answered name by name."""
    modules = [
        "m.l.0.e.0.g",
        "m.l.0.e.0.u\nzz",
        "m.l.0.e.2.g",
        "m.l.1.e.0.g",
        "m.l.1.e.0.u",
        "zz\nm.l.1.e.2.g",
        "m.l.1.e.9.z",
    ]
    ckpt = CheckpointModules(f"{m}.weight" for m in modules)
    assert ckpt.experts_under("m.l.0.e") == ("m.l.0.e.0.g", "m.l.0.e.0.u\nzz", "m.l.0.e.2.g")
    assert ckpt.experts_under("m.l.1.e") == ("m.l.1.e.0.g", "m.l.1.e.0.u", "m.l.1.e.9.z")


PLAIN_TOKENS = [
    "a",
    "b",
    ".",
    r"\.",
    r"\d",
    "+",
    "*",
    "?",
    "|",
    "(?:",
    ")",
    "^",
    "$",
    "1",
    r"\-",
    "-",
    " ",
    r"\(",
    "[",
    r"\w",
    "(",
    "{2}",
    "é",
    r"\\",
    "\\",
]


@pytest.mark.parametrize("seed", range(300))
def test_plain_regexes_compile_and_match_alike_in_re_and_regex(seed: int) -> None:
    """What _plain_regex hands to Python's re compiles there and in the regex package and matches ASCII text alike."""
    import re

    import regex  # installed with transformers (a dependency): missing, this test fails rather than skips

    from quantkit.naming.exclude import _plain_regex

    rng = random.Random(seed)
    for _ in range(20):
        pattern = "".join(rng.choice(PLAIN_TOKENS) for _ in range(rng.randrange(1, 9)))
        if not _plain_regex(pattern):
            continue
        ours, theirs = re.compile(pattern), regex.compile(pattern)
        for _ in range(30):
            text = "".join(rng.choice("ab.1-( \n2") for _ in range(rng.randrange(0, 7)))
            assert (ours.match(text) is None) == (theirs.match(text) is None), (pattern, text)
