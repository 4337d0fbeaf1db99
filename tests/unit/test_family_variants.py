# tier: unit
"""Family.variant: one architecture string, two layouts told apart by a config key (TorchSpec's `use_moe: true` on
LlamaForCausalLMEagle3 / Eagle3DeepseekV2ForCausalLM). The registry gives the variant's record the configs its key
picks out and the record that claims the string every other config; it never picks between two variants."""

from __future__ import annotations

import dataclasses

import pytest

from quantkit.naming.archs import family_named, family_of, is_draft, registered, supported_architectures
from quantkit.naming.family import Family, Key, Variant
from quantkit.naming.layers import UnsupportedArchitectureError


@pytest.mark.parametrize(("config", "record"), [
    ({"architectures": ["Eagle3DeepseekV2ForCausalLM"], "use_moe": True}, "eagle3_torchspec_moe"),
    ({"architectures": ["Eagle3DeepseekV2ForCausalLM"], "use_moe": False}, "eagle3_mla"),
    ({"architectures": ["Eagle3DeepseekV2ForCausalLM"]}, "eagle3_mla"),
    ({"architectures": ["Eagle3DeepseekV2ForCausalLM"], "use_moe": "true"}, "eagle3_mla"),  # the schema names it
    ({"architectures": ["LlamaForCausalLMEagle3"], "use_moe": True}, "eagle3_torchspec_moe"),
    ({"architectures": ["LlamaForCausalLMEagle3"]}, "eagle3_llama"),
    ({"architectures": ["Eagle3DeepseekV3ForCausalLM"], "use_moe": True}, "eagle3_mla"),  # not a TorchSpec string
    ({"architectures": ["Glm4MoeForCausalLMEagle3"], "use_moe": True}, "eagle3_torchspec_moe"),
])  # fmt: skip
def test_the_config_key_picks_the_record(config, record):
    assert family_of(config).name == record and is_draft(config)


def _toy(name: str, archs: tuple[str, ...], variant: Variant | None) -> Family:
    return dataclasses.replace(family_named("eagle3_torchspec_moe"), name=name, architectures=archs, variant=variant,
                               config_keys={})  # fmt: skip


def test_a_variant_only_architecture_is_supported_only_where_its_key_holds():
    toy = _toy("toy_variant", (), Variant(("ToyDraftArch",), Key("toy_switch", False, equals=True)))
    with registered(toy):
        assert family_of({"architectures": ["ToyDraftArch"], "toy_switch": True}) is toy
        with pytest.raises(UnsupportedArchitectureError, match="ToyDraftArch is not supported"):
            family_of({"architectures": ["ToyDraftArch"]})
        assert "ToyDraftArch" not in supported_architectures()  # claimed by no record outright
    with pytest.raises(UnsupportedArchitectureError):  # gone with the record
        family_of({"architectures": ["ToyDraftArch"], "toy_switch": True})


def test_two_variants_of_one_architecture_are_refused_at_registration():
    toy = _toy("toy_variant", (), Variant(("Eagle3DeepseekV2ForCausalLM",), Key("toy_switch", False, equals=True)))
    with pytest.raises(ValueError, match="already taken by family 'eagle3_torchspec_moe'"), registered(toy):
        pass
    assert family_of({"architectures": ["Eagle3DeepseekV2ForCausalLM"], "use_moe": True}).name == "eagle3_torchspec_moe"


def test_a_mistyped_switch_is_one_line_naming_the_key(tmp_path):
    """use_moe is a declared config key (bool): a string there is blamed by name, not read as false."""
    import torch

    from tests.fixtures.checkpoints import write_checkpoint
    from tests.fixtures.cli import cli, one_line_error

    config = {"architectures": ["Eagle3DeepseekV2ForCausalLM"], "model_type": "kimi_k2", "use_moe": "yes",
              "num_hidden_layers": 1, "hidden_size": 8, "vocab_size": 4}  # fmt: skip
    src = write_checkpoint(tmp_path / "d", {"fc.weight": torch.zeros(8, 24)}, config)
    line = one_line_error(cli("inspect", str(src)))
    assert "use_moe" in line and str(src / "config.json") in line, line
