# tier: unit
"""Issue 18, data integrity without a process: safetensors headers judged as safetensors' own loader judges them, the executor's index rules and a damaged journal as one line (the CLI and lock cases are in tests/e2e/test_safety_integrity.py)."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TINY
from tests.fixtures import hostile
from tests.fixtures.hostile import tree_digest

MOE = TINY / "moe-target"


SHARD1, SHARD2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"


INDEX = "model.safetensors.index.json"


JOURNAL = ".quantkit-journal.json"


def _st(header: dict[str, Any] | bytes, data: bytes = b"", pad: bool = True) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    if pad:
        raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + data


def _t(dtype: str, shape: list[Any], begin: Any, end: Any) -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def _raw(text: bytes, data: bytes = b"\0" * 8) -> bytes:
    return _st(text, data)


A8 = b'"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]'  # a valid 8-byte tensor entry, without its closing brace


DEEP = 125  # serde_json's recursion limit is 128 levels: the header (1) and the entry (2) hold the rest


def _real_file() -> bytes:
    import torch
    from safetensors.torch import save

    return save(
        {
            "w": torch.ones(3, 5, dtype=torch.bfloat16),
            "b": torch.zeros(4),
            "s": torch.tensor(2.0),
            "e": torch.zeros(0, 3),
            "m": torch.zeros(2, dtype=torch.bool),
        },
        metadata={"format": "pt"},
    )


# (id, file bytes): each damaged the way a bad disk, a buggy writer or an attacker would, plus valid oddities.
HEADER_CASES: list[tuple[str, Callable[[], bytes]]] = [
    ("valid", lambda: _st({"a": _t("F32", [2], 0, 8)}, b"\0" * 8)),
    ("real-file-from-safetensors", _real_file),
    ("real-file-truncated", lambda: _real_file()[:-3]),
    ("real-file-one-byte-appended", lambda: _real_file() + b"\0"),
    (
        "two-tensors-share-one-byte-range",
        lambda: _st({"a": _t("F32", [2], 0, 8), "b": _t("F32", [2], 0, 8)}, b"\0" * 8),
    ),
    ("partial-overlap", lambda: _st({"a": _t("F32", [2], 0, 8), "b": _t("F32", [2], 4, 12)}, b"\0" * 12)),
    ("tensor-inside-another", lambda: _st({"a": _t("F32", [4], 0, 16), "b": _t("F32", [2], 4, 12)}, b"\0" * 16)),
    ("gap-between-tensors", lambda: _st({"a": _t("F32", [2], 0, 8), "b": _t("F32", [2], 12, 20)}, b"\0" * 20)),
    ("first-tensor-not-at-0", lambda: _st({"a": _t("F32", [2], 4, 12)}, b"\0" * 12)),
    ("tensor-end-runs-past-the-file", lambda: _st({"a": _t("F32", [2], 0, 8)}, b"\0" * 4)),
    ("trailing-bytes-after-the-last-tensor", lambda: _st({"a": _t("F32", [2], 0, 8)}, b"\0" * 9)),
    ("size-not-numel-times-dtype", lambda: _st({"a": _t("F32", [3], 0, 8)}, b"\0" * 8)),
    ("end-before-begin", lambda: _st({"a": _t("F32", [0], 8, 0)}, b"\0" * 8)),
    (
        "offsets-out-of-order-in-the-header",
        lambda: _st({"b": _t("F32", [2], 8, 16), "a": _t("F32", [2], 0, 8)}, b"\0" * 16),
    ),
    (
        "empty-tensors-at-one-offset",
        lambda: _st({"a": _t("F32", [0], 0, 0), "b": _t("F32", [0, 4], 0, 0), "c": _t("F32", [2], 0, 8)}, b"\0" * 8),
    ),
    (
        "empty-tensor-between-two",
        lambda: _st({"a": _t("F32", [2], 0, 8), "e": _t("F32", [0], 8, 8), "c": _t("F32", [2], 8, 16)}, b"\0" * 16),
    ),
    ("scalar", lambda: _st({"a": _t("F32", [], 0, 4)}, b"\0" * 4)),
    ("no-tensors", lambda: _st({})),
    ("metadata-only", lambda: _raw(b'{"__metadata__":{"a":"b"}}', b"")),
    ("metadata-only-with-data", lambda: _raw(b'{"__metadata__":{"a":"b"}}', b"\0")),
    ("header-length-0", lambda: struct.pack("<Q", 0)),
    ("header-length-2**60", lambda: struct.pack("<Q", 2**60) + b"{}"),
    ("header-length-over-100MB", lambda: struct.pack("<Q", 100_000_001) + b"{}"),
    ("header-length-past-the-file", lambda: struct.pack("<Q", 100) + b"{}"),
    ("file-of-7-bytes", lambda: b"\0" * 7),
    ("header-not-utf8", lambda: _raw(b'{"a\xff":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}')),
    ("header-with-utf8-bom", lambda: _raw(b"\xef\xbb\xbf{" + A8 + b"}}")),
    ("header-padded-with-nul", lambda: _st(b"{" + A8 + b"}}\0\0\0\0\0\0\0", b"\0" * 8, pad=False)),
    ("header-padded-with-whitespace", lambda: _st(b"{" + A8 + b"}}\t\n\r ", b"\0" * 8, pad=False)),
    ("leading-whitespace", lambda: _raw(b" {" + A8 + b"}}")),
    ("header-only-whitespace", lambda: _raw(b"        ", b"")),
    ("json-after-the-object", lambda: _raw(b"{" + A8 + b"}} x")),
    ("header-a-json-list", lambda: _raw(b"[]", b"")),
    ("header-null", lambda: _raw(b"null", b"")),
    ("unknown-dtype", lambda: _st({"a": _t("F99", [2], 0, 8)}, b"\0" * 8)),
    ("lowercase-dtype", lambda: _st({"a": _t("f32", [2], 0, 8)}, b"\0" * 8)),
    ("dtype-a-number", lambda: _st({"a": {"dtype": 5, "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8)),
    (
        "every-dtype-safetensors-0.8-knows",
        lambda: _st(
            {
                f"t{i}": _t(d, [8], 8 * i, 8 * i + 8)
                for i, d in enumerate(
                    ["BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ"]
                )
            },
            b"\0" * 64,
        ),
    ),
    (
        "wide-dtypes",
        lambda: _st(
            {
                "c": _t("C64", [1], 0, 8),
                "d": _t("F64", [1], 8, 16),
                "u": _t("U64", [1], 16, 24),
                "i": _t("I16", [2], 24, 28),
                "h": _t("U16", [2], 28, 32),
            },
            b"\0" * 32,
        ),
    ),
    ("F4-whole-bytes", lambda: _st({"a": _t("F4", [2, 3], 0, 3)}, b"\0" * 3)),
    ("F4-odd-number-of-values", lambda: _st({"a": _t("F4", [3], 0, 2)}, b"\0" * 2)),
    ("F6-whole-bytes", lambda: _st({"a": _t("F6_E2M3", [4], 0, 3)}, b"\0" * 3)),
    ("F6-partial-byte", lambda: _st({"a": _t("F6_E3M2", [3], 0, 3)}, b"\0" * 3)),
    ("shape-bool", lambda: _st({"a": _t("F32", [True, 2], 0, 8)}, b"\0" * 8)),
    ("shape-float", lambda: _st({"a": _t("F32", [2.0], 0, 8)}, b"\0" * 8)),
    ("shape-exponent-integer", lambda: _raw(b'{"a":{"dtype":"F32","shape":[2e0],"data_offsets":[0,8]}}')),
    ("shape-negative", lambda: _st({"a": _t("F32", [-2], 0, 8)}, b"\0" * 8)),
    ("shape-minus-zero", lambda: _raw(b'{"a":{"dtype":"F32","shape":[-0,2],"data_offsets":[0,0]}}', b"")),
    ("shape-string", lambda: _st({"a": _t("F32", ["2"], 0, 8)}, b"\0" * 8)),
    ("shape-null", lambda: _raw(b'{"a":{"dtype":"F32","shape":null,"data_offsets":[0,8]}}')),
    ("shape-nested", lambda: _st({"a": _t("F32", [[2]], 0, 8)}, b"\0" * 8)),
    ("shape-2**64", lambda: _st({"a": _t("F32", [2**64, 0], 0, 0)})),
    ("shape-2**64-1-then-0", lambda: _st({"a": _t("F32", [2**64 - 1, 0], 0, 0)})),
    ("shape-product-overflows-before-its-0", lambda: _st({"a": _t("F32", [2**32, 2**32, 0], 0, 0)})),
    ("shape-0-first-then-huge", lambda: _st({"a": _t("F32", [0, 2**63, 2**63], 0, 0)})),
    ("offsets-three", lambda: _raw(b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,9]}}')),
    ("offsets-an-object", lambda: _raw(b'{"a":{"dtype":"F32","shape":[2],"data_offsets":{"0":0,"1":8}}}')),
    ("offsets-float", lambda: _raw(b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8.0]}}')),
    ("offset-2**64", lambda: _st({"a": _t("F32", [0], 2**64, 2**64)})),
    ("missing-shape", lambda: _raw(b'{"a":{"dtype":"F32","data_offsets":[0,8]}}')),
    ("entry-empty-object", lambda: _raw(b'{"a":{}}', b"")),
    ("entry-a-number", lambda: _raw(b'{"a":5}', b"")),
    ("entry-null", lambda: _raw(b'{"a":null}', b"")),
    ("entry-as-a-3-element-array", lambda: _raw(b'{"a":["F32",[2],[0,8]]}')),
    ("entry-as-a-4-element-array", lambda: _raw(b'{"a":["F32",[2],[0,8],1]}')),
    ("entry-as-an-array-bad-dtype", lambda: _raw(b'{"a":["F99",[2],[0,8]]}')),
    ("entry-with-an-extra-field", lambda: _st({"a": {**_t("F32", [2], 0, 8), "x": [1, {"y": 2}]}}, b"\0" * 8)),
    ("entry-gives-dtype-twice", lambda: _raw(b'{"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}}')),
    ("tensor-named-twice-identically", lambda: _raw(b"{" + A8 + b"}," + A8 + b"}}")),
    (
        "tensor-named-twice-other-range",
        lambda: _raw(b"{" + A8 + b'},"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}', b"\0" * 16),
    ),
    (
        "tensor-named-twice-first-malformed",
        lambda: _raw(b'{"a":{"dtype":"F99","shape":[2],"data_offsets":[0,8]},' + A8 + b"}}"),
    ),
    (
        "tensor-named-twice-last-wins",
        lambda: _raw(b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},' + A8 + b"}}"),
    ),
    ("empty-tensor-name", lambda: _st({"": _t("F32", [2], 0, 8)}, b"\0" * 8)),
    ("name-like-metadata", lambda: _st({"__metadata": _t("F32", [2], 0, 8)}, b"\0" * 8)),
    ("metadata-null", lambda: _st({"__metadata__": None, "a": _t("F32", [2], 0, 8)}, b"\0" * 8)),
    ("metadata-number-value", lambda: _st({"__metadata__": {"x": 1}, "a": _t("F32", [2], 0, 8)}, b"\0" * 8)),
    ("metadata-null-value", lambda: _st({"__metadata__": {"x": None}, "a": _t("F32", [2], 0, 8)}, b"\0" * 8)),
    ("metadata-nested", lambda: _st({"__metadata__": {"x": {"y": "z"}}, "a": _t("F32", [2], 0, 8)}, b"\0" * 8)),
    ("metadata-a-list", lambda: _st({"__metadata__": [], "a": _t("F32", [2], 0, 8)}, b"\0" * 8)),
    ("metadata-a-string", lambda: _st({"__metadata__": "x", "a": _t("F32", [2], 0, 8)}, b"\0" * 8)),
    ("metadata-twice", lambda: _raw(b'{"__metadata__":{"a":"b"},"__metadata__":{"a":"c"},' + A8 + b"}}")),
    ("metadata-key-twice", lambda: _raw(b'{"__metadata__":{"a":"b","a":"c"},' + A8 + b"}}")),
    ("metadata-key-twice-first-a-number", lambda: _raw(b'{"__metadata__":{"a":1,"a":"c"},' + A8 + b"}}")),
    ("NaN-in-an-extra-field", lambda: _raw(b"{" + A8 + b',"x":NaN}}')),
    ("Infinity-in-an-extra-field", lambda: _raw(b"{" + A8 + b',"x":Infinity}}')),
    ("float-1e400", lambda: _raw(b"{" + A8 + b',"x":1e400}}')),
    ("float-1e300", lambda: _raw(b"{" + A8 + b',"x":1e300}}')),
    ("float-1e-400", lambda: _raw(b"{" + A8 + b',"x":1e-400}}')),
    ("integer-of-309-digits", lambda: _raw(b"{" + A8 + b',"x":1' + b"0" * 308 + b"}}")),
    ("integer-of-310-digits", lambda: _raw(b"{" + A8 + b',"x":1' + b"0" * 309 + b"}}")),
    ("integer-of-5000-digits", lambda: _raw(b"{" + A8 + b',"x":1' + b"0" * 4999 + b"}}")),
    ("integer-u64-max", lambda: _raw(b"{" + A8 + b',"x":18446744073709551615}}')),
    ("integer-below-i64", lambda: _raw(b"{" + A8 + b',"x":-9223372036854775809}}')),
    ("nesting-127-levels", lambda: _raw(b"{" + A8 + b',"x":' + b"[" * DEEP + b"]" * DEEP + b"}}")),
    ("nesting-128-levels", lambda: _raw(b"{" + A8 + b',"x":' + b"[" * (DEEP + 1) + b"]" * (DEEP + 1) + b"}}")),
    ("nesting-100000-levels", lambda: _raw(b"{" + A8 + b',"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}}")),
    ("control-character-in-a-name", lambda: _raw(b'{"a\x01":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}')),
    ("surrogate-pair-name", lambda: _raw(b'{"\\ud83d\\ude00":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}')),
    ("lone-surrogate-name", lambda: _raw(b'{"\\ud800":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}')),
    ("lone-surrogate-in-an-extra-field", lambda: _raw(b"{" + A8 + b',"x":"\\udc00"}}')),
    ("escaped-backslash-before-u", lambda: _raw(b'{"\\\\ud800":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}')),
]


def _safetensors_accepts(path: Path) -> bool:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="np"):
            return True
    except Exception:  # noqa: BLE001 - any refusal (SafetensorError, OSError, ...) is a refusal
        return False


def test_the_header_cases_are_a_real_test() -> None:
    """Enough files on both sides of safetensors' verdict, so agreeing with it cannot be trivial."""
    assert len(HEADER_CASES) >= 90 and len({name for name, _ in HEADER_CASES}) == len(HEADER_CASES)


