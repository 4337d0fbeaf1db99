# tier: integration
"""What a user reads about the deployment pair (issue 36): the model card and publish's deploy.json describe the pair
the gate measured (the FP8 draft on the MXFP4 target, not on the BF16 target `apply` read), and `apply` ends with the
next command. Real `apply` runs of the bundled tiny models (the native executor: no Quark, no vLLM)."""

from __future__ import annotations

import json
import shlex

import pytest
from click.testing import CliRunner

from quantkit.cli import main


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The demo's deployment pair made as a user makes it: mxfp4-moe on the MoE target, fp8-draft on its draft."""
    from quantkit.io.paths import tiny_models_dir

    tiny = tiny_models_dir()
    root = tmp_path_factory.mktemp("pair")
    runner = CliRunner()
    target = runner.invoke(
        main,
        ["apply", "--recipe", "mxfp4-moe", "--model", str(tiny / "moe-target"), "--output", str(root / "moe-mxfp4")],
    )
    assert target.exit_code == 0, target.output
    draft = runner.invoke(
        main,
        [
            "apply",
            "--recipe",
            "fp8-draft",
            "--model",
            str(tiny / "moe-eagle3-draft"),
            "--target",
            str(tiny / "moe-target"),
            "--output",
            str(root / "draft-fp8"),
        ],
    )
    assert draft.exit_code == 0, draft.output
    return {
        "tiny": tiny,
        "root": root,
        "target": root / "moe-mxfp4",
        "draft": root / "draft-fp8",
        "apply_stdout": draft.stdout,
        "apply_stderr": draft.stderr,
    }


def test_apply_ends_with_the_check_command_that_pastes(pair: dict) -> None:
    last = pair["apply_stderr"].strip().splitlines()[-1]
    assert shlex.split(last) == ["quantkit", "check", str(pair["draft"]), "--target", str(pair["tiny"] / "moe-target")]
    assert "quantkit check" not in pair["apply_stdout"]  # stdout stays the result


def test_apply_prints_one_rate(pair: dict) -> None:
    out, err = pair["apply_stdout"], pair["apply_stderr"]
    rates = [w for w in " ".join((out + err).split()).split(" ") if w.startswith("MB/s")]
    assert len(rates) == 1, out + err  # the executor's, in the summary; progress lines print none of their own
    manifest = json.loads((pair["draft"] / "quantkit.json").read_text())
    assert f"quantized at {manifest['throughput_mb_s']:.0f} MB/s" in " ".join(out.split())


def _report(pair: dict) -> dict:
    tiny, target, draft = pair["tiny"], str(pair["target"]), str(pair["draft"])
    return {
        "schema_version": 1,
        "model": draft,
        "baseline_model": str(tiny / "moe-eagle3-draft"),
        "model_kind": "eagle3-draft",
        "acceptance": {
            "backend": "vllm",
            "candidate_kind": "pair",
            "candidate_target": target,
            "settings": {"num_speculative_tokens": 3, "prompts": "builtin", "num_prompts": 42},
            "baseline": {
                "target": str(tiny / "moe-target"),
                "draft": str(tiny / "moe-eagle3-draft"),
                "mean_acceptance_length": 3.69,
            },
            "candidate": {"target": target, "draft": draft, "mean_acceptance_length": 3.646},
            "ratio": 0.988,
            "ratio_ci": [0.954, 1.02],
        },
        "serve": {"target": target, "draft": draft, "num_speculative_tokens": 3},
        "gate": {
            "passed": True,
            "checks": [
                {
                    "candidate": "draft-fp8",
                    "step": "check",
                    "name": "check.errors",
                    "value": 0.0,
                    "op": "<=",
                    "threshold": 0.0,
                    "passed": True,
                },
                {
                    "candidate": "draft-fp8",
                    "step": "acceptance",
                    "name": "acceptance.ratio",
                    "value": 0.988,
                    "op": ">=",
                    "threshold": 0.95,
                    "passed": True,
                },
                {
                    "candidate": "draft-fp8",
                    "step": "serve",
                    "name": "serve.bs8.acceptance_length",
                    "value": None,
                    "op": ">=",
                    "threshold": 2.0,
                    "passed": False,
                    "message": "the server died before batch 8",
                },
            ],
        },
    }


