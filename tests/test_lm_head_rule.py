# tier: integration
"""The lm-head-quantized rule: a draft with an FP8 lm_head fails check, citing vLLM 0.32's QuarkConfig.get_quant_method
and ParallelLMHead; the row is version-ranged, so lifting it is one field."""

from __future__ import annotations

import dataclasses
import shutil

import torch

from quantkit.apply.run import apply
from quantkit.check.run import run as check
from quantkit.rules.table import RULES
from tests.test_check import edit_tensors


def test_a_draft_with_an_fp8_lm_head_fails_check_with_the_rule(tiny, tmp_path):
    out = tmp_path / "fp8"
    apply("fp8-draft", tiny / "eagle3-draft", out, target=tiny / "target", progress=None)
    good = tmp_path / "good"
    shutil.copytree(out, good)

    def quantize_head(t):
        w = t["lm_head.weight"].float()
        scale = w.abs().amax(dim=1) / 448.0
        t["lm_head.weight"] = (w / scale[:, None]).to(torch.float8_e4m3fn)
        t["lm_head.weight_scale"] = scale.float()

    edit_tensors(out, quantize_head)
    r = check(out, target=tiny / "target", vllm="off", vllm_version="0.32.0")
    found = [f for f in r.findings if f.code == "lm-head-quantized"]
    assert [(f.severity, f.layer_or_tensor) for f in found] == [("error", "lm_head")]
    assert "QuarkConfig.get_quant_method" in found[0].source and "ParallelLMHead" in found[0].source
    assert "--draft-vocab" in found[0].fix
    # the same checkpoint with its lm_head BF16, as fp8-draft writes it: no finding (a kept lm_head is never blamed)
    assert not [f for f in check(good, target=tiny / "target", vllm="off").findings if f.code == "lm-head-quantized"]


def test_the_rule_is_version_ranged_and_can_be_lifted():
    (rule,) = [r for r in RULES if r.id == "lm-head-quantized"]
    assert rule.holds_for_version("0.32.0") and rule.codes == ("lm-head-quantized",)
    lifted = dataclasses.replace(rule, vllm_max="0.40")  # the day a vLLM loads a quantized ParallelLMHead
    assert lifted.holds_for_version("0.32.0") and not lifted.holds_for_version("0.40.0")
