"""`store init`: create shard databases and tables on their masters, idempotently.

Shards are placed by the live map (the map source's, once one is configured),
never by the config's ``map:`` seed: after a move the two differ, and the
seed would put moved shards back on their old host. Each host is worked by
its own threads, hosts in parallel. What already exists is read once per host
from information_schema first, everywhere, so a refusal (a tombstone where
the live map expects the shard) changes nothing, and a second run issues no
DDL at all. On MariaDB, DDL for a shard runs under its admin lock after a
second look, so an init that races with a move's switch finds the tombstone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from store.admin.ownership import shard_lock, tombstones
from store.config import StoreConfig
from store.engines import Engines
from store.exceptions import RoutingError, ShardMovedError
from store.mapsource import live_map
from store.schema import (
    DATABASE_PREFIX,
    NEXT_ID,
    SCHEMA_PREFIX,
    TOMBSTONE_TABLE,
    database_name,
    schema_name,
    shard_statements,
)
from store.shardmap import ShardMap

__all__ = ["InitReport", "init_shards"]

#: Connections per host doing DDL at once; InnoDB's CREATE TABLE waits on fsync,
#: so a few in parallel use the server better than one.
WORKERS_PER_HOST = 4


@dataclass
class InitReport:
    """What `init_shards` did."""

    shards: int = 0
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
    """Create every missing shard database and table on its master host."""
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
    report = InitReport(shards=len(wanted))
    started = time.perf_counter()

    def tick(shard: int) -> None:
        if on_shard is not None:
            on_shard(shard)

    with ThreadPoolExecutor(max_workers=max(1, len(by_host))) as pool:
        servers = [h for h in by_host if engines.dialect(h).name != "sqlite"]
        found = pool.map(lambda h: _existing(engines, h, engines.dialect(h).name), servers)
        looked = dict(zip(servers, found, strict=True))
        for host, existing in looked.items():
            _refuse_tombstones(placed, host, by_host[host], existing)
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
            )
            for host, host_shards in by_host.items()
        }
        for host, fut in futures.items():
            dbs, tables = fut.result()
            report.databases_created += dbs
            report.tables_created += tables
            report.per_host[host] = len(by_host[host])
    report.seconds = time.perf_counter() - started
    return report


def _refuse_tombstones(
    placed: ShardMap, host: str, shards: list[int], existing: set[tuple[str, str]]
) -> None:
    gone = [s for s in shards if (database_name(s), TOMBSTONE_TABLE) in existing]
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
) -> tuple[int, int]:
    types = list(config.types.values())
    relations = list(config.relations.values())
    if engines.dialect(host).name == "sqlite":
        folder = Path(str(config.hosts[host].database))
        created = 0
        for s in shards:
            created += not (folder / f"{database_name(s)}.sqlite3").exists()
            engines.shard(s, host)  # creates the file and its tables
            tick(s)
        return created, created * (len(types) + len(relations))
    backend = engines.dialect(host).name

    def work(s: int) -> tuple[int, int]:
        ns = schema_name(s) if backend == "postgresql" else database_name(s)
        todo = [
            (what, stmt)
            for what, stmt in shard_statements(
                backend, s, types, relations, ids=config.ids, epoch_ms=config.instagram_epoch_ms
            )
            if (ns, what) not in existing
        ]
        if todo:
            with engines.shard(s, host).connect() as conn:
                cur = conn.cursor()
                if backend == "postgresql":
                    for _what, stmt in todo:
                        cur.execute(stmt)
                else:
                    with shard_lock(cur, [s]):
                        # A move may have switched the shard away since the first look.
                        moved = tombstones(cur, [s]).get(s)
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
        return ns_created, len({what for what, _stmt in todo} - {""})

    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(work, shards))
    return sum(r[0] for r in results), sum(r[1] for r in results)


def _existing(engines: Engines, host: str, backend: str) -> set[tuple[str, str]]:
    """(namespace, what) of everything `shard_statements` would create that exists already.

    ``what`` is ``""`` for the database or schema itself, a table (or
    sequence) name, ``table#next_id`` for a MariaDB ID trigger and
    ``#next_id`` for a PostgreSQL next_id() function.
    """
    like = SCHEMA_PREFIX + "____" if backend == "postgresql" else DATABASE_PREFIX + "_____"
    out: set[tuple[str, str]] = set()
    with engines.shard(0, host).connect() as conn:
        cur = conn.cursor()
        cur.execute("SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE %s", (like,))
        out |= {(row[0], "") for row in cur.fetchall()}
        cur.execute(
            "SELECT table_schema, table_name FROM information_schema.tables WHERE table_schema LIKE %s",
            (like,),
        )
        out |= {(row[0], row[1]) for row in cur.fetchall()}
        if backend == "postgresql":
            cur.execute(
                "SELECT routine_schema FROM information_schema.routines "
                "WHERE routine_schema LIKE %s AND routine_name = 'next_id'",
                (like,),
            )
            out |= {(row[0], NEXT_ID) for row in cur.fetchall()}
        else:
            cur.execute(
                "SELECT trigger_schema, event_object_table FROM information_schema.triggers "
                "WHERE trigger_schema LIKE %s",
                (like,),
            )
            out |= {(row[0], row[1] + NEXT_ID) for row in cur.fetchall()}
        cur.close()
    return out
