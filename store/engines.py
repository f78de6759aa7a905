"""Connections to shards: one connection pool per host.

A MariaDB host holds many shard databases and has one pool that all of them
share; statements name their table as ``db00042.pins``. A SQLite "host" is a
folder with one file per shard, so there each shard file gets a small pool of
its own, created (tables included) on first use.

Host URLs are SQLAlchemy URLs (``mysql+pymysql://user:pw@host:3306``,
``mysql+mysqldb://...`` for mysqlclient, ``sqlite:///folder``). The hot path
runs SQL text built once per table on DBAPI connections, because a
SQLAlchemy Core statement costs tens of microseconds per call more than the
driver round trip it wraps (see BENCHMARKS.md and `store.pool`).
Connections run in autocommit mode: a read is one round trip and never
leaves a snapshot open; writes that need a transaction say BEGIN.
"""

from __future__ import annotations

import importlib
import math
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, TypeVar

from sqlalchemy.engine import URL

from store.config import StoreConfig
from store.exceptions import BackendError, ConnectionLostError, ShardMovedError, ShardNotInitializedError
from store.pool import ConnectionPool
from store.schema import (
    TOMBSTONE_ERRNO,
    TOMBSTONE_TABLE,
    database_name,
    parse_tombstone,
    schema_name,
    shard_ddl,
)

__all__ = [
    "Cursor",
    "DBAPIConnection",
    "Engines",
    "MySQLDialect",
    "PostgresDialect",
    "SQLiteDialect",
    "ShardHandle",
    "SqlDialect",
    "mysql_connector",
    "mysql_driver_error",
    "postgres_connector",
    "sqlite_connector",
    "transaction_pair",
]

T = TypeVar("T")

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 60.0
SQLITE_BUSY_TIMEOUT_S = 30.0
# MariaDB: 1049 unknown database, 1146 unknown table.
_MYSQL_MISSING = frozenset({1049, 1146})
# A write to a view (1471 not insertable, 1288 not updatable): the store's
# tables are never views, except the tombstone a moved shard leaves behind.
_MYSQL_TOMBSTONE = frozenset({TOMBSTONE_ERRNO, 1471, 1288})
# MariaDB client errors meaning the connection is gone: can't connect (2002,
# 2003), server gone away (2006), lost during query (2013), lost (2055).
_MYSQL_DISCONNECT = frozenset({2002, 2003, 2006, 2013, 2055})
_DRIVERS = {"pymysql": "pymysql", "mysqldb": "MySQLdb"}
# Transactions rolled back whole, safe to run again: MariaDB deadlock (1213),
# lock wait timeout (1205); PostgreSQL deadlock, serialization failure.
_MYSQL_RETRY = frozenset({1205, 1213})
_PG_RETRY = frozenset({"40P01", "40001"})
_TXN_ATTEMPTS = 4
# PostgreSQL: undefined table, invalid schema name, undefined function.
_PG_MISSING = frozenset({"42P01", "3F000", "42883"})


class Cursor(Protocol):
    """The part of a DBAPI cursor that `store` uses."""

    lastrowid: int | None
    rowcount: int

    def execute(self, sql: str, params: Any = ..., /) -> Any:
        """Run one statement."""

    def executemany(self, sql: str, params: Any, /) -> Any:
        """Run one statement for many parameter sets."""

    def fetchone(self) -> Any:
        """The next row or None."""

    def fetchall(self) -> Any:
        """Every remaining row."""

    def close(self) -> Any:
        """Release the cursor."""


class DBAPIConnection(Protocol):
    """The part of a DBAPI connection that `store` uses."""

    def cursor(self) -> Cursor:
        """A new cursor."""

    def close(self) -> Any:
        """Close the connection."""


