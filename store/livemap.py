"""The live shard map of one store: its source, its refreshes, and the retry after a routing refusal.

A store routes by the map its `Router` holds. With a map source (a file, a
MariaDB table, ZooKeeper) the map changes while the store runs: it is
checked every ``map_poll_s`` seconds, and at once when a call is refused
for a routing reason. A shard that moved leaves a tombstone on its old host
that refuses every read and write (`ShardMovedError`, naming the new host
and map version); while the move switches, its tables are briefly absent
there instead (`ShardNotInitializedError`). Either way the refused statement
wrote nothing.

What is run again after a refusal is one *step*: a read, or one
transaction (or one idempotent statement) of a write's plan
(`store.steps`). `LiveMap.step` waits briefly for the newer map, then runs
the step again on the shard's new host, and again after each further move,
for at most `REROUTE_WAIT_S`. A write whose plan has several steps (an
object, then its unique keys, then its lists) is never run again whole:
what committed before the refusal stays committed, once.

The source is read off the request path, one read at a time per process.
The periodic check (`LiveMap.tick`) runs on a short-lived thread of its
own: the call that starts it waits for it at most `MAP_CHECK_WAIT_S`, and
every other call goes on with the current map without taking a lock. A
check that fails (the source's server down or hung; a table source's reads
are bounded by the config's ``connect_timeout_s`` and ``query_timeout_s``)
keeps the last map: it is counted, logged at most once every
`MAP_LOG_EVERY_S`, and tried again after ``map_poll_s``, the wait doubling
up to `MAP_RETRY_MAX_S` while the source stays down. A call refused for a
routing reason asks for reads on that same thread and stops waiting at its
deadline, whatever the source does: then the refusal is raised.
`LiveMap.age_s` says how long ago the source last confirmed the map in use.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from store import green
from store.config import StoreConfig
from store.exceptions import ConfigError, RoutingError, ShardMovedError, ShardNotInitializedError
from store.forks import at_fork
from store.mapsource import (
    FileMapSource,
    MapSource,
    StaticMapSource,
    TableMapSource,
    ZooKeeperMapSource,
    load_or_seed,
    open_map_source,
)
from store.routing import Router
from store.shardmap import ShardMap

__all__ = [
    "MAP_CHECK_WAIT_S",
    "MAP_LOG_EVERY_S",
    "MAP_RETRY_MAX_S",
    "REROUTE_POLL_S",
    "REROUTE_WAIT_S",
    "LiveMap",
    "MapStatus",
]

R = TypeVar("R")

log = logging.getLogger(__name__)

#: How long a call refused by a fenced shard waits for the moved map to appear.
REROUTE_WAIT_S = 5.0
REROUTE_POLL_S = 0.02
#: How long the call that starts a periodic check waits for it (others do not wait at all).
MAP_CHECK_WAIT_S = 0.1
#: The longest wait between checks while the source keeps failing (never below ``map_poll_s``).
MAP_RETRY_MAX_S = 2.0
#: A source that keeps failing is logged at most this often.
MAP_LOG_EVERY_S = 30.0

_SOURCE_KINDS: tuple[tuple[type, str], ...] = (
    (StaticMapSource, "static"),
    (FileMapSource, "file"),
    (TableMapSource, "table"),
    (ZooKeeperMapSource, "zookeeper"),
)


@dataclass(frozen=True)
class MapStatus:
    """The live map and its source's health, read at one moment (the operator page, the metrics)."""

    #: The version of the map the router routes by.
    version: int
    #: "static" (the config's map), "file", "table", "zookeeper" (or a custom source's class name).
    source: str
    #: Seconds since the source last confirmed this map as its newest; None for a static map.
    age_s: float | None
    #: Seconds since this process began routing by this version; None for a static map.
    since_change_s: float | None
    #: Reads of the source so far (periodic, forced and explicit), and how many of them failed.
    checks: int
    check_errors: int
    #: Why the latest read failed; empty once a read succeeds.
    last_error: str


class _Check:
    """One read of the source, on a thread of its own; callers wait on ``done``."""

    __slots__ = ("done", "error", "forced", "pid", "started")

    def __init__(self, *, forced: bool) -> None:
        self.forced = forced
        self.started = time.monotonic()
        # A child forked while the read runs must not wait for its parent's thread.
        self.pid = os.getpid()
        self.done = threading.Event()
        self.error: BaseException | None = None


