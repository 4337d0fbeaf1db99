"""How long `quantkit inspect` takes on a DeepSeek-V3-sized MXFP4 checkpoint (60 layers x 256 experts), header-only.

Writes a synthetic checkpoint whose safetensors headers declare every tensor with its real shape and data_offsets
while the data region is left sparse (`truncate`), so ~300 GB of apparent size costs no disk; then times
`inspect_checkpoint` against a baseline that only reads and `json.loads` every shard header, and prints the ratio.

    python benchmarks/inspect_large.py                     # 60 layers x 256 experts, DeepSeek-V3 dimensions
    python benchmarks/inspect_large.py --layers 8 --experts 64 --small
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DTYPE_BYTES = {"BF16": 2, "F32": 4, "U8": 1}
# DeepSeek-V3 (and Kimi-K2) text-model dimensions; --small shrinks them for tests.
FULL = dict(hidden=7168, inter=18432, moe_inter=2048, q_lora=1536, kv_lora=512, nope=128, rope=64, v_head=128,
            heads=128, vocab=129280)  # fmt: skip
SMALL = dict(hidden=256, inter=512, moe_inter=64, q_lora=64, kv_lora=32, nope=32, rope=32, v_head=32, heads=4,
             vocab=1024)  # fmt: skip
FIRST_DENSE = 3
EXCLUDE = [
    "model.embed_tokens",
    "re:model\\.layers\\.\\d+\\.self_attn\\..*",
    "re:model\\.layers\\.\\d+\\.mlp\\.shared_experts\\..*",
    "re:model\\.layers\\.[0-2]\\.mlp\\..*",
    "lm_head",
]


def _mxfp4_config() -> dict:
    mx = {"dtype": "fp4", "qscheme": "per_group", "group_size": 32, "scale_format": "e8m0", "ch_axis": -1,
          "is_dynamic": False, "symmetric": None, "observer_cls": "PerBlockMXObserver"}  # fmt: skip
    return {
        "quant_method": "quark", "version": "0.13", "exclude": EXCLUDE,
        "export": {"kv_cache_group": [], "pack_method": "reorder", "weight_format": "real_quantized"},
        "global_quant_config": {"weight": mx, "input_tensors": {**mx, "is_dynamic": True}, "output_tensors": None,
                                "bias": None},
        "layer_quant_config": {}, "layer_type_quant_config": {},
    }  # fmt: skip


def layer_tensors(i: int, d: dict, experts: int, quantized: bool = True) -> dict[str, tuple[str, list[int]]]:
    """Tensor name -> (dtype, shape) for decoder layer i: MLA attention with q_lora, dense MLP for the first three
    layers, else router + shared expert (BF16) + routed experts in MXFP4 (uint8 [out, in/2], E8M0 [out, in/32])."""
    p = f"model.layers.{i}"
    h = d["hidden"]
    t: dict[str, tuple[str, list[int]]] = {
        f"{p}.input_layernorm.weight": ("BF16", [h]),
        f"{p}.post_attention_layernorm.weight": ("BF16", [h]),
        f"{p}.self_attn.q_a_proj.weight": ("BF16", [d["q_lora"], h]),
        f"{p}.self_attn.q_a_layernorm.weight": ("BF16", [d["q_lora"]]),
        f"{p}.self_attn.q_b_proj.weight": ("BF16", [d["heads"] * (d["nope"] + d["rope"]), d["q_lora"]]),
        f"{p}.self_attn.kv_a_proj_with_mqa.weight": ("BF16", [d["kv_lora"] + d["rope"], h]),
        f"{p}.self_attn.kv_a_layernorm.weight": ("BF16", [d["kv_lora"]]),
        f"{p}.self_attn.kv_b_proj.weight": ("BF16", [d["heads"] * (d["nope"] + d["v_head"]), d["kv_lora"]]),
        f"{p}.self_attn.o_proj.weight": ("BF16", [h, d["heads"] * d["v_head"]]),
    }
    if i < FIRST_DENSE:
        t[f"{p}.mlp.gate_proj.weight"] = ("BF16", [d["inter"], h])
        t[f"{p}.mlp.up_proj.weight"] = ("BF16", [d["inter"], h])
        t[f"{p}.mlp.down_proj.weight"] = ("BF16", [h, d["inter"]])
        return t
    m = d["moe_inter"]
    t[f"{p}.mlp.gate.weight"] = ("BF16", [experts, h])
    t[f"{p}.mlp.gate.e_score_correction_bias"] = ("F32", [experts])
    for proj, shape in (("gate_proj", [m, h]), ("up_proj", [m, h]), ("down_proj", [h, m])):
        t[f"{p}.mlp.shared_experts.{proj}.weight"] = ("BF16", shape)
    for e in range(experts):
        for proj, (out, inp) in (("gate_proj", (m, h)), ("up_proj", (m, h)), ("down_proj", (h, m))):
            if quantized:
                t[f"{p}.mlp.experts.{e}.{proj}.weight"] = ("U8", [out, inp // 2])
                t[f"{p}.mlp.experts.{e}.{proj}.weight_scale"] = ("U8", [out, inp // 32])
            else:
                t[f"{p}.mlp.experts.{e}.{proj}.weight"] = ("BF16", [out, inp])
    return t


def write_sparse_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> int:
    """A valid safetensors file whose data region is a hole: header on disk, data bytes never written."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        size = DTYPE_BYTES[dtype]
        for dim in shape:
            size *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        f.truncate(8 + len(raw) + offset)
    return offset


