"""`quantkit apply --max-shard-size`: the output re-cut into shards of at most that size, with HF's names and an
index that transformers reads; the same tensors, byte for byte, as the default (source-sharded) output; an
interrupted re-sharded run resumed to the same bytes; bad sizes and the Quark engine refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from quantkit.apply.run import apply, parse_shard_size
from quantkit.cli import main
from quantkit.errors import QuantkitError, ResumableInterrupt
from tests.fixtures import checkpoints as ck

INDEX = "model.safetensors.index.json"


def _tensors(folder: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    """Every tensor of the folder's safetensors files, read with safetensors itself: (dtype, shape, raw bytes)."""
    import torch
    from safetensors import safe_open

    out: dict[str, tuple[str, tuple[int, ...], bytes]] = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), "pt") as h:
            for k in h.keys():
                t = h.get_tensor(k).contiguous()
                assert k not in out, f"{k} is in two files"
                raw = t.view(torch.uint8).numpy().tobytes() if t.dtype != torch.bool else t.numpy().tobytes()
                out[k] = (str(t.dtype), tuple(t.shape), raw)
    return out


def _header_names(path: Path) -> list[str]:
    n = int.from_bytes(path.read_bytes()[:8], "little")
    header = json.loads(path.read_bytes()[8 : 8 + n])
    return [k for k in header if k != "__metadata__"]


def _weights_and_config(folder: Path) -> dict[str, bytes]:
    return {k: v for k, v in ck.tree_bytes(folder).items() if k != "quantkit.json"}


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return ck.make("qwen3_moe", tmp_path_factory.mktemp("src") / "moe", shard_bytes=200_000)


