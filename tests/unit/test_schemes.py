"""The scheme registry (quantkit.schemes): adding a native scheme is one record, and each native scheme's layout and
output bytes are what its quantizer and the executor really write (values worked out by hand below)."""

from dataclasses import replace

import pytest
import torch

from quantkit.apply.shards import quantize_checkpoint
from quantkit.errors import QuantkitError
from quantkit.io.headers import checkpoint_tensors
from quantkit.io.safetensors import read_header, tensor_nbytes
from quantkit.schemes import SCHEMES, expected_layout, native_schemes, quantize_weight, register_scheme, scheme
from tests.fixtures import checkpoints as ck

# By hand: MXFP4 packs two 4-bit codes per byte and stores one E8M0 byte per 32 elements of a row (rows = every dim
# but the last, flattened, ceil for a partial group); PTPC-FP8 stores one FP8 byte per element and one float32 scale
# per output channel (dim 0).
HAND = {
    ("mxfp4", (64, 96)): {"": ("U8", (64, 48)), "_scale": ("U8", (64, 3))},
    ("mxfp4", (4, 8, 40)): {"": ("U8", (4, 8, 20)), "_scale": ("U8", (32, 2))},
    ("ptpc_fp8", (64, 96)): {"": ("F8_E4M3", (64, 96)), "_scale": ("F32", (64,))},
    ("ptpc_fp8", (3, 8, 40)): {"": ("F8_E4M3", (3, 8, 40)), "_scale": ("F32", (3,))},
}
HAND_BYTES = {
    ("mxfp4", (64, 96)): 64 * 48 + 64 * 3,
    ("mxfp4", (4, 8, 40)): 4 * 8 * 20 + 32 * 2,
    ("ptpc_fp8", (64, 96)): 64 * 96 + 64 * 4,
    ("ptpc_fp8", (3, 8, 40)): 3 * 8 * 40 + 3 * 4,
}


def test_registry_lookup_and_native_set():
    assert native_schemes() == ("mxfp4", "ptpc_fp8")
    assert all(SCHEMES[n].native for n in native_schemes())
    assert not SCHEMES["fp8"].native and SCHEMES["fp8"].output_bytes((8, 8)) is None
    with pytest.raises(QuantkitError, match=r"unknown scheme 'mxfp5' \(known: int4_wo_32, .*mxfp4"):
        scheme("mxfp5")


@pytest.mark.parametrize(("name", "shape"), list(HAND))
def test_layouts_and_output_bytes(name, shape):
    """layout() by hand, equal to what the quantizer returns; output_bytes() equal to the bytes those tensors take."""
    assert expected_layout(shape, name) == HAND[(name, shape)]
    assert SCHEMES[name].output_bytes(shape) == HAND_BYTES[(name, shape)]
    q, s = quantize_weight(torch.randn(*shape, dtype=torch.bfloat16), name)
    st = {torch.uint8: "U8", torch.float8_e4m3fn: "F8_E4M3", torch.float32: "F32"}
    assert {"": (st[q.dtype], tuple(q.shape)), "_scale": (st[s.dtype], tuple(s.shape))} == HAND[(name, shape)]


def test_output_bytes_sum_to_the_written_tensor_bytes(tmp_path):
    """Summed over a tiny MoE checkpoint, output_bytes of the quantized weights plus the bytes of the rest equal the
    tensor bytes of the executor's output."""
    fam = ck.spec("qwen3_moe")
    src = fam.save(tmp_path / "src", shard_bytes=60_000, aux=False)
    exclude = ck.exclude_modules(fam)
    quantize_checkpoint(src, tmp_path / "out", scheme="mxfp4", exclude=exclude, layer_config=None, devices=["cpu"])
    out = checkpoint_tensors(tmp_path / "out")
    quantized = {n.removesuffix("_scale") for n in out if n.endswith(".weight_scale")}
    predicted = 0
    for name, t in checkpoint_tensors(src).items():
        predicted += SCHEMES["mxfp4"].output_bytes(t.shape) if name in quantized else tensor_nbytes(t.dtype, t.shape)
    written = sum(
        end - begin
        for f in (tmp_path / "out").glob("*.safetensors")
        for k, v in read_header(f).items()
        if k != "__metadata__"
        for begin, end in [v["data_offsets"]]
    )
    assert quantized and predicted == written


def test_adding_a_scheme_is_one_record(tmp_path):
    """A copy of the mxfp4 record under another name quantizes to the very same shards: the executor dispatches
    through the registry only (no string test on "mxfp4" is left to take another path)."""
    fam = ck.spec("qwen3_moe")
    src = fam.save(tmp_path / "src", shard_bytes=60_000, aux=False)
    exclude = ck.exclude_modules(fam)
    register_scheme(replace(SCHEMES["mxfp4"], name="mxfp4_copy"))
    try:
        assert "mxfp4_copy" in native_schemes()
        for name in ("mxfp4", "mxfp4_copy"):
            quantize_checkpoint(src, tmp_path / name, scheme=name, exclude=exclude, layer_config=None, devices=["cpu"])
    finally:
        del SCHEMES["mxfp4_copy"]
    shards = sorted(p.name for p in (tmp_path / "mxfp4").glob("*.safetensors"))
    assert len(shards) >= 2
    assert shards == sorted(p.name for p in (tmp_path / "mxfp4_copy").glob("*.safetensors"))
    for shard in shards:
        assert (tmp_path / "mxfp4" / shard).read_bytes() == (tmp_path / "mxfp4_copy" / shard).read_bytes()


def test_a_copied_scheme_batches_as_the_original(tmp_path):
    """The GPU path (run here on CPU) groups and stacks tensors by the record's `batching`: the copy's batched bytes
    are the original's."""
    from quantkit.apply.shards import f2f, process

    fam = ck.spec("qwen3_moe")
    src = fam.save(tmp_path / "src", shard_bytes=60_000, aux=False)
    exclude = ck.exclude_modules(fam)

    def batched(name: str) -> list[dict[str, bytes]]:
        from quantkit.apply.shards import units

        plan = f2f.plan_shards(src, name, exclude, None)
        settings = process.Settings(src, src, name, exclude, None, plan)
        layouts = units.shard_layouts(
            src, plan, scheme=name, exclude=exclude, layer_config=None, drop=frozenset(), decode=None
        )
        files = process.SourceFiles(src, plan.sizes)
        outs = []
        try:
            for shard in plan.shards:
                layout = layouts[shard]
                units.cut_batches(layout, 1 << 40, False)
                for batch in layout.batches:
                    host = torch.empty(batch.read_bytes * 3 + (1 << 20), dtype=torch.uint8)
                    loaded = process.read_batch(files, batch, host, layout.data_start, layout.entries)
                    out = process.process_device(loaded, settings, "cpu")
                    outs.append(
                        {k: t.contiguous().view(-1).view(torch.uint8).numpy().tobytes() for k, t in out.tensors}
                    )
        finally:
            files.close()
        return outs

    register_scheme(replace(SCHEMES["ptpc_fp8"], name="ptpc_fp8_copy"))
    try:
        assert batched("ptpc_fp8_copy") == batched("ptpc_fp8")
    finally:
        del SCHEMES["ptpc_fp8_copy"]
