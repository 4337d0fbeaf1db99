"""The header fast paths (quantkit.io.safetensors._validate_plain, and _validate_compact for the writer form) accept
only headers the full rules accept, with the same ParsedHeader: every header below is judged by each path and by the
full rules."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from quantkit.errors import CheckpointError
from quantkit.io import safetensors as st


def _full(raw: bytes, data_len: int) -> st.ParsedHeader | str:
    """The full rules alone (the fast path switched off), or the error message."""
    try:
        return st._validate_full(raw, len(raw), 8 + len(raw) + data_len, "f", CheckpointError)
    except CheckpointError as e:
        return str(e)


def _entry(dtype: str, shape: list[int], begin: int, end: int) -> str:
    return json.dumps({"dtype": dtype, "shape": shape, "data_offsets": [begin, end]})


W, W2 = _entry("U8", [4], 0, 4).replace(" ", ""), _entry("U8", [2, 2], 4, 8).replace(" ", "")  # the writer form
PLAIN = '{"a":' + _entry("BF16", [2, 2], 0, 8) + ',"b":' + _entry("U8", [4], 8, 12) + "}"
HEADERS = [
    (PLAIN, 12),
    (PLAIN, 13),  # a trailing byte
    ('{"__metadata__":{"format":"pt"},"a":' + _entry("F32", [1], 0, 4) + "}", 4),
    ('{"a":' + _entry("F32", [1], 0, 4) + ',"__metadata__":{"k":"v"}}', 4),  # metadata after a tensor
    ('{"__metadata__":null,"a":' + _entry("F32", [1], 0, 4) + "}", 4),
    ('{"__metadata__":{"k":"v","k":"w"},"a":' + _entry("F32", [1], 0, 4) + "}", 4),  # a repeated metadata key
    ('{"__metadata__":{"k":1},"a":' + _entry("F32", [1], 0, 4) + "}", 4),
    ('{"__metadata__":{},"__metadata__":{},"a":' + _entry("F32", [1], 0, 4) + "}", 4),
    ('{"b":' + _entry("U8", [4], 8, 12) + ',"a":' + _entry("BF16", [2, 2], 0, 8) + "}", 12),  # not in file order
    ('{"a":' + _entry("U8", [4], 0, 4) + ',"a":' + _entry("U8", [4], 0, 4) + "}", 4),  # a name twice
    ('{"a":1,"a":' + _entry("U8", [4], 0, 4) + "}", 4),  # a malformed entry overwritten
    ('{"a":{"dtype":"U8","dtype":"U8","shape":[4],"data_offsets":[0,4]}}', 4),  # a field twice
    ('{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4],"x":1}}', 4),  # an extra field
    ('{"a":{"shape":[4],"dtype":"U8","data_offsets":[0,4]}}', 4),  # another field order
    ('{"a":["U8",[4],[0,4]]}', 4),  # the sequence form
    ('{"a":' + _entry("U8", [0, 2**63, 4], 0, 0) + ',"b":' + _entry("U8", [4], 0, 4) + "}", 4),  # zero dim, overflow
    ('{"a":' + _entry("U8", [0], 0, 0) + ',"b":' + _entry("U8", [4], 0, 4) + "}", 4),  # an empty tensor
    ('{"a":' + _entry("U8", [2**32, 2**32], 0, 4) + "}", 4),  # overflows 64 bits
    ('{"a":' + _entry("F4", [3], 0, 2) + "}", 2),  # 12 bits
    ('{"a":' + _entry("U8", [4], 0, 5) + "}", 5),  # spans more than its bytes
    ('{"a":' + _entry("U8", [4], 4, 0) + "}", 4),  # ends before it begins
    ('{"a":' + _entry("U8", [4], 2, 6) + "}", 6),  # a hole before it
    ('{"a":' + _entry("U8", [4], 0, 4) + ',"b":' + _entry("U8", [4], 2, 6) + "}", 6),  # overlap
    ('{"a":' + _entry("XX", [4], 0, 4) + "}", 4),  # unknown dtype
    ('{"a":{"dtype":"U8","shape":[-0,4],"data_offsets":[0,0]}}', 0),  # -0 is a float to serde_json
    ('{"a":{"dtype":"U8","shape":[4],"data_offsets":[-0,4]}}', 4),  # which Python's json reads as the int 0
    ('{"a":{"dtype":"U8","shape":[4.0],"data_offsets":[0,4]}}', 4),
    ('{"a":{"dtype":"U8","shape":[true],"data_offsets":[0,1]}}', 1),
    ('{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4.0]}}', 4),
    ('{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,"4"]}}', 4),
    ('{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4,4]}}', 4),
    ('{"a\\"b":' + _entry("U8", [4], 0, 4) + "}", 4),  # an escaped quote in a name
    ('{"a\\ud800":' + _entry("U8", [4], 0, 4) + "}", 4),  # a lone surrogate escape
    ('{"a":' + _entry("U8", [4], 0, 4) + ',"b":NaN}', 4),
    ('{"a":' + _entry("U8", [4], 0, 4) + ',"b":{"dtype":"U8","shape":[1e999],"data_offsets":[4,4]}}', 4),
    ("[]", 0),
    ("{}", 0),
    ("{}", 1),
    ('  {"a":' + _entry("U8", [4], 0, 4) + "}  ", 4),  # whitespace around
    ("{" + ",".join(f'"t{i}":' + _entry("BF16", [3, 5], 30 * i, 30 * i + 30) for i in range(500)) + "}", 15000),
    # What the fast path infers instead of checking: strings from the quote count, lengths from sums, ranges from the
    # tiling; each case below is a header that inference must not let through.
    (
        '{"a":{"dtype":1,"shape":[1],"data_offsets":[0,1]},"b":{"dtype":"U8","shape":[4],"data_offsets":[1,5],'
        '"x":null}}',
        5,
    ),  # a string missing from one entry, an extra field in another: the quote count still holds
    ('{"a":{"dtype":["U8"],"shape":[4],"data_offsets":[0,4]}}', 4),  # an unhashable dtype
    (
        '{"a":{"dtype":"U8","shape":[4],"data_offsets":[0]},"b":{"dtype":"U8","shape":[4],"data_offsets":[4,4,8]}}',
        8,
    ),  # offsets of lengths 1 and 3: four bounds, as two pairs would give
    ('{"a":' + _entry("U8", [4], 0, 4) + ',"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8,8]}}', 8),  # 2 and 3
    (
        '{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4],"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}}',
        8,
    ),  # an entry nested in an entry
    ('{"a":{"dtype":"U8","shape":{},"data_offsets":[0,1]}}', 1),  # an empty object as shape, like a scalar's []
    ('{"a":{"dtype":"U8","shape":[4],"data_offsets":{}}}', 0),
    ('{"a":{"dtype":"U8","shape":[{}],"data_offsets":[0,1]}}', 1),
    ('{"a":{"dtype":"U8","shape":[[4]],"data_offsets":[0,4]}}', 4),  # a list as a dimension
    ('{"a":{"dtype":"U8","shape":[[]],"data_offsets":[0,0]}}', 0),
    ('{"a":{"dtype":"U8","shape":[null],"data_offsets":[0,1]}}', 1),
    ('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,true]}}', 1),  # a boolean offset, which is 1 to Python
    ('{"a":{"dtype":"U8","shape":[1],"data_offsets":[false,1]}}', 1),
    ('{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,null]}}', 4),
    ('{"a":{"dtype":"U8","shape":4,"data_offsets":[0,4]}}', 4),
    ('{"a":{"dtype":"U8","shape":[4],"data_offsets":4}}', 4),
    ('{"a":' + _entry("U8", [-2, -2], 0, 4) + "}", 4),  # negative dimensions whose product is right
    ('{"a":' + _entry("U8", [-1, 4], 0, 4) + ',"b":' + _entry("U8", [4], 4, 8) + "}", 8),
    ('{"a-b":' + _entry("U8", [4], 0, 4) + "}", 4),  # a `-` that is no number
    ('{"a":' + _entry("U8", [2**31, 2**31], 0, 2**62) + "}", 2**62),  # 2**65 bits, in a file that could hold them
    ('{"a":' + _entry("U8", [2**64], 0, 2**64) + "}", 2**64),  # a dimension beyond 64 bits
    ('{"a":' + _entry("U8", [4], 0, 4) + ',"b":' + _entry("U8", [4], 0, 4) + "}", 4),  # the same bytes twice
    (
        '{"b":' + _entry("U8", [4], 4, 8) + ',"a":' + _entry("U8", [4], 0, 4) + ',"c":' + _entry("U8", [4], 4, 8) + "}",
        8,
    ),  # out of file order, with an overlap
    ('{"b":' + _entry("U8", [4], 4, 8) + ',"a":' + _entry("U8", [4], 0, 4) + "}", 9),  # out of order, a byte after
    ('{"b":' + _entry("U8", [4], 5, 9) + ',"a":' + _entry("U8", [4], 0, 4) + "}", 9),  # out of order, a hole
    ('{"a":' + _entry("U8", [4], 0, 4) + ',"__metadata__":{"k":"v"},"b":' + _entry("U8", [4], 4, 8) + "}", 8),
    ('{"__metadata__":{"k":["v"]},"a":' + _entry("U8", [4], 0, 4) + "}", 4),
    ('{"__metadata__":[],"a":' + _entry("U8", [4], 0, 4) + "}", 4),
    ('{"a":' + _entry("U8", [1], 0, 1) + ',"b":{"dtype":"U8","shape":[1],"data_offsets":[true,2]}}', 2),
    (
        '{"b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]},"a":{"dtype":"U8","shape":[1],"data_offsets":[false,1]}}',
        2,
    ),  # out of file order, a boolean begin
    ('{"a":' + _entry("U8", [1, 4], 0, 4) + ',"b":{"dtype":"U8","shape":[true,4],"data_offsets":[4,8]}}', 8),
    ('{"a":{"dtype":"U8","shape":[true,4],"data_offsets":[0,4]},"b":' + _entry("U8", [1, 4], 4, 8) + "}", 8),
    (
        '{"a":'
        + _entry("U8", [4], 0, 4)
        + ',"b":{"dtype":"U8","shape":{},"data_offsets":[4,5]},"c":'
        + _entry("U8", [], 5, 6)
        + "}",
        6,
    ),  # an empty object as a shape, beside a real scalar
    (
        '{"a":'
        + _entry("F32", [2, 2], 0, 16)
        + ',"b":'
        + _entry("F32", [2, 2], 16, 32)
        + ',"c":'
        + _entry("F32", [2, 2], 32, 47)
        + "}",
        47,
    ),  # the same kind spanning other bytes
    ('{"__metadata__":{"k":1.5},"a":' + _entry("U8", [4], 0, 4) + "}", 4),
    (
        "{"
        + ",".join(f'"t{i}":' + _entry("U8", [2**61 - 1], i * (2**61 - 1), (i + 1) * (2**61 - 1)) for i in range(9))
        + "}",
        9 * (2**61 - 1),
    ),  # offsets beyond 64 bits, in a file that could hold them
    ('{"a":' + _entry("U8", [4], 0, 4) + ',"b":{"dtype":"U8","shape":[4.0],"data_offsets":[4,8]}}', 8),  # 4.0 == 4
    ('{"a":' + _entry("U8", [4], 0, 4) + ',"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8.0]}}', 8),
    ('{"a":' + _entry("F4", [3], 0, 1) + "}", 1),  # 12 bits, in 1 byte
    ('{"__metadata__":{"k":"v"}}', 0),  # metadata alone
    ('{"__metadata__":null}', 1),
    # The writer form, which _validate_compact matches with a regex and a tiling of the text: each case below is one
    # the tiling, the canonical decimals or a check beside them must refuse (or pass on, as the full rules accept).
    ('{"a":' + W + ',"b":' + W2 + "}    ", 8),  # padded with spaces, as safetensors pads
    ('{"a":' + W + ',"b":' + W2 + "}\t", 8),  # padded with a tab
    ('{"a":' + W + ',"b":' + W2 + ",}", 8),  # a trailing comma
    ('{"a":' + W + ',"b":' + W2 + ",", 8),  # no closing brace after a comma
    ('{"a":' + W + '},"b":' + W2 + "}", 8),  # an object closed early
    ('{"a":' + W + '}"b":' + W2 + "}", 8),
    ('{"a":' + W + ', "b":' + W2 + "}", 8),  # a space between entries
    ('{"a":' + W + ',7,"b":' + W2 + "}", 8),  # junk between two matches
    ('{"a":' + W + ',"b":' + W2 + "}7", 8),  # junk after the object
    ('{"a":' + W + ',"b":' + W2, 8),  # no closing brace
    ('{"a":' + W + ',"b":' + W2 + "}}", 8),
    ('{"a}":' + W + ',"b,\\"":' + W2 + "}", 8),  # a brace and a comma in names; an escaped quote
    ('{"a},\\"b\\":{":' + W + "}", 4),
    ('{"a\\u0001":' + W + "}", 4),  # a control character, escaped
    ('{"a\x01":' + W + "}", 4),  # a raw control character in a name
    ('{"":' + W + "}", 4),  # an empty name
    ('{"é中":' + W + "}", 4),  # names beyond ASCII
    ('{"a":{"dtype":"U8","shape":[4],"data_offsets":[00,4]}}', 4),  # a leading zero
    ('{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,04]}}', 4),
    ('{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[04,8]}}', 8),
    ('{"a":{"dtype":"U8","shape":[04],"data_offsets":[0,4]}}', 4),
    ('{"a":{"dtype":"U8","shape":[4,],"data_offsets":[0,4]}}', 4),
    ('{"a":{"dtype":"U8","shape":[,4],"data_offsets":[0,4]}}', 4),
    ('{"a":{"dtype":"U8","shape":[2,,2],"data_offsets":[0,4]}}', 4),
    ('{"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},"b":' + W2.replace("4,8", "0,4") + "}", 4),
    ('{"a":{"dtype":"U8","shape":[],"data_offsets":[0,1]}}', 1),  # a scalar
    ('{"a":{"dtype":"u8","shape":[4],"data_offsets":[0,4]}}', 4),  # a dtype in lower case
    ('{"a":{"dtype":"U8X","shape":[4],"data_offsets":[0,4]}}', 4),
    ('{"x":' + W + ',"__metadata__":' + W2 + "}", 8),  # a tensor entry named __metadata__
    ('{"__metadata__":{"k":"v"},"__metadata__":' + W + "}", 4),
    ('{"__metadata__":{"k":"v","k":"w"},"a":' + W + "}", 4),  # a repeated metadata key, compact
    ('{"__metadata__":{"k":"v"},"a":' + W + ',"a":' + W2.replace("4,8", "0,4") + "}", 4),  # a name twice, in order
    ('{"a":' + W + ',"a":' + W2 + "}", 8),  # a name twice, tiling
    ('{"__metadata__":{},"a":' + W + "}", 4),
    ('{"__metadata__":{"a,b":"}{","":""},"a":' + W + "}", 4),
    ('{"__metadata__":{"k":"v"},}', 0),
    ('{"__metadata__":{"k":"v"},"a":' + W + ',"b":' + W2 + "}", 8),
    ('{"a":' + W + ',"b":' + W2 + "}", 9),  # a byte after the last tensor
    ('{"a":' + W + ',"b":' + W2.replace("4,8", "5,9") + "}", 9),  # a hole
    ('{"a":' + W + ',"b":' + W2.replace("4,8", "3,7") + "}", 7),  # an overlap
    ('{"a":' + W + ',"b":' + W2.replace("4,8", "4,9") + "}", 9),  # a span larger than the tensor
    ('{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}', 2),  # 12 bits
    (
        '{"a":{"dtype":"U8","shape":[18446744073709551616],"data_offsets":[0,18446744073709551616]}}',
        18446744073709551616,
    ),  # a dimension beyond 64 bits
    ('{"a":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]}}', 0),  # overflows 64 bits
    ('{"a":{"dtype":"U8","data_offsets":[0,4],"shape":[4]}}', 4),  # another field order
    ('{"a":{"dtype":"U8","shape":[' + "9" * 5000 + '],"data_offsets":[0,4]}}', 4),  # past int()'s digit limit
    ('{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,' + "9" * 5000 + "]}}", 4),
    ('{"a":{"dtype":"U8","shape":[1' + "0" * 20 + '],"data_offsets":[0,4]}}', 4),  # 21 digits
    ('{"a":{"dtype":"U8","shape":[1' + "0" * 19 + '],"data_offsets":[0,1' + "0" * 19 + "]}}", 10**19),  # 20 digits
]


FAST_PATHS = pytest.mark.parametrize("fast_path", [st._validate_plain, st._validate_compact], ids=["plain", "compact"])


@FAST_PATHS
@pytest.mark.parametrize(("text", "data_len"), HEADERS)
def test_the_fast_path_agrees_with_the_full_rules(
    text: str, data_len: int, fast_path: Callable[..., st.HeaderColumns | None]
) -> None:
    raw = text.encode()
    full = _full(raw, data_len)
    fast = fast_path(raw, data_len, len(raw))
    if isinstance(full, str):  # refused: the fast path takes no part, and the message is the full rules'
        assert fast is None
        with pytest.raises(CheckpointError) as e:
            st._validate(raw, len(raw), 8 + len(raw) + data_len, "f", CheckpointError)
        assert str(e.value) == full
    else:
        if fast is not None:
            assert fast.parsed() == full
            assert fast == st._columns(full)
        both = st._validate(raw, len(raw), 8 + len(raw) + data_len, "f", CheckpointError)
        assert both.parsed() == full
        assert both.columns == st._columns(full)


def test_the_fast_path_takes_the_form_writers_use() -> None:
    """Not a fallback for everything: the common form (and metadata, and a header out of file order) is taken."""
    taken = ('{"a-b":', '{"__metadata__":{"k":"v"}}', '{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"__me')
    for text, data_len in (
        HEADERS[0],
        HEADERS[2],
        HEADERS[3],
        HEADERS[4],
        HEADERS[8],
        HEADERS[39],
        *(h for h in HEADERS if h[0].startswith(taken)),
    ):
        assert st._validate_plain(text.encode(), data_len, len(text)) is not None, text[:60]


def _writer_header(rng: random.Random, least: int = 0) -> tuple[dict[str, object], int]:
    """A header as safetensors writes one: a few tensors (at least `least`) of random dtype and shape tiling the data,
    maybe metadata."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}} if rng.random() < 0.5 else {}
    offset = 0
    for i in range(rng.randint(least, 5)):
        dtype = rng.choice(["BF16", "F32", "U8", "F8_E4M3", "I64", "BOOL", "F4"])
        shape = [rng.choice([1, 2, 3, 4]) for _ in range(rng.choice([0, 1, 2]))]
        bits = st.DTYPE_BITS[dtype] * math.prod(shape)
        nbytes = bits // 8 if bits % 8 == 0 else 0
        header[f"t{i}"] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    return header, offset


