"""`schemas/_numbers.c`: the numbers of a msgpack map read straight into int64 / float64 bytes and the
map handed back with nil in their place, or None for anything the general path must judge. Checked
against msgpack-python on every width, edge values, broken input, random arrays and random maps."""

from __future__ import annotations

import math
import random
import struct
from array import array

import msgpack
import pytest

from swarmrl.schemas.fastcodec import _plain

_numbers = pytest.importorskip(
    "swarmrl.schemas._numbers", reason="the C module was not built (no compiler at install time)"
)

INT64 = range(-(2**63), 2**63)
EDGES = [0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1, -1, -31, -32, -33, -127, -128]
EDGES += [-129, -(2**15), -(2**15) - 1, -(2**31), -(2**31) - 1, -(2**63)]


def _unpacked_list(raw: bytes) -> list | None:
    """msgpack-python's reading of `raw` if it is one array, else None."""
    try:
        values = msgpack.unpackb(raw, strict_map_key=False)
    except Exception:
        return None
    return values if type(values) is list else None


def expected_ints(raw: bytes) -> list[int] | None:
    """What an int field must read as (as a list), by the module's contract."""
    values = _unpacked_list(raw)
    if values is None or any(type(v) is not int or v not in INT64 for v in values):
        return None
    return values


def expected_floats(raw: bytes) -> list[float] | None:
    """What a float field must read as."""
    values = _unpacked_list(raw)
    if values is None:
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


def _one(raw: bytes, is_float: bool) -> list | None:
    """What `split` reads from the map {"x": <raw>}."""
    got = _numbers.split(b"\x81\xa1x" + bytes(raw), ((b"x", is_float),))
    if got is None:
        return None
    reduced, (values,) = got
    assert reduced == b"\x81\xa1x\xc0"  # nil in its place
    return array("d" if is_float else "q", values).tolist()


def ints(raw: bytes) -> list[int] | None:
    return _one(raw, False)


def floats(raw: bytes) -> list[float] | None:
    return _one(raw, True)


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
    raw = msgpack.packb({"x": [1, 2, 3]})
    for data in (bytearray(raw), memoryview(raw)):
        reduced, (values,) = _numbers.split(data, ((b"x", False),))
        assert array("q", values).tolist() == [1, 2, 3] and reduced == b"\x81\xa1x\xc0"
    with pytest.raises(TypeError):
        _numbers.split("not a buffer", ((b"x", False),))


FIELDS = ((b"prompt_ids", False), (b"output_ids", False), (b"output_logprobs", True))


def _value(rng: random.Random, depth: int = 0) -> object:
    """Any msgpack value: every type and size class (fix, 8, 16, 32), nested a little."""
    kind = rng.randrange(12 if depth < 3 else 9)
    if kind == 0:
        return rng.choice([None, True, False])
    if kind == 1:
        return rng.choice([rng.randrange(-(2**63), 2**64), rng.randrange(-40, 200)])
    if kind == 2:
        return rng.choice([rng.random(), -1e300])
    if kind in (3, 4):
        return rng.choice("ab_é😀") * rng.choice([0, 3, 40, 300, 70000])
    if kind == 5:
        return bytes(rng.choice([0, 5, 300, 70000]))
    if kind == 6:
        return msgpack.ExtType(rng.randrange(128), bytes(rng.choice([1, 2, 3, 4, 8, 16, 300, 70000])))
    if kind in (7, 8):
        return rng.choice(["prompt_ids", "output_logprobs"])  # the names, as values
    if kind in (9, 10):
        return [_value(rng, depth + 1) for _ in range(rng.choice([0, 2, 16, 20]))]
    keys = ["a", "prompt_ids", "x" * 40, "output_logprobs"]
    return {rng.choice(keys): _value(rng, depth + 1) for _ in range(rng.choice([0, 2, 16, 17]))}


def _numbers_for(rng: random.Random, is_float: bool) -> list:
    if rng.random() < 0.01:  # an array 32
        return [float(i) for i in range(70000)] if is_float else list(range(70000))
    n = rng.choice([0, 1, 5, 300])
    if is_float:
        return [rng.choice([rng.random() - 1, rng.randrange(-5, 5), -1e300]) for _ in range(n)]
    return [
        rng.choice([rng.randrange(130), rng.randrange(2**16), rng.randrange(-(2**63), 2**63)])
        for _ in range(n)
    ]


