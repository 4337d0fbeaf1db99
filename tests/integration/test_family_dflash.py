# tier: integration
"""DFlash drafts (DFlashDraftModel: z-lab's Qwen3 DFlash drafts): a tiny seeded replica in the published layout
(config.json with dflash_config.target_layer_ids and mask_token_id, block_size; tensors layers.<i>.*, fc, hidden_norm,
norm, no lm_head) against the bundled tiny target, through inspect, apply --recipe fp8-draft, check --vllm off and deploy with
`"method": "dflash"`, which vLLM's SpeculativeConfig method type accepts."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from quantkit.cli import main
from quantkit.naming.archs import family_of, runtime_layers, speculative_method
from tests.fixtures.checkpoints import write_checkpoint

H, LAYERS, HEADS, KV, HD, MLP, V = 256, 2, 4, 2, 64, 256, 2048
TARGET = Path(__file__).parents[2] / "examples" / "tiny" / "target"  # LlamaForCausalLM, hidden 256, 4 layers
CONFIG = {
    "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": H, "num_hidden_layers": LAYERS,
    "num_attention_heads": HEADS, "num_key_value_heads": KV, "head_dim": HD, "intermediate_size": MLP,
    "vocab_size": V, "rms_norm_eps": 1e-6, "max_position_embeddings": 1024, "rope_theta": 1000000,
    "hidden_act": "silu", "torch_dtype": "bfloat16", "tie_word_embeddings": False, "block_size": 16,
    "dflash_config": {"mask_token_id": V - 1, "target_layer_ids": [0, 1]},
}  # fmt: skip


def dflash_tensors(seed: int = 16) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes: dict[str, tuple[int, ...]] = {"fc.weight": (H, 2 * H), "hidden_norm.weight": (H,), "norm.weight": (H,)}
    for i in range(LAYERS):
        p = f"layers.{i}"
        shapes |= {f"{p}.self_attn.q_proj.weight": (HEADS * HD, H), f"{p}.self_attn.k_proj.weight": (KV * HD, H),
                   f"{p}.self_attn.v_proj.weight": (KV * HD, H), f"{p}.self_attn.o_proj.weight": (H, HEADS * HD),
                   f"{p}.self_attn.q_norm.weight": (HD,), f"{p}.self_attn.k_norm.weight": (HD,),
                   f"{p}.mlp.gate_proj.weight": (MLP, H), f"{p}.mlp.up_proj.weight": (MLP, H),
                   f"{p}.mlp.down_proj.weight": (H, MLP), f"{p}.input_layernorm.weight": (H,),
                   f"{p}.post_attention_layernorm.weight": (H,)}  # fmt: skip
    return {n: (torch.randn(*s, generator=g) * 0.05).to(torch.bfloat16) for n, s in shapes.items()}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    base = tmp_path_factory.mktemp("dflash")
    target = TARGET
    n_target = json.loads((target / "config.json").read_text())["num_hidden_layers"]
    src = write_checkpoint(base / "draft", dflash_tensors(), CONFIG)
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
        "n_target": n_target,
        "inspect": shown,
        "apply": json.loads(applied.stdout),
        "check": checked,
        "deploy": deployed,
    }


def test_runtime_names_follow_qwen3_dflash():
    assert family_of(CONFIG).name == "dflash" and speculative_method(CONFIG) == "dflash"
    layers = {layer.name: layer for layer in runtime_layers(CONFIG, list(dflash_tensors()), 36)}
    assert list(layers) == [
        "model.fc",
        *[
            f"model.layers.{36 + i}.{s}"
            for i in range(LAYERS)
            for s in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
        ],
        "lm_head",
    ]
    assert layers["model.layers.36.self_attn.qkv_proj"].shards == tuple(
        f"model.layers.36.self_attn.{p}_proj" for p in "qkv"
    )
    assert layers["lm_head"].checkpoint_modules == () and layers["lm_head"].quantizable is False  # the target's


def test_inspect_apply_check_deploy(run):
    assert run["inspect"].exit_code == 0, run["inspect"].output
    assert json.loads(run["inspect"].stdout)["model_kind"] == "eagle3-draft"
    assert run["check"].exit_code == 0, run["check"].output
    assert json.loads(run["check"].stdout)["ok"] is True
    assert run["deploy"].exit_code == 0, run["deploy"].output
    spec = json.loads(run["deploy"].stdout)["speculative_config"]
    from vllm.config.speculative import SpeculativeConfig

    allowed = {a for t in typing.get_args(typing.get_type_hints(SpeculativeConfig)["method"])
               for a in (typing.get_args(t) or (t,))}  # fmt: skip
    assert spec["method"] == "dflash" and "dflash" in allowed


def _tensors(folder: Path):
    from safetensors import safe_open

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), "pt") as s:
            out |= {k: s.get_tensor(k) for k in s.keys()}
    return out


def test_headers(run):
    src, out = _tensors(run["src"]), _tensors(run["out"])
    for i in range(LAYERS):
        for m in ("self_attn.q_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj"):
            assert out[f"layers.{i}.{m}.weight"].dtype == torch.float8_e4m3fn, (i, m)
    for name in ("hidden_norm.weight", "norm.weight", "layers.0.self_attn.q_norm.weight"):
        assert torch.equal(out[name].view(torch.uint8), src[name].view(torch.uint8)), name
    assert set(src) <= set(out) and "lm_head.weight" not in out
