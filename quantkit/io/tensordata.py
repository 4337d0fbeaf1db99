"""Reading single tensors' data from safetensors files with numpy only (no torch): scales, d2t/t2d, weights.

`quantkit check` reads the small tensors it must verify (weight scales, the draft's vocabulary maps) this way, so a
static check never imports torch. Values are decoded to numpy: floats (BF16, F16, F32, F8_E4M3) as float32, E8M0
scales and U8 as uint8, integers and BOOL as themselves.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np

from quantkit.errors import CheckpointError
from quantkit.io.safetensors import read_header

_NUMPY = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
          "U8": "u1", "U16": "<u2", "U32": "<u4", "U64": "<u8", "BOOL": "?", "F8_E8M0": "u1"}  # fmt: skip


def _e4m3fn_table() -> np.ndarray:
    """float32 value of every OCP FP8 E4M3FN byte (0x7F / 0xFF are NaN; no infinities)."""
    out = np.empty(256, dtype=np.float32)
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        exp, man = (b >> 3) & 0xF, b & 0x7
        if exp == 0xF and man == 0x7:
            out[b] = np.nan
        elif exp == 0:
            out[b] = sign * (man / 8.0) * 2.0**-6
        else:
            out[b] = sign * (1.0 + man / 8.0) * 2.0 ** (exp - 7)
    return out


E4M3FN = _e4m3fn_table()
# FP4 E2M1 value of each nibble (OCP MX): 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives.
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)


class TensorReader:
    """Reads tensors of one checkpoint folder by name; each shard's header is parsed once."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self._files: dict[str, tuple[int, dict[str, Any]]] = {}

    def _meta(self, file: str) -> tuple[int, dict[str, Any]]:
        if file not in self._files:
            path = self.folder / file
            header = read_header(path)
            with path.open("rb") as f:
                (header_len,) = struct.unpack("<Q", f.read(8))
            self._files[file] = (8 + header_len, header)
        return self._files[file]

    def raw(self, file: str, name: str) -> tuple[str, tuple[int, ...], bytes]:
        start, header = self._meta(file)
        entry = header.get(name)
        if entry is None:
            raise CheckpointError(f"{self.folder / file}: has no tensor {name!r}; the index is stale, regenerate it")
        begin, end = entry["data_offsets"]
        with (self.folder / file).open("rb") as f:
            f.seek(start + begin)
            data = f.read(end - begin)
        if len(data) != end - begin:
            raise CheckpointError(f"{self.folder / file}: tensor {name!r} is cut short; the file is truncated")
        return entry["dtype"], tuple(entry["shape"]), data

    def array(self, file: str, name: str) -> np.ndarray:
        """The tensor as numpy: float types as float32, others as stored (E8M0 as uint8)."""
        dtype, shape, data = self.raw(file, name)
        return decode(dtype, shape, data)


def decode(dtype: str, shape: tuple[int, ...], data: bytes) -> np.ndarray:
    if dtype == "BF16":
        u = np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16
        return u.view(np.float32).reshape(shape)
    if dtype == "F8_E4M3":
        return E4M3FN[np.frombuffer(data, dtype=np.uint8)].reshape(shape)
    np_dtype = _NUMPY.get(dtype)
    if np_dtype is None:
        raise CheckpointError(f"tensor dtype {dtype} cannot be decoded by quantkit")
    arr = np.frombuffer(data, dtype=np_dtype).reshape(shape)
    return arr.astype(np.float32) if arr.dtype.kind == "f" else arr


def dequantize_fp8(weight: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """FP8 weight (already decoded to float32) times its per-tensor / per-channel scale."""
    s = scale.astype(np.float32)
    if s.size == 1:
        return weight * s.reshape(())
    return weight * s.reshape(-1, 1)


def dequantize_mxfp4(packed: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """MXFP4 uint8 [out, in/2] (low nibble first) with E8M0 uint8 scales [out, in/32] -> float32 [out, in]."""
    out_dim, half = packed.shape
    values = np.empty((out_dim, half * 2), dtype=np.float32)
    values[:, 0::2] = E2M1[packed & 0x0F]
    values[:, 1::2] = E2M1[packed >> 4]
    exps = np.where(scale == 0xFF, np.nan, np.ldexp(np.float32(1), scale.astype(np.int32) - 127)).astype(np.float32)
    return (values.reshape(out_dim, -1, 32) * exps[:, :, None]).reshape(out_dim, half * 2)
