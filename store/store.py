"""The `Store` facade: route by ID, then call the repositories.

Data flows one way: caller -> `Store` -> routing (the ID's shard bits and the
shard map) -> repository -> the shard's host. No call ever scans shards to
find an object: its ID says where it lives.
"""

from __future__ import annotations

import functools
import os
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar

from store.cache import Caches, build_caches
from store.config import StoreConfig, TypeSpec
from store.cursors import decode_cursor, encode_cursor
from store.defaults import embedded_config
from store.engines import Engines
from store.exceptions import (
    ConfigError,
    DataError,
    IdError,
    NotFound,
    RoutingError,
    ShardFullError,
    ShardMovedError,
    ShardNotInitializedError,
)
from store.ids import encode_pinterest
from store.mapsource import MapSource, StaticMapSource, load_or_seed, open_map_source
from store.objects import ObjectRepository, Updater
from store.relations import Page, RelationRepository, RelationService
from store.routing import MAX_LOCAL_ID, Location, Router
from store.serde import JsonSerde, Serde
from store.shardmap import ShardMap

__all__ = ["Location", "Store"]

#: How long a call refused by a fenced shard waits for the moved map to appear.
REROUTE_WAIT_S = 5.0
REROUTE_POLL_S = 0.02

P = ParamSpec("P")
R = TypeVar("R")


