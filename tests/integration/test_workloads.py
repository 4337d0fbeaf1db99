"""Acceptance on the workloads that matter (issue 24): AL averages by hand, vLLM's rejection sampling against closed
forms, SPEED-Bench as a prompt source (fixture in every config, multi-turn, placeholders, the Hub path), and golden
per-position references."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from quantkit.acceptance import figures
from quantkit.acceptance.run import _conversations, _summarise
from quantkit.cli import main
from quantkit.engines.rejection import target_probs, verify_round
from quantkit.engines.stats import Sampling, SequenceStats
from quantkit.io.prompts import PromptRecord
from quantkit.io.speed_bench import CONFIGS, PLACEHOLDER, SpeedBenchError, load_speed_bench
from tests.fixtures.speed_bench_fixture import FOLLOWUP, write_fixture


@pytest.fixture(scope="module")
def fixture_dir(tmp_path_factory) -> Path:
    return write_fixture(tmp_path_factory.mktemp("speed-bench"))


# --- AL averages ---------------------------------------------------------------------------------------------------


def test_pooled_and_macro_al_on_a_case_known_by_hand():
    """Request a: 4 rounds accepting 3, 2, 2, 1 (AL 3); request b: 1 round accepting 0 (AL 1); request c: no draft.
    Pooled = 1 + 8/5 = 2.6; macro = (3 + 1) / 2 = 2.0 (c has no AL). Per position: 4, 3, 1 accepted of 5 drafts, so
    the histogram of accepted lengths is [1, 1, 2, 1] and the conditional rates 4/5, 3/4, 1/3."""
    a = SequenceStats(
        num_drafts=4,
        num_draft_tokens=12,
        num_accepted=8,
        accepted_per_pos=[4, 3, 1],
        output_ids=list(range(12)),
        rounds=[(0, 3), (4, 2), (40, 2), (200, 1)],
        expected_accepted=8.0,
    )
    b = SequenceStats(
        num_drafts=1,
        num_draft_tokens=3,
        num_accepted=0,
        accepted_per_pos=[0, 0, 0],
        output_ids=[1],
        rounds=[(0, 0)],
        expected_accepted=0.5,
    )
    c = SequenceStats(num_drafts=0, accepted_per_pos=[0, 0, 0], output_ids=[2], expected_accepted=0.0)
    recs = [PromptRecord("a", "x", None, "p"), PromptRecord("b", "y", None, "p"), PromptRecord("c", "y", None, "p")]
    s = _summarise("baseline", "t", "d", recs, [a, b, c], 3, 0.0)
    assert s.mean_acceptance_length == pytest.approx(2.6)
    assert s.macro_acceptance_length == pytest.approx(2.0)
    assert s.per_domain["x"].macro_acceptance_length == pytest.approx(3.0)
    assert s.per_domain["y"].macro_acceptance_length == pytest.approx(1.0)  # c drafted nothing: left out
    assert s.per_domain["y"].mean_acceptance_length == pytest.approx(1.0)
    assert s.accepted_length_histogram == [1, 1, 2, 1]
    assert s.conditional_acceptance_per_pos == pytest.approx([4 / 5, 3 / 4, 1 / 3])
    # rounds at 0, 4, 0 -> bucket 0-32: (3 + 2 + 0) / 3 rounds; 40 -> 32-128; 200 -> 128-512
    assert s.al_by_output_position == {"0-32": round(1 + 5 / 3, 4), "32-128": 3.0, "128-512": 2.0}
    assert s.expected_acceptance_length == pytest.approx(1 + 8.5 / 5)
    assert [p.acceptance_length for p in s.per_prompt] == [3.0, 1.0, None]
    assert figures.histogram(5, [4, 3, 1]) == [1, 1, 2, 1]


# --- rejection sampling against closed forms ---------------------------------------------------------------------


def _check_round(
    p: torch.Tensor,
    drafts: list[int],
    q: torch.Tensor | None,
    accept: list[float],
    trials: int = 6000,
    lossless: bool = True,
):
    """E[accepted] = a1 + a1 a2 (closed form); the realised mean matches it; with a greedy draft (d fixed) the first
    emitted token is distributed as p[0] (lossless)."""
    exact = accept[0] + accept[0] * accept[1]
    gen = torch.Generator().manual_seed(7)
    total, counts = 0, torch.zeros(p.shape[1])
    for _ in range(trials):
        r = verify_round(p, drafts, q, gen)
        assert r.expected_accepted == pytest.approx(exact, abs=1e-6)
        total += r.accepted
        counts[drafts[0] if r.accepted >= 1 else r.token] += 1
    p1, p2 = accept[0] * (1 - accept[1]), accept[0] * accept[1]
    var = p1 + 4 * p2 - exact**2
    assert abs(total / trials - exact) < 4 * (var / trials) ** 0.5, (total / trials, exact)
    if lossless:
        assert float((counts / trials - p[0]).abs().sum()) / 2 < 0.025


def test_greedy_draft_rejection_sampling_equals_the_closed_form():
    """vLLM's default (greedy draft, no draft probs): accept d with p(d); recover from p with d removed."""
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.1, 0.6, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]])
    _check_round(p, [0, 1], None, [0.5, 0.6])


