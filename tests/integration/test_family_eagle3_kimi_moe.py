# tier: integration
"""TorchSpec's Kimi-K2.5 MoE EAGLE-3 draft (record quantkit/naming/archs/eagle3_torchspec_moe.py): a tiny seeded
replica of lightseekorg/TorchSpec's configs/draft_models/kimi_k25_eagle3_moe.json (architectures
["Eagle3DeepseekV2ForCausalLM"], model_type kimi_k2, use_moe true; keys as published, sizes shrunk to the tiny target)
with the tensor names torchspec/models/draft/deepseek_eagle.py Eagle3DeepseekV2ForCausalLM saves: MLA attention
(midlayer.self_attn.q_a_proj / q_a_layernorm / q_b_proj / kv_a_proj_with_mqa / kv_a_layernorm / kv_b_proj / o_proj,
inputs 2 x hidden) and, with use_moe, moe.py's DeepseekV3MoEBlock under mlp (gate.weight, gate.e_score_correction_bias,
experts.gate_up_proj [E, H, 2I], experts.down_proj [E, I, H], shared_experts.*), as tools/convert_to_hf.py
--export-for-vllm writes it (`midlayer.` renamed `layers.0.`) with a pruned vocabulary (d2t, t2d). The same
architecture string names two layouts: the registry takes this one by use_moe, the dense MLA draft vLLM builds
(eagle3_mla) without it. Through inspect, apply --recipe fp8-draft, check --vllm off and deploy (refused in one line);
the output headers against the source by hand."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from quantkit.naming.archs import NoVllmModelError, family_of, require_vllm_model, runtime_layers
from tests.fixtures.checkpoints import write_checkpoint
from tests.fixtures.cli import cli, cli_json, one_line_error
from tests.integration.test_family_eagle3_glm4_moe import TARGET, check_headers, draft_tensors, moe_block

H, V, DV, E, MI = 256, 2048, 512, 4, 64
HEADS, Q_LORA, KV_LORA, NOPE, ROPE, VD = 4, 64, 128, 32, 64, 32
VLLM_MODELS = Path(torch.__file__).parents[1] / "vllm" / "model_executor" / "models"

# configs/draft_models/kimi_k25_eagle3_moe.json as published (commit 3bd756e7), then shrunk (sizes only)
KIMI_MOE_DRAFT_CONFIG: dict[str, Any] = {
    "architectures": ["Eagle3DeepseekV2ForCausalLM"], "model_type": "kimi_k2", "use_moe": True, "hidden_size": 7168,
    "intermediate_size": 18432, "num_hidden_layers": 1, "num_attention_heads": 64, "num_key_value_heads": 64,
    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "hidden_act": "silu", "rms_norm_eps": 1e-05, "vocab_size": 163840, "draft_vocab_size": 163840,
    "torch_dtype": "bfloat16", "rope_theta": 50000.0,
    "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 64.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "n_routed_experts": 384, "num_experts_per_tok": 8, "moe_intermediate_size": 2048, "n_shared_experts": 1,
    "n_group": 1, "topk_group": 1, "norm_topk_prob": True, "routed_scaling_factor": 2.827, "scoring_func": "sigmoid",
    "first_k_dense_replace": 0, "train_router": True,
    "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 29, 57], "use_aux_hidden_state": True,
                     "use_input_layernorm_in_first_layer": True, "use_last_layernorm": True,
                     "use_mtp_layernorm": False},
    "bos_token_id": 163584, "eos_token_id": 163585, "pad_token_id": 0,
}  # fmt: skip
CONFIG: dict[str, Any] = {
    **KIMI_MOE_DRAFT_CONFIG, "hidden_size": H, "intermediate_size": 512, "num_attention_heads": HEADS,
    "num_key_value_heads": HEADS, "q_lora_rank": Q_LORA, "kv_lora_rank": KV_LORA, "qk_nope_head_dim": NOPE,
    "qk_rope_head_dim": ROPE, "v_head_dim": VD, "vocab_size": V, "draft_vocab_size": DV, "n_routed_experts": E,
    "num_experts_per_tok": 2, "moe_intermediate_size": MI, "max_position_embeddings": 4096, "bos_token_id": 1,
    "eos_token_id": 2,
    "eagle_config": {**KIMI_MOE_DRAFT_CONFIG["eagle_config"], "eagle_aux_hidden_state_layer_ids": [1, 2, 3]},
}  # fmt: skip
P = "layers.0"  # convert_to_hf.py --export-for-vllm's name for the midlayer


def kimi_shapes() -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    bf = torch.bfloat16
    a = f"{P}.self_attn"
    return {
        "embed_tokens.weight": ((V, H), bf), "fc.weight": ((H, 3 * H), bf), "norm.weight": ((H,), bf),
        "lm_head.weight": ((DV, H), bf),
        f"{a}.q_a_proj.weight": ((Q_LORA, 2 * H), bf), f"{a}.q_a_layernorm.weight": ((Q_LORA,), bf),
        f"{a}.q_b_proj.weight": ((HEADS * (NOPE + ROPE), Q_LORA), bf),
        f"{a}.kv_a_proj_with_mqa.weight": ((KV_LORA + ROPE, 2 * H), bf), f"{a}.kv_a_layernorm.weight": ((KV_LORA,), bf),
        f"{a}.kv_b_proj.weight": ((HEADS * (NOPE + VD), KV_LORA), bf), f"{a}.o_proj.weight": ((H, HEADS * VD), bf),
        f"{P}.hidden_norm.weight": ((H,), bf), f"{P}.input_layernorm.weight": ((H,), bf),
        f"{P}.post_attention_layernorm.weight": ((H,), bf),
    } | moe_block(f"{P}.mlp", CONFIG)  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    base = tmp_path_factory.mktemp("eagle3-kimi-moe")
    src = write_checkpoint(base / "draft", draft_tensors(kimi_shapes(), CONFIG, 25), CONFIG, shard_bytes=1 << 19)
    dst = base / "draft-fp8"
    shown = cli_json("inspect", str(src), "--target", str(TARGET))
    applied = cli_json("apply", "--recipe", "fp8-draft", "--model", str(src), "--target", str(TARGET), "--output",
                       str(dst))  # fmt: skip
    checked = cli("check", str(dst), "--target", str(TARGET), "--vllm", "off", "--json")
    deployed = cli("deploy", str(dst), "--target", str(TARGET), "--out", str(base / "deploy"))
    return {"src": src, "out": dst, "base": base, "inspect": shown, "apply": applied, "check": checked,
            "deploy": deployed}  # fmt: skip


def test_use_moe_picks_the_layout_of_one_architecture_string():
    assert family_of(CONFIG).name == "eagle3_torchspec_moe"
    assert family_of({**CONFIG, "use_moe": False}).name == "eagle3_mla"
    assert family_of({k: v for k, v in CONFIG.items() if k != "use_moe"}).name == "eagle3_mla"
    layers = [layer.name for layer in runtime_layers(CONFIG, list(kimi_shapes()), 4)]
    assert layers == ["embed_tokens", "fc", f"{P}.self_attn.q_a_proj", f"{P}.self_attn.q_b_proj",
                      f"{P}.self_attn.kv_a_proj_with_mqa", f"{P}.self_attn.kv_b_proj", f"{P}.self_attn.o_proj",
                      f"{P}.mlp.gate", *(f"{P}.mlp.shared_experts.{p}_proj" for p in ("gate", "up", "down")),
                      f"{P}.mlp.experts", "lm_head"]  # fmt: skip
    with pytest.raises(NoVllmModelError, match="no class for Eagle3DeepseekV2ForCausalLM with an MoE midlayer"):
        require_vllm_model(CONFIG, "d")
    require_vllm_model({**CONFIG, "use_moe": False}, "d")  # the dense MLA draft: vLLM builds it


def test_the_refusal_states_vllms_own_facts():
    """What the refusal says, read from vLLM 0.32's source: its registry maps the string to deepseek_eagle3.py and has
    no GLM MoE draft, and that file's decoder layer builds a dense DeepseekV2MLP."""
    registry = (VLLM_MODELS / "registry.py").read_text()
    assert re.search(r'"Eagle3DeepseekV2ForCausalLM": \("deepseek_eagle3", "Eagle3DeepseekV2ForCausalLM"\)', registry)
    assert '"LlamaForCausalLMEagle3": ("llama_eagle3"' in registry and "Glm4MoeForCausalLMEagle3" not in registry
    deepseek_eagle3 = (VLLM_MODELS / "deepseek_eagle3.py").read_text()
    assert "self.mlp = DeepseekV2MLP(" in deepseek_eagle3 and "FusedMoE" not in deepseek_eagle3


