"""Prometheus metrics for a running store (optional: ``pip install 'shardstore[metrics]'``).

Nothing here is imported unless metrics are asked for, and a store without
metrics runs exactly as before. With them (``Store(metrics=Metrics())`` or
`instrument`), each public `Store` call is timed:

* the op label is the `Store` method (``get``, ``create``, ``link`` ...);
* the host label is the host whose connection the call last checked out on
  its own thread (`store.engines` tells it, one ``is None`` check when
  metrics are off), or ``none`` when no database was asked (a cache hit).

The hot path takes no lock: every thread counts into its own bucket lists
(plain integer increments under the GIL), and a custom collector sums them
when Prometheus scrapes. Everything else (cache counters, breakers, pools,
the live map version, a running move) is read at scrape time from the
objects that already keep it, so it costs nothing between scrapes: cache
servers as `store.cache.Caches.servers` names them (`CacheServer`: an
address and a breaker) and pools by `store.pool.PoolLoad`, never by
reaching into a backend's attributes. The map's age
(``store_map_age_seconds``) is how long ago the map source last confirmed
the map in use: it grows while the source cannot be read.

Metric names (all prefixed ``store_``) are listed in `METRIC_NAMES` and in
the README.
"""

from __future__ import annotations

import contextvars
import threading
import time
import weakref
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from store.cache.invalidators import invalidators
from store.cache.stats import CacheServer, CacheServers
from store.forks import at_fork
from store.move_progress import move_families, move_progress_path, read_move_progress
from store.pool import PoolLoad
from store.threadends import on_thread_end

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

    from store.context import HasAdminContext

__all__ = [
    "BUCKETS_S",
    "INSTRUMENTED_OPS",
    "METRIC_NAMES",
    "Metrics",
    "instrument",
    "move_progress_path",
    "read_move_progress",
]

#: Latency buckets in seconds: 50 us (a warm cache hit) up to 1 s.
BUCKETS_S: tuple[float, ...] = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
)

#: The `Store` methods that are timed, each under its own op label.
INSTRUMENTED_OPS: tuple[str, ...] = (
    "create",
    "get",
    "get_many",
    "get_with_version",
    "update",
    "delete",
    "lookup",
    "link",
    "unlink",
    "links",
    "page",
    "has_link",
    "has_links",
    "has_links_many",
    "pages_many",
    "board_pins",
    "board_pins_many",
    "page_objects",
    "pages_objects_many",
    "count",
)

#: Every metric family this module exports (names as Prometheus shows them, without _total/_bucket).
METRIC_NAMES: tuple[str, ...] = (
    "store_op_seconds",
    "store_errors",
    "store_cache_hits",
    "store_cache_misses",
    "store_cache_fills",
    "store_cache_invalidations",
    "store_cache_updates",
    "store_cache_errors",
    "store_cache_breaker_open",
    "store_pool_in_use",
    "store_pool_waiting",
    "store_pool_idle",
    "store_map_version",
    "store_map_age_seconds",
    "store_map_version_age_seconds",
    "store_map_check_errors",
    "store_move_phase",
    "store_move_rows_copied",
    "store_move_rows_total",
    "store_move_bytes_copied",
    "store_move_replication_lag_seconds",
    "store_move_fenced_seconds",
)

_BOUNDS_NS: tuple[int, ...] = tuple(round(b * 1e9) for b in BUCKETS_S)
_NBUCKETS = len(_BOUNDS_NS) + 1  # the last one is +Inf


def _add_cells(into: dict[tuple[str, str], list[int]], table: dict[tuple[str, str], list[int]]) -> None:
    """Add each of ``table``'s histogram cells into ``into``'s."""
    for key, cell in list(table.items()):
        got = into.get(key)
        if got is None:
            into[key] = list(cell)
        else:
            for i, v in enumerate(cell):
                got[i] += v


#: The host the current call runs on (`Metrics.observe_host`): a context variable, so that calls
#: interleaved on one thread (`AsyncStore(io="native")`, each call a greenlet with a context of
#: its own) each keep their own.
_HOST: contextvars.ContextVar[str] = contextvars.ContextVar("store_metrics_host", default="none")


