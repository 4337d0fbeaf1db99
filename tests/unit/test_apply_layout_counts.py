"""The dry run's size prediction counts tensor layouts from runs of expert positions (CheckpointModules.weight_run)
exactly as it would name by name: random checkpoints whose experts are stored consecutively or not, with biases now
and then, shared TensorInfos, modules in two decisions and weights that are missing."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from quantkit.apply.run import _layout_counts, _weight_runs
from quantkit.io.headers import TensorInfo
from quantkit.naming.builder import CheckpointModules
from quantkit.results import LayerDecision


def _checkpoint(rng: random.Random) -> dict[str, TensorInfo]:
    """Tensors in checkpoint order: layers m.l.<i> of an `a`, sometimes an `n`, and experts under `e`."""
    kinds = [TensorInfo(f"s{f}", "BF16", shape) for f in range(2) for shape in ((4, 2), (2, 4), (4,))]
    names: list[str] = []
    for layer in range(rng.randrange(1, 6)):
        names.append(f"m.l.{layer}.a.weight")
        experts = [f"m.l.{layer}.e.{e}.{p}.weight" for e in range(rng.choice([2, 3, 11])) for p in ("g", "u", "d")]
        change = rng.randrange(6)
        if change == 0:
            experts.insert(rng.randrange(len(experts)), f"m.l.{layer}.e.0.g.bias")
        elif change == 1:
            names.append(f"m.l.{layer}.n.weight")  # between the experts of this layer and a later split
        names += experts
        if change == 2:
            names.append(f"m.l.{layer}.e.gate_weight")  # a tensor under the container that is no expert
        elif change == 3:
            names.append(f"m.l.{layer}.e.shared.weight")  # a module under the container that is no expert
    if rng.random() < 0.3:
        i = rng.randrange(len(names))
        names.append(names.pop(i))  # one tensor moved to the end: its layer's experts are not consecutive
    by_shape = {(4, 2): kinds[:3], (2, 4): kinds[3:]}
    tensors = {n: rng.choice(rng.choice(list(by_shape.values()))) for n in names}
    return tensors


@pytest.mark.parametrize("seed", range(300))
def test_layout_counts_from_runs_answer_as_name_by_name(seed: int) -> None:
    _counted_alike(seed)


def test_most_checkpoints_have_runs() -> None:
    assert sum(map(_counted_alike, range(100))) > 50


def _counted_alike(seed: int) -> bool:
    """Checks one random checkpoint; whether it had runs."""
    rng = random.Random(seed)
    tensors = _checkpoint(rng)
    ckpt = CheckpointModules(list(tensors))
    decisions = []
    for layer in range(6):
        experts = ckpt.experts_under(f"m.l.{layer}.e")
        if experts:
            decisions.append(
                LayerDecision(
                    runtime_name=f"e{layer}",
                    checkpoint_modules=list(experts),
                    action=rng.choice(["quantize", "quantize", "keep"]),
                    scheme=rng.choice(["mxfp4", "ptpc_fp8"]),
                )
            )
    others = [m.removesuffix(".weight") for m in tensors if ".e." not in m]
    for _ in range(rng.randrange(3)):
        picked = rng.sample(others + [f"m.l.{rng.randrange(5)}.e.1.u", "m.missing"], 2)
        decisions.append(
            LayerDecision(runtime_name="x", checkpoint_modules=picked, action="quantize", scheme="ptpc_fp8")
        )
    quantized: dict[str, str | None] = {}
    for d in decisions:
        if d.action == "quantize":
            quantized.update(dict.fromkeys([f"{m}.weight" for m in d.checkpoint_modules], d.scheme))
    plain = Counter((quantized.get(n), t.dtype, t.shape) for n, t in tensors.items())
    assert _layout_counts(decisions, tensors, ckpt) == plain
    assert _layout_counts(decisions, tensors) == plain
    return bool(_weight_runs([d for d in decisions if d.action == "quantize"], tensors, ckpt))


def test_a_consecutive_expert_layer_is_one_run() -> None:
    names = ["m.l.0.a.weight", *(f"m.l.0.e.{e}.{p}.weight" for e in range(3) for p in ("g", "u")), "m.l.0.n.weight"]
    ckpt = CheckpointModules(names)
    experts = ckpt.experts_under("m.l.0.e")
    assert ckpt.weight_run(experts) == range(1, 7)
    assert ckpt.weight_run(list(experts)[1:]) is None
    with_bias = CheckpointModules([*names[:3], "m.l.0.e.0.u.bias", *names[3:]])
    assert with_bias.weight_run(with_bias.experts_under("m.l.0.e")) is None
    d = LayerDecision(runtime_name="e", checkpoint_modules=list(experts), action="quantize", scheme="mxfp4")
    tensors = dict.fromkeys(names, TensorInfo("s", "BF16", (2, 2)))
    assert _weight_runs([d], tensors, ckpt) == {0: range(1, 7)}


@pytest.mark.parametrize("seed", range(200))
def test_unused_after_taking_runs_answers_as_a_set(seed: int) -> None:
    """Experts taken as runs are left out of `used` until it is read; unused() answers as if they were in it."""
    rng = random.Random(seed)
    names = list(_checkpoint(rng))
    ckpt = CheckpointModules(names)
    taken: set[str] = set()
    for layer in rng.sample(range(6), rng.randrange(7)):
        picked = ckpt.experts_under(f"m.l.{layer}.e")
        for _ in range(rng.randrange(1, 3)):  # some taken twice
            taken.update(ckpt.take(picked))
    others = sorted({n.rpartition(".")[0] for n in names})
    taken.update(ckpt.take(rng.sample(others, rng.randrange(4))))
    plain = sorted({n.rpartition(".")[0] for n in names} - taken)
    assert ckpt.unused() == plain
    if rng.random() < 0.5:
        assert ckpt.used == taken
        ckpt.used.add("m.l.0.a")
        taken.add("m.l.0.a")
        assert ckpt.unused() == sorted({n.rpartition(".")[0] for n in names} - taken)


def test_other_tensor_names_are_those_not_ending_in_weight() -> None:
    """plan_apply searches these for fused experts (`.gate_up_proj`, `.down_proj`) instead of every name."""
    rng = random.Random(7)
    names = list(_checkpoint(rng)) + ["weight", ".weight", "a.weight.weight", "m.l.0.e.gate_up_proj", "x.weight_"]
    rng.shuffle(names)
    assert CheckpointModules(names).other_tensor_names() == [n for n in names if not n.endswith(".weight")]
