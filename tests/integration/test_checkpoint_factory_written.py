# tier: integration
"""The checkpoint factory's builders that use transformers' own model classes (tests/fixtures/checkpoints/), written
and read back: each builds the family it is registered under (quantkit's family_of on the written config.json), in
every format it offers, with the record's names (the unit tier checks the others:
tests/unit/test_checkpoint_factory.py)."""

from __future__ import annotations

import json

import pytest

from quantkit.naming.archs import family_named, family_of, mtp_tensor_names
from tests.fixtures import checkpoints as ck

CASES = [(n, {}) for n in ck.NAMES if ck.BUILDERS[n].transformers] + [
    ("deepseek_v3", {"format": "fp8"}),
    ("minimax_m2", {"format": "fp8"}),
]


@pytest.mark.parametrize("name,options", CASES, ids=[f"{n}-{o.get('format', 'default')}" for n, o in CASES])
def test_transformers_builders_build_their_family(tmp_path, name, options):
    out = ck.make(name, tmp_path / name, **options)
    config = json.loads((out / "config.json").read_text())
    assert family_of(config).name == ck.FAMILY[name]
    weight_map = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    names = set(ck.tensors(out))
    assert set(weight_map) == names
    if name == "kimi_k25":  # the wrapper's prefixes, from the record
        wrapper = family_named("kimi_k25").wrapper
        assert wrapper is not None
        assert all(n.startswith((wrapper.text_prefix, *wrapper.encoder_prefixes)) for n in names)
    if options.get("format") == "fp8" and name == "deepseek_v3":  # one MTP layer, where the record looks for it
        mtp = mtp_tensor_names(config, names)
        assert mtp and all(n.startswith("model.layers.3.") for n in mtp)
        assert {weight_map[n] for n in mtp} == {sorted(set(weight_map.values()))[-1]}
