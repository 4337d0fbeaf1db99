# tier: unit
"""What a user reads (issue 36): commands that paste as checked, verdicts first, figures that are true, tables that
fit, defaults that never write into the current folder. Each test reads the output a person reads."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from quantkit.cli import main


def run(*args: str, columns: int = 100, cwd: Path | None = None) -> Result:
    runner = CliRunner()
    env = {"COLUMNS": str(columns)}
    if cwd is None:
        return runner.invoke(main, list(args), env=env)
    old = Path.cwd()
    os.chdir(cwd)
    try:
        return runner.invoke(main, list(args), env=env)
    finally:
        os.chdir(old)


# --- deploy: the command pastes as checked ----------------------------------------------------------------------


def _pair_args(tiny: Path, out: Path, *more: str) -> list[str]:
    return [
        "deploy",
        str(tiny / "eagle3-draft"),
        "--target",
        str(tiny / "target"),
        "--platform",
        "gfx950",
        "--num-speculative-tokens",
        "3",
        "--out",
        str(out),
        "--overwrite",
        *more,
    ]


@pytest.mark.parametrize("columns", [60, 80, 200])
def test_the_printed_deploy_command_gives_the_manifests_argv_at_any_width(
    tiny: Path, tmp_path: Path, columns: int
) -> None:
    res = run(*_pair_args(tiny, tmp_path), columns=columns)
    assert res.exit_code == 0, res.output
    argv = json.loads((tmp_path / "deploy.json").read_text())["argv"]
    assert argv[:2] == ["vllm", "serve"] and any(a.startswith("{") for a in argv)  # the speculative config JSON
    lines = res.stdout.splitlines()
    commands = [line for line in lines if line.startswith("vllm serve")]
    assert len(commands) == 1, res.stdout
    assert shlex.split(commands[0]) == argv
    assert lines[lines.index(commands[0]) - 1] == "command:"
    # --command-only: the whole of stdout is the command
    only = run(*_pair_args(tiny, tmp_path, "--command-only"), columns=columns)
    assert only.exit_code == 0, only.output
    assert only.stdout.count("\n") == 1 and shlex.split(only.stdout) == argv


def test_the_environment_lines_paste_as_exports(tiny: Path, tmp_path: Path) -> None:
    res = run(*_pair_args(tiny, tmp_path), columns=60)
    env = json.loads((tmp_path / "deploy.json").read_text())["env"]
    assert env
    for e in env:
        line = next(x for x in res.stdout.splitlines() if x.startswith(f"export {e['name']}="))
        words = shlex.split(line, comments=True)
        assert words == ["export", f"{e['name']}={e['value']}"]


def test_a_refused_deployment_says_so_in_one_line_and_prints_no_command(tiny: Path, tmp_path: Path) -> None:
    res = run(*_pair_args(tiny, tmp_path, "--tp", "3"), columns=200)  # 4 attention heads: TP 3 is an error
    assert res.exit_code == 1, res.output
    written = json.loads((tmp_path / "deploy.json").read_text())
    assert written["ok"] is False and written["argv"][:2] == ["vllm", "serve"]
    lines = res.stdout.splitlines()
    assert lines[0].startswith("deploy refused: 4 errors, 0 warnings, 0 info; ")  # the verdict comes first
    assert not any("vllm serve" in line for line in lines), res.stdout
    assert not any(line.startswith("command") for line in lines)
    only = run(*_pair_args(tiny, tmp_path, "--tp", "3", "--command-only"))
    assert only.exit_code == 1 and only.stdout == ""
    assert only.stderr.startswith("deploy refused: 4 errors, 0 warnings, 0 info; ") and only.stderr.count("\n") == 1


def test_deploy_writes_into_a_folder_named_after_the_model_and_never_replaces_silently(
    tiny: Path, tmp_path: Path
) -> None:
    args = ["deploy", str(tiny / "target"), "--platform", "cpu"]
    first = run(*args, cwd=tmp_path)
    assert first.exit_code == 0, first.output
    written = tmp_path / "quantkit-out" / "deploy-target" / "deploy.json"
    assert json.loads(written.read_text())["model"] == str(tiny / "target")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["quantkit-out"]  # nothing beside the user's files
    before = written.read_bytes()
    second = run(*args, "--max-model-len", "64", cwd=tmp_path)
    assert second.exit_code == 2 and second.stdout == ""
    assert second.stderr.startswith("error: --out quantkit-out/deploy-target: deploy.json exists")
    assert "--overwrite" in second.stderr and second.stderr.count("\n") == 1
    assert written.read_bytes() == before
    third = run(*args, "--max-model-len", "64", "--overwrite", cwd=tmp_path)
    assert third.exit_code == 0 and json.loads(written.read_text())["max_model_len"] == 64
    # --command-only writes nothing unless --out is given
    (tmp_path / "quantkit-out" / "deploy-target" / "deploy.json").unlink()
    only = run(*args, "--command-only", cwd=tmp_path)
    assert only.exit_code == 0 and not written.exists()


# --- rules and check: verdict first, tables that fit 100 columns, ids whole ----------------------------------------


def _fits(text: str, width: int = 100) -> None:
    long = [line for line in text.splitlines() if len(line) > width]
    assert not long, long


def test_rules_fits_100_columns_with_every_id_whole_and_says_what_each_checks() -> None:
    from quantkit.rules.table import RULES

    res = run("rules", columns=100)
    assert res.exit_code == 0, res.output
    _fits(res.stdout)
    rows = {line.split()[0]: line for line in res.stdout.splitlines() if line.split()}
    for rule in RULES:
        assert rule.id in rows, f"{rule.id} is not whole on one line"
        assert rule.title.split()[0] in rows[rule.id]  # the title starts on the id's line
    assert len(res.stdout.splitlines()) < 2.5 * len(RULES)  # (it was 788 lines for 34 rules)
    assert not any(r.source.split()[0] in res.stdout for r in RULES)  # sources only with --verbose
    verbose = run("rules", "--verbose", columns=100)
    _fits(verbose.stdout)
    flat = " ".join(verbose.stdout.split())
    assert all(" ".join(r.source.split()) in flat for r in RULES)


def _damaged_draft(tiny: Path, tmp_path: Path) -> Path:
    """The tiny draft with an FP8 quantization_config but no scale tensors: check finds several errors."""
    import shutil

    out = tmp_path / "draft-no-scales"
    shutil.copytree(tiny / "eagle3-draft", out)
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "quark",
        "version": "0.13",
        "exclude": ["fc", "lm_head"],
        "export": {"kv_cache_group": [], "pack_method": "reorder", "weight_format": "real_quantized"},
        "global_quant_config": {
            "weight": {"dtype": "fp8_e4m3", "qscheme": "per_channel", "ch_axis": 0, "is_dynamic": False},
            "input_tensors": {"dtype": "fp8_e4m3", "qscheme": "per_channel", "ch_axis": 1, "is_dynamic": True},
        },
        "layer_quant_config": {},
        "layer_type_quant_config": {},
    }
    (out / "config.json").write_text(json.dumps(config))
    return out


def test_check_puts_its_verdict_first_and_fits_100_columns(tiny: Path, tmp_path: Path) -> None:
    folder = _damaged_draft(tiny, tmp_path)
    args = ["check", str(folder), "--target", str(tiny / "target"), "--vllm", "off", "--platform", "gfx950"]
    res = run(*args, columns=100)
    listed = run(*args, "--json")
    findings = json.loads(listed.stdout)["findings"]
    errors = [f for f in findings if f["severity"] == "error"]
    assert res.exit_code == listed.exit_code == 1 and len({f["code"] for f in findings}) >= 2, res.output
    _fits(res.stdout)
    lines = res.stdout.splitlines()
    assert lines[0].startswith(f"FAILED: {len(errors)} error")
    for f in findings:  # every finding's code whole on one line
        assert any(f["code"] in line.split() for line in lines), f["code"]
    # the kernel table is behind --verbose: one line by default
    assert "kernel path on" not in res.stdout and "--verbose" in res.stdout
    verbose = run(*args, "--verbose", columns=100)
    _fits(verbose.stdout)
    assert verbose.stdout.splitlines()[0] == lines[0] and "kernel path on gfx950" in verbose.stdout


# --- small untruths ------------------------------------------------------------------------------------------------


def test_the_dry_run_shows_sizes_in_a_unit_that_shows_the_difference(tiny: Path, tmp_path: Path) -> None:
    args = [
        "apply",
        "--recipe",
        "mxfp4-moe",
        "--model",
        str(tiny / "moe-target"),
        "--output",
        str(tmp_path / "o"),
        "--dry-run",
    ]
    res = run(*args, columns=200)
    data = json.loads(run(*args, "--json").stdout)
    before, after = data["size_before_bytes"], data["size_after_bytes"]
    assert 1e6 < after < before < 1e9  # a few MB: "0.006 GB -> 0.004 GB" was the old line
    line = next(x for x in res.stdout.splitlines() if "predicted size" in x)
    shown = line.split("predicted size ", 1)[1].split(" (", 1)[0]
    assert shown == f"{before / 1e6:.2f} MB -> {after / 1e6:.2f} MB", line


def test_human_bytes_keeps_the_digits_that_tell_sizes_apart() -> None:
    from quantkit.cli.options import human_bytes

    assert human_bytes(2_345_678, 2_101_000) == ["2.35 MB", "2.10 MB"]
    assert human_bytes(2_000_100, 2_000_000) == ["2.0001 MB", "2.0000 MB"]
    assert human_bytes(812, 406) == ["812 B", "406 B"]
    assert human_bytes(3_400_000_000, 1_100_000_000) == ["3.40 GB", "1.10 GB"]


def test_a_finding_reads_as_a_sentence_with_its_fix_apart() -> None:
    from quantkit.results.check import Finding

    f = Finding(
        severity="warning",
        code="moe-padding",
        layer_or_tensor="model.layers.*.mlp.experts",
        message="vLLM's AITER_MXFP4_MXFP4 MoE backend pads each rank's expert sizes at TP 8",
        fix="pick a TP size whose per-rank intermediate size is already aligned",
        source="vllm/x.py f",
    )
    assert f.sentence() == (
        "warning moe-padding at model.layers.*.mlp.experts: vLLM's AITER_MXFP4_MXFP4 MoE backend "
        "pads each rank's expert sizes at TP 8. Fix: Pick a TP size whose per-rank intermediate "
        "size is already aligned. [vllm/x.py f]"
    )
    # a name at the start of a message stays as written
    assert (
        Finding(severity="error", code="c", layer_or_tensor="x", message="model.fc is quantized.").sentence()
        == "error c at x: model.fc is quantized."
    )


def test_deploy_says_what_the_vllm_version_line_means(tiny: Path, tmp_path: Path) -> None:
    res = run("deploy", str(tiny / "target"), "--platform", "cpu", "--out", str(tmp_path))
    assert res.exit_code == 0 and "needs >= any" not in res.stdout
    assert "no rule asks for a newer vLLM" in res.stdout


# --- next steps ----------------------------------------------------------------------------------------------------


def test_inspect_of_a_bf16_model_names_the_recipes_for_its_kind(tiny: Path) -> None:
    from quantkit.recipes import list_recipes

    for model, kind in (("target", "dense-target"), ("moe-target", "moe-target"), ("eagle3-draft", "eagle3-draft")):
        res = run("inspect", str(tiny / model))
        assert res.exit_code == 0, res.output
        fits = [r.name for r in list_recipes() if r.applies_to == kind]
        assert fits and all(name in res.stderr for name in fits), res.stderr
        argv = shlex.split(res.stderr.strip().splitlines()[-1])
        assert argv[:4] == ["quantkit", "apply", "--recipe", fits[0]] and argv[argv.index("--model") + 1] == str(
            tiny / model
        )
        assert "quantkit apply" not in res.stdout


def test_gate_ships_its_example_config_and_help_points_to_it(tmp_path: Path) -> None:
    from quantkit.gate.config import load_gate_config

    res = run("gate", "--example-config")
    assert res.exit_code == 0 and res.stderr == "", res.output
    config = tmp_path / "gate.yaml"
    config.write_text(res.stdout)
    # the comment's apply commands make the candidates; here empty folders stand in for them (paths are checked)
    commands = [
        shlex.split(line.lstrip("# ").strip())
        for line in res.stdout.splitlines()
        if line.lstrip("# ").startswith("quantkit apply")
    ]
    assert len(commands) == 2
    for argv in commands:
        (tmp_path / argv[argv.index("--output") + 1]).mkdir(parents=True)
        assert Path(argv[argv.index("--model") + 1]).is_dir()  # the bundled models, wherever quantkit is installed
    cfg, _ = load_gate_config(config)
    assert [c.name for c in cfg.candidates] == ["pair", "moe-mxfp4"]
    help_text = run("gate", "--help").stdout
    assert "--example-config" in help_text and "examples/gate-tiny.yaml" not in help_text


# --- the demo's last word ------------------------------------------------------------------------------------------


def _gate_report(passed: bool) -> object:
    from quantkit.results.gate import GateReport

    def chk(cand: str, name: str, value: float, op: str, thr: float) -> dict:
        ok = value >= thr if op == ">=" else value <= thr
        return {
            "candidate": cand,
            "step": name.split(".")[0],
            "name": name,
            "value": value,
            "op": op,
            "threshold": thr,
            "passed": ok,
        }

    ratio = 0.988 if passed else 0.61
    checks = [
        chk("draft-fp8", "acceptance.ratio", ratio, ">=", 0.95),
        chk("draft-fp8", "check.precision_mismatches", 0.0, "<=", 0.0),
        chk("moe-mxfp4", "check.precision_mismatches", 0.0, "<=", 0.0),
        chk("moe-mxfp4", "eval.tiny_french_mc.acc.recovery", 1.0, ">=", 0.95),
        chk("moe-mxfp4", "eval.tiny_french_gen.exact_match.recovery", 0.976, ">=", 0.95),
    ]
    loaded = {"errors": 0, "warnings": 0, "vllm_load": {"status": "loaded"}}
    return GateReport.model_validate(
        {
            "gate": {"name": "demo", "passed": passed, "verdict": "pass" if passed else "regression", "checks": checks},
            "candidates": {
                "draft-fp8": {
                    "check": loaded,
                    "acceptance": {"ratio": ratio, "ratio_ci": [0.954, 1.02]},
                    "serve": {
                        "in_process_al": 3.6455,
                        "batches": [
                            {"batch_size": 1, "mean_acceptance_length": 3.6455},
                            {"batch_size": 8, "mean_acceptance_length": 3.6455},
                        ],
                    },
                },
                "moe-mxfp4": {"check": loaded},
            },
        }
    )


def test_the_demo_ends_with_what_was_proven_against_which_thresholds() -> None:
    from quantkit.demo import conclusion

    outputs = {"model_card": "W/publish-preview/README.md", "gate_report": "W/gate-report"}
    text = conclusion(_gate_report(True), outputs)  # type: ignore[arg-type]
    assert text.startswith(
        "The FP8 draft on the MXFP4 target keeps 98.8% of the BF16 pair's acceptance length (the gate needs 95%"
    )
    assert "vLLM loaded both checkpoints at the intended precision" in text
    assert "`vllm serve` at batch 1 and 8 gave the in-process AL (3.646)" in text
    assert "at least 97.6% of the BF16 target on every task (the gate needs 95%)" in text
    assert text.endswith(
        "Next: see the model card W/publish-preview/README.md and the gate report W/gate-report/report.md."
    )
    assert 2 <= text.count(". ") + 1 <= 4  # two or three sentences and where to look
    failed = conclusion(_gate_report(False), outputs)  # type: ignore[arg-type]
    assert failed.startswith("Not proven: the gate's verdict is regression (draft-fp8: acceptance: acceptance.ratio")


def test_third_party_output_goes_to_one_log_and_quantkit_lines_to_the_terminal(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    import sys

    from quantkit.cli.options import third_party_output
    from quantkit.progress import stderr_progress

    log = tmp_path / "third-party.log"
    with third_party_output(log) as terminal:
        os.write(2, b"WARNING from C++ or a child process\n")
        print("a Python warning on sys.stderr", file=sys.stderr, flush=True)
        stderr_progress("demo", stream=terminal)("our progress line")
    os.write(2, b"after the block\n")
    err = capfd.readouterr().err
    assert "[quantkit demo] our progress line" in err and "after the block" in err
    assert "WARNING" not in err and "a Python warning" not in err
    assert log.read_text() == "WARNING from C++ or a child process\na Python warning on sys.stderr\n"
