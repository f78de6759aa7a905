"""Serialisation of object data: a pluggable `Serde`, strict JSON by default.

Objects are stored as JSON text. The default `JsonSerde` accepts only plain
JSON values (dict with str keys, list, str, int, float, bool, None), because
anything else would not come back as it went in: orjson alone would turn NaN
into null, a tuple into a list and a datetime into a string. It checks the
value first (types, 64-bit ints, finite floats, nesting depth), then encodes
with orjson (3-10x faster than the standard json module here), which also
refuses text that is not valid Unicode (a lone surrogate such as ``"\\ud800"``),
and enforces the size limit on the encoded bytes. Whatever it refuses raises
a `DataError` subclass naming the path to the bad value, before any I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

import orjson

from store.exceptions import NotSerializableError, ObjectTooLargeError, brief

__all__ = ["ENCODER_MAX_DEPTH", "JsonSerde", "Serde"]

#: The deepest nesting orjson encodes (it refuses 255 levels); a larger ``max_depth`` acts as this.
ENCODER_MAX_DEPTH = 254
_DEFAULT_MAX_DEPTH = 100
_INT_RANGE = (-(1 << 63), (1 << 64) - 1)  # what orjson encodes
_PATH_CHARS = 120  # of a path quoted in a message


class Serde(Protocol):
    """Turns an object's dict into stored text and back."""

    def dumps(self, data: dict[str, Any]) -> str:
        """Encode ``data``; raise a `DataError` subclass if it cannot be stored."""
        ...

    def loads(self, text: str | bytes) -> dict[str, Any]:
        """Decode stored text."""
        ...


class JsonSerde:
    """Strict JSON with a size limit in bytes of UTF-8 and a nesting limit.

    ``max_depth`` counts containers: the object itself is level 1, so
    ``max_depth=1`` allows only scalar values in it. A `Store` passes
    ``limits.max_object_bytes`` and ``limits.max_depth``.
    """

    __slots__ = ("_depth", "max_bytes", "max_depth")

    def __init__(self, *, max_bytes: int = 1 << 20, max_depth: int = _DEFAULT_MAX_DEPTH) -> None:
        self.max_bytes = max_bytes
        self.max_depth = max_depth
        self._depth = min(max_depth, ENCODER_MAX_DEPTH)

    def dumps(self, data: dict[str, Any]) -> str:
        """Check that ``data`` is a plain JSON object and encode it."""
        if type(data) is not dict:
            raise NotSerializableError(
                f"object data must be a dict (a JSON object), got {type(data).__name__}"
            )
        if not _fits(data, 0, self._depth):
            _check(data, "data", 0, self._depth)  # raises, naming the path to the bad value
            raise NotSerializableError("object data is not plain JSON")  # (not reached: as `_fits`)
        try:
            encoded = orjson.dumps(data)
        except orjson.JSONEncodeError as exc:
            # What the check lets through and orjson refuses: text with a lone surrogate.
            _check_text(data, "data")
            raise NotSerializableError(f"object data cannot be encoded as JSON: {exc}") from None
        if len(encoded) > self.max_bytes:
            raise ObjectTooLargeError(
                f"object is {len(encoded)} bytes as JSON, over the limit of {self.max_bytes}; "
                "store large blobs elsewhere or raise limits.max_object_bytes"
            )
        return encoded.decode()

    #: Decode stored JSON text: orjson's own function, so a page of 50 objects makes no
    #: wrapper call per object (the store only decodes what it encoded: objects).
    loads: Callable[[str | bytes], dict[str, Any]] = staticmethod(orjson.loads)


def _shown(path: str) -> str:
    """A path for a message: one printable line (newlines, controls, lone surrogates escaped), cut short."""
    if not path.isprintable():
        path = "".join(c if c.isprintable() else repr(c)[1:-1] for c in path)
    return path if len(path) <= _PATH_CHARS else path[: _PATH_CHARS - 3] + "..."


def _fits(value: dict[str, Any] | list[Any], depth: int, max_depth: int) -> bool:
    """Whether `_check` passes the container ``value`` at ``depth``: the same rules, with no path
    made for each value (`_check` runs after a False, to say where and why)."""
    if depth >= max_depth:
        return False
    lo, hi = _INT_RANGE
    if type(value) is dict:
        for k in value:
            if type(k) is not str:
                return False
        values: Any = value.values()
    else:
        values = value
    for v in values:
        t = type(v)
        if t is str or t is bool or v is None:
            continue
        if t is int:
            if not lo <= v <= hi:
                return False
        elif t is float:
            if not math.isfinite(v):
                return False
        elif t is dict or t is list:
            if not _fits(v, depth + 1, max_depth):
                return False
        else:
            return False
    return True


def _check(value: object, path: str, depth: int, max_depth: int) -> None:
    # Exact type checks on purpose: subclasses (IntEnum, OrderedDict, str
    # enums) serialise in surprising ways and do not round-trip.
    t = type(value)
    if t is str or t is bool or value is None:
        return
    if t is int:
        assert isinstance(value, int)
        if not _INT_RANGE[0] <= value <= _INT_RANGE[1]:
            raise NotSerializableError(
                f"{_shown(path)} = {brief(value)} is outside the 64-bit integer range; store it as a string"
            )
        return
    if t is float:
        assert isinstance(value, float)
        if not math.isfinite(value):
            raise NotSerializableError(
                f"{_shown(path)} = {value} is not a finite number; JSON has no NaN or Infinity"
            )
        return
    if depth >= max_depth:
        raise NotSerializableError(
            f"{_shown(path)} is nested more than {max_depth} levels deep; flatten the object "
            + (
                "or raise limits.max_depth"
                if max_depth < ENCODER_MAX_DEPTH
                else f"(JSON encoding stops at {ENCODER_MAX_DEPTH} levels)"
            )
        )
    if t is dict:
        assert isinstance(value, dict)
        for k, v in value.items():
            if type(k) is not str:
                raise NotSerializableError(
                    f"{_shown(path)} has key {brief(k)} of type {type(k).__name__}; JSON keys are strings"
                )
            _check(v, f"{path}.{k}", depth + 1, max_depth)
        return
    if t is list:
        assert isinstance(value, list)
        for i, v in enumerate(value):
            _check(v, f"{path}[{i}]", depth + 1, max_depth)
        return
    raise NotSerializableError(
        f"{_shown(path)} is a {t.__name__}, which is not JSON; use dict, list, str, int, float, bool or None"
    )


def _check_text(value: object, path: str) -> None:
    """`NotSerializableError` for the first key or string (of a checked value) that is not valid Unicode.

    Only after orjson refused the value: strings are not walked on the way in.
    """
    if type(value) is str:
        assert isinstance(value, str)
        if not _valid(value):
            raise NotSerializableError(
                f"{_shown(path)} = {brief(value)} holds a lone surrogate, which is not valid "
                "Unicode (UTF-8); decode the text properly or drop the bad character"
            )
    elif type(value) is dict:
        assert isinstance(value, dict)
        for k, v in value.items():
            if not _valid(k):
                raise NotSerializableError(
                    f"{_shown(path)} has key {brief(k)} with a lone surrogate, which is not valid "
                    "Unicode (UTF-8); decode the text properly or drop the bad character"
                )
            _check_text(v, f"{path}.{k}")
    elif type(value) is list:
        assert isinstance(value, list)
        for i, v in enumerate(value):
            _check_text(v, f"{path}[{i}]")


def _valid(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8 (no lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
