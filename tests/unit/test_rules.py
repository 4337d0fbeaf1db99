"""quantkit.rules: the one rule table. Ids are unique, every finding carries its rule's source and a code the rule
declares, and check and deploy take the findings of a rule they both run from the same row (a rule added to the
table in a test shows up in both)."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from quantkit.check.run import run as check_checkpoint
from quantkit.deploy.run import run as deploy_manifest
from quantkit.rules import table
from quantkit.rules.rule import COMMANDS, Rule, RuleContext
from quantkit.vocab import SEVERITIES


@pytest.fixture
def pair(tiny, tmp_path):
    target, draft = tmp_path / "target", tmp_path / "draft"
    shutil.copytree(tiny / "target", target)
    shutil.copytree(tiny / "eagle3-draft", draft)
    return target, draft


def _edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config, indent=2))


def _findings(pair, command: str) -> list:
    target, draft = pair
    if command == "check":
        return check_checkpoint(draft, target=target, vllm="off").findings
    return deploy_manifest(draft, target=target).findings


def test_table_invariants():
    ids = [r.id for r in table.RULES]
    assert len(ids) == len(set(ids))
    for r in table.RULES:
        assert r.severity in SEVERITIES and r.codes and len(set(r.codes)) == len(r.codes), r.id
        assert r.commands and r.commands <= set(COMMANDS), r.id
        assert r.source and "\n" not in r.source, r.id
        assert not (r.check is not None and r.check_layer is not None), r.id
        # a rule no command runs is an observation: of the real load, the numeric step, or the served step's log
        assert r.runs or r.when in ("load", "numeric", "serve"), r.id
    # deploy reads headers only: no rule it runs reads tensor data
    assert all(r.reads == "headers" for r in table.rules_for("deploy", reads=("headers",)))


@pytest.mark.parametrize("command", ["check", "deploy"])
def test_every_finding_carries_its_rules_source_and_a_declared_code(pair, command):
    _edit_config(pair[1], eagle_aux_hidden_state_layer_ids=[1, 2, 7])  # beyond the 4-layer target
    _edit_config(pair[0], vocab_size=4096)
    found = _findings(pair, command)
    assert found
    observed = {c for r in table.RULES if not r.runs for c in r.codes}  # the real load's and numeric's findings
    for f in found:
        if not f.source:
            assert command == "check" and f.code in observed, f.code
            continue
        rules = [r for r in table.RULES if r.source == f.source]
        assert rules, (f.code, f.source)
        assert f.code in rules[0].codes, (f.code, rules[0].id)


def test_check_and_deploy_share_one_implementation(pair):
    """The aux-layer rule runs from one row in both commands: the same codes on the same fields, the same source."""
    _edit_config(pair[1], eagle_aux_hidden_state_layer_ids=[1, 2, 7])
    aux = table.RULES[[r.id for r in table.RULES].index("draft-aux-layers")]
    assert {"check", "deploy"} <= aux.commands
    by = {
        c: {(f.code, f.layer_or_tensor, f.source) for f in _findings(pair, c) if f.code in aux.codes}
        for c in ("check", "deploy")
    }
    where = "eagle_aux_hidden_state_layer_ids"  # out of range, and differing from eagle_config's ids (a warning)
    assert (
        by["check"]
        == by["deploy"]
        == {("aux-layer-out-of-range", where, aux.source), ("aux-layer-ids", where, aux.source)}
    )


def test_a_rule_added_to_the_table_appears_in_check_and_deploy(pair, monkeypatch):
    def toy(ctx: RuleContext) -> None:
        ctx.findings.add("warning", "toy-finding", str(ctx.subject.path), "a toy rule's finding", "none")

    rule = Rule(
        "toy-rule",
        "a rule defined in a test",
        "warning",
        ("toy-finding",),
        "tests/unit/test_rules.py toy",
        frozenset({"check", "deploy"}),
        check=toy,
        needs="pair",
    )
    monkeypatch.setattr(table, "RULES", table.RULES + (rule,))
    monkeypatch.setattr(table, "_BY_ID", {**table._BY_ID, rule.id: rule})
    for command in ("check", "deploy"):
        toys = [f for f in _findings(pair, command) if f.code == "toy-finding"]
        assert len(toys) == 1 and toys[0].source == rule.source, command
    # a rule of one command stays out of the other
    monkeypatch.setattr(table, "RULES", table.RULES[:-1] + (replace(rule, commands=frozenset({"deploy"})),))
    assert not [f for f in _findings(pair, "check") if f.code == "toy-finding"]
    assert [f for f in _findings(pair, "deploy") if f.code == "toy-finding"]


def test_rule_schema_platforms_versions_and_decided_at():
    """The record's platforms, vLLM version range (min inclusive, max exclusive, packaging.version) and decided_at:
    a version gate holds on its range only, and malformed records fail when the table is built."""
    from quantkit.rules.rule import ServingOptions

    gated = Rule(
        "toy-gated",
        "a gated rule",
        "warning",
        ("toy",),
        "tests",
        frozenset({"check"}),
        platforms=frozenset({"gfx942"}),
        vllm_min="0.20",
        vllm_max="0.26",
    )
    assert gated.vllm_spec == ">=0.20,<0.26" and gated.decided_at == "checkpoint"
    on = {
        v: gated.holds_for(ServingOptions(platform="gfx942", vllm_version=v))
        for v in ("0.19.1", "0.20.0", "0.25.1", "0.26.0", "0.26.0rc1", "0.32.0+cpu")
    }
    assert on == {
        "0.19.1": False,
        "0.20.0": True,
        "0.25.1": True,
        "0.26.0": False,
        "0.26.0rc1": False,
        "0.32.0+cpu": False,
    }
    assert not gated.holds_for(ServingOptions(platform="gfx950", vllm_version="0.21"))
    assert gated.holds_for(ServingOptions(platform="gfx942"))  # no version given: every version
    for bad in (
        {"vllm_min": "0.26", "vllm_max": "0.20"},
        {"vllm_min": "not-a-version"},
        {"platforms": frozenset({"gfx999"})},
        {"decided_at": "serve"},
        {"when": "serve"},
    ):
        with pytest.raises(ValueError):
            replace(gated, **bad)
    assert replace(gated, decided_at="serve", when="serve").decided_at == "serve"
    for r in table.RULES:
        assert r.decided_at in ("checkpoint", "serve") and r.source, r.id
        assert r.platforms is None or r.platforms <= {"gfx950", "gfx942", "cuda", "cpu"}, r.id
