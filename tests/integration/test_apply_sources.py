"""`apply` on targets as they ship: FP8-block DeepSeek-V3 and MiniMax-M2, and an INT4 (compressed-tensors
pack-quantized) Kimi-K2.5-style wrapper, to MXFP4, against independent references:

- the MXFP4 experts equal what Quark's own file-to-file path writes for the decoded BF16 equivalent, byte for byte
  (the decoded equivalent is made with compressed-tensors' own decompression and a float32 block dequant written
  here in numpy, not with quantkit's decoder);
- kept layers equal the decoded source, BF16 tensors of the source are byte-identical;
- `check` passes, and `check --numeric --source` stays within the MXFP4 bounds;
- the wrapper's exclude entries resolve through vLLM's own matcher as intended;
- decoded NaN is refused naming the tensor.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.fixtures import checkpoints as ck


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _fp8_block_reference(w: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
    """float32(w_e4m3) * scale_inv per 128x128 block (edge blocks partial), in numpy, then BF16."""
    wf = w.to(torch.float32).numpy()
    s = scale_inv.to(torch.float32).numpy()
    rows = np.repeat(np.repeat(s, 128, axis=0), 128, axis=1)[: wf.shape[0], : wf.shape[1]]
    return torch.from_numpy((wf * rows).astype(np.float32)).to(torch.bfloat16)


def _decoded_reference(src: Path, dst: Path) -> Path:
    """The BF16 equivalent of a quantized source, decoded by references independent of quantkit's decoder."""
    dst.mkdir(parents=True)
    config = json.loads((src / "config.json").read_text())
    for key in ("quantization_config", "compression_config"):
        config.pop(key, None)
        if isinstance(config.get("text_config"), dict):
            config["text_config"].pop(key, None)
    int4 = any(n.endswith(".weight_packed") for f in src.glob("*.safetensors") for n in load_file(str(f)))
    if int4:
        from compressed_tensors.entrypoints.convert.converters import CompressedTensorsDequantizer

        dequantizer = CompressedTensorsDequantizer(src)  # compressed-tensors' own decompression
    for f in sorted(src.glob("*.safetensors")):
        t = load_file(str(f))
        if int4:
            out = {
                n: x.to(torch.bfloat16) if x.is_floating_point() and n not in t else x
                for n, x in dequantizer.process(dict(t)).items()
            }
        else:
            out = {
                n: _fp8_block_reference(x, t[f"{n}_scale_inv"]) if x.dtype == torch.float8_e4m3fn else x
                for n, x in t.items()
                if not n.endswith("_scale_inv")
            }
        save_file({n: x.contiguous() for n, x in out.items()}, str(dst / f.name), metadata={"format": "pt"})
    for f in src.iterdir():
        if f.suffix != ".safetensors" and f.is_file() and f.name not in ("config.json", "model.safetensors.index.json"):
            (dst / f.name).write_bytes(f.read_bytes())
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return dst


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from quantkit.apply import apply

    base = tmp_path_factory.mktemp("sources")
    out = {}
    for name, builder, fmt in (
        ("deepseek", "deepseek_v3", "fp8"),
        ("minimax", "minimax_m2", "fp8"),
        ("kimi", "kimi_k25", "int4"),
    ):
        src = ck.make(builder, base / f"{name}-src", format=fmt)
        result = apply("mxfp4-moe", src, base / f"{name}-mxfp4", devices="cpu", progress=None)
        out[name] = (src, base / f"{name}-mxfp4", result)
    return base, out


@pytest.fixture(scope="module")
def quark_reference(built):
    """Quark 0.13's direct_quantize_checkpoint on each decoded BF16 equivalent, with quantkit's Quark-side exclude."""
    os.environ.setdefault("QUARK_DISABLE_COMPILE", "1")
    with contextlib.redirect_stdout(sys.stderr):
        from quark.torch import LLMTemplate, ModelQuantizer
    base, runs = built
    refs = {}
    for name, (src, _out, result) in runs.items():
        decoded = _decoded_reference(src, base / f"{name}-decoded")
        template = {"deepseek": "deepseek_v3", "minimax": "minimax_m2", "kimi": "kimi_k2"}[name]
        cfg = LLMTemplate.get(template).get_config(scheme="mxfp4", exclude_layers=result.quark_exclude)
        with contextlib.redirect_stdout(sys.stderr):
            ModelQuantizer(cfg).direct_quantize_checkpoint(str(decoded), str(base / f"{name}-quark"), device="cpu")
        refs[name] = (decoded, base / f"{name}-quark")
    return refs


