"""`store bench mix`: load, run every system phase by phase, check, count round trips, report."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import click
import orjson

from store.admin import init_shards
from store.backends import backend_for
from store.config import StoreConfig
from store.exceptions import ConfigError
from store.tools.mix.dataset_db import (
    Copy,
    load_copy,
    mix_schema,
    raw_connection,
    remove_copy,
    truth,
)
from store.tools.mix.invalidation import DaemonProcess, cache_deletes, daemon_config, idle_queries_per_s
from store.tools.mix.options import (
    ASYNC_SYSTEM,
    DEFAULT_SYSTEMS,
    QUICK_SHAPE,
    MixOptions,
    mix_config,
    system_config,
)
from store.tools.mix.pg import (
    PgTruth,
    load_copy_pg,
    pg_connection,
    remove_copy_pg,
    settle_pg,
)
from store.tools.mix.procs import Workers
from store.tools.mix.report import as_json, charts, machine, markdown, tables
from store.tools.mix.runner import Check, Phase, check_holding, count_round_trips, merge, run_phase
from store.tools.mix.servers_cpu import server_cpu_s, since
from store.tools.mix.store_system import StoreSystem
from store.tools.mix.system import MixSchema, System
from store.tools.mix.systems import make_system
from store.tools.mix.workload import DataSet, make_data_set

__all__ = ["ASYNC_SYSTEM", "DEFAULT_SYSTEMS", "MixOptions", "QUICK_SHAPE", "run_mix"]


#: The first stream part of a cold slice (the warm slices' are 1, 2, ...): its own requests.
COLD_PARTS = 50


def _empty(system: System, memcached: tuple[str, ...]) -> None:
    """Empty ``system``'s caches: its Redis keys and memcached."""
    system.flush()
    _flush_memcached(memcached)


def _flush_memcached(servers: tuple[str, ...]) -> None:
    from pymemcache.client.base import Client

    for s in servers:
        host, port = s.rsplit(":", 1)
        c = Client((host, int(port)), connect_timeout=1, timeout=2)
        try:
            c.flush_all(noreply=False)
        finally:
            c.close()


def _versions(schema: MixSchema, config: StoreConfig) -> dict[str, str]:
    out: dict[str, str] = {}
    pg = schema.ids == "instagram"
    conn = (pg_connection if pg else raw_connection)(next(iter(schema.hosts.values())))
    try:
        cur = conn.cursor()
        cur.execute("SELECT VERSION()")
        out["database"] = str(cur.fetchone()[0])
    finally:
        conn.close()
    if config.cache.redis:
        import redis

        r = redis.Redis.from_url(config.cache.redis[0])
        out["redis"] = str(r.info("server").get("redis_version"))
        r.close()
    if config.cache.memcached:
        from pymemcache.client.base import Client

        host, port = config.cache.memcached[0].rsplit(":", 1)
        c = Client((host, int(port)), connect_timeout=1, timeout=1)
        out["memcached"] = c.version().decode()
        c.close()
    import sqlalchemy

    if pg:
        import psycopg

        out["drivers"] = f"psycopg {psycopg.__version__}, SQLAlchemy {sqlalchemy.__version__}"
    else:
        import pymysql

        out["drivers"] = f"PyMySQL {pymysql.__version__}, SQLAlchemy {sqlalchemy.__version__}"
    return out


def _check_connections(schema: MixSchema, names: list[str], threads: int, processes: int = 1) -> None:
    """Refuse to start when the server would run out of connections half way (error 1040)."""
    # Per host name: the floor one per thread, the store's and the peer's pools up to two.
    per_host = {"floor": 1, "horizontal_shard": 2, "store": 2, "store-mysqldb": 2}
    callers = threads * processes
    need = len(set(schema.masters.values())) * callers * sum(per_host.get(n, 2) for n in names) + 10
    pg = schema.ids == "instagram"
    conn = (pg_connection if pg else raw_connection)(next(iter(schema.hosts.values())))
    try:
        cur = conn.cursor()
        if pg:
            cur.execute(
                "SELECT current_setting('max_connections')::int, (SELECT count(*) FROM pg_stat_activity)"
            )
            allowed, used = (int(v) for v in cur.fetchone())
        else:
            cur.execute("SELECT @@max_connections")
            allowed = int(cur.fetchone()[0])
            cur.execute("SHOW STATUS LIKE 'Threads_connected'")
            used = int(cur.fetchone()[1])
    finally:
        conn.close()
    if allowed - used < need:
        fix = (
            f"max_connections = {need + used + 50} in postgresql.conf, then restart it"
            if pg
            else f"SET GLOBAL max_connections = {need + used + 50}"
        )
        raise ConfigError(
            f"the mix at {callers} threads may open about {need} connections, and the server allows "
            f"{allowed} with {used} in use: raise it ({fix}) or run fewer threads or systems"
        )


