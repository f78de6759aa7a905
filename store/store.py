"""The `Store` facade: the library's one entry point, thin over its services.

Data flows one way: caller -> `Store` -> `ObjectService` / `RelationService`
-> routing (the ID's shard bits and the live map) and caches -> backends ->
the shard's host. No call ever scans shards to find an object: its ID says
where it lives. Every call runs through the live map (`store.livemap`),
which reroutes it once when a host refuses it for an older map.
"""

from __future__ import annotations

import functools
import os
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar

from store.cache import Caches, build_caches
from store.config import StoreConfig
from store.cursors import decode_cursor, encode_cursor
from store.defaults import embedded_config
from store.engines import Engines
from store.exceptions import NotFound
from store.livemap import LiveMap
from store.mapsource import MapSource
from store.objects import ObjectRepository, ObjectService, Updater, Versioned
from store.relations import Page, RelationRepository, RelationService
from store.routing import Location, Router
from store.serde import JsonSerde, Serde
from store.shardmap import ShardMap

__all__ = ["AdminContext", "Location", "Store"]

P = ParamSpec("P")
R = TypeVar("R")


def _rerouted(method: Callable[Concatenate[Store, P], R]) -> Callable[Concatenate[Store, P], R]:
    """Run the call through the live map: a newer map now and then, one retry after a reroute."""

    @functools.wraps(method)
    def wrapper(self: Store, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._live.run(lambda: method(self, *args, **kwargs))

    return wrapper


@dataclass(frozen=True)
class AdminContext:
    """What admin jobs (init, check, repair, move, promote) and tools reach inside a store.

    The request path never needs it; `Store.admin_context` hands it out.
    """

    config: StoreConfig
    engines: Engines
    router: Router
    live: LiveMap
    objects: ObjectService
    relations: RelationService
    caches: Caches

    @property
    def relation_repository(self) -> RelationRepository:
        """The relation SQL, per shard."""
        return self.relations.repo

    @property
    def shard_map(self) -> ShardMap:
        """The map the store routes by now."""
        return self.live.current

    @property
    def map_source(self) -> MapSource:
        """Where the store reads its live map."""
        return self.live.source

    def refresh_map(self, *, force: bool = False) -> bool:
        """Reload the map if the source has a newer one; True if it changed."""
        return self.live.refresh(force=force)


class Store:
    """Objects sharded over many hosts, addressed by 64-bit IDs that carry their shard."""

    def __init__(
        self,
        config: StoreConfig,
        *,
        engines: Engines | None = None,
        serde: Serde | None = None,
        rng: random.Random | None = None,
        clock_us: Callable[[], int] | None = None,
        caches: Caches | None = None,
        map_source: MapSource | None = None,
    ) -> None:
        self.config = config
        self._engines = engines or Engines(config)
        self._router = Router(config, rng=rng)
        self._live = LiveMap(config, self._router, map_source)
        self._caches = caches if caches is not None else build_caches(config.cache)
        self._relations = RelationService(
            router=self._router,
            shard=self._engines.shard,
            clock_us=clock_us,
            lists=self._caches.lists,
            prefix=self._caches.prefix,
        )
        repo = ObjectRepository(serde=serde or JsonSerde(max_bytes=config.max_object_bytes), ids=config.ids)
        self._objects = ObjectService(
            config=config,
            router=self._router,
            engines=self._engines,
            repo=repo,
            relations=self._relations,
            cache=self._caches.objects,
            prefix=self._caches.prefix,
        )

    @classmethod
    def from_config(
        cls, source: str | os.PathLike[str] | Mapping[str, Any] | StoreConfig | None = None
    ) -> Store:
        """A store from a YAML path, a config dict, a `StoreConfig`, or None for the embedded default."""
        if source is None:
            config = embedded_config()
        elif isinstance(source, StoreConfig):
            config = source
        elif isinstance(source, Mapping):
            config = StoreConfig.from_dict(source)
        else:
            config = StoreConfig.from_file(source)
        return cls(config)

    # -- the live map -----------------------------------------------------------

    @property
    def shard_map(self) -> ShardMap:
        """The shard map this store routes by now."""
        return self._router.shard_map

    @property
    def map_source(self) -> MapSource:
        """Where this store reads its shard map."""
        return self._live.source

    def refresh_map(self, *, force: bool = False) -> bool:
        """Reload the map if the source has a newer one (``force``: ask it now); True if it changed."""
        return self._live.refresh(force=force)

    def locate(self, id: int, *, type_name: str | None = None) -> Location:  # noqa: A002
        """Shard, type, local id and master host of ``id``, from the ID alone."""
        return self._router.locate(id, type_name)

    # -- objects -----------------------------------------------------------------

    @_rerouted
    def create(
        self, type_name: str, data: dict[str, Any], *, near: int | None = None, shard: int | None = None
    ) -> int:
        """Store a new object and return its 64-bit ID.

        ``near=some_id`` puts it on that ID's shard (a pin on its board's
        shard); ``shard=N`` names the shard; otherwise a random open shard.
        """
        return self._objects.create(type_name, data, near=near, shard=shard)

    @_rerouted
    def get(self, id: int, *, type_name: str | None = None) -> dict[str, Any] | None:  # noqa: A002
        """The object with ``id``, or None if it does not exist or was deleted."""
        return self._objects.get(id, type_name=type_name)

    @_rerouted
    def get_many(self, ids: Iterable[int], *, type_name: str | None = None) -> dict[int, dict[str, Any]]:
        """Objects by ID, absent and deleted ones left out.

        Cache first (one round trip per cache server); the misses are read
        with one query per host (per shard on SQLite).
        """
        return self._objects.get_many(ids, type_name=type_name)

    @_rerouted
    def get_with_version(self, id: int, *, type_name: str | None = None) -> Versioned | None:  # noqa: A002
        """The object with ``id`` and its version, or None if it does not exist or was deleted.

        ``(data, version)``: the version is 1 when the object is created and
        one more at each update. Pass it to ``update(..., if_version=)`` to
        write only if nobody changed the object since (as an HTTP ETag is
        used). Read from the object's master, never from a cache.
        """
        return self._objects.get_with_version(id, type_name=type_name)

    @_rerouted
    def update(
        self,
        id: int,  # noqa: A002
        changes: Updater,
        *,
        type_name: str | None = None,
        if_version: int | None = None,
    ) -> dict[str, Any]:
        """Merge ``changes`` (a dict, or a function old -> new) into the object atomically.

        Runs SELECT ... FOR UPDATE, the change and the write in one
        transaction, so concurrent updates of one object lose nothing.
        Raises `NotFound` if the object does not exist or was deleted.

        ``if_version=V`` (from `get_with_version`): write only if the object
        is still at version V, else raise `ConflictError` and write nothing;
        after the write it is at version V + 1.
        """
        return self._objects.update(id, changes, type_name=type_name, if_version=if_version)

    @_rerouted
    def delete(self, id: int, *, type_name: str | None = None) -> bool:  # noqa: A002
        """Soft-delete: the row stays, marked inactive, and leaves every list that reaches it.

        Every pair of a relation with an inverse that involves the object is
        removed, both sides, counts included (a link racing with the delete
        is refused). Lists of relations without an inverse cannot be found
        from the object: their entries stay, and `board_pins` skips them.
        Running it again finishes a delete that stopped half way. True if
        the object was live.
        """
        return self._objects.delete(id, type_name=type_name)

    def require(self, id: int, *, type_name: str | None = None) -> dict[str, Any]:  # noqa: A002
        """Like `get`, but raises `NotFound` instead of returning None."""
        data = self.get(id, type_name=type_name)
        if data is None:
            raise NotFound(f"no live object {id}")
        return data

    def cache_key(self, id: int, *, type_name: str | None = None) -> str:  # noqa: A002
        """The key under which the object cache keeps ``id``'s object (for tools that look at the cache)."""
        return self._objects.key(id, self._router.route(id, type_name)[1])

    # -- relations -----------------------------------------------------------------

    @_rerouted
    def link(self, relation: str, from_id: int, to_id: int, *, sequence: int | None = None) -> bool:
        """Add ``to_id`` to ``from_id``'s list (and the inverse pair, if configured).

        ``sequence`` defaults to now in microseconds, so newer entries sort
        after older ones (ties by ``to_id``). Linking an existing pair keeps
        its position unless ``sequence`` is given, which moves it. Returns
        True if the pair is new.
        """
        return self._relations.link(relation, from_id, to_id, sequence=sequence)

    @_rerouted
    def unlink(self, relation: str, from_id: int, to_id: int) -> bool:
        """Remove the pair (and its inverse); True if it was there."""
        return self._relations.unlink(relation, from_id, to_id)

    @_rerouted
    def links(
        self, relation: str, from_id: int, *, limit: int = 50, offset: int = 0, newest_first: bool = False
    ) -> list[int]:
        """``to_id``s of ``from_id`` in sequence order, ``LIMIT limit OFFSET offset``."""
        return self._relations.links(relation, from_id, limit=limit, offset=offset, newest_first=newest_first)

    @_rerouted
    def page(
        self,
        relation: str,
        from_id: int,
        *,
        limit: int = 50,
        cursor: str | None = None,
        newest_first: bool = False,
    ) -> Page:
        """One page of ``from_id``'s list by keyset (page 2,000 costs what page 1 costs)."""
        return self._relations.page(relation, from_id, limit=limit, cursor=cursor, newest_first=newest_first)

    @_rerouted
    def has_link(self, relation: str, from_id: int, to_id: int) -> bool:
        """Whether ``to_id`` is in ``from_id``'s list: one primary-key read, no list read."""
        return self._relations.has_link(relation, from_id, to_id)

    @_rerouted
    def count(self, relation: str, from_id: int) -> int:
        """How many entries ``from_id``'s list has: one key read of a count kept exact."""
        return self._relations.count(relation, from_id)

    @_rerouted
    def board_pins(self, board_id: int, *, limit: int = 50, cursor: str | None = None) -> Page:
        """One page of a board's pins with the pin objects: one list read, one batched object read.

        Entries whose pin is gone are skipped and the page is filled from the
        entries after them (more reads only then), so a page is short only at
        the end of the list.
        """
        relation = "board_has_pins"
        pin_type = self.config.relations[relation].to_type
        self._relations.check_limit(limit)
        after = None if cursor is None else decode_cursor(cursor, relation, board_id, False)
        ids: list[int] = []
        objects: list[dict[str, Any]] = []
        want = limit
        while True:
            rows, more = self._relations.rows_after(relation, board_id, after, want)
            # The service, not the public get_many: this call already runs through the live map.
            found = self._objects.get_many([t for _s, t in rows], type_name=pin_type)
            for i, (seq, to_id) in enumerate(rows):
                after = (seq, to_id)
                if to_id in found:
                    ids.append(to_id)
                    objects.append(found[to_id])
                    if len(ids) == limit:
                        more = more or i + 1 < len(rows)
                        break
            if len(ids) == limit or not more:
                break
            want = min(self.config.max_page, 2 * want)  # gone pins: read further, in bigger steps
        next_cursor = encode_cursor(relation, board_id, False, *after) if more and after else None
        return Page(ids, next_cursor, objects)

    # -- lifecycle ------------------------------------------------------------------

    def admin_context(self) -> AdminContext:
        """The store's insides, for admin jobs and tools (never needed on the request path)."""
        return AdminContext(
            self.config, self._engines, self._router, self._live, self._objects, self._relations, self._caches
        )

    def stats(self) -> dict[str, dict[str, int]]:
        """Cache counters (hits, misses, fills, invalidations, errors, skipped, expired) per cache."""
        return self._caches.stats()

    def close(self) -> None:
        """Close every pooled connection."""
        self._engines.dispose()
        self._caches.close()
        self._live.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