@pytest.mark.parametrize("name", ["deepseek", "minimax", "kimi"])
def test_output_equals_quark_on_the_decoded_equivalent(built, quark_reference, name):
    src, out, result = built[1][name]
    decoded, quark_out = quark_reference[name]
    ours, theirs, ref = _tensors(out), _tensors(quark_out), _tensors(decoded)
    assert set(ours) == set(theirs), set(ours) ^ set(theirs)
    quantized = [f"{m}.weight" for d in result.quantized for m in d.checkpoint_modules]
    assert quantized and all(".experts." in n and ours[n].dtype == torch.uint8 for n in quantized)
    mtp = [n for n in ours if n.startswith("model.layers.3.")]  # DeepSeek's MTP layer (3 decoder layers): kept BF16
    assert all(ours[n].dtype != torch.uint8 for n in mtp)
    for n, t in ours.items():
        assert t.dtype == theirs[n].dtype and torch.equal(t.view(torch.uint8), theirs[n].view(torch.uint8)), n
    for n, t in ref.items():  # kept tensors equal the decoded source (BF16 source tensors: byte-identical)
        if n in ours and not n.endswith("_scale") and ours[n].dtype != torch.uint8:
            assert torch.equal(ours[n].view(torch.uint8), t.contiguous().view(torch.uint8)), n
    leftovers = [n for n in ours if n.endswith(("_scale_inv", "weight_packed", "weight_shape"))]
    assert not leftovers
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "quark"
    assert "quantization_config" not in (config.get("text_config") or {})
    assert result.source_format in ("fp8-block", "int4-pack-quantized")
    assert {d.source_format for d in result.layers if d.action == "quantize"} == {result.source_format}


@pytest.mark.parametrize("name", ["deepseek", "minimax", "kimi"])
def test_check_passes_and_numeric_agreement_within_mxfp4_bounds(built, quark_reference, name):
    from quantkit.check.run import run as check_checkpoint

    _src, out, _result = built[1][name]
    decoded, _ = quark_reference[name]
    res = check_checkpoint(out, vllm="off", numeric=True, source=decoded)
    # The weight-level comparison is the contract here. The logits half needs transformers to run the tiny synthetic
    # source, which it cannot for these configs (numeric-logits-failed): that finding alone is tolerated.
    errors = [f for f in res.findings if f.severity == "error" and f.code != "numeric-logits-failed"]
    assert not errors, errors
    assert res.numeric is not None and res.numeric.layers
    assert all(v.relative_error is not None and v.relative_error <= v.bound for v in res.numeric.layers.values())


def test_wrapper_exclude_resolves_through_vllms_matcher(built):
    """vLLM's own should_ignore_layer over the wrapper's runtime names: every kept layer (vision tower, projector,
    attention, router, lm_head) ignored, every expert layer not."""
    from tests.conftest import require_vllm

    require_vllm()
    from vllm.model_executor.layers.quantization.quark.utils import should_ignore_layer

    _src, out, result = built[1]["kimi"]
    exclude = json.loads((out / "config.json").read_text())["quantization_config"]["exclude"]
    assert "re:vision_tower\\." in exclude and "re:mm_projector\\." in exclude
    for d in result.layers:
        ignored = should_ignore_layer(d.runtime_name, ignore=exclude, fused_mapping={})
        assert ignored == (d.action == "keep"), (d.runtime_name, d.action)


def test_decoded_nan_is_refused_naming_the_tensor(tmp_path):
    from quantkit.apply import apply
    from quantkit.errors import QuantkitError

    src = ck.make("deepseek_v3", tmp_path / "src", format="fp8")
    shard = next(f for f in sorted(src.glob("*.safetensors")) if any(".experts." in k for k in load_file(str(f))))
    t = load_file(str(shard))
    name = next(k for k in t if k.endswith("_scale_inv") and ".experts." in k)
    t[name][0, 0] = float("inf")
    save_file(t, str(shard), metadata={"format": "pt"})
    with pytest.raises(QuantkitError, match=name.removesuffix("_scale_inv")):
        apply("mxfp4-moe", src, tmp_path / "out", devices="cpu", progress=None)
    assert not (tmp_path / "out").exists()


def test_mtp_layer_kept_bf16_by_default_and_dropped_on_request(built, tmp_path):
    """DeepSeek-V3's MTP layer (model.layers.3.* for 3 decoder layers): vLLM never loads it into the target; kept
    BF16 by default, left out with the recipe's `mtp: drop` (and the output config then says it has none)."""
    import yaml

    from quantkit.apply import apply
    from quantkit.recipes import load_recipe

    src, out, _ = built[1]["deepseek"]
    kept = {n: t for n, t in _tensors(out).items() if n.startswith("model.layers.3.")}
    assert kept and all(t.dtype in (torch.bfloat16, torch.float32) for t in kept.values())
    recipe = load_recipe("mxfp4-moe").to_dict()
    recipe.update(name="mxfp4-moe-no-mtp", mtp="drop")
    path = tmp_path / "no-mtp.yaml"
    path.write_text(yaml.safe_dump(recipe))
    result = apply(path, src, tmp_path / "out", devices="cpu", progress=None)
    dropped = _tensors(tmp_path / "out")
    assert not [n for n in dropped if n.startswith("model.layers.3.")]
    assert set(dropped) == {n for n in _tensors(out) if not n.startswith("model.layers.3.")}
    assert json.loads((tmp_path / "out" / "config.json").read_text())["num_nextn_predict_layers"] == 0
    assert result.size_after_bytes < sum(f.stat().st_size for f in out.glob("*.safetensors"))
