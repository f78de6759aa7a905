"""What each commit changed, read by the leader: the invalidation log table, or the server's ROW binlog.

Both hand the keys to delete to ``apply(texts)`` as invalidation log texts
(`store.cache.follower.log_entries`), so the keys are named and deleted
exactly as the per-process follower names and deletes them. ``apply``
raises if a cache did not take every delete; the source then keeps the
keys and does not move its heartbeat on.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Collection, Container, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from store.cache.follower import VERSION_MARK, Follower, LogSource, log_entries
from store.cache.heartbeat import Heartbeat
from store.cache.leases import wall_ms
from store.naming import DEFAULT_NAMES, Names

__all__ = ["BinlogKeys", "BinlogSource", "LogTableSource", "Position"]

log = logging.getLogger(__name__)

#: The table, in the config's log database (``store_log``, ``NAME_store_log``), where the binlog
#: source saves its position on the server (made if missing).
POSITION_TABLE = "invalidator"


class LogTableSource:
    """The server's ``store_log.cache_log``, read by the leader only, on its lock connection."""

    def __init__(
        self,
        name: str,
        table: str,
        apply: Callable[[list[str]], None],
        *,
        step_sql: str | None = "SELECT @@auto_increment_increment",
        clean_sql: str | None = None,
    ) -> None:
        self.name = name
        self._table = table
        self._apply = apply
        #: The server's id step query and its DELETE of old rows (`Backend.change_log_step_sql`,
        #: `Backend.change_log_clean`).
        self._step_sql = step_sql
        self._clean_sql = clean_sql
        self._conn: Any = None
        self._follower: Follower | None = None

    def start(self, conn: Any) -> None:
        """Lead on ``conn`` (the lock's connection): start near the log's end, as followers do."""
        self._conn = conn

        @contextlib.contextmanager
        def connect() -> Iterator[Any]:
            yield self._conn

        def apply(objects: list[str], lists: list[str]) -> None:
            self._apply([log_entries(objects=objects, lists=lists)])

        source = LogSource(
            self.name, connect, self._table, step_sql=self._step_sql, clean_sql=self._clean_sql
        )
        self._follower = Follower(lambda: [source], apply)

    def tick(self) -> Heartbeat | None:
        """One pass over the new rows; what the source vouches for now (None: nothing yet)."""
        assert self._follower is not None
        self._follower.run_pass()
        covered = self._follower.covered_ms()
        return Heartbeat(covered, self._follower.started_ms()) if covered else None

    def position(self) -> str:
        """The last log id read."""
        return (
            ""
            if self._follower is None or not self._follower.sources
            else str(self._follower.sources[0].last)
        )

    def stop(self) -> None:
        """Stop leading (the caller closes the connection)."""
        self._follower = None


class _ShardDatabases:
    """The names of the config's shard databases (or schemas), as a container a reader can test."""

    def __init__(self, shard_of: Callable[[str], int | None]) -> None:
        self._shard_of = shard_of

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._shard_of(name) is not None