def _timed(
    config: StoreConfig,
    system: System,
    data: DataSet,
    copy: Copy,
    options: MixOptions,
    threads: int,
    temperature: str,
    seconds: float,
    part: int,
    workers: Workers | None = None,
    slices: int = 1,
) -> Phase:
    """One slice of a phase, with a progress bar; every system replays the same streams for it.

    With ``workers`` the slice runs in their processes (and they replay the
    streams of their own seeds), else in this one.
    """
    procs = "" if workers is None else f" x {workers.processes} process(es)"
    callers = "task(s)" if system.name == ASYNC_SYSTEM else "thread(s)"
    label = f"{system.name}: {threads} {callers}{procs}, {temperature}"
    with click.progressbar(length=1000, label=label, file=sys.stderr) as bar:
        done = [0]

        def tick(frac: float) -> None:
            step = int(frac * 1000) - done[0]
            if step > 0:
                bar.update(step)
                done[0] += step

        seed = options.seed * 100_000 + threads * 100 + part
        # --requests is per phase: its slices share it.
        per_caller = None if options.requests is None else max(1, options.requests // slices)
        common: dict[str, Any] = {
            "threads": threads,
            "temperature": temperature,
            "seconds": seconds,
            "requests_per_thread": per_caller,
            "seed": seed,
            "tick": tick,
        }
        from store.tools.mix.async_system import cache_faults, connections_in_use

        # A store's connections, where the phase runs in this process.
        store = system.store if isinstance(system, StoreSystem) and workers is None else None
        if store is not None:
            connections_in_use(store, restart=True)
            faults = cache_faults(store)
        before = server_cpu_s()
        deleted = cache_deletes(config)
        if workers is not None:
            phase = workers.run_phase(copy, **common)
        elif system.name == ASYNC_SYSTEM:
            from store.tools.mix.async_system import AsyncStoreSystem, run_async_phase

            assert isinstance(system, AsyncStoreSystem)
            del common["threads"], common["requests_per_thread"]
            phase = run_async_phase(system, data, copy, tasks=threads, requests_per_task=per_caller, **common)
        else:
            phase = run_phase(system, data, copy, **common)
        phase.server_cpu_s = since(before, server_cpu_s())
        after = cache_deletes(config)
        phase.cache_deletes = {k: after[k] - deleted[k] for k in after if k in deleted}
        if store is not None:
            phase.connections = connections_in_use(store)
            phase.cache_faults = {k: n - faults.get(k, 0) for k, n in cache_faults(store).items()}
        return phase


def run_mix(options: MixOptions, say: Callable[[str], None]) -> dict[str, Any]:
    """Run the whole benchmark; write the JSON and charts into ``options.out``; the JSON document."""
    config = mix_config(options)
    if not (config.cache.memcached and config.cache.redis):
        raise ConfigError(
            "the mix needs memcached and Redis in the config's cache: section (the floor uses both)"
        )
    pg = config.ids == "instagram"
    if pg and any(not backend_for(url).schema_shards for url in config.hosts.values()):
        raise ConfigError("the mix runs Instagram IDs on PostgreSQL hosts only")
    first, last = config.open_shards[0]
    shards = list(range(first, min(last + 1, first + options.shards)))
    say(f"init: shards {shards[0]}-{shards[-1]} (idempotent)")
    init_shards(config, shards=shards)
    schema = mix_schema(config, shards)
    load, remove, read_truth = (
        (load_copy_pg, remove_copy_pg, PgTruth) if pg else (load_copy, remove_copy, truth)
    )
    data = make_data_set(options.shape)
    names = list(options.systems)
    if options.mysqldb_url and not any(n.partition(":")[0] == "store-mysqldb" for n in names):
        names.append("store-mysqldb")
    if ASYNC_SYSTEM in names and options.processes > 1:
        raise ConfigError(f"{ASYNC_SYSTEM} runs in this process: leave out --processes, or {ASYNC_SYSTEM}")
    _check_connections(schema, names, max(options.threads), max(1, options.processes))
    if ASYNC_SYSTEM in names:
        say(f"{ASYNC_SYSTEM}: io={options.async_io}, on the {options.async_loop} event loop")
    systems: dict[str, System] = {}
    daemons: dict[str, DaemonProcess] = {}
    copies: dict[str, Copy] = {}
    pools: dict[str, Workers] = {}
    rows = (
        data.shape.users
        + data.shape.boards
        + 3 * data.shape.pins
        + 2 * data.shape.users * data.shape.likes_per_user
    )
    phases: list[Phase] = []
    checks: list[Check] = []
    trips: dict[str, dict[str, float]] = {}
    try:
        for n in names:
            systems[n] = make_system(n, config, schema, options)
        for n in names:
            with click.progressbar(length=rows, label=f"load {n}", file=sys.stderr) as bar:
                copies[n] = load(schema, data, shards, progress=bar.update)
        if pg:
            say("vacuum and analyze: the loaded shards' tables (not left to autovacuum mid-phase)")
            settle_pg(schema)
        for n in names:  # after the loads: a daemon starts at the log's end, as a new deployment's does
            own = system_config(n, config, options)
            if own is not None and daemon_config(own) is not None:
                say(f"invalidation: {n} runs a `store invalidate` daemon of its own")
                daemons[n] = DaemonProcess(own)
        if options.processes > 1:
            say(f"workers: {options.processes} processes per system, each builds its own")
            for n in names:
                pools[n] = Workers(n, config, schema, options, copies[n], options.processes)
            for n in names:
                pools[n].wait_up()
        rounds = max(1, options.rounds)
        threaded = [n for n in names if n != ASYNC_SYSTEM]
        # The async store's phases: its tasks (--concurrency), beside the threads of the others.
        callers = [(t, list(threaded)) for t in options.threads if threaded]
        if ASYNC_SYSTEM in names:
            # A task count equal to a thread count joins that phase's turns (the servers drift over
            # a run: slices taken in turns compare fairly); the others are phases of their own.
            for c in options.concurrency or options.threads:
                joined = next((g for t, g in callers if t == c and ASYNC_SYSTEM not in g), None)
                if joined is not None:
                    joined.append(ASYNC_SYSTEM)
                else:
                    callers.append((c, [ASYNC_SYSTEM]))
        for threads, group in callers:
            # Each phase in slices, the systems taking turns at being first (noise, and the
            # servers' drift over a run, land on all alike): cold, each slice from the system's
            # caches emptied, then warm.
            for temperature, first_part in (("cold", COLD_PARTS), ("warm", 1)):
                sliced: dict[str, list[Phase]] = {n: [] for n in group}
                for r in range(rounds):
                    for n in group[r % len(group) :] + group[: r % len(group)]:
                        if temperature == "cold":
                            _empty(systems[n], config.cache.memcached)
                        part = _timed(
                            config,
                            systems[n],
                            data,
                            copies[n],
                            options,
                            threads,
                            temperature,
                            options.seconds / rounds,
                            first_part + r,
                            pools.get(n),
                            rounds,
                        )
                        sliced[n].append(part)
                phases += [merge(sliced[n]) for n in group]
        for pool in pools.values():
            pool.close()
        t = read_truth(schema)
        try:
            for n in names:
                say(f"check: {n}'s answers against the databases")
                check = check_holding(
                    systems[n],
                    t,
                    data,
                    copies[n],
                    seed=options.seed,
                    empty=functools.partial(_empty, systems[n], config.cache.memcached),
                )
                if check.stale:
                    say(f"check: {n} answered {len(check.stale)} stale from its caches; checked again empty")
                checks.append(check)
        finally:
            t.close()
        for n in names:
            say(f"round trips: {n}, {options.trips} calls on one thread")
            trips[n] = count_round_trips(systems[n], data, copies[n], n=options.trips, seed=options.seed + 1)
    finally:
        for pool in pools.values():
            pool.close()
        for n, system in systems.items():
            system.close()
            if n in copies and not options.keep:
                remove(schema, copies[n])
        for daemon in daemons.values():
            daemon.close()
    idle: dict[str, float] = {}
    if options.idle_s > 0:
        connect = pg_connection if pg else raw_connection
        for n in names:
            say(
                f"at rest: {n}'s database queries a second, {max(1, options.processes)} process(es), no calls"
            )
            idle[n] = idle_queries_per_s(
                n,
                config,
                schema,
                options,
                connect,
                processes=max(1, options.processes),
                seconds=options.idle_s,
            )
    meta = {
        "machine": machine(_versions(schema, config)),
        "shape": data.shape.__dict__,
        "shards": len(shards),
        "hosts": sorted(set(schema.masters.values())),
        "threads": options.threads,
        "processes": max(1, options.processes),
        "async": (
            {
                "io": options.async_io,
                "loop": options.async_loop,
                "pool_size": options.async_pool,
                "pool_overflow": options.async_overflow,
            }
            if ASYNC_SYSTEM in names
            else None
        ),
        "seconds": options.seconds,
        "requests_per_thread": options.requests,
    }
    doc = as_json(phases, checks, trips, meta)
    doc["queries_per_s_at_rest"] = idle
    doc["report"] = tables(phases, checks, trips, idle=idle)
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / "mix.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    (options.out / "mix.md").write_text(markdown(doc))
    try:
        doc["charts"] = [str(p) for p in charts(phases, options.out)]
    except ImportError:
        say("charts: matplotlib is not installed (pip install 'shardstore[bench]'); tables and JSON only")
        doc["charts"] = []
    return doc


def data_set_summary(data: DataSet) -> str:
    """One line about the data set's shape."""
    biggest = len(data.board_pins[data.boards_by_size[0]])
    s = data.shape
    likes = s.users * s.likes_per_user
    pins = f"{s.pins:,} pins (biggest board {biggest:,})"
    return f"{s.users:,} users, {s.boards:,} boards, {pins}, {likes:,} likes"
