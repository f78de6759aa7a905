"""Flickr-style ticket servers: unique 64-bit IDs from two (or more) MariaDB servers, dense per server.

Each server keeps one row per counter (photos, accounts, ...), and an ID is
one single-row UPDATE in autocommit whose reply carries the ID::

    CREATE TABLE tickets.ticket_ids (
      counter VARCHAR(64) NOT NULL PRIMARY KEY, next_id BIGINT UNSIGNED NOT NULL);
    UPDATE tickets.ticket_ids SET next_id = LAST_INSERT_ID(next_id) + 2 WHERE counter = 'photos';

With N servers, server i (from 1) hands out i, i + N, i + 2N, ...: with two
servers one hands out the odd IDs and the other the even ones. Concurrent
UPDATEs of the row wait for its lock in turn; a statement that locks one row
cannot deadlock, and one that gives up waiting (error 1205) is rolled back
whole, its ID unused, and retried on the same server. (Flickr's ``REPLACE
INTO Tickets64``, which this module used before, deadlocked now and then
under concurrency, and every rolled-back REPLACE had used an AUTO_INCREMENT
value: 11-25 IDs per 10,000 were never handed out at 8 threads.)

When an ID is skipped, and only then:

- a reply lost: the UPDATE committed but its reply never arrived (the
  connection dropped, the server was killed just after the commit, or the
  client's ``timeout_s`` ran out while the statement waited on the server
  and went on later). `ServerStats.unknown` counts these statements; each
  skipped at most one ticket (one ID, or one block of B).
- a block not used up: with ``block = B`` the IDs left in a block when the
  process ends are never handed out.
- the switch from REPLACE (below), once: the server's first ID after it is
  its first above the old table's AUTO_INCREMENT counter, so the values that
  rolled-back REPLACEs used at the end of the old table are skipped.
- a counter still on the REPLACE path (`store tickets init` not yet run by
  this version): as before, a deadlock's retry skips an ID.

No ID is handed out twice: the counter is an InnoDB row, so it survives a
restart of the server; that needs the durable setting
``innodb_flush_log_at_trx_commit = 1`` (with 0 or 2 an operating system crash
can lose the last commits and the counter would go back). Never delete or
lower a row of ``tickets.ticket_ids``: it is the counter. (``store tickets
init`` will not start a deleted row again: ``tickets.ticket_switches``
records each row it made.)

The place of a server is fixed by ``store tickets init`` (`TicketAllocator.init`):
it records N and i in ``tickets.ticket_server`` on that server, starts each
new counter's row at i, and sets N and i as the server's GLOBAL
``auto_increment_increment`` and ``auto_increment_offset`` for clients of
the REPLACE path (GLOBAL values do not survive a restart: put them in the
server's my.cnf as well). Before the first ID from a server a client checks
that the recorded place matches its own list, and that each counter's row
is one of the server's IDs: a client whose list is reordered, shorter or
longer would hand out IDs twice, so it refuses to run.

Upgrading servers set up by a version that used ``REPLACE INTO
tickets.tickets_<counter>``: deploy this version to the clients first (while
a counter has no row, they take IDs the old way, from the same table), then
run ``store tickets init`` once with the same server list. Per counter and
server it swaps ``tickets_<counter>`` for a view in one RENAME TABLE (which
waits for the REPLACEs running; every later REPLACE meets the view and fails
with error 1471), keeps the old table as ``tickets.replaced_<counter>``, and
starts the row above that table's AUTO_INCREMENT counter. From then on an old
client's every call fails instead of handing out an ID twice, and a client
of this version switches to the row at its next call. Run ``store tickets
init`` again whenever in doubt: it changes nothing once done, and an older
version's init meets the view and leaves it alone.

Calls go round robin. A call to a server is bounded by ``timeout_s``
(connect, every read and write, and the wait for a pooled connection); a
server that cannot be reached, loses the connection or times out is skipped
for ``retry_after_s`` and the call goes to the next server. IDs are unique
and dense per server (but for the gaps above) and only roughly ordered across
servers.

Block reservation: with ``block = B``, ticket T stands for the IDs
``T*B .. T*B + B - 1``, handed out from memory; one round trip per B IDs.
Every client of a counter must use the same B: ``store tickets init``
records it on each server and clients check it.
"""