@pytest.mark.parametrize("name,make", HEADER_CASES, ids=[n for n, _ in HEADER_CASES])
def test_header_verdict_is_safetensors_verdict(tmp_path: Path, name: str, make: Callable[[], bytes]) -> None:
    """Both header readers (quantkit.io.headers for inspect/check/planning, the shard executor's) refuse exactly the
    files safetensors' own loader refuses, in one line naming the file."""
    from quantkit.apply.shards import CorruptShardError, ExecutorError
    from quantkit.apply.shards.f2f import read_shard_header as _read_header_file
    from quantkit.errors import CheckpointError
    from quantkit.io.headers import read_header

    path = tmp_path / f"{name}.safetensors"
    path.write_bytes(make())
    reference = _safetensors_accepts(path)
    try:
        read_header(path)
        ours, message = True, ""
    except CheckpointError as e:
        ours, message = False, str(e)
    assert ours == reference, f"safetensors {'accepts' if reference else 'refuses'} it, quantkit: {message!r}"
    if not ours:
        assert "\n" not in message and str(path) in message and len(message) < 600
    try:
        _read_header_file(path)
        executor = True
    except CorruptShardError:
        executor = False
    except ExecutorError as e:  # a dtype the native executor does not handle (F4, F6): not a corrupt file
        assert reference and "does not handle" in str(e), str(e)
        executor = True
    assert executor == reference


