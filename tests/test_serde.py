"""Strict JSON: what cannot round-trip is refused before any I/O."""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store import JsonSerde, NotSerializableError, ObjectTooLargeError


class Color(enum.IntEnum):
    RED = 1


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"x": float("nan")}, "not a finite number"),
        ({"x": float("inf")}, "not a finite number"),
        ({"x": {1, 2}}, "set, which is not JSON"),
        ({"x": (1, 2)}, "tuple, which is not JSON"),
        ({"x": dt.datetime(2020, 1, 1)}, "datetime, which is not JSON"),
        ({"x": b"bytes"}, "bytes, which is not JSON"),
        ({"x": Color.RED}, "Color, which is not JSON"),
        ({1: "int key"}, "key 1 of type int"),
        ({"deep": {"er": [1, {"x": object()}]}}, r"data.deep.er\[1\].x is a object"),
        ({"big": 1 << 70}, "outside the 64-bit integer range"),
    ],
)
def test_non_json_is_refused_with_the_path(data: dict[str, Any], message: str) -> None:
    with pytest.raises(NotSerializableError, match=message):
        JsonSerde().dumps(data)


@pytest.mark.parametrize("data", [[1, 2], "text", None, 5])
def test_top_level_must_be_an_object(data: Any) -> None:
    with pytest.raises(NotSerializableError, match="must be a dict"):
        JsonSerde().dumps(data)


def test_too_deep_is_refused() -> None:
    data: dict[str, Any] = {}
    node = data
    for _ in range(150):
        node["x"] = {}
        node = node["x"]
    with pytest.raises(NotSerializableError, match="nested more than 100"):
        JsonSerde().dumps(data)


def test_size_limit_counts_utf8_bytes() -> None:
    serde = JsonSerde(max_bytes=20)
    assert serde.loads(serde.dumps({"a": "x" * 10})) == {"a": "x" * 10}
    with pytest.raises(ObjectTooLargeError, match="over the limit of 20"):
        serde.dumps({"a": "é" * 10})  # 10 characters, 20 bytes, plus the braces


def test_round_trip_of_plain_json() -> None:
    data = {"s": "ünïcödé ☃", "i": -(1 << 63), "f": 1.5, "b": True, "n": None, "l": [1, [2, {"x": []}]]}
    serde = JsonSerde()
    assert serde.loads(serde.dumps(data)) == data


_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(1 << 66), max_value=1 << 66),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=3),
    st.sampled_from([(1,), {1}, b"x", Color.RED, dt.date(2020, 1, 1)]),
)
_VALUES = st.recursive(
    _LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(st.text(max_size=2), st.integers(0, 2)), inner, max_size=3),
    ),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(data=st.dictionaries(st.text(max_size=2), _VALUES, max_size=4), depth=st.integers(1, 4))
def test_the_quick_check_passes_exactly_what_the_walk_with_paths_passes(
    data: dict[str, Any], depth: int
) -> None:
    """`JsonSerde.dumps` checks without making a path per value, and walks again naming the path only
    when that check fails: the same values pass or fail, with the walk's message."""
    from store.serde import _check, _fits

    try:
        _check(data, "data", 0, depth)
        walked = None
    except NotSerializableError as exc:
        walked = str(exc)
    assert _fits(data, 0, depth) is (walked is None)
    serde = JsonSerde(max_depth=depth)
    if walked is None:
        assert serde.dumps(data)
    else:
        with pytest.raises(NotSerializableError) as got:
            serde.dumps(data)
        assert str(got.value) == walked