MUTATIONS = [
    b"true",
    b"false",
    b"null",
    b"0",
    b"1",
    b"-1",
    b"1.0",
    b"[]",
    b"{}",
    b'"x"',
    b"[1,2]",
    b"2",
    b"-0",
    b"1e0",
    b",",
    b'"shape"',
    b'"dtype":"U8"',
]
NAME_CHARS = [c.encode() for c in '{}[],: \t\x01"\\\u00e9\u4e2d'] + [b'":{', b'},"', b"\xff"]


@FAST_PATHS
def test_random_mutations_of_written_headers_are_judged_as_the_full_rules_judge_them(
    fast_path: Callable[..., st.HeaderColumns | None],
) -> None:
    # 3,000 headers of the writers' form with one random edit each (a token replaced, a key repeated, the data one
    # byte longer or shorter): whatever the fast path accepts, the full rules accept with the same columns.
    rng = random.Random(20261203)
    taken = 0
    for _ in range(3000):
        # (the compact path takes no header without tensors: the plain one does)
        header, data_len = _writer_header(rng, 0 if fast_path is st._validate_plain else 1)
        raw = json.dumps(header, separators=(",", ":")).encode()
        edit = rng.random()
        if edit < 0.6:
            spots = [i for i, c in enumerate(raw) if chr(c) in '0123456789[]{}",']
            if spots:
                i = rng.choice(spots)
                raw = raw[:i] + rng.choice(MUTATIONS) + raw[min(len(raw), i + rng.randint(1, 4)) :]
        elif edit < 0.75:
            raw = (
                raw.replace(b'"shape"', b'"shape":[1],"shape"', 1)
                if rng.random() < 0.5
                else raw.replace(b'{"dtype"', b'{"dtype":"U8","dtype"', 1)
            )
        elif edit < 0.9:  # a character put into a tensor's name (most keep the header valid)
            spots = [i + 2 for i in range(len(raw)) if raw.startswith(b'"t', i)]
            if spots:
                i = rng.choice(spots)
                raw = raw[:i] + rng.choice(NAME_CHARS) + raw[i:]
        else:
            data_len = max(0, data_len + rng.choice([-1, 1]))
        fast = fast_path(raw, data_len, len(raw))
        if fast is not None:
            full = _full(raw, data_len)
            assert not isinstance(full, str), (raw, data_len, full)
            assert fast == st._columns(full), raw
            taken += 1
    assert taken > 100, taken  # the fast path really took part (232 of the 3,000 with this seed, either path)