from __future__ import annotations

import itertools
import random
import threading
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import URL, make_url

from store import green
from store.backends.mysql.driver import mysql_connector, mysql_driver_error
from store.cache.stats import Breaker
from store.config import TicketsConfig
from store.exceptions import BackendError, TicketError
from store.forks import at_fork
from store.pool import ConnectionPool

__all__ = ["ServerStats", "TicketAllocator", "TicketError", "TicketsConfig"]

TICKETS_DATABASE = "tickets"
#: The table of counter rows: one per counter on each server.
IDS_TABLE = "ticket_ids"
# When each counter's row was made, and its first ID: a row missing where
# this says one was made was deleted by hand, and init must not start it again.
_SWITCHES_TABLE = "ticket_switches"
# DDL can take seconds on a busy server; `store tickets init` is run by hand,
# so it waits longer than an ID request does.
INIT_TIMEOUT_S = 30.0
# How long init's RENAME waits for the metadata lock of a counter's REPLACE
# table. Old clients' new REPLACEs queue behind the waiting RENAME, so it
# must not wait for long behind someone's open transaction.
INIT_LOCK_WAIT_S = 10
# Two inits at once on one server would both fold the REPLACE table into the
# row; the second waits for the first.
_INIT_LOCK = "store_tickets_init"
# A lock wait that times out (1205) rolls the UPDATE back, its ID unused:
# running it again is safe, and sending it to another server instead would
# skew the odd/even split. Deadlocks (1213) happen only on the REPLACE path
# (still used by a counter not yet switched) or against someone's own
# transaction on the row.
CONTENTION_ATTEMPTS = 6
CONTENTION_BACKOFF_S = 0.001
_CONTENTION = frozenset({1205, 1213})
# 1049 unknown database, 1146 unknown table: `store tickets init` has not run.
_MISSING = frozenset({1049, 1146})
# 1471: a REPLACE met the view `store tickets init` puts where the REPLACE
# table was: the counter row is the counter now.
_SWITCHED = 1471
# Server errors (1000-1999 are the server's own) that still mean the
# connection is going away: shutdown (1053, 1077-1080), aborted or broken
# connection (1152, 1154-1161, 1184), killed (1927).
_SERVER_GOING_AWAY = frozenset(
    {1053, 1077, 1078, 1079, 1080, 1152, 1154, 1155, 1156, 1157, 1158, 1159, 1160, 1161, 1184, 1927}
)


def _place_sql(db: str) -> str:
    return (
        "SELECT `auto_increment_increment`, `auto_increment_offset` "
        f"FROM `{db}`.`ticket_server` WHERE `one` = 1"
    )


def _row_sql(db: str) -> str:
    return f"SELECT `next_id` FROM `{db}`.`{IDS_TABLE}` WHERE `counter` = %s"


class _ServerDownError(Exception):
    """The server cannot be reached, lost the connection or timed out: skip it for a while."""


class _ReplyLostError(_ServerDownError):
    """The connection failed after the ID statement was sent: it may have committed (a gap)."""


class _ContendedError(Exception):
    """Every attempt on the server deadlocked or waited for a lock too long."""


@dataclass(frozen=True, slots=True)
class ServerStats:
    """One ticket server as this client sees it."""

    server: str  #: "server 2 (URL)", the password masked
    served: int  #: tickets handed out
    failures: int  #: connection-level failures; each one skipped the server for retry_after_s
    retries: int  #: deadlocks and lock waits met here, retried on this server (never failures)
    available: bool  #: False while the server is skipped after a failure
    #: ID statements whose reply was lost (among the failures): each may have used a ticket no one got
    unknown: int = 0


@dataclass(frozen=True, slots=True)
class _Statement:
    """How one counter takes an ID on one server."""

    sql: str
    replace: bool  # the REPLACE path of a server `store tickets init` has not switched yet


