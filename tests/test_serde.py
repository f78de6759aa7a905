"""Strict JSON: what cannot round-trip is refused before any I/O."""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any

import pytest

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