def _by_offset(header: dict[str, Any]) -> list[str]:
    return sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"])


def _consolidated(folder: Path) -> tuple[dict[str, Any], bytes]:
    """Every tensor of `folder`'s shards in one file, as Mistral's `consolidated.safetensors` holds them."""
    header: dict[str, Any] = {}
    data = b""
    for shard in (SHARD1, SHARD2):
        h, d = hostile.read_header(folder / shard)
        for name in _by_offset(h):
            begin, end = h[name]["data_offsets"]
            header[name] = {**h[name], "data_offsets": [len(data), len(data) + end - begin]}
            data += d[begin:end]
    return header, data


def test_executor_follows_the_index_and_refuses_overlapping_unindexed_shards(tmp_path: Path) -> None:
    """The library path (quantize_checkpoint) holds the same rules as apply's plan."""
    from quantkit.apply.shards import quantize_checkpoint
    from quantkit.apply.shards.f2f import find_shards
    from quantkit.errors import CheckpointError

    src = hostile.copy_model(MOE, tmp_path / "src")
    hostile.write_safetensors(src / "consolidated.safetensors", *_consolidated(src))
    assert sorted(find_shards(src)) == [SHARD1, SHARD2]
    (src / INDEX).unlink()
    with pytest.raises(CheckpointError, match="is in both"):
        quantize_checkpoint(
            src, tmp_path / "out", scheme="mxfp4", exclude=["lm_head"], layer_config=None, devices=["cpu"]
        )
    assert not (tmp_path / "out").exists()


