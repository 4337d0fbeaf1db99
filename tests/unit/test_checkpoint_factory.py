# tier: unit
"""The tests' checkpoint factory (tests/fixtures/checkpoints/) against the family record: every record family has a
builder or a named test that builds it, each builder builds the family it is registered under (read back through
quantkit's own family_of), and the one writer lays shards out as releases do. The builders that need transformers'
model classes are written and read back in tests/integration/test_checkpoint_factory_written.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from quantkit.naming.archs import families, family_named, family_of
from tests.fixtures import checkpoints as ck
from tests.fixtures.checkpoints.writer import plan_by_bytes

ROOT = Path(__file__).resolve().parents[2]

# Record families no factory builder makes yet, with the file that builds them (its own spec through ck.write /
# write_checkpoint, or the bundled models' script). Moving one into the factory means deleting its line here.
BUILT_ELSEWHERE = {
    "deepseek_v4": "tests/integration/test_family_deepseek_v4.py",
    "dflash": "tests/integration/test_family_dflash.py",
    "dspark_draft": "tests/integration/test_family_dspark.py",
    "qwen3_dspark": "tests/integration/test_family_dspark.py",
    "eagle3_mla": "tests/integration/test_family_eagle3_mla.py",
    "eagle3_moe": "tests/integration/test_families_moe_drafts.py",
    "eagle3_qwen3": "tests/integration/test_families.py",
    "eagle3_torchspec_moe": "tests/integration/test_family_eagle3_glm4_moe.py",
    "glm_moe_dsa": "tests/integration/test_family_glm_moe_dsa.py",
    "llama": "examples/make_tiny_models.py",
    "llama4_text": "tests/fixtures/checkpoints/llama4.py",  # the text model of the llama4 wrapper builder
    "minimax_m3": "tests/integration/test_family_minimax_m3.py",
    "minimax_m3_vl": "tests/integration/test_family_minimax_m3.py",
    "peagle": "tests/integration/test_family_peagle.py",
    "qwen3": "tests/integration/test_vllm_names.py",
    "qwen3_5": "tests/integration/test_family_qwen3_5.py",
}


def test_every_record_family_has_a_builder_or_a_named_home():
    record = {f.name for f in families()}
    built = set(ck.FAMILY.values())
    assert built <= record, f"builders registered under no record family: {built - record}"
    moved = built & set(BUILT_ELSEWHERE)
    assert not moved, f"built by the factory now: drop {moved} from BUILT_ELSEWHERE"
    missing = record - built - set(BUILT_ELSEWHERE)
    assert not missing, (
        f"record families with no checkpoint builder (add one to tests/fixtures/checkpoints/): {missing}"
    )
    for name, where in BUILT_ELSEWHERE.items():
        text = (ROOT / where).read_text()
        fam = family_named(name)
        assert any(f'"{a}"' in text for a in fam.architectures) or f'"{name}' in text, (name, where)


def test_names_are_record_families_or_replicas_that_say_which():
    assert len(set(ck.NAMES)) == len(ck.NAMES) and set(ck.NAMES) == set(ck.FAMILY)
    record = {f.name for f in families()}
    replicas = {n for n in ck.NAMES if n not in record}
    assert replicas == {"kimi_k2"}, replicas  # a replica of a published config, of the deepseek_v3 family
    with pytest.raises(KeyError, match="no checkpoint builder 'nope'; known: deepseek_v3"):
        ck.spec("nope")


LIGHT = [n for n in ck.NAMES if not ck.BUILDERS[n].transformers]
HANDMADE = [("deepseek_v3", {"via": "tensors"}), ("minimax_m2", {"via": "tensors"})]


@pytest.mark.parametrize(
    "name,options", [(n, {}) for n in LIGHT] + HANDMADE, ids=lambda v: v if isinstance(v, str) else ""
)
def test_each_builder_builds_the_family_it_is_registered_under(tmp_path, name, options):
    out = ck.make(name, tmp_path / name, **options)
    config = json.loads((out / "config.json").read_text())
    assert family_of(config).name == ck.FAMILY[name]
    stored = set(ck.tensors(out))
    index = out / "model.safetensors.index.json"
    if index.is_file():  # every tensor indexed, in the shard the index names
        weight_map = json.loads(index.read_text())["weight_map"]
        assert set(weight_map) == stored
        assert ck.index_files(out) == {p.name for p in out.glob("*.safetensors")}
    else:
        assert [p.name for p in out.glob("*.safetensors")] == ["model.safetensors"]
    assert stored == set(ck.spec(name, **options).tensors)


def test_llama4_puts_the_text_model_under_the_record_prefix():
    """Wrapper names come from the record (kimi_k25's: tests/integration/test_checkpoint_factory_written.py)."""
    checkpoint = ck.spec("llama4")
    wrapper = family_named("llama4").wrapper
    assert wrapper is not None
    assert all(n.startswith((wrapper.text_prefix, *wrapper.encoder_prefixes)) for n in checkpoint.tensors)
    assert any(n.startswith(wrapper.text_prefix + "model.layers.") for n in checkpoint.tensors)


def test_writer_keeps_a_module_in_one_shard_and_the_mtp_layer_last():
    t = {
        f"model.layers.{i}.mlp.{p}": torch.zeros(100, dtype=torch.uint8) for i in range(4) for p in ("weight", "scale")
    }
    plan = plan_by_bytes(t, 150, last_shard_prefixes=("model.layers.3.",))
    assert plan == [[f"model.layers.{i}.mlp.weight", f"model.layers.{i}.mlp.scale"] for i in range(4)]
    split = plan_by_bytes(t, 150, split_modules=True)
    assert split[0] == ["model.layers.0.mlp.weight"] and len(split) == 8
