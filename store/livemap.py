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
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from store.config import StoreConfig
from store.exceptions import ConfigError, RoutingError, ShardMovedError, ShardNotInitializedError
from store.mapsource import MapSource, StaticMapSource, load_or_seed, open_map_source
from store.routing import Router
from store.shardmap import ShardMap

__all__ = ["REROUTE_POLL_S", "REROUTE_WAIT_S", "LiveMap"]

R = TypeVar("R")

#: How long a call refused by a fenced shard waits for the moved map to appear.
REROUTE_WAIT_S = 5.0
REROUTE_POLL_S = 0.02


class LiveMap:
    """Keeps a router's map in step with its source; runs calls with one retry after a reroute."""

    def __init__(self, config: StoreConfig, router: Router, source: MapSource | None = None) -> None:
        self._config = config
        self._router = router
        self.source: MapSource = source or open_map_source(config)
        self.dynamic = not isinstance(self.source, StaticMapSource)
        self._next_check = 0.0
        self._last_forced = -1.0
        self._lock = threading.Lock()
        #: Steps run again on a newer map after a routing refusal (a count, for tests and metrics).
        self.reroutes = 0
        if self.dynamic:
            self._install(load_or_seed(self.source, config.shard_map))

    @property
    def current(self) -> ShardMap:
        """The map the router routes by now."""
        return self._router.shard_map

    def run(self, call: Callable[[], R]) -> R:
        """``call()`` as one step (`step`), with a newer map now and then: for reads, which write nothing."""
        self.tick()
        return self.step(call)

    def tick(self) -> None:
        """Reload the map if it is time to ask the source (every ``map_poll_s``)."""
        if self.dynamic and time.monotonic() >= self._next_check:
            self.refresh()

    def step(self, call: Callable[[], R]) -> R:
        """``call()``; after a routing refusal, reload the map and run it again, alone.

        ``call`` must route by the map current when it runs (not one read
        before) and must have written nothing when it is refused: one read,
        one transaction, or one idempotent statement. It runs again after
        every newer map, waiting at most `REROUTE_WAIT_S` in all; refused by
        a map that does not change, the refusal is raised.
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
                    deadline = started + REROUTE_WAIT_S
                self._reload_after_failure(started)
                if not isinstance(exc, RoutingError):
                    told = exc.map_version if isinstance(exc, ShardMovedError) else None
                    # The move publishes the new map a moment after it fences the
                    # old host: wait for it (for the version the tombstone names).
                    self._wait_for(max(version + 1, told or 0), deadline)
                if self._router.shard_map.version <= version:
                    raise
                self.reroutes += 1

    def refresh(self, *, force: bool = False) -> bool:
        """Reload the map if the source has a newer one (``force``: ask it now); True if it changed."""
        if not self.dynamic:
            return False
        with self._lock:
            self._next_check = time.monotonic() + self._config.map_poll_s
            if not force and not self.source.changed():
                return False
            new = self.source.load()
            if new is None or new.version <= self._router.shard_map.version:
                return False
            self._install(new)
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

    def _wait_for(self, version: int, deadline: float) -> None:
        """Poll the source until the map reaches ``version`` (at most until ``deadline``)."""
        if not self.dynamic:
            return
        while self._router.shard_map.version < version and time.monotonic() < deadline:
            time.sleep(REROUTE_POLL_S)
            self.refresh(force=True)

    def _reload_after_failure(self, started: float) -> None:
        # Many calls can fail at once (every writer of a moved shard): one
        # reload serves all calls that started before it, so IDs that route
        # nowhere cannot turn every call into a read of the map source.
        if not self.dynamic:
            return
        with self._lock:
            if self._last_forced >= started:
                return
            self._last_forced = time.monotonic()
        self.refresh(force=True)

    def close(self) -> None:
        """Release the source's connection, if it keeps one (ZooKeeper)."""
        close = getattr(self.source, "close", None)
        if close is not None:
            close()