class SqlDialect:
    """How one backend spells the statements `store` runs."""

    name: str = ""
    param: str = "%s"
    begin: str = "BEGIN"
    for_update: str = " FOR UPDATE"
    #: A read that keeps the row from being changed until the transaction ends.
    for_share: str = " FOR SHARE"
    touch_ts: str = ""  # extra SET clause where the DDL has no ON UPDATE
    #: INSERT suffix that skips a row whose key exists, with rowcount 0.
    on_conflict_skip: str = ""
    #: True where a write transaction locks the whole shard (SQLite's BEGIN IMMEDIATE):
    #: two such shards are then locked in shard order, so two writers never wait in a circle.
    locks_whole_shard: bool = False
    #: A statement that locks one key for the rest of the transaction, taken before writing a
    #: pair whose row may be absent; None where the write itself locks the key, present or not
    #: (InnoDB under REPEATABLE READ locks the gap of an absent key).
    key_lock: str | None = None

    def upsert_increment(self, column: str, key: tuple[str, ...], table: str) -> str:
        """INSERT suffix adding 1 to ``column`` of the existing ``key`` row of ``table`` (unqualified)."""
        raise NotImplementedError

    def upsert_set(self, column: str, key: tuple[str, ...]) -> str:
        """INSERT suffix that overwrites ``column`` of the row whose ``key`` exists."""
        raise NotImplementedError

    def table(self, shard: int, table: str) -> str:
        """The quoted name of ``table`` in shard ``shard``."""
        raise NotImplementedError

    def count_locked(self, table: str) -> str:
        """Count one list's rows, locking them against concurrent link/unlink."""
        return f"SELECT COUNT(*) FROM {table} WHERE from_id = {self.param}{self.for_update}"

    def params(self, n: int) -> str:
        """``n`` comma-separated placeholders."""
        return ", ".join([self.param] * n)


class MySQLDialect(SqlDialect):
    """MariaDB / MySQL: every shard is a database on its host."""

    name = "mysql"
    param = "%s"
    for_share = " LOCK IN SHARE MODE"
    # A no-op update reports 0 affected rows (the driver does not set
    # CLIENT_FOUND_ROWS), unlike INSERT IGNORE it hides no other error.
    on_conflict_skip = "ON DUPLICATE KEY UPDATE from_id = from_id"

    def upsert_increment(self, column: str, key: tuple[str, ...], table: str) -> str:
        """``ON DUPLICATE KEY UPDATE n = n + 1``."""
        return f"ON DUPLICATE KEY UPDATE {column} = {column} + 1"

    def upsert_set(self, column: str, key: tuple[str, ...]) -> str:
        """``ON DUPLICATE KEY UPDATE n = VALUES(n)``."""
        return f"ON DUPLICATE KEY UPDATE {column} = VALUES({column})"

    def table(self, shard: int, table: str) -> str:
        """``db00042`.`pins``, quoted."""
        return f"`{database_name(shard)}`.`{table}`"


class PostgresDialect(SqlDialect):
    """PostgreSQL: every logical shard is a schema (``shard0042``) in the host's database."""

    name = "postgresql"
    param = "%s"
    touch_ts = ", ts = now()"
    key_lock = "SELECT pg_advisory_xact_lock(%s)"
    on_conflict_skip = "ON CONFLICT DO NOTHING"

    def table(self, shard: int, table: str) -> str:
        """``"shard0042"."pins"``, quoted."""
        return f'"{schema_name(shard)}"."{table}"'

    def upsert_increment(self, column: str, key: tuple[str, ...], table: str) -> str:
        """``ON CONFLICT (key) DO UPDATE SET n = relation_counts.n + 1`` (the existing row's n)."""
        return f'ON CONFLICT ({", ".join(key)}) DO UPDATE SET {column} = "{table}".{column} + 1'

    def upsert_set(self, column: str, key: tuple[str, ...]) -> str:
        """``ON CONFLICT (key) DO UPDATE SET n = EXCLUDED.n``."""
        return f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET {column} = EXCLUDED.{column}"

    def count_locked(self, table: str) -> str:
        """PostgreSQL refuses FOR UPDATE with an aggregate: lock the rows in a subquery."""
        return f"SELECT COUNT(*) FROM (SELECT 1 FROM {table} WHERE from_id = %s FOR UPDATE) AS locked"


class SQLiteDialect(SqlDialect):
    """SQLite: every shard is a file of its own, so names are unqualified."""

    name = "sqlite"
    param = "?"
    begin = "BEGIN IMMEDIATE"  # take the write lock up front: SQLite has no FOR UPDATE
    for_update = ""
    for_share = ""
    locks_whole_shard = True
    touch_ts = ", ts = strftime('%Y-%m-%d %H:%M:%f', 'now')"
    on_conflict_skip = "ON CONFLICT DO NOTHING"

    def upsert_increment(self, column: str, key: tuple[str, ...], table: str) -> str:
        """``ON CONFLICT (key) DO UPDATE SET n = n + 1``."""
        return f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET {column} = {column} + 1"

    def upsert_set(self, column: str, key: tuple[str, ...]) -> str:
        """``ON CONFLICT (key) DO UPDATE SET n = excluded.n``."""
        return f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET {column} = excluded.{column}"

    def table(self, shard: int, table: str) -> str:
        """``"pins"``, quoted."""
        return f'"{table}"'