def test_probabilistic_draft_rejection_sampling_equals_the_closed_form():
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.1, 0.6, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]])
    q = torch.tensor([[0.2, 0.5, 0.2, 0.1], [0.1, 0.3, 0.3, 0.3]])
    # min(1, 0.3/0.5), min(1, 0.6/0.3); drafts held fixed here, so the output marginal is not p (test_acceptance
    # samples d from q for that)
    _check_round(p, [1, 1], q, [0.6, 1.0], lossless=False)


def test_target_probs_top_k_top_p_by_hand():
    """Temperature 1, logits giving p = [0.5, 0.3, 0.15, 0.05]: top_k 2 keeps {0, 1} -> [0.625, 0.375, 0, 0]; top_p
    0.8 drops tokens whose ascending cumulative sum is <= 0.2 (0.05, 0.05 + 0.15) -> the same; temperature 0 is
    one-hot."""
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    want = torch.tensor([[0.625, 0.375, 0.0, 0.0]])
    assert torch.allclose(target_probs(logits, Sampling(1.0, top_k=2)), want, atol=1e-6)
    assert torch.allclose(target_probs(logits, Sampling(1.0, top_p=0.8)), want, atol=1e-6)
    assert torch.allclose(
        target_probs(logits, Sampling(1.0, top_p=0.9)), torch.tensor([[0.5, 0.3, 0.15, 0.0]]) / 0.95, atol=1e-6
    )
    assert target_probs(logits, Sampling(0.0)).tolist() == [[1.0, 0.0, 0.0, 0.0]]


@pytest.fixture(scope="module")
def engine(tiny):
    from transformers import AutoTokenizer

    from quantkit.engines.reference import ReferenceEngine, load_reference_target
    from quantkit.io.headers import read_config

    tok = AutoTokenizer.from_pretrained(tiny / "target")
    model = load_reference_target(str(tiny / "target"), read_config(tiny / "target"), "cpu")
    eng = ReferenceEngine(model, tiny / "eagle3-draft")
    yield eng, tok
    eng.close()


def test_greedy_through_the_rejection_sampler_equals_greedy_al(engine):
    """Temperature 0 as one-hot distributions through vLLM's rejection sampling gives today's greedy tokens and
    counters exactly, and the expected AL equals the realised one."""
    eng, tok = engine
    for text in ("What is 12 + 30?", "Write a haiku about rain.", "List three colours."):
        ids = tok(
            tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True),
            add_special_tokens=False,
        )["input_ids"]
        a = eng.generate(ids, 3, 32, 0.0, {tok.eos_token_id}, seed=1, argmax_path=True)
        b = eng.generate(ids, 3, 32, 0.0, {tok.eos_token_id}, seed=1, argmax_path=False)
        assert (a.output_ids, a.num_drafts, a.num_accepted, a.accepted_per_pos, a.rounds) == (
            b.output_ids,
            b.num_drafts,
            b.num_accepted,
            b.accepted_per_pos,
            b.rounds,
        )
        assert b.expected_accepted == pytest.approx(b.num_accepted)


