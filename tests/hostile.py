"""Builders of hostile inputs for tests/test_bad_inputs.py, and a runner of the real CLI in a subprocess.

Everything here is stdlib only (no torch, no safetensors): the files are made byte by byte, so a test can damage
exactly one field of an otherwise valid checkpoint copied from examples/tiny.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HEAVY = ("torch", "quark", "transformers", "vllm", "lm_eval")

# Runs `quantkit ARGS` as `python -m quantkit` does, with one addition: with QUANTKIT_TEST_FORBID_HEAVY=1 the first
# import of a heavy package (torch, Quark, transformers, vLLM, lm-eval) ends the process with status 97 and one
# line naming it. Errors whose information sits in the command line, a config or a header must be found before
# such an import (issue 10, item 5); this turns "it imported torch first" into a fast, explicit failure instead of a
# 30 s Quark import followed by whatever the command does next.
_PROBE = r"""
import importlib.abc, os, sys
if os.environ.get("QUANTKIT_TEST_FORBID_HEAVY") == "1":
    HEAVY = set(os.environ["QUANTKIT_TEST_HEAVY"].split(","))
    class _Forbid(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in HEAVY:
                os.write(2, ("heavy import before the error: %s\n" % name).encode())
                os._exit(97)
            return None
    sys.meta_path.insert(0, _Forbid())
import runpy
sys.argv[0] = "quantkit"
runpy.run_module("quantkit", run_name="__main__", alter_sys=True)
"""

FORBIDDEN_HEAVY_EXIT = 97


@dataclass
class Run:
    """What a CLI run did."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def run_cli(args: list[str], *, cwd: Path, stdin: bytes | None = None, env: dict[str, str] | None = None,
            forbid_heavy: bool = False, timeout: float = 600, preexec_fn: Callable[[], Any] | None = None) -> Run:
    """`quantkit ARGS` in a fresh interpreter: real exit status, real stdin, real signals."""
    full_env = {**os.environ, "QUARK_DISABLE_COMPILE": "1", "COLUMNS": "200", "HF_HUB_OFFLINE": "1",
                "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1", **(env or {})}
    full_env.pop("QUANTKIT_DEBUG", None)  # a traceback on demand would hide the one-line error under test
    cmd = [sys.executable, "-m", "quantkit", *args]
    if forbid_heavy:
        full_env.update(QUANTKIT_TEST_FORBID_HEAVY="1", QUANTKIT_TEST_HEAVY=",".join(HEAVY))
        cmd = [sys.executable, "-c", _PROBE, *args]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=full_env, stdin=subprocess.PIPE if stdin is not None else
                            subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=preexec_fn)
    try:
        out, err = proc.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"quantkit {' '.join(args)} still running after {timeout}s; stderr tail: "
                             f"{err.decode(errors='replace')[-2000:]}") from None
    return Run(args, proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"),
               time.perf_counter() - t0)


# --- digests ------------------------------------------------------------------------------------------------------


def tree_digest(path: Path) -> dict[str, str]:
    """sha256 of every file under `path` (or of `path` itself), symlinks recorded by target, not followed."""
    if path.is_symlink():
        return {".": "symlink:" + os.readlink(path)}
    if not path.exists():
        return {}
    if path.is_file():
        return {".": _sha256(path)}
    out: dict[str, str] = {}
    for root, dirs, files in os.walk(path):
        for name in sorted(dirs + files):
            p = Path(root) / name
            rel = str(p.relative_to(path))
            if p.is_symlink():
                out[rel] = "symlink:" + os.readlink(p)
            elif p.is_file():
                out[rel] = _sha256(p)
            elif p.is_dir():
                out[rel] = "dir"
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


# --- checkpoint copies and damage ---------------------------------------------------------------------------------


def copy_model(src: Path, dst: Path, *, drop: tuple[str, ...] = ()) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(*drop) if drop else None)
    return dst