def _serve_line(card: str) -> list[str]:
    lines = [line for line in card.splitlines() if line.startswith("vllm serve ")]
    assert len(lines) == 1, lines
    return shlex.split(lines[0].replace("<TARGET>", "TARGET_PLACEHOLDER"))


def test_the_card_and_deploy_json_describe_the_measured_pair(pair: dict) -> None:
    from quantkit.deploy.run import run as deploy
    from quantkit.publish.bundle import prepare
    from quantkit.publish.card import render_card

    # the references: deploy run directly on the measured pair (MXFP4 target) and on the pair apply read (BF16)
    measured = deploy(pair["draft"], target=pair["target"], platform="gfx950").predicted_backends
    bf16 = deploy(pair["draft"], target=pair["tiny"] / "moe-target", platform="gfx950").predicted_backends
    assert measured["moe"] != bf16["moe"] and bf16["moe"] == "unquantized", (measured, bf16)

    pub = prepare(pair["draft"], _report(pair), repo_id="org/draft-fp8", target="org/moe-mxfp4")
    assert pub.deploy_json is not None and pub.deploy_json["predicted_backends"] == measured
    assert pub.deploy_json["model"] == "org/moe-mxfp4" and pub.deploy_json["draft"] == "org/draft-fp8"
    card = str(render_card(pub))
    argv = _serve_line(card)
    assert argv[:3] == ["vllm", "serve", "org/moe-mxfp4"]
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec["model"] == "org/draft-fp8"
    assert f"moe `{measured['moe']}`" in card and "moe `unquantized`" not in card
    assert "this draft served on `org/moe-mxfp4`" in card and "recipe `mxfp4-moe`" in card
    # the figures as their kind reads, and no lm-eval for a draft
    assert "| check.errors | 0 | <= 0 | yes |" in card and "| acceptance.ratio | 0.9880 | >= 0.9500 | yes |" in card
    assert "| serve.bs8.acceptance_length | not measured: the server died before batch 8 | >= 2.0000 | no |" in card
    assert "Does not apply to a draft" in card
    # what apply read is still said where it belongs: the published quantkit.json names the BF16 target
    assert pub.manifest.target == "moe-target"


def test_without_a_hub_id_the_card_names_the_measured_target(pair: dict) -> None:
    from quantkit.publish.bundle import prepare
    from quantkit.publish.card import render_card

    pub = prepare(pair["draft"], _report(pair), repo_id="org/draft-fp8")
    card = str(render_card(pub))
    assert _serve_line(card)[2] == "TARGET_PLACEHOLDER"
    assert "Replace `<TARGET>` with the Hub id of `moe-mxfp4`" in card
    assert str(pair["root"]) not in card  # no local path
    assert pub.deploy_json is not None and pub.deploy_json["predicted_backends"]["moe"] != "unquantized"


def test_deploys_padding_finding_reads_as_a_sentence_about_vllms_backend(pair: dict, tmp_path) -> None:
    # moe_intermediate_size 128 at TP 2: 64 per rank, which AITER's MXFP4 MoE kernel pads to 128 (by hand: +100%)
    res = CliRunner().invoke(
        main,
        ["deploy", str(pair["target"]), "--platform", "gfx950", "--tp", "2", "--out", str(tmp_path)],
        env={"COLUMNS": "80"},
    )
    assert res.exit_code == 0, res.output
    line = next(x for x in res.stdout.splitlines() if x.startswith("warning moe-padding at "))
    message = line.split(": ", 1)[1]
    assert message.startswith(
        "vLLM's AITER_MXFP4_MXFP4 MoE backend pads each rank's expert sizes at TP 2: "
        "intermediate 64 -> 128, hidden 256 -> 256: 100% extra"
    )
    assert ". Fix: Pick a TP size" in message  # the fix is its own sentence, not glued on