def _journal_key(src: Path) -> dict[str, Any]:
    from quantkit import __version__

    return {
        "source": str(src.resolve()),
        "scheme": "mxfp4",
        "exclude": [],
        "layer_config": {},
        "drop": [],
        "source_format": None,
        "model_dtype": "bfloat16",
        "quantkit_version": __version__,
    }


_ENTRY = {
    "name": SHARD1,
    "bytes_in": 10,
    "bytes_out": 5,
    "sha256_in": "0" * 64,
    "sha256_out": "0" * 64,
    "tensors": 1,
    "quantized": 1,
    "seconds": 0.1,
    "device": "cpu",
    "resumed": False,
    "weight_map": ["w"],
}


BAD_JOURNALS: dict[str, Callable[[Path], bytes]] = {
    "a-json-list": lambda src: b"[]",
    "shards-a-list": lambda src: json.dumps({"quantkit_journal": 2, **_journal_key(src), "shards": []}).encode(),
    "entry-without-bytes_out": lambda src: json.dumps(
        {
            "quantkit_journal": 2,
            **_journal_key(src),
            "shards": {SHARD1: {k: v for k, v in _ENTRY.items() if k != "bytes_out"}},
        }
    ).encode(),
    "entry-a-string": lambda src: json.dumps(
        {"quantkit_journal": 2, **_journal_key(src), "shards": {SHARD1: "done"}}
    ).encode(),
    "bytes_out-a-string": lambda src: json.dumps(
        {"quantkit_journal": 2, **_journal_key(src), "shards": {SHARD1: {**_ENTRY, "bytes_out": "5"}}}
    ).encode(),
    "sha256-not-hex": lambda src: json.dumps(
        {"quantkit_journal": 2, **_journal_key(src), "shards": {SHARD1: {**_ENTRY, "sha256_in": "z" * 64}}}
    ).encode(),
    "entry-under-another-name": lambda src: json.dumps(
        {"quantkit_journal": 2, **_journal_key(src), "shards": {SHARD2: _ENTRY}}
    ).encode(),
    "5000-digit-integer": lambda src: b'{"quantkit_journal": 2, "shards": {}, "x": 1' + b"0" * 4999 + b"}",
    "5000-digit-bytes_out": lambda src: (
        json.dumps({"quantkit_journal": 2, **_journal_key(src), "shards": {SHARD1: {**_ENTRY, "bytes_out": 0}}})
        .encode()
        .replace(b'"bytes_out": 0', b'"bytes_out": 1' + b"0" * 4999)
    ),
    "not-json": lambda src: b"{not json",
    "not-utf8": lambda src: b'{"quantkit_journal": "\xff"}',
    "nested-100000-deep": lambda src: hostile.nested_json().encode(),
    "empty-file": lambda src: b"",
    "from-a-different-source": lambda src: json.dumps(
        {"quantkit_journal": 2, **_journal_key(src), "source": "/models/another-model", "shards": {}}
    ).encode(),
    "from-a-different-scheme": lambda src: json.dumps(
        {"quantkit_journal": 2, **_journal_key(src), "scheme": "ptpc_fp8", "shards": {}}
    ).encode(),
    "from-an-older-quantkit": lambda src: json.dumps(
        {"quantkit_journal": 1, "source": str(src.resolve()), "shards": {}}
    ).encode(),
}