@dataclass
class _Server:
    index: int
    label: str  # for messages: never holds the password
    url: URL
    pool: ConnectionPool
    breaker: Breaker
    driver_error: type[Exception]
    stats_lock: threading.Lock = field(default_factory=threading.Lock)
    served: int = 0
    failures: int = 0
    retries: int = 0
    unknown: int = 0
    placed: bool = False  # the recorded place matched this client's list
    checked: set[str] = field(default_factory=set)  # counters whose block size matched
    statements: dict[str, _Statement] = field(default_factory=dict)  # counter -> its checked statement


def _connector(url: URL, timeout_s: float, setup: str | None) -> tuple[Callable[[], Any], type[Exception]]:
    """A function that opens a connection whose every wait ends after ``timeout_s``; the driver's error class.

    The store's default reply timeout would stall an ID request that long on
    a hung server; the error class tells driver errors from bugs.
    """
    try:
        connect = mysql_connector(url, connect_timeout_s=timeout_s, query_timeout_s=timeout_s, setup=setup)
        return connect, mysql_driver_error(url)
    except BackendError as exc:
        raise TicketError(f"tickets.servers: {exc}") from exc


def _code(exc: BaseException) -> int | None:
    """The MariaDB error number of a driver error, if it carries one."""
    args = getattr(exc, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def _lost_connection(exc: BaseException) -> bool:
    """True for an error that says nothing about the SQL and everything about the connection."""
    code = _code(exc)
    return code is None or not 1000 <= code < 2000 or code in _SERVER_GOING_AWAY


def _first_above(high: int, offset: int, n: int) -> int:
    """The smallest ID above ``high`` of the server at ``offset`` of ``n`` (offset, offset + n, ...)."""
    return high + 1 + (offset - (high + 1)) % n


def _replace_sql(db: str, counter: str) -> str:
    return f"REPLACE INTO `{db}`.`tickets_{counter}` (stub) VALUES ('a')"


def _update_sql(db: str, counter: str, n: int) -> str:
    # LAST_INSERT_ID(expr) puts the row's value in the statement's own reply
    # (the OK packet's insert id): one round trip per ID. The counter name is
    # checked by the config ([a-z_][a-z0-9_]*), so it is safe as a literal.
    return (
        f"UPDATE `{db}`.`{IDS_TABLE}` SET `next_id` = LAST_INSERT_ID(`next_id`) + {n} "
        f"WHERE `counter` = '{counter}'"
    )


class TicketAllocator:
    """Hands out IDs from the ticket servers, round robin, skipping servers that fail."""

    def __init__(self, config: TicketsConfig) -> None:
        self.config = config
        #: The counters' database on each server (``NAME_tickets`` in a namespace).
        self._db = config.database
        n = len(config.servers)
        self._servers = [self._server(i, url, n) for i, url in enumerate(config.servers)]
        self._turn = itertools.count()
        self._blocks: dict[str, list[int]] = {}  # counter -> [next id, end]
        self._lock = threading.Lock()
        # Set when a server's recorded place contradicts this client's list:
        # such a client would hand out IDs twice, so it hands out none at all.
        self._refused: str | None = None
        at_fork(self, TicketAllocator._after_fork)

    def _after_fork(self) -> None:
        """In a forked child: no block of IDs (the parent hands out the rest of its blocks: were
        the child to go on from them too, both would hand out the same IDs), locks of its own.
        Each server's pool resets itself (`store.pool`)."""
        self._lock = threading.Lock()
        self._blocks = {}
        for server in self._servers:
            server.stats_lock = threading.Lock()

    @property
    def _init_lock(self) -> str:
        """The server-wide lock of `init` (one per tickets database)."""
        return _INIT_LOCK if self._db == TICKETS_DATABASE else f"{_INIT_LOCK}:{self._db}"

    def _server(self, index: int, url: str, n: int) -> _Server:
        parsed = make_url(url)
        label = f"server {index + 1} ({parsed.render_as_string(hide_password=True)})"
        # For the REPLACE path of counters not yet switched to their row.
        setup = f"SET SESSION auto_increment_increment = {n}, auto_increment_offset = {index + 1}"
        connect, driver_error = _connector(parsed, self.config.timeout_s, setup)
        return _Server(
            index,
            label,
            parsed,
            ConnectionPool(connect, name=f"ticket {label}", timeout_s=self.config.timeout_s),
            Breaker(failures_to_trip=1, cooldown_s=self.config.retry_after_s),
            driver_error,
        )

    # -- provisioning --------------------------------------------------------

    def init(self) -> None:
        """Set up every server: its place, block size and counter rows; switch REPLACE tables (idempotent).

        Records on each server its place in this list
        (``auto_increment_increment`` = number of servers,
        ``auto_increment_offset`` = its position from 1) in
        ``tickets.ticket_server`` and sets both as GLOBAL defaults. Changes
        nothing if any server was set up at another place before: moving a
        server would make it hand out IDs that another server already did.
        A counter's REPLACE table (made by an earlier version, or made here
        so that an earlier version's init finds one) is swapped for a view
        that refuses REPLACE, and its row starts above the table's
        AUTO_INCREMENT counter: see the module docstring, "Upgrading".
        """
        conns: list[tuple[_Server, Any]] = []
        try:
            for server in self._servers:
                connect, _error = _connector(server.url, max(self.config.timeout_s, INIT_TIMEOUT_S), None)
                try:
                    conns.append((server, connect()))
                except (server.driver_error, OSError) as exc:
                    raise TicketError(f"cannot connect to ticket {server.label}: {exc}") from exc
            # First check every server, then change any: a wrong list must
            # not leave some servers set up at a place the others contradict.
            for set_up in (False, True):
                for server, conn in conns:
                    cur = conn.cursor()
                    try:
                        if set_up:
                            self._set_up(cur, server)
                        else:
                            self._check_recorded_place(cur, server)
                    except (server.driver_error, OSError) as exc:
                        raise TicketError(f"setting up ticket {server.label} failed: {exc}") from exc
                    finally:
                        cur.close()
        finally:
            for _server, conn in conns:
                with suppress(Exception):
                    conn.close()

    def _check_recorded_place(self, cur: Any, server: _Server) -> None:
        row = self._read_place(cur, server)
        if row is not None:  # None: never set up, init records its place
            self._check_place(server, row, by_init=True)

    def _read_place(self, cur: Any, server: _Server) -> tuple[int, int] | None:
        """The (increment, offset) recorded on ``server``, or None if `store tickets init` never ran there."""
        try:
            cur.execute(_place_sql(self._db))
            row = cur.fetchone()
        except server.driver_error as exc:
            if _code(exc) not in _MISSING:
                raise
            return None
        return None if row is None else (int(row[0]), int(row[1]))

    def _set_up(self, cur: Any, server: _Server) -> None:
        n, offset = len(self._servers), server.index + 1
        cur.execute("SELECT GET_LOCK(%s, %s)", (self._init_lock, INIT_TIMEOUT_S))
        if cur.fetchone()[0] != 1:
            raise TicketError(
                f"another `store tickets init` has held ticket {server.label} for {INIT_TIMEOUT_S:g} s: "
                "let it finish, then run this one again"
            )
        try:
            cur.execute(f"SET SESSION lock_wait_timeout = {INIT_LOCK_WAIT_S}")
            self._set_up_locked(cur, server, n, offset)
        finally:
            # Closing the connection releases it too: a failure here must not
            # hide the one that brought us here.
            with suppress(server.driver_error, OSError):
                cur.execute("DO RELEASE_LOCK(%s)", (self._init_lock,))

    def _set_up_locked(self, cur: Any, server: _Server, n: int, offset: int) -> None:
        cur.execute(f"CREATE DATABASE IF NOT EXISTS `{self._db}`")
        cur.execute(
            f"CREATE TABLE IF NOT EXISTS `{self._db}`.`ticket_server` ("
            "`one` TINYINT UNSIGNED NOT NULL DEFAULT 1 PRIMARY KEY CHECK (`one` = 1), "
            "`auto_increment_increment` INT UNSIGNED NOT NULL, "
            "`auto_increment_offset` INT UNSIGNED NOT NULL, "
            "`recorded_at` TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP) ENGINE=InnoDB"
        )
        cur.execute(
            f"INSERT IGNORE INTO `{self._db}`.`ticket_server` "
            "(`one`, `auto_increment_increment`, `auto_increment_offset`) VALUES (1, %s, %s)",
            (n, offset),
        )
        # Another init with another list may have won the race since the check.
        self._verify_place(cur, server, by_init=True)
        cur.execute(
            f"CREATE TABLE IF NOT EXISTS `{self._db}`.`ticket_counters` ("
            "`counter` VARCHAR(64) NOT NULL PRIMARY KEY, `block` INT NOT NULL) ENGINE=InnoDB"
        )
        cur.execute(
            f"CREATE TABLE IF NOT EXISTS `{self._db}`.`{IDS_TABLE}` ("
            "`counter` VARCHAR(64) NOT NULL PRIMARY KEY, `next_id` BIGINT UNSIGNED NOT NULL) ENGINE=InnoDB"
        )
        cur.execute(
            f"CREATE TABLE IF NOT EXISTS `{self._db}`.`{_SWITCHES_TABLE}` ("
            "`counter` VARCHAR(64) NOT NULL PRIMARY KEY, `first_id` BIGINT UNSIGNED NOT NULL, "
            "`switched_at` TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP) ENGINE=InnoDB"
        )
        for counter in self.config.counters:
            cur.execute(
                f"INSERT IGNORE INTO `{self._db}`.`ticket_counters` (counter, block) VALUES (%s, %s)",
                (counter, self.config.block),
            )
            self._check_block(cur, server, counter)
            self._switch_counter(cur, server, counter, n, offset)
        cur.execute("SELECT @@GLOBAL.auto_increment_increment, @@GLOBAL.auto_increment_offset")
        row = cur.fetchone()
        if (int(row[0]), int(row[1])) == (n, offset):
            return  # already so (e.g. from my.cnf): SET GLOBAL would need a privilege for nothing
        try:
            cur.execute(f"SET GLOBAL auto_increment_increment = {n}, auto_increment_offset = {offset}")
        except server.driver_error as exc:
            raise TicketError(
                f"cannot set the GLOBAL auto_increment_increment = {n}, auto_increment_offset = {offset} "
                f"of ticket {server.label}: {exc}; run `store tickets init` as a user with SUPER "
                "(or SYSTEM_VARIABLES_ADMIN), or put both in the server's my.cnf and restart it"
            ) from exc

    def _switch_counter(self, cur: Any, server: _Server, counter: str, n: int, offset: int) -> None:
        """Make ``counter``'s row the counter on ``server``, above every ID its REPLACE table handed out."""
        db, old, kept, view = (
            self._db,
            f"tickets_{counter}",
            f"replaced_{counter}",
            f"tombstone_{counter}",
        )
        # The table an earlier version's init makes, made here too when it is
        # missing: every counter then goes through the same swap, and the view
        # left in its place stops an earlier version's init from making a new
        # REPLACE table that would count from 1 again (on a view, CREATE TABLE
        # IF NOT EXISTS changes nothing).
        cur.execute(
            f"CREATE TABLE IF NOT EXISTS `{db}`.`{old}` ("
            "`id` BIGINT UNSIGNED NOT NULL AUTO_INCREMENT, `stub` CHAR(1) NOT NULL DEFAULT '', "
            "PRIMARY KEY (`id`), UNIQUE KEY `stub` (`stub`)) ENGINE=InnoDB"
        )
        kinds = self._table_kinds(cur, (old, kept))
        if kinds.get(old) == "BASE TABLE":
            if kept in kinds:
                raise TicketError(
                    f"ticket {server.label} has both {db}.{old} (a REPLACE table, made after the switch to "
                    f"counter rows) and {db}.{kept} (the one the switch kept): IDs may have been handed out "
                    f"from both; rename {db}.{kept} away only after moving the {db}.{IDS_TABLE} row of "
                    f"{counter!r} above both tables' AUTO_INCREMENT, then run `store tickets init` again"
                )
            cur.execute(
                f"CREATE OR REPLACE SQL SECURITY INVOKER VIEW `{db}`.`{view}` AS SELECT "
                f"'IDs of {counter} come from {db}.{IDS_TABLE} since store tickets init: "
                "upgrade this client' AS `replaced_by`"
            )
            # One statement: it waits for the REPLACEs running, and every
            # later REPLACE meets the view (error 1471), so no old client can
            # take an ID after the AUTO_INCREMENT read below.
            cur.execute(f"RENAME TABLE `{db}`.`{old}` TO `{db}`.`{kept}`, `{db}`.`{view}` TO `{db}`.`{old}`")
            kinds[kept] = "BASE TABLE"
        elif kinds.get(old) != "VIEW":
            raise TicketError(
                f"ticket {server.label}: {db}.{old} is a {kinds.get(old)}, not the REPLACE table of "
                f"{counter!r} nor the view that replaces it: rename it away, then run `store tickets init` "
                "again"
            )
        cur.execute(_row_sql(self._db), (counter,))
        if cur.fetchone() is None:
            cur.execute(
                f"SELECT `switched_at` FROM `{db}`.`{_SWITCHES_TABLE}` WHERE `counter` = %s", (counter,)
            )
            switched = cur.fetchone()
            if switched is not None or kept not in kinds:
                since = "" if switched is None else f", made {switched[0]} and deleted since"
                raise TicketError(
                    f"ticket {server.label} has no {db}.{IDS_TABLE} row for {counter!r}{since}: the highest "
                    f"ID it handed out is unknown, so init will not start the counter again; insert the row "
                    f"by hand, next_id above every ID of {counter!r} and equal to {offset} modulo {n}"
                )
        if kept not in kinds:
            return
        # The table no longer changes: every ID it handed out is below its
        # AUTO_INCREMENT counter (rolled-back REPLACEs moved it on too) and
        # at most its one row's id.
        cur.execute(
            "SELECT `AUTO_INCREMENT` FROM information_schema.TABLES "
            "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
            (db, kept),
        )
        auto_increment = cur.fetchone()[0] or 1
        cur.execute(f"SELECT COALESCE(MAX(`id`), 0) FROM `{db}`.`{kept}`")
        first = _first_above(max(int(auto_increment) - 1, int(cur.fetchone()[0])), offset, n)
        # GREATEST: a row already there has moved on from its start; never back.
        # The record of the switch commits with the row, or neither does.
        cur.execute("START TRANSACTION")
        cur.execute(
            f"INSERT INTO `{db}`.`{IDS_TABLE}` (`counter`, `next_id`) VALUES (%s, %s) "
            "ON DUPLICATE KEY UPDATE `next_id` = GREATEST(`next_id`, VALUES(`next_id`))",
            (counter, first),
        )
        cur.execute(
            f"INSERT IGNORE INTO `{db}`.`{_SWITCHES_TABLE}` (`counter`, `first_id`) VALUES (%s, %s)",
            (counter, first),
        )
        cur.execute("COMMIT")

    def _table_kinds(self, cur: Any, names: tuple[str, ...]) -> dict[str, str]:
        """TABLE_TYPE ('BASE TABLE', 'VIEW', ...) of those of ``names`` that exist in the tickets database."""
        marks = ", ".join(["%s"] * len(names))
        cur.execute(
            "SELECT TABLE_NAME, TABLE_TYPE FROM information_schema.TABLES "
            f"WHERE TABLE_SCHEMA = %s AND TABLE_NAME IN ({marks})",
            (self._db, *names),
        )
        return {str(name): str(kind) for name, kind in cur.fetchall()}

    def _verify_place(self, cur: Any, server: _Server, *, by_init: bool = False) -> None:
        """Check the place recorded on ``server`` against this client's list (once per server)."""
        row = self._read_place(cur, server)
        if row is None:
            raise TicketError(
                f"ticket {server.label} has no recorded place (no tickets.ticket_server row): "
                "run `store tickets init` with the full server list"
            )
        self._check_place(server, row, by_init=by_init)
        server.placed = True

    def _check_place(self, server: _Server, row: tuple[int, int], *, by_init: bool) -> None:
        increment, offset = row
        n, position = len(self._servers), server.index + 1
        if (increment, offset) == (n, position):
            return
        if increment == n:
            fix = "put the servers in the same order as when they were initialised"
        else:
            fix = (
                f"list all {increment} servers, in the order they were initialised "
                f"(a different number of servers needs every counter's {self._db}.{IDS_TABLE} row "
                "moved past the highest ID handed out, into the server's new place, and "
                "tickets.ticket_server emptied, before `store tickets init`)"
            )
        message = (
            f"ticket {server.label} was set up as offset {offset} of {increment} by `store tickets init`; "
            f"this client lists it at position {position} of {n}: {fix}"
        )
        if not by_init:
            self._refused = message
        raise TicketError(message)

    def _check_block(self, cur: Any, server: _Server, counter: str) -> None:
        cur.execute(f"SELECT block FROM `{self._db}`.`ticket_counters` WHERE counter = %s", (counter,))
        row = cur.fetchone()
        if row is None:
            raise TicketError(
                f"counter {counter!r} is not set up on ticket {server.label}: run `store tickets init`"
            )
        if int(row[0]) != self.config.block:
            raise TicketError(
                f"counter {counter!r} was set up with block {row[0]} on ticket {server.label}, this client "
                f"uses {self.config.block}: mixing block sizes would hand out IDs twice"
            )
        server.checked.add(counter)

    def _statement(self, cur: Any, server: _Server, counter: str) -> _Statement:
        """How ``counter`` takes an ID on ``server``: its row, or the REPLACE table until init switches it."""
        if counter not in server.checked:
            self._check_block(cur, server, counter)
        n, offset = len(self._servers), server.index + 1
        try:
            cur.execute(_row_sql(self._db), (counter,))
            row = cur.fetchone()
        except server.driver_error as exc:
            if _code(exc) != 1146:
                raise
            row = None  # set up by a version before counter rows
        if row is None:
            statement = _Statement(_replace_sql(self._db, counter), replace=True)
        elif int(row[0]) % n != offset % n:
            raise TicketError(
                f"the {self._db}.{IDS_TABLE} row of {counter!r} on ticket {server.label} is at "
                f"{row[0]}, not one of this server's IDs ({offset} modulo {n}): it was changed by hand; "
                f"move it up to the next such value, never down"
            )
        else:
            statement = _Statement(_update_sql(self._db, counter, n), replace=False)
        server.statements[counter] = statement
        return statement

    # -- handing out IDs -------------------------------------------------------

    def next(self, counter: str = "default") -> int:
        """One new ID from ``counter``."""
        if self.config.block == 1:
            return self._ticket(counter)
        with self._lock:
            span = self._blocks.get(counter)
            if span is None or span[0] >= span[1]:
                ticket = self._ticket(counter)
                span = self._blocks[counter] = [ticket * self.config.block, (ticket + 1) * self.config.block]
            value = span[0]
            span[0] += 1
            return value

    def next_many(self, counter: str = "default", n: int = 1) -> list[int]:
        """``n`` new IDs from ``counter``."""
        if not isinstance(n, int) or n < 1:
            raise TicketError(f"n must be a positive int, got {n!r}")
        return [self.next(counter) for _ in range(n)]

    def _ticket(self, counter: str) -> int:
        if counter not in self.config.counters:
            raise TicketError(f"unknown counter {counter!r}; configured: {', '.join(self.config.counters)}")
        if self._refused is not None:
            raise TicketError(self._refused)
        n = len(self._servers)
        start = next(self._turn)
        errors: list[str] = []
        tried: set[int] = set()
        # Two passes: first the servers that are up, then (if all were
        # skipped) the skipped ones, so a recovered server is found at once.
        # A server that failed in this call is not asked twice: a hung one
        # would stall the call for another timeout_s.
        for attempt in range(2 * n):
            server = self._servers[(start + attempt) % n]
            if server.index in tried or (attempt < n and not server.breaker.allow()):
                continue
            tried.add(server.index)
            try:
                value = self._take(server, counter)
            except _ServerDownError as exc:
                server.breaker.failure()
                with server.stats_lock:
                    server.failures += 1
                    server.unknown += isinstance(exc, _ReplyLostError)
                errors.append(str(exc))
                continue
            except _ContendedError as exc:
                errors.append(str(exc))  # busy, not broken: the breaker stays closed
                continue
            server.breaker.success()
            with server.stats_lock:
                server.served += 1
            return value
        raise TicketError(f"no ticket server answered for {counter!r}: " + "; ".join(errors))

    def _take(self, server: _Server, counter: str) -> int:
        try:
            conn, born = server.pool.checkout()
        except Exception as exc:  # the driver's, or the pool's wait for a free connection
            raise _ServerDownError(f"cannot connect to ticket {server.label}: {exc}") from exc
        try:
            cur = conn.cursor()
            if not server.placed:
                self._verify_place(cur, server)
            value = self._take_retrying(cur, server, counter)
            cur.close()
        except (TicketError, _ContendedError):
            server.pool.checkin(conn, born)
            raise
        except _ReplyLostError:
            server.pool.discard(conn, disconnected=True)
            raise
        except (server.driver_error, OSError) as exc:
            if isinstance(exc, OSError) or _lost_connection(exc):
                server.pool.discard(conn, disconnected=True)
                raise _ServerDownError(f"ticket {server.label} failed: {exc}") from exc
            # The server answered: the connection is fine, the SQL is not.
            server.pool.checkin(conn, born)
            hint = ": run `store tickets init`" if _code(exc) in _MISSING else ""
            raise TicketError(f"ticket {server.label} refused the ticket query: {exc}{hint}") from exc
        except BaseException:
            server.pool.discard(conn)
            raise
        server.pool.checkin(conn, born)
        if not value:
            raise TicketError(f"ticket {server.label} returned no id for {counter!r}")
        return int(value)

    def _take_retrying(self, cur: Any, server: _Server, counter: str) -> Any:
        for attempt in range(CONTENTION_ATTEMPTS):
            statement = server.statements.get(counter) or self._statement(cur, server, counter)
            try:
                cur.execute(statement.sql)
            except (server.driver_error, OSError) as exc:
                if isinstance(exc, OSError) or _lost_connection(exc):
                    raise _ReplyLostError(f"ticket {server.label} failed: {exc}") from exc
                code = _code(exc)
                if statement.replace and code == _SWITCHED:
                    # `store tickets init` swapped the table for its view
                    # since this client looked; the row is the counter now
                    # (or will be in a moment: init writes it right after).
                    server.statements.pop(counter, None)
                elif code in _CONTENTION:
                    with server.stats_lock:
                        server.retries += 1
                else:
                    raise
                if attempt + 1 == CONTENTION_ATTEMPTS:
                    raise _ContendedError(
                        f"ticket {server.label}: {CONTENTION_ATTEMPTS} deadlocks, lock waits or switches "
                        f"in a row on {counter!r}: {exc}"
                    ) from exc
                # Jittered, doubling: the colliding sessions should not meet again.
                green.sleep(CONTENTION_BACKOFF_S * 2**attempt * random.uniform(0.5, 1.0))
                continue
            if not statement.replace and cur.rowcount != 1:
                raise TicketError(
                    f"ticket {server.label} has no {self._db}.{IDS_TABLE} row for {counter!r} any "
                    "more (deleted by hand?): the highest ID it handed out is unknown; insert the row again "
                    "with next_id above every ID of the counter"
                )
            return cur.lastrowid  # LAST_INSERT_ID(), from the same round trip
        raise AssertionError("unreachable")  # the loop returns or raises

    def served(self) -> list[int]:
        """How many tickets each server handed out (in config order)."""
        return [s.served for s in self._servers]

    def stats(self) -> list[ServerStats]:
        """Per server (in config order): served, failures, retries, lost replies, whether it is skipped."""
        return [
            ServerStats(s.label, s.served, s.failures, s.retries, s.breaker.allow(), s.unknown)
            for s in self._servers
        ]

    def close(self) -> None:
        """Close every idle connection."""
        for s in self._servers:
            s.pool.clear()