@pytest.fixture(scope="module")
def default_out(source, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("default") / "out"
    apply("mxfp4-moe", source, out, devices="cpu")
    return out


def _assert_consistent(out: Path, limit: int) -> dict:
    """The index covers every tensor exactly once, in the file that holds it; total_size is the tensors' bytes;
    HF's names; every file within the limit unless it holds a single tensor."""
    from transformers.utils.hub import get_checkpoint_shard_files

    index = json.loads((out / INDEX).read_text())
    files = sorted(p.name for p in out.glob("*.safetensors"))
    n = len(files)
    assert files == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    held = {name: f for f in files for name in _header_names(out / f)}
    assert sum(len(_header_names(out / f)) for f in files) == len(held)  # no tensor in two files
    assert index["weight_map"] == held
    tensors = _tensors(out)
    assert index["metadata"]["total_size"] == sum(len(raw) for _, _, raw in tensors.values())
    for f in files:
        size = (out / f).stat().st_size
        assert size <= limit or len(_header_names(out / f)) == 1, (f, size, limit)
    # transformers' own index reader (what from_pretrained calls on a sharded folder)
    shard_files, metadata = get_checkpoint_shard_files(str(out), str(out / INDEX))
    assert sorted(Path(p).name for p in shard_files) == files
    assert set(metadata["all_checkpoint_keys"]) == set(held)
    return index


@pytest.mark.parametrize("limit", [150_000, 40_000], ids=["within", "oversized-tensors"])
def test_resharded_output_holds_the_default_outputs_tensors(source, default_out, tmp_path, limit):
    out = tmp_path / "out"
    r = CliRunner().invoke(
        main,
        [
            "apply",
            "--recipe",
            "mxfp4-moe",
            "--model",
            str(source),
            "--output",
            str(out),
            "--devices",
            "cpu",
            "--max-shard-size",
            str(limit),
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    result = json.loads(r.stdout)
    assert result["max_shard_size"] == limit
    index = _assert_consistent(out, limit)
    default_files = sorted(p.name for p in default_out.glob("*.safetensors"))
    assert len(index["weight_map"]) == len(_tensors(default_out))
    assert sorted(p.name for p in out.glob("*.safetensors")) != default_files  # really re-cut
    assert _tensors(out) == _tensors(default_out)  # byte for byte, dtype and shape
    if limit == 40_000:  # tensors above the limit exist, each alone in its own file
        big = [f for f in out.glob("*.safetensors") if f.stat().st_size > limit]
        assert big and all(len(_header_names(f)) == 1 for f in big)
    # the source hashes recorded are the source's own shards, as in a default run
    manifest = json.loads((out / "quantkit.json").read_text())
    assert manifest["source_files"] == json.loads((default_out / "quantkit.json").read_text())["source_files"]
    assert sorted(manifest["source_files"]) == sorted(p.name for p in source.glob("*.safetensors"))
    check = CliRunner().invoke(main, ["check", str(out), "--vllm", "off", "--json"])
    assert check.exit_code == 0 and json.loads(check.stdout)["ok"], check.output[-2000:]


def test_default_output_keeps_the_source_shard_names(source, default_out):
    assert sorted(p.name for p in default_out.glob("*.safetensors")) == sorted(
        p.name for p in source.glob("*.safetensors")
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("5GB", 5 * 10**9),
        ("500MB", 500 * 10**6),
        ("2GiB", 2 * 2**30),
        ("10KiB", 10 * 1024),
        ("1000", 1000),
        ("8Gb", 10**9),
        ("5gb", 5 * 10**9 // 8),
        ("7mib", 7 * 2**20),
    ],
)
def test_sizes_read_as_transformers_reads_max_shard_size(text, expected):
    from transformers.utils.hub import convert_file_size_to_int

    assert parse_shard_size(text) == expected
    if not text.isdigit():  # transformers takes a plain number as an int only
        assert convert_file_size_to_int(text) == expected


@pytest.mark.parametrize("bad", ["5XB", "big", "-1GB", "0", "1.5GB", ""])
def test_a_bad_size_is_one_line_exit_2_before_any_output(source, tmp_path, bad):
    out = tmp_path / "out"
    r = CliRunner().invoke(
        main,
        [
            "apply",
            "--recipe",
            "mxfp4-moe",
            "--model",
            str(source),
            "--output",
            str(out),
            "--devices",
            "cpu",
            "--max-shard-size",
            bad,
        ],
    )
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: --max-shard-size"), r.output
    assert "Traceback" not in r.output
    assert list(tmp_path.iterdir()) == []


def test_the_quark_engine_refuses_resharding_naming_the_native_engine(source, tmp_path):
    out = tmp_path / "out"
    r = CliRunner().invoke(
        main,
        [
            "apply",
            "--recipe",
            "mxfp4-moe",
            "--model",
            str(source),
            "--output",
            str(out),
            "--devices",
            "cpu",
            "--engine",
            "quark",
            "--max-shard-size",
            "1MB",
        ],
    )
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "--engine native" in lines[0] and lines[0].startswith("error:"), r.output
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def larger(tmp_path_factory) -> Path:
    """Enough source shards (~1.5 MB each) that an interrupt after the second output shard leaves work to do."""
    out = tmp_path_factory.mktemp("larger") / "moe"
    return ck.make("qwen3_moe", out, layers=4, experts=16, hidden=256, inter=256, vocab=1024, shard_bytes=1_500_000)


def test_an_interrupted_resharded_run_resumes_to_the_same_bytes(larger, tmp_path):
    limit = 2_000_000  # each output shard spans source shards, so outputs and sources do not line up
    clean = tmp_path / "clean"
    apply("mxfp4-moe", larger, clean, devices="cpu", max_shard_size=limit)
    out = tmp_path / "out"

    def interrupt(message: str) -> None:
        if message.startswith("shard 2/"):  # the second output shard is written and journaled
            raise KeyboardInterrupt

    with pytest.raises(ResumableInterrupt, match="resume with: quantkit apply .*--max-shard-size 2000000"):
        apply("mxfp4-moe", larger, out, devices="cpu", max_shard_size=limit, progress=interrupt)
    assert not out.exists()
    partial = out.with_name(f".{out.name}.quantkit-partial")
    journal = json.loads((partial / ".quantkit-journal.json").read_text())
    assert journal["max_shard_size"] == limit
    finished = sorted(journal["shards"])
    total = len(list(clean.glob("*.safetensors")))
    assert 2 <= len(finished) < total and journal["sources"]
    # a finished output shard damaged in place (same size) must be redone, the others kept
    damaged = partial / finished[-1]
    raw = bytearray(damaged.read_bytes())
    raw[-1] ^= 0xFF
    damaged.write_bytes(bytes(raw))
    # resuming under another shard size is another run's journal: refused in one line, the folder kept
    with pytest.raises(QuantkitError, match="max_shard_size differs"):
        apply("mxfp4-moe", larger, out, devices="cpu", max_shard_size=limit // 2, resume=True)
    result = apply("mxfp4-moe", larger, out, devices="cpu", max_shard_size=limit, resume=True)
    assert 1 <= result.resumed_shards <= len(finished) - 1
    assert not any(s.resumed for s in result.shards if s.name == finished[-1])
    assert _weights_and_config(out) == _weights_and_config(clean)
    assert (
        json.loads((out / "quantkit.json").read_text())["source_files"]
        == json.loads((clean / "quantkit.json").read_text())["source_files"]
    )
    _assert_consistent(out, limit)


def test_two_workers_finishing_out_of_order_write_the_same_resharded_tensors(larger, tmp_path):
    """Two workers and a small budget: batches reach the writer out of source order, and output shards fill from
    several batches at once."""
    from quantkit.apply.shards import quantize_checkpoint

    exclude = ck.exclude_modules(ck.spec("qwen3_moe", layers=4, experts=16, hidden=256, inter=256, vocab=1024))
    one = quantize_checkpoint(
        larger, tmp_path / "one", scheme="mxfp4", exclude=exclude, layer_config=None, devices=["cpu"]
    )
    two = quantize_checkpoint(
        larger,
        tmp_path / "two",
        scheme="mxfp4",
        exclude=exclude,
        layer_config=None,
        devices=["cpu", "cpu"],
        max_shard_size=1_000_000,
        max_memory=64 << 20,
    )
    assert two.slots > 1 and len(two.shards) != len(one.shards)
    assert two.source_sha256 == one.source_sha256 == {s.name: s.sha256_in for s in one.shards}
    assert _tensors(tmp_path / "two") == _tensors(tmp_path / "one")
    _assert_consistent(tmp_path / "two", 1_000_000)
