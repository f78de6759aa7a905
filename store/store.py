"""The `Store` facade: the library's one entry point, thin over its services.

Data flows one way: caller -> `Store` -> `ObjectService` / `RelationService`
-> routing (the ID's shard bits and the live map) and caches -> backends ->
the shard's host. No call ever scans shards to find an object: its ID says
where it lives. Every call runs through the live map (`store.livemap`):
a read is run again when a host refuses it for an older map; a write is a
plan of steps (`store.steps`), and only the refused step runs again.
"""

from __future__ import annotations

import functools
import os
import random
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from store.bulk_create import BulkCreates
from store.cache import Caches, build_caches
from store.cache.follower import CLEAN_BATCH, Follower, build_follower, settled_versions
from store.cache.heartbeat import HeartbeatTrust
from store.cache.lists import ListCache
from store.config import StoreConfig
from store.context import AdminContext
from store.defaults import embedded_config
from store.engines import Engines, ShardHandle
from store.exceptions import ConfigError, NotFound, StoreError, brief
from store.exchange import ExportReport, ImportReport, export_records, import_records
from store.livemap import LiveMap
from store.mapsource import MapSource
from store.objects import ObjectRepository, ObjectService, Updater, Versioned
from store.relations.bulk import BulkPairs
from store.relations.inputs import id_list, pair_list
from store.relations.reads import ObjectPages, RelationReads
from store.relations.repository import Page
from store.relations.service import RelationService
from store.routing import Location, Router
from store.scan import Scan
from store.serde import JsonSerde, Serde
from store.shardmap import ShardMap
from store.steps import Steps
from store.unique import UniqueKeys

if TYPE_CHECKING:
    from store.metrics import Metrics

__all__ = ["AdminContext", "Location", "Store"]

P = ParamSpec("P")
R = TypeVar("R")


