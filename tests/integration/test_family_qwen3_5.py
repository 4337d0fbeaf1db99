# tier: integration
"""Qwen3.6 dense (Qwen3_5ForConditionalGeneration, model_type qwen3_5, text model qwen3_5_text): a tiny replica built
from the Qwen3.5-MoE replica's published layout (tests/fixtures/checkpoints/) with the dense MLP the dense release stores in
every layer and in its MTP block, through inspect, apply --recipe fp8-target and check --vllm off; a MoE recipe on it
is refused in one line naming the kind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from quantkit.cli import main
from quantkit.naming.archs import family_of, runtime_layers
from tests.fixtures import checkpoints as ck

DENSE_I = 256
_MOE_KEYS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
             "decoder_sparse_step", "mlp_only_layers", "norm_topk_prob", "router_aux_loss_coef")  # fmt: skip
TEXT = {**{k: v for k, v in ck.QWEN3_5_MOE_CONFIG["text_config"].items() if k not in _MOE_KEYS},
        "model_type": "qwen3_5_text", "intermediate_size": DENSE_I}  # fmt: skip
CONFIG = {
    **ck.QWEN3_5_MOE_CONFIG,
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "model_type": "qwen3_5",
    "text_config": TEXT,
    "vision_config": {**ck.QWEN3_5_MOE_CONFIG["vision_config"], "model_type": "qwen3_5"},
}


def dense_tensors() -> dict[str, tuple[tuple[int, ...], str]]:
    """The MoE replica's names with each layer's (and the MTP layer's) `mlp.*` replaced by a dense gate/up/down."""
    moe = ck.qwen3_5_moe_tensors(ck.QWEN3_5_MOE_CONFIG, fused_experts=False)
    out = {n: v for n, v in moe.items() if ".mlp." not in n}
    H = ck.H
    for p in [f"model.language_model.layers.{i}" for i in range(TEXT["num_hidden_layers"])] + ["mtp.layers.0"]:
        out |= {f"{p}.mlp.gate_proj.weight": ((DENSE_I, H), "BF16"), f"{p}.mlp.up_proj.weight": ((DENSE_I, H), "BF16"),
                f"{p}.mlp.down_proj.weight": ((H, DENSE_I), "BF16")}  # fmt: skip
    return out


def _tensors(folder: Path):
    from safetensors import safe_open

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), "pt") as s:
            out |= {k: s.get_tensor(k) for k in s.keys()}
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    base = tmp_path_factory.mktemp("qwen36")
    src = ck.write(base / "q36", CONFIG, dense_tensors(), seed=36)
    dst = base / "q36-fp8"
    runner = CliRunner()
    shown = runner.invoke(main, ["inspect", str(src), "--json"])
    applied = runner.invoke(
        main, ["apply", "--recipe", "fp8-target", "--model", str(src), "--output", str(dst), "--json"]
    )
    assert applied.exit_code == 0, applied.output
    checked = runner.invoke(main, ["check", str(dst), "--vllm", "off", "--json"])
    moe = runner.invoke(main, ["apply", "--recipe", "mxfp4-moe", "--model", str(src), "--output", str(base / "x")])
    return {"src": src, "out": dst, "inspect": shown, "apply": json.loads(applied.stdout), "check": checked, "moe": moe}


def test_runtime_names_are_dense_hybrid():
    assert family_of(CONFIG).name == "qwen3_5"
    layers = {layer.name: layer for layer in runtime_layers(CONFIG, list(dense_tensors()))}
    lm = "language_model.model.layers"
    assert [n for n in layers if n.startswith(f"{lm}.0.")] == [
        f"{lm}.0.linear_attn.in_proj_qkvz", f"{lm}.0.linear_attn.in_proj_ba", f"{lm}.0.linear_attn.conv1d",
        f"{lm}.0.linear_attn.out_proj", f"{lm}.0.mlp.gate_up_proj", f"{lm}.0.mlp.down_proj"]  # fmt: skip
    assert f"{lm}.3.self_attn.qkv_proj" in layers and not any(".experts" in n or "mtp." in n for n in layers)


def test_inspect_apply_check_and_moe_recipe_refused(run):
    assert run["inspect"].exit_code == 0, run["inspect"].output
    assert json.loads(run["inspect"].stdout)["model_kind"] == "dense-target"
    assert run["check"].exit_code == 0, run["check"].output
    assert json.loads(run["check"].stdout)["ok"] is True
    line = run["moe"].stderr.strip()
    assert run["moe"].exit_code == 2 and "\n" not in line
    assert "dense-target" in line and "quantkit recipes list" in line


def test_headers(run):
    import torch

    src, out = _tensors(run["src"]), _tensors(run["out"])
    quantized = {d["runtime_name"] for d in run["apply"]["layers"] if d["action"] == "quantize"}
    assert "language_model.model.layers.0.mlp.gate_up_proj" in quantized and "language_model.lm_head" not in quantized
    lm = "model.language_model.layers"
    assert out[f"{lm}.0.mlp.gate_proj.weight"].dtype == torch.float8_e4m3fn
    assert out[f"{lm}.3.self_attn.q_proj.weight"].dtype == torch.float8_e4m3fn
    for name, t in src.items():  # kept: MTP block, vision tower, conv1d, norms, embeddings, lm_head
        if (
            name.startswith(("mtp.", "model.visual.", "lm_head", "model.language_model.embed_tokens"))
            or ".conv1d." in name
            or "norm" in name
        ):
            assert out[name].dtype == t.dtype and torch.equal(out[name].view(torch.uint8), t.view(torch.uint8)), name
    assert set(src) <= set(out)