def test_sampled_engine_acceptance_matches_its_expected_acceptance(engine):
    """On the real tiny pair at T=0.8, top_k 50: over seeds, realised accepted tokens average to the expected ones
    (E[accepted | drafts] from the target's probabilities along the path), within 4 standard errors."""
    eng, tok = engine
    ids = tok(
        tok.apply_chat_template(
            [{"role": "user", "content": "Tell me about the sea."}], tokenize=False, add_generation_prompt=True
        ),
        add_special_tokens=False,
    )["input_ids"]
    diffs = []
    for sd in range(16):
        s = eng.generate(ids, 3, 12, Sampling(0.8, top_k=50), {tok.eos_token_id}, seed=sd)
        diffs.append(s.num_accepted - (s.expected_accepted or 0.0))
    mean = sum(diffs) / len(diffs)
    sd = (sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1)) ** 0.5
    assert abs(mean) < 4 * sd / len(diffs) ** 0.5 + 1e-9, (mean, sd)


# --- SPEED-Bench ---------------------------------------------------------------------------------------------------


def test_the_fixture_parses_in_every_config(fixture_dir):
    for config in CONFIGS:
        sb = load_speed_bench(f"speed-bench:{config}", fixture_dir)
        assert sb.records and sb.revision is None and len(sb.content_sha256) == 64
        assert sb.files == [f"{config}/test-00000-of-00001.parquet"]
        assert len(sb.records) == (22 if config == "qualitative" else 3)
    math = load_speed_bench("speed-bench:qualitative/math", fixture_dir)
    assert {r.domain for r in math.records} == {"math"} and len(math.records) == 2
    writing = load_speed_bench("speed-bench:qualitative/writing", fixture_dir)
    assert [r.followups for r in writing.records] == [(FOLLOWUP,), ()]
    with pytest.raises(SpeedBenchError, match="unknown SPEED-Bench config"):
        load_speed_bench("speed-bench:throughput_4k", fixture_dir)


def test_multi_turn_rows_go_turn_by_turn_with_the_replies(fixture_dir, engine):
    """The second user turn is sent after the model's own reply to the first; the request's counters are the sum."""
    eng, tok = engine
    recs = load_speed_bench("speed-bench:qualitative/writing", fixture_dir).records
    sent: list[list[str]] = []

    def generate(texts, seeds):
        sent.append(texts)
        return [
            eng.generate(tok(t, add_special_tokens=False)["input_ids"], 3, 8, 0.0, {tok.eos_token_id}, seed=s)
            for t, s in zip(texts, seeds)
        ]

    stats = _conversations(recs, [0, 1], generate, tok, {}, None)
    assert len(sent) == 2 and len(sent[0]) == 2 and len(sent[1]) == 1
    first_reply = tok.decode(stats[0].output_ids[:8], skip_special_tokens=True)
    second = sent[1][0]
    assert second.startswith(sent[0][0][: len(sent[0][0]) // 2])  # the conversation so far, then more
    assert first_reply.strip() in second and second.index(first_reply.strip()) < second.index(FOLLOWUP)
    assert len(stats[0].output_ids) > 8 and len(stats[1].output_ids) <= 8


def test_placeholder_rows_are_refused_in_one_line(tmp_path, tiny):
    root = write_fixture(tmp_path / "sb", placeholders=True)
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
            "speed-bench:qualitative",
            "--speed-bench",
            str(root),
        ],
    )
    assert result.exit_code == 2, result.output
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1 and "1 of 22" in err and "prepare_data.py" in err and "Traceback" not in err
    assert PLACEHOLDER not in err


