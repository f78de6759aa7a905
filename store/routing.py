"""Routing (pure): from a 64-bit ID to its shard, type, local id and master host.

No I/O here: a `Router` reads the ID's bits and the shard map, nothing else.
Routing never scans: the ID says where its object lives.
"""

from __future__ import annotations

import random
import threading
from bisect import bisect_right
from collections.abc import Collection, Mapping
from typing import NamedTuple, Protocol

from store.exceptions import IdError, UnknownRelationError, UnknownTypeError, WrongTypeError, brief
from store.forks import at_fork
from store.ids import MAX_ID, PINTEREST, decode_instagram, decode_pinterest
from store.shardmap import ShardMap
from store.specs import RelationSpec, TypeSpec

__all__ = ["MAX_LOCAL_ID", "Location", "Router", "RoutingConfig"]

MAX_LOCAL_ID = PINTEREST.field("local_id").max
_ID_LIMIT = 1 << 62  # IDs at or above this have reserved bits set


class Location(NamedTuple):
    """Where an ID's object lives."""

    shard: int
    type: TypeSpec
    local_id: int
    host: str


class RoutingConfig(Protocol):
    """What routing reads of a config (`store.config.StoreConfig` has all of it)."""

    @property
    def ids(self) -> str:
        """``pinterest`` or ``instagram``."""

    @property
    def shard_map(self) -> ShardMap:
        """The map to start from."""

    @property
    def types(self) -> Mapping[str, TypeSpec]:
        """Types by name."""

    @property
    def relations(self) -> Mapping[str, RelationSpec]:
        """Relations by name."""

    @property
    def open_shards(self) -> tuple[tuple[int, int], ...]:
        """Where new root objects go."""

    @property
    def max_page(self) -> int:
        """The largest page a list read may ask for."""

    @property
    def max_ids(self) -> int:
        """The most IDs (or pairs) one call may take."""

    @property
    def id_chunk(self) -> int:
        """The most IDs one query carries."""

    @property
    def max_cursor_bytes(self) -> int:
        """The longest page cursor accepted."""

    @property
    def cursor_secret(self) -> bytes | None:
        """The secret page cursors are signed with (None: unsigned)."""


