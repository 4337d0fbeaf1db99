"""EAGLE-3 drafts with an MoE decoder layer (SpecForge Qwen3MoEForCausalLMEagle3, GptOssForCausalLMEagle3; family
record quantkit/naming/archs/eagle3_moe.py) on tiny seeded replicas generated here from SpecForge's published configs
(configs/qwen3-30B-A3B-eagle3-moe-draft.json, configs/gpt-oss-20B-eagle3-moe.json, shrunk) with the tensor names its
training models save (specforge/modeling/draft/qwen3_moe_eagle.py: stacked `mlp.gate_weight / up_weight /
down_weight`, top-level `hidden_norm`; gpt_oss_eagle.py: transformers' GptOssMLP, `mlp.router` and fused
`mlp.experts.gate_up_proj [E, H, 2I]`). inspect, apply fp8-draft (experts and attention FP8, router / fc / lm_head /
embeddings / norms byte-identical), `check --vllm off`, the output headers decoded by hand against the source, the
one-line refusals of `check --vllm auto|required`, `deploy` and `acceptance` (vLLM 0.32's registry builds no such draft) and where
their hint leads, and the Quark engine (refused in one line on the stacked / fused layouts, byte-identical to the
native executor on the per-expert layout)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import ROOT, require_vllm
from tests.fixtures.checkpoints import tensors, write_checkpoint
from tests.fixtures.cli import cli, cli_json, one_line_error

TARGET = ROOT / "examples" / "tiny" / "target"  # LlamaForCausalLM, hidden 256, 4 layers, vocab 2048
BF = torch.bfloat16

# SpecForge configs/qwen3-30B-A3B-eagle3-moe-draft.json as published, then shrunk (sizes only) to the tiny target.
QWEN3_MOE_DRAFT_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3MoEForCausalLMEagle3"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144, "max_position_embeddings": 262144,
    "max_window_layers": 1, "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
    "norm_topk_prob": True, "num_attention_heads": 32, "num_hidden_layers": 1, "num_experts": 128,
    "num_experts_per_tok": 8, "num_key_value_heads": 4, "output_router_logits": False, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.1, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.53.2", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936, "draft_vocab_size": 32000,
    "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 23, 44]},
}  # fmt: skip
# SpecForge configs/gpt-oss-20B-eagle3-moe.json as published.
GPT_OSS_DRAFT_CONFIG: dict[str, Any] = {
    "architectures": ["GptOssForCausalLMEagle3"], "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 11, 21]},
    "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880, "initializer_range": 0.02, "intermediate_size": 17280,
    "num_local_experts": 16, "max_position_embeddings": 4096, "model_type": "gpt_oss", "num_attention_heads": 64,
    "num_key_value_heads": 8, "num_hidden_layers": 1, "pad_token_id": 0, "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.52.3", "use_cache": True,
    "rope_theta": 150000, "vocab_size": 201088, "experts_per_token": 4, "draft_vocab_size": 32000,
}  # fmt: skip
# The tiny target's sizes: hidden 256, vocab 2048, 4 layers (aux ids must be below 4).
SHRINK: dict[str, Any] = {"hidden_size": 256, "vocab_size": 2048, "draft_vocab_size": 512, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 64, "max_position_embeddings": 4096,
          "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}}  # fmt: skip
QWEN3: dict[str, Any] = dict(QWEN3_MOE_DRAFT_CONFIG, **SHRINK, intermediate_size=512, moe_intermediate_size=64, num_experts=8,
             num_experts_per_tok=2, bos_token_id=1, eos_token_id=2)  # fmt: skip
GPT_OSS: dict[str, Any] = dict(
    GPT_OSS_DRAFT_CONFIG, **SHRINK, intermediate_size=64, num_local_experts=4, experts_per_token=2
)
NO_VLLM = "vLLM 0.32 builds no EAGLE-3 draft with an MoE decoder layer (vllm/model_executor/models/registry.py"


def _tensors(shapes: dict[str, tuple[int, ...]], config: dict, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {n: (torch.ones(s) + torch.randn(*s, generator=g) * 0.01 if "norm" in n else torch.randn(*s, generator=g)
               * 0.05).to(BF) for n, s in shapes.items()}  # fmt: skip
    v, dv = config["vocab_size"], config["draft_vocab_size"]
    hot = torch.randperm(v, generator=g)[:dv].sort().values  # the draft vocabulary: dv target ids, ascending
    out["d2t"] = hot - torch.arange(dv)  # draft id -> target id offset
    out["t2d"] = torch.zeros(v, dtype=torch.bool)
    out["t2d"][hot] = True
    return out


def _attention(h: int, c: dict) -> dict[str, tuple[int, ...]]:
    q, kv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    # Llama attention of the EAGLE-3 midlayer: input is [embeds, hidden] (2 x hidden)
    return {"midlayer.self_attn.q_proj.weight": (q, 2 * h), "midlayer.self_attn.k_proj.weight": (kv, 2 * h),
            "midlayer.self_attn.v_proj.weight": (kv, 2 * h), "midlayer.self_attn.o_proj.weight": (h, q),
            "midlayer.input_layernorm.weight": (h,), "midlayer.post_attention_layernorm.weight": (h,),
            "fc.weight": (h, 3 * h), "norm.weight": (h,), "lm_head.weight": (c["draft_vocab_size"], h)}  # fmt: skip


def qwen3_moe_draft(out: Path, layout: str = "stacked", seed: int = 0) -> Path:
    """Qwen3MoEForCausalLMEagle3 as SpecForge saves it: embed_tokens, fc, hidden_norm (top level: "I don't want to
    change Qwen3MoeDecoderLayer so let's do it here"), midlayer with q_norm / k_norm, router mlp.gate [E, H] and
    SpecForgeQwen3MoeSparseMoeBlock's stacked gate_weight / up_weight [E, I, H], down_weight [E, H, I]; or, with
    `layout="per-expert"`, the same values re-saved as mlp.experts.<e>.{gate,up,down}_proj.weight."""
    c = QWEN3
    h, e, m = c["hidden_size"], c["num_experts"], c["moe_intermediate_size"]
    shapes = _attention(h, c) | {
        "embed_tokens.weight": (c["vocab_size"], h), "hidden_norm.weight": (h,),
        "midlayer.self_attn.q_norm.weight": (c["head_dim"],), "midlayer.self_attn.k_norm.weight": (c["head_dim"],),
        "midlayer.mlp.gate.weight": (e, h), "midlayer.mlp.gate_weight": (e, m, h), "midlayer.mlp.up_weight": (e, m, h),
        "midlayer.mlp.down_weight": (e, h, m)}  # fmt: skip
    t = _tensors(shapes, c, seed)
    if layout == "per-expert":
        for p in ("gate", "up", "down"):
            stacked = t.pop(f"midlayer.mlp.{p}_weight")
            t |= {f"midlayer.mlp.experts.{x}.{p}_proj.weight": stacked[x].clone() for x in range(e)}
    return write_checkpoint(out, t, c, shard_bytes=1 << 19)


def gpt_oss_draft(out: Path, seed: int = 0) -> Path:
    """GptOssForCausalLMEagle3 as SpecForge saves it: LlamaForCausalLMEagle3 (midlayer.hidden_norm inside the layer,
    no embed_tokens) with transformers' GptOssMLP: router weight [E, H] + bias [E], experts gate_up_proj [E, H, 2I]
    (gate and up interleaved), gate_up_proj_bias [E, 2I], down_proj [E, I, H], down_proj_bias [E, H]."""
    c = GPT_OSS
    h, e, i = c["hidden_size"], c["num_local_experts"], c["intermediate_size"]
    shapes = _attention(h, c) | {
        "midlayer.hidden_norm.weight": (h,), "midlayer.mlp.router.weight": (e, h), "midlayer.mlp.router.bias": (e,),
        "midlayer.mlp.experts.gate_up_proj": (e, h, 2 * i), "midlayer.mlp.experts.gate_up_proj_bias": (e, 2 * i),
        "midlayer.mlp.experts.down_proj": (e, i, h), "midlayer.mlp.experts.down_proj_bias": (e, h)}  # fmt: skip
    return write_checkpoint(out, _tensors(shapes, c, seed), c, shard_bytes=1 << 19)


MAKERS = {"qwen3-stacked": lambda p: qwen3_moe_draft(p), "qwen3-per-expert": lambda p: qwen3_moe_draft(p, "per-expert"),
          "gpt-oss": gpt_oss_draft}  # fmt: skip
ROUTER = {
    "qwen3-stacked": "midlayer.mlp.gate",
    "qwen3-per-expert": "midlayer.mlp.gate",
    "gpt-oss": "midlayer.mlp.router",
}


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8),
                                                                     b.contiguous().view(torch.uint8))  # fmt: skip


def assert_fp8_of(out: dict[str, torch.Tensor], name: str, source: torch.Tensor) -> None:
    """ptpc FP8 by hand: e4m3 weight [out, in] times its per-row F32 scale is `source` within e4m3's rounding (3
    mantissa bits: 1/16 of a value, 1/8 bounded here as the quotient is rounded to BF16 first, plus the subnormal
    step of the row's scale). A wrong expert, split or transpose is off by the values themselves."""
    w, s = out[f"{name}.weight"], out[f"{name}.weight_scale"]
    assert w.dtype == torch.float8_e4m3fn and w.shape == source.shape, (name, w.dtype, w.shape)
    assert s.dtype == torch.float32 and s.numel() == source.shape[0] and bool((s > 0).all()), name
    got, ref = w.float() * s.reshape(-1, 1), source.float()
    assert bool(((got - ref).abs() <= ref.abs() / 8 + s.reshape(-1, 1) / 8 + 1e-8).all()), name
    assert float(torch.corrcoef(torch.stack([got.flatten(), ref.flatten()]))[0, 1]) > 0.99, name


@pytest.fixture(scope="module")
def drafts(tmp_path_factory) -> dict[str, dict[str, Path]]:
    """Each replica and its fp8-draft output (applied with the target, as a user would)."""
    base = tmp_path_factory.mktemp("moe-drafts")
    out = {}
    for name, make in MAKERS.items():
        src = make(base / name)
        dst = base / f"{name}-fp8"
        applied = cli_json("apply", "--recipe", "fp8-draft", "--model", str(src), "--target", str(TARGET), "--output",
                           str(dst))  # fmt: skip
        out[name] = {"src": src, "out": dst, "applied": applied}
    return out


# --- inspect ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(MAKERS))
def test_inspect_names_the_draft_layers_and_the_expert_layout(name, tmp_path):
    src = MAKERS[name](tmp_path / name)
    shown = cli_json("inspect", str(src))
    assert shown["model_kind"] == "eagle3-draft", shown
    layers = {d["name"]: d for d in shown["layers"]}
    want = {"fc", "midlayer.self_attn.q_proj", "midlayer.self_attn.k_proj", "midlayer.self_attn.v_proj",
            "midlayer.self_attn.o_proj", ROUTER[name], "midlayer.mlp.experts", "lm_head"}  # fmt: skip
    assert set(layers) == want | ({"embed_tokens"} if name.startswith("qwen3") else set()), sorted(layers)
    assert layers["midlayer.mlp.experts"]["kind"] == "moe" and layers[ROUTER[name]]["kind"] == "router"
    fmt = shown["source_format"]
    if name == "qwen3-stacked":
        assert fmt.startswith("qwen3_moe with 8 experts stacked per layer (mlp.gate_weight, mlp.up_weight"), fmt
    elif name == "gpt-oss":
        assert fmt.startswith("gpt_oss with 4 experts fused per layer (experts.gate_up_proj [E, H, 2I])"), fmt
    else:
        assert fmt.startswith("unquantized"), fmt


# --- apply, check --vllm off, the headers ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(MAKERS))
def test_apply_fp8_draft_quantizes_attention_and_experts_and_keeps_the_rest_byte_identical(name, drafts):
    d = drafts[name]
    actions = {x["runtime_name"]: x["action"] for x in d["applied"]["layers"]}
    kept = {"fc", "lm_head", ROUTER[name]} | ({"embed_tokens"} if name.startswith("qwen3") else set())
    assert {n for n, a in actions.items() if a == "keep"} == kept, actions
    assert {n for n, a in actions.items() if a == "quantize"} == {
        "midlayer.self_attn.q_proj", "midlayer.self_attn.k_proj", "midlayer.self_attn.v_proj",
        "midlayer.self_attn.o_proj", "midlayer.mlp.experts"}  # fmt: skip
    config = json.loads((d["out"] / "config.json").read_text())
    qc = config["quantization_config"]
    assert qc["quant_method"] == "quark" and sorted(qc["exclude"]) == sorted(kept), qc["exclude"]
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]

    src, out = tensors(d["src"]), tensors(d["out"])
    experts = {k: v for k, v in config.items() if k in ("num_experts", "num_local_experts")}
    e = next(iter(experts.values()))
    # attention: FP8 with a scale, decoding to the source
    for p in "qkvo":
        name_p = f"midlayer.self_attn.{p}_proj"
        assert_fp8_of(out, name_p, src[f"{name_p}.weight"])
    # experts: per expert FP8, each the right slice of the stored layout (a wrong split or transpose fails here)
    for x in range(e):
        base = f"midlayer.mlp.experts.{x}"
        if name == "gpt-oss":
            assert_fp8_of(out, f"{base}.gate_up_proj", src["midlayer.mlp.experts.gate_up_proj"][x].t())
            assert_fp8_of(out, f"{base}.down_proj", src["midlayer.mlp.experts.down_proj"][x].t())
            assert same_bytes(out[f"{base}.gate_up_proj.bias"], src["midlayer.mlp.experts.gate_up_proj_bias"][x])
            assert same_bytes(out[f"{base}.down_proj.bias"], src["midlayer.mlp.experts.down_proj_bias"][x])
        else:
            for p in ("gate", "up", "down"):
                ref = (
                    src[f"{base}.{p}_proj.weight"] if name == "qwen3-per-expert" else src[f"midlayer.mlp.{p}_weight"][x]
                )
                assert_fp8_of(out, f"{base}.{p}_proj", ref)
    # every other tensor (router, fc, lm_head, embeddings, norms, d2t, t2d) byte-identical to the source
    scales = [n for n in out if n.endswith(".weight_scale")]
    quantized = set(scales) | {n.removesuffix("_scale") for n in scales}
    kept_tensors = [n for n in out if n not in quantized and not n.startswith("midlayer.mlp.experts.")]
    assert {"fc.weight", "lm_head.weight", f"{ROUTER[name]}.weight", "norm.weight", "d2t", "t2d"} <= set(kept_tensors)
    for n in kept_tensors:
        assert n in src and same_bytes(out[n], src[n]), n
    assert not [n for n in src if n not in out and "experts" not in n and not n.endswith("_weight")]
    assert not [n for n in out if n.endswith(("gate_weight", "up_weight", "down_weight", "gate_up_proj",
                                              "down_proj", "_bias"))]  # the stored layouts are gone  # fmt: skip

    checked = cli_json("check", str(d["out"]), "--target", str(TARGET), "--vllm", "off")
    assert checked["ok"] is True, checked["findings"]
    assert not [f for f in checked["findings"] if f["severity"] in ("error", "warning")], checked["findings"]


