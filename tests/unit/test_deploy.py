# tier: unit
"""quantkit.deploy: the vllm serve manifest and its known-bad combinations, tokenizer drift, size ratio (the verdict tests are in tests/unit/test_verdict.py; the rules against vLLM's own source and classes in tests/integration/test_deploy_against_vllm.py)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import struct
from pathlib import Path

import pytest

from quantkit.deploy.run import DeployInputError
from quantkit.deploy.run import run as deploy_manifest
from quantkit.gate.release import size_ratio, tokenizer_drift
from quantkit.results.deploy import DEPLOY_FILE
from quantkit.rules.table import KNOWN_BAD

DTYPE_BYTES = {"BOOL": 1, "BF16": 2, "F16": 2, "F32": 4, "U8": 1, "F8_E4M3": 1, "I32": 4, "I64": 8}


def read_safetensors(path: Path) -> dict[str, tuple[str, list[int], bytes]]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    return {
        k: (v["dtype"], v["shape"], data[v["data_offsets"][0] : v["data_offsets"][1]])
        for k, v in header.items()
        if k != "__metadata__"
    }


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], bytes | None]]) -> None:
    """A valid safetensors file; tensor bytes default to zeros of the right size."""
    header, blobs, offset = {}, [], 0
    for name, (dtype, shape, blob) in tensors.items():
        size = DTYPE_BYTES[dtype]
        for d in shape:
            size *= d
        blob = blob if blob is not None else bytes(size)
        assert len(blob) == size
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        blobs.append(blob)
        offset += size
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            config.pop(k, None)
        else:
            config[k] = v
    (folder / "config.json").write_text(json.dumps(config, indent=2))


@pytest.fixture
def pair(tiny, tmp_path):
    """Copies of the bundled target and EAGLE-3 draft, to damage."""
    target, draft = tmp_path / "target", tmp_path / "draft"
    shutil.copytree(tiny / "target", target)
    shutil.copytree(tiny / "eagle3-draft", draft)
    return target, draft


def mxfp4_moe(tiny, folder: Path) -> Path:
    """A header-level MXFP4 copy of the tiny MoE target's first layer: experts' weights uint8 [out, in/2] with E8M0
    scales [out, in/32] (Quark's layout, quark_ocp_mx.py); moe_intermediate_size 128, hidden 256."""
    folder.mkdir()
    shutil.copy(tiny / "moe-target" / "config.json", folder / "config.json")
    tensors: dict[str, tuple[str, list[int], bytes | None]] = {}
    for e in range(8):
        p = f"model.layers.0.mlp.experts.{e}"
        for proj, (out, inp) in {"gate_proj": (128, 256), "up_proj": (128, 256), "down_proj": (256, 128)}.items():
            tensors[f"{p}.{proj}.weight"] = ("U8", [out, inp // 2], None)
            tensors[f"{p}.{proj}.weight_scale"] = ("U8", [out, inp // 32], None)
    tensors["model.layers.0.self_attn.o_proj.weight"] = ("BF16", [256, 256], None)
    write_safetensors(folder / "model.safetensors", tensors)
    return folder


def codes(manifest) -> set[tuple[str, str]]:
    return {(f.severity, f.code) for f in manifest.findings}


def test_pair_manifest_serves_target_with_draft_as_eagle3(tiny, tmp_path):
    m = deploy_manifest(tiny / "eagle3-draft", target=tiny / "target", platform="gfx950", tp=1)
    assert m.ok and m.findings == []
    assert m.argv[:3] == ["vllm", "serve", str(tiny / "target")]
    assert shlex.split(m.command) == m.argv
    spec = json.loads(m.argv[m.argv.index("--speculative-config") + 1])
    # on ROCm the drafter gets AITER unified attention (vllm PR #47854's workaround, quantkit.rules.serving)
    assert spec == {
        "method": "eagle3",
        "model": str(tiny / "eagle3-draft"),
        "num_speculative_tokens": 3,
        "attention_backend": "ROCM_AITER_UNIFIED_ATTN",
    }
    assert m.argv[m.argv.index("--max-model-len") + 1] == "4096"  # the target's max_position_embeddings
    assert "--kv-cache-dtype" not in m.argv  # auto is vLLM's default
    env = {e.name: e for e in m.env}
    assert env["VLLM_ROCM_USE_AITER"].value == "1"
    assert "VLLM_ROCM_USE_AITER_MOE" not in env  # a dense target
    assert m.shell.startswith("VLLM_ROCM_USE_AITER=1 ") and m.shell.endswith(m.command)
    path = m.write(tmp_path)
    assert path.name == DEPLOY_FILE
    data = json.loads(path.read_text())
    assert data["argv"] == m.argv and data["speculative_config"] == spec and data["ok"] is True
    assert data["schema_version"] == 1 and all(e["source"] for e in data["env"])


def test_published_names_replace_local_paths(tiny):
    m = deploy_manifest(
        tiny / "eagle3-draft",
        target=tiny / "target",
        model_ref="org/target",
        draft_ref="org/draft-fp8",
        num_speculative_tokens=5,
        max_model_len=8192,
        kv_cache_dtype="fp8",
    )
    assert m.argv[:3] == ["vllm", "serve", "org/target"]
    assert json.loads(m.argv[m.argv.index("--speculative-config") + 1])["model"] == "org/draft-fp8"
    assert m.argv[m.argv.index("--max-model-len") + 1] == "8192"
    assert m.argv[m.argv.index("--kv-cache-dtype") + 1] == "fp8"
    assert m.draft == "org/draft-fp8" and m.num_speculative_tokens == 5


def test_mla_target_gets_the_aiter_mla_flag(tiny, tmp_path):
    target = tmp_path / "mla"
    shutil.copytree(tiny / "moe-target", target)
    edit_config(target, kv_lora_rank=64)
    assert "VLLM_ROCM_USE_AITER_MLA" in {e.name for e in deploy_manifest(target, platform="gfx950").env}


def test_bad_inputs_are_one_line_errors(tiny):
    cases = [
        ({"folder": tiny / "eagle3-draft"}, "pass target="),
        ({"folder": tiny / "target", "target": tiny / "target"}, "target= is only for a draft"),
        ({"folder": tiny / "eagle3-draft", "target": tiny / "eagle3-draft"}, "is an EAGLE-3 draft too"),
        ({"folder": tiny / "target", "platform": "mi300"}, "unknown; use one of"),
        ({"folder": tiny / "target", "tp": 0}, "positive integer"),
        ({"folder": tiny / "target", "kv_cache_dtype": "fp4"}, "does not know it"),
    ]
    for kwargs, needle in cases:
        with pytest.raises(DeployInputError) as e:
            deploy_manifest(**kwargs)
        assert needle in str(e.value) and "\n" not in str(e.value)


def _quantize_lm_head(pair):
    _, draft = pair
    tensors = read_safetensors(draft / "model.safetensors")
    rows, cols = tensors["lm_head.weight"][1]
    tensors["lm_head.weight"] = ("F8_E4M3", [rows, cols], None)
    tensors["lm_head.weight_scale"] = ("F32", [rows, 1], None)
    write_safetensors(draft / "model.safetensors", tensors)
    return {}


def _aux_out_of_range(pair):
    edit_config(pair[1], eagle_aux_hidden_state_layer_ids=[1, 2, 7])  # the target has 4 layers: ids 0..4
    return {}


def _aux_default_repeats(pair):
    # Without ids vLLM uses (2, L//2, L-3) = (2, 2, 1) for the 4-layer target: a repeated layer.
    edit_config(pair[1], eagle_aux_hidden_state_layer_ids=None, eagle_config={"use_aux_hidden_state": True})
    return {}


def _quark_config(**export):
    return {
        "quant_method": "quark",
        "export": {"kv_cache_group": [], **export},
        "exclude": ["model.fc", "lm_head"],
        "global_quant_config": {},
        "layer_quant_config": {},
        "layer_type_quant_config": {},
    }


def _e5m2_with_quark_draft(pair):
    edit_config(pair[1], quantization_config=_quark_config())
    return {"kv_cache_dtype": "fp8_e5m2"}


def _fp8_kv_unscaled_draft(pair):
    return {"kv_cache_dtype": "fp8"}


def _fp8_kv_cpu_head_size(pair):
    edit_config(pair[0], head_dim=48, num_attention_heads=4)
    return {"kv_cache_dtype": "fp8", "platform": "cpu"}


def _tp_heads(pair):
    return {"tp": 3}  # 4 attention heads, 2 KV heads


def _k_zero(pair):
    return {"num_speculative_tokens": 0}


def _k_large(pair):
    return {"num_speculative_tokens": 12}


def _max_model_len_beyond(pair):
    return {"max_model_len": 4097}  # the tiny target holds 4096 positions (max_position_embeddings)


def _fp8_down_proj(draft, scale_shape):
    """The draft's down_proj as Quark's ptpc FP8 writes it (F8_E4M3 weight, F32 per-channel scale), scale shaped
    `scale_shape` with `out` for the output rows."""
    tensors = read_safetensors(draft / "model.safetensors")
    out, cols = tensors["midlayer.mlp.down_proj.weight"][1]
    tensors["midlayer.mlp.down_proj.weight"] = ("F8_E4M3", [out, cols], None)
    tensors["midlayer.mlp.down_proj.weight_scale"] = ("F32", [out if d == "out" else d for d in scale_shape], None)
    write_safetensors(draft / "model.safetensors", tensors)
    ptpc = {
        "weight": {"dtype": "fp8_e4m3", "qscheme": "per_channel", "ch_axis": 0, "is_dynamic": False, "symmetric": True},
        "input_tensors": {
            "dtype": "fp8_e4m3",
            "qscheme": "per_channel",
            "ch_axis": 1,
            "is_dynamic": True,
            "symmetric": True,
        },
        "output_tensors": None,
        "bias": None,
    }
    qc = _quark_config()
    qc["exclude"] += ["re:.*(q|k|v|o|gate|up)_proj"]  # every other linear stays BF16
    qc["layer_quant_config"] = {"*down_proj": ptpc}
    edit_config(draft, quantization_config=qc)


def _fp8_scale_2d(pair):
    _fp8_down_proj(pair[1], ["out", 1])
    return {}


def _fp8_fp16_target(pair):
    _fp8_down_proj(pair[1], ["out"])
    edit_config(pair[0], torch_dtype="float16")
    return {}


def _fp8_draft_gfx942(pair):
    _fp8_down_proj(pair[1], ["out"])
    return {"platform": "gfx942"}


def _draft_rocm_attn(pair):
    return {"draft_attention_backend": "ROCM_ATTN"}


def _block_size_1(pair):
    return {"block_size": 1}


def _kv_group_unmatched(pair):
    edit_config(pair[1], quantization_config=_quark_config(kv_cache_group=["*k_proj", "*v_proj"]))
    return {}


def _mla_quark_target_fp8_kv(pair):
    kv = {"output_tensors": {"dtype": "fp8_e4m3", "qscheme": "per_tensor", "is_dynamic": False}}
    qc = _quark_config(kv_cache_group=["*k_proj", "*v_proj"])
    qc["layer_quant_config"] = {"*k_proj": kv, "*v_proj": kv}
    edit_config(pair[0], quantization_config=qc, kv_lora_rank=64)  # an MLA config under Quark
    return {"kv_cache_dtype": "fp8"}


def _vocab_mismatch(pair):
    edit_config(pair[0], vocab_size=4096)
    return {}


CASES = {  # name: (damage, expected (severity, code))
    "quantized draft lm_head": (_quantize_lm_head, ("error", "lm-head-quantized")),
    "aux ids beyond the target": (_aux_out_of_range, ("error", "aux-layer-out-of-range")),
    "default aux ids repeat": (_aux_default_repeats, ("error", "aux-layer-ids")),
    "fp8_e5m2 KV with a Quark draft": (_e5m2_with_quark_draft, ("error", "kv-fp8-e5m2-quark")),
    "fp8 KV for a draft without scales": (_fp8_kv_unscaled_draft, ("warning", "kv-fp8-draft-unscaled")),
    "fp8 KV on CPU with head size 48": (_fp8_kv_cpu_head_size, ("error", "kv-fp8-cpu-head-size")),
    "TP 3 with 4 heads / 2 KV heads": (_tp_heads, ("error", "tp-attention-heads")),
    "num_speculative_tokens 0": (_k_zero, ("error", "num-speculative-tokens-range")),
    "num_speculative_tokens 12": (_k_large, ("warning", "num-speculative-tokens-range")),
    "draft/target vocab mismatch": (_vocab_mismatch, ("error", "draft-vocab-mismatch")),
    "max_model_len beyond the target's positions": (_max_model_len_beyond, ("error", "max-model-len-beyond-positions")),
    "per-channel FP8 scale [out, 1]": (_fp8_scale_2d, ("error", "fp8-channel-scale-1d")),
    "FP8 per-channel draft in an FP16 target on ROCm": (_fp8_fp16_target, ("warning", "fp8-rowwise-bf16-output")),
    "FP8 draft on gfx942 (fnuz, noted)": (_fp8_draft_gfx942, ("info", "platform-fp8-fnuz")),
    "drafter on ROCM_ATTN": (_draft_rocm_attn, ("warning", "draft-attention-backend-rocm")),
    "--block-size 1 with a draft": (_block_size_1, ("error", "draft-block-size-1")),
    "kv_cache_group matching no layer_quant_config key": (_kv_group_unmatched, ("error", "kv-quark-spec")),
    "MLA target under Quark with FP8 KV": (_mla_quark_target_fp8_kv, ("warning", "kv-scales-mla-quark")),
}


@pytest.mark.parametrize("case", list(CASES))
def test_known_bad_pair_combination_is_caught(pair, case):
    damage, expected = CASES[case]
    clean = deploy_manifest(pair[1], target=pair[0], platform="gfx950")
    kwargs = {"platform": "gfx950", **damage(pair)}
    m = deploy_manifest(pair[1], target=pair[0], **kwargs)
    assert expected in codes(m), [f.to_dict() for f in m.findings]
    assert expected not in codes(clean)
    for f in m.findings:
        assert f.source in {r.source for r in KNOWN_BAD} and f.message and f.fix and "\n" not in f.message
    assert m.ok == (expected[0] != "error")
    assert json.loads(json.dumps(m.to_dict()))["findings"]


def test_tp_heads_reports_kv_heads_too(pair):
    m = deploy_manifest(pair[1], target=pair[0], tp=3)
    assert {("error", "tp-attention-heads"), ("error", "tp-kv-heads")} <= codes(m)
    assert {f.layer_or_tensor for f in m.findings if f.code == "tp-attention-heads"} == {
        "target num_attention_heads",
        "draft num_attention_heads",
    }
    # 4 heads, 2 KV heads at TP 4: heads split 1 a rank, each KV head replicated on 2 ranks: fine
    assert not codes(deploy_manifest(pair[1], target=pair[0], tp=4))


def test_kv_scales_in_the_draft_silence_the_unscaled_warning(pair):
    edit_config(pair[1], quantization_config=_quark_config(kv_cache_group=["*k_proj", "*v_proj"]))
    m = deploy_manifest(pair[1], target=pair[0], kv_cache_dtype="fp8")
    assert ("warning", "kv-fp8-draft-unscaled") not in codes(m)


def test_mxfp4_tp_that_splits_a_scale_group(tiny, tmp_path):
    folder = mxfp4_moe(tiny, tmp_path / "moe-mxfp4")
    m8 = deploy_manifest(folder, tp=8)  # down_proj input 128 / 8 = 16 per rank: half a group
    groups = [f for f in m8.findings if f.code == "tp-mxfp4-group"]
    assert len(groups) == 1 and groups[0].layer_or_tensor == "model.layers.{N}.mlp.experts.{N}.down_proj"
    assert "16 of 128" in groups[0].message and "(8 tensors)" in groups[0].message
    assert "--tensor-parallel-size 4" in groups[0].fix
    assert not [f for f in deploy_manifest(folder, tp=4).findings if f.code.startswith("tp-")]  # 32 per rank
    assert ("error", "tp-indivisible") in codes(deploy_manifest(folder, tp=3))


def test_mxfp4_platforms(tiny, tmp_path):
    folder = mxfp4_moe(tiny, tmp_path / "moe-mxfp4")
    assert ("error", "platform-mxfp4-cpu") in codes(deploy_manifest(folder, platform="cpu"))
    assert ("warning", "platform-mxfp4-emulated") in codes(deploy_manifest(folder, platform="gfx942"))
    assert not codes(deploy_manifest(folder, platform="gfx950"))


def test_rules_on_real_quark_outputs_agree_with_quantkit_check(tiny, tiny_outputs):
    """On Quark's own MXFP4 export, the TP-group rule agrees with quantkit check's (an independent implementation
    over the same vLLM rule); the real FP8 draft has a BF16 lm_head and is refused only with fp8_e5m2 KV."""
    from quantkit.check.run import run as check_checkpoint

    moe = tiny_outputs["mxfp4-moe"]
    for tp in (1, 2, 4, 8):
        mine = any(f.code == "tp-mxfp4-group" for f in deploy_manifest(moe, tp=tp).findings)
        theirs = any(
            f.code == "tp-mxfp4-group"
            for f in check_checkpoint(moe, tp=tp, platform="gfx950", vllm="off", progress=lambda _m: None).findings
        )
        assert mine == theirs, tp
    assert any(f.code == "tp-mxfp4-group" for f in deploy_manifest(moe, tp=8).findings)
    draft = tiny_outputs["fp8-draft"]
    ok = deploy_manifest(draft, target=tiny / "target")
    assert ok.ok and not codes(ok)
    e5m2 = deploy_manifest(draft, target=tiny / "target", kv_cache_dtype="fp8_e5m2")
    assert ("error", "kv-fp8-e5m2-quark") in codes(e5m2)


def test_tokenizer_drift_names_the_one_changed_token(tiny, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(tiny / "target", out)
    assert tokenizer_drift(tiny / "target", out) == []
    vocab = json.loads((out / "tokenizer.json").read_text())["model"]["vocab"]
    token, tid = "\u0120garden", vocab["\u0120garden"]  # byte-level BPE: \u0120 (Ġ) is the leading space
    raw = (out / "tokenizer.json").read_text(encoding="utf-8")
    entry = re.findall(rf'"{token}":\s*{tid}\b', raw)
    assert len(entry) == 1  # change this one vocabulary entry, byte for byte, and nothing else
    (out / "tokenizer.json").write_text(
        raw.replace(entry[0], entry[0].replace(token, "\u0120gardxn")), encoding="utf-8"
    )
    assert tokenizer_drift(tiny / "target", out) == [
        f"tokenizer.json: model.vocab: id {tid} is '\u0120garden' in source, '\u0120gardxn' in output"
    ]
    # independent confirmation that this one token matters: the tokenizers library loads the source and refuses
    # the copy, whose merge rules still produce the old token
    from tokenizers import Tokenizer

    assert Tokenizer.from_file(str(tiny / "target" / "tokenizer.json")).encode("in the garden").ids
    with pytest.raises(Exception, match="\u0120garden"):
        Tokenizer.from_file(str(out / "tokenizer.json"))


def test_tokenizer_drift_other_files(tiny, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(tiny / "target", out)
    (out / "chat_template.jinja").write_text((out / "chat_template.jinja").read_text().replace("<|end|>", "<|eot|>"))
    config = json.loads((out / "tokenizer_config.json").read_text())
    config["eos_token"] = "<|eot|>"
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (out / "special_tokens_map.json").write_text("{}")
    drift = tokenizer_drift(tiny / "target", out)
    assert drift[0] == "tokenizer_config.json: eos_token: '<|end|>' in source, '<|eot|>' in output"
    assert drift[1].startswith("chat_template.jinja: line 2: ")
    assert drift[2] == "special_tokens_map.json: only in output"
    (out / "tokenizer.json").unlink()
    assert "tokenizer.json: in source, missing in output" in tokenizer_drift(tiny / "target", out)


def test_size_ratio_counts_safetensors_bytes(tiny, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    tensors = read_safetensors(tiny / "target" / "model.safetensors")
    kept = {k: v for k, v in tensors.items() if not k.startswith("lm_head")}
    write_safetensors(out / "model.safetensors", kept)  # type: ignore[arg-type]
    expected = (out / "model.safetensors").stat().st_size / (tiny / "target" / "model.safetensors").stat().st_size
    assert size_ratio(tiny / "target", out) == pytest.approx(expected) and expected < 1
    assert size_ratio(tiny / "target", tiny / "target") == 1.0