def _rerouted(method: Callable[Concatenate[Store, P], R]) -> Callable[Concatenate[Store, P], R]:
    """Check for a newer map now and then; after a routing failure, reload it and retry once.

    A shard that moved leaves a tombstone on its old host that refuses every
    read and write (`ShardMovedError`, naming the new host and map version);
    while the move switches, its tables are briefly absent there instead
    (`ShardNotInitializedError`). Either way the call wrote nothing: the
    store waits briefly for the newer map, then runs the call again on the
    new host. Link and unlink are idempotent, so their retry is safe even if
    one side had committed.
    """

    @functools.wraps(method)
    def wrapper(self: Store, /, *args: P.args, **kwargs: P.kwargs) -> R:
        self._maybe_refresh()
        version = self._router.shard_map.version
        started = time.monotonic()
        try:
            return method(self, *args, **kwargs)
        except (RoutingError, ShardNotInitializedError, ShardMovedError) as exc:
            self._reload_after_failure(started)
            if not isinstance(exc, RoutingError):
                told = exc.map_version if isinstance(exc, ShardMovedError) else None
                # The move publishes the new map a moment after it fences the
                # old host: wait for it (for the version the tombstone names).
                self._wait_for_map(max(version + 1, told or 0))
            if self._router.shard_map.version <= version:
                raise
            return method(self, *args, **kwargs)

    return wrapper


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
        self._instagram = config.ids == "instagram"
        self._objects = ObjectRepository(
            serde=serde or JsonSerde(max_bytes=config.max_object_bytes),
            ids=config.ids,
        )
        self._router = Router(config, rng=rng)
        self._source: MapSource = map_source or open_map_source(config)
        self._dynamic = not isinstance(self._source, StaticMapSource)
        self._next_check = 0.0
        self._last_forced = -1.0
        self._map_lock = threading.Lock()
        if self._dynamic:
            self._install(load_or_seed(self._source, config.shard_map))
        self._caches = caches if caches is not None else build_caches(config.cache)
        self._relations = RelationService(
            router=self._router,
            shard=self._engines.shard,
            clock_us=clock_us,
            lists=self._caches.lists,
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

    @property
    def shard_map(self) -> ShardMap:
        """The shard map this store routes by now."""
        return self._router.shard_map

    # -- the live map ---------------------------------------------------------

    @property
    def map_source(self) -> MapSource:
        """Where this store reads its shard map."""
        return self._source

    def _install(self, new: ShardMap) -> None:
        unknown = sorted(set(new.hosts()) - set(self.config.hosts))
        if unknown:
            raise ConfigError(
                f"shard map version {new.version} names host(s) {', '.join(unknown)} that are not under "
                "hosts in this process's config: add them and restart"
            )
        if new.shards != self.config.shards:
            raise ConfigError(
                f"shard map version {new.version} has {new.shards} shards, the config {self.config.shards}"
            )
        self._router.shard_map = new

    def refresh_map(self, *, force: bool = False) -> bool:
        """Reload the map if the source has a newer one (``force``: ask it now); True if it changed."""
        if not self._dynamic:
            return False
        with self._map_lock:
            self._next_check = time.monotonic() + self.config.map_poll_s
            if not force and not self._source.changed():
                return False
            new = self._source.load()
            if new is None or new.version <= self._router.shard_map.version:
                return False
            self._install(new)
            return True

    def _wait_for_map(self, version: int) -> None:
        """Poll the source until the map reaches ``version`` (at most `REROUTE_WAIT_S`)."""
        if not self._dynamic:
            return
        deadline = time.monotonic() + REROUTE_WAIT_S
        while self._router.shard_map.version < version and time.monotonic() < deadline:
            time.sleep(REROUTE_POLL_S)
            self.refresh_map(force=True)

    def _reload_after_failure(self, started: float) -> None:
        # Many calls can fail at once (every writer of a moved shard): one
        # reload serves all calls that started before it, so IDs that route
        # nowhere cannot turn every call into a read of the map source.
        if not self._dynamic:
            return
        with self._map_lock:
            if self._last_forced >= started:
                return
            self._last_forced = time.monotonic()
        self.refresh_map(force=True)

    def _maybe_refresh(self) -> None:
        if self._dynamic and time.monotonic() >= self._next_check:
            self.refresh_map()

    # -- routing -----------------------------------------------------------

    def locate(self, id: int, *, type_name: str | None = None) -> Location:  # noqa: A002
        """Shard, type, local id and master host of ``id``, from the ID alone."""
        return self._router.locate(id, type_name)

    # -- objects -----------------------------------------------------------

    @_rerouted
    def create(
        self, type_name: str, data: dict[str, Any], *, near: int | None = None, shard: int | None = None
    ) -> int:
        """Store a new object and return its 64-bit ID.

        ``near=some_id`` puts it on that ID's shard (a pin on its board's
        shard); ``shard=N`` names the shard; otherwise a random open shard.
        """
        spec = self._router.type(type_name)
        text = self._objects.encode(data)
        if near is not None and shard is not None:
            raise IdError("give near= or shard=, not both")
        if near is not None:
            target = self._router.shard_of(near)
        elif shard is not None:
            if type(shard) is not int or not 0 <= shard < self.shard_map.shards:
                raise IdError(f"shard must be an int in 0..{self.shard_map.shards - 1}, got {shard!r}")
            target = shard
        else:
            target = self._router.pick_shard()
        host = self.shard_map.master(target)
        h = self._engines.shard(target, host)
        local_id = self._objects.insert(h, spec.table, text)
        if self._instagram:
            new = local_id  # the database made the whole ID
        elif local_id > MAX_LOCAL_ID:
            self._objects.remove(h, spec.table, local_id)
            raise ShardFullError(
                f"shard {target} table {spec.table} has used all {MAX_LOCAL_ID} local ids; "
                "create the object on another shard"
            )
        else:
            new = encode_pinterest(target, spec.id, local_id)
        self._forget(new, spec)
        return new

    def _forget(self, id: int, spec: TypeSpec) -> None:  # noqa: A002
        """A create is a write: drop whatever the caches hold under the new ID.

        An ID is made again after shard databases are reset or restored from
        an older backup, and the caches may still hold the old object (or
        its lists) under it.
        """
        self._invalidate_object(id, spec)
        lists = [(r.name, id) for r in self.config.relations.values() if r.from_type == spec.name]
        self._relations.invalidate(lists)

    @_rerouted
    def get(self, id: int, *, type_name: str | None = None) -> dict[str, Any] | None:  # noqa: A002
        """The object with ``id``, or None if it does not exist or was deleted."""
        shard, spec, local_id, host = self._router.route(id, type_name)
        cache = self._caches.objects
        if cache is None:
            text = self._objects.get(self._engines.shard(shard, host), spec.table, local_id)
            return None if text is None else self._objects.decode(text)
        key = self._okey(id, spec)

        def load(_missing: list[str]) -> dict[str, bytes]:
            text = self._objects.get(self._engines.shard(shard, host), spec.table, local_id)
            return {} if text is None else {key: text.encode()}

        value = cache.get_many([key], load).get(key)
        return None if value is None else self._objects.decode(value)

    @_rerouted
    def get_many(self, ids: Iterable[int], *, type_name: str | None = None) -> dict[int, dict[str, Any]]:
        """Objects by ID, absent and deleted ones left out.

        Cache first (one round trip per cache server); the misses are read
        with one query per host (per shard on SQLite).
        """
        route = self._router.route
        routed = {id_: route(id_, type_name) for id_ in ids}
        decode = self._objects.decode
        cache = self._caches.objects
        if cache is None:
            return {id_: decode(text) for id_, text in self._read_texts(routed).items()}
        keys = {self._okey(id_, r[1]): id_ for id_, r in routed.items()}

        def load(missing: list[str]) -> dict[str, bytes]:
            wanted = {keys[k]: routed[keys[k]] for k in missing}
            return {
                self._okey(i, wanted[i][1]): text.encode() for i, text in self._read_texts(wanted).items()
            }

        return {keys[k]: decode(v) for k, v in cache.get_many(list(keys), load).items()}

    def _read_texts(self, routed: dict[int, tuple[int, TypeSpec, int, str]]) -> dict[int, str]:
        """JSON text of live objects from the databases, batched per host (per shard on SQLite)."""
        by_host: dict[str, dict[tuple[int, str], list[int]]] = {}
        keys: dict[tuple[int, str, int], int] = {}
        for id_, (shard, spec, local_id, host) in routed.items():
            groups = by_host.get(host)
            if groups is None:
                groups = by_host[host] = {}
            group = groups.get((shard, spec.table))
            if group is None:
                group = groups[(shard, spec.table)] = []
            group.append(local_id)
            keys[(shard, spec.table, local_id)] = id_
        out: dict[int, str] = {}
        for host, groups in by_host.items():
            parts = [(shard, table, local_ids) for (shard, table), local_ids in groups.items()]
            # A server host answers for all its shards in one query; where
            # each shard has a pool of its own (SQLite's files), one per shard.
            if self._engines.backend(host).pool_per_shard:
                by_shard: dict[int, list[tuple[int, str, list[int]]]] = {}
                for part in parts:
                    by_shard.setdefault(part[0], []).append(part)
                batches = list(by_shard.values())
            else:
                batches = [parts]
            for batch in batches:
                h = self._engines.shard(batch[0][0], host)
                for shard, table, local_id, text in self._objects.get_many(h, batch):
                    out[keys[(shard, table, local_id)]] = text
        return out

    def cache_key(self, id: int, *, type_name: str | None = None) -> str:  # noqa: A002
        """The key under which the object cache keeps ``id``'s object (for tools that look at the cache)."""
        return self._okey(id, self._router.route(id, type_name)[1])

    def _okey(self, id: int, spec: TypeSpec) -> str:  # noqa: A002
        # A Pinterest ID carries its type; an Instagram ID does not, so its key
        # names the type: a board is never answered for a pin with its ID.
        if self._instagram:
            return f"{self._caches.prefix}o:{spec.id}:{id}"
        return f"{self._caches.prefix}o:{id}"

    def _invalidate_object(self, id: int, spec: TypeSpec) -> None:  # noqa: A002
        if self._caches.objects is not None:
            self._caches.objects.invalidate([self._okey(id, spec)])

    @_rerouted
    def update(self, id: int, changes: Updater, *, type_name: str | None = None) -> dict[str, Any]:  # noqa: A002
        """Merge ``changes`` (a dict, or a function old -> new) into the object atomically.

        Runs SELECT ... FOR UPDATE, the change and the write in one
        transaction, so concurrent updates of one object lose nothing.
        Raises `NotFound` if the object does not exist or was deleted.
        """
        if not callable(changes) and not isinstance(changes, dict):
            raise DataError(f"changes must be a dict or a function old -> new, got {type(changes).__name__}")
        shard, spec, local_id, host = self._router.route(id, type_name)
        try:
            return self._objects.update(
                self._engines.shard(shard, host), spec.table, local_id, changes, what=str(id)
            )
        finally:
            # Also after a failure: the commit may have happened before the
            # error (a lost connection), and a needless delete is harmless.
            self._invalidate_object(id, spec)

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
        shard, spec, local_id, host = self._router.route(id, type_name)
        try:
            was_live = self._objects.delete(self._engines.shard(shard, host), spec.table, local_id)
        finally:
            self._invalidate_object(id, spec)
        self._relations.remove_object(spec.name, id)
        return was_live

    def require(self, id: int, *, type_name: str | None = None) -> dict[str, Any]:  # noqa: A002
        """Like `get`, but raises `NotFound` instead of returning None."""
        data = self.get(id, type_name=type_name)
        if data is None:
            raise NotFound(f"no live object {id}")
        return data

    # -- relations ---------------------------------------------------------

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
            found = self.get_many([t for _s, t in rows], type_name=pin_type)
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

    # -- lifecycle ---------------------------------------------------------

    @property
    def router(self) -> Router:
        """The router (ID -> shard, type, host) this store uses."""
        return self._router

    @property
    def relation_repository(self) -> RelationRepository:
        """The relation repository (per-shard SQL), for admin jobs."""
        return self._relations.repo

    @property
    def relation_service(self) -> RelationService:
        """The relation service (validation, inverse order, list cache), for admin jobs."""
        return self._relations

    @property
    def engines(self) -> Engines:
        """The engines (one per host) this store uses."""
        return self._engines

    def stats(self) -> dict[str, dict[str, int]]:
        """Cache counters (hits, misses, fills, invalidations, errors, skipped) per cache."""
        return self._caches.stats()

    @property
    def caches(self) -> Caches:
        """The caches this store uses."""
        return self._caches

    def close(self) -> None:
        """Close every pooled connection."""
        self._engines.dispose()
        self._caches.close()
        close = getattr(self._source, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