def test_check_finds_a_damaged_expert_scale(drafts, tmp_path):
    """check --vllm off is structural, not a rubber stamp: a zeroed expert scale is an error."""
    import shutil

    from safetensors.torch import load_file, save_file

    out = tmp_path / "damaged"
    shutil.copytree(drafts["qwen3-stacked"]["out"], out)
    victim = "midlayer.mlp.experts.3.down_proj.weight_scale"
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shard = out / index["weight_map"][victim]
    tensors = load_file(str(shard))
    tensors[victim] = torch.zeros_like(tensors[victim])
    save_file(tensors, str(shard), metadata={"format": "pt"})
    res = cli("check", str(out), "--target", str(TARGET), "--vllm", "off", "--json")
    assert res.exit_code == 1, res.output
    found = json.loads(res.stdout)["findings"]
    assert any(f["severity"] == "error" and "experts.3.down_proj" in f["layer_or_tensor"] for f in found), found


def test_a_recipe_can_put_the_experts_in_mxfp4(drafts, tmp_path):
    """ "experts FP8, or MXFP4 if a recipe says so": an fp8-draft variant whose override gives the experts mxfp4."""
    recipe = tmp_path / "fp8-draft-mxfp4-experts.yaml"
    text = (ROOT / "recipes" / "fp8-draft.yaml").read_text().replace("name: fp8-draft", "name: fp8-draft-mxfp4-experts")
    recipe.write_text(
        text.replace(
            "quantize: [decoder_linears, experts]",
            "quantize: [decoder_linears, experts]\n"
            "overrides:\n  - role: experts\n    scheme: mxfp4\n    reason: experts in MXFP4\n",
        )
    )
    out = tmp_path / "out"
    applied = cli_json("apply", "--recipe", str(recipe), "--model", str(drafts["gpt-oss"]["src"]), "--target",
                       str(TARGET), "--output", str(out))  # fmt: skip
    schemes = {x["runtime_name"]: x["scheme"] for x in applied["layers"] if x["action"] == "quantize"}
    assert schemes["midlayer.mlp.experts"] == "mxfp4" and schemes["midlayer.self_attn.q_proj"] == "ptpc_fp8"
    got = tensors(out)
    w = got["midlayer.mlp.experts.0.gate_up_proj.weight"]
    assert w.dtype == torch.uint8 and w.shape == (2 * GPT_OSS["intermediate_size"], GPT_OSS["hidden_size"] // 2)
    assert got["midlayer.self_attn.q_proj.weight"].dtype == torch.float8_e4m3fn
    checked = cli_json("check", str(out), "--target", str(TARGET), "--vllm", "off")
    assert checked["ok"] is True, checked["findings"]


def test_a_moe_recipe_says_the_draft_is_a_draft(drafts, tmp_path):
    """Before, apply said "is a moe-target; pick a recipe for moe-target" and that recipe then said "not supported".
    Now the draft is an eagle3-draft: an MoE target recipe is refused naming eagle3-draft, and fp8-draft (what that
    hint leads to) applies (the fixture)."""
    line = one_line_error(cli("apply", "--recipe", "mxfp4-moe", "--model", str(drafts["qwen3-stacked"]["src"]),
                              "--output", str(tmp_path / "x")))  # fmt: skip
    assert "is a eagle3-draft" in line and "pick a recipe for eagle3-draft" in line, line
    assert "moe-target (" not in line and "not supported" not in line
    assert drafts["qwen3-stacked"]["applied"]["model_kind"] == "eagle3-draft"


# --- what vLLM cannot do --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["qwen3-stacked", "gpt-oss"])
def test_vllm_load_and_deploy_are_refused_in_one_line_and_the_hint_works(name, drafts, tmp_path):
    d = drafts[name]
    arch = json.loads((d["out"] / "config.json").read_text())["architectures"][0]
    runs = [("check", str(d["out"]), "--target", str(TARGET), "--vllm", "auto"),
            ("check", str(d["out"]), "--target", str(TARGET), "--vllm", "required"),
            ("check", str(d["out"]), "--vllm", "auto"),
            ("deploy", str(d["out"]), "--target", str(TARGET), "--out", str(tmp_path)),
            ("deploy", str(d["out"]), "--out", str(tmp_path))]  # fmt: skip
    lines = [one_line_error(cli(*args)) for args in runs]
    for line in lines:
        assert NO_VLLM in line and f"has no {arch}" in line, line
        assert "pick a recipe" not in line and "--target" not in line, line
    assert not (tmp_path / "deploy.json").exists()
    # the hint: the command the line names, run as it says
    hint = shlex.split(lines[0].rsplit(": ", 1)[1])
    assert hint[:2] == ["quantkit", "check"] and hint[-2:] == ["--vllm", "off"], hint
    assert cli_json(*hint[1:])["ok"] is True


@pytest.mark.parametrize("backend", ["reference", "vllm", "auto"])
def test_acceptance_is_refused_in_one_line_before_any_engine(backend, drafts):
    """Before: the reference engine died on `KeyError: 'midlayer.mlp.gate_proj.weight'` and vLLM on a
    SpeculativeConfig ValidationError. Neither engine builds an MoE-layer draft: one line, naming why."""
    d = drafts["gpt-oss"]
    line = one_line_error(cli("acceptance", "--target", str(TARGET), "--draft", str(d["src"]), "--candidate",
                              str(d["out"]), "--backend", backend))  # fmt: skip
    assert "reference engine runs dense EAGLE-3 drafts only" in line and NO_VLLM in line, line
    assert "unexpected" not in line


def test_vllms_registry_has_no_moe_layer_eagle3_draft():
    """The fact the refusal cites: vLLM's registry maps neither architecture, and every other draft layout quantkit
    names is one it maps."""
    require_vllm()
    from vllm.model_executor.models.registry import _SPECULATIVE_DECODING_MODELS

    from quantkit.naming.archs import families, family_named

    moe = family_named("eagle3_moe")
    assert not set(moe.architectures) & set(_SPECULATIVE_DECODING_MODELS)
    assert moe.draft is not None and moe.draft.vllm_refusal is not None
    others = {a for f in families() if f.draft and f.draft.vllm_refusal is None for a in f.architectures}
    assert others and others <= set(_SPECULATIVE_DECODING_MODELS)


# --- the Quark engine -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["qwen3-stacked", "gpt-oss"])
def test_quark_engine_refuses_the_stored_layouts_naming_native(name, drafts, tmp_path):
    line = one_line_error(cli("apply", "--recipe", "fp8-draft", "--model", str(drafts[name]["src"]), "--output",
                              str(tmp_path / "q"), "--engine", "quark"))  # fmt: skip
    assert "fused-experts" in line and "--engine native" in line, line
    # following it: --engine native gives the same bytes as the default run
    out = tmp_path / "n"
    cli_json("apply", "--recipe", "fp8-draft", "--model", str(drafts[name]["src"]), "--target", str(TARGET),
             "--output", str(out), "--engine", "native")  # fmt: skip
    a, b = tensors(out), tensors(drafts[name]["out"])
    assert set(a) == set(b) and all(same_bytes(a[k], b[k]) for k in a)


def test_quark_engine_on_the_per_expert_layout_matches_the_native_executor(drafts, tmp_path):
    """Real Quark 0.13 (its file-to-file path, llama template) on the per-expert layout: the same tensors and bytes
    as the native executor."""
    out = tmp_path / "quark"
    applied = cli_json("apply", "--recipe", "fp8-draft", "--model", str(drafts["qwen3-per-expert"]["src"]),
                       "--target", str(TARGET), "--output", str(out), "--engine", "quark")  # fmt: skip
    assert applied["engine"] == "quark"
    a, b = tensors(out), tensors(drafts["qwen3-per-expert"]["out"])
    assert set(a) == set(b)
    assert [k for k in a if not same_bytes(a[k], b[k])] == []
