# tier: integration
"""MiniMax-M3 (MiniMaxM3SparseForConditionalGeneration, model_type minimax_m3_vl, text model minimax_m3): a tiny
replica from the published config.json keys (per-layer moe_layer_freq, sparse_attention_config) and tensor names
(language_model.model.layers.N.{self_attn.index_q_proj, block_sparse_moe.experts.E.w1, ...}, vision tower) through
inspect, apply --recipe mxfp4-moe and check --vllm off, and the output headers against the source."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from quantkit.cli import main
from quantkit.naming.archs import family_of, runtime_layers
from tests.fixtures import checkpoints as ck

H, MI, DI, E, V = ck.H, ck.MOE_I, 256, 4, ck.VOCAB
HEADS, KV, HD, IDX_HEADS, IDX_DIM = 4, 2, 32, 2, 32
TEXT = {
    "model_type": "minimax_m3", "vocab_size": V, "hidden_size": H, "num_hidden_layers": 3, "num_attention_heads": HEADS,
    "num_key_value_heads": KV, "head_dim": HD, "intermediate_size": MI, "dense_intermediate_size": DI,
    "shared_intermediate_size": MI, "num_local_experts": E, "num_experts_per_tok": 2, "n_shared_experts": 1,
    "scoring_func": "sigmoid", "use_routing_bias": True, "routed_scaling_factor": 2.0, "num_mtp_modules": 1,
    "moe_layer_freq": [0, 1, 1], "rms_norm_eps": 1e-6, "max_position_embeddings": 1024, "hidden_act": "silu",
    "sparse_attention_config": {"use_sparse_attention": True, "sparse_index_dim": IDX_DIM,
                                "sparse_num_index_heads": IDX_HEADS, "sparse_topk_blocks": 16, "sparse_block_size": 128,
                                "sparse_attention_freq": [0, 1, 1], "sparse_disable_index_value": [0, 1, 1],
                                "sparse_init_block": 0, "sparse_local_block": 1},
}  # fmt: skip
CONFIG = {"architectures": ["MiniMaxM3SparseForConditionalGeneration"], "model_type": "minimax_m3_vl",
          "text_config": TEXT, "vision_config": {"hidden_size": 64}, "tie_word_embeddings": False}  # fmt: skip
MOE_LAYERS = (1, 2)


def m3_tensors() -> dict[str, tuple[tuple[int, ...], str]]:
    """The release's names (language_model.model.*, vision_tower.*, multi_modal_projector.*, patch_merge_mlp.*)."""
    t: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,),
                                     "lm_head.weight": (V, H)}  # fmt: skip
    f32 = set()
    for i in range(3):
        p = f"model.layers.{i}"
        t |= {f"{p}.input_layernorm.weight": (H,), f"{p}.post_attention_layernorm.weight": (H,),
              f"{p}.self_attn.q_proj.weight": (HEADS * HD, H), f"{p}.self_attn.k_proj.weight": (KV * HD, H),
              f"{p}.self_attn.v_proj.weight": (KV * HD, H), f"{p}.self_attn.o_proj.weight": (H, HEADS * HD),
              f"{p}.self_attn.q_norm.weight": (HD,), f"{p}.self_attn.k_norm.weight": (HD,)}  # fmt: skip
        if TEXT["sparse_attention_config"]["sparse_attention_freq"][i]:
            t |= {f"{p}.self_attn.index_q_proj.weight": (IDX_HEADS * IDX_DIM, H),
                  f"{p}.self_attn.index_k_proj.weight": (IDX_DIM, H)}  # fmt: skip
        if TEXT["moe_layer_freq"][i]:
            m = f"{p}.block_sparse_moe"
            t |= {f"{m}.gate.weight": (E, H), f"{m}.e_score_correction_bias": (E,)}
            f32 |= {f"{m}.gate.weight", f"{m}.e_score_correction_bias"}
            for e in range(E):
                t |= {f"{m}.experts.{e}.w1.weight": (MI, H), f"{m}.experts.{e}.w3.weight": (MI, H),
                      f"{m}.experts.{e}.w2.weight": (H, MI)}  # fmt: skip
            t |= {f"{m}.shared_experts.gate_proj.weight": (MI, H), f"{m}.shared_experts.up_proj.weight": (MI, H),
                  f"{m}.shared_experts.down_proj.weight": (H, MI)}  # fmt: skip
        else:
            t |= {f"{p}.mlp.gate_proj.weight": (DI, H), f"{p}.mlp.up_proj.weight": (DI, H),
                  f"{p}.mlp.down_proj.weight": (H, DI)}  # fmt: skip
    out = {f"language_model.{k}": (v, "F32" if k in f32 else "BF16") for k, v in t.items()}
    vision = {"vision_tower.vision_model.encoder.layers.0.self_attn.q_proj.weight": (64, 64),
              "vision_tower.vision_model.encoder.layers.0.self_attn.k_proj.weight": (64, 64),
              "vision_tower.vision_model.encoder.layers.0.self_attn.v_proj.weight": (64, 64),
              "vision_tower.vision_model.encoder.layers.0.self_attn.out_proj.weight": (64, 64),
              "vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight": (128, 64),
              "vision_tower.vision_model.encoder.layers.0.mlp.fc2.weight": (64, 128),
              "multi_modal_projector.linear_1.weight": (H, 64), "multi_modal_projector.linear_2.weight": (H, H),
              "patch_merge_mlp.linear_1.weight": (64, 256), "patch_merge_mlp.linear_2.weight": (64, 64)}  # fmt: skip
    return out | {k: (v, "BF16") for k, v in vision.items()}


