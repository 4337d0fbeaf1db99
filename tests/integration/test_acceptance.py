"""`quantkit acceptance`: the reference engine is lossless, agrees with vLLM, and the metric can fail."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from quantkit.acceptance.run import bootstrap_ratio_ci, run_acceptance
from quantkit.cli import main
from quantkit.engines.reference import ReferenceEngine
from quantkit.engines.rejection import verify_round
from quantkit.io.prompts import load_prompts
from tests.conftest import require_vllm

QUIET = lambda _m: None  # noqa: E731


@pytest.fixture(scope="module")
def target_and_tokenizer(tiny):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny / "target")
    model = AutoModelForCausalLM.from_pretrained(tiny / "target", dtype=torch.float32).eval()
    return model, tok


def test_reference_engine_is_lossless_in_greedy_mode(tiny, target_and_tokenizer):
    """Speculative output == the target's own greedy generation, token for token, on 2 prompts per domain."""
    model, tok = target_and_tokenizer
    engine = ReferenceEngine(model, tiny / "eagle3-draft")
    records = load_prompts("builtin")
    chosen = [r for i, r in enumerate(records) if i % 6 < 2]
    drafts = 0
    try:
        for r in chosen:
            ids = tok(r.render(tok), add_special_tokens=False)["input_ids"]
            spec = engine.generate(ids, k=3, max_new_tokens=48, eos_token_ids={tok.eos_token_id})
            with torch.no_grad():
                plain = model.generate(
                    torch.tensor([ids]),
                    max_new_tokens=48,
                    do_sample=False,
                    eos_token_id=tok.eos_token_id,
                    pad_token_id=tok.pad_token_id,
                )[0, len(ids) :]
            assert spec.output_ids == plain.tolist(), r.id
            drafts += spec.num_drafts
            assert spec.num_accepted <= 3 * spec.num_drafts
    finally:
        engine.close()
    assert drafts > 20


def test_speculative_sampling_identical_draft_always_accepted():
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(4, 50, generator=gen), -1)
    for _ in range(200):
        tokens = [int(torch.multinomial(p[j], 1, generator=gen)) for j in range(3)]
        r = verify_round(p, tokens, p[:3], gen)
        assert r.accepted == 3 and r.expected_accepted == 3.0


def test_speculative_sampling_matches_theory():
    """Acceptance probability of one draft token is sum_x min(p(x), q(x)); the output is distributed as p."""
    gen = torch.Generator().manual_seed(1)
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    q = torch.tensor([0.1, 0.2, 0.3, 0.4])
    expected = float(torch.minimum(p, q).sum())  # 0.1 + 0.2 + 0.15 + 0.05 = 0.5
    trials, accepted = 20000, 0
    counts = torch.zeros(4)
    for _ in range(trials):
        d = int(torch.multinomial(q, 1, generator=gen))
        r = verify_round(torch.stack([p, p]), [d], q[None], gen)
        n, extra = r.accepted, r.token
        accepted += n
        counts[d if n == 1 else extra] += 1
    rate = accepted / trials
    sigma = (expected * (1 - expected) / trials) ** 0.5
    assert abs(rate - expected) < 4 * sigma, (rate, expected)
    assert float((counts / trials - p).abs().sum()) / 2 < 0.015  # total variation distance to p


def test_bootstrap_ci_brackets_the_ratio():
    base = [(10, 25), (12, 30), (8, 20), (11, 28)]
    cand = [(10, 20), (12, 24), (8, 15), (11, 22)]
    lo, hi = bootstrap_ratio_ci(base, cand, samples=500)
    al = lambda xs: 1 + sum(a for _, a in xs) / sum(d for d, _ in xs)  # noqa: E731
    assert lo <= al(cand) / al(base) <= hi and hi < 1.0


def test_broken_candidate_gets_a_clearly_lower_ratio(tiny, fp8_draft, broken_fp8_draft):
    out, _ = fp8_draft
    good = run_acceptance(tiny / "target", tiny / "eagle3-draft", out, backend="reference", progress=QUIET)
    bad = run_acceptance(tiny / "target", tiny / "eagle3-draft", broken_fp8_draft, backend="reference", progress=QUIET)
    assert good.baseline.mean_acceptance_length >= 2.0
    assert good.ratio > 0.95 and good.ratio_ci[0] > 0.9, good.ratio_ci
    assert bad.ratio < 0.6 and bad.ratio_ci[1] < 0.8, (bad.ratio, bad.ratio_ci)
    assert bad.candidate.acceptance_rate_per_pos[0] < good.candidate.acceptance_rate_per_pos[0] - 0.3
    # greedy speculative decoding stays lossless whatever the draft: the outputs do not change
    assert bad.greedy_outputs_identical is True
    assert set(good.per_domain_ratio) == {
        "chat",
        "coding",
        "math",
        "multilingual",
        "rag",
        "structured",
        "summarization",
    }