def test_inspect_apply_check(run):
    assert run["inspect"]["model_kind"] == "eagle3-draft"
    assert run["inspect"]["architecture"] == "Eagle3DeepseekV2ForCausalLM"
    actions = {d["runtime_name"]: d["action"] for d in run["apply"]["layers"]}
    kept = {"embed_tokens", "fc", "lm_head", f"{P}.mlp.gate"}
    assert {n for n, a in actions.items() if a == "keep"} == kept, actions
    assert {n for n, a in actions.items() if a == "quantize"} == {
        *(f"{P}.self_attn.{p}" for p in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")),
        f"{P}.mlp.experts", *(f"{P}.mlp.shared_experts.{p}_proj" for p in ("gate", "up", "down"))}  # fmt: skip
    config = json.loads((run["out"] / "config.json").read_text())
    assert config["use_moe"] is True and sorted(config["quantization_config"]["exclude"]) == sorted(kept)
    assert run["check"].exit_code == 0, run["check"].output
    checked = json.loads(run["check"].stdout)
    assert checked["ok"] is True and not [f for f in checked["findings"] if f["severity"] in ("error", "warning")]


def test_headers_quantized_where_intended_kept_where_intended_nothing_dropped(run):
    check_headers(run["src"], run["out"], P, CONFIG)  # d2t, t2d and the MLA layernorms among the kept


def test_deploy_refuses_in_one_line(run):
    line = one_line_error(run["deploy"])
    assert "vLLM 0.32 has no class for Eagle3DeepseekV2ForCausalLM with an MoE midlayer" in line, line
    assert line.endswith(f"quantkit check {run['out']} --vllm off"), line
