"""64-bit ID layouts as data, and their encoders and decoders (pure).

A layout is a tuple of named bit segments, most significant first, whose
widths add up to 64. Two layouts ship:

* ``PINTEREST``: 2 reserved bits (always 0) | 16-bit shard | 10-bit type |
  36-bit local id, the AUTO_INCREMENT key of the object's row in its shard.
* ``INSTAGRAM``: 41 bits of milliseconds since an epoch | 13-bit logical
  shard | 10-bit per-table sequence.

Every ID must also fit a signed BIGINT (below 2**63), so an Instagram ID's
millisecond field can use 40 of its 41 bits: about 34.8 years from the epoch.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from typing import NamedTuple

from store.exceptions import IdError, brief

__all__ = [
    "INSTAGRAM",
    "INSTAGRAM_EPOCH_MS",
    "MAX_ID",
    "PINTEREST",
    "InstagramId",
    "Layout",
    "PinterestId",
    "Segment",
    "decode_instagram",
    "decode_pinterest",
    "encode_instagram",
    "encode_pinterest",
    "instagram_datetime",
    "makes_ids_again",
]

#: IDs are stored as signed BIGINT by PostgreSQL and most clients, so they stay below 2**63.
MAX_ID = (1 << 63) - 1

#: Instagram's published ``next_id()`` epoch (2011-08-24T21:07:01.721Z), our default.
INSTAGRAM_EPOCH_MS = 1314220021721


@dataclass(frozen=True, slots=True)
class Segment:
    """One named bit field of a layout. ``reserved`` fields must be zero."""

    name: str
    bits: int
    reserved: bool = False

    @property
    def max(self) -> int:
        """The largest value the field holds."""
        return (1 << self.bits) - 1


class Layout:
    """An ordered set of segments (most significant first) filling 64 bits."""

    __slots__ = ("_shifts", "name", "segments")

    def __init__(self, name: str, segments: tuple[Segment, ...]) -> None:
        total = sum(s.bits for s in segments)
        if total != 64:
            raise ValueError(f"layout {name!r} has {total} bits, expected 64")
        self.name = name
        self.segments = segments
        shifts: list[int] = []
        remaining = 64
        for seg in segments:
            remaining -= seg.bits
            shifts.append(remaining)
        self._shifts = tuple(shifts)

    def field(self, name: str) -> Segment:
        """The segment called ``name``."""
        for seg in self.segments:
            if seg.name == name:
                return seg
        raise KeyError(name)

    def encode(self, **fields: int) -> int:
        """Pack named field values into one ID, range-checking every field."""
        value = 0
        for seg, shift in zip(self.segments, self._shifts, strict=True):
            if seg.reserved:
                continue
            if seg.name not in fields:
                raise IdError(f"{self.name} ID needs field {seg.name!r}")
            field_value = fields[seg.name]
            _check_int(field_value, f"{seg.name}")
            if not 0 <= field_value <= seg.max:
                raise IdError(
                    f"{seg.name} must be in 0..{seg.max} for a {self.name} ID, got {brief(field_value)}"
                )
            value |= field_value << shift
        if value > MAX_ID:
            raise IdError(
                f"{self.name} ID {value} is 2**63 or more and would be negative as a signed "
                f"BIGINT; use a smaller {self.segments[0].name}"
            )
        return value

    def decode(self, value: object) -> dict[str, int]:
        """Split an ID into its named fields; reserved bits must be zero."""
        _check_int(value, f"{self.name} ID")
        assert isinstance(value, int)
        if not 0 <= value <= MAX_ID:
            raise IdError(f"{self.name} ID must be in 0..{MAX_ID} (below 2**63), got {brief(value)}")
        out: dict[str, int] = {}
        for seg, shift in zip(self.segments, self._shifts, strict=True):
            field_value = (value >> shift) & seg.max
            if seg.reserved:
                if field_value:
                    raise IdError(f"{self.name} ID {value} has reserved bits set ({seg.name}={field_value})")
                continue
            out[seg.name] = field_value
        return out


def _check_int(value: object, what: str) -> None:
    # bool is an int subclass, and True as an ID is always a caller's bug.
    if not isinstance(value, int) or isinstance(value, bool):
        raise IdError(f"{what} must be an int, got {type(value).__name__} {brief(value)}")


PINTEREST = Layout(
    "pinterest",
    (
        Segment("reserved", 2, reserved=True),
        Segment("shard_id", 16),
        Segment("type_id", 10),
        Segment("local_id", 36),
    ),
)

INSTAGRAM = Layout(
    "instagram",
    (Segment("ms", 41), Segment("shard_id", 13), Segment("sequence", 10)),
)


class PinterestId(NamedTuple):
    """A decoded Pinterest-style ID."""

    shard_id: int
    type_id: int
    local_id: int


class InstagramId(NamedTuple):
    """A decoded Instagram-style ID; ``ms`` counts from the layout's epoch."""

    ms: int
    shard_id: int
    sequence: int

    def datetime(self, epoch_ms: int = INSTAGRAM_EPOCH_MS) -> _dt.datetime:
        """The wall-clock creation time (UTC) for IDs made with ``epoch_ms``.

        `IdError` if ``epoch_ms`` is not an int or the time falls outside the years 1-9999.
        """
        _check_int(epoch_ms, "epoch_ms")
        try:
            return _dt.datetime.fromtimestamp((epoch_ms + self.ms) / 1000, tz=_dt.UTC)
        except (OverflowError, OSError, ValueError):
            raise IdError(
                f"epoch_ms {brief(epoch_ms)} + {self.ms} ms is not a time in the years 1-9999; "
                f"pass the epoch the IDs were made with (Instagram's is {INSTAGRAM_EPOCH_MS})"
            ) from None