class _Local(threading.local):
    """One thread's counters: ``hist[(op, host)]`` is bucket counts then the sum in ns.

    Registered with its `Metrics` on the thread's first call, and folded
    into the ended threads' total when the thread ends (`store.threadends`).
    """

    hist: dict[tuple[str, str], list[int]]

    def __init__(self, owner: weakref.ref[Metrics]) -> None:
        hist: dict[tuple[str, str], list[int]] = {}
        self.hist = hist
        metrics = owner()
        if metrics is None:
            return
        with metrics._lock:
            metrics._threads.append(hist)

        def fold() -> None:
            m = owner()
            if m is not None:
                m._fold(hist)

        on_thread_end(self, "end", fold)


class Metrics:
    """The metrics of one or more stores, registered with a Prometheus registry as one collector.

    ``registry`` defaults to a private `CollectorRegistry` (use
    `render` or `registry` to expose it); pass
    ``prometheus_client.REGISTRY`` to join the process-wide one.
    ``move_journal``: a `store move` journal whose progress is exported too.
    """

    def __init__(
        self, registry: CollectorRegistry | None = None, *, move_journal: str | Path | None = None
    ) -> None:
        from prometheus_client import CollectorRegistry

        self._lock = threading.Lock()
        self._threads: list[dict[tuple[str, str], list[int]]] = []
        #: The counts of threads that have ended.
        self._ended: dict[tuple[str, str], list[int]] = {}
        self._local = _Local(weakref.ref(self))
        self._errors: dict[tuple[str, str], int] = {}
        self._stores: weakref.WeakSet[HasAdminContext] = weakref.WeakSet()
        self.move_journal = None if move_journal is None else Path(move_journal)
        self.registry: CollectorRegistry = registry if registry is not None else CollectorRegistry()
        self.registry.register(self)
        at_fork(self, Metrics._after_fork)

    def _after_fork(self) -> None:
        """In a forked child: a lock of its own (a thread of the parent may have held the old one)."""
        self._lock = threading.Lock()

    # -- the hot path --------------------------------------------------------------

    def observe_host(self, host: str) -> None:
        """Called by `store.engines` at each checkout: the host the current call runs on."""
        _HOST.set(host)

    def timed(self, op: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` timed under ``op``: one histogram observation per call, errors counted by kind."""
        local = self._local
        perf = time.perf_counter_ns
        bounds = _BOUNDS_NS
        count_error = self._count_error
        host, reset = _HOST.get, _HOST.set

        def record(t0: int) -> None:
            dt = perf() - t0
            key = (op, host())
            hist = local.hist
            cell = hist.get(key)
            if cell is None:
                cell = hist[key] = [0] * (_NBUCKETS + 1)
            cell[bisect_left(bounds, dt)] += 1
            cell[-1] += dt

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            reset("none")
            t0 = perf()
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:
                record(t0)
                count_error(op, exc)
                raise
            dt = perf() - t0
            key = (op, host())
            cell = local.hist.get(key)
            if cell is None:
                cell = local.hist[key] = [0] * (_NBUCKETS + 1)
            cell[bisect_left(bounds, dt)] += 1
            cell[-1] += dt
            return result

        wrapper.__name__ = getattr(fn, "__name__", op)
        wrapper.__doc__ = getattr(fn, "__doc__", None)
        return wrapper

    def _count_error(self, op: str, exc: BaseException) -> None:
        key = (op, type(exc).__name__)
        with self._lock:
            self._errors[key] = self._errors.get(key, 0) + 1

    # -- wiring --------------------------------------------------------------------

    def attach(self, store: HasAdminContext) -> None:
        """Time ``store``'s calls and export its caches, pools and map (see `instrument`)."""
        for op in INSTRUMENTED_OPS:
            method = getattr(store, op, None)
            if method is not None and op not in vars(store):  # an instance attribute: wrapped already
                setattr(store, op, self.timed(op, method))
        store.admin_context().engines.set_observer(self.observe_host)
        self._stores.add(store)

    def render(self) -> bytes:
        """The registry in Prometheus' text format (what ``/metrics`` serves)."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)

    # -- scrape time ---------------------------------------------------------------

    def latencies(self) -> dict[tuple[str, str], list[int]]:
        """Every thread's counts summed: ``(op, host) -> [bucket counts..., +Inf count, sum ns]``."""
        out: dict[tuple[str, str], list[int]] = {}
        with self._lock:  # (a thread's counts move to the total under it: none counted twice)
            for table in [self._ended, *self._threads]:
                _add_cells(out, table)
        return out

    def _fold(self, hist: dict[tuple[str, str], list[int]]) -> None:
        """Move an ended thread's counts into the ended threads' total."""
        with self._lock:
            self._threads.remove(hist)
            _add_cells(self._ended, hist)

    def errors(self) -> dict[tuple[str, str], int]:
        """Errors raised through timed calls: ``(op, exception class) -> count``."""
        with self._lock:
            return dict(self._errors)

    def describe(self) -> Iterable[Any]:
        """Nothing up front: the families are made at each scrape (Prometheus' custom collector)."""
        return []

    def collect(self) -> Iterator[Any]:
        """The metric families, read now (called by the registry at each scrape)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        hist = HistogramMetricFamily(
            "store_op_seconds", "Latency of store calls by op and the host they ran on", labels=["op", "host"]
        )
        for (op, host), cell in sorted(self.latencies().items()):
            cum, buckets = 0, []
            for i, bound in enumerate(BUCKETS_S):
                cum += cell[i]
                buckets.append((_le(bound), float(cum)))
            cum += cell[_NBUCKETS - 1]
            buckets.append(("+Inf", float(cum)))
            hist.add_metric([op, host], buckets, cell[-1] / 1e9)
        yield hist
        errors = CounterMetricFamily("store_errors", "Errors raised by store calls", labels=["op", "kind"])
        for (op, kind), n in sorted(self.errors().items()):
            errors.add_metric([op, kind], n)
        yield errors
        yield from self._store_families(CounterMetricFamily, GaugeMetricFamily)
        yield from self._invalidator_families(GaugeMetricFamily)
        yield from self._move_families(GaugeMetricFamily)

    def _store_families(self, counter: Any, gauge: Any) -> Iterator[Any]:
        names = ("hits", "misses", "fills", "invalidations", "updates", "errors")
        counters = {n: counter(f"store_cache_{n}", f"Cache {n}", labels=["cache"]) for n in names}
        breaker = gauge(
            "store_cache_breaker_open", "1 if the server's breaker is open", labels=["cache", "server"]
        )
        in_use = gauge("store_pool_in_use", "Connections checked out", labels=["host"])
        waiting = gauge("store_pool_waiting", "Callers waiting for a connection", labels=["host"])
        idle = gauge("store_pool_idle", "Idle pooled connections", labels=["host"])
        version = gauge("store_map_version", "Version of the live shard map this process routes by")
        age = gauge(
            "store_map_age_seconds",
            "Seconds since the map source last confirmed the live map (grows while it cannot be read)",
        )
        version_age = gauge(
            "store_map_version_age_seconds", "Seconds since this process began routing by its map's version"
        )
        check_errors = counter("store_map_check_errors", "Reads of the shard map source that failed")
        totals: dict[str, dict[str, int]] = {}
        breakers: dict[tuple[str, str], int] = {}
        is_open: int | bool
        pools: dict[str, list[int]] = {}
        newest = 0
        # Stores with a map source: the oldest confirmation, the newest change, every failed read.
        ages: list[tuple[float, float, int]] = []
        for store in list(self._stores):
            ctx = store.admin_context()
            for cache, stats in ctx.caches.stats().items():
                mine = totals.setdefault(cache, dict.fromkeys(names, 0))
                for n in names:
                    mine[n] += stats.get(n, 0)
            for key, is_open in cache_breakers(store).items():
                breakers[key] = max(breakers.get(key, 0), int(is_open))
            loads: Mapping[str, PoolLoad] = ctx.engines.pools()
            for name, pool in loads.items():
                got = pools.setdefault(name, [0, 0, 0])
                got[0] += pool.in_use
                got[1] += pool.waiting
                got[2] += pool.idle
            newest = max(newest, ctx.shard_map.version)
            live = ctx.live
            # A scrape checks the map like a call does: an idle process's map would otherwise
            # show as old however well its source answers.
            live.tick()
            status = live.status()
            if status.age_s is not None and status.since_change_s is not None:
                ages.append((status.age_s, status.since_change_s, status.check_errors))
        for cache, values in sorted(totals.items()):
            for n in names:
                counters[n].add_metric([cache], values[n])
        for (cache, server), is_open in sorted(breakers.items()):
            breaker.add_metric([cache, server], is_open)
        for name, (u, w, i) in sorted(pools.items()):
            in_use.add_metric([name], u)
            waiting.add_metric([name], w)
            idle.add_metric([name], i)
        if self._stores:
            version.add_metric([], newest)
        yield from counters.values()
        yield from (breaker, in_use, waiting, idle, version)
        if ages:  # a static map (no map_source) has no age to show
            age.add_metric([], max(a for a, _c, _e in ages))
            version_age.add_metric([], min(c for _a, c, _e in ages))
            check_errors.add_metric([], sum(e for _a, _c, e in ages))
            yield from (age, version_age, check_errors)

    def _invalidator_families(self, gauge: Any) -> Iterator[Any]:
        """Each server's invalidation daemon as it publishes itself in the caches (if configured)."""
        rows: dict[str, dict[str, Any]] = {}
        for store in list(self._stores):
            for row in invalidators(store):
                rows.setdefault(row["server"], row)
        if not rows:
            return
        age = gauge(
            "store_invalidation_heartbeat_age_seconds",
            "Age of the host's invalidation heartbeat in the caches (absent: none)",
            labels=["host"],
        )
        leader = gauge(
            "store_invalidation_leader", "1 while a daemon leads the server's invalidation", labels=["server"]
        )
        standby = gauge("store_invalidation_standby", "1 while a standby daemon waits", labels=["server"])
        lag = gauge(
            "store_invalidation_lag_seconds",
            "How far the leader's binlog stream is behind",
            labels=["server"],
        )
        deleted = gauge(
            "store_invalidation_keys_deleted", "Cache keys the leading daemon deleted", labels=["server"]
        )
        for server, row in sorted(rows.items()):
            for host, seconds in sorted(row["heartbeat_age_s"].items()):
                if seconds is not None:
                    age.add_metric([host], float(seconds))
            lead = row["leader"]
            leader.add_metric([server], 0.0 if lead is None else 1.0)
            standby.add_metric([server], 0.0 if row["standby"] is None else 1.0)
            if lead is not None and lead.get("lag_s") is not None:
                lag.add_metric([server], float(lead["lag_s"]))
            if lead is not None and isinstance(lead.get("keys_deleted"), int):
                deleted.add_metric([server], float(lead["keys_deleted"]))
        yield from (age, leader, standby, lag, deleted)

    def _move_families(self, gauge: Any) -> Iterator[Any]:
        yield from move_families(gauge, self.move_journal)


def _le(bound: float) -> str:
    return repr(float(bound))


def cache_breakers(store: HasAdminContext) -> dict[tuple[str, str], bool]:
    """``(cache, server) -> open?`` for each cache server of ``store`` (in-process caches have none)."""
    servers = store.admin_context().caches.servers()
    return {(kind, s.address): not s.breaker.allow() for kind, group in servers.items() for s in group}


def redis_servers(backend: Any) -> list[Any]:
    """The Redis servers' backends (`RedisListBackend`) behind a list backend: one, several, or none."""
    return list(backend.cache_servers()) if isinstance(backend, CacheServers) else []


def redis_address(backend: CacheServer) -> str:
    """``host:port/db`` of a Redis list backend (never its password)."""
    return backend.address


def instrument(store: HasAdminContext, metrics: Metrics) -> Metrics:
    """Time ``store``'s public calls into ``metrics`` and export its caches, pools and map; returns it.

    What ``Store(metrics=...)`` calls. Calling it twice on one store wraps once.
    """
    metrics.attach(store)
    return metrics
