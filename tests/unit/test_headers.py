"""The stdlib safetensors header reader, checked against files written and read by the real safetensors library."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from quantkit.errors import CheckpointError
from quantkit.io.headers import INDEX_FILE, TensorInfo, checkpoint_tensors, read_header, safetensors_files

TENSORS: dict[str, tuple[torch.dtype, tuple[int, ...], str]] = {
    "w.f32": (torch.float32, (3, 5), "F32"),
    "w.bf16": (torch.bfloat16, (4, 8), "BF16"),
    "w.f16": (torch.float16, (2, 2, 2), "F16"),
    "w.fp8": (torch.float8_e4m3fn, (16, 32), "F8_E4M3"),
    "w.mxfp4_packed": (torch.uint8, (16, 16), "U8"),
    "ids.i64": (torch.int64, (7,), "I64"),
    "mask.bool": (torch.bool, (3,), "BOOL"),
    "scale.scalar": (torch.float32, (), "F32"),
    "empty": (torch.float32, (0, 3), "F32"),
}


def _tensors() -> dict[str, torch.Tensor]:
    return {name: torch.zeros(shape, dtype=torch.float32).to(dtype) for name, (dtype, shape, _) in TENSORS.items()}


@pytest.fixture
def real_file(tmp_path: Path) -> Path:
    path = tmp_path / "model.safetensors"
    save_file(_tensors(), str(path), metadata={"format": "pt"})
    return path


def _assert_one_line(error: pytest.ExceptionInfo[CheckpointError], *fragments: str) -> None:
    message = str(error.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message


def test_header_matches_safetensors_library(real_file: Path) -> None:
    header = read_header(real_file)
    assert header["__metadata__"] == {"format": "pt"}
    assert set(header) - {"__metadata__"} == set(TENSORS)
    with safe_open(str(real_file), framework="pt") as f:
        for name, (_, shape, dtype) in TENSORS.items():
            assert header[name]["dtype"] == dtype == f.get_slice(name).get_dtype()
            assert header[name]["shape"] == list(shape) == f.get_slice(name).get_shape()


def test_single_file_checkpoint(real_file: Path) -> None:
    tensors = checkpoint_tensors(real_file.parent)
    assert tensors == {
        name: TensorInfo("model.safetensors", dtype, shape) for name, (_, shape, dtype) in TENSORS.items()
    }


def _sharded(folder: Path) -> dict[str, str]:
    tensors = _tensors()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[:4], "model-00002-of-00002.safetensors": names[4:]}
    weight_map = {}
    for file, members in shards.items():
        save_file({n: tensors[n] for n in members}, str(folder / file))
        weight_map |= {n: file for n in members}
    (folder / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": 1}, "weight_map": weight_map}))
    return weight_map


def test_sharded_checkpoint_follows_index(tmp_path: Path) -> None:
    weight_map = _sharded(tmp_path)
    save_file({"stray": torch.zeros(1)}, str(tmp_path / "unindexed.safetensors"))  # not in the index: ignored
    tensors = checkpoint_tensors(tmp_path)
    assert {name: t.file for name, t in tensors.items()} == weight_map
    assert tensors["w.bf16"] == TensorInfo(weight_map["w.bf16"], "BF16", (4, 8))
    assert safetensors_files(tmp_path) == sorted(set(weight_map.values()))


def test_stale_index_is_an_error(tmp_path: Path) -> None:
    weight_map = _sharded(tmp_path)
    weight_map["w.gone"] = "model-00001-of-00002.safetensors"
    (tmp_path / INDEX_FILE).write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(CheckpointError) as error:
        checkpoint_tensors(tmp_path)
    _assert_one_line(error, INDEX_FILE, "'w.gone'", "stale")


def test_index_naming_a_missing_shard_is_an_error(tmp_path: Path) -> None:
    _sharded(tmp_path)
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError) as error:
        checkpoint_tensors(tmp_path)
    _assert_one_line(error, INDEX_FILE, "model-00002-of-00002.safetensors, which is missing")


def test_bad_index_json_is_an_error(tmp_path: Path) -> None:
    _sharded(tmp_path)
    (tmp_path / INDEX_FILE).write_text("{ not json")
    with pytest.raises(CheckpointError) as error:
        checkpoint_tensors(tmp_path)
    _assert_one_line(error, str(tmp_path / INDEX_FILE), "not valid JSON")


def test_tensor_in_two_unindexed_files_is_an_error(tmp_path: Path) -> None:
    save_file({"w": torch.zeros(2)}, str(tmp_path / "a.safetensors"))
    save_file({"w": torch.zeros(2)}, str(tmp_path / "b.safetensors"))
    with pytest.raises(CheckpointError) as error:
        checkpoint_tensors(tmp_path)
    _assert_one_line(error, "'w' is in both a.safetensors and b.safetensors")


def test_the_first_fault_in_shard_order_is_the_one_named(tmp_path: Path) -> None:
    """Every header is read before placement is checked; a fault in an earlier shard is still the one reported, as
    when each shard was checked as it was read: a misplaced tensor, then a damaged later shard."""
    weight_map = _sharded(tmp_path)
    first, second = sorted(set(weight_map.values()))
    moved = next(name for name, file in weight_map.items() if file == first)
    (tmp_path / INDEX_FILE).write_text(json.dumps({"weight_map": {**weight_map, moved: second}}))
    (tmp_path / second).write_bytes(b"\x10" + bytes(7))  # a header length beyond the file
    with pytest.raises(CheckpointError) as error:
        checkpoint_tensors(tmp_path)
    _assert_one_line(error, first, repr(moved), f"places in {second}")
    for name in ("a", "b", "c"):  # without an index: a tensor in two files, then a damaged third
        save_file({"w": torch.zeros(2)}, str(tmp_path / f"{name}.safetensors"))
    (tmp_path / INDEX_FILE).unlink()
    for file in (first, second):
        (tmp_path / file).unlink()
    (tmp_path / "c.safetensors").write_bytes(b"\x10" + bytes(7))
    with pytest.raises(CheckpointError) as error:
        checkpoint_tensors(tmp_path)
    _assert_one_line(error, "'w' is in both a.safetensors and b.safetensors")


def test_folder_without_safetensors_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError) as error:
        checkpoint_tensors(tmp_path)
    _assert_one_line(error, str(tmp_path), "no .safetensors files")
    with pytest.raises(CheckpointError) as error:
        checkpoint_tensors(tmp_path / "nowhere")
    _assert_one_line(error, "checkpoint folder not found")


def _raw(path: Path, header: bytes | object, data: bytes = b"", length: int | None = None) -> Path:
    body = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(body) if length is None else length) + body + data)
    return path


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        pytest.param(lambda f: f.write_bytes(f.read_bytes()[:4]) and f, "only 4 bytes", id="shorter-than-8-bytes"),
        pytest.param(lambda f: f.write_bytes(f.read_bytes()[:40]) and f, "header length", id="cut-in-header"),
        pytest.param(lambda f: f.write_bytes(f.read_bytes()[:-10]) and f, "outside the file", id="cut-in-data"),
        pytest.param(lambda f: _raw(f, b"{not json!"), "not valid JSON", id="bad-json"),
        pytest.param(lambda f: _raw(f, b"\xff\xfe{}"), "not valid JSON", id="not-utf8"),
        pytest.param(lambda f: _raw(f, [1, 2]), "JSON list, not an object", id="json-array"),
        pytest.param(lambda f: _raw(f, b"{}", length=2**62), "does not fit", id="absurd-length"),
        pytest.param(lambda f: _raw(f, b"", length=0), "does not fit", id="zero-length"),
        pytest.param(lambda f: _raw(f, {"w": {"dtype": "F32"}}), "'w' header entry is malformed", id="no-shape"),
        pytest.param(
            lambda f: _raw(f, {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4),
            "spans 4 bytes",
            id="shape-vs-bytes",
        ),
    ],
)
def test_corrupt_file_is_one_line_checkpoint_error(real_file: Path, make: object, fragment: str) -> None:
    path = make(real_file)  # type: ignore[operator]
    with pytest.raises(CheckpointError) as error:
        read_header(path)
    _assert_one_line(error, str(real_file), fragment)


def test_missing_file_is_a_checkpoint_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError) as error:
        read_header(tmp_path / "nope.safetensors")
    _assert_one_line(error, "nope.safetensors: file not found")


def test_a_header_damaged_after_it_was_read_is_refused(real_file: Path) -> None:
    # Headers are validated once per process (io.safetensors caches them by file size and header bytes): a file that
    # changes afterwards, even to the same size, must be validated afresh, never answered from the cache.
    assert read_header(real_file)["w.f16"]["dtype"] == "F16"
    raw = real_file.read_bytes()
    assert raw.count(b'"F16"') == 1
    real_file.write_bytes(raw.replace(b'"F16"', b'"Q16"'))
    assert real_file.stat().st_size == len(raw)
    with pytest.raises(CheckpointError) as error:
        read_header(real_file)
    _assert_one_line(error, str(real_file), "'w.f16'", "dtype 'Q16'")
    real_file.write_bytes(raw)
    assert read_header(real_file)["w.f16"]["dtype"] == "F16"


def test_a_cached_header_is_not_changed_by_its_readers(real_file: Path) -> None:
    from quantkit.io.safetensors import read_parsed_header

    first = read_parsed_header(real_file)
    expected = list(first.entries)
    first.entries.clear()
    first.listed.clear()
    again = read_parsed_header(real_file)
    assert again.entries == expected
    assert [e.name for e in again.listed] == [n for n in read_header(real_file) if n != "__metadata__"]
    with safe_open(str(real_file), framework="pt") as f:
        assert {e.name for e in again.entries} == set(f.keys())


S1, S2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
INDEXES = [
    f'{{"metadata": {{"total_size": 8}}, "weight_map": {{"a": "{S1}", "b": "{S2}"}}}}',
    f'{{"weight_map": {{"a": "{S1}", "a": "{S2}"}}}}',  # a tensor named twice
    f'{{"weight_map": {{"a": "{S1}", "a": "{S1}"}}}}',  # twice, in the same shard
    f'{{"weight_map": {{"a": "{S1}"}}, "weight_map": {{"b": "{S2}"}}}}',  # the weight map twice
    f'{{"metadata": {{"k": 1, "k": 2}}, "weight_map": {{"a": "{S1}"}}}}',  # a metadata key twice
    f'{{"metadata": {{"k": ["x", {{"y": "z"}}]}}, "weight_map": {{"a": "{S1}"}}}}',  # strings nested in metadata
    f'{{"weight_map": {{"a": "{S1}", "a": 1}}}}',  # a name twice, the last no file name
    f'{{"weight_map": {{"a": "{S1}", "b": null}}}}',
    f'{{"weight_map": {{"a": "{S1}", "b": ["{S1}"]}}}}',  # a list as a file name
    f'{{"weight_map": {{"a": "{S1}", "b": 2}}}}',
    f'{{"weight_map": {{"a\\"b": "{S1}"}}}}',  # an escaped quote
    f'{{"weight_map": {{"a": "{S1}", "\\u0061": "{S2}"}}}}',  # a name twice, once escaped
    f'{{"weight_map": {{"a": "sub/{S1}"}}}}',
    f'{{"weight_map": ["{S1}"]}}',
    f'["{S1}"]',
    f'{{"weight_map": {{"a": "{S1}"}}',  # truncated
    f'{{"metadata": {{"total_size": {"9" * 5000}}}, "weight_map": {{"a": "{S1}"}}}}',
]


def _index_result(folder: Path) -> dict[str, str] | str:
    import quantkit.io.headers as headers

    headers._INDEXES.clear()
    try:
        return headers.read_index(folder)  # type: ignore[return-value]
    except CheckpointError as e:
        return str(e)


@pytest.mark.parametrize("text", INDEXES)
def test_the_plain_index_reader_agrees_with_the_hook(
    tmp_path: Path, text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An index read without a hook (quantkit.io.headers._plain_weight_map) gives what the hook path gives: the
    same weight map, or the same error."""
    import quantkit.io.headers as headers

    (tmp_path / INDEX_FILE).write_text(text)
    plain = _index_result(tmp_path)
    monkeypatch.setattr(headers, "_plain_weight_map", lambda _text: None)
    assert plain == _index_result(tmp_path)
    if text == INDEXES[0]:
        monkeypatch.undo()
        assert headers._plain_weight_map(text) == ({"a": S1, "b": S2}, {S1, S2})  # the common form: plain


def test_paused_gc_leaves_what_it_made_in_the_oldest_generation() -> None:
    # After a paused build, the first collection must not walk every object made meanwhile (0.04-0.06 s on a
    # Kimi-K2.5-sized index): they go to the oldest generation, and the collector runs again.
    import gc

    from quantkit.io.headers import paused_gc

    assert gc.isenabled()
    with paused_gc():
        assert not gc.isenabled()
        made = [{"shape": [i, 2]} for i in range(2000)]
    assert gc.isenabled()
    oldest = {id(o) for o in gc.get_objects(generation=2)}
    assert all(id(o) in oldest for o in made[::97])
    assert not any(id(o) in oldest for o in gc.get_objects(generation=0))  # (the generations are apart)


def test_paused_gc_keeps_objects_frozen_by_the_process_frozen() -> None:
    import gc

    from quantkit.io.headers import paused_gc

    kept = [{"frozen": i} for i in range(100)]
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with paused_gc():
            made = [{"new": i} for i in range(100)]
        assert gc.get_freeze_count() == frozen  # nothing the process froze was released
        assert gc.isenabled() and kept and made
    finally:
        gc.unfreeze()
