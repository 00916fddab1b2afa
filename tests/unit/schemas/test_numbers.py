"""`schemas/_numbers.c`: msgpack arrays of numbers read straight into int64 / float64 bytes, or None
for anything the general path must judge. Checked against msgpack-python on every width, edge values,
broken input and random arrays."""

from __future__ import annotations

import math
import random
import struct
from array import array

import msgpack
import pytest

_numbers = pytest.importorskip(
    "swarmrl.schemas._numbers", reason="the C module was not built (no compiler at install time)"
)

INT64 = range(-(2**63), 2**63)
EDGES = [0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1, -1, -31, -32, -33, -127, -128]
EDGES += [-129, -(2**15), -(2**15) - 1, -(2**31), -(2**31) - 1, -(2**63)]


def expected_ints(raw: bytes) -> list[int] | None:
    """What `ints` must return (as a list), by the module's contract, from msgpack-python's reading."""
    try:
        values = msgpack.unpackb(raw, strict_map_key=False)
    except Exception:
        return None
    if type(values) is not list or any(type(v) is not int or v not in INT64 for v in values):
        return None
    return values


def expected_floats(raw: bytes) -> list[float] | None:
    try:
        values = msgpack.unpackb(raw, strict_map_key=False)
    except Exception:
        return None
    if type(values) is not list:
        return None
    out = []
    for v in values:
        if type(v) is int and abs(v) <= 2**53:
            out.append(float(v))
        elif type(v) is float and math.isfinite(v):
            out.append(v)
        else:
            return None
    return out


def ints(raw: bytes) -> list[int] | None:
    got = _numbers.ints(raw)
    return None if got is None else array("q", got).tolist()


def floats(raw: bytes) -> list[float] | None:
    got = _numbers.floats(raw)
    return None if got is None else array("d", got).tolist()


def test_every_int_width_reads_as_msgpack_writes_it() -> None:
    raw = msgpack.packb(EDGES)
    assert ints(raw) == EDGES
    assert floats(raw) is None  # ints beyond 2**53 have no exact float64
    small = [v for v in EDGES if abs(v) <= 2**53]
    assert floats(msgpack.packb(small)) == [float(v) for v in small]


def test_array_headers_of_every_size() -> None:
    for n in (0, 1, 15, 16, 65535, 65536):  # fixarray, array 16, array 32 boundaries
        values = list(range(n))
        assert ints(msgpack.packb(values)) == values


def test_floats_of_both_widths_and_no_non_finite() -> None:
    assert floats(msgpack.packb([-0.5, 1e-300, -0.0], use_single_float=False)) == [-0.5, 1e-300, -0.0]
    single = struct.unpack(">f", struct.pack(">f", 0.1))[0]  # float 32 widens exactly
    assert floats(msgpack.packb([0.1], use_single_float=True)) == [single]
    for bad in (math.nan, math.inf, -math.inf):
        assert floats(msgpack.packb([0.0, bad])) is None
        assert floats(msgpack.packb([bad], use_single_float=True)) is None
    assert ints(msgpack.packb([1.0])) is None


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\xc0",  # nil, not an array
        msgpack.packb({"a": 1}),
        msgpack.packb([1, 2])[:-1],  # cut short
        msgpack.packb([1, 300])[:-1],  # cut inside an element
        msgpack.packb([1]) + b"\x01",  # bytes after the array
        b"\xdd\xff\xff\xff\xff\x01",  # a count far beyond the bytes
        b"\xdc\x00\x02\x01",  # a count one beyond
        msgpack.packb([1, None]),
        msgpack.packb([1, "2"]),
        msgpack.packb([1, True]),
        msgpack.packb([1, [2]]),
        msgpack.packb([1, b"\x02"]),
        msgpack.packb([2**63]),  # uint 64 beyond int64
    ],
)
def test_what_is_not_plainly_numbers_is_refused(raw: bytes) -> None:
    assert expected_ints(raw) is None and expected_floats(raw) is None  # the reference agrees
    assert ints(raw) is None and floats(raw) is None


def test_random_arrays_agree_with_msgpack() -> None:
    rng = random.Random(11)
    pool = [lambda: rng.choice(EDGES), lambda: rng.randrange(-(2**40), 2**40), lambda: rng.random() - 0.5]
    pool += [lambda: rng.choice([None, "x", True, math.nan, 2**64 - 1, [1]])]
    for _ in range(2000):
        values = [rng.choice(pool[: rng.choice([1, 2, 3, 4])])() for _ in range(rng.randrange(0, 40))]
        raw = msgpack.packb(values, use_single_float=rng.random() < 0.2)
        if rng.random() < 0.2:  # damage it: a byte changed, cut, or added
            pos = rng.randrange(len(raw))
            raw = rng.choice(
                [raw[:pos] + bytes([rng.randrange(256)]) + raw[pos + 1 :], raw[:pos], raw + b"\x00"]
            )
        assert ints(raw) == expected_ints(raw), raw.hex()
        assert floats(raw) == expected_floats(raw), raw.hex()


def test_any_buffer_is_read() -> None:
    raw = msgpack.packb([1, 2, 3])
    assert ints(bytearray(raw)) == ints(memoryview(raw)) == [1, 2, 3]
    with pytest.raises(TypeError):
        _numbers.ints("not a buffer")