@pytest.mark.vllm
def test_reference_and_vllm_agree(tiny, fp8_draft):
    """Greedy AL from vLLM's own counters and from the reference engine on the bundled pair, by the cross-engine
    agreement rule (quantkit.acceptance.agreement, the reasons there; tests/integration/test_pair.py applies it to the MoE pair).

    Measured on an AVX-512 host: BF16 draft 3.684 (vLLM) vs 3.695 (reference); the generated tokens are identical
    for all 42 prompts and 41 prompts have identical counters; one differs by 2 accepted tokens, a draft near-tie
    (vLLM computes activations in bf16 where the reference uses float32; the weights are the same bf16 values).
    So: per prompt, at most a quarter of the same-token prompts with other counters (a counting difference would hit
    them all); overall, the AL difference within the paired randomization bound at 0.99; and the ratios agree
    within the sum of the two ratio CIs' half-widths, since each engine's ratio carries its own prompt sampling.
    """
    from quantkit.acceptance.agreement import describe, runs_agree

    require_vllm()
    out, _ = fp8_draft
    ref = run_acceptance(tiny / "target", tiny / "eagle3-draft", out, backend="reference", progress=QUIET)
    vll = run_acceptance(tiny / "target", tiny / "eagle3-draft", out, backend="vllm", progress=QUIET)
    for a, b in ((ref.baseline, vll.baseline), (ref.candidate, vll.candidate)):
        agreement = runs_agree(b, a)
        print(f"\n{a.label}: {describe(agreement)}")
        assert agreement.same_output_prompts is not None and agreement.same_output_prompts >= 1, describe(agreement)
        assert len(agreement.counter_mismatches) <= agreement.same_output_prompts // 4, describe(agreement)
        assert agreement.agree, describe(agreement)
    half = sum((hi - lo) / 2 for lo, hi in (ref.ratio_ci, vll.ratio_ci))
    assert abs(ref.ratio - vll.ratio) <= half, (ref.ratio, vll.ratio, ref.ratio_ci, vll.ratio_ci)


def test_vllm_cpu_refuses_sampling(tiny, tmp_path):
    require_vllm()
    result = CliRunner().invoke(
        main,
        [
            "acceptance",
            "--target",
            str(tiny / "target"),
            "--draft",
            str(tiny / "eagle3-draft"),
            "--candidate",
            str(tiny / "eagle3-draft"),
            "--backend",
            "vllm",
            "--temperature",
            "0.7",
        ],
    )
    assert result.exit_code == 2 and "temperature" in result.stderr and "reference" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_cli_json_sampled_reference_with_context_lengths(tiny, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "\n".join(
            json.dumps(r)
            for r in [
                {"messages": [{"role": "user", "content": "What is 12 + 30?"}], "domain": "math"},
                {"messages": [{"role": "user", "content": "What is the capital of Spain?"}], "domain": "chat"},
                {
                    "prompt": "<|user|>\nWrite a Python function that reverses a string.<|end|>\n<|assistant|>\n",
                    "domain": "coding",
                },
            ]
        )
    )
    out = tmp_path / "acc.json"
    result = CliRunner().invoke(
        main,
        [
            "acceptance",
            "--target",
            str(tiny / "target"),
            "--draft",
            str(tiny / "eagle3-draft"),
            "--candidate",
            str(tiny / "eagle3-draft"),
            "--backend",
            "reference",
            "--temperature",
            "0.8",
            "--prompts",
            str(prompts),
            "--context-lengths",
            "160",
            "--max-new-tokens",
            "24",
            "--json",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data == json.loads(out.read_text())
    assert data["backend"] == "reference" and data["settings"]["temperature"] == 0.8
    assert data["greedy_outputs_identical"] is None
    assert set(data["baseline"]["per_domain"]) == {"math", "chat", "coding"}
    assert 1.0 <= data["baseline"]["mean_acceptance_length"] <= 4.0
    assert list(data["baseline"]["by_context_length"]) == ["160"]
    # same draft on both sides with the same seed: identical figures
    assert data["ratio"] == 1.0


def test_bad_prompt_file(tiny, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}]}\nnot json\n')
    result = CliRunner().invoke(
        main,
        [
            "acceptance",
            "--target",
            str(tiny / "target"),
            "--draft",
            str(tiny / "eagle3-draft"),
            "--candidate",
            str(tiny / "eagle3-draft"),
            "--backend",
            "reference",
            "--prompts",
            str(bad),
        ],
    )
    assert result.exit_code == 2 and "bad.jsonl:2" in result.stderr and "Traceback" not in result.output


def test_draft_passed_as_target(tiny):
    result = CliRunner().invoke(
        main,
        [
            "acceptance",
            "--target",
            str(tiny / "eagle3-draft"),
            "--draft",
            str(tiny / "eagle3-draft"),
            "--candidate",
            str(tiny / "eagle3-draft"),
        ],
    )
    assert result.exit_code == 2 and "--target" in result.stderr
