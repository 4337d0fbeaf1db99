"""quantkit.apply.shards (the native shard executor) against Quark 0.13's own `direct_quantize_checkpoint`, file by file and byte for byte, on
small random checkpoints of each family; and the executor's own promises: resume after kill -9, a corrupt shard
midway, non-finite weights refused, memory bounded by a few shards, no Quark import."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from quantkit.apply.shards import (
    JOURNAL_NAME,
    CorruptShardError,
    ExecutorError,
    NonFiniteWeightError,
    ShardEvent,
    quantize_checkpoint,
)
from quantkit.errors import QuantkitError
from quantkit.io.headers import checkpoint_tensors
from quantkit.io.safetensors import serialize_safetensors
from tests.fixtures import checkpoints as ck
from tests.fixtures import memory

ROOT = Path(__file__).resolve().parents[2]


def _assert_same_tree(quark_out: Path, ours: Path) -> None:
    a, b = ck.tree_bytes(quark_out), ck.tree_bytes(ours)
    assert sorted(a) == sorted(b), set(a) ^ set(b)
    differ = [name for name in a if a[name] != b[name]]
    assert not differ, f"files differ from Quark's: {differ}"


CASES = [
    ("qwen3_moe", "mxfp4", None),
    ("deepseek_v3", "mxfp4", None),
    ("deepseek_v3", "mxfp4", {"*self_attn*": "ptpc_fp8"}),  # mxfp4-moe-attn-fp8
    ("minimax_m2", "mxfp4", None),
    ("mixtral", "mxfp4", None),
    ("mixtral", "ptpc_fp8", None),
    ("eagle3_llama", "ptpc_fp8", None),  # fp8-draft: fc and lm_head kept
]


@pytest.mark.parametrize(
    "family,scheme,layer_config", CASES, ids=[f"{f}-{s}{'-attnfp8' if lc else ''}" for f, s, lc in CASES]
)
def test_byte_identical_to_quark(quark_f2f, tmp_path, family, scheme, layer_config):
    fam = ck.spec(family, via="tensors")
    src = fam.save(tmp_path / "src")
    exclude = ck.exclude_modules(fam)
    if layer_config:
        exclude = [m for m in exclude if "self_attn" not in m]
    quark_out = quark_f2f.checkpoint(src, tmp_path / "quark", fam.template, scheme, exclude, layer_config)
    events: list[ShardEvent] = []
    report = quantize_checkpoint(
        src,
        tmp_path / "ours",
        scheme=scheme,
        exclude=exclude,
        layer_config=layer_config,
        devices=["cpu"],
        progress=events.append,
    )
    _assert_same_tree(quark_out, tmp_path / "ours")
    shards = sorted(p.name for p in src.glob("*.safetensors"))
    assert sorted(r.name for r in report.shards) == shards
    assert sum(e.kind == "done" for e in events) == len(shards) == sum(e.kind == "start" for e in events)
    for r in report.shards:
        assert r.sha256_in == hashlib.sha256((src / r.name).read_bytes()).hexdigest()
        assert r.sha256_out == hashlib.sha256((tmp_path / "ours" / r.name).read_bytes()).hexdigest()
        assert r.bytes_out == (tmp_path / "ours" / r.name).stat().st_size and r.device == "cpu"
    assert sum(r.quantized for r in report.shards) > 0
    assert (
        report.exclude == json.loads((tmp_path / "ours" / "config.json").read_text())["quantization_config"]["exclude"]
    )
    assert not (tmp_path / "ours" / JOURNAL_NAME).exists()


def _edge_family() -> ck.Checkpoint:
    """Tensors that exercise each of Quark's pass-through rules: a 3-D `.weight` (quantized), a 1-D F32 linear-named
    weight (cast to the config dtype), an excluded F32 router (kept F32), F32 and F16 weights (quantized from their
    own dtype), a last dim that is not a multiple of 32, int64/bool buffers, a zero-size tensor."""
    g = torch.Generator().manual_seed(5)
    t = {
        "model.embed_tokens.weight": torch.randn(64, 64, generator=g).to(torch.bfloat16),
        "model.layers.0.mlp.experts.fused.weight": torch.randn(4, 64, 64, generator=g).to(torch.bfloat16),
        "model.layers.0.router_scale.weight": torch.randn(64, generator=g),
        "model.layers.0.mlp.gate.weight": torch.randn(8, 64, generator=g),
        "model.layers.0.proj32.weight": torch.randn(32, 64, generator=g) * 1e-3,
        "model.layers.0.proj16.weight": (torch.randn(32, 64, generator=g) * 1e-3).to(torch.float16),
        "model.layers.0.odd.weight": torch.randn(16, 48, generator=g).to(torch.bfloat16),
        "model.layers.0.input_layernorm.weight": torch.ones(64, dtype=torch.bfloat16),
        "model.layers.0.positions": torch.arange(8),
        "model.layers.0.mask": torch.tensor([True, False, True]),
        "model.layers.0.empty": torch.zeros(0, 4, dtype=torch.bfloat16),
        "lm_head.weight": torch.randn(64, 64, generator=g).to(torch.bfloat16),
    }
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16"}
    return ck.Checkpoint("edge", "llama", config, t, ("*.mlp.gate", "lm_head"))


@pytest.mark.parametrize("scheme", ["mxfp4", "ptpc_fp8"])
def test_pass_through_rules_match_quark(quark_f2f, tmp_path, scheme):
    fam = _edge_family()
    src = fam.save(tmp_path / "src", shard_bytes=20_000)
    exclude = ck.exclude_modules(fam)
    quark_out = quark_f2f.checkpoint(src, tmp_path / "quark", "llama", scheme, exclude)
    quantize_checkpoint(src, tmp_path / "ours", scheme=scheme, exclude=exclude, layer_config=None, devices=["cpu"])
    _assert_same_tree(quark_out, tmp_path / "ours")
    # Every tensor stored as the source stores it (same dtype and shape: passed through) has the source's bytes.
    source, ours = checkpoint_tensors(src), checkpoint_tensors(tmp_path / "ours")
    passed = [n for n, t in ours.items() if n in source and (source[n].dtype, source[n].shape) == (t.dtype, t.shape)]
    assert len(passed) >= 3
    for name in passed:
        assert _stored_bytes(tmp_path / "ours", name) == _stored_bytes(src, name), name


def test_patterns_and_several_workers_match_quark(quark_f2f, tmp_path):
    """Exclusions given as Quark patterns (not module names), a per-module override, and two CPU workers finishing
    shards out of order: the index still lists shards in Quark's order."""
    fam = ck.spec("qwen3_moe", layers=3)
    src = fam.save(tmp_path / "src", shard_bytes=60_000)
    exclude = ["*.mlp.gate", "lm_head"]
    layer_config = {"*self_attn.o_proj": "ptpc_fp8", "*experts.1.*": "ptpc_fp8"}
    quark_out = quark_f2f.checkpoint(src, tmp_path / "quark", "qwen3_moe", "mxfp4", exclude, layer_config)
    quantize_checkpoint(
        src, tmp_path / "ours", scheme="mxfp4", exclude=exclude, layer_config=layer_config, devices=["cpu", "cpu"]
    )
    _assert_same_tree(quark_out, tmp_path / "ours")