# The two hot-path functions below are unrolled shifts of the layouts above:
# a Layout.decode call costs about 2 us, these about 0.3 us. A test checks that
# they agree with the layouts for random IDs.
_P_SHARD_SHIFT = 46
_P_TYPE_SHIFT = 36
_P_LOCAL_MASK = (1 << 36) - 1


def encode_pinterest(shard_id: int, type_id: int, local_id: int) -> int:
    """Build a Pinterest ID; raises `IdError` naming any field out of range."""
    if (
        type(shard_id) is int
        and type(type_id) is int
        and type(local_id) is int
        and 0 <= shard_id <= 0xFFFF
        and 0 <= type_id <= 0x3FF
        and 0 <= local_id <= _P_LOCAL_MASK
    ):
        return (shard_id << _P_SHARD_SHIFT) | (type_id << _P_TYPE_SHIFT) | local_id
    return PINTEREST.encode(shard_id=shard_id, type_id=type_id, local_id=local_id)


def decode_pinterest(id: int) -> PinterestId:  # noqa: A002 - `id` is the documented name
    """Split a Pinterest ID into shard, type and local id."""
    if type(id) is int and 0 <= id < (1 << 62):
        return PinterestId(id >> _P_SHARD_SHIFT, (id >> _P_TYPE_SHIFT) & 0x3FF, id & _P_LOCAL_MASK)
    f = PINTEREST.decode(id)  # raises the precise IdError
    return PinterestId(f["shard_id"], f["type_id"], f["local_id"])


def encode_instagram(ms: int, shard_id: int, sequence: int) -> int:
    """Build an Instagram ID from ms since the epoch, logical shard and sequence."""
    return INSTAGRAM.encode(ms=ms, shard_id=shard_id, sequence=sequence)


def decode_instagram(id: int) -> InstagramId:  # noqa: A002 - `id` is the documented name
    """Split an Instagram ID into ms since the epoch, shard and sequence."""
    f = INSTAGRAM.decode(id)
    return InstagramId(f["ms"], f["shard_id"], f["sequence"])


def instagram_datetime(id: int, epoch_ms: int = INSTAGRAM_EPOCH_MS) -> _dt.datetime:  # noqa: A002
    """The UTC creation time of an Instagram ID made with ``epoch_ms``."""
    return decode_instagram(id).datetime(epoch_ms)


def makes_ids_again(ids: str) -> bool:
    """Whether a layout's IDs can be made again, so a create must drop what caches hold under its new ID.

    ``"pinterest"``: yes. The local id is the row's AUTO_INCREMENT key, which
    starts again after a development reset or a restore from an older backup
    while the caches still hold the old objects' entries.

    ``"instagram"``: no. An ID carries the millisecond its database made it
    and the logical shard; two IDs of one shard in one millisecond differ by
    the per-table sequence (10 bits), and the ID is the row's primary key, so
    a repeat within a millisecond fails its INSERT instead of making an
    object. A reset or a restore takes the sequences back, not the clock.
    Only a database clock set back past IDs already made (or a changed
    epoch) could make one again: flush the caches after that, as after any
    change made around the store.
    """
    if ids not in ("pinterest", "instagram"):
        raise ValueError(f"ids must be 'pinterest' or 'instagram', got {brief(ids)}")
    return ids == "pinterest"
