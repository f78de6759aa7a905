"""Connections to shards: one connection pool per host (per shard file on SQLite).

A server host holds many shard databases or schemas and has one pool that
all of them share; statements name their table as ``db00042.pins``. A SQLite
"host" is a folder with one file per shard, so there each shard file gets a
pool of its own, its tables made on first use. What differs by server is
the host's `store.backends.Backend`: this module never asks which it is.

Connections run in autocommit mode: a read is one round trip and never
leaves a snapshot open; writes that need a transaction say BEGIN. Where the
backend's connections take several statements per request (MariaDB), the
BEGIN goes with the transaction's first statement and statements whose
results are not read go with the next one or with the COMMIT: the
transaction's cursor is `store.transactions`'s. This module checks
connections out and in, turns driver errors into the store's, and runs a
transaction on one shard (`ShardHandle.transaction`) or on two
(`transaction_pair`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any, TypeVar

from store import green
from store.backends import Backend, ErrorKind, access_denied, backend_for
from store.config import StoreConfig
from store.exceptions import (
    BackendError,
    ConfigError,
    ConnectionLostError,
    ShardMovedError,
    ShardNotInitializedError,
)
from store.forks import at_fork
from store.pool import ConnectionPool
from store.transactions import Cursor, DBAPIConnection, _refusal, _retrying, _rolled_back, _Txn

__all__ = ["Cursor", "DBAPIConnection", "Engines", "ShardHandle", "transaction_pair"]

T = TypeVar("T")


class _Checkout:
    """``with handle.connect() as conn``: check out, give back or discard, wrap driver errors.

    A connection that leaves by an exception is discarded, unless `keep`
    was called: its transaction was refused by the store's own check (a
    deleted object, a version conflict) and rolled back cleanly.
    """

    __slots__ = ("_born", "_conn", "_h", "_keep")

    def __init__(self, h: ShardHandle) -> None:
        self._h = h
        self._keep = False

    def keep(self) -> None:
        """Give the connection back even though an exception leaves the block (it is known clean)."""
        self._keep = True

    def __enter__(self) -> DBAPIConnection:
        h = self._h
        if h.observe is not None:  # metrics on (`store.metrics`): tell it the host this call runs on
            h.observe(h.host)
        try:
            self._conn, self._born = h.pool.checkout()
        except BackendError:
            raise
        except Exception as exc:
            raise _wrap(exc, h) from exc
        return self._conn  # type: ignore[no-any-return]

    def __exit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        h = self._h
        if exc is None or self._keep:
            h.pool.checkin(self._conn, self._born)
            return
        # Whatever state the connection is in (an open transaction, a
        # half-read result), it must not go back to the pool.
        lost = isinstance(exc, Exception) and h.backend.classify(exc) is ErrorKind.DISCONNECT
        h.pool.discard(self._conn, disconnected=lost)
        if isinstance(exc, Exception) and h.backend.is_driver_error(exc):
            wrapped = _wrap(exc, h)
            if isinstance(wrapped, ShardMovedError) and wrapped.moved_to is None:
                wrapped = _with_tombstone_details(h, wrapped)
            raise wrapped from exc


def _with_tombstone_details(h: ShardHandle, err: ShardMovedError) -> ShardMovedError:
    """A write refused by a tombstone does not say where the shard went: its marker row does.

    One more round trip, on this rare path only; without an answer, the
    error stays as it was (the store reloads its map either way).
    """
    try:
        conn, born = h.pool.checkout()
    except Exception:
        return err
    try:
        cur = conn.cursor()
        told = h.backend.tombstones(cur, [h.shard]).get(h.shard)
        cur.close()
    except Exception:
        h.pool.discard(conn)
        return err
    h.pool.checkin(conn, born)
    if told is None:
        return err
    return _moved(h.shard, h.host, told[0], told[1], err.orig)


def _moved(
    shard: int, host: str, moved_to: str | None, version: int | None, orig: BaseException | None
) -> ShardMovedError:
    whereto = "" if moved_to is None else f" to {moved_to} in map version {version}"
    return ShardMovedError(
        f"shard {shard} on host {host} is a tombstone: the shard moved away{whereto}; this process "
        "routed by an older map (a Store reloads its map and retries by itself)",
        shard=shard,
        host=host,
        moved_to=moved_to,
        map_version=version,
        orig=orig,
    )


class ShardHandle:
    """Everything needed to run statements on one shard: its host's backend and pool."""

    __slots__ = ("_log", "backend", "host", "observe", "pool", "shard")

    def __init__(
        self,
        shard: int,
        host: str,
        pool: ConnectionPool,
        backend: Backend,
        log: Callable[[ShardHandle], str | None] | None = None,
        observe: Callable[[str], None] | None = None,
    ) -> None:
        self.shard = shard
        self.host = host
        self.pool = pool
        self.backend = backend
        self._log = log
        #: Told the host at every checkout when metrics are on (`Engines.set_observer`); else None.
        self.observe = observe

    def log_sql(self) -> str | None:
        """The INSERT of an invalidation log row on this host, if writes here are logged (else None)."""
        return None if self._log is None else self._log(self)

    def connect(self) -> _Checkout:
        """A pooled connection as a context manager; driver errors come out as `BackendError`."""
        return _Checkout(self)

    def table(self, table: str) -> str:
        """The quoted name of ``table`` in this shard."""
        return self.backend.table(self.shard, table)

    def read(self, sql: str, params: Sequence[Any], *, one: bool) -> Any:
        """Run a read: one row (``one``) or all rows (`_reading`: again on a lost connection)."""

        def run(cur: Any) -> Any:
            rows_of = getattr(cur, "execute_rows", None)
            if rows_of is not None:  # (PyMySQL: read straight off the socket, 15-17 us less a read)
                ((_n, _id, rows),) = rows_of(sql, params)
                return (rows[0] if rows else None) if one else rows
            cur.execute(sql, params)
            return cur.fetchone() if one else cur.fetchall()

        return self._reading(run)

    def read_pipelined(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[list[Any]]:
        """Run reads in one request where the driver pipelines them (`Backend.pipelines`): the
        rows of each, in order (`_reading`: again on a lost connection)."""

        def run(cur: Any) -> list[list[Any]]:  # (a pipelining driver's cursor: `run_pipeline`)
            return [rows or [] for _n, rows in cur.run_pipeline(statements)]

        return self._reading(run)

    def write(self, sql: str, params: Sequence[Any]) -> int:
        """Run one write statement on its own (autocommit); the rows it changed.

        A deadlock or lock wait timeout rolled the statement back whole: it runs again, as a
        transaction does (`transaction`). Any other error is raised.
        """

        def attempt() -> int:
            with self.connect() as conn:
                cur = conn.cursor()
                cur.execute(sql, params)
                n = int(cur.rowcount)
                cur.close()
            return n

        return _retrying(attempt)

    def _reading(self, run: Callable[[Any], T]) -> T:
        """``run`` on a pooled connection's cursor.

        A connection lost during the read is retried once on a new one: an idle pooled
        connection may have died unseen (a server restart, ``wait_timeout``). A connection
        that could not be opened is not: the host is unreachable, and a second connect would
        only double the wait to two ``connect_timeout_s``.
        """
        for attempt in (1, 2):
            conn: DBAPIConnection | None = None  # stays None if no connection could be had
            try:
                with self.connect() as conn:
                    cur = conn.cursor()
                    got = run(cur)
                    cur.close()
                return got
            except ConnectionLostError:
                if conn is None or attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def transaction(self, body: Callable[[Cursor], T]) -> T:
        """Run ``body`` in one transaction on this shard; again after a deadlock or lock timeout.

        A deadlock or lock wait timeout rolls the whole transaction back, so
        running it again is safe. Any other error rolls back and is raised.
        """

        def attempt() -> T:
            checkout = self.connect()
            with checkout as conn:
                cur = _Txn(conn.cursor(), self.backend)
                try:
                    result = body(cur)
                    cur.commit()
                except BaseException as exc:
                    # The ROLLBACK releases the locks now rather than at
                    # disconnect; after a refusal the connection is reused.
                    if _rolled_back([cur]) and _refusal(exc):
                        checkout.keep()
                    raise
                finally:
                    cur.close()
            return result

        return _retrying(attempt)


def transaction_pair(
    first: ShardHandle,
    second: ShardHandle,
    body_first: Callable[[Cursor], T],
    body_second: Callable[[Cursor, T], None],
    *,
    step: Callable[[str], None] | None = None,
) -> T:
    """A transaction on ``second`` run and committed inside one on ``first`` (two pools).

    BEGIN first; ``body_first``; BEGIN second; ``body_second``; COMMIT second;
    COMMIT first. Both connections are taken from their pools before either
    transaction begins, always in (host, shard) order, so two callers can
    never each hold one connection and wait for the other's pool. Where a
    write transaction locks a whole shard (SQLite), both BEGINs come first,
    in shard order. A deadlock or lock wait timeout rolls both back and runs
    both again. ``step`` is told "primary written" and "inverse committed".
    """
    say = step or (lambda _name: None)
    a, b = sorted((first, second), key=lambda h: (h.host, h.shard))

    def attempt() -> T:
        out_a, out_b = a.connect(), b.connect()
        with out_a as ca, out_b as cb:
            r1, r2 = (ca.cursor(), cb.cursor()) if a is first else (cb.cursor(), ca.cursor())
            open_: list[_Txn] = []
            t1: _Txn | None = None
            t2: _Txn | None = None
            try:
                if first.backend.locks_whole_shard:
                    for h, r in sorted(((first, r1), (second, r2)), key=lambda hr: hr[0].shard):
                        open_.append(_Txn(r, h.backend))
                    t1, t2 = (open_[0], open_[1]) if open_[0]._c is r1 else (open_[1], open_[0])
                else:
                    t1 = _Txn(r1, first.backend)
                    open_.append(t1)
                result = body_first(t1)
                say("primary written")
                if t2 is None:
                    t2 = _Txn(r2, second.backend)
                    open_.append(t2)
                body_second(t2, result)
                t2.commit()
                open_.remove(t2)
                say("inverse committed")
                t1.commit()
                open_.remove(t1)
            except BaseException as exc:
                # This frees the locks now; after a refusal both connections are reused.
                if _rolled_back(open_) and _refusal(exc):
                    out_a.keep()
                    out_b.keep()
                raise
            finally:
                r1.close()
                r2.close()
        return result

    return _retrying(attempt)


def _wrap(exc: Exception, h: ShardHandle) -> BackendError | ShardMovedError:
    kind = h.backend.classify(exc)
    where = f"shard {h.shard} on host {h.host}"
    if kind is ErrorKind.TOMBSTONE:
        told = h.backend.tombstone_from_error(exc)
        if told is None:
            return _moved(h.shard, h.host, None, None, exc)
        return _moved(h.shard, h.host, told[0], told[1], exc)
    if kind is ErrorKind.MISSING:
        return ShardNotInitializedError(
            f"{where} is not initialised ({exc}); run `store init --shards {h.shard}-{h.shard}`", orig=exc
        )
    if access_denied(exc):
        return BackendError(_denied_message(exc, h), orig=exc)
    if kind is ErrorKind.DISCONNECT:
        return ConnectionLostError(f"lost or could not open the connection to {where}: {exc}", orig=exc)
    err = BackendError(f"database error on {where}: {exc}", orig=exc)
    err.retryable = kind is ErrorKind.RETRYABLE
    err.duplicate = kind is ErrorKind.DUPLICATE
    return err


def _denied_message(exc: Exception, h: ShardHandle) -> str:
    """What to do about a privilege the server refused on ``h``."""
    s = h.shard
    if (exc.args and exc.args[0] == 1045) or "password authentication failed" in str(exc):
        return (
            f"host {h.host} refused the login ({exc}): check the user and password of hosts.{h.host} "
            "(url, password_env or password_file)"
        )
    return (
        f"the account of host {h.host} may not do this on shard {s} ({exc}). An application account "
        "reads and writes rows only: run DDL with the admin URL (hosts.NAME.admin), and give the account "
        f"the shards it serves with `store grants --app-user NAME --apply`. If shard {s} was never "
        f"made, run `store init --shards {s}-{s}`"
    )


#: Threads that run a call's queries beside the calling thread's own: at most FANOUT_WORKERS + 1
#: queries of one call run at once (a batch that spans more hosts waits for a turn).
FANOUT_WORKERS = 8


_LOG_EXISTS = "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = %s AND table_name = %s"


class Engines:
    """One pool per host (per shard file where the backend wants one), created lazily, shared by threads."""

    def __init__(self, config: StoreConfig) -> None:
        self._config = config
        self._lock = threading.Lock()
        self._fanout: ThreadPoolExecutor | None = None
        self._pools: dict[tuple[str, int], ConnectionPool] = {}
        self._handles: dict[tuple[str, int], ShardHandle] = {}
        self._backends = {name: backend_for(url, config.names) for name, url in config.hosts.items()}
        c = config.cache
        shared = bool(c.memcached or c.redis)
        #: The hosts whose writes are logged (`store.cache.follower`): all with ``cache.follow``,
        #: else those whose ``cache.invalidation`` is ``log`` (where caches are shared).
        self.logged_hosts = frozenset(
            name for name in config.hosts if shared and (c.follow or c.invalidation_of(name) == "log")
        )
        #: Writes are logged on some host.
        self.logging = bool(self.logged_hosts)
        self._logs: dict[str, str] = {}
        self._observe: Callable[[str], None] | None = None
        at_fork(self, Engines._after_fork)

    def _after_fork(self) -> None:
        """In a forked child: a lock of its own, and no fan-out threads (they stayed in the parent:
        a new pool of them starts on the next batch). Each pool resets itself (`store.pool`)."""
        self._lock = threading.Lock()
        self._fanout = None

    def _log_sql(self, h: ShardHandle) -> str | None:
        """The log INSERT of ``h``'s host, once the log is known to exist (checked once per process).

        `store init` makes the log where ``cache.follow`` is on; an account
        that may create it (an admin's) makes it here if it is missing; the
        application's account gets a `ConfigError` that says to run init.
        """
        sql = self._logs.get(h.host)
        if sql is None:
            with self._lock:
                if h.host not in self._logs:
                    with h.connect() as conn:
                        cur = conn.cursor()
                        cur.execute(_LOG_EXISTS, (h.backend.names.log_database, "cache_log"))
                        if not int(cur.fetchone()[0]):
                            try:
                                for ddl in h.backend.change_log_ddl():
                                    cur.execute(ddl)
                            except Exception as exc:
                                if not access_denied(exc):
                                    raise
                                raise ConfigError(
                                    f"host {h.host} has no invalidation log ({h.backend.change_log}) and "
                                    "this account may not create it: run `store init` "
                                    "(cache.follow is on, or cache.invalidation is log)"
                                ) from None
                        cur.close()
                    self._logs[h.host] = h.backend.change_log_insert()
                sql = self._logs[h.host]
        return sql

    def backend(self, host: str) -> Backend:
        """The backend of ``host``."""
        return self._backends[host]

    def shard(self, shard: int, host: str) -> ShardHandle:
        """A handle on shard ``shard`` as held by ``host``."""
        handle = self._handles.get((host, shard))
        if handle is None:
            handle = self._make_handle(shard, host)
        return handle

    def _make_handle(self, shard: int, host: str) -> ShardHandle:
        backend = self._backends[host]
        with self._lock:
            # Server hosts share one pool across shards: key it on shard -1.
            key = (host, shard if backend.pool_per_shard else -1)
            pool = self._pools.get(key)
            if pool is None:
                pool = self._make_pool(host, shard, backend)
                self._pools[key] = pool
            log = self._log_sql if host in self.logged_hosts and backend.change_log else None
            handle = self._handles[(host, shard)] = ShardHandle(
                shard, host, pool, backend, log, self._observe
            )
            return handle

    def set_observer(self, observe: Callable[[str], None] | None) -> None:
        """Have ``observe(host)`` called at each connection checkout (metrics); None stops it."""
        with self._lock:
            self._observe = observe
            for handle in self._handles.values():
                handle.observe = observe

    def pools(self) -> dict[str, ConnectionPool]:
        """The pools made so far, by name (the host, or host/shard file where pools are per shard)."""
        with self._lock:
            return {pool.name: pool for pool in self._pools.values()}

    def _make_pool(self, host: str, shard: int, backend: Backend) -> ConnectionPool:
        c = self._config
        open_one = backend.connector(
            c.hosts[host],
            shard=shard,
            connect_timeout_s=c.connect_timeout_s,
            query_timeout_s=c.query_timeout_s,
        )
        name = f"{host}/{backend.namespace(shard)}" if backend.pool_per_shard else host
        pool = ConnectionPool(
            open_one,
            name=name,
            max_open=c.max_open,
            max_idle=c.pool_size,
            timeout_s=c.pool_timeout_s,
            recycle_s=c.pool_recycle_s,
            idle_s=c.pool_idle_s,
        )
        if backend.made_on_first_use:
            conn, born = pool.checkout()
            try:
                cur = conn.cursor()
                made = backend.shard_statements(
                    shard, c.types.values(), c.relations.values(), ids=c.ids, unique=bool(c.unique)
                )
                for _what, stmt in backend.missing(made, backend.existing(cur), ""):
                    cur.execute(stmt)
                cur.close()
            except BaseException:
                pool.discard(conn)
                raise
            pool.checkin(conn, born)
        return pool

    def run_all(self, jobs: Sequence[Callable[[], T]]) -> list[T]:
        """Run ``jobs`` (one query each, on different hosts) at once; their results in order.

        The first runs on the calling thread, the others on a small shared
        pool of `FANOUT_WORKERS` threads, so a batch over four hosts costs
        about one host's round trip. Every job finishes before the first
        error is raised (no query is left running on a connection).
        """
        if len(jobs) <= 1:
            return [job() for job in jobs]
        if green.active():  # an event loop's call: each job a call of the loop's, no thread
            return green.gather(jobs)
        pool = self._fanout
        if pool is None:
            with self._lock:
                pool = self._fanout
                if pool is None:
                    pool = self._fanout = ThreadPoolExecutor(
                        FANOUT_WORKERS, thread_name_prefix="store-fanout"
                    )
        futures = [pool.submit(job) for job in jobs[1:]]
        first: list[T] = []
        error: BaseException | None = None
        try:
            first.append(jobs[0]())
        except BaseException as exc:
            error = exc
        rest: list[T] = []
        for f in futures:
            try:
                rest.append(f.result())
            except BaseException as exc:
                error = error or exc
        if error is not None:
            raise error
        return first + rest

    def dispose(self) -> None:
        """Close every idle pooled connection and forget the pools."""
        with self._lock:
            if self._fanout is not None:
                self._fanout.shutdown(wait=True)
                self._fanout = None
            for pool in self._pools.values():
                pool.clear()
            self._pools.clear()
            self._handles.clear()