class LiveMap:
    """Keeps a router's map in step with its source; runs calls with one retry after a reroute."""

    def __init__(self, config: StoreConfig, router: Router, source: MapSource | None = None) -> None:
        self._config = config
        self._router = router
        self.source: MapSource = source or open_map_source(config)
        self.dynamic = not isinstance(self.source, StaticMapSource)
        self._next_check = 0.0
        self._last_forced = -1.0
        #: Guards the map's installation and the checks' bookkeeping; never held while the source reads.
        self._lock = threading.Lock()
        #: Steps run again on a newer map after a routing refusal (a count, for tests and metrics).
        self.reroutes = 0
        self._check: _Check | None = None
        self._closed = False
        now = time.monotonic()
        self._confirmed_at = now
        self._changed_at = now
        self._checks = 0
        self._errors = 0
        self._failures = 0  # in a row
        self._last_error = ""
        self._logged_at: float | None = None
        if self.dynamic:
            self._install(load_or_seed(self.source, config.shard_map))
            self._checks = 1
        at_fork(self, LiveMap._after_fork)

    def _after_fork(self) -> None:
        """In a forked child: a lock of its own; a check the parent runs is not this process's
        (`_running` tells by the process id), so the next one due starts here."""
        self._lock = threading.Lock()
        self._check = None
        self._next_check = 0.0

    @property
    def current(self) -> ShardMap:
        """The map the router routes by now."""
        return self._router.shard_map

    @property
    def age_s(self) -> float | None:
        """Seconds since the source last confirmed the map in use as its newest (None: a static map).

        It grows while the source cannot be read, and drops back at the
        first check that reads it again.
        """
        if not self.dynamic:
            return None
        return max(0.0, time.monotonic() - self._confirmed_at)

    def status(self) -> MapStatus:
        """The map's version, age and its source's health, as one consistent reading."""
        kind = next((k for cls, k in _SOURCE_KINDS if isinstance(self.source, cls)), None)
        with self._lock:
            now = time.monotonic()
            return MapStatus(
                version=self._router.shard_map.version,
                source=kind or type(self.source).__name__,
                age_s=max(0.0, now - self._confirmed_at) if self.dynamic else None,
                since_change_s=max(0.0, now - self._changed_at) if self.dynamic else None,
                checks=self._checks,
                check_errors=self._errors,
                last_error=self._last_error,
            )

    def run(self, call: Callable[[], R]) -> R:
        """``call()`` as one step (`step`), with a newer map now and then: for reads, which write nothing."""
        self.tick()
        return self.step(call)

    def tick(self) -> None:
        """Reload the map if it is time to ask the source (every ``map_poll_s``).

        The source is read on a thread of its own, one read at a time: the
        call that starts it waits for it at most `MAP_CHECK_WAIT_S`, others
        go on at once with the current map. A failed read never raises here:
        the last map stays (see the module's text).
        """
        if self.dynamic and time.monotonic() >= self._next_check:
            check = self._begin(forced=False)
            if check is not None:
                green.wait_event(check.done, MAP_CHECK_WAIT_S)

    def step(self, call: Callable[[], R]) -> R:
        """``call()``; after a routing refusal, reload the map and run it again, alone.

        ``call`` must route by the map current when it runs (not one read
        before) and must have written nothing when it is refused: one read,
        one transaction, or one idempotent statement. It runs again after
        every newer map, waiting at most `REROUTE_WAIT_S` in all from the
        first refusal (not from the call's start: a write blocked behind a
        move's fence for seconds is refused when the fence commits, and the
        new map comes a moment after); refused by a map that does not
        change, the refusal is raised.
        """
        deadline: float | None = None
        while True:
            version = self._router.shard_map.version
            started = time.monotonic()
            try:
                return call()
            except (RoutingError, ShardNotInitializedError, ShardMovedError) as exc:
                if not self.dynamic:
                    raise
                if deadline is None:
                    deadline = time.monotonic() + REROUTE_WAIT_S
                self._reload_after_failure(started, deadline)
                if not isinstance(exc, RoutingError):
                    told = exc.map_version if isinstance(exc, ShardMovedError) else None
                    # The move publishes the new map a moment after it fences the
                    # old host: wait for it (for the version the tombstone names).
                    self._wait_for(max(version + 1, told or 0), deadline)
                if self._router.shard_map.version <= version:
                    raise
                self.reroutes += 1

    def refresh(self, *, force: bool = False) -> bool:
        """Reload the map if the source has a newer one (``force``: ask it now); True if it changed.

        Reads the source on the calling thread (bounded by the source's own
        timeouts) and raises what it raises, `BackendError` when it cannot be
        reached: admin commands must not go on with a map they could not
        confirm. No lock is held while the source reads.
        """
        if not self.dynamic:
            return False
        started = time.monotonic()
        with self._lock:
            self._next_check = started + self._config.map_poll_s
        try:
            changed = self._read(force=force)
        except Exception as exc:
            self._failed(exc, quiet=True)
            raise
        self._answered(started)
        return changed

    def _read(self, *, force: bool) -> bool:
        """Ask the source; install its map if it is newer. True if it was."""
        if not force and not self.source.changed():
            return False
        new = self.source.load()
        if new is None:
            return False
        with self._lock:
            if new.version <= self._router.shard_map.version:
                return False
            self._install(new)
            self._changed_at = time.monotonic()
            return True

    def _install(self, new: ShardMap) -> None:
        unknown = sorted(set(new.hosts()) - set(self._config.hosts))
        if unknown:
            raise ConfigError(
                f"shard map version {new.version} names host(s) {', '.join(unknown)} that are not under "
                "hosts in this process's config: add them and restart"
            )
        if new.shards != self._config.shards:
            raise ConfigError(
                f"shard map version {new.version} has {new.shards} shards, the config {self._config.shards}"
            )
        self._router.shard_map = new

    # -- checks: one read of the source at a time, on a thread of its own ----------------------

    def _running(self) -> _Check | None:
        """The check in flight in this process (call with the lock held)."""
        check = self._check
        if check is None or check.pid != os.getpid() or check.done.is_set():
            return None
        return check

    def _begin(self, *, forced: bool, since: float | None = None) -> _Check | None:
        """The check in flight, else a new one; None if none is needed.

        None: the store is closed, a periodic check is not due (another
        thread ran it), or a forced check begun at or after ``since`` has
        already ended.
        """
        with self._lock:
            if self._closed:
                return None
            running = self._running()
            if running is not None:
                return running if forced else None
            now = time.monotonic()
            if not forced and now < self._next_check:
                return None
            if since is not None and self._last_forced >= since:
                return None
            check = _Check(forced=forced)
            self._check = check
            self._next_check = now + self._config.map_poll_s
            if forced:
                self._last_forced = check.started
        try:
            threading.Thread(
                target=self._run_check, args=(check,), name="store-map-check", daemon=True
            ).start()
        except RuntimeError as exc:  # no new threads at interpreter shutdown: the map stays
            check.error = exc
            self._end(check)
        return check

    def _run_check(self, check: _Check) -> None:
        try:
            self._read(force=check.forced)
        except Exception as exc:  # the last map stays; the next check comes after a backoff
            check.error = exc
            self._failed(exc)
        else:
            self._answered(check.started)
        finally:
            self._end(check)

    def _end(self, check: _Check) -> None:
        with self._lock:
            if self._check is check:
                self._check = None
        check.done.set()

    def _answered(self, started: float) -> None:
        with self._lock:
            self._confirmed_at = max(self._confirmed_at, started)
            self._checks += 1
            failures, self._failures = self._failures, 0
            self._last_error = ""
            logged, self._logged_at = self._logged_at, None
        if logged is not None and failures:
            log.info(
                "the shard map source answers again after %d failed read(s); map version %d",
                failures,
                self._router.shard_map.version,
            )

    def _failed(self, exc: BaseException, *, quiet: bool = False) -> None:
        now = time.monotonic()
        with self._lock:
            self._checks += 1
            self._errors += 1
            self._failures += 1
            self._last_error = f"{type(exc).__name__}: {exc}"
            poll = self._config.map_poll_s
            backoff = min(poll * 2 ** min(self._failures - 1, 16), max(poll, MAP_RETRY_MAX_S))
            self._next_check = max(self._next_check, now + backoff)
            due = self._logged_at is None or now - self._logged_at >= MAP_LOG_EVERY_S
            speak = due and not quiet and not self._closed
            if speak:
                self._logged_at = now
            failures, error, age = self._failures, self._last_error, now - self._confirmed_at
        if speak:
            log.warning(
                "cannot follow the shard map source (%d failed read(s) in a row): %s; still routing by "
                "map version %d, confirmed %.1f s ago",
                failures,
                error,
                self._router.shard_map.version,
                age,
            )

    def _await(self, check: _Check, deadline: float) -> None:
        """Wait for ``check`` until ``deadline``; a map the config cannot follow is raised."""
        green.wait_event(check.done, max(0.0, deadline - time.monotonic()))
        if check.done.is_set() and isinstance(check.error, ConfigError):
            raise ConfigError(str(check.error)) from check.error

    def _forced_check(self, since: float, deadline: float) -> None:
        """Wait until a read of the source begun at or after ``since`` has ended (until ``deadline``)."""
        while time.monotonic() < deadline:
            check = self._begin(forced=True, since=since)
            if check is None:
                return
            self._await(check, deadline)
            if check.forced and check.started >= since:
                return

    def _wait_for(self, version: int, deadline: float) -> None:
        """Poll the source until the map reaches ``version`` (at most until ``deadline``)."""
        if not self.dynamic:
            return
        while self._router.shard_map.version < version and time.monotonic() < deadline:
            green.sleep(min(REROUTE_POLL_S, max(0.0, deadline - time.monotonic())))
            self._forced_check(time.monotonic(), deadline)

    def _reload_after_failure(self, started: float, deadline: float) -> None:
        # Many calls can fail at once (every writer of a moved shard): one
        # forced read serves all calls that started before it, so IDs that route
        # nowhere cannot turn every call into a read of the map source.
        if not self.dynamic:
            return
        self._forced_check(started, deadline)

    def close(self) -> None:
        """Start no more checks; release the source's connection, if it keeps one (ZooKeeper)."""
        with self._lock:
            self._closed = True
        close = getattr(self.source, "close", None)
        if close is not None:
            close()
