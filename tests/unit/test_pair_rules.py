# tier: unit
"""Pair mode before any model loads: roles checked, a misfit pair refused, the gate's pair candidates validated, and the cross-engine agreement rule on hand-made counters (the pair's acceptance in vLLM and the reference engine is in tests/integration/test_pair.py)."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner

from quantkit.acceptance.run import AcceptanceError, run_acceptance
from quantkit.cli import main
from tests.conftest import TINY

QUIET = lambda _m: None  # noqa: E731


TARGET, DRAFT = TINY / "moe-target", TINY / "moe-eagle3-draft"


def _acc(*extra: str) -> list[str]:
    return [
        "acceptance",
        "--target",
        str(TARGET),
        "--draft",
        str(DRAFT),
        "--backend",
        "reference",
        "--max-new-tokens",
        "2",
        *extra,
    ]


@pytest.mark.parametrize(
    "args, needle",
    [
        (
            ["--candidate", str(TARGET), "--candidate-target", str(TARGET)],
            "--candidate",
        ),  # a target as the pair's draft
        (["--candidate", str(DRAFT), "--candidate-target", str(DRAFT)], "--candidate-target"),  # a draft as its target
    ],
)
def test_pair_roles_are_checked(args, needle):
    result = CliRunner().invoke(main, _acc(*args))
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], lines


def test_pair_misfit_is_refused_before_loading():
    """The Llama target's draft (aux ids 1,2,3) on the 2-layer MoE target: the static fit check covers the pair."""
    with pytest.raises(AcceptanceError, match="aux-layer-out-of-range") as e:
        run_acceptance(
            TARGET, DRAFT, TINY / "eagle3-draft", candidate_target=TARGET, backend="reference", progress=QUIET
        )
    assert str(TINY / "eagle3-draft") in str(e.value) and str(TARGET) in str(e.value)


def _gate_cfg(tmp_path, candidate: dict, **over) -> str:
    cfg = {
        "name": "pair",
        "target": str(TARGET),
        "draft": str(DRAFT),
        "candidates": [candidate],
        "steps": ["check", "acceptance"],
        "check": {"vllm": "off"},
        "acceptance": {"min_ratio": 0.98, "per_domain_min_ratio": 0.95, "min_al": 2.0, "backend": "reference"},
    }
    cfg.update(over)
    path = tmp_path / "gate.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


@pytest.mark.parametrize(
    "candidate, needle",
    [
        ({"name": "p", "path": str(DRAFT), "target": "/nowhere/t"}, "candidates[0].target: /nowhere/t does not exist"),
        ({"name": "p", "path": str(DRAFT), "target": str(TARGET), "baseline": str(TARGET)}, "drop its baseline"),
        ({"name": "p", "path": str(TARGET), "target": str(TARGET)}, "candidates[0].path"),
        ({"name": "p", "path": str(DRAFT), "target": str(DRAFT)}, "candidates[0].target"),
        ({"name": "p", "path": str(DRAFT), "target": 3}, "candidates.0.target"),
    ],
)
def test_gate_rejects_bad_pairs(tmp_path, candidate, needle):
    result = CliRunner().invoke(main, ["gate", _gate_cfg(tmp_path, candidate), "--out", str(tmp_path / "r")])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: gate config") and needle in lines[0], lines
    assert not (tmp_path / "r").exists()


def test_gate_pair_paths_are_relative_to_the_config(tmp_path):
    from quantkit.gate.config import GateConfigError, load_gate_config

    sub = tmp_path / "cfg"
    sub.mkdir()
    (tmp_path / "qd").mkdir()
    cfg_file = sub / "gate.yaml"
    data = {
        "name": "rel",
        "target": str(TARGET),
        "draft": str(DRAFT),
        "steps": ["acceptance"],
        "candidates": [{"name": "p", "path": "../qd", "target": "../qt"}],
    }
    cfg_file.write_text(yaml.safe_dump(data))
    with pytest.raises(GateConfigError, match=r"candidates\[0\]\.target: \.\./qt does not exist"):
        load_gate_config(cfg_file)
    (tmp_path / "qt").mkdir()
    cfg, base = load_gate_config(cfg_file)
    assert cfg.candidates[0].target == "../qt" and base == sub.resolve()


def test_agreement_rule_on_hand_made_counters():
    """quantkit.acceptance.agreement on counters whose answer is known by hand: identical runs agree with bound 0;
    k of 42 prompts one accepted token apart, all the same way, give p = 2 / 2**k exactly (only the swaps of none
    or all of them reach the observed difference), so 7 agree at 0.99 and 8 do not; mixed directions agree; a
    counter difference where the tokens are the same is named."""
    from quantkit.acceptance.agreement import al_agreement
    from quantkit.results import PromptAcceptance

    def run(accepted: list[int], digests: list[str] | None = None) -> list[PromptAcceptance]:
        return [
            PromptAcceptance(
                id=f"p{i}",
                domain="d",
                num_drafts=5,
                num_accepted=a,
                generated_tokens=5 + a + 1,
                output_digest=None if digests is None else digests[i],
            )
            for i, a in enumerate(accepted)
        ]

    same = run([10] * 42)
    r = al_agreement(same, same)
    assert r.delta == 0 and r.bound == 0 and r.p_value == 1 and r.agree and r.differing_prompts == 0
    for k, agree in ((7, True), (8, False)):
        shifted = run([11] * k + [10] * (42 - k))
        r = al_agreement(shifted, same)
        assert r.differing_prompts == k and r.p_value == pytest.approx(2 / 2**k) and r.agree is agree, r
        assert r.delta == pytest.approx(k / (5 * 42), abs=1e-6) and (abs(r.delta) <= r.bound) is agree
    mixed = run([11] * 6 + [9] * 6 + [10] * 30)
    assert al_agreement(mixed, same).agree
    # counters by token identity: p3 wrote the same tokens in both runs but counted one accepted token more
    digests = [f"t{i}" for i in range(42)]
    r = al_agreement(run([10] * 3 + [11] + [10] * 38, digests), run([10] * 42, digests[:5] + ["x"] + digests[6:]))
    assert r.same_output_prompts == 41 and r.counter_mismatches == ["p3"]
    with pytest.raises(ValueError, match="same prompts"):
        al_agreement(same, same[:-1])