def _bad_journal(tmp_path: Path, case: str) -> tuple[Path, Path, dict[Path, dict[str, str]]]:
    out = tmp_path / "out"
    partial = tmp_path / ".out.quantkit-partial"
    partial.mkdir()
    (partial / JOURNAL).write_bytes(BAD_JOURNALS[case](MOE))
    return out, partial, {p: tree_digest(p) for p in (MOE, partial)}


@pytest.mark.parametrize("case", list(BAD_JOURNALS))
def test_a_bad_journal_is_one_line_naming_the_fix(tmp_path: Path, case: str) -> None:
    """In process (one torch import for all cases); the CLI's exit code and output are the next test's."""
    from quantkit.apply.run import apply
    from quantkit.errors import QuantkitError

    out, partial, before = _bad_journal(tmp_path, case)
    with pytest.raises(QuantkitError) as e:
        apply("mxfp4-moe", MOE, out, devices="cpu", resume=True)
    line = str(e.value)
    assert e.value.exit_code == 2 and "\n" not in line and len(line) < 600
    assert JOURNAL in line and "--overwrite" in line, line
    assert "resume with" not in line  # resuming again cannot fix a journal
    assert not out.exists()
    assert {p: tree_digest(p) for p in before} == before  # the partial folder is left for the user to decide
