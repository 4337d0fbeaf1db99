# tier: unit
"""The gate's release figures without a server: tokenizer drift, size against the dry run's prediction, unquantized layers, and served-vs-in-process disagreement judged anomalous (the served step is in tests/e2e/test_gate_release.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from quantkit.cli import main
from tests.conftest import TINY

TARGET, DRAFT = TINY / "moe-target", TINY / "moe-eagle3-draft"


K, MAX_TOKENS = 3, 64


def _config(tmp_path: Path, candidates: list[dict], steps: list[str], **over) -> str:
    cfg = {
        "name": "release",
        "target": str(TARGET),
        "draft": str(DRAFT),
        "candidates": candidates,
        "steps": steps,
        "check": {"vllm": "off"},
        "acceptance": {"min_al": 2.0, "num_speculative_tokens": K, "max_new_tokens": MAX_TOKENS},
    }
    for key, value in over.items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
    path = tmp_path / "gate.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def _gate(config: str, out: Path, *extra: str):
    return CliRunner().invoke(main, ["gate", config, "--out", str(out), *extra])


def _failures(result) -> list[str]:
    return [x for x in result.stderr.splitlines() if x.startswith("gate failed:")]


def test_tokenizer_drift_size_and_unquantized_are_caught(moe_pair, tmp_path):
    """One changed token in a copy of the draft's tokenizer.json, and an extra tensor in its weights; the intact
    draft beside it passes the same figures; the BF16 draft itself is no quantized output."""
    from safetensors.torch import load_file, save_file

    draft_q, _ = moe_pair
    bad = tmp_path / "draft-drifted"
    shutil.copytree(draft_q, bad)
    tok = json.loads((bad / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = tok["model"]["vocab"]
    token = next(t for t, i in vocab.items() if i == 100)
    vocab[token + "x"] = vocab.pop(token)
    (bad / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False), encoding="utf-8")
    import torch

    tensors = load_file(str(bad / "model.safetensors"))
    tensors["model.extra_tensor"] = torch.zeros(200_000, dtype=torch.bfloat16)  # 400 kB on a 1.66 MB output
    save_file(tensors, str(bad / "model.safetensors"), metadata={"format": "pt"})
    index_path = bad / "model.safetensors.index.json"  # outputs carry an index, and the index is the truth
    index = json.loads(index_path.read_text())
    index["weight_map"]["model.extra_tensor"] = "model.safetensors"
    index_path.write_text(json.dumps(index))

    cfg = _config(
        tmp_path,
        [
            {"name": "intact", "path": str(draft_q)},
            {"name": "drifted", "path": str(bad)},
            {"name": "bf16", "path": str(DRAFT)},
        ],
        ["check"],
    )
    result = _gate(cfg, tmp_path / "r", "--json")
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    assert data["gate"]["verdict"] == "regression"
    cands = data["candidates"]
    assert cands["intact"]["verdict"] == "pass", cands["intact"]["verdict_reasons"]
    assert cands["intact"]["release"]["tokenizer_drift"] == []
    assert abs(cands["intact"]["release"]["size_ratio"] / cands["intact"]["release"]["predicted_size_ratio"] - 1) < 0.01
    assert cands["drifted"]["verdict"] == "regression"
    drift = cands["drifted"]["release"]["tokenizer_drift"]
    assert drift == [f"tokenizer.json: model.vocab: id 100 is {token!r} in source, {token + 'x'!r} in output"]
    lines = _failures(result)
    assert any(
        x.startswith("gate failed: drifted: check: tokenizer.drifted_files = 1 (threshold <= 0)") and "id 100" in x
        for x in lines
    ), lines
    assert any("drifted: check: size.prediction_error = " in x and "apply --dry-run predicts" in x for x in lines)
    # the BF16 source as a candidate: as large as its source, no layer quantized, and no quantkit.json to predict from
    bf16 = {c["name"]: c for c in cands["bf16"]["gate"]["checks"]}
    assert bf16["size.ratio"]["value"] == 1.0 and bf16["size.ratio"]["op"] == "<" and not bf16["size.ratio"]["passed"]
    assert bf16["check.unexpected_unquantized"]["value"] == 1 and not bf16["check.unexpected_unquantized"]["passed"]
    assert "size.prediction_error" not in bf16
    assert not any(x.startswith("gate failed: intact:") for x in lines)


def test_served_and_in_process_disagreeing_is_anomalous():
    """The rule the serve step applies, on hand-made per-prompt counters (42 prompts, 5 drafts each): a server one
    accepted token short on every prompt disagrees beyond what differing prompts explain (p = 2 / 2**42): anomalous,
    not a regression, though it clears min_al. A few prompts moved either way (near-tie flips) pass, and so do 7 all
    moved the same way (p = 2/128 > 0.01). Without per-request counters only a fixed tolerance applies."""
    from quantkit.acceptance.agreement import al_agreement
    from quantkit.gate.verdict import agreement, judge, threshold
    from quantkit.results import PromptAcceptance

    def run(accepted):
        return [
            PromptAcceptance(id=f"p{i}", domain="d", num_drafts=5, num_accepted=a, generated_tokens=0)
            for i, a in enumerate(accepted)
        ]

    def check(served, name):
        a = al_agreement(run(served), in_process)
        al = 1 + sum(served) / (5 * 42)
        return a, agreement(
            "pair", "serve", name, al, ref_al, None, p_value=a.p_value, level=a.level, shown_threshold=a.bound
        )

    in_process = run([12] * 42)
    ref_al = 1 + 12 / 5
    far_a, bad = check([11] * 42, "serve.bs8.al_vs_in_process")
    near_a, good = check([13, 11, 11, 13, 12] + [12] * 37, "serve.bs1.al_vs_in_process")
    seven_a, also_good = check([11] * 7 + [12] * 35, "serve.bs4.al_vs_in_process")
    assert bad.value == pytest.approx(abs(far_a.delta)) and bad.threshold == far_a.bound and bad.op == "<="
    assert not bad.passed and bad.message.startswith("anomalous: 3.2 disagrees with 3.4 measured the other way beyond")
    assert good.passed and good.message == "" and also_good.passed and seven_a.p_value == 2 / 128
    assert judge([bad, good, also_good]).verdict == "anomalous"
    # al_tolerance as a floor: the same systematic difference under it is not anomalous
    floor = agreement("c", "serve", "x", 3.2, 3.4, 0.25, p_value=far_a.p_value, level=0.99)
    assert judge([floor]).verdict == "pass"
    # no per-request counters: the fixed tolerance is the whole rule
    assert judge([agreement("c", "serve", "x", 3.2, 3.6455, 0.05)]).verdict == "anomalous"
    assert judge([agreement("c", "serve", "x", 3.62, 3.6455, 0.05)]).verdict == "pass"
    # a strict "<" threshold: equal to it misses
    assert not threshold("c", "check", "size.ratio", 1.0, "<", 1.0).passed
    assert threshold("c", "check", "size.ratio", 0.99, "<", 1.0).passed