class Router:
    """Routes Pinterest IDs with a config's types and shard map; picks shards for new objects."""

    def __init__(self, config: RoutingConfig, *, rng: random.Random | None = None) -> None:
        self.config = config
        self.shard_map: ShardMap = config.shard_map
        self._types_by_id = {t.id: t for t in config.types.values()}
        self._rng = rng or random.Random()
        self._rng_lock = threading.Lock()
        self._own_rng = rng is None
        at_fork(self, Router._after_fork)
        self._instagram = config.ids == "instagram"
        starts, total = [], 0
        for low, high in config.open_shards:
            starts.append(total)
            total += high - low + 1
        self._open_starts = starts
        self._open_total = total

    def _after_fork(self) -> None:
        """In a forked child: a lock of its own; its own random shard choices (unless given an rng)."""
        self._rng_lock = threading.Lock()
        if self._own_rng:
            self._rng.seed()

    def route(self, id: int, type_name: str | None = None) -> tuple[int, TypeSpec, int, str]:  # noqa: A002
        """(shard, type, row key, master host) of ``id``; raises a precise error if it has none.

        The row key is the local id for Pinterest IDs, the whole ID for
        Instagram IDs (which carry no type: the caller names it).
        """
        # Decoded first (every scheme), then the map asked once.
        if self._instagram:
            shard, spec, key = self._instagram_key(id, type_name)
        elif type(id) is int and 0 < id < _ID_LIMIT:
            # The hot path of every call: decode inline (decode_pinterest
            # re-checks and raises the precise IdError for anything odd).
            shard = id >> 46
            found = self._types_by_id.get((id >> 36) & 0x3FF)
            key = id & MAX_LOCAL_ID
            if found is None or key == 0 or (type_name is not None and found.name != type_name):
                self._route_error(id, type_name)
            assert found is not None
            spec = found
        else:
            shard, type_id, key = decode_pinterest(id)
            found = self._types_by_id.get(type_id)
            if found is None or key == 0 or (type_name is not None and found.name != type_name):
                self._route_error(id, type_name)
            assert found is not None
            spec = found
        return shard, spec, key, self.shard_map.master(shard)

    def check_ids(self, ids: list[int], type_name: str | None = None) -> None:
        """Raise `route`'s error for the first of ``ids`` that does not route; quick for the ones that do.

        For a batch whose keys come from the IDs alone (Pinterest IDs carry
        their type and shard): only the ones read from the database are
        routed in full.
        """
        if self._instagram:
            for id_ in ids:
                self.route(id_, type_name)
            return
        allowed: Collection[int]
        if type_name is None:
            allowed = self._types_by_id.keys()
        else:
            allowed = {t.id for t in self._types_by_id.values() if t.name == type_name}
        shards = self.shard_map.shards
        for id_ in ids:
            if not (
                type(id_) is int
                and 0 < id_ < _ID_LIMIT
                and id_ & MAX_LOCAL_ID
                and (id_ >> 36) & 0x3FF in allowed
                and id_ >> 46 < shards
            ):
                self.route(id_, type_name)

    def by_host_instagram(self, ids: list[int], type_name: str | None) -> dict[str, dict[int, list[int]]]:
        """Instagram IDs grouped by master host, then shard (repeats kept), each checked as `route` checks it.

        The hot path of a batch read: the 13 shard bits read inline, the map
        asked once per shard, not per ID. An ID that does not route raises
        `route`'s error.
        """
        if not ids:
            return {}
        if type_name is None or not self._instagram:
            self.route(ids[0], type_name)  # an Instagram ID carries no type: raises
            raise AssertionError("by_host_instagram is for Instagram IDs of a named type")
        self.type(type_name)
        by_shard: dict[int, list[int]] = {}
        for id_ in ids:
            if type(id_) is int and 0 < id_ <= MAX_ID:
                shard = (id_ >> 10) & 0x1FFF
                group = by_shard.get(shard)
                if group is None:
                    group = by_shard[shard] = []
                group.append(id_)
            else:
                self.route(id_, type_name)  # raises the precise error (a non-int, 0, out of range)
        out: dict[str, dict[int, list[int]]] = {}
        master = self.shard_map.master
        for shard, group in by_shard.items():
            out.setdefault(master(shard), {})[shard] = group
        return out

    def _instagram_key(self, id: int, type_name: str | None) -> tuple[int, TypeSpec, int]:  # noqa: A002
        """(shard, type, row key) of an Instagram ID: the type is the caller's, the key the whole ID."""
        # The 13 shard bits, inline; decode_instagram raises the precise IdError.
        well_formed = type(id) is int and 0 < id <= MAX_ID
        shard = (id >> 10) & 0x1FFF if well_formed else decode_instagram(id).shard_id
        if type_name is None:
            raise IdError(
                f"Instagram ID {id} carries no type: pass type_name= (one of {', '.join(self.config.types)})"
            )
        if id == 0:
            raise IdError("ID 0 is no object's ID")
        return shard, self.type(type_name), id

    def locate(self, id: int, type_name: str | None = None) -> Location:  # noqa: A002
        """`route` as a named tuple."""
        return Location(*self.route(id, type_name))

    def _route_error(self, id: int, type_name: str | None) -> None:  # noqa: A002
        _shard, type_id, local_id = decode_pinterest(id)
        spec = self._types_by_id.get(type_id)
        if spec is None:
            raise UnknownTypeError(
                f"ID {id} has type id {type_id}, which no type in the config uses "
                f"(known: {', '.join(f'{t.name}={t.id}' for t in self.config.types.values())})"
            )
        if type_name is not None and spec.name != type_name:
            self.type(type_name)
            raise WrongTypeError(f"ID {id} is a {spec.name}, not a {type_name}")
        if local_id == 0:
            raise IdError(f"ID {id} has local id 0, which no object has (local ids start at 1)")

    def type(self, type_name: str) -> TypeSpec:
        """The type called ``type_name``; `UnknownTypeError` listing the known ones."""
        try:
            spec = self.config.types.get(type_name)
        except TypeError:  # unhashable: a list, a dict
            spec = None
        if spec is None:
            what = "unknown type" if isinstance(type_name, str) else "a type name must be a str, got"
            raise UnknownTypeError(
                f"{what} {brief(type_name)}; the config defines: {', '.join(self.config.types)}"
            )
        return spec

    def relation(self, name: str) -> RelationSpec:
        """The relation called ``name``; `UnknownRelationError` listing the known ones."""
        try:
            spec = self.config.relations.get(name)
        except TypeError:  # unhashable: a list, a dict
            spec = None
        if spec is None:
            known = ", ".join(self.config.relations) or "none"
            what = "unknown relation" if isinstance(name, str) else "a relation name must be a str, got"
            raise UnknownRelationError(f"{what} {brief(name)}; the config defines: {known}")
        return spec

    def pick_shard(self) -> int:
        """A uniformly random open shard, for an object with no `near`."""
        with self._rng_lock:
            n = self._rng.randrange(self._open_total)
        i = bisect_right(self._open_starts, n) - 1
        return self.config.open_shards[i][0] + n - self._open_starts[i]

    def shard_of(self, id: int) -> int:  # noqa: A002
        """The shard bits of ``id`` (checked to be a well-formed ID)."""
        return (decode_instagram(id) if self._instagram else decode_pinterest(id)).shard_id
