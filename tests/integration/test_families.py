"""The family registry (quantkit.naming.archs): one record per family or draft layout, the only source of what a
checkpoint is; a draft whose config names a registered draft layout is a draft wherever quantkit asks."""

from __future__ import annotations

import importlib.util
import json
import os
import pkgutil
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from quantkit.cli import main
from quantkit.deploy.run import run as deploy_manifest
from quantkit.naming import archs
from quantkit.naming.archs import is_draft, model_kind
from quantkit.naming.family import QuarkTemplateError
from quantkit.vocab import EAGLE3_DRAFT
from tests.fixtures import toy_family

ROOT = Path(__file__).resolve().parents[2]


def _qwen3_draft(tiny: Path, out: Path) -> Path:
    """The bundled EAGLE-3 draft, its config naming Eagle3Qwen3ForCausalLM directly (no speculators_model_type):
    the layout vLLM's registry maps to qwen3_eagle3.py."""
    shutil.copytree(tiny / "eagle3-draft", out)
    config = json.loads((out / "config.json").read_text())
    config["architectures"] = ["Eagle3Qwen3ForCausalLM"]
    config["model_type"] = "qwen3"
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def test_eagle3_qwen3_architecture_is_a_draft(tiny, tmp_path):
    """Before the one registry, naming/drafts.py had its own list of draft architectures without Eagle3Qwen3ForCausalLM,
    so this draft was a dense target for apply, deploy and inspect."""
    draft = _qwen3_draft(tiny, tmp_path / "draft")
    config = json.loads((draft / "config.json").read_text())
    assert is_draft(config) and model_kind(config) == EAGLE3_DRAFT

    res = CliRunner().invoke(main, ["inspect", str(draft), "--json"])
    assert res.exit_code == 0, res.output
    shown = json.loads(res.stdout)
    assert shown["model_kind"] == EAGLE3_DRAFT and shown["target_num_layers"] is None
    names = {layer["name"] for layer in shown["layers"]}
    assert "model.layers.{N}.qkv_proj" in names and "model.fc" in names  # qwen3_eagle3.py's own qkv_proj prefix

    res = CliRunner().invoke(
        main,
        [
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
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "dense-target" not in res.output
    plan = json.loads(res.stdout)
    assert plan["model_kind"] == EAGLE3_DRAFT and plan["target_num_layers"] == 4

    manifest = deploy_manifest(draft, tiny / "target")
    assert manifest.draft is not None and "--speculative-config" in manifest.command


# --- the registry ----------------------------------------------------------------------------------------------


def test_registry_invariants():
    """Every module under naming/archs/ defines one FAMILY named as the module; no architecture is claimed twice;
    is_draft <=> a draft layout; SUPPORTED_ARCHITECTURES is the union of the records' architectures."""
    modules = sorted(m.name for m in pkgutil.iter_modules(archs.__path__))
    records = [importlib.import_module(f"quantkit.naming.archs.{m}").FAMILY for m in modules]
    assert [f.name for f in records] == modules
    claimed = [a for f in records for a in f.architectures]
    assert len(claimed) == len(set(claimed))
    assert set(claimed) == set(archs.SUPPORTED_ARCHITECTURES)
    for f in records:
        assert f.is_draft == (f.draft is not None)
        assert (f.build_layers is None) == (f.wrapper is not None), f.name  # only a wrapper has no builder
    with pytest.raises(ValueError, match="already claimed"):
        archs.register(toy_family.FAMILY.__class__("copy", ("LlamaForCausalLM",), "x", None))


def _quark_template_names() -> set[str]:
    # Quark's own file, read as text: importing quark.torch takes ~30 s (test_recipes reads the schemes the same way).
    spec = importlib.util.find_spec("quark")
    assert spec is not None and spec.submodule_search_locations
    text = (Path(list(spec.submodule_search_locations)[0]) / "torch/quantization/config/template.py").read_text()
    table = text[text.index("DEFAULT_TEMPLATES = {") :]
    table = table[: table.index("\n}\n")]
    return set(re.findall(r'^    "([a-z0-9_]+)": \{', table, re.M))


def test_every_quark_template_exists_in_quark():
    """Every template a record names is a key of Quark 0.13's DEFAULT_TEMPLATES, and every family that is not a
    test's names one for each model_type it keys."""
    known = _quark_template_names()
    assert {"llama", "qwen3_moe", "deepseek_v3", "kimi_k25"} <= known  # the regex reads the table
    for f in archs.families():
        assert set(f.quark_templates.values()) <= known, f.name
        assert f.quark_templates, f"{f.name} has no Quark template"
        for model_type in set(f.quark_templates) - {"*"}:
            assert f.quark_template({"model_type": model_type}) in known


def test_kimi_k25_gets_quarks_own_template():
    """Issue 19: Kimi-K2.5 took the silent llama fallback of the old QUARK_TEMPLATES table."""
    config = {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": {"model_type": "kimi_k2", "n_routed_experts": 8},
    }
    assert archs.quark_template(config) == "kimi_k25"
    assert model_kind(config) == "moe-target"  # the wrapper asks its text family


def test_missing_quark_template_is_an_error_naming_the_family(tmp_path):
    """`apply --engine quark` on a family without a Quark template: one line naming the family and --engine native,
    before Quark is imported (the toy family reaches the subprocess through QUANTKIT_FAMILY_MODULES)."""
    with pytest.raises(QuarkTemplateError, match="toy_moe"):
        toy_family.FAMILY.quark_template(toy_family.CONFIG)
    src = toy_family.write_checkpoint(tmp_path / "toy")
    code = (
        "import sys\nfrom click.testing import CliRunner\nfrom quantkit.cli import main\n"
        f"r = CliRunner().invoke(main, ['apply', '--recipe', 'mxfp4-moe', '--model', {str(src)!r}, '--output', "
        f"{str(tmp_path / 'out')!r}, '--engine', 'quark'])\n"
        "print(r.exit_code); print(r.stderr.strip()); print('quark' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), archs.FAMILY_MODULES_ENV: "tests.fixtures.toy_family"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    exit_code, line, quark_imported = out.stdout.strip().split("\n")
    assert exit_code == "2", out
    assert line.startswith("error: ") and "toy_moe" in line and "--engine native" in line, line
    assert quark_imported == "False"


# --- a family from its record alone ----------------------------------------------------------------------------


def test_a_family_from_its_record_alone_goes_through_inspect_apply_and_check(tmp_path):
    """tests/fixtures/toy_family.py's record (its own router and expert names, no Quark template, built with naming.builder)
    registered in-process: inspect, apply (engine auto -> native) and check run from it alone; no file under
    quantkit/ knows it. The commands run in-process (CliRunner): `check --vllm off`, since check's real vLLM load
    is a subprocess that cannot load a family vLLM does not have (real families are tested against vLLM in
    test_vllm_names)."""
    import torch
    from safetensors import safe_open

    from quantkit.io.headers import checkpoint_tensors

    src = toy_family.write_checkpoint(tmp_path / "toy")
    out = tmp_path / "toy-mxfp4"
    runner = CliRunner()
    with archs.registered(toy_family.FAMILY):
        res = runner.invoke(main, ["inspect", str(src), "--json"])
        assert res.exit_code == 0, res.output
        shown = json.loads(res.stdout)
        assert shown["architecture"] == toy_family.ARCHITECTURE and shown["model_kind"] == "moe-target"
        names = {layer["name"] for layer in shown["layers"]}
        assert {"model.layers.0.mlp.router", "model.layers.1.mlp.experts", "model.layers.0.self_attn.qkv_proj"} <= names

        res = runner.invoke(
            main, ["apply", "--recipe", "mxfp4-moe", "--model", str(src), "--output", str(out), "--json"]
        )
        assert res.exit_code == 0, res.output
        applied = json.loads(res.stdout)
        assert applied["engine"] == "native"
        quantized = {d["runtime_name"] for d in applied["layers"] if d["action"] == "quantize"}
        assert quantized == {f"model.layers.{i}.mlp.experts" for i in range(toy_family.LAYERS)}

        res = runner.invoke(main, ["check", str(out), "--vllm", "off", "--json"])
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["ok"] is True

    # the output: U8 experts with E8M0 scales, the router BF16 and byte-identical to the source
    tensors = checkpoint_tensors(out)
    for i in range(toy_family.LAYERS):
        for e in range(toy_family.EXPERTS):
            for proj in ("w_in", "w_out"):
                name = f"model.layers.{i}.mlp.experts.{e}.{proj}"
                assert tensors[f"{name}.weight"].dtype == "U8" and f"{name}.weight_scale" in tensors
    with safe_open(str(src / "model.safetensors"), "pt") as a, safe_open(str(out / "model.safetensors"), "pt") as b:
        for i in range(toy_family.LAYERS):
            name = f"model.layers.{i}.mlp.router.weight"
            assert tensors[name].dtype == "BF16"
            assert torch.equal(a.get_tensor(name).view(torch.int16), b.get_tensor(name).view(torch.int16))
    exclude = json.loads((out / "config.json").read_text())["quantization_config"]["exclude"]
    assert exclude == [
        "model.embed_tokens",
        r"re:model\.layers\.\d+\.self_attn\.qkv_proj$",
        r"re:model\.layers\.\d+\.self_attn\.o_proj$",
        r"re:model\.layers\.\d+\.mlp\.router$",
        "lm_head",
    ]

    # outside the context the family is unknown again: one line naming its architecture
    res = runner.invoke(main, ["inspect", str(src)])
    assert res.exit_code == 2 and "Traceback" not in res.output
    line = res.stderr.strip()
    assert "\n" not in line and toy_family.ARCHITECTURE in line


def test_family_modules_variable_names_what_it_cannot_import(tiny):
    """QUANTKIT_FAMILY_MODULES naming a module that does not import: one line naming the variable and the module."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), archs.FAMILY_MODULES_ENV: "no_such_family_module"}
    out = subprocess.run(
        [sys.executable, "-m", "quantkit", "inspect", str(tiny / "target")],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    line = out.stderr.strip()
    assert out.returncode == 2 and "\n" not in line and "Traceback" not in line
    assert archs.FAMILY_MODULES_ENV in line and "no_such_family_module" in line