def _rerouted(method: Callable[Concatenate[Store, P], R]) -> Callable[Concatenate[Store, P], R]:
    """A read through the live map: a newer map now and then, run again after a reroute."""

    @functools.wraps(method)
    def wrapper(self: Store, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._live.run(lambda: method(self, *args, **kwargs))

    return wrapper


def _planned(method: Callable[Concatenate[Store, P], R]) -> Callable[Concatenate[Store, P], R]:
    """A write: a newer map now and then; its steps reroute one by one (`store.steps`), the call never."""

    @functools.wraps(method)
    def wrapper(self: Store, /, *args: P.args, **kwargs: P.kwargs) -> R:
        self._live.tick()
        return method(self, *args, **kwargs)

    return wrapper


class Store:
    """Objects sharded over many hosts, addressed by 64-bit IDs that carry their shard.

    ``metrics``: a `store.metrics.Metrics` (pip install 'shardstore[metrics]') that
    times every call by operation and host for Prometheus; None costs nothing.
    """

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
        metrics: Metrics | None = None,
    ) -> None:
        self.config = config
        self._engines = engines or Engines(config)
        self._router = Router(config, rng=rng)
        self._live = LiveMap(config, self._router, map_source)
        #: Runs the steps of every write's plan: a step refused by a moved shard runs again alone.
        self._steps = Steps(self._live.step)
        self._caches = caches if caches is not None else build_caches(config.cache, config.names)
        self._relations = RelationService(
            router=self._router,
            shard=self._engines.shard,
            clock_us=clock_us,
            lists=self._caches.lists,
            prefix=self._caches.prefix,
            steps=self._steps,
        )
        serde = serde or JsonSerde(max_bytes=config.max_object_bytes, max_depth=config.max_depth)
        repo = ObjectRepository(serde=serde, ids=config.ids)
        self._unique = (
            UniqueKeys(
                config=config,
                router=self._router,
                engines=self._engines,
                cache=self._caches.objects,
                prefix=self._caches.prefix,
                steps=self._steps,
            )
            if config.unique
            else None
        )
        self._objects = ObjectService(
            config=config,
            router=self._router,
            engines=self._engines,
            repo=repo,
            relations=self._relations,
            cache=self._caches.objects,
            prefix=self._caches.prefix,
            unique=self._unique,
            steps=self._steps,
            sweep=self._bulk_pairs,
        )
        self._follower = _start_follower(config, self._engines, self._router, self._caches)
        if metrics is not None:  # store.metrics (and prometheus_client) only load when asked for
            from store.metrics import instrument

            instrument(self, metrics)

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
        elif isinstance(source, str | os.PathLike):
            config = StoreConfig.from_file(source)
        else:
            raise ConfigError(
                "a store's config is a YAML file's path, a mapping, a StoreConfig or None (the embedded "
                f"default), got {type(source).__name__} {brief(source)}"
            )
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

    @_planned
    def create(
        self, type_name: str, data: dict[str, Any], *, near: int | None = None, shard: int | None = None
    ) -> int:
        """Store a new object and return its 64-bit ID.

        ``near=some_id`` puts it on that ID's shard (a pin on its board's
        shard); ``shard=N`` names the shard; otherwise a random open shard.
        """
        return self._objects.create(type_name, data, near=near, shard=shard)

    @_planned
    def create_many(
        self,
        type_name: str,
        items: Iterable[dict[str, Any]],
        *,
        near: int | None = None,
        shard: int | None = None,
    ) -> list[int]:
        """Store many new objects of one type; their IDs, in the order of ``items``.

        One multi-row INSERT per shard (per ``limits.id_chunk`` rows).
        ``near``/``shard`` put every item on that shard, as for `create`;
        without them each item goes to a random open shard. Every item is
        checked before any I/O (a bad one raises naming ``items[i]``; more
        than ``limits.max_ids`` is a `LimitError`). Unique values are claimed
        for all items or none: a `DuplicateKeyError` (``.index``: the item)
        for a value another object or another item holds, and nothing is
        created.
        """
        return self._bulk_creates.create_many(type_name, items, near=near, shard=shard)

    @functools.cached_property
    def _bulk_creates(self) -> BulkCreates:
        """`create_many`'s plan (made on first use)."""
        return BulkCreates(
            config=self.config,
            router=self._router,
            engines=self._engines,
            objects=self._objects,
            relations=self._relations,
            cache=self._caches.objects,
            unique=self._unique,
            steps=self._steps,
        )

    @_rerouted
    def get(self, id: int, *, type_name: str | None = None) -> dict[str, Any] | None:  # noqa: A002
        """The object with ``id``, or None if it does not exist or was deleted."""
        return self._objects.get(id, type_name=type_name)

    def get_many(self, ids: Iterable[int], *, type_name: str | None = None) -> dict[int, dict[str, Any]]:
        """Objects by ID, absent and deleted ones left out.

        Cache first (one round trip per cache server); the misses are read
        with one query per host (per shard on SQLite). Every ID is checked
        before any I/O; more than ``limits.max_ids`` IDs is a `LimitError`, and
        a host given more than ``limits.id_chunk`` gets several bounded queries.
        """
        wanted = id_list(ids, "ids", unique=False, limit=self.config.max_ids)  # (an iterator, once)
        return self._live.run(lambda: self._objects.get_many(wanted, type_name=type_name))

    @_rerouted
    def get_with_version(self, id: int, *, type_name: str | None = None) -> Versioned | None:  # noqa: A002
        """The object with ``id`` and its version, or None if it does not exist or was deleted.

        ``(data, version)``: the version is 1 when the object is created and
        one more at each update. Pass it to ``update(..., if_version=)`` to
        write only if nobody changed the object since (as an HTTP ETag is
        used). Read from the object's master, never from a cache.
        """
        return self._objects.get_with_version(id, type_name=type_name)

    @_planned
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
        transaction, so concurrent updates of one object lose nothing, and
        each call is applied once. Raises `NotFound` if the object does not
        exist or was deleted.

        ``if_version=V`` (from `get_with_version`): write only if the object
        is still at version V, else raise `ConflictError` and write nothing;
        after the write it is at version V + 1. Without it, an update never
        raises `ConflictError`: one that changes unique values (config
        ``unique:``) while other writers change them retries until it lands,
        or raises `WriteTimeoutError` after ``write_timeout_s``, having
        written nothing.
        """
        return self._objects.update(id, changes, type_name=type_name, if_version=if_version)

    @_planned
    def delete(self, id: int, *, type_name: str | None = None) -> bool:  # noqa: A002
        """Soft-delete: the row stays, marked inactive, and leaves every list that reaches it.

        The mark commits first and decides the result: True if the object
        was live. Then the unique values it held at that moment are
        released, and every pair of a relation with an inverse that involves
        the object is removed, both sides, counts included (a link racing
        with the delete is refused). Lists of relations without an inverse
        cannot be found from the object: their entries stay, and
        `page_objects` skips them. Running it again finishes a delete that
        stopped half way.
        """
        return self._objects.delete(id, type_name=type_name)

    @_rerouted
    def lookup(self, name: str, value: str | int) -> int | None:
        """The ID of the live object whose unique key ``name`` (config ``unique:``) is ``value``, or None.

        One read of the key's row, on the shard a hash of the value picks;
        cached like objects. ``create`` and ``update`` refuse a value
        another object holds with `DuplicateKeyError`.
        """
        return self._objects.lookup(name, value)

    def require(self, id: int, *, type_name: str | None = None) -> dict[str, Any]:  # noqa: A002
        """Like `get`, but raises `NotFound` instead of returning None."""
        data = self.get(id, type_name=type_name)
        if data is None:
            raise NotFound(f"no live object {id}")
        return data

    def cache_key(self, id: int, *, type_name: str | None = None) -> str:  # noqa: A002
        """The key under which the object cache keeps ``id``'s object (for tools that look at the cache)."""
        return self._objects.key(id, self._router.route(id, type_name)[1])

    def scan(
        self,
        type_name: str,
        *,
        shards: Iterable[int] | None = None,
        batch: int = 1000,
        include_deleted: bool = False,
        resume: str | None = None,
    ) -> Scan:
        """Every object of ``type_name`` as ``(id, data)``, in shard and key (``local_id``) order.

        Keyset pages of ``batch`` rows per shard, each its own read (no
        transaction stays open between pages), on the master the live map
        names when the page is read: a shard that moves during the scan is
        read on from the same position on its new host, no object missed or
        returned twice. ``shards``: only these shard numbers (a range, a
        list). ``include_deleted``: soft-deleted objects too. The iterator's
        ``resume_token`` (a str) is the position after the last object it
        returned; ``resume=token`` goes on from there. Bad arguments raise
        before any read.
        """
        return Scan(
            config=self.config,
            engines=self._engines,
            live=self._live,
            spec=self._router.type(type_name),
            decode=self._objects.repo.decode,
            shards=shards,
            batch=batch,
            include_deleted=include_deleted,
            resume=resume,
        )

    def export(
        self,
        out: str | os.PathLike[str] | IO[str],
        *,
        shards: Iterable[int] | None = None,
        resume: bool = False,
        progress: Callable[[int, int], None] | None = None,
    ) -> ExportReport:
        """Write every object (deleted ones marked) and relation entry as NDJSON (`store.exchange`).

        ``out``: a path or a text stream. An existing path is refused unless
        ``resume``, which goes on after its last complete line.
        ``progress(done, total)`` hears each shard of each type and relation.
        """
        return export_records(self, out, shards=shards, resume=resume, progress=progress)

    def import_records(
        self,
        lines: Iterable[str | bytes],
        *,
        batch: int = 1000,
        progress: Callable[[int], None] | None = None,
    ) -> ImportReport:
        """Write what an export's ``lines`` hold and the store lacks, with the same IDs (`store.exchange`).

        Idempotent: run again, it adds nothing. Each batch of ``batch`` lines
        is checked whole first; a bad line raises `BadRecordError` with every
        bad line's number, nothing of its batch written.
        """
        return import_records(self, lines, batch=batch, progress=progress)

    # -- relations -----------------------------------------------------------------

    @_planned
    def link(self, relation: str, from_id: int, to_id: int, *, sequence: int | None = None) -> bool:
        """Add ``to_id`` to ``from_id``'s list (and the inverse pair, if configured).

        ``sequence`` defaults to now in microseconds, so newer entries sort
        after older ones (ties by ``to_id``). Linking an existing pair keeps
        its position unless ``sequence`` is given, which moves it. Returns
        True if the pair is new. A side whose object is deleted is refused
        (`NotFound`); an ID with no object row at all is linked as given (an
        object kept elsewhere, such as a user of another system, can be
        listed; `page_objects` skips entries with no live object).
        """
        return self._relations.link(relation, from_id, to_id, sequence=sequence)

    @_planned
    def unlink(self, relation: str, from_id: int, to_id: int) -> bool:
        """Remove the pair (and its inverse); True if it was there."""
        return self._relations.unlink(relation, from_id, to_id)

    @_planned
    def link_many(
        self, relation: str, pairs: Iterable[tuple[int, int]], *, sequence: int | None = None
    ) -> int:
        """`link` each (from_id, to_id) of ``pairs``; how many were new (`link`'s True).

        Pairs are written by `link`'s protocol, grouped by their two sides'
        hosts: a few requests per group, not three per pair. ``sequence``
        as for `link` (default: now, the same for every pair). Every pair is
        checked before any I/O; more than ``limits.max_ids`` is a
        `LimitError`. Pairs naming a deleted object are refused (`NotFound`
        naming them) after every other pair is written.
        """
        return self._bulk_pairs.link_many(relation, pairs, sequence=sequence)

    @_planned
    def unlink_many(self, relation: str, pairs: Iterable[tuple[int, int]]) -> int:
        """`unlink` each (from_id, to_id) of ``pairs``, both sides; how many were there."""
        return self._bulk_pairs.unlink_many(relation, pairs)

    @functools.cached_property
    def _bulk_pairs(self) -> BulkPairs:
        """`link_many` and `unlink_many` (made on first use)."""
        return BulkPairs(self._relations, max_pairs=self.config.max_ids)

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
        since: int | None = None,
        until: int | None = None,
    ) -> Page:
        """One page of ``from_id``'s list by keyset (page 2,000 costs what page 1 costs).

        ``since`` and ``until`` keep the page to entries whose sequence lies in
        ``since <= sequence < until`` (``since`` inclusive, ``until``
        exclusive; sequences default to microseconds since the epoch, so
        ``since=t0, until=t1`` is what was linked from t0 up to, not
        including, t1). Either may be left out. The next page's cursor goes on
        within the same range and is refused (`CursorError`) with another one;
        ``since > until`` raises `LimitError`.
        """
        return self._relations.page(
            relation, from_id, limit=limit, cursor=cursor, newest_first=newest_first, since=since, until=until
        )

    @_rerouted
    def has_link(self, relation: str, from_id: int, to_id: int) -> bool:
        """Whether ``to_id`` is in ``from_id``'s list: one primary-key read, no list read."""
        return self._relations.has_link(relation, from_id, to_id)

    @functools.cached_property
    def _reads(self) -> RelationReads:
        """Reads of many lists at once (made on first use)."""
        return RelationReads(self._relations, self._engines)

    def has_links(self, relation: str, from_id: int, to_ids: Iterable[int]) -> set[int]:
        """Which of ``to_ids`` are in ``from_id``'s list.

        One query on ``from_id``'s shard (a primary-key ``IN`` read), or none
        when the list cache holds the whole list and trusts it.
        """
        wanted = id_list(to_ids, "to_ids", unique=False, limit=self.config.max_ids)
        return self._live.run(lambda: self._reads.has_links(relation, from_id, wanted))

    def has_links_many(self, relation: str, pairs: Iterable[tuple[int, int]]) -> set[tuple[int, int]]:
        """Which of ``pairs`` (from_id, to_id) are linked, as a set of pairs (a feed's hearts).

        Lists the cache holds whole answer from one round trip to it; the rest
        take one query per host, covering all its shards, hosts asked at once.
        """
        wanted = pair_list(pairs, limit=self.config.max_ids)
        return self._live.run(lambda: self._reads.has_links_many(relation, wanted))

    def pages_many(
        self, relation: str, from_ids: Iterable[int], *, limit: int = 50, newest_first: bool = False
    ) -> dict[int, Page]:
        """The first page of each list (oldest first, or newest, as `page` gives it), by from_id.

        Cached lists come from one round trip to the list cache; the rest
        from one query per host (a keyset subquery per list, on the sequence
        index), hosts asked at once, and are cached. Each ``next_cursor``
        works with `page` (with the same ``newest_first``).
        """
        ids = id_list(from_ids, "from_ids", limit=self.config.max_ids)
        return self._live.run(
            lambda: self._reads.pages_many(relation, ids, limit=limit, newest_first=newest_first)
        )

    @_rerouted
    def count(self, relation: str, from_id: int) -> int:
        """How many entries ``from_id``'s list has: one key read of a count kept exact."""
        return self._relations.count(relation, from_id)

    @functools.cached_property
    def _object_pages(self) -> ObjectPages:
        """Pages with their objects (made on first use)."""

        def load(ids: list[int], type_name: str) -> dict[int, dict[str, Any]]:
            # The service, not the public get_many: these calls already run through the live map.
            return self._objects.get_many(ids, type_name=type_name, bounded=False)

        return ObjectPages(self._relations, self._reads, load)

    @_rerouted
    def page_objects(
        self,
        relation: str,
        from_id: int,
        *,
        limit: int = 50,
        cursor: str | None = None,
        newest_first: bool = False,
        since: int | None = None,
        until: int | None = None,
    ) -> Page:
        """One page of ``from_id``'s list with the objects it names (the relation's to-type).

        ``ids``, ``objects`` (aligned with ``ids``) and ``next_cursor``: one list
        read and one batched object read. Entries whose object is gone are
        skipped and the page is filled from the entries after them (more reads
        only then), so a page is short only at the end of the list.
        ``cursor``, ``newest_first``, ``since`` and ``until`` are `page`'s, and
        the cursors of the two calls are the same: either goes on with the other's.
        """
        return self._object_pages.page(
            relation, from_id, limit=limit, cursor=cursor, newest_first=newest_first, since=since, until=until
        )

    def pages_objects_many(
        self, relation: str, from_ids: Iterable[int], *, limit: int = 50, newest_first: bool = False
    ) -> dict[int, Page]:
        """`page_objects`' first page of each list, by from_id: ids, objects and cursor.

        The lists as `pages_many` reads them, then every page's objects in one
        batched object read (one memcached batch per server; misses one query
        per host). Gone objects are skipped and pages filled, as
        `page_objects` does. Warm, that is one Redis pipeline and one memcached
        batch per server; cold, two queries per host.
        """
        ids = id_list(from_ids, "from_ids", limit=self.config.max_ids)  # (an iterator, once)
        return self._live.run(
            lambda: self._object_pages.first_pages(relation, ids, limit=limit, newest_first=newest_first)
        )

    @_rerouted
    def board_pins(
        self, board_id: int, *, limit: int = 50, cursor: str | None = None, newest_first: bool = False
    ) -> Page:
        """`page_objects` of ``board_has_pins``: a board's pins, with the pin objects."""
        # (Not through self.page_objects: metrics would count the call under both names.)
        return self._object_pages.page(
            "board_has_pins", board_id, limit=limit, cursor=cursor, newest_first=newest_first
        )

    def board_pins_many(
        self, board_ids: Iterable[int], *, limit: int = 50, newest_first: bool = False
    ) -> dict[int, Page]:
        """`pages_objects_many` of ``board_has_pins``: each board's first pins, by board ID."""
        ids = id_list(board_ids, "board_ids", limit=self.config.max_ids)
        return self._live.run(
            lambda: self._object_pages.first_pages(
                "board_has_pins", ids, limit=limit, newest_first=newest_first
            )
        )

    # -- lifecycle ------------------------------------------------------------------

    def admin_context(self) -> AdminContext:
        """The store's insides, for admin jobs and tools (never needed on the request path)."""
        return AdminContext(
            self.config,
            self._engines,
            self._router,
            self._live,
            self._objects,
            self._relations,
            self._caches,
            self._unique,
            self._steps,
        )

    def ping(self) -> dict[str, Any]:
        """Whether each host, cache server and the map source answered within its timeout.

        ``{"ok": bool, "hosts": {name: probe}, "caches": {"memcached": {address: probe},
        "redis": {address: probe}}, "map_source": probe}``, each probe ``{"ok": bool,
        "ms": float, "error": str | None}``; all asked at once. Never raises for a
        server that is down: it is reported (see `store.health`).
        """
        from store.health import ping

        return ping(self.config, self._engines, self._live.source, self._live.current)

    def stats(self) -> dict[str, dict[str, int]]:
        """Counters per cache: hits, misses, fills, invalidations, updates, errors, skipped, expired."""
        return self._caches.stats()

    def close(self) -> None:
        """Stop following the invalidation logs; close every pooled connection."""
        if self._follower is not None:
            self._follower.stop()
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


