# tier: integration
"""TorchSpec's GLM-4-MoE EAGLE-3 draft (Glm4MoeForCausalLMEagle3; record quantkit/naming/archs/eagle3_torchspec_moe.py)
on a tiny seeded replica of lightseekorg/TorchSpec's configs/draft_models/glm4_moe_eagle3.json (keys as published,
sizes shrunk to the tiny target) with the tensor names its model saves: torchspec/models/draft/llama3_eagle.py
LlamaForCausalLMEagle3 (embed_tokens, fc, norm, lm_head, midlayer.self_attn.{q,k,v,o}_proj, midlayer.hidden_norm /
input_layernorm / post_attention_layernorm) whose midlayer.mlp is, with use_moe, torchspec/models/draft/moe.py's
DeepseekV3MoEBlock: mlp.gate.weight [E, H] and its e_score_correction_bias buffer, mlp.experts.gate_up_proj
[E, H, 2I] (gate first half, up second) and mlp.experts.down_proj [E, I, H], mlp.shared_experts.{gate,up,down}_proj.
Through inspect, apply --recipe fp8-draft, check --vllm off and deploy (refused: vLLM 0.32 has no class for it); the
output headers against the source by hand; the reasons in the model card and the `quantkit families` listing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from quantkit.naming.archs import family_of, runtime_layers
from quantkit.naming.layers import CheckpointLayoutError
from tests.conftest import ROOT
from tests.fixtures.checkpoints import tensors, write_checkpoint
from tests.fixtures.cli import cli, cli_json, one_line_error
from tests.integration.test_families_moe_drafts import assert_fp8_of, same_bytes

TARGET = ROOT / "examples" / "tiny" / "target"  # LlamaForCausalLM, hidden 256, 4 layers, vocab 2048
H, V, E, MI = 256, 2048, 4, 64  # hidden and vocab of the tiny target; 4 routed experts of intermediate 64

# configs/draft_models/glm4_moe_eagle3.json as published (commit 3bd756e7), then shrunk (sizes only) to the tiny target
GLM4_MOE_DRAFT_CONFIG: dict[str, Any] = {
    "architectures": ["Glm4MoeForCausalLMEagle3"], "model_type": "glm4_moe", "use_moe": True, "hidden_size": 4096,
    "intermediate_size": 10944, "num_hidden_layers": 1, "num_attention_heads": 96, "num_key_value_heads": 8,
    "head_dim": 128, "partial_rotary_factor": 0.5, "hidden_act": "silu", "rms_norm_eps": 1e-05, "vocab_size": 151552,
    "draft_vocab_size": 151552, "torch_dtype": "bfloat16", "rope_theta": 10000.0, "n_routed_experts": 128,
    "num_experts_per_tok": 8, "moe_intermediate_size": 1408, "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
    "norm_topk_prob": True, "routed_scaling_factor": 1.0, "scoring_func": "sigmoid", "first_k_dense_replace": 0,
    "train_router": True,
    "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 21, 42], "use_aux_hidden_state": True,
                     "use_input_layernorm_in_first_layer": True, "use_last_layernorm": True},
    "pad_token_id": 0,
}  # fmt: skip
CONFIG: dict[str, Any] = {
    **GLM4_MOE_DRAFT_CONFIG, "hidden_size": H, "intermediate_size": 512, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 64, "vocab_size": V, "draft_vocab_size": V, "n_routed_experts": E,
    "num_experts_per_tok": 2, "moe_intermediate_size": MI, "max_position_embeddings": 4096,
    "eagle_config": {**GLM4_MOE_DRAFT_CONFIG["eagle_config"], "eagle_aux_hidden_state_layer_ids": [1, 2, 3]},
}  # fmt: skip


def moe_block(prefix: str, config: dict[str, Any]) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """DeepseekV3MoEBlock's state dict under `prefix` (torchspec/models/draft/moe.py): router weight [E, H] and its
    e_score_correction_bias buffer [E] (F32 here, as DeepSeek releases store it), MoEExperts' [E, in, out] tensors, a
    SwiGLU shared expert of intermediate moe_intermediate_size x n_shared_experts."""
    h, e, i = config["hidden_size"], config["n_routed_experts"], config["moe_intermediate_size"]
    s = i * config["n_shared_experts"]
    bf = torch.bfloat16
    return {
        f"{prefix}.gate.weight": ((e, h), bf), f"{prefix}.gate.e_score_correction_bias": ((e,), torch.float32),
        f"{prefix}.experts.gate_up_proj": ((e, h, 2 * i), bf), f"{prefix}.experts.down_proj": ((e, i, h), bf),
        f"{prefix}.shared_experts.gate_proj.weight": ((s, h), bf), f"{prefix}.shared_experts.up_proj.weight": ((s, h), bf),
        f"{prefix}.shared_experts.down_proj.weight": ((h, s), bf),
    }  # fmt: skip


def draft_tensors(shapes: dict[str, tuple[tuple[int, ...], torch.dtype]], config: dict[str, Any],
                  seed: int) -> dict[str, torch.Tensor]:  # fmt: skip
    """Seeded values: norms near 1, the rest small; d2t / t2d (TorchSpec's buffers) where the draft vocab is pruned."""
    g = torch.Generator().manual_seed(seed)
    out = {n: ((1 + torch.randn(*s, generator=g) * 0.01) if "norm" in n else torch.randn(*s, generator=g) * 0.05).to(dt)
           for n, (s, dt) in shapes.items()}  # fmt: skip
    v, dv = config["vocab_size"], config["draft_vocab_size"]
    if dv != v:
        hot = torch.randperm(v, generator=g)[:dv].sort().values
        out["d2t"] = hot - torch.arange(dv)
        out["t2d"] = torch.zeros(v, dtype=torch.bool)
        out["t2d"][hot] = True
    return out


def glm_shapes(config: dict[str, Any]) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    h, q = config["hidden_size"], config["num_attention_heads"] * config["head_dim"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    bf = torch.bfloat16
    return {
        "embed_tokens.weight": ((config["vocab_size"], h), bf), "fc.weight": ((h, 3 * h), bf), "norm.weight": ((h,), bf),
        "lm_head.weight": ((config["draft_vocab_size"], h), bf),
        "midlayer.self_attn.q_proj.weight": ((q, 2 * h), bf), "midlayer.self_attn.k_proj.weight": ((kv, 2 * h), bf),
        "midlayer.self_attn.v_proj.weight": ((kv, 2 * h), bf), "midlayer.self_attn.o_proj.weight": ((h, q), bf),
        "midlayer.hidden_norm.weight": ((h,), bf), "midlayer.input_layernorm.weight": ((h,), bf),
        "midlayer.post_attention_layernorm.weight": ((h,), bf),
    } | moe_block("midlayer.mlp", config)  # fmt: skip


def glm_draft(out: Path, config: dict[str, Any] = CONFIG, seed: int = 38) -> Path:
    return write_checkpoint(out, draft_tensors(glm_shapes(config), config, seed), config, shard_bytes=1 << 19)


def expected_fp8(src: dict[str, torch.Tensor], prefix: str, config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Each quantized module and the BF16 weight it must decode to, computed from the source by hand: attention (every
    self_attn weight but the MLA layernorms) and shared-expert weights as stored; expert e's gate / up the first / second half of gate_up_proj[e] along its out
    dimension, transposed to [out, in]; down_proj[e] transposed."""
    i = config["moe_intermediate_size"]
    want = {n.removesuffix(".weight"): t for n, t in src.items()
            if n.startswith(f"{prefix}.self_attn.") and "norm" not in n or ".shared_experts." in n}  # fmt: skip
    for e in range(config["n_routed_experts"]):
        gate_up, down = src[f"{prefix}.mlp.experts.gate_up_proj"][e], src[f"{prefix}.mlp.experts.down_proj"][e]
        base = f"{prefix}.mlp.experts.{e}"
        want |= {f"{base}.gate_proj": gate_up[:, :i].t(), f"{base}.up_proj": gate_up[:, i:].t(),
                 f"{base}.down_proj": down.t()}  # fmt: skip
    return want


def check_headers(src_dir: Path, out_dir: Path, prefix: str, config: dict[str, Any]) -> None:
    """Quantized where intended (FP8 + per-row scale decoding to the hand-computed source), kept where intended
    (byte-identical), nothing dropped (the output's names are exactly the kept ones plus the quantized ones)."""
    src, out = tensors(src_dir), tensors(out_dir)
    fp8 = expected_fp8(src, prefix, config)
    for module, ref in fp8.items():
        assert_fp8_of(out, module, ref)
    fused = {f"{prefix}.mlp.experts.gate_up_proj", f"{prefix}.mlp.experts.down_proj"}
    kept = [n for n in src if n not in fused and n.removesuffix(".weight") not in fp8]
    assert {"fc.weight", "lm_head.weight", "norm.weight", f"{prefix}.mlp.gate.weight",
            f"{prefix}.mlp.gate.e_score_correction_bias", f"{prefix}.hidden_norm.weight"} <= set(kept)  # fmt: skip
    for n in kept:
        assert n in out and same_bytes(out[n], src[n]), n
    assert set(out) == set(kept) | {f"{m}.{p}" for m in fp8 for p in ("weight", "weight_scale")}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    base = tmp_path_factory.mktemp("eagle3-glm4-moe")
    src, dst = glm_draft(base / "draft"), base / "draft-fp8"
    shown = cli_json("inspect", str(src), "--target", str(TARGET))
    applied = cli_json("apply", "--recipe", "fp8-draft", "--model", str(src), "--target", str(TARGET), "--output",
                       str(dst))  # fmt: skip
    checked = cli("check", str(dst), "--target", str(TARGET), "--vllm", "off", "--json")
    deployed = cli("deploy", str(dst), "--target", str(TARGET), "--out", str(base / "deploy"))
    return {"src": src, "out": dst, "base": base, "inspect": shown, "apply": applied, "check": checked,
            "deploy": deployed}  # fmt: skip


def test_record_names_the_checkpoint_modules():
    assert family_of(CONFIG).name == "eagle3_torchspec_moe"
    names = list(glm_shapes(CONFIG))
    layers = {layer.name: layer for layer in runtime_layers(CONFIG, names, 4)}
    assert list(layers) == [
        "embed_tokens", "fc", "midlayer.self_attn.q_proj", "midlayer.self_attn.k_proj", "midlayer.self_attn.v_proj",
        "midlayer.self_attn.o_proj", "midlayer.mlp.gate", "midlayer.mlp.shared_experts.gate_proj",
        "midlayer.mlp.shared_experts.up_proj", "midlayer.mlp.shared_experts.down_proj", "midlayer.mlp.experts",
        "lm_head"]  # fmt: skip
    assert layers["midlayer.mlp.gate"].kind == "router" and layers["midlayer.mlp.experts"].kind == "moe"
    # without use_moe TorchSpec's GLM class builds a dense midlayer MLP: refused, naming both fixes
    with pytest.raises(CheckpointLayoutError, match='add "use_moe": true.*LlamaForCausalLMEagle3'):
        runtime_layers({**CONFIG, "use_moe": False}, names, 4)


def test_inspect_apply_check(run):
    assert (
        run["inspect"]["model_kind"] == "eagle3-draft" and run["inspect"]["architecture"] == "Glm4MoeForCausalLMEagle3"
    )
    assert run["inspect"]["source_format"].startswith("torchspec_moe with 4 experts fused"), run["inspect"][
        "source_format"
    ]
    actions = {d["runtime_name"]: d["action"] for d in run["apply"]["layers"]}
    kept = {"embed_tokens", "fc", "lm_head", "midlayer.mlp.gate"}
    assert {n for n, a in actions.items() if a == "keep"} == kept, actions
    assert {n for n, a in actions.items() if a == "quantize"} == {
        *(f"midlayer.self_attn.{p}_proj" for p in "qkvo"), "midlayer.mlp.experts",
        *(f"midlayer.mlp.shared_experts.{p}_proj" for p in ("gate", "up", "down"))}  # fmt: skip
    qc = json.loads((run["out"] / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "quark" and sorted(qc["exclude"]) == sorted(kept)
    assert run["check"].exit_code == 0, run["check"].output
    checked = json.loads(run["check"].stdout)
    assert checked["ok"] is True and not [f for f in checked["findings"] if f["severity"] in ("error", "warning")]


def test_headers_quantized_where_intended_kept_where_intended_nothing_dropped(run):
    check_headers(run["src"], run["out"], "midlayer", CONFIG)


def test_deploy_and_a_vllm_check_refuse_in_one_line(run):
    line = one_line_error(run["deploy"])
    assert "vLLM 0.32 has no class for Glm4MoeForCausalLMEagle3 with an MoE midlayer" in line, line
    assert line.endswith(f"quantkit check {run['out']} --vllm off"), line
    assert not (run["base"] / "deploy").exists() or not any((run["base"] / "deploy").iterdir())
    required = one_line_error(cli("check", str(run["out"]), "--target", str(TARGET), "--vllm", "required"))
    assert "has no class for Glm4MoeForCausalLMEagle3" in required, required


def test_card_and_families_give_the_reasons(run):
    from quantkit.publish.card import build_model_card

    card = build_model_card(run["out"], repo_id="someone/glm-draft-fp8").text.replace("\\", "")  # unescaped
    for words in ("fc's input concatenates three target hidden states", "vLLM cannot load a quantized EAGLE-3 draft "
                  "lm_head", "router is tiny and accuracy-critical", "embeddings are lookups",
                  "lm_head, embed_tokens, d2t/t2d", "norms (hidden_norm"):  # fmt: skip
        assert words in card, words
    listed = {f["name"]: f for f in cli_json("families")["families"]}["eagle3_torchspec_moe"]
    assert listed["vllm_builds"] is False and listed["architectures"] == ["Glm4MoeForCausalLMEagle3"]
    assert listed["variants"] == ["LlamaForCausalLMEagle3 with use_moe: true",
                                  "Eagle3DeepseekV2ForCausalLM with use_moe: true"]  # fmt: skip
    assert any(k["part"].startswith("router and its bias") for k in listed["kept"])
