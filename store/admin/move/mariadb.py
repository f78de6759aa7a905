"""`store move`: move a range of shards to another MariaDB host without losing a write.

Phases, recorded in a journal file so that a crash or Ctrl-C can be resumed
(``--resume``) or undone (``--abort``):

1. plan: the shards, tables, rows and bytes that will move (``--dry-run`` stops here).
2. copy: ``mariadb-dump --single-transaction`` of the shard databases from
   the source, loaded into the target, while the application writes. The
   dump's snapshot begins while another session holds the moving tables
   READ locked (writers wait until mariadb-dump has printed its position,
   a moment); its GTID position is the one read under that lock, not the
   one mariadb-dump prints (which can be another session's).
3. catch up: the target replicates those databases from the source (a named
   replication connection with a ``replicate_wild_do_table`` filter, from the
   dump's GTID position) until it is level.
   Then, still unfenced, ``CHECKSUM TABLE`` of every moving table on both
   sides at one GTID position (a consistent snapshot on the source, begun
   while another session holds the moving tables READ locked for a moment;
   the target's replication stopped ``UNTIL`` that position for its
   snapshot, then resumed), and the target catches up once more.
4. fence: `FENCE_SESSIONS` sessions on the source take ``LOCK TABLES ...
   WRITE`` on the moving tables, each on whole databases (writers wait;
   other shards are untouched; if the sessions' locks cross a writer's
   transaction over two shards, one session takes them all instead), read
   the source's GTID position and wait
   until the target has applied it (a few events: it was level just before).
5. verify, under the lock: the target replicates strictly from the
   checksummed position without error, and each table's newest row is the
   same on both sides (with a ``slave_exec_mode`` other than STRICT,
   ``CHECKSUM TABLE`` of everything instead). A mismatch, before or under
   the fence, unlocks and stops with the journal kept (resume, or abort).
6. switch: replication stops; under the lock every moving table is renamed
   (each fence session its own tables, side by side) into an archive
   database ``moved_dbNNNNN`` (not binlogged), the new map
   is written (version + 1), and the lock is released. Then each moved
   shard's database on the source becomes a tombstone (see
   `store.admin.ownership`): views that refuse every read and write where the
   tables were, and a marker naming the target and the map version. Writers
   that waited, and processes still holding the old map, are refused by the
   source: they reload the map and retry on the target. Nothing can be
   written to the source copy after the fence, even if something creates
   the tables there again. The switch holds the shards' admin locks, so an
   ``init`` running at the same time finds the tombstone, not a gap.
7. cleanup (``--cleanup``, later): drop the archive databases; tombstones stay.

A crash while fenced releases the lock (the session dies) and the source
keeps taking writes; resuming restarts replication and fences again, and
only tables still on the source are fenced, so a half-done switch finishes.
The source needs ROW binlogs with GTIDs (MariaDB's default GTID mode) and the
target must be able to connect to it as the configured user.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import URL

from store.admin.move.engine import MARIADB, MoveContext
from store.admin.move.mariadb_verify import FENCE_WAIT_TIMEOUT_S, MariaDBVerify, first_key_columns, together
from store.admin.ownership import SHARD_LOCK_TIMEOUT_S
from store.backends import backend_for
from store.backends.mysql.admin import (
    STASH_SUFFIX,
    dump_databases,
    id_trigger,
    leave_tombstones,
    load_dump,
    table_triggers,
)
from store.backends.mysql.dialect import MySQLBackend
from store.backends.mysql.driver import READ_TIMEOUT_S, mysql_connector
from store.exceptions import BackendError, MoveError
from store.naming import TOMBSTONE_TABLE, like_escape

if TYPE_CHECKING:
    from store.admin.move.journal import Journal, MovePlan

__all__ = ["FENCE_SESSIONS", "REPLICATION_NAME", "MariaDBEngine"]

log = logging.getLogger("store.admin.move")

#: The move's replication connection on the target (`store.naming.Names.replication_name` in a namespace).
REPLICATION_NAME = "store_move"
CATCH_UP_TIMEOUT_S = 120
#: How much longer than the wait it asks for a reply to ``MASTER_GTID_WAIT`` may take to arrive.
REPLY_MARGIN_S = 10
# Moves copy MariaDB shard databases: every host of a move is checked to be one (`_url`).
_MYSQL = MySQLBackend()
LOCK_WAIT_TIMEOUT_S = 10
#: How many source sessions take the fence's locks and rename the fenced tables, side by side.
FENCE_SESSIONS = 4
#: Before the fence, the target catches up again until a round takes under this (at most LEVEL_ROUNDS).
LEVEL_BEFORE_FENCE_S = 0.05
LEVEL_ROUNDS = 5
#: How long the fence sessions may take to hold their locks together before one session takes them all.
LOCK_TOGETHER_S = 0.2


class MariaDBEngine(MariaDBVerify):
    """The steps of a move of MariaDB shard databases (`store.admin.move.engine.MoveEngine`)."""

    kind = MARIADB

    def __init__(self, move: MoveContext) -> None:
        self.move = move

    @property
    def _mysql(self) -> MySQLBackend:
        """MariaDB, naming the store's namespace."""
        backend = _MYSQL.named(self.move.names)
        assert isinstance(backend, MySQLBackend)
        return backend

    # -- helpers ---------------------------------------------------------------

    def _url(self, host: str) -> URL:
        url = self.move.store.config.hosts.get(host)
        if url is None:
            raise MoveError(f"host {host!r} is not under hosts in the config")
        backend = backend_for(url)
        if backend.schema_shards:
            raise MoveError(
                f"host {host!r} is PostgreSQL and these shards are on MariaDB: a move copies shards "
                "between servers of one kind (MariaDB databases to MariaDB, PostgreSQL schemas to PostgreSQL)"
            )
        if not backend.can_move:
            raise MoveError(f"host {host!r} is not MariaDB: moves copy MariaDB shard databases")
        return url

    def _id_triggers(self) -> dict[str, str]:
        """Object table -> its ID trigger's name, for the config's types (none with Pinterest IDs)."""
        if self.move.store.config.ids != "instagram":
            return {}
        return {t.table: f"{t.table}_next_id" for t in self.move.store.config.types.values()}

    # -- checks ----------------------------------------------------------------

    def check_source(self, source: str) -> None:
        """Refuse a source the move cannot catch up from (MariaDB: ROW binlogs with GTIDs)."""
        self._check_source_binlog(source)

    def units(self, low: int, high: int) -> list[str]:
        """What is copied, one per shard: the shard databases."""
        return [self.move.names.database_name(s) for s in range(low, high + 1)]

    # -- progress --------------------------------------------------------------

    def sampler(self, target: str) -> Any:
        """A connection to the target for the progress sampler."""
        return mysql_connector(self._url(target))()

    def sample(self, conn: Any, step: str, low: int, high: int) -> dict[str, Any]:
        """The target's rows, tables and bytes while the copy loads, its lag while it catches up."""
        cur = conn.cursor()
        try:
            if step == "load":
                dbs = self.units(low, high)
                marks = ", ".join(["%s"] * len(dbs))
                cur.execute(
                    "SELECT COALESCE(SUM(table_rows), 0), COUNT(*), "
                    "COALESCE(SUM(data_length + index_length), 0) FROM information_schema.tables "
                    f"WHERE table_schema IN ({marks}) AND table_type = 'BASE TABLE'",
                    dbs,
                )
                got = cur.fetchone()
                return {"rows_copied": int(got[0]), "tables_copied": int(got[1]), "disk_copied": int(got[2])}
            if step == "catch_up":
                cur.execute(f"SHOW SLAVE '{self.move.names.replication_name}' STATUS")
                names = [c[0] for c in cur.description]
                row = dict(zip(names, cur.fetchone() or (), strict=False))
                lag = row.get("Seconds_Behind_Master")
                return {"lag_s": None if lag is None else float(lag)}
            return {}
        finally:
            cur.close()

    def _check_source_binlog(self, source: str) -> None:
        with self._conn(source) as cur:
            cur.execute("SELECT @@log_bin, @@binlog_format")
            log_bin, fmt = cur.fetchone()
        if not log_bin or str(fmt).upper() != "ROW":
            raise MoveError(f"the source {source} needs --log-bin with --binlog-format=ROW for a move")

    def _refuse_what_cannot_move(self, source: str, to: str, dbs: list[str]) -> None:
        """`MoveError` for anything on the hosts or in the shard databases that a move could not finish."""
        for host in (source, to):
            with self._conn(host) as cur:
                cur.execute("SELECT @@version")
                version = str(cur.fetchone()[0])
            if "mariadb" not in version.lower():
                raise MoveError(
                    f"{host} runs {version}, not MariaDB: moves replicate by MariaDB GTID "
                    "(named replication connections)"
                )
        self._check_source_binlog(source)
        marks = ", ".join(["%s"] * len(dbs))
        archives = [self.move.names.archive(d) for d in dbs]
        with self._conn(source) as cur:
            cur.execute(
                f"SELECT schema_name FROM information_schema.schemata WHERE schema_name IN ({marks})", dbs
            )
            missing = sorted(set(dbs) - {str(r[0]) for r in cur.fetchall()})
            if missing:
                raise MoveError(
                    f"{source} has no database {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}: "
                    "nothing to move there; run store init first"
                )
            cur.execute(
                f"SELECT schema_name FROM information_schema.schemata WHERE schema_name IN ({marks})",
                archives,
            )
            left = sorted(str(r[0]) for r in cur.fetchall())
            if left:
                raise MoveError(
                    f"{source} still holds the archive {', '.join(left[:3])}{' ...' if len(left) > 3 else ''}"
                    " of an earlier move of these shards: run store move --cleanup (or --abort) with that "
                    "move's journal first"
                )
            cur.execute(
                "SELECT table_schema, table_name, table_type FROM information_schema.tables "
                f"WHERE table_schema IN ({marks}) AND (table_type <> 'BASE TABLE' OR table_name LIKE %s) "
                "ORDER BY 1, 2",
                [*dbs, "%" + STASH_SUFFIX.replace("_", "\\_")],
            )
            odd = [(str(d), str(t), str(k)) for d, t, k in cur.fetchall()]
            if odd:
                d, t, kind = odd[0]
                if t.endswith(STASH_SUFFIX):
                    raise MoveError(
                        f"{source} holds {d}.{t}, a table an interrupted move was fencing: finish that move "
                        "with store move --resume, or undo it with --abort, using its journal"
                    )
                raise MoveError(
                    f"{d}.{t} on {source} is a {kind.lower()}, not a table: store move copies and fences "
                    "only tables; drop it first"
                )
            for what, query in (
                ("routine", f"SELECT routine_schema, routine_name FROM information_schema.routines "
                            f"WHERE routine_schema IN ({marks}) ORDER BY 1, 2"),
                ("event", f"SELECT event_schema, event_name FROM information_schema.events "
                          f"WHERE event_schema IN ({marks}) ORDER BY 1, 2"),
            ):  # fmt: skip
                cur.execute(query, dbs)
                found = cur.fetchone()
                if found is not None:
                    raise MoveError(
                        f"{found[0]} on {source} has the {what} {found[1]}, which store move does not carry: "
                        f"drop it, or move the shard by hand"
                    )
            ours = self._id_triggers()
            for (d, t), names in table_triggers(cur, dbs).items():
                if names != [ours.get(t)]:
                    raise MoveError(
                        f"{d}.{t} on {source} has the trigger(s) {', '.join(names)}; store move carries only "
                        "the Instagram ID trigger of each object table (ids: instagram): drop the others"
                    )

    @contextmanager
    def _conn(self, host: str, *, timeout_s: float | None = None) -> Iterator[Any]:
        """A session on ``host``, each reply waited for at most ``timeout_s`` (else `READ_TIMEOUT_S`)."""
        conn = mysql_connector(
            self._url(host), query_timeout_s=READ_TIMEOUT_S if timeout_s is None else timeout_s
        )()
        try:
            yield conn.cursor()
        finally:
            conn.close()

    def _tables(self, host: str, databases: list[str]) -> list[tuple[str, str, int, int]]:
        marks = ", ".join(["%s"] * len(databases))
        with self._conn(host) as cur:
            cur.execute(
                "SELECT table_schema, table_name, COALESCE(table_rows, 0), "
                "COALESCE(data_length, 0) + COALESCE(index_length, 0) FROM information_schema.tables "
                f"WHERE table_schema IN ({marks}) AND table_type = 'BASE TABLE' ORDER BY 1, 2",
                databases,
            )
            return [(str(r[0]), str(r[1]), int(r[2]), int(r[3])) for r in cur.fetchall()]

    def _forget_replication(self, j: Journal) -> None:
        """Stop and remove the move's replication connection on the target (if any)."""
        with self._conn(j.target) as cur:
            with suppress(Exception):
                cur.execute(f"STOP SLAVE '{self.move.names.replication_name}'")
            with suppress(Exception):
                cur.execute(f"RESET SLAVE '{self.move.names.replication_name}' ALL")

    def _drop_target_copy(self, j: Journal, dbs: list[str]) -> None:
        """Forget the replication and drop the target's copies of the moving databases."""
        self._forget_replication(j)
        with self._conn(j.target) as cur:
            for db in dbs:
                cur.execute(f"DROP DATABASE IF EXISTS `{db}`")

    # -- plan ------------------------------------------------------------------

    def check_hosts(self, source: str, to: str, slave: str | None) -> None:
        """`MoveError` unless the hosts are MariaDB hosts of the config, the source and target two servers."""
        there_id, here_id = _MYSQL.server_identity(self._url(to)), _MYSQL.server_identity(self._url(source))
        if there_id == here_id:  # the copy would first drop the databases it is about to copy
            raise MoveError(
                f"{source} and {to} are the same server ({here_id}): a move copies shards between two servers"
            )
        if slave is not None:
            self._url(slave)

    def survey(self, plan: MovePlan, map_version: int) -> None:
        """Measure the moving tables; `MoveError` for a tombstone, a leftover copy, or what cannot move."""
        low, high, source, to = plan.low, plan.high, plan.source, plan.target
        plan.tables = self._tables(source, plan.databases())
        with self._conn(source) as cur:
            gone = self._mysql.tombstones(cur, range(low, high + 1))
        if gone:
            shard, (moved_to, version) = min(gone.items())
            raise MoveError(
                f"{source} holds only a tombstone of shard {shard} (moved to {moved_to} in map version "
                f"{version}), yet the live map (version {map_version}) names {source}: the map source is "
                "behind the hosts; run store check"
            )
        there = sorted({db for db, t, _r, _b in self._tables(to, plan.databases()) if t != TOMBSTONE_TABLE})
        if there:
            raise MoveError(
                f"{to} already holds tables of {', '.join(there[:3])}{' ...' if len(there) > 3 else ''}, "
                f"which the live map (version {map_version}) does not give it: a leftover copy? Run store "
                "check, and drop them before moving these shards there"
            )
        self._refuse_what_cannot_move(source, to, plan.databases())

    # -- copy and catch up -----------------------------------------------------

    def copy(self, j: Journal, dbs: list[str]) -> None:
        """Dump the shard databases (``--single-transaction``, `_dump`) and load them into the target."""
        t0 = time.monotonic()
        self.move.say(f"copy: dumping {len(dbs)} shard database(s) from {j.source}")
        if self.move.progress is not None:
            with suppress(Exception):  # only for the progress bar
                measured = self._tables(j.source, dbs)
                self.move.step(
                    rows_total=sum(t[2] for t in measured),
                    bytes_total=sum(t[3] for t in measured),
                    tables_total=len(measured),
                    disk_total=sum(t[3] for t in measured),
                )
        self.move.step(phase="copy", step="dump")
        self._drop_target_copy(j, dbs)
        try:
            dump, gtid = self._dump(j, dbs)
            self.move.say(
                f"copy: loading {len(dump) / 1e6:.1f} MB into {j.target} (writers of the moving tables "
                f"waited {j.timings.get('copy_held_s', 0):.3f} s while the dump began)"
            )
            self.move.step(step="load", bytes_copied=0, bytes_total=len(dump))
            load_dump(self._url(j.target), dump)
            self.move.step(step="loaded", bytes_copied=len(dump))
        except BackendError as exc:
            raise MoveError(f"copying from {j.source} to {j.target}: {exc}") from exc
        j.gtid = gtid
        j.timings["copy_bytes"] = len(dump)
        self.move.phase(j, "catch_up", t0, "copy_s")

    def _dump(self, j: Journal, dbs: list[str]) -> tuple[bytes, str]:
        """A dump of ``dbs`` from the source, and the GTID position at which it holds exactly their
        transactions: where the target's replication starts.

        Not the position mariadb-dump prints, which can be another session's (`dump_databases`).
        mariadb-dump starts while another session holds every table of ``dbs`` still (`_held_at`),
        and they are let go only once it has printed its position, which it does once its snapshot
        has begun: the snapshot begins under the lock, so it holds exactly the transactions on
        these tables up to the position read under the lock. Writers of the moving tables wait
        from the lock until then (``copy_held_s`` in the journal's timings).
        """
        tables = [(d, t) for d, t, _r, _b in self._tables(j.source, dbs)]
        with self._held_at(j, tables, "copy") as (lock, at):
            held = time.monotonic()

            def begun() -> None:
                lock.execute("UNLOCK TABLES")
                j.timings["copy_held_s"] = round(time.monotonic() - held, 3)

            dump, printed = dump_databases(self._url(j.source), dbs, begun=begun)
        if printed != at:
            log.debug("copy: mariadb-dump printed the position %s; the copy holds %s", printed, at)
        return dump, at

    def _start_replication(self, j: Journal, dbs: list[str]) -> None:
        src = self._url(j.source)
        # The target connects to the source itself: from where it runs, the source's address
        # may not be the URL's (hosts.NAME.replication_host, e.g. a compose service name).
        host, port = self.move.store.config.replication_address(j.source, 3306)
        with self._conn(j.target) as cur:
            if not j.replicating:
                cur.execute("SET GLOBAL gtid_slave_pos = %s", (j.gtid,))
                cur.execute(
                    f"CHANGE MASTER '{self.move.names.replication_name}' TO "
                    "MASTER_HOST = %s, MASTER_PORT = %s, "
                    "MASTER_USER = %s, MASTER_PASSWORD = %s, MASTER_USE_GTID = slave_pos",
                    (host, port, src.username or "root", src.password or ""),
                )
                cur.execute(
                    f"SET GLOBAL {self.move.names.replication_name}.replicate_wild_do_table = %s",
                    (",".join(f"{like_escape(d)}.%" for d in dbs),),
                )
                j.replicating = True
                j.save(self.move.journal_path)
            cur.execute(f"START SLAVE '{self.move.names.replication_name}'")

    def _wait_level(self, j: Journal, position: str, timeout_s: float) -> None:
        """Wait until the target has applied ``position``; `MoveError` if it has not within ``timeout_s``."""
        with self._conn(j.target, timeout_s=timeout_s + REPLY_MARGIN_S) as cur:  # the wait is one reply
            cur.execute("SELECT MASTER_GTID_WAIT(%s, %s)", (position, timeout_s))
            if cur.fetchone()[0] != 0:
                cur.execute(f"SHOW SLAVE '{self.move.names.replication_name}' STATUS")
                names = [d[0] for d in cur.description]
                status = dict(zip(names, cur.fetchone() or (), strict=False))
                raise MoveError(
                    f"{j.target} did not catch up with {j.source} within {timeout_s:.0f} s "
                    f"(IO {status.get('Slave_IO_Running')}, SQL {status.get('Slave_SQL_Running')}, "
                    f"error {status.get('Last_Error') or status.get('Last_IO_Error') or '-'}); "
                    "resume when it has, or abort"
                )

    def catch_up(self, j: Journal, dbs: list[str]) -> None:
        """Replicate the shard databases from the dump's GTID position until the target is level."""
        t0 = time.monotonic()
        self._start_replication(j, dbs)
        with self._conn(j.source) as cur:
            cur.execute("SELECT @@gtid_binlog_pos")
            position = str(cur.fetchone()[0])
        self.move.say(f"catch up: {j.target} replicating from {j.source} up to {position}")
        self.move.step(phase="catch_up", step="catch_up")
        self._wait_level(j, position, CATCH_UP_TIMEOUT_S)
        self.move.step(lag_s=0.0)
        self.move.phase(j, "switch", t0, "catch_up_s")

    # -- fence and switch ------------------------------------------------------

    @contextmanager
    def shards_locked(self, j: Journal) -> Iterator[Any]:
        """One session on the source does the whole switch, holding the moving shards' admin locks:
        an init that waits on them finds the tombstone. Closing it releases every lock."""
        conn = mysql_connector(self._url(j.source))()
        src = conn.cursor()
        try:
            with self._mysql.admin_lock(src, range(j.low, j.high + 1), timeout_s=SHARD_LOCK_TIMEOUT_S):
                yield src
        finally:
            conn.close()  # also releases the locks if anything failed

    def serving(self, j: Journal, dbs: list[str], session: Any) -> bool:
        """True while moving tables are still on the source (a crash in the switch left some on their
        way to the archive: they go first)."""
        self._archive_stashed(j.source, dbs)
        return bool(self._fenceable(j, dbs))

    def _fenceable(self, j: Journal, dbs: list[str]) -> list[tuple[str, str]]:
        """The moving tables still on the source."""
        return [(db, t) for db, t, _r, _b in self._tables(j.source, dbs) if t != TOMBSTONE_TABLE]

    def stream(self, j: Journal, dbs: list[str]) -> None:
        """Start the replication again after a crash: the lock died with its session."""
        self._start_replication(j, dbs)

    def verify_before_fence(self, j: Journal, dbs: list[str]) -> str:
        """`_checksum_before_fence` of the tables still on the source."""
        return self._checksum_before_fence(j, self._fenceable(j, dbs))

    def finish_switch(self, j: Journal, dbs: list[str]) -> None:
        """Nothing: the renames took the tables out of reach, the tombstones follow."""

    def leave_tombstones(self, j: Journal, dbs: list[str], session: Any) -> int:
        """Each moved shard's database becomes a tombstone, in the session holding the admin locks."""
        return leave_tombstones(
            session, range(j.low, j.high + 1), j.target, j.switched_version, names=self.move.names
        )

    def forget_replication(self, j: Journal) -> None:
        """Stop and remove the move's replication connection on the target (if any)."""
        self._forget_replication(j)

    def fence_and_switch(self, j: Journal, dbs: list[str], fence: Any, checked_at: str) -> None:
        """Fence the tables on the source, check the target has everything, archive them, switch the map.

        Before this, the checksums of every table were compared at one GTID
        position, ``checked_at`` (`_checksum_before_fence`; "" if they were
        not); before the lock, the target catches up
        once more (`_level_before_fence`), so that under the lock only the
        last few events remain to wait for and cheap checks to make. The
        lock is taken by `FENCE_SESSIONS` sessions at once, each on whole
        databases, and each renames its own tables: the renames, most of the
        fenced time, run side by side. If their locks cross a writer's
        transaction that spans two of them (`_lock_together`), one session
        takes every lock, as it always did, and renames alone. A crash
        releases every session's lock.
        """
        tables = self._fenceable(j, dbs)
        fence.execute("SET SESSION sql_log_bin = 0")  # the archive and renames stay off the binlog
        for db in dbs:
            fence.execute(f"CREATE DATABASE IF NOT EXISTS `{self.move.names.archive(db)}`")
        triggered = table_triggers(fence, dbs)  # MariaDB renames these only within their database
        keys = first_key_columns(fence, dbs) if checked_at else {}
        self._level_before_fence(j)
        by_db: dict[str, list[tuple[str, str]]] = {}
        for d, t in tables:
            by_db.setdefault(d, []).append((d, t))
        groups: list[list[tuple[str, str]]] = [[] for _ in range(min(FENCE_SESSIONS, len(by_db)))]
        for i, d in enumerate(sorted(by_db)):
            groups[i % len(groups)].extend(by_db[d])
        extra = [mysql_connector(self._url(j.source))() for _ in groups]
        sessions = [c.cursor() for c in extra]
        own = list(sessions)
        marks: dict[str, float] = {}
        try:
            for cur in [fence, *sessions]:
                cur.execute("SET SESSION sql_log_bin = 0")
                cur.execute(f"SET SESSION lock_wait_timeout = {LOCK_WAIT_TIMEOUT_S}")
            t0 = time.monotonic()
            try:
                if not self._lock_together(j, sessions, groups):
                    # A writer's transaction across two groups (a link between two shards of
                    # this host) held a table one session waited for while it waited for a
                    # table another held. One session takes every lock in one statement: any
                    # such wait is then one MariaDB sees, and it turns the writer away.
                    log.info(
                        "fence: the sessions' locks crossed a writer's transaction; locking in one session"
                    )
                    for c in extra:  # whatever they hold goes with them
                        with suppress(Exception):
                            c.close()
                    own, sessions, groups = [], [fence], [[dt for g in groups for dt in g]]
                    fence.execute("LOCK TABLES " + ", ".join(f"`{d}`.`{t}` WRITE" for d, t in groups[0]))
                j.timings["fenced_sessions"] = len(sessions)
                self.move.step(phase="switch", step="fence", fence_started=time.time(), fence_ended=None)
                marks["lock_s"] = time.monotonic()
                fence.execute("SELECT @@gtid_binlog_pos")
                position = str(fence.fetchone()[0])
                self.move.say(
                    f"fence: {len(tables)} tables locked on {j.source}; {j.target} to reach {position}"
                )
                self._wait_level(j, position, FENCE_WAIT_TIMEOUT_S)
                marks["level_s"] = time.monotonic()
                self.move.step(step="verify", lag_s=0.0)
                if checked_at:
                    self._verify_fenced(j, sessions, groups, position, checked_at, keys)
                else:  # the target may skip row events it cannot apply: compare everything, fenced
                    self._verify(j, sessions, groups)
                marks["verify_s"] = time.monotonic()

                def stop_replication() -> None:  # on the target, while the source renames
                    with self._conn(j.target) as cur:
                        cur.execute(f"STOP SLAVE '{self.move.names.replication_name}'")

                def rename(cur: Any, group: list[tuple[str, str]]) -> None:
                    for d, t in sorted(group, key=lambda dt: dt not in triggered):
                        if (d, t) in triggered:  # out of reach first; to the archive below
                            cur.execute(f"ALTER TABLE `{d}`.`{t}` RENAME `{d}`.`{t}{STASH_SUFFIX}`")
                        else:
                            cur.execute(
                                f"ALTER TABLE `{d}`.`{t}` RENAME `{self.move.names.archive(d)}`.`{t}`"
                            )

                together(
                    [
                        stop_replication,
                        *(
                            lambda cur=cur, group=group: rename(cur, group)
                            for cur, group in zip(sessions, groups, strict=True)
                        ),
                    ]
                )
                marks["rename_s"] = time.monotonic()
                if triggered:
                    self._archive_stashed(j.source, dbs)
                    marks["archive_s"] = time.monotonic()
                self.move.step(step="switch")
                if not self.move.map_switched(j):
                    self.move.write_map(j)
                j.switched_version = self.move.store.shard_map.version
                marks["map_s"] = time.monotonic()
            finally:
                for cur in [*own, fence]:
                    with suppress(Exception):  # a dead session has released the lock already
                        cur.execute("UNLOCK TABLES")
                        cur.execute("SET SESSION sql_log_bin = 1")
        finally:
            for c in extra:
                with suppress(Exception):
                    c.close()
        self.move.step(fence_ended=time.time())
        end = time.monotonic()
        j.timings["fenced_s"] = round(end - t0, 3)
        last = t0
        for name, at in marks.items():  # where the fenced time went
            j.timings[f"fence_{name}"] = round(at - last, 3)
            last = at
        j.timings["fence_unlock_s"] = round(end - last, 3)
        j.save(self.move.journal_path)
        self.move.say(
            f"fence: held {j.timings['fenced_s']:.3f} s ("
            + ", ".join(f"{k[6:-2]} {v:.3f}" for k, v in j.timings.items() if k.startswith("fence_"))
            + ")"
        )

    def _lock_together(self, j: Journal, sessions: list[Any], groups: list[list[tuple[str, str]]]) -> bool:
        """Each of ``sessions`` locks its group of tables (``LOCK TABLES ... WRITE``), all at once.

        True when all hold their locks. False, with none held, when they do
        not within `LOCK_TOGETHER_S`: a writer's transaction that spans two
        groups can hold a table one session waits for while it waits for a
        table another session holds, a wait MariaDB cannot see as a
        deadlock. The sessions still waiting are interrupted (``KILL
        QUERY``); they are not used again.
        """
        ids = []
        for cur in sessions:
            cur.execute("SELECT CONNECTION_ID()")
            ids.append(int(cur.fetchone()[0]))
        errors: list[BaseException] = []

        def lock(cur: Any, group: list[tuple[str, str]]) -> None:
            try:
                cur.execute("LOCK TABLES " + ", ".join(f"`{d}`.`{t}` WRITE" for d, t in group))
            except BaseException as exc:  # re-raised below, or the interrupted wait
                errors.append(exc)

        threads = [
            threading.Thread(target=lock, args=(cur, group), daemon=True)
            for cur, group in zip(sessions, groups, strict=True)
        ]
        for t in threads:
            t.start()
        deadline = time.monotonic() + LOCK_TOGETHER_S
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        waiting = [i for i, t in enumerate(threads) if t.is_alive()]
        if waiting:
            with self._conn(j.source) as cur:
                for i in waiting:
                    with suppress(Exception):
                        cur.execute(f"KILL QUERY {ids[i]}")
            for t in threads:
                t.join(LOCK_WAIT_TIMEOUT_S + 5)
        if waiting or errors:
            for cur in sessions:
                with suppress(Exception):
                    cur.execute("UNLOCK TABLES")
        if errors and not waiting:
            raise errors[0]
        return not waiting

    def _level_before_fence(self, j: Journal) -> None:
        """Let the target catch up again, until a round takes under `LEVEL_BEFORE_FENCE_S`: little is left
        for the fence to wait for."""
        with self._conn(j.source) as cur:
            for _ in range(LEVEL_ROUNDS):
                cur.execute("SELECT @@gtid_binlog_pos")
                position = str(cur.fetchone()[0])
                t0 = time.monotonic()
                self._wait_level(j, position, CATCH_UP_TIMEOUT_S)
                if time.monotonic() - t0 < LEVEL_BEFORE_FENCE_S:
                    break

    def _archive_stashed(self, host: str, dbs: list[str]) -> int:
        """Drop the triggers of the fenced tables under their stash names and rename them into the archive.

        From a session of its own: the fence session's renames took them out
        of its lock. They are out of reach of every writer already, and their
        contents were verified before they were renamed, so a resumed move
        finishes this too. How many tables it moved.
        """
        stashed = [(d, t) for d, t, _r, _b in self._tables(host, dbs) if t.endswith(STASH_SUFFIX)]
        if not stashed:
            return 0
        with self._conn(host) as cur:
            cur.execute("SET SESSION sql_log_bin = 0")
            triggers = table_triggers(cur, sorted({d for d, _t in stashed}))
            for d, t in stashed:
                for name in triggers.get((d, t), []):
                    cur.execute(f"DROP TRIGGER IF EXISTS `{d}`.`{name}`")
                archive = self.move.names.archive(d)
                cur.execute(f"CREATE DATABASE IF NOT EXISTS `{archive}`")
                cur.execute(f"ALTER TABLE `{d}`.`{t}` RENAME `{archive}`.`{t[: -len(STASH_SUFFIX)]}`")
        return len(stashed)

    def _restore_source(self, j: Journal, dbs: list[str]) -> None:
        """Put every table a switch had fenced back where it was on the source, with its ID trigger.

        A table whose trigger must come back goes through its stash name: the
        trigger is made on it there, and only the rename within the database,
        which keeps it, makes the table reachable again. The counter table
        comes back first. Idempotent: an abort that crashed is run again.
        """
        ours = self._id_triggers()
        epoch = self.move.store.config.instagram_epoch_ms
        archived = [
            (d, t) for d, t, _r, _b in self._tables(j.source, [self.move.names.archive(d) for d in dbs])
        ]
        with self._conn(j.source) as cur:
            cur.execute("SET SESSION sql_log_bin = 0")
            leftover = table_triggers(cur, sorted({d for d, _t in archived}))
            for a, t in sorted(archived, key=lambda at: at[1] in ours):
                for name in leftover.get((a, t), []):  # none made by a move; a rename would refuse them
                    cur.execute(f"DROP TRIGGER IF EXISTS `{a}`.`{name}`")
                live = self.move.names.unarchive(a)
                cur.execute(
                    f"ALTER TABLE `{a}`.`{t}` RENAME `{live}`.`{t}{STASH_SUFFIX if t in ours else ''}`"
                )
            for d, stash, _r, _b in self._tables(j.source, dbs):
                if not stash.endswith(STASH_SUFFIX):
                    continue
                t = stash[: -len(STASH_SUFFIX)]
                if t in ours:
                    shard = self.move.names.database_shard(d)
                    assert shard is not None
                    cur.execute(id_trigger(shard, t, epoch, on=stash, db=d))
                cur.execute(f"ALTER TABLE `{d}`.`{stash}` RENAME `{d}`.`{t}`")
            for db in dbs:
                cur.execute(f"DROP DATABASE IF EXISTS `{self.move.names.archive(db)}`")

    # -- abort and cleanup -------------------------------------------------------

    # -- abort and cleanup -------------------------------------------------------

    def abort(self, j: Journal, dbs: list[str]) -> None:
        """Drop the target's copy and its replication; tables a crashed switch had fenced go back."""
        self._drop_target_copy(j, dbs)
        self._restore_source(j, dbs)

    def cleanup(self, j: Journal, dbs: list[str]) -> list[str]:
        """Drop the archive databases on the source, holding the shards' admin locks."""
        dropped = []
        with (
            self._conn(j.source) as cur,
            self._mysql.admin_lock(cur, range(j.low, j.high + 1), timeout_s=SHARD_LOCK_TIMEOUT_S),
        ):
            cur.execute("SET SESSION sql_log_bin = 0")
            for db in dbs:
                cur.execute(f"DROP DATABASE IF EXISTS `{self.move.names.archive(db)}`")
                dropped.append(self.move.names.archive(db))
        return dropped