def write_synthetic_deepseek(
    folder: Path, layers: int = 60, experts: int = 256, small: bool = False, quantized: bool = True
) -> dict:
    """Write the header-only checkpoint (one shard per decoder layer plus one for embeddings/head) and its index;
    `quantized=False` writes the BF16 source such a checkpoint is made from (no quantization_config)."""
    d = SMALL if small else FULL
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "torch_dtype": "bfloat16",
        "hidden_size": d["hidden"], "intermediate_size": d["inter"], "moe_intermediate_size": d["moe_inter"],
        "num_hidden_layers": layers, "num_attention_heads": d["heads"], "num_key_value_heads": d["heads"],
        "n_routed_experts": experts, "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace":
        FIRST_DENSE, "moe_layer_freq": 1, "q_lora_rank": d["q_lora"], "kv_lora_rank": d["kv_lora"],
        "qk_nope_head_dim": d["nope"], "qk_rope_head_dim": d["rope"], "v_head_dim": d["v_head"],
        "vocab_size": d["vocab"], "num_nextn_predict_layers": 0, "tie_word_embeddings": False,
        "quantization_config": _mxfp4_config(),
    }  # fmt: skip
    if not quantized:
        del config["quantization_config"]
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    shards = [
        {
            "model.embed_tokens.weight": ("BF16", [d["vocab"], d["hidden"]]),
            "model.norm.weight": ("BF16", [d["hidden"]]),
            "lm_head.weight": ("BF16", [d["vocab"], d["hidden"]]),
        }
    ]
    shards += [layer_tensors(i, d, experts, quantized) for i in range(layers)]
    weight_map: dict[str, str] = {}
    total = 0
    for n, tensors in enumerate(shards):
        name = f"model-{n + 1:05d}-of-{len(shards):05d}.safetensors"
        total += write_sparse_safetensors(folder / name, tensors)
        weight_map.update(dict.fromkeys(tensors, name))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return {"tensors": len(weight_map), "shards": len(shards), "apparent_bytes": total}


def baseline(folder: Path) -> int:
    """The least any header-based tool must do: read the index and json.loads every shard header."""
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    count = 0
    for file in sorted(set(index["weight_map"].values())):
        with (folder / file).open("rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            count += len(json.loads(f.read(n)))
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=60)
    parser.add_argument("--experts", type=int, default=256)
    parser.add_argument("--small", action="store_true", help="small dimensions (same tensor count)")
    parser.add_argument("--dir", type=Path, default=None, help="where to write it (default: a temporary folder)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from quantkit.check.inspect import inspect_checkpoint

    tmp = Path(tempfile.mkdtemp(prefix="quantkit-inspect-large-")) if args.dir is None else args.dir
    try:
        folder = tmp / "deepseek-v3-mxfp4-synthetic"
        t0 = time.perf_counter()
        facts = write_synthetic_deepseek(folder, args.layers, args.experts, args.small)
        print(
            f"wrote {facts['tensors']} tensors in {facts['shards']} shards, {facts['apparent_bytes'] / 1e9:.1f} GB "
            f"apparent (sparse), in {time.perf_counter() - t0:.1f}s"
        )
        base = min(_timed(lambda: baseline(folder)) for _ in range(args.repeat))
        best = float("inf")
        result = None
        for _ in range(args.repeat):
            t = time.perf_counter()
            result = inspect_checkpoint(folder)
            best = min(best, time.perf_counter() - t)
        assert result is not None
        t = time.perf_counter()
        cli = subprocess.run(
            [sys.executable, "-c", "from quantkit.cli.commands import main; main()", "inspect", str(folder), "--json"],
            capture_output=True,
            text=True,
        )
        cli_s = time.perf_counter() - t
        assert cli.returncode == 0, cli.stderr
        print(f"baseline (index + json.loads of every header): {base:.3f}s")
        print(f"inspect_checkpoint:                            {best:.3f}s  ({best / base:.1f}x baseline)")
        print(f"`quantkit inspect --json` (a new process):      {cli_s:.3f}s")
        for g in result.groups:
            print(f"  {g.pattern:55s} x{g.count:<3d} {g.precision:8s} {g.bytes / 1e9:9.2f} GB  {g.reason[:60]}")
        print("  bytes by precision:", {k: f"{v / 1e9:.1f} GB" for k, v in result.bytes_by_precision.items()})
    finally:
        if args.dir is None:
            shutil.rmtree(tmp, ignore_errors=True)


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


if __name__ == "__main__":
    main()