class _Checkout:
    """``with handle.connect() as conn``: check out, give back or discard, wrap driver errors."""

    __slots__ = ("_born", "_conn", "_h")

    def __init__(self, h: ShardHandle) -> None:
        self._h = h

    def __enter__(self) -> DBAPIConnection:
        h = self._h
        try:
            self._conn, self._born = h.pool.checkout()
        except BackendError:
            raise
        except Exception as exc:
            raise _wrap(exc, h.shard, h.host) from exc
        return self._conn  # type: ignore[no-any-return]

    def __exit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        h = self._h
        if exc is None:
            h.pool.checkin(self._conn, self._born)
            return
        # Whatever state the connection is in (an open transaction, a
        # half-read result), it must not go back to the pool.
        lost = isinstance(exc, Exception) and _is_disconnect(exc)
        h.pool.discard(self._conn, disconnected=lost)
        if isinstance(exc, Exception) and _is_driver_error(exc):
            wrapped = _wrap(exc, h.shard, h.host)
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
        cur.execute(
            f"SELECT moved_to, map_version FROM {h.table(TOMBSTONE_TABLE)} WHERE shard = %s", (h.shard,)
        )
        row = cur.fetchone()
        cur.close()
    except Exception:
        h.pool.discard(conn)
        return err
    h.pool.checkin(conn, born)
    if row is None:
        return err
    return _moved(h.shard, h.host, str(row[0]), int(row[1]), err.orig)


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
    """Everything needed to run statements on one shard: its dialect and its host's pool."""

    __slots__ = ("dialect", "host", "pool", "shard")

    def __init__(self, shard: int, host: str, pool: ConnectionPool, dialect: SqlDialect) -> None:
        self.shard = shard
        self.host = host
        self.pool = pool
        self.dialect = dialect

    def connect(self) -> _Checkout:
        """A pooled connection as a context manager; driver errors come out as `BackendError`."""
        return _Checkout(self)

    def table(self, table: str) -> str:
        """The quoted name of ``table`` in this shard."""
        return self.dialect.table(self.shard, table)

    def read(self, sql: str, params: Sequence[Any], *, one: bool) -> Any:
        """Run a read: one row (``one``) or all rows. Retried once on a new connection if it was lost."""
        for attempt in (1, 2):
            try:
                with self.connect() as conn:
                    cur = conn.cursor()
                    cur.execute(sql, params)
                    rows = cur.fetchone() if one else cur.fetchall()
                    cur.close()
                return rows
            except ConnectionLostError:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def transaction(self, body: Callable[[Cursor], T]) -> T:
        """Run ``body`` in one transaction on this shard; again after a deadlock or lock timeout.

        A deadlock or lock wait timeout rolls the whole transaction back, so
        running it again is safe. Any other error rolls back and is raised.
        """

        def attempt() -> T:
            with self.connect() as conn:
                cur = conn.cursor()
                cur.execute(self.dialect.begin)
                try:
                    result = body(cur)
                    cur.execute("COMMIT")
                except BaseException:
                    # The connection is discarded on the way out anyway; the
                    # ROLLBACK releases the locks now rather than at disconnect.
                    with suppress(Exception):
                        cur.execute("ROLLBACK")
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
        with a.connect() as ca, b.connect() as cb:
            c1, c2 = (ca.cursor(), cb.cursor()) if a is first else (cb.cursor(), ca.cursor())
            open_: list[Cursor] = []
            try:
                if first.dialect.locks_whole_shard:
                    for h, c in sorted(((first, c1), (second, c2)), key=lambda hc: hc[0].shard):
                        c.execute(h.dialect.begin)
                        open_.append(c)
                else:
                    c1.execute(first.dialect.begin)
                    open_.append(c1)
                result = body_first(c1)
                say("primary written")
                if c2 not in open_:
                    c2.execute(second.dialect.begin)
                    open_.append(c2)
                body_second(c2, result)
                c2.execute("COMMIT")
                open_.remove(c2)
                say("inverse committed")
                c1.execute("COMMIT")
                open_.remove(c1)
            except BaseException:
                for c in open_:  # the connections are discarded anyway; this frees the locks now
                    with suppress(Exception):
                        c.execute("ROLLBACK")
                raise
            finally:
                c1.close()
                c2.close()
        return result

    return _retrying(attempt)


