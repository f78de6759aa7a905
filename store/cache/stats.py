"""Cache counters and the circuit breaker that keeps a failing server out of the way."""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from store.forks import at_fork
from store.threadends import on_thread_end

__all__ = ["Breaker", "CacheServer", "CacheServers", "CacheStats", "LostInvalidations"]


#: The counters of a `CacheStats`, in the order `as_dict` lists them.
COUNTERS = ("hits", "misses", "fills", "invalidations", "updates", "errors", "skipped", "expired")


class CacheStats:
    """What one cache did since the store opened. Read with `Store.stats()`.

    The counters are ``hits``, ``misses``, ``fills``, ``invalidations``,
    ``updates`` (cached lists a write changed in place rather than dropped),
    ``errors``, ``skipped`` (calls not made because the server was cooling
    down) and ``expired`` (entries older than ``max_stale_s``: read again,
    counted in misses too). Each thread counts into a dict of its own, with
    no lock (the request path adds to them several times a call; a shared
    lock there was contended by every thread); reading a counter sums the
    threads' dicts. A thread's dict is folded into the ended threads' total
    when it ends (`store.threadends`).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        #: What the latest error was (the server and the exception), for operators; "" if none yet.
        self.last_error = ""
        self._local = threading.local()
        self._lock = threading.Lock()  # only to register a thread's dict, and for errors
        self._tables: list[dict[str, int]] = []
        #: The counts of threads that have ended.
        self._ended = dict.fromkeys(COUNTERS, 0)
        #: Called before the counters are read, if set: the cache reads the replies it still owes
        #: (fills sent without waiting), so that what a reader sees is settled.
        self.before_read: Callable[[], None] | None = None
        at_fork(self, _new_lock)

    def _mine(self) -> dict[str, int]:
        table: dict[str, int] | None = getattr(self._local, "table", None)
        if table is None:
            table = dict.fromkeys(COUNTERS, 0)
            with self._lock:
                self._tables.append(table)
            self._local.table = table
            me = weakref.ref(self)

            def fold() -> None:
                stats = me()
                if stats is not None:
                    stats._fold(table)

            on_thread_end(self._local, "end", fold)
        return table

    def _fold(self, table: dict[str, int]) -> None:
        """Move an ended thread's counts into the ended threads' total."""
        with self._lock:
            self._tables.remove(table)
            for name, n in table.items():
                self._ended[name] += n

    def add(self, **counts: int) -> None:
        """Add to several counters at once (thread-safe: into this thread's own counters)."""
        table = self._mine()
        for name, n in counts.items():
            table[name] += n

    def error(self, where: str, exc: BaseException) -> None:
        """Count one error and remember it as the latest."""
        self._mine()["errors"] += 1
        with self._lock:
            self.last_error = f"{where}: {type(exc).__name__}: {exc}"[:300]

    def _sum(self, name: str) -> int:
        if self.before_read is not None:
            self.before_read()
        with self._lock:  # (a thread's counts move to the total under it: none counted twice)
            return self._ended[name] + sum(t[name] for t in self._tables)

    @property
    def hits(self) -> int:
        """Reads answered by the cache."""
        return self._sum("hits")

    @property
    def misses(self) -> int:
        """Reads the cache could not answer."""
        return self._sum("misses")

    @property
    def fills(self) -> int:
        """Entries stored after a miss."""
        return self._sum("fills")

    @property
    def invalidations(self) -> int:
        """Keys dropped after writes."""
        return self._sum("invalidations")

    @property
    def errors(self) -> int:
        """Calls that failed."""
        return self._sum("errors")

    @property
    def skipped(self) -> int:
        """Calls not made because the server was cooling down."""
        return self._sum("skipped")

    @property
    def expired(self) -> int:
        """Entries older than ``max_stale_s``, read again."""
        return self._sum("expired")

    def as_dict(self) -> dict[str, int]:
        """The counters as a plain dict."""
        if self.before_read is not None:
            self.before_read()
        with self._lock:
            tables = [self._ended, *self._tables]
            return {name: sum(t[name] for t in tables) for name in COUNTERS}

    def __repr__(self) -> str:
        return f"CacheStats({self.name!r}, {self.as_dict()})"


class Breaker:
    """Opens after ``failures_to_trip`` failures in a row; closed again after ``cooldown_s``.

    ``dirty`` is set when an invalidation could not be delivered: the server
    may hold a value the database no longer has, so the owner must empty it
    (or the keys it owns) before trusting it again.
    """

    def __init__(
        self,
        *,
        failures_to_trip: int = 3,
        cooldown_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._trip = failures_to_trip
        self._cooldown_s = cooldown_s
        self._clock = clock
        self._lock = threading.Lock()
        self._failures = 0
        self._open_until = 0.0
        self.dirty = False
        at_fork(self, _new_lock)

    def allow(self) -> bool:
        """True if a call may go to the server now."""
        return self._open_until == 0.0 or self._clock() >= self._open_until

    def success(self) -> None:
        """Record a call that worked."""
        if self._failures or self._open_until:
            with self._lock:
                self._failures = 0
                self._open_until = 0.0

    def failure(self) -> None:
        """Record a failed call; open the breaker after enough of them."""
        with self._lock:
            self._failures += 1
            if self._failures >= self._trip:
                self._open_until = self._clock() + self._cooldown_s

    def trip(self) -> None:
        """Open at once (the server is known to be unusable)."""
        with self._lock:
            self._failures = self._trip
            self._open_until = self._clock() + self._cooldown_s


class LostInvalidations:
    """The keys whose invalidations may not have reached one server, until they are sent again.

    `lose` marks the server's breaker dirty and remembers the keys, up to
    ``most``; past that it remembers only that there were too many, and the
    owner must empty the server. The owner takes what to send (`pending`),
    sends it, and reports it done (`sent`): the server is clean again only
    if nothing was lost meanwhile (a generation counter says), else what was
    lost meanwhile stays for the next time. The lock is never held across I/O.
    """

    def __init__(self, breaker: Breaker, most: int) -> None:
        self.breaker = breaker
        self.most = most
        self._lock = threading.Lock()
        self._keys: set[str] = set()
        self._all = False
        self._generation = 0
        at_fork(self, _new_lock)

    def lose(self, keys: Sequence[str]) -> None:
        """The invalidations of ``keys`` may not have arrived: the server is dirty."""
        with self._lock:
            self._generation += 1
            if self._all or len(self._keys) + len(keys) > self.most:
                self._all = True
                self._keys.clear()
            else:
                self._keys.update(keys)
            self.breaker.dirty = True

    def pending(self) -> tuple[int, list[str] | None]:
        """(the generation now, the keys to send again); None for the keys: too many were lost,
        empty the whole server."""
        with self._lock:
            return self._generation, None if self._all else list(self._keys)

    def sent(self, generation: int, keys: list[str] | None) -> bool:
        """What `pending` gave at ``generation`` was sent (``keys`` None: the server was emptied);
        True if the server is clean now."""
        with self._lock:
            if generation == self._generation:
                self._keys.clear()
                self._all = False
                self.breaker.dirty = False
            elif keys is not None:
                self._keys.difference_update(keys)  # (what was lost meanwhile stays)
            return not self.breaker.dirty


def _new_lock(owner: CacheStats | Breaker | LostInvalidations) -> None:
    """In a forked child: a lock of its own (a thread of the parent may have held the old one)."""
    owner._lock = threading.Lock()


class CacheServer(Protocol):
    """One cache server as metrics and the operator page read it: its name and this process's breaker."""

    @property
    def address(self) -> str:
        """``host:port`` (Redis: ``host:port/db``), never a password: the server's label."""
        ...

    @property
    def breaker(self) -> Breaker:
        """This process's breaker on the server."""
        ...


@runtime_checkable
class CacheServers(Protocol):
    """A cache backend on servers (memcached's, Redis'): the servers it spreads keys over.

    In-process backends, and a user's own, need not implement it: they have no server to show.
    """

    def cache_servers(self) -> Sequence[CacheServer]:
        """Every configured server, in the configured order (down or not)."""
        ...