class BinlogKeys:
    """The cache keys a binlog transaction's row changes invalidate, named as writers log them.

    ``tables`` (the object tables, the relations and ``relation_counts``)
    and `schemas` (the shard databases) are what the reader parses: the
    rows of any other table or database (another app's, or a table that
    names no cache key) are skipped before they are decoded.
    """

    def __init__(
        self,
        *,
        object_key: Callable[[str, int, int], str | None],
        list_key: Callable[[str, int], str | None],
        names: Names = DEFAULT_NAMES,
        tables: Collection[str] | None = None,
        schemas: bool = False,
    ) -> None:
        #: A shard database's name (``db00042``, ``NAME_db00042`` in a namespace) to its shard; with
        #: ``schemas``, a PostgreSQL shard schema's (``shard0042``: `store.invalidate.wal`).
        self._names = names
        self._shard_of = names.schema_shard if schemas else names.database_shard
        #: The only databases (schemas) whose rows name keys.
        self.schemas: Container[str] = _ShardDatabases(self._shard_of)
        #: The only tables whose rows name keys (None: every table is read).
        self.tables = None if tables is None else frozenset(tables)
        #: (table, shard, first column) -> the object's cache key (None: not an object table).
        self._object_key = object_key
        #: (relation, from_id) -> the list's cache key (None: not a relation).
        self._list_key = list_key

    def named_by_schemas(self) -> BinlogKeys:
        """The same keys, for rows named by PostgreSQL shard schema (`store.invalidate.wal`)."""
        return BinlogKeys(
            object_key=self._object_key,
            list_key=self._list_key,
            names=self._names,
            tables=self.tables,
            schemas=True,
        )

    def entries(self, changes: list[tuple[str, str, list[Any]]]) -> str:
        """The log text of one transaction's rows: (schema, table, row values in column order)."""
        objects: list[str] = []
        versions: dict[str, int] = {}
        dropped: set[str] = set()
        for schema, table, values in changes:
            shard = self._shard_of(schema)
            if shard is None or not values:
                continue
            if table == "relation_counts":
                key = self._list_key(str(_text(values[0])), int(values[1]))
                if key is not None:
                    versions[key] = max(versions.get(key, 0), int(values[3]) if len(values) > 3 else 0)
                continue
            key = self._list_key(table, int(values[0]))
            if key is not None:
                dropped.add(key)
                continue
            okey = self._object_key(table, shard, int(values[0]))
            if okey is not None:
                objects.append(okey)
        lists = [
            f"{k}{VERSION_MARK}{versions[k]}" if versions.get(k) else k
            for k in sorted(dropped | set(versions))
        ]
        return log_entries(objects=sorted(set(objects)), lists=lists)


def _pymysql_connect(**settings: Any) -> Any:
    """pymysql.connect, for mysql-replication: it names the control connection's schema ``db``,
    which PyMySQL deprecates (a warning at each connect)."""
    import pymysql

    if "db" in settings:
        settings["database"] = settings.pop("db")
    return pymysql.connect(**settings)


class StreamLostError(RuntimeError):
    """The binlog stream's connection was lost: the source steps down and resumes from its saved position."""


def _one_stream_connection() -> Callable[..., Any]:
    """A ``pymysql_wrapper`` that opens the stream's connection once and refuses to open it again.

    On a lost connection mysql-replication reconnects by itself, from the
    position the reader was made with (for MariaDB, ``auto_position``), not
    from where it had got to: the stream would go back to the start of the
    leader's term and read it again, behind the queued transactions, so a
    tick could confirm a re-read transaction and drop a newer one's keys
    with it. Refused, the reconnect fails the stream; the leader steps down
    and starts again from the position it saved after its last confirmed
    tick, which nothing after is missing from.
    """
    opened = 0

    def connect(**settings: Any) -> Any:
        nonlocal opened
        if "db" not in settings and "database" not in settings:  # the control connection names a schema
            opened += 1
            if opened > 1:
                raise StreamLostError("the binlog stream's connection was lost")
        return _pymysql_connect(**settings)

    return connect


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes | bytearray) else str(value)


@dataclass
class Position:
    """Where the binlog source is: the GTID state after the last confirmed transaction, the binlog
    file and offset, and since when it has vouched without a break."""

    gtid: str = ""
    file: str = ""
    pos: int = 0
    since_ms: int = 0

    def encode(self) -> bytes:
        """``gtid file pos since`` (``-`` for an empty GTID state)."""
        return f"{self.gtid or '-'} {self.file or '-'} {self.pos} {self.since_ms}".encode()

    @classmethod
    def decode(cls, value: bytes | str | None) -> Position | None:
        """The position in a saved value; None if there is none."""
        if not value:
            return None
        text = value.decode() if isinstance(value, bytes) else value
        parts = text.split()
        if len(parts) != 4 or not parts[2].isdigit() or not parts[3].isdigit():
            return None
        gtid, file = ("" if p == "-" else p for p in parts[:2])
        return cls(gtid, file, int(parts[2]), int(parts[3]))


@dataclass
class _Pending:
    end: tuple[str, int]
    text: str
    gtid: tuple[int, str] | None


@dataclass
class _Txn:
    gtid: tuple[int, str] | None = None
    changes: list[tuple[str, str, list[Any]]] = field(default_factory=list)


