# tier: unit
"""deploy serves a draft with the K that `quantkit tune --apply` wrote into its folder (tune.json), unless told."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from quantkit.cli import main
from quantkit.deploy.run import DeployInputError, run
from quantkit.results.tune import TuneOption

TINY = Path(__file__).resolve().parents[2] / "examples" / "tiny"


@pytest.fixture()
def tuned(tmp_path: Path) -> Path:
    draft = tmp_path / "draft-tuned"
    shutil.copytree(TINY / "eagle3-draft", draft)
    option = TuneOption(body="fp8", draft_vocab=1024, k=5, al=3.1, baseline_al=3.1, al_ratio=1.0)
    (draft / "tune.json").write_text(option.model_dump_json(indent=2) + "\n")  # as tune --apply writes it
    return draft


def test_the_tuned_k_is_the_default(tuned: Path) -> None:
    m = run(tuned, target=TINY / "target", platform="gfx950")
    assert m.num_speculative_tokens == 5 and m.speculative_config is not None
    assert m.speculative_config["num_speculative_tokens"] == 5
    assert m.num_speculative_tokens_source == "tune.json (quantkit tune --apply)"
    assert '"num_speculative_tokens":5' in " ".join(m.argv)
    # an explicit K wins, and says so
    m2 = run(tuned, target=TINY / "target", platform="gfx950", num_speculative_tokens=2)
    assert m2.num_speculative_tokens == 2 and m2.num_speculative_tokens_source == "--num-speculative-tokens"
    # through the CLI as a user runs it
    r = CliRunner().invoke(
        main,
        ["deploy", str(tuned), "--target", str(TINY / "target"), "--json", "--out", str(tuned.parent / "deploy.json")],
    )
    assert r.exit_code == 0, r.output
    assert '"num_speculative_tokens": 5' in r.stdout or '"num_speculative_tokens":5' in r.stdout


def test_without_tune_json_k_is_3_and_a_bad_one_is_refused(tuned: Path) -> None:
    m = run(TINY / "eagle3-draft", target=TINY / "target", platform="gfx950")
    assert m.num_speculative_tokens == 3 and m.num_speculative_tokens_source == "default"
    (tuned / "tune.json").write_text('{"k": "many"}')
    with pytest.raises(DeployInputError, match="tune.json quantkit tune --apply writes") as e:
        run(tuned, target=TINY / "target", platform="gfx950")
    assert "\n" not in str(e.value)