def test_serializer_matches_safetensors(tmp_path):
    """The streaming writer gives safetensors' own bytes: every dtype, layout order, odd names, empty dicts."""
    from safetensors.torch import save

    dtypes = [
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.uint16,
        torch.int32,
        torch.uint32,
        torch.int64,
        torch.uint64,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.float8_e4m3fn,
        torch.float8_e5m2,
        torch.float8_e8m0fnu,
    ]
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for i, dt in enumerate(dtypes):
        raw = torch.randint(0, 255, (3, 5 + i), generator=g, dtype=torch.uint8)
        tensors[f"t{i:02d}.{dt}"] = (
            raw.view(dt) if dt.itemsize == 1 else raw[:, : (5 + i) // dt.itemsize * dt.itemsize].contiguous().view(dt)
        )
        tensors[f"b{i}"] = tensors[f"t{i:02d}.{dt}"].reshape(-1)[:2].clone()
    tensors["zero"] = torch.zeros(0, 3)
    tensors["scalar"] = torch.tensor(1.5)
    tensors['odd "name"\\é'] = torch.ones(2, dtype=torch.bfloat16)
    for case in (tensors, {}, {"only": torch.ones(1)}):
        n, sha = serialize_safetensors(case, tmp_path / "x.safetensors")
        want = save(case)
        assert (tmp_path / "x.safetensors").read_bytes() == want
        assert n == len(want) and sha == hashlib.sha256(want).hexdigest()


# --- the batched (GPU) path and the read pipeline, on CPU ---------------------------------------------------------------


def _shard_outputs(
    src: Path, scheme: str, exclude: list[str], layer_config, batched: bool, batch_bytes: int = 1 << 40
) -> list[tuple]:
    """Every shard through the per-tensor path (proven equal to Quark above) or the batched one `process_device`
    runs on a GPU, here on CPU, in batches of at most `batch_bytes` read: (tensor names in order, {name: (dtype,
    shape, bytes)}, tensors quantized)."""
    from quantkit.apply.shards import f2f, process, units

    plan = f2f.plan_shards(src, scheme, exclude, layer_config)
    settings = process.Settings(src, src, scheme, exclude, layer_config, plan)
    layouts = units.shard_layouts(
        src, plan, scheme=scheme, exclude=exclude, layer_config=layer_config, drop=frozenset(), decode=None
    )
    files = process.SourceFiles(src, plan.sizes)
    outs = []
    for name in plan.shards:
        layout = layouts[name]
        units.cut_batches(layout, batch_bytes, False)
        tensors: dict = {}
        quantized = 0
        for batch in layout.batches:
            host = torch.empty(batch.read_bytes * 3 + (1 << 20), dtype=torch.uint8)
            loaded = process.read_batch(files, batch, host, layout.data_start, layout.entries)
            out = (
                process.process_device(loaded, settings, "cpu")
                if batched
                else process.process_cpu(loaded, settings, "cpu", None)
            )
            tensors.update(
                {
                    k: (t.dtype, tuple(t.shape), t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
                    for k, t in out.tensors
                }
            )
            quantized += out.quantized
        outs.append((list(tensors), tensors, quantized))
    files.close()
    return outs


def _mixed_family() -> ck.Checkpoint:
    """Same last dims in several shapes, 3-D weights, bf16/f16/f32 weights, a last dim not a multiple of 32, and
    PTPC-FP8 overrides for some experts: every way the batches can group and split."""
    fam = _edge_family()
    g = torch.Generator().manual_seed(9)
    for e in range(6):
        fam.tensors[f"model.layers.1.mlp.experts.{e}.up_proj.weight"] = (torch.randn(24, 64, generator=g) * 0.02).to(
            torch.bfloat16
        )
        fam.tensors[f"model.layers.1.mlp.experts.{e}.down_proj.weight"] = (
            torch.randn(64, 24 + 8 * (e % 2), generator=g) * 0.02
        ).to(torch.bfloat16)
    fam.tensors["model.layers.1.mlp.experts.fused3d.weight"] = torch.randn(3, 16, 64, generator=g)
    return fam


@pytest.mark.parametrize(
    "family,scheme,layer_config",
    [
        ("mixed", "mxfp4", None),
        ("mixed", "ptpc_fp8", None),
        ("mixed", "mxfp4", {"*experts.1.*": "ptpc_fp8", "*experts.fused*": "ptpc_fp8", "*.proj16": "ptpc_fp8"}),
        ("deepseek_v3", "mxfp4", {"*self_attn*": "ptpc_fp8"}),
    ],
)
@pytest.mark.parametrize("batch_bytes", [1 << 30, 5000])
def test_batched_path_gives_the_per_tensor_bytes(tmp_path, monkeypatch, family, scheme, layer_config, batch_bytes):
    """The GPU path stacks same-shape tensors, quantizes once and splits: each tensor's bytes, names, order and
    digests must be the per-tensor path's (and so Quark's); a batch limit of 5000 bytes also splits the groups."""
    from quantkit.apply.shards import process

    fam = _mixed_family() if family == "mixed" else ck.spec(family, via="tensors")
    src = fam.save(tmp_path / "src", shard_bytes=30_000, aux=False)
    exclude = [m for m in ck.exclude_modules(fam) if not (layer_config and "self_attn" in m)]
    monkeypatch.setattr(process, "_DEVICE_BATCH_BYTES", batch_bytes)
    per_tensor = _shard_outputs(src, scheme, exclude, layer_config, batched=False)
    batched = _shard_outputs(src, scheme, exclude, layer_config, batched=True, batch_bytes=batch_bytes * 2)
    assert sum(q for *_, q in per_tensor) > 10
    assert batched == per_tensor


def test_batched_path_names_the_non_finite_weight(tmp_path):

    fam = ck.spec("qwen3_moe", layers=1)
    fam.tensors["model.layers.0.mlp.experts.5.up_proj.weight"][3, 7] = float("-inf")
    src = fam.save(tmp_path / "src", shard_bytes=10**7, aux=False)
    with pytest.raises(NonFiniteWeightError, match=r"experts\.5\.up_proj\.weight\[3, 7\] is -inf"):
        _shard_outputs(src, "mxfp4", ck.exclude_modules(fam), None, batched=True)


def test_several_readers_write_the_same_folder(tmp_path):
    """Readers finish shards out of order; the folder (index order included) is the one-reader folder."""
    src, exclude = _checkpoint(tmp_path, shard_bytes=30_000)
    one = _run(src, tmp_path / "one", exclude, readers=1)
    four = _run(src, tmp_path / "four", exclude, readers=4)
    assert len(four.shards) >= 8
    assert ck.tree_bytes(tmp_path / "one") == ck.tree_bytes(tmp_path / "four")
    assert [r.sha256_out for r in one.shards] == [r.sha256_out for r in four.shards]
    with pytest.raises(ExecutorError, match="readers=0"):
        _run(src, tmp_path / "zero", exclude, readers=0)


def test_cpu_processes_write_the_thread_folder(tmp_path, monkeypatch):
    """Weights quantized in CPU child processes (through the shared slot memory) give the folder the threads give
    (and so Quark's, above); a NaN found in a child is named as the threads name it; a bad switch is one line."""
    src, exclude = _checkpoint(tmp_path, shard_bytes=30_000)
    threads = _run(src, tmp_path / "threads", exclude, cpu_processes=False)
    procs = _run(src, tmp_path / "procs", exclude, cpu_processes=True)
    assert threads.cpu_processes == 0 and procs.cpu_processes >= 1
    assert ck.tree_bytes(tmp_path / "threads") == ck.tree_bytes(tmp_path / "procs")
    assert _run(src, tmp_path / "auto", exclude).cpu_processes == 0  # far below 1 GiB of weights: threads
    monkeypatch.setenv("QUANTKIT_CPU_PROCESSES", "1")
    assert _run(src, tmp_path / "env", exclude).cpu_processes >= 1
    assert ck.tree_bytes(tmp_path / "env") == ck.tree_bytes(tmp_path / "threads")
    monkeypatch.setenv("QUANTKIT_CPU_CHILDREN", "3")  # the children's number, set: the same bytes
    assert _run(src, tmp_path / "three", exclude).cpu_processes == 3
    assert ck.tree_bytes(tmp_path / "three") == ck.tree_bytes(tmp_path / "threads")
    monkeypatch.setenv("QUANTKIT_CPU_CHILDREN", "0")
    with pytest.raises(ExecutorError, match="QUANTKIT_CPU_CHILDREN='0'"):
        _run(src, tmp_path / "zero-children", exclude)
    assert not (tmp_path / "zero-children").exists()  # refused before any work
    monkeypatch.delenv("QUANTKIT_CPU_CHILDREN")
    monkeypatch.setenv("QUANTKIT_CPU_PROCESSES", "yes")
    with pytest.raises(ExecutorError, match="QUANTKIT_CPU_PROCESSES='yes'"):
        _run(src, tmp_path / "bad", exclude)
    monkeypatch.delenv("QUANTKIT_CPU_PROCESSES")
    fam = ck.spec("qwen3_moe", layers=1)
    fam.tensors["model.layers.0.mlp.experts.2.gate_proj.weight"][4, 9] = float("nan")
    bad = fam.save(tmp_path / "nan")
    with pytest.raises(NonFiniteWeightError, match=r"experts\.2\.gate_proj\.weight\[4, 9\] is nan"):
        _run(bad, tmp_path / "nan-out", ck.exclude_modules(fam), cpu_processes=True)


def test_exclusion_matcher_is_fnmatch():
    import fnmatch
    import random

    from quantkit.apply.shards.f2f import matcher as _matcher

    rng = random.Random(0)
    parts = ["model", "layers", "0", "12", "mlp", "experts", "gate", "self_attn", "q_proj", "lm_head", "[x]"]
    names = [".".join(rng.choice(parts) for _ in range(rng.randint(1, 5))) for _ in range(300)]
    for _ in range(50):
        patterns = tuple(
            rng.choice([n, n.replace("0", "?"), "*" + n[-5:], n[:4] + "*", "*[0-9].mlp*", "[!m]*", "model.layers.[1]*"])
            for n in rng.sample(names, rng.randint(0, 6))
        )
        match = _matcher(patterns)
        for n in names:
            assert match(n) == any(fnmatch.fnmatch(n, p) for p in patterns), (n, patterns)


# --- resume, corruption, refusal --------------------------------------------------------------------------------------


def _checkpoint(tmp_path: Path, shard_bytes: int = 60_000) -> tuple[Path, list[str]]:
    fam = ck.spec("qwen3_moe", layers=3)
    return fam.save(tmp_path / "src", shard_bytes=shard_bytes), ck.exclude_modules(fam)


def _run(src: Path, dst: Path, exclude: list[str], **kwargs):
    return quantize_checkpoint(src, dst, scheme="mxfp4", exclude=exclude, layer_config=None, devices=["cpu"], **kwargs)


def test_resume_after_kill_is_byte_identical(tmp_path):
    src, exclude = _checkpoint(tmp_path)
    shards = len(list(src.glob("*.safetensors")))
    assert shards >= 6
    _run(src, tmp_path / "clean", exclude)
    script = textwrap.dedent(f"""
        import os, signal
        from pathlib import Path
        from quantkit.apply.shards import quantize_checkpoint
        done = []
        def progress(event):
            if event.kind == "done":
                done.append(event.shard)
                if len(done) == 3:
                    os.kill(os.getpid(), signal.SIGKILL)
        quantize_checkpoint(Path({str(src)!r}), Path({str(tmp_path / "resumed")!r}), scheme="mxfp4",
                            exclude={exclude!r}, layer_config=None, devices=["cpu"], progress=progress)
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -9, proc.stderr
    journal = json.loads((tmp_path / "resumed" / JOURNAL_NAME).read_text())
    assert 3 <= len(journal["shards"]) < shards
    assert not (tmp_path / "resumed" / "config.json").exists()  # final files only once every shard is done
    with pytest.raises(ExecutorError, match="resume=True"):
        _run(src, tmp_path / "resumed", exclude)
    report = _run(src, tmp_path / "resumed", exclude, resume=True)
    assert report.resumed_shards == len(journal["shards"])
    assert sum(not r.resumed for r in report.shards) == shards - len(journal["shards"])
    assert ck.tree_bytes(tmp_path / "resumed") == ck.tree_bytes(tmp_path / "clean")


def test_resume_redoes_a_damaged_output_shard(tmp_path):
    src, exclude = _checkpoint(tmp_path)
    _run(src, tmp_path / "clean", exclude)
    events = []

    def stop_after_two(event):
        if event.kind == "done" and len(events) < 2:
            events.append(event.shard)
        if len(events) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _run(src, tmp_path / "out", exclude, progress=stop_after_two)
    damaged = tmp_path / "out" / events[0]
    damaged.write_bytes(damaged.read_bytes()[:-1] + b"\x00")
    report = _run(src, tmp_path / "out", exclude, resume=True)
    by_name = {r.name: r for r in report.shards}
    assert not by_name[events[0]].resumed and by_name[events[1]].resumed
    assert ck.tree_bytes(tmp_path / "out") == ck.tree_bytes(tmp_path / "clean")


def test_corrupt_shard_midway_is_one_line_and_keeps_the_journal(tmp_path):
    src, exclude = _checkpoint(tmp_path)
    last = max(src.glob("*.safetensors"))
    original = last.read_bytes()

    def corrupt_later_shard(event):
        if event.kind == "done" and last.stat().st_size == len(original):
            last.write_bytes(original[: len(original) // 2])  # the disk "loses" half of a shard not read yet

    with pytest.raises(CorruptShardError) as err:
        _run(src, tmp_path / "out", exclude, progress=corrupt_later_shard)
    message = str(err.value)
    assert "\n" not in message and last.name in message and "re-download" in message
    journal = json.loads((tmp_path / "out" / JOURNAL_NAME).read_text())
    assert journal["shards"] and last.name not in journal["shards"]
    assert not (tmp_path / "out" / "config.json").exists()
    last.write_bytes(original)
    report = _run(src, tmp_path / "out", exclude, resume=True)
    assert report.resumed_shards == len(journal["shards"])
    _run(src, tmp_path / "clean", exclude)
    assert ck.tree_bytes(tmp_path / "out") == ck.tree_bytes(tmp_path / "clean")


@pytest.mark.parametrize(
    "scheme,value,word",
    [("mxfp4", float("nan"), "nan"), ("mxfp4", float("-inf"), "-inf"), ("ptpc_fp8", float("inf"), "inf")],
)
def test_non_finite_weight_is_refused_with_its_index(tmp_path, scheme, value, word):
    fam = ck.spec("qwen3_moe")
    fam.tensors["model.layers.0.mlp.experts.3.down_proj.weight"][5, 17] = value
    src = fam.save(tmp_path / "src")
    with pytest.raises(NonFiniteWeightError) as err:
        quantize_checkpoint(
            src, tmp_path / "out", scheme=scheme, exclude=ck.exclude_modules(fam), layer_config=None, devices=["cpu"]
        )
    assert f"model.layers.0.mlp.experts.3.down_proj.weight[5, 17] is {word}" in str(err.value)
    assert "\n" not in str(err.value) and isinstance(err.value, QuantkitError)


def test_non_finite_weight_in_a_kept_layer_is_copied(tmp_path):
    """Only weights to be quantized must be finite: a kept layer's bytes pass through as they are (as in Quark)."""
    fam = ck.spec("qwen3_moe", layers=1)
    fam.tensors["lm_head.weight"][0, 0] = float("nan")
    src = fam.save(tmp_path / "src")
    quantize_checkpoint(
        src, tmp_path / "out", scheme="mxfp4", exclude=ck.exclude_modules(fam), layer_config=None, devices=["cpu"]
    )
    src_bytes, out_bytes = _stored_bytes(src, "lm_head.weight"), _stored_bytes(tmp_path / "out", "lm_head.weight")
    assert out_bytes == src_bytes
    assert torch.isnan(torch.frombuffer(bytearray(out_bytes), dtype=torch.bfloat16)[0])


def _stored_bytes(folder: Path, name: str) -> bytes:
    """The bytes tensor `name` has in its shard under `folder`, cut from the file by its header's offsets."""
    from quantkit.io.safetensors import read_header

    for shard in sorted(folder.glob("*.safetensors")):
        header = read_header(shard)
        if name in header:
            raw = shard.read_bytes()
            begin, end = header[name]["data_offsets"]
            start = 8 + int.from_bytes(raw[:8], "little")
            return raw[start + begin : start + end]
    raise AssertionError(f"{name} is in no shard of {folder}")


def test_refusals_are_one_line_quantkit_errors(tmp_path):
    src, exclude = _checkpoint(tmp_path)
    cases = {
        "scheme": {"scheme": "fp8"},
        "devices": {"devices": []},
        "source folder": {"dst": src},
    }
    for needle, change in cases.items():
        kwargs = {
            "dst": tmp_path / "out",
            "scheme": "mxfp4",
            "exclude": exclude,
            "layer_config": None,
            "devices": ["cpu"],
        }
        kwargs.update(change)
        dst = kwargs.pop("dst")
        with pytest.raises(QuantkitError, match=needle) as err:
            quantize_checkpoint(src, dst, **kwargs)
        assert "\n" not in str(err.value)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": "fp8"}}))
    with pytest.raises(ExecutorError, match="already quantized"):
        _run(src, tmp_path / "out2", exclude)
    (src / "config.json").write_text(json.dumps(config))
    (tmp_path / "stray").mkdir()
    (tmp_path / "stray" / "notes.txt").write_text("not ours")
    with pytest.raises(ExecutorError, match="not an interrupted run"):
        _run(src, tmp_path / "stray", exclude, resume=True)
    _run(src, tmp_path / "out3", exclude)
    with pytest.raises(ExecutorError, match="different run"):
        (tmp_path / "out3" / JOURNAL_NAME).write_text(json.dumps({"quantkit_journal": 1, "scheme": "ptpc_fp8"}))
        quantize_checkpoint(
            src, tmp_path / "out3", scheme="mxfp4", exclude=exclude, layer_config=None, devices=["cpu"], resume=True
        )


# --- process-level properties -----------------------------------------------------------------------------------------


def test_does_not_import_quark(tmp_path):
    src, exclude = _checkpoint(tmp_path, shard_bytes=400_000)
    script = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from quantkit.apply.shards import quantize_checkpoint
        quantize_checkpoint(Path({str(src)!r}), Path({str(tmp_path / "out")!r}), scheme="mxfp4",
                            exclude={exclude!r}, layer_config=None, devices=["cpu"])
        loaded = [m for m in sys.modules if m == "quark" or m.startswith("quark.")]
        assert not loaded, loaded
        print("ok")
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_peak_memory_is_a_few_shards_not_the_model(tmp_path):
    """8 shards of ~40 MB (320 MB of bf16 experts): the run's peak RSS growth must stay under 3 shards + 60 MB,
    which loading the whole model (320 MB) cannot."""
    from safetensors.torch import save_file

    src = tmp_path / "src"
    src.mkdir()
    g = torch.Generator().manual_seed(0)
    shard_mb = 40
    for i in range(8):
        tensors = {
            f"model.layers.{i}.mlp.experts.{e}.down_proj.weight": (torch.randn(1024, 2048, generator=g) * 0.02).to(
                torch.bfloat16
            )
            for e in range(shard_mb // 4)
        }
        tensors[f"model.layers.{i}.input_layernorm.weight"] = torch.ones(2048, dtype=torch.bfloat16)
        save_file(tensors, str(src / f"model-{i + 1:05d}-of-00008.safetensors"), metadata={"format": "pt"})
    (src / "config.json").write_text(json.dumps({"model_type": "qwen3_moe", "torch_dtype": "bfloat16"}))
    largest = max(p.stat().st_size for p in src.glob("*.safetensors"))
    growth = memory.peak_rss_growth(src, tmp_path / "out", [])
    total = sum(p.stat().st_size for p in src.glob("*.safetensors"))
    print(
        f"peak RSS growth {growth / 2**20:.0f} MiB, largest shard {largest / 2**20:.0f} MiB, model {total / 2**20:.0f} MiB"
    )
    assert growth < 3 * largest + 60 * 2**20 < total, (growth / 2**20, largest / 2**20)
