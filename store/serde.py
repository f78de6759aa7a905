"""Serialisation of object data: a pluggable `Serde`, strict JSON by default.

Objects are stored as JSON text. The default `JsonSerde` accepts only plain
JSON values (dict with str keys, list, str, int, float, bool, None), because
anything else would not come back as it went in: orjson alone would turn NaN
into null, a tuple into a list and a datetime into a string. It checks the
value first, then encodes with orjson (3-10x faster than the standard json
module here) and enforces the size limit on the encoded bytes.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import orjson

from store.exceptions import NotSerializableError, ObjectTooLargeError

__all__ = ["JsonSerde", "Serde"]

_MAX_DEPTH = 100
_INT_RANGE = (-(1 << 63), (1 << 64) - 1)  # what orjson encodes


class Serde(Protocol):
    """Turns an object's dict into stored text and back."""

    def dumps(self, data: dict[str, Any]) -> str:
        """Encode ``data``; raise a `DataError` subclass if it cannot be stored."""
        ...

    def loads(self, text: str | bytes) -> dict[str, Any]:
        """Decode stored text."""
        ...


class JsonSerde:
    """Strict JSON with a size limit in bytes of UTF-8."""

    __slots__ = ("max_bytes",)

    def __init__(self, *, max_bytes: int = 1 << 20) -> None:
        self.max_bytes = max_bytes

    def dumps(self, data: dict[str, Any]) -> str:
        """Check that ``data`` is a plain JSON object and encode it."""
        if type(data) is not dict:
            raise NotSerializableError(
                f"object data must be a dict (a JSON object), got {type(data).__name__}"
            )
        _check(data, "data", 0)
        encoded = orjson.dumps(data)
        if len(encoded) > self.max_bytes:
            raise ObjectTooLargeError(
                f"object is {len(encoded)} bytes as JSON, over the limit of {self.max_bytes}; "
                "store large blobs elsewhere or raise limits.max_object_bytes"
            )
        return encoded.decode()

    def loads(self, text: str | bytes) -> dict[str, Any]:
        """Decode stored JSON text."""
        value: dict[str, Any] = orjson.loads(text)
        return value


def _check(value: object, path: str, depth: int) -> None:
    # Exact type checks on purpose: subclasses (IntEnum, OrderedDict, str
    # enums) serialise in surprising ways and do not round-trip.
    t = type(value)
    if t is str or t is bool or value is None:
        return
    if t is int:
        assert isinstance(value, int)
        if not _INT_RANGE[0] <= value <= _INT_RANGE[1]:
            raise NotSerializableError(f"{path} = {value} is outside the 64-bit integer range")
        return
    if t is float:
        assert isinstance(value, float)
        if not math.isfinite(value):
            raise NotSerializableError(
                f"{path} = {value} is not a finite number; JSON has no NaN or Infinity"
            )
        return
    if depth >= _MAX_DEPTH:
        raise NotSerializableError(f"{path} is nested more than {_MAX_DEPTH} levels deep")
    if t is dict:
        assert isinstance(value, dict)
        for k, v in value.items():
            if type(k) is not str:
                raise NotSerializableError(
                    f"{path} has key {k!r} of type {type(k).__name__}; JSON keys are strings"
                )
            _check(v, f"{path}.{k}", depth + 1)
        return
    if t is list:
        assert isinstance(value, list)
        for i, v in enumerate(value):
            _check(v, f"{path}[{i}]", depth + 1)
        return
    raise NotSerializableError(
        f"{path} is a {t.__name__}, which is not JSON; use dict, list, str, int, float, bool or None"
    )
