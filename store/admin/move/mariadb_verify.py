"""How a MariaDB move compares the two sides: checksums before the fence, cheap checks under it.

A part of `store.admin.move.mariadb.MariaDBEngine` (its base class), apart
for its size: `_checksum_before_fence` compares every table's checksum at
one GTID position while the source serves; under the fence,
`_verify_fenced` checks that the target replicated strictly from there and
that each table ends with the same row, or `_verify` compares the checksums
of everything where the target might skip row events. `_held_at` holds the
moving tables still for the moment a snapshot begins, the checksum's or the
copy's dump's, and gives the GTID position that snapshot holds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from typing import TYPE_CHECKING, Any

from store.backends.mysql.driver import mysql_connector
from store.exceptions import MoveError

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

    from store.admin.move.engine import MoveContext
    from store.admin.move.journal import Journal

__all__ = ["FENCE_WAIT_TIMEOUT_S", "MariaDBVerify"]

FENCE_WAIT_TIMEOUT_S = 30
#: How long the copy and the checksum wait for the moving tables' READ locks (writers wait behind them).
SNAPSHOT_LOCK_WAIT_S = 2
#: MariaDB's ER_LOCK_WAIT_TIMEOUT.
LOCK_WAIT_TIMEOUT_ERRNO = 1205


def together(calls: list[Callable[[], object]]) -> None:
    """Run ``calls`` at once (each in a thread but the first); the first error, once all have ended."""
    errors: list[BaseException] = []

    def run(call: Callable[[], object]) -> None:
        try:
            call()
        except BaseException as exc:  # re-raised below, in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(c,)) for c in calls[1:]]
    for t in threads:
        t.start()
    run(calls[0])
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def first_key_columns(cur: Any, dbs: list[str]) -> dict[tuple[str, str], str]:
    """(database, table) -> the first column of its primary key, for the tables of ``dbs`` that have one."""
    cur.execute(
        "SELECT table_schema, table_name, column_name FROM information_schema.statistics "
        f"WHERE table_schema IN ({', '.join(['%s'] * len(dbs))}) AND index_name = 'PRIMARY' "
        "AND seq_in_index = 1",
        dbs,
    )
    return {(str(d), str(t)): str(c) for d, t, c in cur.fetchall()}


def compare(here: dict[str, Any], there: dict[str, Any], where: str, what: str = "checksums") -> None:
    """`MoveError` naming the tables whose ``what`` differ between the source (``here``) and the target."""
    wrong = sorted(k for k in here if here[k] != there.get(k))
    if wrong:
        raise MoveError(
            f"verify: {what} differ for {', '.join(wrong[:5])}{' ...' if len(wrong) > 5 else ''}{where}: "
            "resume to try again, or abort"
        )


class MariaDBVerify:
    """The comparisons of a MariaDB move (`store.admin.move.mariadb.MariaDBEngine` fills in the rest)."""

    move: MoveContext

    def _url(self, host: str) -> URL:
        raise NotImplementedError

    def _conn(self, host: str, *, timeout_s: float | None = None) -> AbstractContextManager[Any]:
        raise NotImplementedError

    def _checksum_before_fence(self, j: Journal, tables: list[tuple[str, str]]) -> str:
        """Compare every table's checksum on both sides at one GTID position, before the fence; that position.

        The source takes a consistent snapshot and the GTID position it
        stands at (`_snapshot_at`); the target's replication applies exactly up to that
        position (``START SLAVE UNTIL``), takes its snapshot there and goes
        on. Both checksum in their snapshots while writes go on. The fenced
        check (`_verify_fenced`) then relies on the target replicating
        strictly (a row event it cannot apply stops it) from that position:
        with any other ``slave_exec_mode`` this returns "" and the fence
        compares checksums itself.
        """
        with self._conn(j.target) as cur:
            cur.execute("SELECT @@slave_exec_mode")
            if "STRICT" not in str(cur.fetchone()[0]).upper():
                return ""
        t0 = time.monotonic()
        names = ", ".join(f"`{d}`.`{t}`" for d, t in tables)
        here_conn = mysql_connector(self._url(j.source))()
        there_conn = mysql_connector(self._url(j.target))()
        try:
            here, there = here_conn.cursor(), there_conn.cursor()
            there.execute(
                f"STOP SLAVE '{self.move.names.replication_name}'"
            )  # UNTIL needs both threads stopped
            try:
                at = self._snapshot_at(j, here, tables)
                there.execute(
                    f"START SLAVE '{self.move.names.replication_name}' UNTIL master_gtid_pos = %s", (at,)
                )
                self._until_stopped(j, there, at)
                there.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
            finally:  # from another session: START SLAVE would end the snapshot's transaction
                with self._conn(j.target) as cur:
                    cur.execute(
                        f"STOP SLAVE '{self.move.names.replication_name}'"
                    )  # a no-op once UNTIL has stopped it
                    cur.execute(f"START SLAVE '{self.move.names.replication_name}'")
            sums: list[dict[str, Any]] = [{}, {}]

            def checksum(cur: Any, into: dict[str, Any]) -> None:
                cur.execute(f"CHECKSUM TABLE {names}")
                into.update({str(r[0]): r[1] for r in cur.fetchall()})

            together([lambda: checksum(here, sums[0]), lambda: checksum(there, sums[1])])
        finally:
            here_conn.close()
            there_conn.close()
        compare(sums[0], sums[1], f" at {at}, before the fence; the source keeps serving")
        j.timings["checksum_s"] = round(time.monotonic() - t0, 3)
        self.move.say(
            f"catch up: {len(sums[0])} table checksums equal on both sides at {at}, before the fence"
        )
        return at

    def _snapshot_at(self, j: Journal, cur: Any, tables: list[tuple[str, str]]) -> str:
        """Start a consistent snapshot on ``cur`` (a session on the source); the GTID position at
        which the snapshot holds exactly the transactions on ``tables``.

        Not from the snapshot's ``binlog_snapshot_file`` and ``_position``: MariaDB keeps those
        status variables in globals of the server, which every ``SHOW STATUS`` of any session (a
        monitoring agent's ``SHOW GLOBAL STATUS``, another snapshot's own) writes before it reads
        them back, so a session can be handed another's position, a few transactions off its
        snapshot: the target then stops elsewhere than the snapshot and a good copy looks wrong.
        Instead the snapshot starts while ``tables`` are held still (`_held_at`), at the position
        read then.
        """
        with self._held_at(j, tables, "verify") as (_lock, at):
            cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        if not at:
            raise MoveError(f"verify: {j.source} gave no GTID position for its snapshot")
        return at

    @contextmanager
    def _held_at(self, j: Journal, tables: list[tuple[str, str]], step: str) -> Iterator[tuple[Any, str]]:
        """A session on the source holding ``tables`` READ locked, and the GTID position read under
        that lock: a snapshot begun in the block holds exactly the transactions on ``tables`` up to
        that position, and none after it.

        No transaction on ``tables`` commits while the lock is held (writers wait, readers do not),
        and a writer keeps its table's metadata lock until its commit is done (in the binlog and
        visible): once the lock is granted, every transaction on them in the binlog is visible, and
        no other joins them until the lock goes. Transactions on other tables in the position,
        perhaps not visible yet, are not the target's to apply (its replication filter skips them).
        The block may unlock early (``UNLOCK TABLES`` on the session); at its end, whatever
        happened, the session unlocks and closes. A transaction that holds one of ``tables``
        longer than `SNAPSHOT_LOCK_WAIT_S` fails the ``step`` (resume tries again), not the writes.
        """
        with self._conn(j.source) as lock:
            if tables:
                lock.execute(f"SET SESSION lock_wait_timeout = {SNAPSHOT_LOCK_WAIT_S}")
                try:
                    lock.execute("LOCK TABLES " + ", ".join(f"`{d}`.`{t}` READ" for d, t in tables))
                except Exception as exc:
                    if not (exc.args and exc.args[0] == LOCK_WAIT_TIMEOUT_ERRNO):
                        raise
                    raise MoveError(
                        f"{step}: a transaction on {j.source} held a moving table for over "
                        f"{SNAPSHOT_LOCK_WAIT_S} s; the source keeps serving: resume to try again, or abort"
                    ) from exc
            try:
                lock.execute("SELECT @@gtid_binlog_pos")
                yield lock, str(lock.fetchone()[0] or "")
            finally:
                with suppress(Exception):  # a session that died has unlocked; closing it unlocks too
                    lock.execute("UNLOCK TABLES")

    def _until_stopped(self, j: Journal, cur: Any, at: str) -> None:
        """Wait until the target's replication, started ``UNTIL`` ``at``, has applied it and stopped."""
        deadline = time.monotonic() + FENCE_WAIT_TIMEOUT_S
        while True:
            cur.execute(f"SHOW SLAVE '{self.move.names.replication_name}' STATUS")
            names = [d[0] for d in cur.description]
            status = dict(zip(names, cur.fetchone() or (), strict=False))
            if status.get("Last_SQL_Errno"):
                raise MoveError(
                    f"{j.target} stopped replicating from {j.source}: {status.get('Last_SQL_Error')}; "
                    "resume when it has been fixed, or abort"
                )
            if status.get("Slave_SQL_Running") == "No" and status.get("Slave_IO_Running") == "No":
                break
            if time.monotonic() > deadline:
                raise MoveError(
                    f"{j.target} did not reach {at} within {FENCE_WAIT_TIMEOUT_S} s; resume, or abort"
                )
            time.sleep(0.005)
        cur.execute("SELECT MASTER_GTID_WAIT(%s, %s)", (at, 1))
        if cur.fetchone()[0] != 0:
            raise MoveError(f"{j.target} stopped replicating before {at}; resume, or abort")

    def _verify_fenced(
        self,
        j: Journal,
        sessions: list[Any],
        groups: list[list[tuple[str, str]]],
        position: str,
        at: str,
        keys: dict[tuple[str, str], str],
    ) -> None:
        """The fenced check after `_checksum_before_fence`: the target applied every event from ``at``
        to ``position`` (waited for already) and still replicates without error (strictly: a row
        event it could not apply would have stopped it), and each table's newest row, by the first
        column of its primary key (``keys``; an index lookup, not a scan), is the same on both sides.

        What this does not see, and the full checksums under the fence did: a row changed on the
        target behind replication's back after ``at`` (nothing of the store's writes there: the map
        does not name the target until the switch)."""
        with self._conn(j.target) as cur:
            cur.execute(f"SHOW SLAVE '{self.move.names.replication_name}' STATUS")
            names = [d[0] for d in cur.description]
            status = dict(zip(names, cur.fetchone() or (), strict=False))
        if status.get("Slave_SQL_Running") != "Yes" or status.get("Last_SQL_Errno"):
            raise MoveError(
                f"verify: {j.target} is not replicating ({status.get('Last_SQL_Error') or 'stopped'}); "
                "the source was unlocked and keeps serving: resume to try again, or abort"
            )

        def newest(group: list[tuple[str, str]]) -> str:
            return " UNION ALL ".join(
                f"SELECT '{d}.{t}', MAX(`{keys[d, t]}`) FROM `{d}`.`{t}`"
                if (d, t) in keys
                else f"SELECT '{d}.{t}', NULL"  # no primary key: nothing cheap to compare
                for d, t in group
            )

        here, there = self._both_sides(j, sessions, groups, newest)
        compare(here, there, "; the source was unlocked and keeps serving", "newest rows")
        self.move.say(
            f"verify: {j.target} applied {position} and replicates without error; {len(here)} tables end "
            f"with the same row on both sides (checksums equal at {at})"
        )

    def _verify(self, j: Journal, sessions: list[Any], groups: list[list[tuple[str, str]]]) -> None:
        """Compare every fenced table's checksum on both sides, each fence session its own tables."""
        here, there = self._both_sides(
            j, sessions, groups, lambda group: "CHECKSUM TABLE " + ", ".join(f"`{d}`.`{t}`" for d, t in group)
        )
        compare(here, there, "; the source was unlocked and keeps serving")
        self.move.say(f"verify: {len(here)} table checksums equal on both sides")

    def _both_sides(
        self,
        j: Journal,
        sessions: list[Any],
        groups: list[list[tuple[str, str]]],
        query: Callable[[list[tuple[str, str]]], str],
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """``query`` of each fence session's tables on that session (it holds their locks), and of all
        of them on the target, at once: (table -> the source's answer, table -> the target's)."""
        answers: list[dict[str, Any]] = [{} for _ in range(len(sessions) + 1)]

        def ask(cur: Any, group: list[tuple[str, str]], into: dict[str, Any]) -> None:
            if group:
                cur.execute(query(group))
                into.update({str(r[0]): r[1] for r in cur.fetchall()})

        def target_side() -> None:
            with self._conn(j.target) as cur:
                ask(cur, [dt for g in groups for dt in g], answers[-1])

        together(
            [
                target_side,
                *(
                    lambda cur=cur, group=group, into=into: ask(cur, group, into)
                    for cur, group, into in zip(sessions, groups, answers, strict=False)
                ),
            ]
        )
        return {k: v for a in answers[:-1] for k, v in a.items()}, answers[-1]