def read_header(path: Path) -> tuple[dict[str, Any], bytes]:
    """(header, tensor data) of a safetensors file."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_safetensors(path: Path, header: dict[str, Any] | bytes, data: bytes = b"") -> None:
    """A safetensors file from a header (dict, or raw header bytes as stored) and the data bytes."""
    raw = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def set_dtype(path: Path, tensor: str, dtype: str) -> None:
    header, data = read_header(path)
    header[tensor]["dtype"] = dtype
    write_safetensors(path, header, data)


def set_header_length(path: Path, length: int) -> None:
    with open(path, "r+b") as f:
        f.write(struct.pack("<Q", length))


BF16_BITS = {"nan": 0x7FC0, "+inf": 0x7F80, "-inf": 0xFF80}


def poison_bf16(path: Path, tensor: str, index: tuple[int, int], value: str) -> None:
    """Write NaN / +Inf / -Inf (BF16 bit patterns) at `index` of a 2-D BF16 tensor, in place."""
    header, _ = read_header(path)
    entry = header[tensor]
    assert entry["dtype"] == "BF16" and len(entry["shape"]) == 2, entry
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
    flat = index[0] * entry["shape"][1] + index[1]
    with open(path, "r+b") as f:
        f.seek(8 + n + entry["data_offsets"][0] + 2 * flat)
        f.write(struct.pack("<H", BF16_BITS[value]))


def poison_f32_or_bf16_scalar(path: Path, tensor: str, value: float) -> None:
    """Set the first element of a float tensor (F32, BF16 or F16) to `value` (e.g. inf, nan), in place."""
    header, _ = read_header(path)
    entry = header[tensor]
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
    if entry["dtype"] == "F32":
        blob = struct.pack("<f", value)
    elif entry["dtype"] == "BF16":
        blob = struct.pack("<f", value)[2:]
    elif entry["dtype"] == "F16":
        blob = struct.pack("<e", value)
    else:
        raise ValueError(f"{tensor}: dtype {entry['dtype']}")
    with open(path, "r+b") as f:
        f.seek(8 + n + entry["data_offsets"][0])
        f.write(blob)


def nested_json(depth: int = 100_000) -> str:
    """Valid JSON nested `depth` lists deep: `[[[...]]]`."""
    return "[" * depth + "]" * depth


def alias_bomb_yaml(levels: int = 10, width: int = 10, prefix: str = "", key: str = "bomb") -> str:
    """'Billion laughs': `levels` anchors of `width` aliases each (width**levels leaves), under `key`."""
    lines = [prefix.rstrip("\n")] if prefix else []
    lines.append("x0: &x0 [" + ", ".join(['"lol"'] * width) + "]")
    for i in range(1, levels):
        lines.append(f"x{i}: &x{i} [" + ", ".join([f"*x{i - 1}"] * width) + "]")
    lines.append(f"{key}: *x{levels - 1}")
    return "\n".join(lines) + "\n"


def evil_module(folder: Path, module: str, marker: Path) -> None:
    """A Python file that, if anything imports it, writes `marker` (and defines the class names asked for)."""
    (folder / f"{module}.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
        "class EvilTokenizer:\n    pass\n"
        "class EvilConfig:\n    pass\n"
        "class EvilModel:\n    pass\n"
    )


def add_remote_code(folder: Path, marker: Path) -> None:
    """auto_map entries in tokenizer_config.json and config.json pointing at local code that writes `marker`."""
    evil_module(folder, "tokenization_evil", marker)
    evil_module(folder, "configuration_evil", marker)
    evil_module(folder, "modeling_evil", marker)
    tok = json.loads((folder / "tokenizer_config.json").read_text())
    # Only auto_map can resolve this class: transformers then asks whether to run the folder's code (and a `yes y |`
    # on stdin would answer).
    tok["tokenizer_class"] = "EvilTokenizer"
    tok["auto_map"] = {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", "tokenization_evil.EvilTokenizer"]}
    (folder / "tokenizer_config.json").write_text(json.dumps(tok, indent=2))
    cfg = json.loads((folder / "config.json").read_text())
    cfg["auto_map"] = {"AutoConfig": "configuration_evil.EvilConfig",
                       "AutoModelForCausalLM": "modeling_evil.EvilModel"}
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))


def evil_pickle(marker: Path) -> bytes:
    """A pickle whose loading runs `open(marker, 'w')` (protocol 2, built by hand: no pickling of callables)."""
    # GLOBAL builtins.open; args (marker, 'w'); REDUCE; STOP
    path = str(marker).encode()
    return (b"\x80\x02cbuiltins\nopen\nq\x00X" + struct.pack("<I", len(path)) + path
            + b"X\x01\x00\x00\x00wq\x01\x86q\x02Rq\x03.")


def pickle_only_folder(src: Path, dst: Path, marker: Path) -> Path:
    """A checkpoint folder with config.json, tokenizer and a hostile pytorch_model.bin, and no safetensors."""
    copy_model(src, dst, drop=("*.safetensors", "model.safetensors.index.json"))
    (dst / "pytorch_model.bin").write_bytes(evil_pickle(marker))
    return dst


def fake_quantkit_output(src: Path, dst: Path) -> Path:
    """A folder that passes publish's "written by quantkit apply" test without Quark: quantkit.json and a Quark
    quantization_config. For cases that are about publish's other inputs (repo id, report)."""
    copy_model(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "quark", "export": {"kv_cache_group": []},
                                  "global_quant_config": {}, "layer_quant_config": {},
                                  "layer_type_quant_config": {}, "exclude": ["lm_head"]}
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    manifest = {"quantkit_manifest_version": 1, "layers": [], "model_kind": "dense-target", "source": str(src),
                "recipe": {"name": "fp8-target"}, "architecture": "LlamaForCausalLM"}
    (dst / "quantkit.json").write_text(json.dumps(manifest, indent=2))
    return dst


def error_lines(stderr: str, prefix: str = "error:") -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(prefix)]