def _ints_fit(value: object) -> bool:
    """No int beyond int64 anywhere in `value` (`split` leaves such payloads to the general path)."""
    if type(value) is int:
        return value in INT64
    if isinstance(value, dict):
        return all(_ints_fit(k) and _ints_fit(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return all(map(_ints_fit, value))
    return True


def test_an_int_beyond_int64_anywhere_is_refused() -> None:
    for big in ({"a": {"b": [2**63]}}, {"a": 2**64 - 1}, {2**63: 1}):
        assert _numbers.split(msgpack.packb(big), FIELDS) is None
    assert _numbers.split(msgpack.packb({"a": [2**63 - 1, -(2**63)]}), FIELDS) is not None


def test_random_maps_split_as_msgpack_reads_them() -> None:
    rng = random.Random(5)
    counts = {"read": 0, "untouched": 0, "refused": 0}
    for _ in range(3000):
        record: dict = {}
        keys = ["episode_id", "prompt_ids", "messages", "output_ids", "output_logprobs", "v"]
        rng.shuffle(keys)
        for key in keys[: rng.randrange(len(keys) + 1)]:
            is_float = key == "output_logprobs"
            numeric = key in ("prompt_ids", "output_ids", "output_logprobs") and rng.random() < 0.9
            record[key] = _numbers_for(rng, is_float) if numeric else _value(rng)
        if rng.random() < 0.1:
            record = {i: 1 for i in range(rng.randrange(1, 20))} | record  # int keys
        raw = msgpack.packb(record, use_bin_type=True)
        clean = (
            type(record) is dict
            and all(type(k) is str for k in record)
            and _ints_fit(record)
            and all(
                (expected_floats if f else expected_ints)(msgpack.packb(record[k.decode()])) is not None
                for k, f in FIELDS
                if k.decode() in record
            )
        )
        if rng.random() < 0.15:  # damaged: a byte changed, cut short, or a byte added
            pos = rng.randrange(len(raw))
            raw = rng.choice(
                [raw[:pos] + bytes([rng.randrange(256)]) + raw[pos + 1 :], raw[:pos], raw + b"\0"]
            )
            clean = False
        got = _numbers.split(raw, FIELDS)
        try:
            original = msgpack.unpackb(raw, strict_map_key=False)
        except Exception:
            original = None
        if got is None:
            assert not clean, raw[:200].hex()
            counts["refused"] += 1
            continue
        reduced, values = got
        if reduced is raw:  # none of the fields: handed back untouched, for msgspec to judge
            assert values == (None, None, None)
            assert original is None or not any(k.decode() in original for k, _ in FIELDS)
            counts["untouched"] += 1
            continue
        try:
            rest = msgpack.unpackb(reduced, strict_map_key=False)
        except Exception:
            rest = None
        if original is None:  # broken where split does not look (a string's UTF-8): still broken
            assert rest is None
            continue
        expected = dict(original)
        for (name, is_float), packed in zip(FIELDS, values, strict=True):
            key = name.decode()
            if key not in original:
                assert packed is None
                continue
            want = [float(v) for v in original[key]] if is_float else original[key]
            assert array("d" if is_float else "q", packed).tolist() == want
            expected[key] = None
        assert rest == expected
        counts["read"] += 1
    assert min(counts.values()) > 100, counts  # every outcome was exercised


def test_a_field_given_twice_is_refused() -> None:
    raw = (
        b"\x82"
        + msgpack.packb("prompt_ids")
        + msgpack.packb([1])
        + msgpack.packb("prompt_ids")
        + msgpack.packb([2])
    )
    assert _numbers.split(raw, FIELDS) is None


PLAIN = 2  # `split`'s kind for a free-form field: checked where it stands


def _plain_reference(value: bytes) -> bool | None:
    """What `fastcodec._plain` says of the value msgpack-python reads (None: it reads nothing)."""
    try:
        return _plain(msgpack.unpackb(value, raw=False, strict_map_key=False, timestamp=0))
    except Exception:  # broken msgpack, or a string that is not UTF-8 (msgspec refuses those itself)
        return None


def test_plain_fields_stay_where_they_are_and_must_be_plain_data() -> None:
    fields = ((b"data", PLAIN), (b"prompt_ids", 0))
    ok = {"data": {"a": [1, 2.5, None, True, "x", {"b": []}]}, "v": b"bytes elsewhere are msgspec's"}
    raw = msgpack.packb(ok, use_bin_type=True)
    reduced, values = _numbers.split(raw, fields)
    assert reduced is raw and values == (None, None)  # nothing packed: the payload as it was
    for bad in ({"a": b"bin"}, [msgpack.ExtType(1, b"x")], {1: "int key"}, {"a": [{(1, 2): 3}]}):
        raw = msgpack.packb({"data": bad, "prompt_ids": [1]}, use_bin_type=True)
        assert _numbers.split(raw, fields) is None, bad
    twice = b"\x82" + msgpack.packb("data") + msgpack.packb([1]) + msgpack.packb("data")  # msgspec judges
    assert _numbers.split(twice + msgpack.packb({"a": 1}), fields) is not None  # duplicates; each is
    assert _numbers.split(twice + msgpack.packb({"a": b"x"}, use_bin_type=True), fields) is None  # checked
    with pytest.raises(ValueError, match="kind 3"):
        _numbers.split(raw, ((b"data", 3),))


def test_random_plain_fields_are_judged_as_fastcodec_plain_judges_them() -> None:
    rng = random.Random(9)
    fields = ((b"messages", PLAIN), (b"prompt_ids", 0))
    verdicts = {True: 0, False: 0}
    for _ in range(3000):
        value = _value(rng)
        if rng.random() < 0.2:
            value = {rng.choice(["k", 3, 2.5, None]): value}
        packed_value = msgpack.packb(value, use_bin_type=True)
        want = _plain_reference(packed_value)
        if want is None:
            continue
        raw = msgpack.packb({"v": 1, "prompt_ids": [1, 2]}, use_bin_type=True)
        raw = b"\x83" + raw[1:] + msgpack.packb("messages") + packed_value
        got = _numbers.split(raw, fields)
        want = want and _ints_fit(value)  # a big int anywhere is the general path's too
        assert (got is not None) == want, packed_value[:200].hex()
        verdicts[want] += 1
    assert min(verdicts.values()) > 300, verdicts
