"""`store init`: create shard databases and tables on their masters, idempotently.

Shards are placed by the live map (the map source's, once one is configured),
never by the config's ``map:`` seed: after a move the two differ, and the
seed would put moved shards back on their old host. Each host is worked by
its own threads, hosts in parallel. What already exists is read once per host
from information_schema first, everywhere, so a refusal (a tombstone where
the live map expects the shard) changes nothing, and a second run issues no
DDL at all. On MariaDB, DDL for a shard runs under its admin lock after a
second look, so an init that races with a move's switch finds the tombstone.

Unique keys (config ``unique:``) keep their rows on the shard a hash of the
value picks, any of all the shards, whatever shards an object lives on. So
an init of some shards (``--shards A-B``) also makes the ``unique_keys``
table (with its database or schema, nothing else) on every other shard of
the config where it is missing: creates and lookups of objects on A-B work
at once, and a later init of the rest adds the other tables beside it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from store.admin.ownership import SHARD_LOCK_TIMEOUT_S
from store.backends import Backend
from store.backends.tables import UNIQUE_TABLE
from store.config import StoreConfig
from store.engines import Engines
from store.exceptions import RoutingError, ShardMovedError
from store.mapsource import live_map
from store.naming import ADDED_VERSION, TOMBSTONE_TABLE
from store.shardmap import ShardMap

__all__ = ["InitReport", "init_shards"]

#: Connections per host doing DDL at once; InnoDB's CREATE TABLE waits on fsync,
#: so a few in parallel use the server better than one.
WORKERS_PER_HOST = 4


@dataclass
class InitReport:
    """What `init_shards` did."""

    shards: int = 0
    #: Shards outside those asked for that got only their unique-key table checked (and made
    #: where missing), because unique keys hash over all shards.
    unique_shards: int = 0
    tables_created: int = 0
    databases_created: int = 0
    seconds: float = 0.0
    per_host: dict[str, int] = field(default_factory=dict)


def init_shards(
    config: StoreConfig,
    *,
    engines: Engines | None = None,
    shards: Iterable[int] | None = None,
    on_shard: Callable[[int], None] | None = None,
    workers_per_host: int = WORKERS_PER_HOST,
) -> InitReport:
    """Create every missing shard database and table on its master host.

    With unique keys, every shard outside ``shards`` gets its unique-key
    table too (see the module's docstring; `InitReport.unique_shards`).
    Connects with the hosts' admin URLs (`StoreConfig.for_admin`) unless
    ``engines`` is given. Where ``cache.follow`` is on, each MariaDB
    master's invalidation log is made too.
    """
    config = config.for_admin()
    own = engines is None
    engines = engines or Engines(config)
    try:
        return _init(config, engines, shards, on_shard, workers_per_host)
    finally:
        if own:
            engines.dispose()


def _init(
    config: StoreConfig,
    engines: Engines,
    shards: Iterable[int] | None,
    on_shard: Callable[[int], None] | None,
    workers_per_host: int,
) -> InitReport:
    wanted = sorted(set(range(config.shards) if shards is None else shards))
    for s in wanted:
        if not 0 <= s < config.shards:
            raise RoutingError(f"shard {s} is outside 0..{config.shards - 1}; fix --shards")
    placed = live_map(config)
    by_host: dict[str, list[int]] = {}
    for s in wanted:
        by_host.setdefault(placed.master(s), []).append(s)
    # Unique-key rows hash over all shards: the others need their unique_keys table too.
    unique_only: set[int] = set()
    if config.unique:
        asked = set(wanted)
        for s in range(config.shards):
            host = placed.master(s)
            if s not in asked and not engines.backend(host).made_on_first_use:
                unique_only.add(s)
                by_host.setdefault(host, []).append(s)
    report = InitReport(shards=len(wanted), unique_shards=len(unique_only))
    started = time.perf_counter()

    def tick(shard: int) -> None:
        if on_shard is not None and shard not in unique_only:
            on_shard(shard)

    with ThreadPoolExecutor(max_workers=max(1, len(by_host))) as pool:
        servers = [h for h in by_host if not engines.backend(h).made_on_first_use]
        found = pool.map(lambda h: _existing(engines, h), servers)
        looked = dict(zip(servers, found, strict=True))
        for host, existing in looked.items():
            _refuse_tombstones(placed, host, engines.backend(host), by_host[host], existing)
        futures = {
            host: pool.submit(
                _init_host,
                config,
                engines,
                host,
                host_shards,
                looked.get(host, set()),
                tick,
                workers_per_host,
                unique_only,
            )
            for host, host_shards in by_host.items()
        }
        for host, fut in futures.items():
            dbs, tables = fut.result()
            report.databases_created += dbs
            report.tables_created += tables
            mine = sum(1 for s in by_host[host] if s not in unique_only)
            if mine:
                report.per_host[host] = mine
    if engines.logging:
        for host, host_shards in by_host.items():
            engines.shard(host_shards[0], host).log_sql()  # makes the log where it is missing
    report.seconds = time.perf_counter() - started
    return report


def _refuse_tombstones(
    placed: ShardMap, host: str, backend: Backend, shards: list[int], existing: set[tuple[str, str]]
) -> None:
    gone = [s for s in shards if (backend.namespace(s), TOMBSTONE_TABLE) in existing]
    if gone:
        raise ShardMovedError(
            f"the live map (version {placed.version}) gives shard {gone[0]} to {host}, but {host} holds a "
            f"tombstone of it{f' (and of {len(gone) - 1} more)' if len(gone) > 1 else ''}: the map source "
            "is behind the hosts. Nothing was created; check map_source and run store check",
            shard=gone[0],
            host=host,
        )


def _init_host(
    config: StoreConfig,
    engines: Engines,
    host: str,
    shards: list[int],
    existing: set[tuple[str, str]],
    tick: Callable[[int], None],
    workers: int,
    unique_only: set[int],
) -> tuple[int, int]:
    types = list(config.types.values())
    relations = list(config.relations.values())
    backend = engines.backend(host)
    if backend.made_on_first_use:
        made = {s for s, copy in backend.inventory(config.hosts[host], _no_cursor).copies.items()}
        for s in shards:
            engines.shard(s, host).pool  # noqa: B018 - making the handle makes the shard
            tick(s)
        created = len(set(shards) - made)
        return created, created * (len(types) + len(relations) + (1 if relations else 0))

    def work(s: int) -> tuple[int, int]:
        ns = backend.namespace(s)
        only_keys = s in unique_only  # the database or schema and the unique-key table, nothing else
        statements = backend.shard_statements(
            s,
            [] if only_keys else types,
            [] if only_keys else relations,
            ids=config.ids,
            epoch_ms=config.instagram_epoch_ms,
            unique=bool(config.unique),
        )
        if only_keys:
            statements = [(what, stmt) for what, stmt in statements if what in ("", UNIQUE_TABLE)]
        todo = backend.missing(statements, existing, ns)
        if todo:
            with engines.shard(s, host).connect() as conn:
                cur = conn.cursor()
                with backend.admin_lock(cur, [s], timeout_s=SHARD_LOCK_TIMEOUT_S):
                    # A move may have switched the shard away since the first look.
                    moved = backend.tombstones(cur, [s]).get(s)
                    if moved is not None:
                        raise ShardMovedError(
                            f"shard {s} moved from {host} to {moved[0]} (map version {moved[1]}) while "
                            "init ran: run store init again to create what is missing where it is now",
                            shard=s,
                            host=host,
                            moved_to=moved[0],
                            map_version=moved[1],
                        )
                    for _what, stmt in todo:
                        cur.execute(stmt)
                cur.close()
        tick(s)
        ns_created = int((ns, "") not in existing)
        tables = {what for what, _stmt in todo if not what.endswith(ADDED_VERSION)} - {""}
        return ns_created, len(tables)

    # No more workers than the host's pool lets open at once: a worker waiting for a connection
    # behind another's DDL would fail after pool_timeout_s, which a small pool makes short.
    workers = max(1, min(workers, engines.shard(shards[0], host).pool.max_open))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(work, shards))
    return sum(r[0] for r in results), sum(r[1] for r in results)


def _existing(engines: Engines, host: str) -> set[tuple[str, str]]:
    """(namespace, what) of everything `shard_statements` would create that exists already on ``host``."""
    with engines.shard(0, host).connect() as conn:
        cur = conn.cursor()
        found = engines.backend(host).existing(cur)
        cur.close()
    return found


def _no_cursor() -> Any:
    raise AssertionError("a backend whose shards are made on first use needs no connection to look")