def _tensors(folder: Path):
    from safetensors import safe_open

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), "pt") as s:
            out |= {k: s.get_tensor(k) for k in s.keys()}
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    base = tmp_path_factory.mktemp("m3")
    src = ck.write(base / "m3", CONFIG, m3_tensors(), seed=3)
    dst = base / "m3-mxfp4"
    runner = CliRunner()
    shown = runner.invoke(main, ["inspect", str(src), "--json"])
    applied = runner.invoke(
        main, ["apply", "--recipe", "mxfp4-moe", "--model", str(src), "--output", str(dst), "--json"]
    )
    assert applied.exit_code == 0, applied.output
    checked = runner.invoke(main, ["check", str(dst), "--vllm", "off", "--json"])
    return {"src": src, "out": dst, "inspect": shown, "apply": json.loads(applied.stdout), "check": checked}


def test_runtime_names_follow_vllms_model_file():
    assert (
        family_of(CONFIG).name == "minimax_m3_vl"
        and family_of({**TEXT, "architectures": ["MiniMaxM3SparseForCausalLM"]}).name == "minimax_m3"
    )
    layers = {layer.name: layer for layer in runtime_layers(CONFIG, list(m3_tensors()))}
    lm = "language_model.model.layers"
    assert [n for n in layers if n.startswith(f"{lm}.0.")] == [
        f"{lm}.0.self_attn.qkv_proj",
        f"{lm}.0.self_attn.o_proj",
        f"{lm}.0.mlp.gate_up_proj",
        f"{lm}.0.mlp.down_proj",
    ]
    assert [n for n in layers if n.startswith(f"{lm}.1.")] == [
        f"{lm}.1.self_attn.qkv_proj", f"{lm}.1.self_attn.o_proj", f"{lm}.1.block_sparse_moe.gate",
        f"{lm}.1.block_sparse_moe.experts", f"{lm}.1.block_sparse_moe.shared_experts.gate_up_proj",
        f"{lm}.1.block_sparse_moe.shared_experts.down_proj"]  # fmt: skip
    sparse_qkv = layers[f"{lm}.1.self_attn.qkv_proj"]
    assert sparse_qkv.shards == tuple(f"{lm}.1.self_attn.{p}_proj" for p in "qkv")  # the packed mapping: q, k, v
    assert f"{lm}.1.self_attn.index_q_proj" in sparse_qkv.checkpoint_modules  # the indexer loads into qkv_proj
    assert layers[f"{lm}.1.block_sparse_moe.gate"].quantizable is False
    assert "vision_tower.multi_modal_projector.linear_1" in layers  # the mapper's rename
    assert "vision_tower.vision_model.encoder.layers.0.fc1" in layers


def test_inspect_apply_check(run):
    assert run["inspect"].exit_code == 0, run["inspect"].output
    shown = json.loads(run["inspect"].stdout)
    assert shown["architecture"] == "MiniMaxM3SparseForConditionalGeneration" and shown["model_kind"] == "moe-target"
    quantized = {d["runtime_name"] for d in run["apply"]["layers"] if d["action"] == "quantize"}
    assert quantized == {f"language_model.model.layers.{i}.block_sparse_moe.experts" for i in MOE_LAYERS}
    assert run["check"].exit_code == 0, run["check"].output
    assert json.loads(run["check"].stdout)["ok"] is True


def test_headers_quantized_where_intended_kept_where_intended_nothing_dropped(run):
    import torch

    src, out = _tensors(run["src"]), _tensors(run["out"])
    experts = tuple(f"language_model.model.layers.{i}.block_sparse_moe.experts." for i in MOE_LAYERS)
    assert set(out) == set(src) | {n.replace(".weight", ".weight_scale") for n in src if n.startswith(experts)}
    for name, t in src.items():
        if name.startswith(experts):
            assert out[name].dtype == torch.uint8 and tuple(out[name].shape) == (t.shape[0], t.shape[1] // 2), name
        else:  # attention + indexer projections, router + bias (F32), shared experts, dense MLP, vision tower
            assert out[name].dtype == t.dtype and torch.equal(out[name].view(torch.uint8), t.view(torch.uint8)), name
