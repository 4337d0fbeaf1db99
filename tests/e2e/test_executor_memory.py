"""The executor at real shard sizes: memory held to a byte budget whatever the shard (peak RSS of a run whose model is
one large shard, measured in a subprocess), a budget below one tensor's work refused in one line before any work,
modules whose parts lie in different shards (FP8-block scales, INT4 scale/shape) quantized to the very bytes of the
same source sharded without splits, and, on a GPU, the GPU decode bit-exact with the CPU decode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from quantkit.apply.shards import ExecutorError, quantize_checkpoint
from quantkit.io.formats import detect_format
from quantkit.io.headers import checkpoint_tensors, read_config
from tests.fixtures import checkpoints as ck
from tests.fixtures import memory

ROOT = Path(__file__).resolve().parents[2]
MIB = 2**20
_EXCLUDE = ["*self_attn*", "*lm_head", "*mlp.gate", "vision_tower*", "mm_projector*", "*shared_experts*"]


def _one_large_shard(src: Path, kept_mib: int, tensor_mib: int) -> None:
    """One ~`kept_mib` MiB shard: excluded (kept) routers of `tensor_mib` MiB each, which the executor only copies,
    and a few experts to quantize; cheap to make (no random numbers for the kept bytes)."""
    src.mkdir(parents=True)
    rows = tensor_mib * MIB // (2 * 2048)
    base = torch.arange(rows * 2048, dtype=torch.int32).remainder(16000).to(torch.int16)
    tensors = {
        f"model.layers.{i}.mlp.gate.weight": (base + i).view(torch.bfloat16).reshape(rows, 2048)
        for i in range(kept_mib // tensor_mib)
    }
    g = torch.Generator().manual_seed(0)
    for e in range(4):
        tensors[f"model.layers.0.mlp.experts.{e}.down_proj.weight"] = (torch.randn(256, 2048, generator=g) * 0.02).to(
            torch.bfloat16
        )
    save_file(tensors, str(src / "model.safetensors"), metadata={"format": "pt"})
    (src / "config.json").write_text(json.dumps({"model_type": "qwen3_moe", "torch_dtype": "bfloat16"}))


def test_peak_rss_stays_within_the_budget_for_one_large_shard(tmp_path):
    """A 128 MiB shard quantized with a 24 MiB budget: the run's peak RSS growth must stay within twice the budget,
    below half the shard (it was slots x the shard before; the bytes are checked against other budgets in
    test_modules_split_across_shards_give_the_unsplit_bytes)."""
    src = tmp_path / "src"
    _one_large_shard(src, kept_mib=128, tensor_mib=2)
    size = (src / "model.safetensors").stat().st_size
    growth = memory.peak_rss_growth(src, tmp_path / "out", ["*.mlp.gate"], max_memory=24 * 2**20)
    print(f"peak RSS growth {growth / MIB:.0f} MiB for a {size / MIB:.0f} MiB shard, budget 24 MiB")
    assert growth < 48 * MIB < size / 2, growth / MIB


def test_max_memory_below_one_tensor_is_refused_before_any_work(tmp_path):
    src = tmp_path / "src"
    _one_large_shard(src, kept_mib=8, tensor_mib=4)
    with pytest.raises(ExecutorError) as err:
        quantize_checkpoint(
            src,
            tmp_path / "out",
            scheme="mxfp4",
            exclude=["*.mlp.gate"],
            layer_config=None,
            devices=["cpu"],
            max_memory=2 * MIB,
        )
    message = str(err.value)
    assert "\n" not in message and "--max-memory 2.0 MiB" in message and "model.layers." in message
    assert not (tmp_path / "out").exists()
    # The CLI: one line on stderr, exit 2, nothing written.
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "quantkit",
            "apply",
            "--recipe",
            "mxfp4-moe",
            "--model",
            str(ROOT / "quantkit" / "data" / "tiny" / "moe-target"),
            "--output",
            str(tmp_path / "cli"),
            "--devices",
            "cpu",
            "--max-memory",
            "4KiB",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "--max-memory 0.0 MiB" in errors[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and not (tmp_path / "cli").exists()
    from click.testing import CliRunner

    from quantkit.cli.app import main

    result = CliRunner().invoke(
        main,
        [
            "apply",
            "--recipe",
            "mxfp4-moe",
            "--model",
            str(src),
            "--output",
            str(tmp_path / "cli2"),
            "--max-memory",
            "lots",
        ],
    )
    assert result.exit_code == 2 and "--max-memory 'lots': not a size" in result.output, result.output


def _reshard(src: Path, dst: Path, move) -> int:
    """Copy checkpoint `src` to `dst` with the tensors `move(name)` selects moved to the next shard (the last
    shard's to the first): each module's anchor stays where it was, so the output shards are the same files."""
    dst.mkdir()
    files = sorted(p.name for p in src.glob("*.safetensors"))
    shards = {f: load_file(str(src / f)) for f in files}
    moved = 0
    out: dict[str, dict[str, torch.Tensor]] = {f: {} for f in files}
    for i, f in enumerate(files):
        for name, t in shards[f].items():
            target = files[(i + 1) % len(files)] if move(name) else f
            moved += target != f
            out[target][name] = t
    weight_map = {}
    for f, tensors in out.items():
        save_file(tensors, str(dst / f), metadata={"format": "pt"})
        weight_map.update({n: f for n in tensors})
    (dst / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    for p in src.iterdir():
        if p.suffix != ".safetensors" and p.name != "model.safetensors.index.json":
            (dst / p.name).write_bytes(p.read_bytes())
    return moved


_INT4_CONFIG = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "ignore": [],
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32},
        }
    },
}


def _int4_parts(rows: int, cols: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    """weight_packed / weight_scale / weight_shape of random INT4 values in compressed-tensors' layout (8 values per
    int32, lowest nibble first, stored as value + 8; quantkit.io.formats)."""
    nibbles = torch.randint(0, 16, (rows, cols // 8, 8), generator=g, dtype=torch.int64)
    packed = (nibbles << torch.arange(0, 32, 4)).sum(-1)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    scale = (torch.rand(rows, cols // 32, generator=g) * 0.01 + 1e-3).to(torch.bfloat16)
    return {"weight_packed": packed, "weight_scale": scale, "weight_shape": torch.tensor([rows, cols])}


def _quantized_source(out: Path, fmt: str) -> Path:
    """A small Qwen3-MoE whose experts are FP8-block (DeepSeek's layout) or INT4 pack-quantized, in shards that keep
    each module whole."""
    fam = ck.spec("qwen3_moe", layers=2, experts=6, hidden=256, inter=128)
    config = dict(fam.config)
    g = torch.Generator().manual_seed(3)
    tensors: dict[str, torch.Tensor] = {}
    for name, t in fam.tensors.items():
        if ".experts." not in name:
            tensors[name] = t
        elif fmt == "fp8-block":
            tensors[name], tensors[name + "_scale_inv"] = ck.fp8_block_quantize(t)
        else:
            for part, value in _int4_parts(*t.shape, g).items():
                tensors[f"{name.removesuffix('.weight')}.{part}"] = value
    config["quantization_config"] = dict(ck.FP8_CONFIG) if fmt == "fp8-block" else _INT4_CONFIG
    return ck.write_checkpoint(out, tensors, config, shard_bytes=200_000)


@pytest.mark.parametrize(
    "fmt,move",
    [
        ("fp8-block", lambda n: n.endswith("_scale_inv") and ".gate_proj." not in n),
        ("int4", lambda n: n.endswith((".weight_scale", ".weight_shape")) and ".experts.1." not in n),
    ],
)
def test_modules_split_across_shards_give_the_unsplit_bytes(tmp_path, fmt, move):
    whole = _quantized_source(tmp_path / "whole", fmt)
    split = tmp_path / "split"
    assert _reshard(whole, split, move) >= 4
    outs = []
    for src, budget in ((whole, None), (split, 12 * MIB), (whole, 12 * MIB)):
        source_format = detect_format(read_config(src), checkpoint_tensors(src))
        out = tmp_path / f"out-{src.name}-{budget}"
        # A small budget: several batches per shard, so parts are fetched from other batches and other shards.
        report = quantize_checkpoint(
            src,
            out,
            scheme="mxfp4",
            exclude=_EXCLUDE,
            layer_config=None,
            devices=["cpu"],
            decode=source_format,
            max_memory=budget,
        )
        assert report.slots >= 2 and len(report.shards) >= 2
        assert sum(r.quantized for r in report.shards) > 0
        outs.append(ck.tree_bytes(out))
    assert outs[0] == outs[1]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (run on the GPU machine)")
def test_gpu_decode_is_bit_exact_with_the_cpu_decode(tmp_path):
    """FP8-block and INT4 modules decoded on the GPU equal the CPU decode bit for bit, and a whole run of each
    source on cuda:0 writes the folder the CPU run writes."""
    from quantkit.io.formats import SourceFormat, decode_module

    g = torch.Generator().manual_seed(0)
    fp8 = SourceFormat("fp8-block", block_size=(128, 128))
    int4 = SourceFormat("int4-pack-quantized", group_size=32, num_bits=4)
    checked = 0
    for rows, cols in ((256, 384), (200, 320), (7168, 2048)):
        w, s = ck.fp8_block_quantize(torch.randn(rows, cols, generator=g) * 0.05)
        cpu = decode_module(fp8, "x.weight", [w, s])
        gpu = decode_module(fp8, "x.weight", [w.cuda(), s.cuda()]).cpu()
        assert torch.equal(cpu.view(torch.int16), gpu.view(torch.int16))
        parts = _int4_parts(rows, cols, g)
        p = [parts["weight_packed"], parts["weight_scale"], parts["weight_shape"]]
        cpu = decode_module(int4, "x.weight", p)
        gpu = decode_module(int4, "x.weight", [p[0].cuda(), p[1].cuda(), p[2]]).cpu()
        assert torch.equal(cpu.view(torch.int16), gpu.view(torch.int16))
        checked += 2
    for name in ("fp8-block", "int4"):
        src = _quantized_source(tmp_path / name, name)
        fmt = detect_format(read_config(src), checkpoint_tensors(src))
        trees = []
        for device in ("cpu", "cuda:0"):
            out = tmp_path / f"{name}-{device.replace(':', '')}"
            quantize_checkpoint(
                src, out, scheme="mxfp4", exclude=_EXCLUDE, layer_config=None, devices=[device], decode=fmt
            )
            trees.append(ck.tree_bytes(out))
        assert trees[0] == trees[1], name
        checked += 1
    print(f"GPU decode bit-exact: {checked} checks")
