"""`store move` of PostgreSQL schema shards (``ids: instagram``): logical replication, fence, switch.

The same phases and journal as a MariaDB move (`store.admin.move`), so
``--resume``, ``--abort``, ``--cleanup`` and ``--status`` work alike:

1. plan: the schemas, tables, rows and bytes that will move (``--dry-run``
   stops here). Refused: a source without ``wal_level = logical``, two host
   names of one server, schemas missing on the source, a tombstone or an
   archive of an earlier move there, tables of these shards on the target,
   a subscription, publication or slot a killed move left behind, and
   objects a move would not carry (views, other functions, triggers, tables
   without a primary key).
2. copy: the schemas' DDL (``pg_dump --schema-only``: tables, indexes,
   ``next_id()`` and its counter) is loaded into the target; the source
   publishes the schemas' tables (``FOR TABLES IN SCHEMA`` from PostgreSQL
   15, a table list before) and makes the move's logical slot with an
   exported snapshot; ``pg_dump --data-only --snapshot`` copies the rows as
   of that snapshot while the application writes, and the target subscribes
   to the slot (``copy_data = false``): it streams every change after it.
3. catch up: the slot has confirmed the source's WAL position. Then,
   still unfenced, both sides hash every row in snapshots at one WAL
   position (`store.admin.move.postgres_verify`): what differs is what
   changed between the snapshots, or is wrong on the target, and is left
   for the fence to compare row by row; the target catches up once more.
4. fence: one source transaction takes ``LOCK TABLE ... IN EXCLUSIVE MODE``
   on every moving table (writers wait, readers do not, other shards are
   untouched), reads ``pg_current_wal_lsn()`` and waits until the slot has
   confirmed it.
5. verify, under the lock: each table's row count and newest key, and the
   rows that differed before the fence, on both sides (without a
   comparison before the fence: row counts and a hash of every row); a
   mismatch releases the lock and stops with the journal kept.
6. switch: the subscription is disabled; the counter of each schema moves
   to the target (``setval`` to the source's value plus `ID_MARGIN`, under
   the advisory locks ``next_id()`` takes, so the target never hands out an
   ID the source did); then, in the same source transaction, the tables and
   ``next_id()`` go into the archive schema ``moved_shardNNNN`` and each
   schema becomes a tombstone: views of the old tables' names and columns
   whose every read and write raises SQLSTATE `TOMBSTONE_SQLSTATE` naming the
   new host and map version, a ``next_id()`` that does the same, and the
   marker table ``store_tombstone``. The transaction commits (writers that
   waited re-resolve the names, find the views and are refused: the store
   reloads its map and retries on the target), the new map is written
   (version + 1), the subscription and its slot are dropped.
7. cleanup (``--cleanup``, later): drop the archive schemas; tombstones stay.

A crash before the source transaction commits leaves the source serving
(the lock and the half-made switch die with the session); resuming enables
the subscription again and fences once more. A crash after it leaves the
source refusing and the map to write: resuming writes it. Abort drops the
subscription, its slots, the publication and the target copy, and undoes a
committed switch whose map was never written. The target must be able to
connect to the source as the configured user (with its TLS settings).
"""

from __future__ import annotations

import logging
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any

import psycopg
from sqlalchemy.engine import URL

from store.admin.move.engine import POSTGRES, MoveContext
from store.admin.move.postgres_checks import _QUERY_TIMEOUT_S, _lit, _name, _q
from store.admin.move.postgres_verify import PostgresVerify, Suspects
from store.admin.ownership import SHARD_LOCK_TIMEOUT_S
from store.backends import backend_for
from store.backends.postgres.admin import PG_LOCK_BASE, TOMBSTONE_SQLSTATE
from store.backends.postgres.dialect import PostgresBackend
from store.backends.postgres.driver import postgres_connector
from store.exceptions import MoveError
from store.naming import TOMBSTONE_TABLE, tombstone_message
from store.tls import postgres_tls

if TYPE_CHECKING:
    from store.admin.move.journal import Journal, MovePlan

__all__ = ["ID_MARGIN", "PostgresEngine"]

log = logging.getLogger("store.admin.move")

_PG = PostgresBackend()
#: How far past the source's counter the target's starts (units of next_id(): 1024 per millisecond).
ID_MARGIN = 1024 * 1000
CATCH_UP_TIMEOUT_S = 120
FENCE_WAIT_TIMEOUT_S = 30
#: A fence that deadlocks with a writer (or waits longer than this for its locks) is tried again.
LOCK_WAIT_TIMEOUT_S = 10
FENCE_ATTEMPTS = 5
POLL_S = 0.01
#: Before the fence, the target catches up again until a round takes under this (at most LEVEL_ROUNDS).
LEVEL_BEFORE_FENCE_S = 0.05
LEVEL_ROUNDS = 5
_RETRY_LOCK = frozenset({"40P01", "55P03"})  # deadlock detected, lock not available