@pytest.mark.parametrize("metadata", [None, {"format": "pt"}, {}, {"a,b": "}{", "": ""}])
def test_the_compact_path_takes_what_safetensors_writes(tmp_path: Path, metadata: dict[str, str] | None) -> None:
    """Headers written by safetensors itself (save_file) and by quantkit's writer are in the writer form: the compact
    path takes them, with the full rules' columns (it is no fallback that never runs)."""
    import torch
    from safetensors.torch import save_file

    tensors = {
        "w": torch.zeros(3, 5, dtype=torch.bfloat16),
        "s": torch.zeros((), dtype=torch.float32),
        "b": torch.zeros(7, dtype=torch.bool),
        "q": torch.zeros(2, 16, dtype=torch.float8_e4m3fn),
        "i": torch.zeros(4, dtype=torch.int64),
        "\u00e9.\u4e2d": torch.zeros(1, dtype=torch.uint8),
    }
    written = [tmp_path / "save_file.safetensors", tmp_path / "quantkit.safetensors"]
    save_file(tensors, str(written[0]), metadata=metadata)
    if metadata is None:  # quantkit's writer writes no metadata
        st.serialize_safetensors(tensors, written[1])
    for path in written[: 1 if metadata is not None else 2]:
        data = path.read_bytes()
        n = int.from_bytes(data[:8], "little")
        raw, data_len = data[8 : 8 + n], len(data) - 8 - n
        full = _full(raw, data_len)
        assert not isinstance(full, str), full
        assert st._validate_compact(raw, data_len, n) == st._columns(full), path.name