def _retrying(attempt: Callable[[], T]) -> T:
    """``attempt()``, again after a deadlock or lock wait timeout (it rolled everything back)."""
    for n in range(1, _TXN_ATTEMPTS + 1):
        try:
            return attempt()
        except BackendError as exc:
            if not _retryable(exc) or n == _TXN_ATTEMPTS:
                raise
            time.sleep(0.005 * n)
    raise AssertionError("unreachable")


def _retryable(exc: BackendError) -> bool:
    orig = exc.orig
    code = orig.args[0] if orig is not None and orig.args else None
    return code in _MYSQL_RETRY or getattr(orig, "sqlstate", None) in _PG_RETRY


def _is_driver_error(exc: Exception) -> bool:
    if isinstance(exc, sqlite3.Error | ConnectionError | TimeoutError):
        return True
    return type(exc).__module__.startswith(("pymysql", "MySQLdb", "psycopg"))


def _is_disconnect(exc: Exception) -> bool:
    if isinstance(exc, ConnectionError | TimeoutError | BrokenPipeError):
        return True
    if type(exc).__module__.startswith("psycopg"):
        # psycopg: a lost or refused connection is an OperationalError with no SQLSTATE.
        return type(exc).__name__ == "OperationalError" and getattr(exc, "sqlstate", None) is None
    code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
    name = type(exc).__name__
    return (code in _MYSQL_DISCONNECT) or (name == "InterfaceError" and code in (0, None))


def _wrap(exc: Exception, shard: int, host: str) -> BackendError | ShardMovedError:
    code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
    text = str(exc)
    where = f"shard {shard} on host {host}"
    sqlstate = getattr(exc, "sqlstate", None)
    if code in _MYSQL_TOMBSTONE:
        told = parse_tombstone(text)
        if told is None:
            return _moved(shard, host, None, None, exc)
        return _moved(shard, host, told[0], told[1], exc)
    if code in _MYSQL_MISSING or "no such table" in text or sqlstate in _PG_MISSING:
        return ShardNotInitializedError(
            f"{where} is not initialised ({text}); run `store init --shards {shard}-{shard}`",
            orig=exc,
        )
    if _is_disconnect(exc):
        return ConnectionLostError(f"lost or could not open the connection to {where}: {text}", orig=exc)
    return BackendError(f"database error on {where}: {text}", orig=exc)


def _mysql_driver(url: URL) -> tuple[str, Any]:
    driver = url.get_driver_name() if "+" in url.drivername else "pymysql"
    if driver not in _DRIVERS:
        raise BackendError(f"unsupported MariaDB driver {driver!r}; use mysql+pymysql or mysql+mysqldb")
    return driver, importlib.import_module(_DRIVERS[driver])


def mysql_driver_error(url: URL) -> type[Exception]:
    """The base class of the errors ``url``'s driver raises (to tell them from bugs)."""
    error: type[Exception] = _mysql_driver(url)[1].Error
    return error


def mysql_connector(
    url: URL,
    *,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
    query_timeout_s: float = READ_TIMEOUT_S,
    setup: str | None = None,
) -> Callable[[], Any]:
    """A function that opens an autocommit, utf8mb4 DBAPI connection to ``url``.

    Opening it waits at most ``connect_timeout_s``; each read or write of a
    reply at most ``query_timeout_s`` (then the connection is lost to the
    caller). ``setup`` is a statement run on every new connection.
    """
    driver, module = _mysql_driver(url)

    def whole(seconds: float) -> float:
        return max(1, math.ceil(seconds)) if driver == "mysqldb" else seconds  # mysqlclient: whole seconds

    kwargs: dict[str, Any] = {
        "host": url.host or "127.0.0.1",
        "port": url.port or 3306,
        "user": url.username or "root",
        "password": url.password or "",
        "charset": "utf8mb4",
        "autocommit": True,
        "connect_timeout": whole(connect_timeout_s),
        "read_timeout": whole(query_timeout_s),
        "write_timeout": whole(query_timeout_s),
        # The inverse-pair protocol relies on InnoDB locking the gap of an
        # absent key, which READ COMMITTED (a common server default) skips.
        "init_command": "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ",
    }
    if "unix_socket" in url.query:
        kwargs["unix_socket"] = url.query["unix_socket"]

    def connect() -> Any:
        conn = module.connect(**kwargs)
        if setup is not None:
            try:
                cur = conn.cursor()
                cur.execute(setup)
                cur.close()
            except BaseException:
                with suppress(Exception):
                    conn.close()
                raise
        return conn

    return connect


