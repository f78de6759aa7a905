"""The shard map: contiguous shard ranges -> (master, slave) host names (pure).

A `ShardMap` is an immutable, versioned value checked when it is built: its
ranges cover every shard from 0 to ``shards - 1`` with no gap and no overlap.
Lookup is a binary search over range starts, O(log ranges).
"""

from __future__ import annotations

import itertools
from bisect import bisect_right
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from store.exceptions import ConfigError, RoutingError

__all__ = ["ShardMap", "ShardRange"]


@dataclass(frozen=True, slots=True)
class ShardRange:
    """Shards ``start..end`` (both inclusive) served by ``master`` (and ``slave``)."""

    start: int
    end: int
    master: str
    slave: str | None = None

    def __contains__(self, shard: object) -> bool:
        return isinstance(shard, int) and self.start <= shard <= self.end

    def __len__(self) -> int:
        return self.end - self.start + 1

    def shards(self) -> range:
        """The shard numbers of this range."""
        return range(self.start, self.end + 1)


class ShardMap:
    """Immutable map of every shard to its host pair, with a version number."""

    __slots__ = ("_ends", "_masters", "_starts", "ranges", "shards", "version")

    def __init__(self, ranges: Iterable[ShardRange], *, shards: int, version: int = 1) -> None:
        ordered = tuple(sorted(ranges, key=lambda r: r.start))
        if not isinstance(shards, int) or isinstance(shards, bool) or not 1 <= shards <= 65536:
            raise ConfigError(f"shards must be an int in 1..65536, got {shards!r}")
        if not isinstance(version, int) or version < 1:
            raise ConfigError(f"map version must be a positive int, got {version!r}")
        if not ordered:
            raise ConfigError(f"map is empty: add a range covering shards 0..{shards - 1}")
        expected = 0
        for r in ordered:
            if r.start > r.end:
                raise ConfigError(f"map range [{r.start}, {r.end}] is reversed: write [low, high]")
            if r.start > expected:
                raise ConfigError(
                    f"map has a gap: shards {expected}..{r.start - 1} are in no range; "
                    "extend a neighbouring range or add one"
                )
            if r.start < expected:
                raise ConfigError(
                    f"map ranges overlap at shard {r.start}: each shard must be in exactly one range"
                )
            expected = r.end + 1
        if expected != shards:
            if expected < shards:
                raise ConfigError(
                    f"map has a gap: shards {expected}..{shards - 1} are in no range "
                    f"(the config says shards: {shards})"
                )
            raise ConfigError(
                f"map range ends at shard {expected - 1}, beyond the last shard {shards - 1} "
                f"(shards: {shards}); shrink the range or raise shards"
            )
        init = object.__setattr__  # the map is frozen: __setattr__ refuses
        init(self, "ranges", ordered)
        init(self, "shards", shards)
        init(self, "version", version)
        init(self, "_starts", tuple(r.start for r in ordered))
        init(self, "_ends", tuple(r.end for r in ordered))
        # shard -> master, filled as shards are routed (the map never changes; a dict read is cheaper
        # than a bisection on every call, and concurrent fills write the same value)
        init(self, "_masters", {})

    ranges: tuple[ShardRange, ...]
    _masters: dict[int, str]
    shards: int
    version: int
    _starts: tuple[int, ...]
    _ends: tuple[int, ...]

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its ranges, shard count and version (built again, checked, on load)."""
        return _rebuild, (self.ranges, self.shards, self.version)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"ShardMap is immutable; build a new one (tried to set {name})")

    def range_for(self, shard: int) -> ShardRange:
        """The range holding ``shard``; `RoutingError` if no range does."""
        i = bisect_right(self._starts, shard) - 1
        if i < 0 or shard > self._ends[i]:
            raise RoutingError(
                f"shard {shard} is not in the shard map (shards 0..{self.shards - 1}, "
                f"map version {self.version}): the ID is not from this store, or the map is stale"
            )
        return self.ranges[i]

    def master(self, shard: int) -> str:
        """Name of the host that serves reads and writes for ``shard``."""
        host = self._masters.get(shard)
        if host is None:
            host = self._masters[shard] = self.range_for(shard).master
        return host

    def hosts(self) -> list[str]:
        """Every host name the map mentions, masters and slaves, in first-seen order."""
        seen: dict[str, None] = {}
        for r in self.ranges:
            seen[r.master] = None
            if r.slave is not None:
                seen[r.slave] = None
        return list(seen)

    def shards_of(self, host: str) -> Iterator[int]:
        """Every shard whose master is ``host``."""
        for r in self.ranges:
            if r.master == host:
                yield from r.shards()

    def with_move(self, low: int, high: int, master: str, slave: str | None = None) -> ShardMap:
        """A new map (version + 1) in which shards ``low..high`` are served by ``master``.

        The range may be part of existing ranges, which are split; neighbours
        left with the same hosts are merged back into one range.
        """
        if not 0 <= low <= high < self.shards:
            raise ConfigError(f"shards {low}-{high} are not within 0-{self.shards - 1}, low before high")
        pieces: list[ShardRange] = []
        for r in self.ranges:
            if r.end < low or r.start > high:
                pieces.append(r)
                continue
            if r.start < low:
                pieces.append(ShardRange(r.start, low - 1, r.master, r.slave))
            if r.end > high:
                pieces.append(ShardRange(high + 1, r.end, r.master, r.slave))
        pieces.append(ShardRange(low, high, master, slave))
        return ShardMap(_merge(pieces), shards=self.shards, version=self.version + 1)

    def diff(self, other: ShardMap) -> list[tuple[int, int, str, str]]:
        """(first, last, master here, master in ``other``) for every shard span whose master differs."""
        out: list[tuple[int, int, str, str]] = []
        bounds = sorted({r.start for r in self.ranges} | {r.start for r in other.ranges} | {self.shards})
        for start, nxt in itertools.pairwise(bounds):
            a, b = self.range_for(start).master, other.range_for(start).master
            if a != b:
                if out and out[-1][1] == start - 1 and out[-1][2:] == (a, b):
                    out[-1] = (out[-1][0], nxt - 1, a, b)
                else:
                    out.append((start, nxt - 1, a, b))
        return out

    def to_dict(self) -> dict[str, object]:
        """The map as plain data (the config's ``map:`` form plus version and shards)."""
        return {
            "version": self.version,
            "shards": self.shards,
            "map": [
                {"range": [r.start, r.end], "master": r.master, **({"slave": r.slave} if r.slave else {})}
                for r in self.ranges
            ],
        }

    @classmethod
    def from_dict(cls, raw: object) -> ShardMap:
        """The inverse of `to_dict`, checked like the config's map."""
        if not isinstance(raw, dict) or not isinstance(raw.get("map"), list):
            raise ConfigError("a stored shard map must be {version, shards, map: [...]}")
        ranges = []
        for i, item in enumerate(raw["map"]):
            try:
                (low, high), master = item["range"], item["master"]
            except (KeyError, TypeError, ValueError) as exc:
                raise ConfigError(
                    f"stored shard map entry {i} is not {{range: [a, b], master: HOST}}"
                ) from exc
            ranges.append(ShardRange(int(low), int(high), str(master), item.get("slave")))
        return cls(ranges, shards=raw.get("shards"), version=raw.get("version", 1))  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[ShardRange]:
        return iter(self.ranges)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ShardMap):
            return NotImplemented
        return (self.ranges, self.shards, self.version) == (other.ranges, other.shards, other.version)

    def __hash__(self) -> int:
        return hash((self.ranges, self.shards, self.version))

    def __repr__(self) -> str:
        return f"ShardMap(version={self.version}, shards={self.shards}, ranges={len(self.ranges)})"


def _merge(ranges: list[ShardRange]) -> list[ShardRange]:
    out: list[ShardRange] = []
    for r in sorted(ranges, key=lambda r: r.start):
        last = out[-1] if out else None
        if last is not None and last.end + 1 == r.start and (last.master, last.slave) == (r.master, r.slave):
            out[-1] = ShardRange(last.start, r.end, r.master, r.slave)
        else:
            out.append(r)
    return out


def _rebuild(ranges: Iterable[ShardRange], shards: int, version: int) -> ShardMap:
    """A pickled `ShardMap` again (`ShardMap.__reduce__`)."""
    return ShardMap(ranges, shards=shards, version=version)
