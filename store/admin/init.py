"""`store init`: create shard databases and tables on their masters, idempotently.

Each host is worked by its own threads, hosts in parallel. What already
exists is read once per host from information_schema and skipped, so a second
run issues no DDL at all and reports nothing created.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from store.config import StoreConfig
from store.engines import Engines
from store.exceptions import RoutingError
from store.schema import (
    DATABASE_PREFIX,
    NEXT_ID,
    SCHEMA_PREFIX,
    database_name,
    schema_name,
    shard_statements,
)

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
    by_host: dict[str, list[int]] = {}
    for s in wanted:
        by_host.setdefault(config.shard_map.master(s), []).append(s)
    report = InitReport(shards=len(wanted))
    started = time.perf_counter()

    def tick(shard: int) -> None:
        if on_shard is not None:
            on_shard(shard)

    with ThreadPoolExecutor(max_workers=max(1, len(by_host))) as pool:
        futures = {
            host: pool.submit(_init_host, config, engines, host, host_shards, tick, workers_per_host)
            for host, host_shards in by_host.items()
        }
        for host, fut in futures.items():
            dbs, tables = fut.result()
            report.databases_created += dbs
            report.tables_created += tables
            report.per_host[host] = len(by_host[host])
    report.seconds = time.perf_counter() - started
    return report


def _init_host(
    config: StoreConfig,
    engines: Engines,
    host: str,
    shards: list[int],
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
    existing = _existing(engines, host, backend)

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
