"""The header fast path (quantkit.io.safetensors._validate_plain) accepts only headers the full rules accept, with the
same ParsedHeader: every header below is judged both ways."""

from __future__ import annotations

import json

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
    ('{"a":{"dtype":1,"shape":[1],"data_offsets":[0,1]},"b":{"dtype":"U8","shape":[4],"data_offsets":[1,5],'
     '"x":null}}', 5),  # a string missing from one entry, an extra field in another: the quote count still holds
    ('{"a":{"dtype":["U8"],"shape":[4],"data_offsets":[0,4]}}', 4),  # an unhashable dtype
    ('{"a":{"dtype":"U8","shape":[4],"data_offsets":[0]},"b":{"dtype":"U8","shape":[4],"data_offsets":[4,4,8]}}',
     8),  # offsets of lengths 1 and 3: four bounds, as two pairs would give
    ('{"a":' + _entry("U8", [4], 0, 4) + ',"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8,8]}}', 8),  # 2 and 3
    ('{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4],"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}}',
     8),  # an entry nested in an entry
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
    ('{"b":' + _entry("U8", [4], 4, 8) + ',"a":' + _entry("U8", [4], 0, 4) + ',"c":' + _entry("U8", [4], 4, 8) + "}",
     8),  # out of file order, with an overlap
    ('{"b":' + _entry("U8", [4], 4, 8) + ',"a":' + _entry("U8", [4], 0, 4) + "}", 9),  # out of order, a byte after
    ('{"b":' + _entry("U8", [4], 5, 9) + ',"a":' + _entry("U8", [4], 0, 4) + "}", 9),  # out of order, a hole
    ('{"a":' + _entry("U8", [4], 0, 4) + ',"__metadata__":{"k":"v"},"b":' + _entry("U8", [4], 4, 8) + "}", 8),
    ('{"__metadata__":{"k":["v"]},"a":' + _entry("U8", [4], 0, 4) + "}", 4),
    ('{"__metadata__":[],"a":' + _entry("U8", [4], 0, 4) + "}", 4),
    ('{"a":' + _entry("U8", [1], 0, 1) + ',"b":{"dtype":"U8","shape":[1],"data_offsets":[true,2]}}', 2),
    ('{"b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]},"a":{"dtype":"U8","shape":[1],"data_offsets":[false,1]}}',
     2),  # out of file order, a boolean begin
    ('{"a":' + _entry("U8", [1, 4], 0, 4) + ',"b":{"dtype":"U8","shape":[true,4],"data_offsets":[4,8]}}', 8),
    ('{"a":{"dtype":"U8","shape":[true,4],"data_offsets":[0,4]},"b":' + _entry("U8", [1, 4], 4, 8) + "}", 8),
    ('{"a":' + _entry("U8", [4], 0, 4) + ',"b":{"dtype":"U8","shape":{},"data_offsets":[4,5]},"c":'
     + _entry("U8", [], 5, 6) + "}", 6),  # an empty object as a shape, beside a real scalar
    ('{"a":' + _entry("F32", [2, 2], 0, 16) + ',"b":' + _entry("F32", [2, 2], 16, 32) + ',"c":'
     + _entry("F32", [2, 2], 32, 47) + "}", 47),  # the same kind spanning other bytes
    ('{"__metadata__":{"k":1.5},"a":' + _entry("U8", [4], 0, 4) + "}", 4),
    ("{" + ",".join(f'"t{i}":' + _entry("U8", [2**61 - 1], i * (2**61 - 1), (i + 1) * (2**61 - 1)) for i in range(9))
     + "}", 9 * (2**61 - 1)),  # offsets beyond 64 bits, in a file that could hold them
    ('{"a":' + _entry("U8", [4], 0, 4) + ',"b":{"dtype":"U8","shape":[4.0],"data_offsets":[4,8]}}', 8),  # 4.0 == 4
    ('{"a":' + _entry("U8", [4], 0, 4) + ',"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8.0]}}', 8),
    ('{"a":' + _entry("F4", [3], 0, 1) + "}", 1),  # 12 bits, in 1 byte
    ('{"__metadata__":{"k":"v"}}', 0),  # metadata alone
    ('{"__metadata__":null}', 1),
]


@pytest.mark.parametrize(("text", "data_len"), HEADERS)
def test_the_fast_path_agrees_with_the_full_rules(text: str, data_len: int) -> None:
    raw = text.encode()
    full = _full(raw, data_len)
    fast = st._validate_plain(raw, data_len, len(raw))
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
    for text, data_len in (HEADERS[0], HEADERS[2], HEADERS[3], HEADERS[4], HEADERS[8], HEADERS[39],
                           *(h for h in HEADERS if h[0].startswith(taken))):
        assert st._validate_plain(text.encode(), data_len, len(text)) is not None, text[:60]
