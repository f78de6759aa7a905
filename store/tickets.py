"""Flickr-style ticket servers: dense, unique 64-bit IDs from two (or more) MariaDB servers.

Each counter (photos, accounts, ...) is a table with one row per server::

    CREATE TABLE tickets.tickets_photos (
      id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT, stub CHAR(1) NOT NULL DEFAULT '',
      PRIMARY KEY (id), UNIQUE KEY (stub));
    REPLACE INTO tickets.tickets_photos (stub) VALUES ('a');   -- and LAST_INSERT_ID()

With N servers, server i (from 1) runs its sessions with
``auto_increment_increment = N`` and ``auto_increment_offset = i``, so with
two servers one hands out odd IDs and the other even ones.

The place of a server is fixed by ``store tickets init`` (`TicketAllocator.init`):
it records N and i in ``tickets.ticket_server`` on that server and sets them
as the server's GLOBAL defaults, so that other clients of the server behave
too (GLOBAL values do not survive a restart: put them in the server's
my.cnf as well). A client sets the session values itself, from its own list,
and before the first ID from a server it checks that the recorded place
matches that list: a client whose list is reordered, shorter or longer would
hand out IDs twice, so it refuses to run.

Calls go round robin. A call to a server is bounded by ``timeout_s``
(connect, every read and write, and the wait for a pooled connection); a
server that cannot be reached, loses the connection or times out is skipped
for ``retry_after_s`` and the call goes to the next server. Its counter lives
in InnoDB and survives a restart, so an ID is never handed out twice; an ID
whose REPLACE committed but whose reply was lost is simply never handed out
(a gap). A deadlock or lock wait between concurrent REPLACEs is normal on a
healthy server: it is retried on the same server and is not a failure. IDs
are unique and dense per server but only roughly ordered across servers.

Block reservation: with ``block = B``, ticket T stands for the IDs
``T*B .. T*B + B - 1``, handed out from memory; one round trip per B IDs.
Every client of a counter must use the same B: ``store tickets init``
records it on each server and clients check it.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import URL, make_url

from store.backends.mysql import mysql_connector, mysql_driver_error
from store.cache.stats import Breaker
from store.config import TicketsConfig
from store.exceptions import BackendError, TicketError
from store.pool import ConnectionPool

__all__ = ["ServerStats", "TicketAllocator", "TicketError", "TicketsConfig"]

TICKETS_DATABASE = "tickets"
# DDL can take seconds on a busy server; `store tickets init` is run by hand,
# so it waits longer than an ID request does.
INIT_TIMEOUT_S = 30.0
# Concurrent REPLACEs of the one stub row deadlock (1213) or wait for a lock
# (1205) now and then on a healthy server. InnoDB has rolled the statement
# back, so running it again is safe; sending it to another server instead
# would skew the odd/even split and leave gaps.
CONTENTION_ATTEMPTS = 6
CONTENTION_BACKOFF_S = 0.001
_CONTENTION = frozenset({1205, 1213})
# 1049 unknown database, 1146 unknown table: `store tickets init` has not run.
_MISSING = frozenset({1049, 1146})
# Server errors (1000-1999 are the server's own) that still mean the
# connection is going away: shutdown (1053, 1077-1080), aborted or broken
# connection (1152, 1154-1161, 1184), killed (1927).
_SERVER_GOING_AWAY = frozenset(
    {1053, 1077, 1078, 1079, 1080, 1152, 1154, 1155, 1156, 1157, 1158, 1159, 1160, 1161, 1184, 1927}
)
_PLACE_SQL = (
    "SELECT `auto_increment_increment`, `auto_increment_offset` "
    f"FROM `{TICKETS_DATABASE}`.`ticket_server` WHERE `one` = 1"
)


class _ServerDownError(Exception):
    """The server cannot be reached, lost the connection or timed out: skip it for a while."""


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
    placed: bool = False  # the recorded place matched this client's list
    checked: set[str] = field(default_factory=set)  # counters whose block size matched


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


class TicketAllocator:
    """Hands out IDs from the ticket servers, round robin, skipping servers that fail."""

    def __init__(self, config: TicketsConfig) -> None:
        self.config = config
        n = len(config.servers)
        self._servers = [self._server(i, url, n) for i, url in enumerate(config.servers)]
        self._turn = itertools.count()
        self._blocks: dict[str, list[int]] = {}  # counter -> [next id, end]
        self._lock = threading.Lock()
        # Set when a server's recorded place contradicts this client's list:
        # such a client would hand out IDs twice, so it hands out none at all.
        self._refused: str | None = None

    def _server(self, index: int, url: str, n: int) -> _Server:
        parsed = make_url(url)
        label = f"server {index + 1} ({parsed.render_as_string(hide_password=True)})"
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
        """Set up every server: its place, the counter tables and block size (idempotent).

        Records on each server its place in this list
        (``auto_increment_increment`` = number of servers,
        ``auto_increment_offset`` = its position from 1) in
        ``tickets.ticket_server`` and sets both as GLOBAL defaults. Changes
        nothing if any server was set up at another place before: moving a
        server would make it hand out IDs that another server already did.
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
            cur.execute(_PLACE_SQL)
            row = cur.fetchone()
        except server.driver_error as exc:
            if _code(exc) not in _MISSING:
                raise
            return None
        return None if row is None else (int(row[0]), int(row[1]))

    def _set_up(self, cur: Any, server: _Server) -> None:
        n, offset = len(self._servers), server.index + 1
        cur.execute(f"CREATE DATABASE IF NOT EXISTS `{TICKETS_DATABASE}`")
        cur.execute(
            f"CREATE TABLE IF NOT EXISTS `{TICKETS_DATABASE}`.`ticket_server` ("
            "`one` TINYINT UNSIGNED NOT NULL DEFAULT 1 PRIMARY KEY CHECK (`one` = 1), "
            "`auto_increment_increment` INT UNSIGNED NOT NULL, "
            "`auto_increment_offset` INT UNSIGNED NOT NULL, "
            "`recorded_at` TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP) ENGINE=InnoDB"
        )
        cur.execute(
            f"INSERT IGNORE INTO `{TICKETS_DATABASE}`.`ticket_server` "
            "(`one`, `auto_increment_increment`, `auto_increment_offset`) VALUES (1, %s, %s)",
            (n, offset),
        )
        # Another init with another list may have won the race since the check.
        self._verify_place(cur, server, by_init=True)
        cur.execute(
            f"CREATE TABLE IF NOT EXISTS `{TICKETS_DATABASE}`.`ticket_counters` ("
            "`counter` VARCHAR(64) NOT NULL PRIMARY KEY, `block` INT NOT NULL) ENGINE=InnoDB"
        )
        for counter in self.config.counters:
            cur.execute(
                f"CREATE TABLE IF NOT EXISTS `{TICKETS_DATABASE}`.`tickets_{counter}` ("
                "`id` BIGINT UNSIGNED NOT NULL AUTO_INCREMENT, `stub` CHAR(1) NOT NULL DEFAULT '', "
                "PRIMARY KEY (`id`), UNIQUE KEY `stub` (`stub`)) ENGINE=InnoDB"
            )
            cur.execute(
                f"INSERT IGNORE INTO `{TICKETS_DATABASE}`.`ticket_counters` (counter, block) VALUES (%s, %s)",
                (counter, self.config.block),
            )
            self._check_block(cur, server, counter)
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
                f"(a different number of servers needs every counter's AUTO_INCREMENT moved past "
                "the highest ID handed out, and tickets.ticket_server emptied, before `store tickets init`)"
            )
        message = (
            f"ticket {server.label} was set up as offset {offset} of {increment} by `store tickets init`; "
            f"this client lists it at position {position} of {n}: {fix}"
        )
        if not by_init:
            self._refused = message
        raise TicketError(message)

    def _check_block(self, cur: Any, server: _Server, counter: str) -> None:
        cur.execute(
            f"SELECT block FROM `{TICKETS_DATABASE}`.`ticket_counters` WHERE counter = %s", (counter,)
        )
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
                value = self._replace(server, counter)
            except _ServerDownError as exc:
                server.breaker.failure()
                with server.stats_lock:
                    server.failures += 1
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

    def _replace(self, server: _Server, counter: str) -> int:
        try:
            conn, born = server.pool.checkout()
        except Exception as exc:  # the driver's, or the pool's wait for a free connection
            raise _ServerDownError(f"cannot connect to ticket {server.label}: {exc}") from exc
        try:
            cur = conn.cursor()
            if not server.placed:
                self._verify_place(cur, server)
            if counter not in server.checked:
                self._check_block(cur, server, counter)
            value = self._replace_retrying(cur, server, counter)
            cur.close()
        except (TicketError, _ContendedError):
            server.pool.checkin(conn, born)
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

    def _replace_retrying(self, cur: Any, server: _Server, counter: str) -> Any:
        sql = f"REPLACE INTO `{TICKETS_DATABASE}`.`tickets_{counter}` (stub) VALUES ('a')"
        for attempt in range(CONTENTION_ATTEMPTS):
            try:
                cur.execute(sql)
                return cur.lastrowid  # LAST_INSERT_ID(), from the same round trip
            except server.driver_error as exc:
                if _code(exc) not in _CONTENTION:
                    raise
                with server.stats_lock:
                    server.retries += 1
                if attempt + 1 == CONTENTION_ATTEMPTS:
                    raise _ContendedError(
                        f"ticket {server.label}: {CONTENTION_ATTEMPTS} deadlocks or lock waits in a row "
                        f"on {counter!r}: {exc}"
                    ) from exc
                # Jittered, doubling: the colliding sessions should not meet again.
                time.sleep(CONTENTION_BACKOFF_S * 2**attempt * random.uniform(0.5, 1.0))
        raise AssertionError("unreachable")  # the loop returns or raises

    def served(self) -> list[int]:
        """How many tickets each server handed out (in config order)."""
        return [s.served for s in self._servers]

    def stats(self) -> list[ServerStats]:
        """Per server (in config order): tickets served, failures, retries, and whether it is skipped."""
        return [
            ServerStats(s.label, s.served, s.failures, s.retries, s.breaker.allow()) for s in self._servers
        ]

    def close(self) -> None:
        """Close every idle connection."""
        for s in self._servers:
            s.pool.clear()
