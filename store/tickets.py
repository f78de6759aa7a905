"""Flickr-style ticket servers: dense, unique 64-bit IDs from two (or more) MariaDB servers.

Each counter (photos, accounts, ...) is a table with one row per server::

    CREATE TABLE tickets.tickets_photos (
      id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT, stub CHAR(1) NOT NULL DEFAULT '',
      PRIMARY KEY (id), UNIQUE KEY (stub));
    REPLACE INTO tickets.tickets_photos (stub) VALUES ('a');   -- and LAST_INSERT_ID()

With N servers, server i (from 0) runs its sessions with
``auto_increment_increment = N`` and ``auto_increment_offset = i + 1``, so with
two servers one hands out odd IDs and the other even ones. The settings are
made per session by this client (the servers need no configuration); a
client that writes to these tables without them could break uniqueness.

Calls go round robin. A server that fails is skipped for ``retry_after_s``
and tried again later; its counter lives in InnoDB and survives a restart,
so an ID is never handed out twice. An ID whose REPLACE committed but whose
reply was lost is simply never handed out (a gap). IDs are unique and dense
per server but only roughly ordered across servers.

Block reservation: with ``block = B``, ticket T stands for the IDs
``T*B .. T*B + B - 1``, handed out from memory; one round trip per B IDs.
Every client of a counter must use the same B: ``store tickets init``
records it on each server and clients check it.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import make_url

from store.cache.stats import Breaker
from store.config import TicketsConfig
from store.engines import mysql_connector
from store.exceptions import BackendError, StoreError
from store.pool import ConnectionPool

__all__ = ["TicketAllocator", "TicketError", "TicketsConfig"]

TICKETS_DATABASE = "tickets"


class TicketError(StoreError):
    """No ticket server could hand out an ID, or the servers disagree on their setup."""


@dataclass
class _Server:
    index: int
    url: str
    pool: ConnectionPool
    breaker: Breaker
    served: int = 0
    checked: set[str] = field(default_factory=set)


class TicketAllocator:
    """Hands out IDs from the ticket servers, round robin, skipping servers that fail."""

    def __init__(self, config: TicketsConfig) -> None:
        self.config = config
        n = len(config.servers)
        self._servers = [self._server(i, url, n) for i, url in enumerate(config.servers)]
        self._turn = itertools.count()
        self._blocks: dict[str, list[int]] = {}  # counter -> [next id, end]
        self._lock = threading.Lock()

    def _server(self, index: int, url: str, n: int) -> _Server:
        connect = mysql_connector(make_url(url))
        setup = f"SET SESSION auto_increment_increment = {n}, auto_increment_offset = {index + 1}"

        def open_session() -> Any:
            conn = connect()
            cur = conn.cursor()
            cur.execute(setup)
            cur.close()
            return conn

        return _Server(
            index,
            url,
            ConnectionPool(
                open_session, name=f"ticket server {index + 1} ({url})", timeout_s=self.config.timeout_s
            ),
            Breaker(failures_to_trip=1, cooldown_s=self.config.retry_after_s),
        )

    # -- provisioning --------------------------------------------------------

    def init(self) -> None:
        """Create the tickets database, one table per counter, and record the block size (idempotent)."""
        for server in self._servers:
            conn, born = server.pool.checkout()
            try:
                cur = conn.cursor()
                cur.execute(f"CREATE DATABASE IF NOT EXISTS `{TICKETS_DATABASE}`")
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
                        f"INSERT IGNORE INTO `{TICKETS_DATABASE}`.`ticket_counters` (counter, block) "
                        "VALUES (%s, %s)",
                        (counter, self.config.block),
                    )
                    self._check_block(cur, server, counter)
                cur.close()
            except BaseException:
                server.pool.discard(conn)
                raise
            server.pool.checkin(conn, born)

    def _check_block(self, cur: Any, server: _Server, counter: str) -> None:
        cur.execute(
            f"SELECT block FROM `{TICKETS_DATABASE}`.`ticket_counters` WHERE counter = %s", (counter,)
        )
        row = cur.fetchone()
        if row is None:
            raise TicketError(f"counter {counter!r} is not set up on {server.url}: run `store tickets init`")
        if int(row[0]) != self.config.block:
            raise TicketError(
                f"counter {counter!r} was set up with block {row[0]} on {server.url}, this client uses "
                f"{self.config.block}: mixing block sizes would hand out IDs twice"
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
        n = len(self._servers)
        start = next(self._turn)
        errors: list[str] = []
        # Two passes: first the servers that are up, then (if all were
        # skipped) every server, so a recovered server is found at once.
        for attempt in range(2 * n):
            server = self._servers[(start + attempt) % n]
            if attempt < n and not server.breaker.allow():
                continue
            try:
                value = self._replace(server, counter)
            except BackendError as exc:
                server.breaker.failure()
                errors.append(f"server {server.index + 1}: {exc}")
                continue
            server.breaker.success()
            server.served += 1
            return value
        raise TicketError(f"no ticket server answered for {counter!r}: " + "; ".join(errors[-n:]))

    def _replace(self, server: _Server, counter: str) -> int:
        try:
            conn, born = server.pool.checkout()
        except Exception as exc:
            raise BackendError(f"cannot connect to {server.url}: {exc}", orig=exc) from exc
        try:
            cur = conn.cursor()
            if counter not in server.checked:
                self._check_block(cur, server, counter)
            cur.execute(f"REPLACE INTO `{TICKETS_DATABASE}`.`tickets_{counter}` (stub) VALUES ('a')")
            value = cur.lastrowid  # LAST_INSERT_ID(), from the same round trip
            cur.close()
        except TicketError:
            server.pool.checkin(conn, born)
            raise
        except Exception as exc:
            server.pool.discard(conn, disconnected=True)
            raise BackendError(f"ticket server {server.url} failed: {exc}", orig=exc) from exc
        server.pool.checkin(conn, born)
        if not value:
            raise BackendError(f"ticket server {server.url} returned no id")
        return int(value)

    def served(self) -> list[int]:
        """How many tickets each server handed out (in config order)."""
        return [s.served for s in self._servers]

    def close(self) -> None:
        """Close every idle connection."""
        for s in self._servers:
            s.pool.clear()