class PostgresEngine(PostgresVerify):
    """The steps of a move of PostgreSQL schema shards (`store.admin.move.engine.MoveEngine`)."""

    kind = POSTGRES

    def __init__(self, move: MoveContext) -> None:
        self.move = move
        #: What `verify_before_fence` left for the fence to compare (None: everything).
        self._suspected: Suspects | None = None

    # -- helpers ---------------------------------------------------------------

    @property
    def _pg_backend(self) -> PostgresBackend:
        """PostgreSQL, naming the store's namespace."""
        backend = _PG.named(self.move.names)
        assert isinstance(backend, PostgresBackend)
        return backend

    def _url(self, host: str) -> URL:
        url = self.move.store.config.hosts.get(host)
        if url is None:
            raise MoveError(f"host {host!r} is not under hosts in the config")
        if backend_for(url).move_kind != self.kind:
            raise MoveError(
                f"host {host!r} is not PostgreSQL: PostgreSQL schema shards move to another PostgreSQL host"
            )
        return url

    def _connect(self, host: str, *, timeout_s: float = 60.0) -> Any:
        return postgres_connector(self._url(host), query_timeout_s=timeout_s)()

    @contextmanager
    def _pg(self, host: str, *, timeout_s: float = 60.0) -> Iterator[Any]:
        conn = self._connect(host, timeout_s=timeout_s)
        try:
            yield conn
        finally:
            conn.close()

    def _conninfo(self, host: str, *, for_replica: bool = False) -> str:
        """A libpq connection string for ``host`` (as its config names it, TLS settings included).

        ``for_replica``: the string another server (a subscription) connects with, to the host's
        ``replication_host`` where one is set.
        """
        url = self._url(host)
        address = (
            self.move.store.config.replication_address(host, 5432)
            if for_replica
            else (url.host or "127.0.0.1", url.port or 5432)
        )
        parts = {
            "host": address[0],
            "port": str(address[1]),
            "user": url.username or "postgres",
            "dbname": str(url.database),
            **postgres_tls(url),
        }
        if url.password:
            parts["password"] = str(url.password)

        def quote(v: str) -> str:
            return "'" + v.replace("\\", "\\\\").replace("'", "\\'") + "'"

        return " ".join(f"{k}={quote(v)}" for k, v in parts.items())

    def _tables(self, host: str, databases: list[str]) -> list[tuple[str, str, int, int]]:
        """(schema, table, live rows, bytes) of every base table in ``databases`` (schemas) on ``host``."""
        with self._pg(host) as conn:
            rows = conn.execute(
                "SELECT n.nspname, c.relname, coalesce(s.n_live_tup, 0), pg_total_relation_size(c.oid) "
                "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid "
                "WHERE n.nspname = ANY(%s) AND c.relkind IN ('r', 'p') ORDER BY 1, 2",
                (databases,),
            ).fetchall()
        return [(str(r[0]), str(r[1]), int(r[2]), int(r[3])) for r in rows]

    # -- plan ------------------------------------------------------------------

    def check_hosts(self, source: str, to: str, slave: str | None) -> None:
        """`MoveError` unless the hosts are PostgreSQL hosts of the config and two servers."""
        self._url(source)
        self._url(to)
        if slave is not None:
            self._url(slave)
        if self._server_of(source) == self._server_of(to):
            raise MoveError(
                f"{source} and {to} are the same server ({self._server_of(to)}): a move copies shards "
                "between two servers"
            )

    def survey(self, plan: MovePlan, map_version: int) -> None:
        """`MoveError` for what the move could not finish; then measure the moving tables."""
        self._refuse_pg(plan, map_version)
        plan.tables = self._tables(plan.source, plan.databases())

    # -- run -------------------------------------------------------------------

    def check_source(self, source: str) -> None:
        """Refuse a source without ``wal_level=logical``."""
        self._check_source_wal(source)

    def units(self, low: int, high: int) -> list[str]:
        """What is copied, one per shard: the shard schemas."""
        return [self.move.names.schema_name(s) for s in range(low, high + 1)]

    # -- progress --------------------------------------------------------------

    def sampler(self, target: str) -> Any:
        """A connection to the target for the progress sampler."""
        return postgres_connector(self._url(target), query_timeout_s=5)()

    def sample(self, conn: Any, step: str, low: int, high: int) -> dict[str, Any]:
        """The rows inserted on the target while the copy loads, the subscription's lag after."""
        if step in ("load", "dump"):
            row = conn.execute(
                "SELECT coalesce(sum(n_tup_ins), 0) FROM pg_stat_user_tables WHERE schemaname = ANY(%s)",
                (self.units(low, high),),
            ).fetchone()
            return {"rows_copied": int(row[0])}
        if step == "catch_up":
            row = conn.execute(
                "SELECT extract(epoch FROM now() - max(latest_end_time)) FROM pg_stat_subscription "
                "WHERE subname = %s",
                (_name(low, high, self.move.names),),
            ).fetchone()
            return {"lag_s": None if row is None or row[0] is None else max(0.0, float(row[0]))}
        return {}

    # -- copy ------------------------------------------------------------------

    def copy(self, j: Journal, schemas: list[str]) -> None:
        """Schemas, then the rows as of the new slot's snapshot, then a subscription that streams from it.

        The slot is made with an exported snapshot (a replication connection
        held open meanwhile); ``pg_dump --snapshot`` copies exactly what the
        slot will not replay, and the subscription starts at the slot.
        """
        t0 = time.monotonic()
        self.move.say(f"copy: {len(schemas)} schema(s) from {j.source} to {j.target} by logical replication")
        self.move.step(phase="copy", step="dump")
        with suppress(Exception):  # only for the progress bar
            measured = self._tables(j.source, schemas)
            self.move.step(rows_total=sum(t[2] for t in measured), bytes_total=sum(t[3] for t in measured))
        self._drop_replication(j)
        self._drop_target_copy(j, schemas)
        self._dump_load(j, schemas, ["--schema-only"])
        name = _name(j.low, j.high, self.move.names)
        with self._pg(j.source) as conn:
            if self._server_version(j.source) >= 150000:
                what = "TABLES IN SCHEMA " + ", ".join(_q(s) for s in schemas)
            else:
                what = "TABLE " + ", ".join(
                    f"{_q(s)}.{_q(t)}" for s, t, _r, _b in self._tables(j.source, schemas)
                )
            conn.execute(f"CREATE PUBLICATION {_q(name)} FOR {what}")  # before the slot: it decodes by it
        slot: Any = psycopg.connect(self._conninfo(j.source) + " replication=database", autocommit=True)
        try:
            made = slot.execute(f"CREATE_REPLICATION_SLOT {name} LOGICAL pgoutput EXPORT_SNAPSHOT").fetchone()
            self.move.step(step="load")
            copied = self._dump_load(j, schemas, ["--data-only", f"--snapshot={made[2]}"])
        finally:
            slot.close()
        j.gtid = str(made[1])  # where the stream starts (the status shows it)
        j.timings["copy_bytes"] = copied
        with self._pg(j.target) as conn:
            source = self._conninfo(j.source, for_replica=True)  # the target connects with it
            conn.execute(
                f"CREATE SUBSCRIPTION {_q(name)} CONNECTION {_lit(source)} "
                f"PUBLICATION {_q(name)} "
                f"WITH (copy_data = false, create_slot = false, slot_name = {_lit(name)})"
            )
        j.replicating = True
        self.move.say(f"copy: {copied / 1e6:.1f} MB copied to {j.target}; streaming changes from {made[1]}")
        self.move.step(step="loaded", bytes_copied=copied)
        self.move.phase(j, "catch_up", t0, "copy_s")

    def _dump_load(self, j: Journal, schemas: list[str], what: list[str]) -> int:
        """``pg_dump what`` of the schemas on the source, streamed into the target and loaded in one
        transaction; how many bytes went across."""
        src, dst = self._url(j.source), self._url(j.target)
        with tempfile.TemporaryFile() as dump_err, tempfile.TemporaryFile() as load_err:
            dump = subprocess.Popen(
                ["pg_dump", *what, "--no-owner", "--no-privileges", "--no-publications", "--no-subscriptions",
                 *[f"--schema={s}" for s in schemas], "--dbname", self._conninfo(j.source)],
                stdout=subprocess.PIPE,
                stderr=dump_err,
                env={**os.environ, "PGPASSWORD": src.password or ""},
            )  # fmt: skip
            load = subprocess.Popen(
                ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "--single-transaction",
                 "-d", self._conninfo(j.target)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=load_err,
                env={**os.environ, "PGPASSWORD": dst.password or ""},
            )  # fmt: skip
            assert dump.stdout is not None
            assert load.stdin is not None
            copied, broken = 0, False
            try:
                while chunk := dump.stdout.read(1 << 20):
                    copied += len(chunk)
                    load.stdin.write(chunk)
            except BrokenPipeError:  # psql stopped at an error: told below
                broken = True
            dump.stdout.close()  # pg_dump stops too if psql did
            dumped = dump.wait()
            if dumped != 0 and not broken:
                load.kill()  # no part of a failed dump is committed
            with suppress(BrokenPipeError):
                load.stdin.close()
            if load.wait() != 0 and (broken or dumped == 0):
                load_err.seek(0)
                raise MoveError(
                    f"loading the schemas into {j.target} failed: "
                    f"{load_err.read().decode(errors='replace').strip()[:500]}"
                )
            if dumped != 0:
                dump_err.seek(0)
                raise MoveError(
                    f"pg_dump of {j.source} failed: {dump_err.read().decode(errors='replace')[:500]}"
                )
        return copied

    def _subscription(self, j: Journal) -> tuple[int, bool] | None:
        """(oid, enabled) of the move's subscription on the target, or None."""
        with self._pg(j.target) as conn:
            row = conn.execute(
                "SELECT s.oid, s.subenabled FROM pg_subscription s JOIN pg_database d ON d.oid = s.subdbid "
                "WHERE s.subname = %s AND d.datname = current_database()",
                (_name(j.low, j.high, self.move.names),),
            ).fetchone()
        return None if row is None else (int(row[0]), bool(row[1]))

    # -- catch up --------------------------------------------------------------

    def _ensure_streaming(self, j: Journal, schemas: list[str]) -> bool:
        """Enable the subscription; False if there is none (the copy must run again)."""
        found = self._subscription(j)
        if found is None:
            return False
        if not found[1]:
            with self._pg(j.target) as conn:
                conn.execute(f"ALTER SUBSCRIPTION {_q(_name(j.low, j.high, self.move.names))} ENABLE")
        return True

    def _recopy(self, j: Journal, schemas: list[str]) -> None:
        self.move.say(f"copy: the subscription on {j.target} is gone; copying again")
        j.phase = "copy"
        j.replicating = False
        j.save(self.move.journal_path)
        self.copy(j, schemas)

    def catch_up(self, j: Journal, schemas: list[str]) -> None:
        """Wait until the slot has confirmed the source's WAL position (copying again without one)."""
        t0 = time.monotonic()
        if not self._ensure_streaming(j, schemas):
            self._recopy(j, schemas)
        with self._pg(j.source) as conn:
            lsn = str(conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0])
        self.move.say(f"catch up: {j.target} replicating from {j.source} up to {lsn}")
        self.move.step(phase="catch_up", step="catch_up")
        self._wait_level(j, lsn, CATCH_UP_TIMEOUT_S)
        self.move.step(lag_s=0.0)
        self.move.phase(j, "switch", t0, "catch_up_s")

    def _wait_level(self, j: Journal, lsn: str, timeout_s: float) -> None:
        """Wait until the move's slot on the source has confirmed ``lsn``: the target applied and flushed it.

        The target applies with asynchronous commits and confirms only what
        its WAL holds on disk: a small synchronous commit there flushes them
        all at once, rather than waiting for its WAL writer. An idle source
        sends nothing to confirm: a little WAL there moves it on.
        """
        name = _name(j.low, j.high, self.move.names)
        deadline = time.monotonic() + timeout_s
        nudge = time.monotonic() + 0.5
        with self._pg(j.source) as conn, self._pg(j.target) as there:
            while True:
                row = conn.execute(
                    "SELECT confirmed_flush_lsn >= %s::pg_lsn, active FROM pg_replication_slots "
                    "WHERE slot_name = %s",
                    (lsn, name),
                ).fetchone()
                if row is None:
                    raise MoveError(f"{j.source} has no replication slot {name}: resume, or abort")
                if row[0]:
                    return
                now = time.monotonic()
                if now > deadline:
                    raise MoveError(
                        f"{j.target} did not catch up with {j.source} (position {lsn}) "
                        f"within {timeout_s:.0f} s "
                        f"(slot {'active' if row[1] else 'inactive'}; see {j.target}'s server log); "
                        "resume when it has, or abort"
                    )
                there.execute("SELECT pg_logical_emit_message(true, 'store-move', 'flush')")
                if now > nudge:
                    conn.execute("SELECT pg_logical_emit_message(false, 'store-move', '')")
                    nudge = now + 0.5
                time.sleep(POLL_S)

    # -- fence, verify, switch ---------------------------------------------------

    def _source_state(self, j: Journal, schemas: list[str]) -> str:
        """``live`` (every moving schema still holds its tables) or ``tombstone`` (the switch committed)."""
        with self._pg(j.source) as conn:
            marked = self._pg_backend.tombstones(conn.cursor(), range(j.low, j.high + 1))
        if not marked:
            return "live"
        if len(marked) == len(schemas):
            return "tombstone"
        raise MoveError(
            f"{j.source} holds tombstones of {len(marked)} of the {len(schemas)} moving schemas: "
            "a switch commits them all at once; someone changed them by hand"
        )

    @contextmanager
    def shards_locked(self, j: Journal) -> Iterator[Any]:
        """Hold the moving shards' admin locks on the source (a session of their own)."""
        admin = self._connect(j.source)
        try:
            with self._pg_backend.admin_lock(
                admin.cursor(), range(j.low, j.high + 1), timeout_s=SHARD_LOCK_TIMEOUT_S
            ):
                yield admin
        finally:
            admin.close()

    def serving(self, j: Journal, schemas: list[str], session: Any) -> bool:
        """True while the moving schemas hold their tables (no switch committed on the source)."""
        return self._source_state(j, schemas) == "live"

    def stream(self, j: Journal, schemas: list[str]) -> None:
        """Enable the subscription again (or copy again without one); level again first: under the lock
        only the tail is left."""
        if not self._ensure_streaming(j, schemas):
            self._recopy(j, schemas)
            self.catch_up(j, schemas)
        with self._pg(j.source) as conn:
            lsn = str(conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0])
        self._wait_level(j, lsn, CATCH_UP_TIMEOUT_S)

    def verify_before_fence(self, j: Journal, schemas: list[str]) -> str:
        """Compare both sides on snapshots at one WAL position while the source serves
        (`_compare_snapshots`); that position, or "" if no snapshot could be had (the fence then
        hashes every row, `_verify_pg`)."""
        found = self._compare_snapshots(j, schemas, CATCH_UP_TIMEOUT_S)
        self._suspected = None if found is None else found[1]
        return "" if found is None else found[0]

    def fence_and_switch(self, j: Journal, schemas: list[str], session: Any, verified: str) -> None:
        """`_fence_and_switch`, comparing under the fence only what ``verified`` left (the suspects)."""
        self._fence_and_switch(j, schemas, self._suspected if verified else None)

    def finish_switch(self, j: Journal, schemas: list[str]) -> None:
        """Carry the IDs again (idempotent): a crash may have come between the commit and the map."""
        self._carry_ids(j, schemas, None)

    def leave_tombstones(self, j: Journal, schemas: list[str], session: Any) -> int:
        """Nothing more: the switch's transaction left the tombstones; how many."""
        return len(schemas)

    def forget_replication(self, j: Journal) -> None:
        """Drop the subscription, its slots and the publication."""
        self._drop_replication(j)
        with self._pg(j.source) as conn:
            conn.execute(f"DROP PUBLICATION IF EXISTS {_q(_name(j.low, j.high, self.move.names))}")
        j.replicating = False

    def _table_info(
        self, conn: Any, schemas: list[str]
    ) -> dict[tuple[str, str], tuple[list[tuple[str, str]], list[str]]]:
        """(schema, table) -> (columns with their types, primary key columns) of the moving tables."""
        out: dict[tuple[str, str], tuple[list[tuple[str, str]], list[str]]] = {}
        for sc, t, col, kind, key in conn.execute(
            "SELECT n.nspname, c.relname, a.attname, format_type(a.atttypid, a.atttypmod), "
            "a.attnum = ANY(i.indkey) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped "
            "LEFT JOIN pg_index i ON i.indrelid = c.oid AND i.indisprimary "
            "WHERE n.nspname = ANY(%s) AND c.relkind IN ('r', 'p') ORDER BY 1, 2, a.attnum",
            (schemas,),
        ).fetchall():
            cols, keys = out.setdefault((str(sc), str(t)), ([], []))
            cols.append((str(col), str(kind)))
            if key:
                keys.append(str(col))
        return out

    def _fence_and_switch(self, j: Journal, schemas: list[str], suspects: Suspects | None = None) -> None:
        """Fence the moving tables, wait for the target, verify, carry the IDs, archive and tombstone.

        With ``suspects`` (the rows were compared before the fence), the
        target catches up again first, and the check under the lock is
        `_verify_fenced_pg`; without, every row is hashed (`_verify_pg`).
        """
        if suspects is not None:
            self._level_before_fence(j)
        for attempt in range(1, FENCE_ATTEMPTS + 1):
            fence = self._connect(j.source, timeout_s=_QUERY_TIMEOUT_S)
            try:
                self._fenced(j, fence, schemas, suspects)
                return
            except Exception as exc:
                if getattr(exc, "sqlstate", None) not in _RETRY_LOCK or attempt == FENCE_ATTEMPTS:
                    raise
                self.move.say(f"fence: could not lock every table ({exc}); trying again")
            finally:
                with suppress(Exception):
                    fence.close()  # rolls back an unfinished switch and releases the locks
                self.move.step(fence_ended=time.time())

    def _level_before_fence(self, j: Journal) -> None:
        """Let the target catch up again, until a round takes under `LEVEL_BEFORE_FENCE_S`: little is
        left for the fence to wait for (the comparison before it took a while)."""
        for _ in range(LEVEL_ROUNDS):
            with self._pg(j.source) as conn:
                lsn = str(conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0])
            t0 = time.monotonic()
            self._wait_level(j, lsn, CATCH_UP_TIMEOUT_S)
            if time.monotonic() - t0 < LEVEL_BEFORE_FENCE_S:
                break

    def _fenced(self, j: Journal, fence: Any, schemas: list[str], suspects: Suspects | None) -> None:
        if suspects is not None:  # the check's sessions, opened before the lock
            sessions = self._sessions(j)
            try:
                self._fenced_with(j, fence, schemas, suspects, sessions)
            finally:
                for c in sessions[0] + sessions[1]:
                    with suppress(Exception):
                        c.close()
        else:
            self._fenced_with(j, fence, schemas, None, None)

    def _fenced_with(
        self,
        j: Journal,
        fence: Any,
        schemas: list[str],
        suspects: Suspects | None,
        sessions: tuple[list[Any], list[Any]] | None,
    ) -> None:
        info = self._table_info(fence, schemas)
        tables = sorted(info)
        names = ", ".join(f"{_q(s)}.{_q(t)}" for s, t in tables)
        version = self.move.store.map_source.load()
        assert version is not None
        new_version = version.version + 1
        fence.execute("BEGIN")
        fence.execute(f"SET LOCAL lock_timeout = '{LOCK_WAIT_TIMEOUT_S}s'")
        t0 = time.monotonic()
        fence.execute(f"LOCK TABLE {names} IN EXCLUSIVE MODE")
        self.move.step(phase="switch", step="fence", fence_started=time.time(), fence_ended=None)
        marks = {"lock_s": time.monotonic()}
        lsn = str(fence.execute("SELECT pg_current_wal_lsn()").fetchone()[0])
        self.move.say(f"fence: {len(tables)} tables locked on {j.source}; {j.target} to reach {lsn}")
        self._wait_level(j, lsn, FENCE_WAIT_TIMEOUT_S)
        marks["level_s"] = time.monotonic()
        self.move.step(step="verify", lag_s=0.0)
        if suspects is None or sessions is None:
            self._verify_pg(j, info)
        else:
            self._verify_fenced_pg(j, info, suspects, sessions)
        marks["verify_s"] = time.monotonic()
        self._disable_subscription(j)
        for shard in range(j.low, j.high + 1):  # next_id() waits on these: no ID leaves the source now
            fence.execute("SELECT pg_advisory_xact_lock(%s)", (PG_LOCK_BASE + shard,))
        self._carry_ids(j, schemas, fence)
        marks["ids_s"] = time.monotonic()
        self.move.step(step="switch")
        fence.execute(self._tombstone_sql(j, schemas, info, new_version))
        fence.execute(f"DROP PUBLICATION IF EXISTS {_q(_name(j.low, j.high, self.move.names))}")
        fence.execute("COMMIT")
        marks["archive_s"] = time.monotonic()
        self.move.step(fence_ended=time.time())
        end = time.monotonic()
        j.timings["fenced_s"] = round(end - t0, 3)
        last = t0
        for mark, at in marks.items():
            j.timings[f"fence_{mark}"] = round(at - last, 3)
            last = at
        j.save(self.move.journal_path)

    def _disable_subscription(self, j: Journal) -> None:
        """Stop the apply worker (the switch's DDL must not reach the target); wait until it has."""
        name = _name(j.low, j.high, self.move.names)
        with self._pg(j.target) as conn:
            conn.execute(f"ALTER SUBSCRIPTION {_q(name)} DISABLE")
            deadline = time.monotonic() + 30
            while conn.execute(
                "SELECT 1 FROM pg_stat_subscription WHERE subname = %s AND pid IS NOT NULL", (name,)
            ).fetchone():
                if time.monotonic() > deadline:
                    raise MoveError(f"the subscription {name} on {j.target} did not stop within 30 s")
                time.sleep(POLL_S)

    def _carry_ids(self, j: Journal, schemas: list[str], fence: Any) -> None:
        """Set each target schema's counter past the source's (never back): the target repeats no ID."""
        select = " UNION ALL ".join(f"SELECT {_lit(s)}, last_value FROM {_q(s)}.id_seq" for s in schemas)
        if fence is not None:
            found = fence.execute(select).fetchall()
        else:
            with self._pg(j.source) as conn:
                found = conn.execute(select).fetchall()
        with self._pg(j.target) as conn:
            conn.execute("BEGIN")
            for s, last in found:
                seq = _lit(f"{_q(str(s))}.id_seq")
                conn.execute(
                    f"SELECT setval({seq}, greatest((SELECT last_value FROM {_q(str(s))}.id_seq), %s))",
                    (int(last) + ID_MARGIN,),
                )
            conn.execute("COMMIT")

    def _tombstone_sql(
        self,
        j: Journal,
        schemas: list[str],
        info: dict[tuple[str, str], tuple[list[tuple[str, str]], list[str]]],
        version: int,
    ) -> str:
        """The statements that archive the moving tables and next_id() and leave the tombstones."""
        out: list[str] = []
        for shard in range(j.low, j.high + 1):
            sc = self.move.names.schema_name(shard)
            q, a = _q(sc), _q(self.move.names.archive(sc))
            message = tombstone_message(shard, j.target, version)
            out += [
                f"CREATE SCHEMA IF NOT EXISTS {a}",
                f"ALTER FUNCTION {q}.next_id() SET SCHEMA {a}",
                f"CREATE TABLE {q}.{_q(TOMBSTONE_TABLE)} (shard integer PRIMARY KEY, moved_to text NOT NULL, "
                "map_version bigint NOT NULL, moved_at timestamptz NOT NULL DEFAULT now())",
                f"INSERT INTO {q}.{_q(TOMBSTONE_TABLE)} (shard, moved_to, map_version) "
                f"VALUES ({shard}, {_lit(j.target)}, {version})",
                f"CREATE FUNCTION {q}.store_moved() RETURNS bigint LANGUAGE plpgsql VOLATILE AS "
                f"$f$BEGIN RAISE EXCEPTION USING ERRCODE = '{TOMBSTONE_SQLSTATE}', "
                f"MESSAGE = {_lit(message)}, "
                "HINT = 'the shard moved: reload the shard map and retry on its new host'; END$f$",
                f"CREATE FUNCTION {q}.store_refuse() RETURNS trigger LANGUAGE plpgsql AS "
                f"$f$BEGIN PERFORM {q}.store_moved(); RETURN NULL; END$f$",
                f"CREATE FUNCTION {q}.next_id() RETURNS bigint LANGUAGE plpgsql VOLATILE AS "
                f"$f$BEGIN RETURN {q}.store_moved(); END$f$",
            ]
            for (s, t), (cols, _keys) in sorted(info.items()):
                if s != sc:
                    continue
                out.append(f"ALTER TABLE {q}.{_q(t)} SET SCHEMA {a}")
                # The subquery is never flattened (OFFSET 0) and its volatile column is computed
                # whenever a row is looked at: a read raises. Each column is a different expression:
                # were they equal, the planner would take ``from_id = 1 AND to_id = 2`` for 1 = 2
                # and skip the scan (a read of no rows, an UPDATE or DELETE of none, no error).
                columns = ", ".join(
                    f"CASE WHEN r.x = {n} THEN NULL::{kind} END AS {_q(col)}"
                    for n, (col, kind) in enumerate(cols)
                )
                out.append(
                    f"CREATE VIEW {q}.{_q(t)} AS SELECT {columns} "
                    f"FROM (SELECT {q}.store_moved() AS x OFFSET 0) r"
                )
                # Every write raises before it looks for rows (the statement trigger), whatever
                # its WHERE: a write the planner finds no row for is refused too, never a no-op.
                out.append(
                    f"CREATE TRIGGER store_refuse INSTEAD OF INSERT OR UPDATE OR DELETE ON {q}.{_q(t)} "
                    f"FOR EACH ROW EXECUTE FUNCTION {q}.store_refuse()"
                )
                out.append(
                    f"CREATE TRIGGER store_refuse_all BEFORE INSERT OR UPDATE OR DELETE ON {q}.{_q(t)} "
                    f"FOR EACH STATEMENT EXECUTE FUNCTION {q}.store_refuse()"
                )
        return ";\n".join(out)

    def _restore_source(self, j: Journal, dbs: list[str]) -> None:
        """Undo a committed switch whose map was never written: the tables and next_id() come back.

        One transaction: the tombstone goes and the archived tables return
        under their names at once. Idempotent (nothing to do without an archive).
        """
        schemas = dbs
        with self._pg(j.source) as conn:
            archived = {str(r[0]) for r in conn.execute(
                "SELECT nspname FROM pg_namespace WHERE nspname = ANY(%s)",
                ([self.move.names.archive(s) for s in schemas],),
            ).fetchall()}  # fmt: skip
            if not archived:
                return
            tables = self._tables(j.source, sorted(archived))
            conn.execute("BEGIN")
            for sc in schemas:
                a = self.move.names.archive(sc)
                if a not in archived:
                    continue
                q = _q(sc)
                for _a, t, _r, _b in (x for x in tables if x[0] == a):
                    conn.execute(f"DROP VIEW IF EXISTS {q}.{_q(t)}")
                    conn.execute(f"ALTER TABLE {_q(a)}.{_q(t)} SET SCHEMA {q}")
                conn.execute(f"DROP TABLE IF EXISTS {q}.{_q(TOMBSTONE_TABLE)}")
                conn.execute(f"DROP FUNCTION IF EXISTS {q}.store_refuse()")
                has_fn = conn.execute(
                    "SELECT 1 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                    "WHERE n.nspname = %s AND p.proname = 'next_id'",
                    (a,),
                ).fetchone()
                if has_fn:
                    conn.execute(f"DROP FUNCTION IF EXISTS {q}.next_id()")
                    conn.execute(f"ALTER FUNCTION {_q(a)}.next_id() SET SCHEMA {q}")
                conn.execute(f"DROP FUNCTION IF EXISTS {q}.store_moved()")
                conn.execute(f"DROP SCHEMA {_q(a)}")
            conn.execute("COMMIT")

    # -- replication objects ---------------------------------------------------

    def _drop_replication(self, j: Journal) -> None:
        """Drop the move's subscription on the target and every slot it left on the source (idempotent)."""
        name = _name(j.low, j.high, self.move.names)
        found = self._subscription(j)
        if found is not None:
            with self._pg(j.target) as conn:
                with suppress(Exception):
                    conn.execute(f"ALTER SUBSCRIPTION {_q(name)} DISABLE")
                conn.execute(f"ALTER SUBSCRIPTION {_q(name)} SET (slot_name = NONE)")
                conn.execute(f"DROP SUBSCRIPTION {_q(name)}")
        sync = None if found is None else f"pg\\_{found[0]}\\_sync\\_%"
        deadline = time.monotonic() + 30
        with self._pg(j.source) as conn:
            while True:
                slots = conn.execute(
                    "SELECT slot_name, active_pid FROM pg_replication_slots WHERE slot_name = %s "
                    "OR (%s::text IS NOT NULL AND slot_name LIKE %s)",
                    (name, sync, sync),
                ).fetchall()
                if not slots:
                    return
                for slot, pid in slots:
                    try:
                        if pid is not None:
                            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
                        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                    except Exception:
                        if time.monotonic() > deadline:
                            raise
                time.sleep(0.05)

    def _drop_target_copy(self, j: Journal, dbs: list[str]) -> None:
        """Drop the target's copies of the moving schemas (never while the map gives them to it)."""
        if self.move.map_switched(j):
            raise MoveError(f"the map gives shards {j.low}-{j.high} to {j.target}: its copy stays")
        with self._pg(j.target) as conn:
            for sc in dbs:
                conn.execute(f"DROP SCHEMA IF EXISTS {_q(sc)} CASCADE")
        with self._pg(j.source) as conn:
            conn.execute(f"DROP PUBLICATION IF EXISTS {_q(_name(j.low, j.high, self.move.names))}")

    # -- abort and cleanup -------------------------------------------------------

    def abort(self, j: Journal, schemas: list[str]) -> None:
        """Drop the replication objects, undo a committed switch, drop the target's copy."""
        self._drop_replication(j)
        self._restore_source(j, schemas)
        self._drop_target_copy(j, schemas)
        j.replicating = False

    def cleanup(self, j: Journal, schemas: list[str]) -> list[str]:
        """Drop the archive schemas on the source, holding the shards' admin locks."""
        dropped = []
        with (
            self._pg(j.source) as conn,
            self._pg_backend.admin_lock(
                conn.cursor(), range(j.low, j.high + 1), timeout_s=SHARD_LOCK_TIMEOUT_S
            ),
        ):
            for sc in schemas:
                conn.execute(f"DROP SCHEMA IF EXISTS {_q(self.move.names.archive(sc))} CASCADE")
                dropped.append(self.move.names.archive(sc))
        return dropped