def _settle(lists: ListCache) -> Callable[[list[str]], None]:
    """The follower's step for list entries: drop each list older than the version its entry names."""

    def settle(entries: list[str]) -> None:
        lists.settle(sorted(settled_versions(entries).items()))

    return settle


def _trust_heartbeats(config: StoreConfig, router: Router, caches: Caches) -> None:
    """Where `store invalidate` daemons follow the hosts, trust entries past the window by their
    heartbeats (`store.invalidate`), read from memcached at most once per interval."""
    objects = caches.objects
    peek = getattr(objects.store, "peek_many", None) if objects is not None else None
    if peek is None or not config.cache.daemon_hosts(config.hosts):
        return
    assert objects is not None

    def host_of(key: str) -> str | None:
        # Object and list keys end with the ID that routes them (`ObjectService.key`, `list_key`).
        try:
            return router.shard_map.master(router.shard_of(int(key.rpartition(":")[2])))
        except (ValueError, StoreError):
            return None

    trust = HeartbeatTrust(
        objects.store, caches.prefix, lambda: {r.master for r in router.shard_map}, host_of=host_of
    )
    for cache in (caches.objects, caches.lists):
        if cache is not None:
            cache.follower = trust


def _start_follower(config: StoreConfig, engines: Engines, router: Router, caches: Caches) -> Follower | None:
    """Follow every master's invalidation log (`store.cache.follower`), where writes are logged."""
    if not config.cache.follow or not engines.logging or not (caches.objects or caches.lists):
        _trust_heartbeats(config, router, caches)
        return None

    def hosts() -> list[tuple[str, Callable[[], Any], str, str | None, str]]:
        out: list[tuple[str, Callable[[], Any], str, str | None, str]] = []
        seen: set[str] = set()
        shard_map = router.shard_map
        for r in shard_map:
            url = str(config.hosts[r.master])
            if url in seen:
                continue
            seen.add(url)
            h = engines.shard(r.shards().start, r.master)
            table = h.backend.change_log
            if table is None:
                raise StoreError(
                    f"host {r.master} keeps no invalidation log: entries are trusted in the window only"
                )

            def connect(h: ShardHandle = h) -> Any:
                h.log_sql()  # makes the log, once
                return h.connect()

            b = h.backend
            out.append((url, connect, table, b.change_log_step_sql, b.change_log_clean(CLEAN_BATCH)))
        return out

    follower = build_follower(
        hosts,
        None if caches.objects is None else caches.objects.invalidate,
        None if caches.lists is None else _settle(caches.lists),
        poll_s=config.cache.follow_poll_s,
    )
    for cache in (caches.objects, caches.lists):
        if cache is not None:
            cache.follower = follower
    follower.start()
    return follower