def test_speed_bench_from_a_hub_server_records_revision_and_hash(fixture_dir, tmp_path, monkeypatch):
    """The Hub path through huggingface_hub against tests/fixtures/hub_server.py: the pinned commit is what is recorded, and
    the content hash equals the local copy's."""
    from tests.fixtures.hub_server import HubServer

    files = {p.relative_to(fixture_dir).as_posix(): p.read_bytes() for p in fixture_dir.rglob("*.parquet")}
    with HubServer("hf_test_token") as hub:
        oid = hub.add_dataset("nvidia/SPEED-Bench", files)
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_TOKEN", "hf_test_token")
        monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
        sb = load_speed_bench("speed-bench:qualitative/coding", f"nvidia/SPEED-Bench@{oid}")
        assert sb.repo == "nvidia/SPEED-Bench" and sb.revision == oid
        assert sb.content_sha256 == load_speed_bench("speed-bench:qualitative", fixture_dir).content_sha256
        with pytest.raises(SpeedBenchError, match="no such revision"):
            load_speed_bench("speed-bench:qualitative", "nvidia/SPEED-Bench@" + "0" * 40)


def test_acceptance_on_speed_bench_reports_categories_and_publishes_no_prompts(fixture_dir, tiny, tmp_path):
    """`quantkit acceptance --prompts speed-bench:qualitative` on a local copy: AL per category, pooled and macro,
    the histogram; acceptance.json carries the hash, not the prompts."""
    from quantkit.publish.sidecar import AcceptanceSidecar
    from quantkit.results import AcceptanceResult

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
            "--prompts",
            "speed-bench:qualitative",
            "--speed-bench",
            str(fixture_dir),
            "--max-new-tokens",
            "4",
            "--temperature",
            "0.7",
            "--top-k",
            "20",
            "--num-seeds",
            "2",
            "--chat-template-kwargs",
            '{"enable_thinking": false}',
            "--json",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    b = data["baseline"]
    assert set(b["per_domain"]) == {
        "coding",
        "humanities",
        "math",
        "multilingual",
        "qa",
        "rag",
        "reasoning",
        "roleplay",
        "stem",
        "summarization",
        "writing",
    }
    assert all(v["macro_acceptance_length"] is not None for v in b["per_domain"].values())
    assert sum(b["accepted_length_histogram"]) == b["num_drafts"] and len(b["accepted_length_histogram"]) == 4
    assert len(b["per_prompt"]) == 44 and {p["seed"] for p in b["per_prompt"]} >= {0, 1}
    st = data["settings"]
    assert (st["temperature"], st["top_k"], st["num_seeds"], st["chat_template_kwargs"]) == (
        0.7,
        20,
        2,
        {"enable_thinking": False},
    )
    assert st["prompt_source"]["kind"] == "speed-bench" and len(st["prompt_source"]["content_sha256"]) == 64
    assert data["expected_ratio"] == 1.0 and "macro_acceptance_length" in data["definitions"]
    side = AcceptanceSidecar.from_acceptance(AcceptanceResult.model_validate(data), model="org/draft-fp8")
    text = json.dumps(side.model_dump(mode="json"))
    assert side.dataset is not None and side.dataset.content_sha256 == st["prompt_source"]["content_sha256"]
    assert side.prompt_set.sha256 == st["prompt_source"]["content_sha256"]
    assert "Write a Python function" not in text and "Translate" not in text
    assert "pooled" in side.averages["mean_acceptance_length"]


# --- golden references ---------------------------------------------------------------------------------------------


