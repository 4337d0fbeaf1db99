"""`quantkit apply` on the native shard executor, through the real CLI: interrupted and resumed runs, a damaged
shard found midway, a kill after the rename, Mixtral's layout on the default path, and the dry run."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.fixtures import checkpoints as ck

ROOT = Path(__file__).resolve().parents[2]
PARTIAL_JOURNAL = ".quantkit-journal.json"


def _cli(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "quantkit", *args],
        cwd=kw.pop("cwd", ROOT),
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        **kw,
    )


def _weights_and_config(folder: Path) -> dict[str, bytes]:
    """Everything but quantkit.json (which records timings and the command line)."""
    return {k: v for k, v in ck.tree_bytes(folder).items() if k != "quantkit.json"}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_interrupted_apply_resumes_to_the_same_bytes(big_moe, big_moe_mxfp4, tmp_path, sig):
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "quantkit",
            "apply",
            "--recipe",
            "mxfp4-moe",
            "--model",
            str(big_moe),
            "--output",
            str(out),
            "--devices",
            "cpu",
        ],
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        # SIGINT as a terminal delivers it, even when the suite was started in the background with SIGINT ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    lines: list[str] = []
    sent = threading.Event()

    def read() -> None:
        for line in proc.stderr:
            lines.append(line)
            if not sent.is_set() and re.search(r"shard \d+/\d+ ", line):
                proc.send_signal(sig)  # as soon as the first shard is done: the rest are still to come
                sent.set()

    reader = threading.Thread(target=read)
    reader.start()
    proc.wait(timeout=600)
    reader.join()
    stderr = "".join(lines)
    assert sent.is_set(), stderr
    assert proc.returncode == 128 + sig, stderr
    errors = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "resume with: quantkit apply" in errors[0] and "--resume" in errors[0], stderr
    assert "Traceback" not in stderr
    assert not out.exists()  # no complete-looking output
    partial = out.with_name(f".{out.name}.quantkit-partial")
    journal = json.loads((partial / PARTIAL_JOURNAL).read_text())
    total = len(list(big_moe.glob("*.safetensors")))
    assert 1 <= len(journal["shards"]) < total

    # Without --resume the partial run is neither lost nor silently overwritten.
    again = _cli("apply", "--recipe", "mxfp4-moe", "--model", str(big_moe), "--output", str(out), "--devices", "cpu")
    assert again.returncode == 2 and "--resume" in again.stderr and partial.exists()

    command = errors[0].split("resume with: ", 1)[1]
    resumed = subprocess.run(
        command.replace("quantkit ", f"{sys.executable} -m quantkit ", 1),
        shell=True,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "kept from the interrupted run" in resumed.stderr
    assert not partial.exists()
    assert _weights_and_config(out) == _weights_and_config(big_moe_mxfp4)
    manifest = json.loads((out / "quantkit.json").read_text())
    assert manifest["resumed_shards"] == len(journal["shards"])


def test_a_damaged_shard_midway_is_one_line_and_stays_resumable(big_moe, tmp_path):
    """NaN in the last shard's expert weight: the headers are fine, so only the data read finds it."""
    from safetensors.torch import load_file, save_file

    src = tmp_path / "src"
    subprocess.run(["cp", "-r", str(big_moe), str(src)], check=True)
    last = sorted(src.glob("*.safetensors"))[-1]
    tensors = load_file(str(last))
    name = next(n for n in tensors if ".experts." in n and n.endswith(".weight"))
    tensors[name][2, 5] = float("nan")
    save_file(tensors, str(last), metadata={"format": "pt"})
    before = ck.tree_bytes(src)
    out = tmp_path / "out"
    r = _cli("apply", "--recipe", "mxfp4-moe", "--model", str(src), "--output", str(out), "--devices", "cpu")
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.returncode == 2 and len(errors) == 1, r.stderr
    assert f"{name}[2, 5] is nan" in errors[0] and last.name in errors[0] and "resume with" in errors[0]
    assert not out.exists()
    assert (out.with_name(f".{out.name}.quantkit-partial") / PARTIAL_JOURNAL).is_file()
    assert ck.tree_bytes(src) == before


def test_killed_right_after_the_rename_leaves_a_complete_valid_folder(tmp_path, tiny):
    out = tmp_path / "out"
    script = f"""
import os, signal
from quantkit.apply import apply
def progress(message):
    if message.startswith("wrote "):  # printed after the rename, before apply returns
        os.kill(os.getpid(), signal.SIGKILL)
apply("mxfp4-moe", {str(tiny / "moe-target")!r}, {str(out)!r}, devices="cpu", progress=progress)
"""
    r = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == -9, r.stderr
    assert not out.with_name(f".{out.name}.quantkit-partial").exists()
    manifest = json.loads((out / "quantkit.json").read_text())
    assert sorted(p.name for p in out.iterdir()) == manifest["output_files"]
    check = _cli("check", str(out), "--vllm", "off", "--json")
    assert check.returncode == 0 and json.loads(check.stdout)["ok"], check.stdout[-2000:]


def test_mixtral_layout_on_the_default_path(tmp_path):
    """Mixtral's block_sparse_moe.experts.N.w1/w2/w3 (as real releases ship): transformers renames them in memory,
    which broke the old in-memory default; per shard (the default now) keeps the checkpoint's names."""
    src = ck.make("mixtral", tmp_path / "mixtral")
    out = tmp_path / "out"
    r = _cli("apply", "--recipe", "mxfp4-moe", "--model", str(src), "--output", str(out), "--json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["path"] == "per-shard" and result["engine"] == "native"
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    assert "model.layers.0.block_sparse_moe.experts.0.w1.weight_scale" in index
    check = _cli("check", str(out), "--vllm", "off", "--json")
    assert check.returncode == 0 and json.loads(check.stdout)["ok"], check.stdout[-2000:]


def test_dry_run_reads_no_tensor_data_and_writes_nothing(tmp_path, tiny):
    out = tmp_path / "out"
    r = _cli(
        "apply",
        "--recipe",
        "mxfp4-moe",
        "--model",
        str(tiny / "moe-target"),
        "--output",
        str(out),
        "--dry-run",
        "--devices",
        "cpu",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["dry_run"] is True and not out.exists()
    assert not list(tmp_path.glob(".out.quantkit*"))
    assert plan["exclude"][-1] == "lm_head" and plan["summary"]["quantized_layers"] == 2
    shards = sorted(p.name for p in (tiny / "moe-target").glob("*.safetensors"))
    assert sorted(s for v in plan["device_plan"].values() for s in v) == shards


def test_dry_run_predicts_the_written_size(tmp_path, tiny, big_moe_mxfp4):
    manifest = json.loads((big_moe_mxfp4 / "quantkit.json").read_text())
    plan = _cli(
        "apply",
        "--recipe",
        "mxfp4-moe",
        "--model",
        manifest["source"],
        "--output",
        str(tmp_path / "o"),
        "--dry-run",
        "--json",
    )
    predicted = json.loads(plan.stdout)["size_after_bytes"]
    written = sum(p.stat().st_size for p in big_moe_mxfp4.glob("*.safetensors"))
    # The prediction counts tensor bytes; the files add their JSON headers (a few KB per shard).
    assert predicted <= written <= predicted + 64_000 * len(list(big_moe_mxfp4.glob("*.safetensors")))