class BinlogSource:
    """The server's ROW binlog, through ``mysql-replication``.

    A thread reads the stream and queues each transaction's keys with the
    position where it ends. Each tick, on the lock's connection: once the
    stream has passed the position ``SHOW MASTER STATUS`` gave at the
    previous tick's time t0, the keys of every transaction up to it are
    deleted (now, after t0: every write acknowledged before t0 had its
    engine commit before t0, so the delete comes after the commit even
    though the binlog is written before it), and the heartbeat's T becomes
    t0. Then the next t0 and position are taken. One query a tick.
    """

    def __init__(
        self,
        name: str,
        settings: Mapping[str, Any],
        keys: BinlogKeys,
        apply: Callable[[list[str]], None],
        *,
        server_id: int,
        load: Callable[[], Position | None],
        save: Callable[[Position, Any], None],
    ) -> None:
        self.name = name
        self._settings = dict(settings)
        self._keys = keys
        self._apply = apply
        self._server_id = server_id
        self._load = load
        self._save = save
        self._conn: Any = None
        self._lock = threading.Lock()
        self._pending: list[_Pending] = []
        self._done: tuple[str, int] = ("", 0)
        self._target: tuple[int, tuple[str, int]] | None = None
        self._stream: Any = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._stopping = threading.Event()
        self._gtids: dict[int, str] = {}
        self.position = Position()
        self.covered_ms = 0
        #: Transactions read, and started-again-from-the-current-position events (binlog purged).
        self.transactions = 0
        self.restarts = 0

    def start(self, conn: Any) -> None:
        """Lead on ``conn``: resume from the saved position, or start from the current one."""
        self._conn = conn
        self._stopping.clear()
        self._error = None
        self._pending, self._target, self.covered_ms = [], None, 0
        saved = self._load()
        cur = conn.cursor()
        try:
            if saved is not None and saved.gtid and self._purged(cur, saved):
                log.warning(
                    "invalidator %s: the binlog no longer holds %s; starting again", self.name, saved.gtid
                )
                self.restarts += 1
                saved = None
            if saved is None or not saved.gtid:
                saved = self._current(cur)
        finally:
            cur.close()
        self.position = saved
        self._gtids = {int(g.split("-")[0]): g for g in saved.gtid.split(",") if g}
        self._done = ("", 0)
        self._thread = threading.Thread(target=self._follow, name=f"store-binlog-{self.name}", daemon=True)
        self._thread.start()

    def _current(self, cur: Any) -> Position:
        """Where to start with nothing saved (or the saved position purged), and since when it vouches.

        Every transaction before the start must have had its engine commit
        before "since". A transaction is in the binlog before its commit is
        visible, so ``@@gtid_binlog_pos`` read at t may name one whose commit
        comes after t: an entry filled after t could miss it, the stream
        (which starts after it) would never delete its keys, and the entry
        would be trusted as filled after "since". A consistent snapshot's
        binlog position (``binlog_snapshot_file`` and ``_position``) matches
        exactly the commits the snapshot sees, all made before it returned.
        """
        cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        try:
            cur.execute("SHOW SESSION STATUS LIKE 'binlog_snapshot_%'")
            status = {_text(k).lower(): _text(v) for k, v in cur.fetchall()}
        finally:
            cur.execute("COMMIT")
        since = wall_ms()
        file, pos = status["binlog_snapshot_file"], int(status["binlog_snapshot_position"])
        cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (file, pos))
        row = cur.fetchone()
        gtid = _text(row[0]) if row is not None and row[0] is not None else ""
        return Position(gtid=gtid, file=file, pos=pos, since_ms=since)

    def _purged(self, cur: Any, saved: Position) -> bool:
        """True if the binlog no longer holds ``saved`` (older than the first file's GTID state)."""
        cur.execute("SHOW BINARY LOGS")
        first = cur.fetchone()
        if first is None:
            return True
        cur.execute("SELECT BINLOG_GTID_POS(%s, 4)", (first[0],))
        start = str(cur.fetchone()[0] or "")
        have = {int(g.split("-")[0]): int(g.split("-")[2]) for g in start.split(",") if g}
        for g in saved.gtid.split(","):
            domain, _server, seq = g.split("-")
            if int(domain) in have and int(seq) < have[int(domain)]:
                return True
        return False

    def _follow(self) -> None:
        from pymysqlreplication import BinLogStreamReader
        from pymysqlreplication.event import (
            HeartbeatLogEvent,
            MariadbGtidEvent,
            QueryEvent,
            RotateEvent,
            XidEvent,
        )
        from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

        try:
            stream = self._stream = BinLogStreamReader(
                connection_settings=self._settings,
                pymysql_wrapper=_one_stream_connection(),
                server_id=self._server_id,
                blocking=True,
                is_mariadb=True,
                auto_position=self.position.gtid,
                freeze_schema=True,
                only_schemas=self._keys.schemas,
                only_tables=self._keys.tables,
                slave_heartbeat=0.25,
                # The server's heartbeats carry its position while the binlog is idle: without
                # them an idle stream never reaches the target and no heartbeat is published.
                only_events=[
                    HeartbeatLogEvent,
                    MariadbGtidEvent,
                    QueryEvent,
                    XidEvent,
                    RotateEvent,
                    WriteRowsEvent,
                    UpdateRowsEvent,
                    DeleteRowsEvent,
                ],
                enable_logging=False,
            )
            txn = _Txn()
            while not self._stopping.is_set():
                event = stream.fetchone()
                if event is None:
                    continue
                ended = False
                if isinstance(event, MariadbGtidEvent):
                    txn = _Txn(gtid=(int(event.domain_id), str(event.gtid)))
                elif isinstance(event, WriteRowsEvent | DeleteRowsEvent):
                    for row in event.rows:
                        txn.changes.append((event.schema, event.table, list(row["values"].values())))
                elif isinstance(event, UpdateRowsEvent):
                    for row in event.rows:
                        txn.changes.append((event.schema, event.table, list(row["after_values"].values())))
                elif isinstance(event, XidEvent):
                    ended = True
                elif isinstance(event, QueryEvent):
                    # BEGIN opens a group; COMMIT (non-transactional tables) or a DDL statement
                    # (a group of its own) ends one.
                    query = _text(event.query).strip().upper()
                    ended = not query.startswith(("BEGIN", "XA"))
                with self._lock:
                    if ended and txn.gtid is not None:
                        end = (str(stream.log_file), int(stream.log_pos))
                        self._pending.append(_Pending(end, self._keys.entries(txn.changes), txn.gtid))
                        self.transactions += 1
                        txn = _Txn()
                    if stream.log_file:
                        self._done = (str(stream.log_file), int(stream.log_pos))
        except BaseException as exc:
            if not self._stopping.is_set():
                self._error = exc
        finally:
            with contextlib.suppress(Exception):
                if self._stream is not None:
                    self._stream.close()

    def tick(self) -> Heartbeat | None:
        """Confirm what the stream has passed, then take the next target; what is vouched for now."""
        if self._error is not None:
            raise RuntimeError(f"binlog stream of {self.name} failed: {self._error}") from self._error
        if self._thread is not None and not self._thread.is_alive():
            raise RuntimeError(f"binlog stream of {self.name} ended")
        target = self._target
        if target is not None:
            with self._lock:
                reached = self._done >= target[1]
                ready = [p for p in self._pending if p.end <= target[1]] if reached else []
            if reached:
                texts = [p.text for p in ready if p.text]
                if texts:
                    self._apply(texts)  # raises if a cache missed a delete: kept, tried again next tick
                with self._lock:
                    del self._pending[: len(ready)]
                for p in ready:
                    if p.gtid is not None:
                        self._gtids[p.gtid[0]] = p.gtid[1]
                self.position = Position(
                    ",".join(self._gtids[d] for d in sorted(self._gtids)),
                    target[1][0],
                    target[1][1],
                    self.position.since_ms,
                )
                self.covered_ms = target[0]
                self._target = target = None
                self._save(self.position, self._conn)
        if target is None:
            t0 = wall_ms()
            cur = self._conn.cursor()
            try:
                cur.execute("SHOW MASTER STATUS")
                row = cur.fetchone()
            finally:
                cur.close()
            if row is None:
                raise RuntimeError(f"host {self.name} keeps no binlog (start it with --log-bin)")
            self._target = (t0, (str(row[0]), int(row[1])))
        return Heartbeat(self.covered_ms, self.position.since_ms) if self.covered_ms else None

    def lag_s(self) -> float:
        """How far the stream is behind the last target taken (0 when it has reached it)."""
        target = self._target
        if target is None or self._done >= target[1]:
            return 0.0
        return max(0.0, (wall_ms() - target[0]) / 1000)

    def stop(self) -> None:
        """Stop reading the stream."""
        self._stopping.set()
        stream = self._stream
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.close()
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None
