# tier: e2e
"""Issue 35, outputs: every result file is written atomically and never through a link (item 4); no command writes
into a model folder it reads (item 2); a pickle-only folder is refused by every command in one line (item 3);
one parameter type per kind of value (item 10); config counts checked against the checkpoint (item 5);
remote-code refusals that name a flag the command takes (item 11); Markdown escaping; unknown vLLM versions.

The CLI cases run the real CLI in a subprocess and assert test_bad_inputs.py's contract: exit status 2, exactly one
`error:` line, no traceback, nothing complete-looking left, every source byte for byte unchanged.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from tests.conftest import TINY
from tests.fixtures.hostile import copy_model, error_lines, run_cli, tree_digest

TARGET = TINY / "target"


def _one_error(run, *mentions: str) -> str:  # type: ignore[no-untyped-def]
    where = f"\nexit {run.returncode}\nstderr: {run.stderr[-3000:]!r}\nstdout: {run.stdout[-500:]!r}"
    assert "Traceback" not in run.stderr, where
    assert run.returncode == 2, where
    lines = error_lines(run.stderr)
    assert len(lines) == 1, where
    for m in mentions:
        assert m in lines[0], f"{m!r} not in the error line" + where
    return lines[0]


# --- item 4: atomic writes, never through a link --------------------------------------------------------------------


def test_write_file_atomic_replaces_a_planted_link(tmp_path: Path) -> None:
    from quantkit.io.files import write_file_atomic

    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.json").symlink_to(outside)
    (out / "dangling.json").symlink_to(tmp_path / "nowhere" / "x.json")
    write_file_atomic(out / "report.json", "{}\n")
    write_file_atomic(out / "dangling.json", b"{}\n")
    assert outside.read_text() == "secret"
    assert not (tmp_path / "nowhere").exists()
    for name in ("report.json", "dangling.json"):
        assert not (out / name).is_symlink() and (out / name).read_text() == "{}\n"
    assert sorted(p.name for p in out.iterdir()) == ["dangling.json", "report.json"]  # no temporary file left
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE((out / "report.json").stat().st_mode) == 0o666 & ~mask


def test_write_file_atomic_keeps_the_previous_file_on_failure(tmp_path: Path) -> None:
    from quantkit.errors import QuantkitError
    from quantkit.io.files import write_file_atomic

    target = tmp_path / "report.md"
    target.write_text("previous")

    with pytest.raises(TypeError):
        write_file_atomic(target, 12345)  # type: ignore[arg-type]  # fails after the temp file exists
    assert target.read_text() == "previous"
    assert [p.name for p in tmp_path.iterdir()] == ["report.md"]
    (tmp_path / "folder.json").mkdir()
    with pytest.raises(QuantkitError, match="is a folder"):
        write_file_atomic(tmp_path / "folder.json", "x")


def test_jsonout_write_and_manifest_write_never_follow_a_link(tmp_path: Path) -> None:
    from quantkit.io import jsonout

    outside = tmp_path / "outside.json"
    outside.write_text("keep")
    (tmp_path / "a.json").symlink_to(outside)
    jsonout.write(tmp_path / "a.json", {"x": float("nan")})
    assert outside.read_text() == "keep"
    assert json.loads((tmp_path / "a.json").read_text()) == {"x": None}


@pytest.mark.parametrize("overwrite", [True, False])
def test_deploy_never_writes_through_a_planted_link(tmp_path: Path, overwrite: bool) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    out = tmp_path / "out"
    out.mkdir()
    (out / "deploy.json").symlink_to(outside)
    run = run_cli(
        ["deploy", str(TARGET), "--platform", "cpu", "--out", str(out), *(["--overwrite"] if overwrite else [])],
        cwd=tmp_path,
    )
    assert outside.read_text() == "secret"
    if overwrite:
        assert run.returncode == 0, run.stderr
        assert not (out / "deploy.json").is_symlink()
        assert json.loads((out / "deploy.json").read_text())["ok"] is True
    else:
        _one_error(run, "deploy.json exists", "--overwrite")
        assert (out / "deploy.json").is_symlink()


# --- item 10: one parameter type per kind of value -----------------------------------------------------------------

BIG = "9" * 5000  # past Python's int-digit limit (4300): packaging and int() raise ValueError on it
HUGE = "9" * 400  # float() gives inf


def _model_copy(tmp_path: Path, name: str = "target") -> Path:
    return copy_model(TINY / name, tmp_path / f"src-{name}")


def _args(case: str, src: Path, out: Path) -> tuple[list[str], dict[str, str], tuple[str, ...], bool]:
    """(argv, env, mentions, usage error?) of one out-of-range value."""
    apply = ["apply", "--recipe", "mxfp4-moe", "--model", str(src), "--output", str(out)]
    acceptance = ["acceptance", "--target", str(src), "--draft", str(src), "--out", str(out / "a.json")]
    return {
        "rules-version-5000-digits": (
            ["rules", "--vllm-version", BIG],
            {},
            ("--vllm-version", "5000 characters"),
            False,
        ),
        "deploy-version-5000-digits": (
            ["deploy", str(src), "--out", str(out), "--vllm-version", BIG],
            {},
            ("--vllm-version",),
            False,
        ),
        "check-version-5000-digits": (["check", str(src), "--vllm-version", BIG], {}, ("--vllm-version",), False),
        "inspect-version-not-pep440": (
            ["inspect", str(src), "--vllm-version", "0.32.0-cpu!!"],
            {},
            ("--vllm-version",),
            False,
        ),
        "apply-max-memory-400-digits": ([*apply, "--max-memory", HUGE], {}, ("--max-memory", "400 characters"), False),
        "apply-max-memory-env-400-digits": (apply, {"QUANTKIT_MAX_MEMORY": HUGE}, ("QUANTKIT_MAX_MEMORY",), False),
        "apply-max-memory-beyond-1-eib": ([*apply, "--max-memory", "2000000T"], {}, ("--max-memory", "1 EiB"), False),
        "apply-max-memory-negative": ([*apply, "--max-memory", "-1G"], {}, ("--max-memory",), False),
        "apply-max-shard-size-5000-digits": ([*apply, "--max-shard-size", BIG], {}, ("--max-shard-size",), False),
        "apply-max-shard-size-beyond-1-eib": (
            [*apply, "--max-shard-size", "9999999999999999999GB"],
            {},
            ("--max-shard-size", "1 EiB"),
            False,
        ),
        "acceptance-temperature-nan": ([*acceptance, "--temperature", "nan"], {}, ("--temperature", "finite"), True),
        "acceptance-temperature-inf": ([*acceptance, "--temperature", "inf"], {}, ("--temperature", "finite"), True),
        "acceptance-temperature-1e400": ([*acceptance, "--temperature", "1e400"], {}, ("--temperature",), True),
        "acceptance-top-p-nan": ([*acceptance, "--top-p", "NaN"], {}, ("--top-p",), True),
        "acceptance-top-k-5000-digits": ([*acceptance, "--top-k", BIG], {}, ("--top-k", "5000 characters"), True),
        "acceptance-top-k-beyond": ([*acceptance, "--top-k", "10000000000"], {}, ("--top-k",), True),
        "check-load-timeout-nan": (["check", str(src), "--load-timeout", "nan"], {}, ("--load-timeout",), True),
        "check-tp-5000-digits": (["check", str(src), "--tp", BIG], {}, ("--tp",), True),
        "inspect-tp-beyond": (["inspect", str(src), "--tp", "100000000000"], {}, ("--tp",), True),
        "deploy-tp-5000-digits": (["deploy", str(src), "--out", str(out), "--tp", BIG], {}, ("--tp",), True),
        "eval-limit-5000-digits": (
            ["eval", "--model", str(src), "--tasks", "x", "--limit", BIG],
            {},
            ("--limit",),
            True,
        ),
        "eval-batch-size-beyond": (
            ["eval", "--model", str(src), "--tasks", "x", "--batch-size", "10000000000"],
            {},
            ("--batch-size",),
            True,
        ),
    }[case]


CASES_10 = [
    "rules-version-5000-digits",
    "deploy-version-5000-digits",
    "check-version-5000-digits",
    "inspect-version-not-pep440",
    "apply-max-memory-400-digits",
    "apply-max-memory-env-400-digits",
    "apply-max-memory-beyond-1-eib",
    "apply-max-memory-negative",
    "apply-max-shard-size-5000-digits",
    "apply-max-shard-size-beyond-1-eib",
    "acceptance-temperature-nan",
    "acceptance-temperature-inf",
    "acceptance-temperature-1e400",
    "acceptance-top-p-nan",
    "acceptance-top-k-5000-digits",
    "acceptance-top-k-beyond",
    "check-load-timeout-nan",
    "check-tp-5000-digits",
    "inspect-tp-beyond",
    "deploy-tp-5000-digits",
    "eval-limit-5000-digits",
    "eval-batch-size-beyond",
]


@pytest.mark.parametrize("case", CASES_10)
def test_out_of_range_values_are_one_line_before_any_work(tmp_path: Path, case: str) -> None:
    src = _model_copy(tmp_path)
    out = tmp_path / "out"
    argv, env, mentions, usage = _args(case, src, out)
    before = tree_digest(src)
    run = run_cli(argv, cwd=tmp_path, env=env, forbid_heavy=True, timeout=120)
    where = f"\nexit {run.returncode}\nstderr: {run.stderr[-2000:]!r}"
    assert "Traceback" not in run.stderr and run.returncode == 2, where
    lines = error_lines(run.stderr, "Error:" if usage else "error:")
    assert len(lines) == 1 and len(lines[0]) < 600, where  # the hostile value is never echoed whole
    for m in mentions:
        assert m in lines[0], f"{m!r} not in the error line" + where
    assert run.stdout == "", where
    assert not out.exists(), where
    assert tree_digest(src) == before


def _config_case(tmp_path: Path, edit: dict[str, object], raw: str | None = None) -> Path:
    src = _model_copy(tmp_path)
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(edit)
    cfg = {k: v for k, v in cfg.items() if v is not None}  # None: the key removed
    text = json.dumps(cfg)
    if raw is not None:  # a number json.dumps cannot write as such
        text = text.replace('"RAW"', raw)
    (src / "config.json").write_text(text)
    return src


@pytest.mark.parametrize(
    ("label", "edit", "raw", "mentions"),
    [
        ("positions-1e300", {"max_position_embeddings": "RAW"}, "1e300", ("max_position_embeddings", "config.json")),
        ("positions-2-pow-40", {"max_position_embeddings": 2**40}, None, ("max_position_embeddings",)),
        # the smallest length key wins (as in vLLM): seq_length alone
        ("seq-length-1e30", {"seq_length": "RAW", "max_position_embeddings": None}, "1e30", ("seq_length",)),
        (
            "yarn-factor-1e308",
            {"rope_scaling": {"rope_type": "yarn", "factor": 1e308, "original_max_position_embeddings": 4096}},
            None,
            ("rope_scaling.factor", "config.json"),
        ),
        (
            "linear-factor-1e300",
            {"rope_scaling": {"rope_type": "linear", "factor": 1e300}},
            None,
            ("rope_scaling.factor",),
        ),
        (
            "linear-factor-product",
            {"rope_scaling": {"rope_type": "linear", "factor": 900000.0}, "max_position_embeddings": 1_000_000},
            None,
            ("x rope factor",),
        ),
        (
            "rope-parameters-factor-negative",
            {"rope_parameters": {"rope_type": "linear", "factor": -2.0}},
            None,
            ("rope_parameters.factor",),
        ),
    ],
)
def test_deploy_refuses_absurd_positions_in_one_line(
    tmp_path: Path, label: str, edit: dict[str, object], raw: str | None, mentions: tuple[str, ...]
) -> None:
    src = _config_case(tmp_path, edit, raw)
    before = tree_digest(src)
    out = tmp_path / "out"
    run = run_cli(
        ["deploy", str(src), "--platform", "cpu", "--out", str(out)], cwd=tmp_path, forbid_heavy=True, timeout=120
    )
    line = _one_error(run, *mentions)
    assert str(src) in line  # names the file
    assert not out.exists()
    assert tree_digest(src) == before


def test_a_real_long_context_config_is_never_blamed(tmp_path: Path) -> None:
    """Llama-4 Scout: 10,485,760 positions; a linear factor of 8 over 131,072: both are what published configs say."""
    for edit in (
        {"max_position_embeddings": 10_485_760},
        {"max_position_embeddings": 131_072, "rope_scaling": {"rope_type": "linear", "factor": 8.0}},
    ):
        src = _config_case(tmp_path / str(len(str(edit))), edit)
        run = run_cli(
            ["deploy", str(src), "--platform", "cpu", "--out", str(tmp_path / "o" / src.parent.name), "--json"],
            cwd=tmp_path,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr
        argv = json.loads(run.stdout)["argv"]
        length = int(argv[argv.index("--max-model-len") + 1])
        assert length == (10_485_760 if "rope_scaling" not in edit else 131_072 * 8)


def test_rules_says_no_rule_knows_an_unknown_version(tmp_path: Path) -> None:
    run = run_cli(["rules", "--vllm-version", "99999"], cwd=tmp_path, forbid_heavy=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "no rule knows vLLM 99999" in run.stdout and "newer than every version" in run.stdout
    run = run_cli(["rules", "--vllm-version", "99999", "--json"], cwd=tmp_path, timeout=120)
    assert "no rule knows vLLM 99999" in json.loads(run.stdout)["version_note"]
    for known in ("0.32.0", "0.32", "0.25.1"):  # 0.32 is 0.32.0 (PEP 440)
        run = run_cli(["rules", "--vllm-version", known, "--json"], cwd=tmp_path, timeout=120)
        assert json.loads(run.stdout)["version_note"] is None, known
    run = run_cli(["rules", "--vllm-version", "0.22.0", "--json"], cwd=tmp_path, timeout=120)
    assert "between the versions" in json.loads(run.stdout)["version_note"]
    assert "0.20.0's rules" in json.loads(run.stdout)["version_note"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [("8GiB", 8 * 2**30), ("500MiB", 500 * 2**20), ("1.5G", 3 * 2**29), ("4096", 4096), ("1T", 2**40)],
)
def test_sizes_within_range_read_as_before(text: str, expected: int) -> None:
    from quantkit.io.sizes import parse_size

    assert parse_size(text, "--max-memory") == expected


# --- item 11: remote-code refusals name a flag the command takes, or the step that does ------------------------------


def test_every_commands_refusal_names_only_a_flag_it_takes() -> None:
    from quantkit.cli import main
    from quantkit.io.hf import hint_for_command

    for name, command in main.commands.items():
        takes = any(p.name == "trust_remote_code" for p in command.params)
        hint = hint_for_command(name, takes)
        if takes:
            assert hint.startswith("pass --trust-remote-code"), name
        else:
            assert f"`quantkit {name}` takes no --trust-remote-code" in hint, name
            assert "pass --trust-remote-code" not in hint, name
    assert {n for n, c in main.commands.items() if any(p.name == "trust_remote_code" for p in c.params)} >= {
        "apply",
        "check",
        "acceptance",
        "eval",
    }


def _remote_code_folder(tmp_path: Path) -> tuple[Path, Path]:
    from tests.fixtures.hostile import add_remote_code

    src = _model_copy(tmp_path)
    marker = tmp_path / "hostile-code-ran"
    add_remote_code(src, marker)
    return src, marker


def test_check_vllm_required_refuses_remote_code_in_one_line(tmp_path: Path) -> None:
    """Before: a `vllm-load-failed` finding in the table, after the static checks. Now: one line naming the files and
    the flag, exit 2, before any vLLM process starts."""
    src, marker = _remote_code_folder(tmp_path)
    before = tree_digest(src)
    run = run_cli(["check", str(src), "--vllm", "required", "--platform", "cpu"], cwd=tmp_path, timeout=300)
    line = _one_error(run, "tokenization_evil.py", "modeling_evil.py", "pass --trust-remote-code")
    assert "vllm-load" not in run.stdout + run.stderr and run.stdout == "", line
    assert not marker.exists()
    assert tree_digest(src) == before


def test_bench_refusal_names_the_flag_bench_takes(tmp_path: Path) -> None:
    """bench takes --trust-remote-code since this round (it passes it on to vllm serve), so its refusal names it."""
    src, marker = _remote_code_folder(tmp_path)
    before = tree_digest(src)
    run = run_cli(["bench", "--target", str(src), "--out", str(tmp_path / "bench-out")], cwd=tmp_path, timeout=300)
    line = _one_error(run, "tokenization_evil.py", "pass --trust-remote-code")
    assert "takes no --trust-remote-code" not in line
    assert not marker.exists()
    assert tree_digest(src) == before


# --- Markdown and HTML injection; NaN in the card --------------------------------------------------------------------

HOSTILE = "<img src=x onerror=alert(1)>\x1b[2J\x00 a|b\nnew row [link](javascript:x) **bold** `tick`"


def test_md_text_and_md_code_escape_every_class() -> None:
    from quantkit.io.markdown import Markup, md_code, md_text

    text = md_text(HOSTILE)
    assert "<" not in text and ">" not in text and "&lt;img" in text
    assert "\x1b" not in text and "\x00" not in text and "\\x1b" in text and "\\x00" in text
    assert "\n" not in text and "a\\|b" in text and "\\[link\\]" in text and "\\*\\*bold" in text
    code = md_code(HOSTILE)
    assert code.startswith("`") and code.endswith("`") and code.count("`") == 2
    assert "\n" not in code and "\x1b" not in code and "\x00" not in code and "a\\|b" in code
    assert md_text("x" * 5000).endswith("(4400 more characters)")
    assert md_text(Markup("**all**")) == "**all**"
    assert md_text("plain-name_1.5") == "plain-name_1.5"  # inside a word `_` makes no emphasis (CommonMark)
    assert md_text("_x_") == "\\_x\\_"


def _moe_card(tmp_path: Path, report: dict[str, object] | None = None) -> str:
    return str(_moe_card_object(tmp_path, report).text)


def _moe_card_object(tmp_path: Path, report: dict[str, object] | None = None):  # type: ignore[no-untyped-def]
    from quantkit.publish.card import build_model_card

    out = tmp_path / "moe-mxfp4"
    out.mkdir()
    (out / "config.json").write_text(
        json.dumps({"architectures": ["Qwen3MoeForCausalLM"], "quantization_config": {"quant_method": "quark"}})
    )
    manifest = {
        "model_kind": "moe-target",
        "architecture": "Qwen3MoeForCausalLM",
        "source": "Qwen/Qwen3-30B-A3B",
        "recipe": {"name": "mxfp4-moe", "scheme": "mxfp4", "description": HOSTILE},
        "exclude": ["lm_head", HOSTILE],
        "layers": [
            {
                "runtime_name": "model.layers.0.mlp.experts",
                "role": "experts",
                "action": "quantize",
                "scheme": "mxfp4",
                "reason": HOSTILE,
                "checkpoint_modules": [],
            },
            {
                "runtime_name": "lm_head",
                "role": "lm_head",
                "action": "keep",
                "scheme": None,
                "reason": "output head stays BF16",
                "checkpoint_modules": ["lm_head"],
            },
        ],
    }
    (out / "quantkit.json").write_text(json.dumps(manifest))
    return build_model_card(out, repo_id="amd-test/moe-mxfp4", report=report)


def _assert_no_injection(text: str) -> None:
    """No raw HTML, link or emphasis outside code spans (inside one, Markdown renders nothing), and no control
    character anywhere."""
    import re

    assert "\x1b" not in text and "\x00" not in text
    prose = re.sub(r"`[^`\n]*`", "", text)
    assert "<img" not in prose and "[link](javascript" not in prose and "**bold**" not in prose


def test_model_card_escapes_everything_from_input(tmp_path: Path) -> None:
    text = _moe_card(tmp_path)
    _assert_no_injection(text)
    row = next(line for line in text.splitlines() if "model.layers.0.mlp.experts" in line)
    assert row.replace("\\|", "").count("|") == 6  # five columns: the pipe and the newline stayed inside their cell


def test_card_says_not_measured_for_nan_figures(tmp_path: Path) -> None:
    nan, inf = float("nan"), float("inf")
    report = {
        "schema_version": 1,
        "model": "moe-mxfp4",
        "acceptance": {
            "backend": "vllm",
            "num_speculative_tokens": 3,
            "prompts": "builtin",
            "num_prompts": 2,
            "candidate_kind": "draft",
            "baseline": {"mean_acceptance_length": nan, "per_domain": {HOSTILE: nan}},
            "candidate": {"mean_acceptance_length": 2.5, "per_domain": {HOSTILE: 2.5}},
            "ratio": nan,
            "ratio_ci": [-inf, inf],
            "per_domain_ratio": {HOSTILE: nan},
        },
        "eval": {
            "tasks": [
                {"task": HOSTILE, "metric": "acc", "baseline": nan, "candidate": 0.5, "delta": nan, "recovery": inf}
            ]
        },
    }
    card = _moe_card_object(tmp_path, report)
    text = str(card.text)
    _assert_no_injection(text)
    # model-index (the card's YAML metadata) gets no entry for a figure that is NaN or infinite
    assert ".nan" not in str(card.content) and ".inf" not in str(card.content)
    values = [r.metric_value for r in card.data.eval_results or []]
    assert all(isinstance(v, (int, float)) and v == v and abs(v) != float("inf") for v in values), values
    assert "-inf" not in text and " inf]" not in text and "[nan" not in text
    assert "AL ratio and its 95% CI: not measured (the gate report holds NaN or an infinity" in text
    assert "| not measured |" in text


def test_gate_report_md_escapes_names_domains_reasons_and_messages(tmp_path: Path) -> None:
    from quantkit.gate.reports import render_markdown, write_reports
    from quantkit.results import CandidateReport
    from quantkit.results.gate import GateCheck, GateResult

    report = CandidateReport.model_validate(
        {
            "acceptance": {
                "backend": "vllm",
                "num_speculative_tokens": 3,
                "prompts": "builtin",
                "num_prompts": 2,
                "candidate_kind": "draft",
                "baseline": {"mean_acceptance_length": 2.0, "per_domain": {HOSTILE: 2.0}},
                "candidate": {"mean_acceptance_length": 2.0, "per_domain": {HOSTILE: 2.0}},
                "ratio": 1.0,
                "ratio_ci": [0.9, 1.1],
                "per_domain_ratio": {HOSTILE: 1.0},
            },
            "eval": {"tasks": [{"task": HOSTILE, "metric": HOSTILE, "baseline": 0.5, "candidate": 0.5}]},
        }
    )
    result = GateResult(
        name=HOSTILE,
        config="g.yaml",
        passed=False,
        verdict="regression",
        reasons=[f"regression: {HOSTILE}"],
        checks=[
            GateCheck(
                candidate="c",
                step="acceptance",
                name=HOSTILE,
                value=0.5,
                threshold=0.9,
                op=">=",
                passed=False,
                message=HOSTILE,
            )
        ],
        candidates={"c": report},
        seconds=1.0,
    )
    md = render_markdown(result)
    _assert_no_injection(md)
    table = [line for line in md.splitlines() if line.startswith("| ") and "acceptance" in line]
    assert table and all(line.replace("\\|", "").count("|") == 7 for line in table), table  # six columns
    out = tmp_path / "r"
    out.mkdir()
    (out / "report.md").symlink_to(tmp_path / "outside.md")
    (tmp_path / "outside.md").write_text("keep")
    write_reports(result, out)
    assert (tmp_path / "outside.md").read_text() == "keep" and not (out / "report.md").is_symlink()
    _assert_no_injection((out / "report.md").read_text())


def test_chart_draws_a_domain_named_like_tex(tmp_path: Path) -> None:
    """A prompt domain `a$\\foo{$b` made matplotlib's mathtext raise ParseFatalException while the gate wrote its
    report (exit 1, `error: unexpected`); names are drawn as the text they are."""
    from quantkit.publish.charts import render_acceptance_chart
    from quantkit.results import AcceptanceResult

    domain = "a$\\foo{$b"
    acc = AcceptanceResult.model_validate(
        {
            "backend": "vllm",
            "num_speculative_tokens": 3,
            "prompts": "builtin",
            "num_prompts": 2,
            "candidate_kind": "draft",
            "baseline": {"mean_acceptance_length": 2.0, "per_domain": {domain: 2.0}},
            "candidate": {"mean_acceptance_length": 2.1, "per_domain": {domain: 2.1}},
            "ratio": 1.05,
            "ratio_ci": [0.9, 1.1],
            "per_domain_ratio": {domain: 1.05},
        }
    )
    out = render_acceptance_chart(acc, None, tmp_path / "c.png")
    assert out is not None and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_deploy_says_no_rule_knows_an_unknown_version(tmp_path: Path) -> None:
    run = run_cli(
        ["deploy", str(TARGET), "--platform", "cpu", "--vllm-version", "99999", "--out", str(tmp_path / "o")],
        cwd=tmp_path,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "note: no rule knows vLLM 99999" in run.stdout and "0.32.0's rules" in run.stdout
    run = run_cli(
        ["deploy", str(TARGET), "--platform", "cpu", "--vllm-version", "0.32.0", "--out", str(tmp_path / "o2")],
        cwd=tmp_path,
        timeout=120,
    )
    assert run.returncode == 0 and "no rule knows" not in run.stdout


def test_refuse_remote_code_blames_only_code_that_would_run(tmp_path: Path) -> None:
    """A config.json auto_map over a model_type transformers knows (DeepSeek-V3's releases ship one) loads with the
    local class, as vLLM loads it: not refused. A tokenizer only its own code can build is refused, naming the
    files; with the flag nothing is refused (and nothing runs here: the probe stops at the refusal)."""
    from quantkit.errors import QuantkitError
    from quantkit.io.hf import refuse_remote_code, remote_code_allowed
    from tests.fixtures.hostile import evil_module

    marker = tmp_path / "hostile-code-ran"
    config_only = _model_copy(tmp_path)
    evil_module(config_only, "configuration_evil", marker)
    cfg = json.loads((config_only / "config.json").read_text())
    cfg["auto_map"] = {"AutoConfig": "configuration_evil.EvilConfig"}
    (config_only / "config.json").write_text(json.dumps(cfg))
    refuse_remote_code(config_only)
    src, marker2 = _remote_code_folder(tmp_path / "b")
    with pytest.raises(QuantkitError, match=r"tokenization_evil\.py.*pass --trust-remote-code"):
        refuse_remote_code(src)
    with remote_code_allowed(True):
        refuse_remote_code(src)  # allowed: the probe returns before loading anything
    assert not marker.exists() and not marker2.exists()
