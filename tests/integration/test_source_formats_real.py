# tier: integration
"""Source formats decoded from real tiny checkpoints (DeepSeek-V3 and MiniMax-M2 FP8-block, a Kimi-K2.5-style INT4 wrapper, built with transformers) against compressed-tensors' own decompressors and an independent NumPy dequantizer (tests/unit/test_source_formats.py has the pure cases)."""

from __future__ import annotations

import numpy as np
import pytest

from quantkit.io import formats as F
from tests.unit.test_source_formats import _bf16_bits, _bits, numpy_fp8_block_dequant


@pytest.fixture(scope="module")
def source_checkpoints(tmp_path_factory):
    from tests.fixtures import checkpoints as ck

    root = tmp_path_factory.mktemp("source-checkpoints")
    return {name: ck.make(builder, root / name, **opts) for name, (builder, opts) in ck.SOURCES.items()}


def _shards(folder):
    from safetensors.torch import load_file

    return {f.name: load_file(f) for f in sorted(folder.glob("*.safetensors"))}


@pytest.mark.parametrize("name", ["deepseek-v3-fp8", "minimax-m2-fp8"])
def test_fp8_block_checkpoints_decode_exactly(source_checkpoints, name):
    import torch
    from compressed_tensors.entrypoints.convert.converters import FP8BlockDequantizer

    from quantkit.io.headers import checkpoint_tensors, read_config
    from quantkit.naming import archs

    folder = source_checkpoints[name]
    config, infos = read_config(folder), checkpoint_tensors(folder)
    fmt = F.detect_format(config, infos)
    assert (fmt.name, fmt.block_size) == ("fp8-block", (128, 128))
    plan = F.decoded_tensor_names(fmt, infos)
    archs.runtime_layers(config, plan)  # quantkit's naming reads the decoded checkpoint as its architecture
    partial = decoded = 0
    # compressed-tensors' model-free FP8 block dequantizer, told which modules are FP8 (it does not look).
    ct = FP8BlockDequantizer(targets=[n[: -len(".weight")] for n, parts in plan.items() if len(parts) == 2])
    for shard in _shards(folder).values():
        out = F.decode_tensors(fmt, shard)
        ref_ct = ct.process(dict(shard))
        assert set(out) == set(ref_ct) == {n for n in plan if n in out}
        assert not [n for n in out if n.endswith("_scale_inv")]
        for n, t in out.items():
            if n in shard and shard[n].dtype != torch.float8_e4m3fn:
                assert t is shard[n]
                continue
            raw = shard[n].view(torch.uint8).numpy()
            ref = numpy_fp8_block_dequant(raw, shard[n + "_scale_inv"].numpy())
            np.testing.assert_array_equal(_bits(t), _bf16_bits(ref))
            assert torch.equal(t.view(torch.int16), ref_ct[n].view(torch.int16))
            partial += any(d % 128 for d in t.shape)
            decoded += 1
    assert decoded == sum(1 for parts in plan.values() if len(parts) == 2) and partial > 0
    if name == "deepseek-v3-fp8":
        mtp = archs.mtp_tensor_names(config, infos)
        assert mtp and all(n.startswith("model.layers.3.") for n in mtp)
        assert "model.layers.3.eh_proj.weight" in mtp and "model.layers.3.mlp.experts.0.up_proj.weight_scale_inv" in mtp


def test_int4_kimi_checkpoint_decodes_like_compressed_tensors(source_checkpoints):
    import torch
    from compressed_tensors.entrypoints.convert.converters import (
        CompressedTensorsDequantizer,
    )

    from quantkit.io.headers import checkpoint_tensors, read_config
    from quantkit.naming import archs

    folder = source_checkpoints["kimi-k25-int4"]
    config, infos = read_config(folder), checkpoint_tensors(folder)
    fmt = F.detect_format(config, infos)
    assert (fmt.name, fmt.group_size, fmt.config_key) == ("int4-pack-quantized", 32, "text_config.quantization_config")
    plan = F.decoded_tensor_names(fmt, infos)
    _family, text, prefix = archs.text_family(config)
    assert prefix == "language_model."
    archs.runtime_layers(text, [n[len(prefix) :] for n in plan if n.startswith(prefix)])
    reference = CompressedTensorsDequantizer(folder)  # reads text_config.quantization_config itself
    experts = 0
    for shard in _shards(folder).values():
        out = F.decode_tensors(fmt, shard)
        ref = reference.process(dict(shard))
        assert set(out) == set(ref)
        assert not [n for n in out if n.endswith(F.INT4_PARTS)]
        for n, t in out.items():
            assert t.dtype == ref[n].dtype
            if n in shard:
                assert t is shard[n]  # kept: the very tensor read from the file
            else:
                assert torch.equal(t.view(torch.int16), ref[n].view(torch.int16)), n
                assert ".mlp.experts." in n
                experts += 1
    assert experts == sum(1 for parts in plan.values() if len(parts) == 3) == 2 * 4 * 3
    assert F.decoded_origins(fmt, infos)["vision_tower.encoder.blocks.0.wqkv.weight"] == "stored"