def test_golden_fails_a_draft_damaged_at_one_position_only(tmp_path):
    """A good run and one whose draft is damaged at position 2 only (its rate falls by 0.2, position 3's rises by
    0.2 as a mean-preserving regression can): the pooled AL check passes for both, the per-position check fails
    the damaged one at position 2 and nowhere else."""
    from quantkit.gate.golden import golden_checks, load_golden
    from quantkit.gate.verdict import judge
    from quantkit.results import AcceptanceResult

    golden_file = tmp_path / "golden.yaml"
    golden_file.write_text(
        "model: tiny\nsettings: {num_speculative_tokens: 3, temperature: 0.0}\n"
        "al: {value: 2.8, tolerance: 0.05}\nacceptance_rate_per_pos: [0.8, 0.6, 0.4]\n"
        "position_tolerance: 0.03\nper_category: {math: 2.9}\ncategory_tolerance: 0.1\n"
    )
    golden = load_golden(golden_file)

    def result(rates):
        cand = {
            "mean_acceptance_length": 1 + sum(rates),
            "acceptance_rate_per_pos": rates,
            "per_domain": {"math": {"mean_acceptance_length": 2.9, "macro_acceptance_length": 2.9}},
        }
        return AcceptanceResult.model_validate(
            {"settings": {"num_speculative_tokens": 3, "temperature": 0.0}, "baseline": cand, "candidate": cand}
        )

    good = golden_checks(result([0.8, 0.6, 0.4]), golden, "c")
    assert judge(good).verdict == "pass", [(c.name, c.passed) for c in good]
    bad = golden_checks(result([0.8, 0.4, 0.6]), golden, "c")
    failed = [c.name for c in bad if c.passed is False]
    assert failed == ["acceptance.golden.pos2"], failed
    assert judge(bad).verdict == "regression"
    off = golden_checks(
        AcceptanceResult.model_validate(
            {"settings": {"num_speculative_tokens": 3, "temperature": 1.0}, "candidate": {}}
        ),
        golden,
        "c",
    )
    assert [c.verdict for c in off] == ["infeasible"] and "temperature" in off[0].message


def test_gate_config_takes_sampling_and_golden_keys(tmp_path, tiny):
    from quantkit.gate.config import GateConfigError, load_gate_config

    (tmp_path / "golden.yaml").write_text("acceptance_rate_per_pos: [0.8]\n")
    base = (
        f"name: g\ntarget: {tiny / 'target'}\ndraft: {tiny / 'eagle3-draft'}\n"
        f"candidates: [{{name: c, path: {tiny / 'eagle3-draft'}}}]\nsteps: [acceptance]\n"
    )
    cfg = tmp_path / "gate.yaml"
    cfg.write_text(
        base + "acceptance: {temperature: 1.0, top_p: 0.95, top_k: 40, num_seeds: 3, "
        "chat_template_kwargs: {enable_thinking: true}, prompts: 'speed-bench:qualitative', "
        "golden: golden.yaml}\n"
    )
    c, _ = load_gate_config(cfg)
    assert (c.acceptance.top_p, c.acceptance.top_k, c.acceptance.golden) == (0.95, 40, "golden.yaml")
    cfg.write_text(base + "acceptance: {golden: missing.yaml}\n")
    with pytest.raises(GateConfigError, match="acceptance.golden"):
        load_gate_config(cfg)


def test_bad_sampling_inputs_are_one_line(tiny):
    args = [
        "acceptance",
        "--target",
        str(tiny / "target"),
        "--draft",
        str(tiny / "eagle3-draft"),
        "--candidate",
        str(tiny / "eagle3-draft"),
        "--backend",
        "reference",
    ]
    r = CliRunner().invoke(main, [*args, "--num-seeds", "3"])
    assert r.exit_code == 2 and "--num-seeds" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = CliRunner().invoke(main, [*args, "--chat-template-kwargs", "[1]"])
    assert r.exit_code == 2 and "not an object" in r.output
    r = CliRunner().invoke(
        main, [*args, "--prompts", "speed-bench:qualitative", "--speed-bench", str(Path(os.devnull))]
    )
    assert r.exit_code == 2 and "--speed-bench" in r.stderr
