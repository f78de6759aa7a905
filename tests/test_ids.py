"""ID layouts: the published vectors, round trips, and every range check."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from store import IdError, decode_instagram, decode_pinterest, encode_instagram, encode_pinterest
from store.ids import INSTAGRAM, MAX_ID, PINTEREST, Layout, Segment, instagram_datetime

# Decoded by hand from Pinterest's article (DESIGN.md section 1).
PINTEREST_VECTORS = [
    (241294492511762325, 3429, 1, 7075733),  # pin
    (241294629943640797, 3429, 3, 733),  # user
    (241294561224164665, 3429, 2, 1337),  # board
]
INSTAGRAM_VECTORS = [
    (2217813737473025833, 264384000000, 1001, 809),  # one published copy prints ...832: wrong
    (11637205501278089, 1387263000, 31341 % 2000, 5001 % 1024),  # the article's own example
]


@pytest.mark.parametrize(("value", "shard", "type_id", "local"), PINTEREST_VECTORS)
def test_pinterest_vectors(value: int, shard: int, type_id: int, local: int) -> None:
    assert decode_pinterest(value) == (shard, type_id, local)
    assert encode_pinterest(shard, type_id, local) == value


@pytest.mark.parametrize(("value", "ms", "shard", "seq"), INSTAGRAM_VECTORS)
def test_instagram_vectors(value: int, ms: int, shard: int, seq: int) -> None:
    assert decode_instagram(value) == (ms, shard, seq)
    assert encode_instagram(ms, shard, seq) == value


def test_pinterest_pin_lives_on_its_boards_shard() -> None:
    pin, _user, board = (v[0] for v in PINTEREST_VECTORS)
    assert decode_pinterest(pin).shard_id == decode_pinterest(board).shard_id


def test_instagram_datetime_uses_the_epoch() -> None:
    value = encode_instagram(1000, 1, 0)
    assert instagram_datetime(value, epoch_ms=0) == dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=dt.UTC)
    assert decode_instagram(value).datetime(86_400_000).date() == dt.date(1970, 1, 2)


@given(st.integers(0, 0xFFFF), st.integers(0, 0x3FF), st.integers(0, (1 << 36) - 1))
def test_pinterest_round_trip(shard: int, type_id: int, local: int) -> None:
    value = encode_pinterest(shard, type_id, local)
    assert 0 <= value < 1 << 62
    assert decode_pinterest(value) == (shard, type_id, local)
    # The unrolled fast path agrees with the layout as data.
    assert PINTEREST.decode(value) == {"shard_id": shard, "type_id": type_id, "local_id": local}
    assert PINTEREST.encode(shard_id=shard, type_id=type_id, local_id=local) == value


@given(st.integers(0, (1 << 40) - 1), st.integers(0, 8191), st.integers(0, 1023))
def test_instagram_round_trip(ms: int, shard: int, seq: int) -> None:
    value = encode_instagram(ms, shard, seq)
    assert 0 <= value <= MAX_ID
    assert decode_instagram(value) == (ms, shard, seq)


@given(st.integers(0, MAX_ID))
def test_instagram_ids_sort_by_time(value: int) -> None:
    later = encode_instagram(min(decode_instagram(value).ms + 1, (1 << 40) - 1), 0, 0)
    assert later > value or decode_instagram(value).ms == (1 << 40) - 1


@pytest.mark.parametrize(
    ("args", "field", "allowed"),
    [
        ((-1, 1, 1), "shard_id", "0..65535"),
        ((65536, 1, 1), "shard_id", "0..65535"),
        ((1, 1024, 1), "type_id", "0..1023"),
        ((1, -5, 1), "type_id", "0..1023"),
        ((1, 1, 1 << 36), "local_id", "0..68719476735"),
        ((1, 1, -1), "local_id", "0..68719476735"),
    ],
)
def test_pinterest_field_out_of_range(args: tuple[int, int, int], field: str, allowed: str) -> None:
    with pytest.raises(IdError, match=rf"{field} must be in {allowed}"):
        encode_pinterest(*args)


@pytest.mark.parametrize(
    ("args", "field"),
    [((-1, 1, 1), "ms"), ((1 << 41, 1, 1), "ms"), ((1, 8192, 1), "shard_id"), ((1, 1, 1024), "sequence")],
)
def test_instagram_field_out_of_range(args: tuple[int, int, int], field: str) -> None:
    with pytest.raises(IdError, match=field):
        encode_instagram(*args)


def test_instagram_id_must_stay_below_2_63() -> None:
    with pytest.raises(IdError, match=r"2\*\*63 or more"):
        encode_instagram(1 << 40, 0, 0)


@pytest.mark.parametrize("bad", [-1, 1 << 63, 1 << 64])
def test_ids_out_of_range_are_rejected(bad: int) -> None:
    with pytest.raises(IdError, match="below 2"):
        decode_pinterest(bad)
    with pytest.raises(IdError, match="below 2"):
        decode_instagram(bad)


def test_reserved_bits_set_is_an_error() -> None:
    with pytest.raises(IdError, match="reserved bits set"):
        decode_pinterest((1 << 62) | 5)


@pytest.mark.parametrize("bad", ["123", 1.0, None, True])
def test_non_integers_are_rejected(bad: object) -> None:
    with pytest.raises(IdError, match="must be an int"):
        decode_pinterest(bad)  # type: ignore[arg-type]
    with pytest.raises(IdError, match="must be an int"):
        encode_pinterest(1, 1, bad)  # type: ignore[arg-type]


def test_id_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="shard_id"):
        encode_pinterest(-1, 0, 0)


def test_layouts_fill_64_bits() -> None:
    assert sum(s.bits for s in PINTEREST.segments) == 64
    assert sum(s.bits for s in INSTAGRAM.segments) == 64
    with pytest.raises(ValueError, match="63 bits"):
        Layout("short", (Segment("a", 63),))
    with pytest.raises(IdError, match="needs field 'b'"):
        Layout("two", (Segment("a", 32), Segment("b", 32))).encode(a=1)