def postgres_connector(
    url: URL, *, connect_timeout_s: float = CONNECT_TIMEOUT_S, query_timeout_s: float = READ_TIMEOUT_S
) -> Callable[[], Any]:
    """A function that opens an autocommit psycopg connection to ``url``.

    A statement runs at most ``query_timeout_s`` on the server; data the
    server does not acknowledge for that long breaks the connection.
    """
    import psycopg

    ms = int(query_timeout_s * 1000)
    kwargs: dict[str, Any] = {
        "host": url.host or "127.0.0.1",
        "port": url.port or 5432,
        "user": url.username or "postgres",
        "dbname": url.database,
        "connect_timeout": max(2, math.ceil(connect_timeout_s)),  # libpq: whole seconds, at least 2
        "options": f"-c statement_timeout={ms}",
        "tcp_user_timeout": ms,
        "autocommit": True,
    }
    if url.password:
        kwargs["password"] = url.password

    def connect() -> Any:
        return psycopg.connect(**kwargs)

    return connect


def sqlite_connector(path: Path) -> Callable[[], sqlite3.Connection]:
    """A function that opens one shard file in autocommit mode with WAL."""

    def connect() -> sqlite3.Connection:
        conn = sqlite3.connect(
            str(path), isolation_level=None, check_same_thread=False, timeout=SQLITE_BUSY_TIMEOUT_S
        )
        # WAL lets readers run beside the one writer; synchronous stays FULL so
        # a commit that returned survives power loss.
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        return conn

    return connect


class Engines:
    """One pool per host (per shard file for SQLite), created lazily, shared by threads."""

    def __init__(self, config: StoreConfig) -> None:
        self._config = config
        self._lock = threading.Lock()
        self._pools: dict[tuple[str, int], ConnectionPool] = {}
        self._handles: dict[tuple[str, int], ShardHandle] = {}
        self._dialects: dict[str, SqlDialect] = {}
        for name, url in config.hosts.items():
            backend = url.get_backend_name()
            self._dialects[name] = (
                SQLiteDialect()
                if backend == "sqlite"
                else PostgresDialect()
                if backend == "postgresql"
                else MySQLDialect()
            )

    def dialect(self, host: str) -> SqlDialect:
        """The dialect of ``host``."""
        return self._dialects[host]

    def shard(self, shard: int, host: str) -> ShardHandle:
        """A handle on shard ``shard`` as held by ``host``."""
        handle = self._handles.get((host, shard))
        if handle is None:
            handle = self._make_handle(shard, host)
        return handle

    def _make_handle(self, shard: int, host: str) -> ShardHandle:
        dialect = self._dialects[host]
        with self._lock:
            # Server hosts share one pool across shards: key it on shard -1.
            key = (host, shard if dialect.name == "sqlite" else -1)
            pool = self._pools.get(key)
            if pool is None:
                pool = self._make_pool(host, shard, dialect)
                self._pools[key] = pool
            handle = self._handles[(host, shard)] = ShardHandle(shard, host, pool, dialect)
            return handle

    def _make_pool(self, host: str, shard: int, dialect: SqlDialect) -> ConnectionPool:
        c = self._config
        url = c.hosts[host]
        size = c.pool_size
        wait = c.pool_timeout_s
        if dialect.name != "sqlite":
            open_one = (postgres_connector if dialect.name == "postgresql" else mysql_connector)(
                url, connect_timeout_s=c.connect_timeout_s, query_timeout_s=c.query_timeout_s
            )
            return ConnectionPool(open_one, name=host, max_open=2 * size, max_idle=size, timeout_s=wait)
        folder = Path(str(url.database))
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{database_name(shard)}.sqlite3"
        pool = ConnectionPool(
            sqlite_connector(path), name=f"{host}/{path.name}", max_open=2 * size, max_idle=size
        )
        conn, born = pool.checkout()
        try:
            for stmt in shard_ddl(
                "sqlite", shard, self._config.types.values(), self._config.relations.values()
            ):
                conn.execute(stmt)
        except BaseException:
            pool.discard(conn)
            raise
        pool.checkin(conn, born)
        return pool

    def dispose(self) -> None:
        """Close every idle pooled connection and forget the pools."""
        with self._lock:
            for pool in self._pools.values():
                pool.clear()
            self._pools.clear()
            self._handles.clear()
