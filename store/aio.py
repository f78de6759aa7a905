"""`AsyncStore`: the store's API as coroutines, for asyncio apps (FastAPI, Starlette, aiohttp).

What runs where: ``io="threads"`` (the default) or ``io="native"``.

``io="native"`` runs each call on the event loop's own thread, in a
greenlet (`store.green`): the sync store's code, unchanged, with each
socket wait (MariaDB through PyMySQL, memcached, Redis, PostgreSQL through
libpq) and each wait for a pooled connection an await on the loop. Many
calls are in flight at once with no thread per call, and the database
connections open are bounded by the pool (``pool_size`` + ``pool_overflow``
per host), not by
the number of tasks: a call that finds every connection of a host in use
waits for one on the loop. Opening a connection, a TLS handshake, and
MariaDB through mysqlclient or a Unix socket still block the loop while
they run. Cancellation is as below: a started call runs to its end as a
task of its own.

``io="threads"``. There is ONE request path: an
`AsyncStore` drives a sync `Store`, and every routing decision, statement,
cache rule, pair-write plan, lease and trust rule is that store's; nothing
of the request path is written a second time here. Each call runs the sync
store's method on a worker thread of a `ThreadPoolExecutor` the
`AsyncStore` owns, and the coroutine awaits it, so:

* the event loop never blocks on a database, memcached or Redis;
* the database connections in use are bounded by the executor's
  ``max_workers`` (at most one per worker on each host: a call holds at
  most one per host), not by the number of tasks: 10,000 tasks awaiting
  ``get`` queue for the workers, they do not open 10,000 connections.
  The default is ``min(32, pool_size)`` (``pool_size`` from the config),
  one worker per pooled connection of a host. More workers than
  ``pool_size`` only wait in the pool (up to ``pool_timeout_s``); fewer
  cap the store's concurrency below what the pool allows;
* the caller's `contextvars` (a tracing span, a request id) are copied
  into the worker for the call, as `asyncio.to_thread` does;
* the call's deadlines are the store's (``connect_timeout_s``,
  ``query_timeout_s``, ``pool_timeout_s``, ``write_timeout_s``, the
  caches' timeouts); ``asyncio.timeout()`` around an ``await`` works as
  a cancellation (below).

Cancellation. A task cancelled (or timed out) while it awaits a call gets
`asyncio.CancelledError` at once, but the call itself is never stopped
half way: a write a worker has started runs to completion there (both
sides of a pair, the counts, the cache invalidations; its locks released
and its connection back in the pool), exactly as if the reply had been
lost. So a cancelled write may have been applied, or not (if no worker had
taken it yet, it never runs); read it back to know. A write is applied
once either way. `aclose()` waits for every call still running, including
those whose tasks were cancelled.

``update(id, fn)``: ``fn`` is a plain function, as with `Store.update`; it
runs where the call runs (the worker thread, or with ``io="native"`` the
loop's thread), inside the object's transaction. A coroutine
function (``async def``) is refused with `TypeError` before anything runs.

Forks: an `AsyncStore` made before ``os.fork()`` gives the child a new
executor of its own when it is next used (`store.forks`, and a process id
check at each call); the sync store under it reopens its own connections.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import functools
import inspect
import os
import random
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, TypeVar

from store import green
from store.config import StoreConfig
from store.exceptions import ConfigError, StoreError, brief
from store.exchange import ExportReport, ImportReport
from store.forks import at_fork
from store.objects import Updater, Versioned
from store.relations.repository import Page
from store.routing import Location
from store.scan import Scan
from store.store import AdminContext, Store

if TYPE_CHECKING:
    from store.cache import Caches
    from store.engines import Engines
    from store.mapsource import MapSource
    from store.metrics import Metrics
    from store.serde import Serde
    from store.shardmap import ShardMap

__all__ = ["IO_MODES", "MAX_WORKERS_DEFAULT_CAP", "AsyncScan", "AsyncStore", "default_max_workers"]

R = TypeVar("R")

#: The default executor never has more workers than this, however large ``pool_size`` is.
MAX_WORKERS_DEFAULT_CAP = 32


#: How an `AsyncStore` runs its calls (see the module's text).
IO_MODES = ("threads", "native")


def default_max_workers(config: StoreConfig) -> int:
    """The default ``max_workers``: one worker per pooled connection of a host, at most 32."""
    return min(MAX_WORKERS_DEFAULT_CAP, config.pool_size)


class AsyncStore:
    """The `Store` API as coroutines: ``await s.get(id)``; see the module's text for what runs where.

    The constructor takes what `Store`'s takes, plus ``max_workers``: how
    many calls run at once (each on a worker thread of the store's own
    executor, made on first use), default ``min(32, pool_size)``; and ``io``:
    ``"threads"`` (that executor) or ``"native"`` (each call a greenlet on the
    event loop). With ``"native"``, ``max_workers`` given caps the calls
    running at once on each loop (the others wait their turn, in order, before
    they start; a caller cancelled meanwhile never starts its call); not
    given, no cap: the pools alone bound what waits on a database.
    """

    def __init__(
        self,
        config: StoreConfig,
        *,
        max_workers: int | None = None,
        io: str = "threads",
        engines: Engines | None = None,
        serde: Serde | None = None,
        rng: random.Random | None = None,
        clock_us: Callable[[], int] | None = None,
        caches: Caches | None = None,
        map_source: MapSource | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        workers = _worker_count(config, max_workers)  # checked before the store starts anything
        _io_mode(io)
        store = Store(
            config,
            engines=engines,
            serde=serde,
            rng=rng,
            clock_us=clock_us,
            caches=caches,
            map_source=map_source,
            metrics=metrics,
        )
        self._attach(store, workers, io, max_workers)

    def _attach(self, store: Store, max_workers: int, io: str = "threads", cap: int | None = None) -> None:
        #: How many calls run at once with ``io="threads"``: the executor's workers.
        self.max_workers = max_workers
        #: How calls run: ``"threads"`` or ``"native"`` (see the module's text).
        self.io = _io_mode(io)
        #: With ``io="native"``: the most calls running at once on a loop (None: no cap), and
        #: each loop's turns (`_Turns`).
        self.native_cap = cap if self.io == "native" else None
        self._turns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Turns] = (
            weakref.WeakKeyDictionary()
        )
        #: The outcomes of the calls running with ``io="native"`` (`aclose` waits for them).
        #: The native calls still running (`store.green.begin`), cancelled callers' too.
        self._native: set[Any] = set()
        self._store = store
        self._executor: ThreadPoolExecutor | None = None
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._closed = False
        at_fork(self, AsyncStore._forget_executor)

    @classmethod
    def from_config(
        cls,
        source: str | os.PathLike[str] | Mapping[str, Any] | StoreConfig | None = None,
        *,
        max_workers: int | None = None,
        io: str = "threads",
    ) -> AsyncStore:
        """A store from what `Store.from_config` takes: a YAML path, a dict, a `StoreConfig` or None."""
        if max_workers is not None:
            _worker_count(None, max_workers)  # refused before the store is made
        _io_mode(io)
        return cls.from_store(Store.from_config(source), max_workers=max_workers, io=io)

    @classmethod
    def from_store(cls, store: Store, *, max_workers: int | None = None, io: str = "threads") -> AsyncStore:
        """Drive an existing sync ``store`` (shared with sync code, if need be); `aclose` closes it."""
        if not isinstance(store, Store):
            raise TypeError(f"AsyncStore.from_store takes a Store, got {type(store).__name__}")
        self = cls.__new__(cls)
        self._attach(store, _worker_count(store.config, max_workers), io, max_workers)
        return self

    # -- what runs the calls --------------------------------------------------------

    def _forget_executor(self) -> None:
        """In a forked child: the parent's workers and native calls are not this process's; a new
        executor is made on next use."""
        self._executor = None
        self._native = set()
        self._turns = weakref.WeakKeyDictionary()
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def _workers(self) -> ThreadPoolExecutor:
        if self._pid != os.getpid():  # a fork `store.forks` did not see
            self._forget_executor()
        executor = self._executor
        if executor is None:
            with self._lock:
                if self._closed:
                    raise StoreError("this AsyncStore is closed; make a new one")
                executor = self._executor
                if executor is None:
                    executor = self._executor = ThreadPoolExecutor(
                        max_workers=self.max_workers, thread_name_prefix="store-aio"
                    )
        return executor

    async def _run(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> R:
        """``fn(*args, **kwargs)`` on a worker, in a copy of the caller's context."""
        if self._closed:
            raise StoreError("this AsyncStore is closed; make a new one")
        if self.io == "native":
            # A caller cancelled at any await gets CancelledError at once, while the call runs to
            # its end on the loop (no pair half written, no connection left mid-reply).
            # (Awaited as it is: a cancelled await cancels the future, which only drops the
            # outcome; the call stays listed in _native until it ends, for aclose.)
            if self.native_cap is None:
                return await green.begin(self._native, fn, *args, **kwargs)
            loop = asyncio.get_running_loop()
            turns = self._turns.get(loop)
            if turns is None:
                turns = self._turns[loop] = _Turns(self.native_cap)
            await turns.take(loop)
            return await green.begin(self._native, turns.run, fn, args, kwargs)
        executor = self._workers()
        context = contextvars.copy_context()
        loop = asyncio.get_running_loop()
        # A cancelled await cancels only a call no worker has started; a started one runs to its end.
        return await loop.run_in_executor(executor, functools.partial(context.run, fn, *args, **kwargs))

    # -- the live map -----------------------------------------------------------

    @property
    def config(self) -> StoreConfig:
        """The store's validated config."""
        return self._store.config

    @property
    def shard_map(self) -> ShardMap:
        """The shard map this store routes by now."""
        return self._store.shard_map

    @property
    def map_source(self) -> MapSource:
        """Where this store reads its shard map."""
        return self._store.map_source

    async def refresh_map(self, *, force: bool = False) -> bool:
        """As `Store.refresh_map`: reload the map if its source has a newer one; True if it changed."""
        return await self._run(self._store.refresh_map, force=force)

    async def locate(self, id: int, *, type_name: str | None = None) -> Location:  # noqa: A002
        """As `Store.locate`: shard, type, local id and master host of ``id`` (no I/O, run inline)."""
        return self._store.locate(id, type_name=type_name)

    # -- objects -----------------------------------------------------------------

    async def create(
        self, type_name: str, data: dict[str, Any], *, near: int | None = None, shard: int | None = None
    ) -> int:
        """As `Store.create`: store a new object and return its 64-bit ID."""
        return await self._run(self._store.create, type_name, data, near=near, shard=shard)

    async def get(self, id: int, *, type_name: str | None = None) -> dict[str, Any] | None:  # noqa: A002
        """As `Store.get`: the object with ``id``, or None if it does not exist or was deleted."""
        return await self._run(self._store.get, id, type_name=type_name)

    async def get_many(
        self, ids: Iterable[int], *, type_name: str | None = None
    ) -> dict[int, dict[str, Any]]:
        """As `Store.get_many`: objects by ID, absent and deleted left out (``ids`` read in the worker)."""
        return await self._run(self._store.get_many, ids, type_name=type_name)

    async def get_with_version(
        self,
        id: int,  # noqa: A002
        *,
        type_name: str | None = None,
    ) -> Versioned | None:
        """As `Store.get_with_version`: ``(data, version)`` from the object's master, or None."""
        return await self._run(self._store.get_with_version, id, type_name=type_name)

    async def update(
        self,
        id: int,  # noqa: A002
        changes: Updater,
        *,
        type_name: str | None = None,
        if_version: int | None = None,
    ) -> dict[str, Any]:
        """As `Store.update`: merge a dict, or apply a plain function old -> new, atomically.

        The function runs where the call runs (a worker thread, or the loop's
        thread with ``io="native"``), in the object's transaction, once per
        committed change; an ``async def`` function is a `TypeError`.
        """
        if callable(changes) and not isinstance(changes, dict):
            changes = _plain(changes)
        return await self._run(self._store.update, id, changes, type_name=type_name, if_version=if_version)

    async def delete(self, id: int, *, type_name: str | None = None) -> bool:  # noqa: A002
        """As `Store.delete`: soft-delete, both sides of its pairs removed; True if it was live."""
        return await self._run(self._store.delete, id, type_name=type_name)

    async def lookup(self, name: str, value: str | int) -> int | None:
        """As `Store.lookup`: the ID of the live object whose unique key ``name`` is ``value``, or None."""
        return await self._run(self._store.lookup, name, value)

    async def require(self, id: int, *, type_name: str | None = None) -> dict[str, Any]:  # noqa: A002
        """As `Store.require`: like `get`, but raises `NotFound` instead of returning None."""
        return await self._run(self._store.require, id, type_name=type_name)

    async def cache_key(self, id: int, *, type_name: str | None = None) -> str:  # noqa: A002
        """As `Store.cache_key`: the object cache's key of ``id`` (no I/O, run inline)."""
        return self._store.cache_key(id, type_name=type_name)

    # -- relations -----------------------------------------------------------------

    async def link(self, relation: str, from_id: int, to_id: int, *, sequence: int | None = None) -> bool:
        """As `Store.link`: add the pair (and its inverse); True if it is new."""
        return await self._run(self._store.link, relation, from_id, to_id, sequence=sequence)

    async def unlink(self, relation: str, from_id: int, to_id: int) -> bool:
        """As `Store.unlink`: remove the pair (and its inverse); True if it was there."""
        return await self._run(self._store.unlink, relation, from_id, to_id)

    async def links(
        self, relation: str, from_id: int, *, limit: int = 50, offset: int = 0, newest_first: bool = False
    ) -> list[int]:
        """As `Store.links`: ``to_id``s of ``from_id`` in sequence order, ``LIMIT limit OFFSET offset``."""
        return await self._run(
            self._store.links, relation, from_id, limit=limit, offset=offset, newest_first=newest_first
        )

    async def page(
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
        """As `Store.page`: one keyset page of ``from_id``'s list, ``since <= sequence < until``."""
        return await self._run(
            self._store.page,
            relation,
            from_id,
            limit=limit,
            cursor=cursor,
            newest_first=newest_first,
            since=since,
            until=until,
        )

    async def has_link(self, relation: str, from_id: int, to_id: int) -> bool:
        """As `Store.has_link`: whether ``to_id`` is in ``from_id``'s list."""
        return await self._run(self._store.has_link, relation, from_id, to_id)

    async def has_links(self, relation: str, from_id: int, to_ids: Iterable[int]) -> set[int]:
        """As `Store.has_links`: which of ``to_ids`` are in ``from_id``'s list."""
        return await self._run(self._store.has_links, relation, from_id, to_ids)

    async def has_links_many(self, relation: str, pairs: Iterable[tuple[int, int]]) -> set[tuple[int, int]]:
        """As `Store.has_links_many`: which of ``pairs`` (from_id, to_id) are linked."""
        return await self._run(self._store.has_links_many, relation, pairs)

    async def pages_many(
        self, relation: str, from_ids: Iterable[int], *, limit: int = 50, newest_first: bool = False
    ) -> dict[int, Page]:
        """As `Store.pages_many`: the first page of each list, by from_id."""
        return await self._run(
            self._store.pages_many, relation, from_ids, limit=limit, newest_first=newest_first
        )

    async def board_pins_many(
        self, board_ids: Iterable[int], *, limit: int = 50, newest_first: bool = False
    ) -> dict[int, Page]:
        """As `Store.board_pins_many`: each board's first page with its pin objects, by board ID."""
        return await self._run(self._store.board_pins_many, board_ids, limit=limit, newest_first=newest_first)

    async def count(self, relation: str, from_id: int) -> int:
        """As `Store.count`: how many entries ``from_id``'s list has (kept exact)."""
        return await self._run(self._store.count, relation, from_id)

    async def board_pins(
        self, board_id: int, *, limit: int = 50, cursor: str | None = None, newest_first: bool = False
    ) -> Page:
        """As `Store.board_pins`: one page of a board's pins with the pin objects."""
        return await self._run(
            self._store.board_pins, board_id, limit=limit, cursor=cursor, newest_first=newest_first
        )

    async def create_many(
        self,
        type_name: str,
        items: Iterable[dict[str, Any]],
        *,
        near: int | None = None,
        shard: int | None = None,
    ) -> list[int]:
        """As `Store.create_many`: many new objects of one type, their IDs in the order of ``items``."""
        return await self._run(self._store.create_many, type_name, list(items), near=near, shard=shard)

    async def link_many(
        self, relation: str, pairs: Iterable[tuple[int, int]], *, sequence: int | None = None
    ) -> int:
        """As `Store.link_many`: `link` each pair, batched per host; how many were new."""
        return await self._run(self._store.link_many, relation, list(pairs), sequence=sequence)

    async def unlink_many(self, relation: str, pairs: Iterable[tuple[int, int]]) -> int:
        """As `Store.unlink_many`: `unlink` each pair, batched per host; how many were there."""
        return await self._run(self._store.unlink_many, relation, list(pairs))

    async def page_objects(
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
        """As `Store.page_objects`: one page of ``from_id``'s list with the objects it names."""
        return await self._run(
            self._store.page_objects,
            relation,
            from_id,
            limit=limit,
            cursor=cursor,
            newest_first=newest_first,
            since=since,
            until=until,
        )

    async def pages_objects_many(
        self, relation: str, from_ids: Iterable[int], *, limit: int = 50, newest_first: bool = False
    ) -> dict[int, Page]:
        """As `Store.pages_objects_many`: each list's first page with its objects, by from_id."""
        return await self._run(
            self._store.pages_objects_many, relation, list(from_ids), limit=limit, newest_first=newest_first
        )

    async def scan(
        self,
        type_name: str,
        *,
        shards: Iterable[int] | None = None,
        batch: int = 1000,
        include_deleted: bool = False,
        resume: str | None = None,
    ) -> AsyncScan:
        """As `Store.scan`, as an async iterator: ``async for id, data in await s.scan("pin")``.

        Rows are fetched on a worker a page at a time; ``resume_token`` is the
        position after the last row this iterator gave (bad arguments raise here).
        """
        scan = await self._run(
            self._store.scan,
            type_name,
            shards=None if shards is None else list(shards),
            batch=batch,
            include_deleted=include_deleted,
            resume=resume,
        )
        return AsyncScan(self, scan, batch)

    async def export(
        self,
        out: str | os.PathLike[str] | IO[str],
        *,
        shards: Iterable[int] | None = None,
        resume: bool = False,
        progress: Callable[[int, int], None] | None = None,
    ) -> ExportReport:
        """As `Store.export` (on a worker: a long call; ``progress`` is called there)."""
        return await self._run(self._store.export, out, shards=shards, resume=resume, progress=progress)

    async def import_records(
        self,
        lines: Iterable[str | bytes],
        *,
        batch: int = 1000,
        progress: Callable[[int], None] | None = None,
    ) -> ImportReport:
        """As `Store.import_records` (on a worker: a long call; ``progress`` is called there)."""
        return await self._run(self._store.import_records, lines, batch=batch, progress=progress)

    async def ping(self) -> dict[str, Any]:
        """As `Store.ping`: whether each host, cache server and the map source answered in time."""
        return await self._run(self._store.ping)

    # -- lifecycle ------------------------------------------------------------------

    def admin_context(self) -> AdminContext:
        """The sync store's insides, for admin jobs, tools and tests (never on the request path)."""
        return self._store.admin_context()

    async def stats(self) -> dict[str, dict[str, int]]:
        """As `Store.stats`: counters per cache (in-process, run inline)."""
        return self._store.stats()

    async def aclose(self) -> None:
        """Wait for every call still running (cancelled tasks' too), then close the store.

        Calls made after it raise `StoreError`. Closing twice is harmless.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            executor, self._executor = self._executor, None
        while self._native:  # (each ends on its own: nothing of theirs to await but the end)
            await asyncio.sleep(0.005)
        if executor is not None:
            await asyncio.to_thread(executor.shutdown, wait=True)
        await asyncio.to_thread(self._store.close)

    async def __aenter__(self) -> AsyncStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


def _io_mode(io: object) -> str:
    """``io`` checked: one of `IO_MODES`."""
    if io not in IO_MODES:
        raise ConfigError(f"io must be one of {', '.join(map(repr, IO_MODES))}, got {brief(io)}")
    return str(io)


class _Turns:
    """The calls of one loop that run at once with ``io="native"`` and a cap: a call takes a turn
    before it starts (or waits for one, first come first served) and gives it to the next caller
    when it ends. All on the loop's thread: no lock."""

    __slots__ = ("free", "waiting")

    def __init__(self, cap: int) -> None:
        self.free = cap
        self.waiting: collections.deque[asyncio.Future[None]] = collections.deque()

    async def take(self, loop: asyncio.AbstractEventLoop) -> None:
        """A turn: at once if one is free and nobody waits, else when a call ends."""
        if self.free > 0 and not self.waiting:
            self.free -= 1
            return
        turn: asyncio.Future[None] = loop.create_future()
        self.waiting.append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.give()  # handed a turn, cancelled before it could start: to the next one
            raise

    def give(self) -> None:
        """An ended call's turn, to the first caller still waiting (or back to the free ones)."""
        while self.waiting:
            turn = self.waiting.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        self.free += 1

    def run(self, fn: Callable[..., R], args: tuple[Any, ...], kwargs: dict[str, Any]) -> R:
        """``fn(*args, **kwargs)``, its turn given on when it ends (in the call's greenlet)."""
        try:
            return fn(*args, **kwargs)
        finally:
            self.give()


def _worker_count(config: StoreConfig | None, max_workers: int | None) -> int:
    """``max_workers`` checked, or the default for ``config``."""
    if max_workers is None and config is not None:
        return default_max_workers(config)
    if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
        raise ConfigError(f"max_workers must be an int of at least 1, got {brief(max_workers)}")
    return max_workers


def _plain(fn: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """``fn`` as `Store.update` runs it; `TypeError` for a coroutine function, now or when it runs."""
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__):
        raise TypeError(_ASYNC_UPDATE)

    @functools.wraps(fn)
    def plain(old: dict[str, Any]) -> dict[str, Any]:
        new = fn(old)
        if inspect.isawaitable(new):  # a lambda that returns a coroutine: refused before any write
            close = getattr(new, "close", None)
            if callable(close):
                close()  # never awaited: closed, so no "never awaited" warning
            raise TypeError(_ASYNC_UPDATE)
        return new  # type: ignore[no-any-return]

    return plain


_ASYNC_UPDATE = (
    "AsyncStore.update takes a dict or a plain function old -> new, run inside the object's "
    "transaction; an async function cannot be awaited there: read what it needs first"
)


class AsyncScan:
    """`Store.scan` as an async iterator: rows fetched on the store's workers, a page at a time."""

    def __init__(self, owner: AsyncStore, scan: Scan, batch: int) -> None:
        self._owner = owner
        self._scan = scan
        self._batch = max(1, batch)
        self._rows: list[tuple[tuple[int, dict[str, Any]], str]] = []
        self._done = False
        #: The position after the last row this iterator gave (``Store.scan(..., resume=token)``).
        self.resume_token: str = scan.resume_token

    def __aiter__(self) -> AsyncScan:
        """Itself."""
        return self

    def _pull(self) -> list[tuple[tuple[int, dict[str, Any]], str]]:
        out = []
        for _ in range(self._batch):
            row = next(self._scan, None)
            if row is None:
                break
            out.append((row, self._scan.resume_token))
        return out

    async def __anext__(self) -> tuple[int, dict[str, Any]]:
        """The next (id, data)."""
        if not self._rows and not self._done:
            self._rows = await self._owner._run(self._pull)
            self._rows.reverse()
            self._done = not self._rows
        if not self._rows:
            raise StopAsyncIteration
        row, token = self._rows.pop()
        self.resume_token = token
        return row
