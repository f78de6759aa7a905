"""`store bench` and `store bench mix`: timings against the raw driver, and the mixed workload.

The benchmarks live in `store.tools`, imported only when a command runs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click

from store.cli.common import config_option, echo_json, load_config, open_store

__all__ = ["bench"]


@click.group(invoke_without_command=True)
@config_option
@click.option("-n", "--iterations", default=2000, show_default=True, help="Calls per case.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option(
    "--metrics-port",
    type=int,
    default=None,
    help="Run with metrics on, served on 127.0.0.1:PORT/metrics, and time get and warm get "
    "with metrics on against off (needs the metrics extra).",
)
@click.option(
    "--cases",
    default=None,
    metavar="NAMES",
    help="Run only these cases, separated by commas: a case's name as the report prints it, or "
    "the part before its size (create_many,link_many). Default: every case.",
)
@click.option(
    "--floor-cursor",
    type=click.Choice(["driver", "store"]),
    default="driver",
    show_default=True,
    help="The cursor the floors send their statements through: the driver's own (as a "
    "hand-written program does), or the store's (its quicker binding and escaping: a stricter floor).",
)
@click.pass_context
def bench(
    ctx: click.Context,
    config_path: Path | None,
    iterations: int,
    as_json: bool,
    metrics_port: int | None,
    cases: str | None,
    floor_cursor: str,
) -> None:
    """Time store operations next to the raw driver doing the same work.

    `store bench mix` runs a mixed workload over threads instead.
    """
    if ctx.invoked_subcommand is not None:
        return
    from store.tools.bench import Wanted, format_results, run_bench

    try:
        wanted = Wanted(None if cases is None else cases.split(","))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--cases") from None

    say: Callable[[str], None] = lambda msg: click.echo(f"running {msg} ...", err=True)  # noqa: E731
    metrics = None
    if metrics_port is not None:
        from prometheus_client import start_http_server

        from store.metrics import Metrics

        metrics = Metrics()
        start_http_server(metrics_port, addr="127.0.0.1", registry=metrics.registry)
        click.echo(f"metrics on http://127.0.0.1:{metrics_port}/metrics", err=True)
    with open_store(config_path) as store:
        results = run_bench(
            store, n=iterations, progress=say, metrics=metrics, cases=wanted, floor_cursor=floor_cursor
        )
        stats = store.stats()
        last_errors = store.admin_context().caches.last_errors()
    if as_json:
        echo_json({"results": [r.as_dict() for r in results], "cache_stats": stats})
        return
    click.echo(format_results(results))
    for name, counters in stats.items():
        click.echo(f"cache {name}: " + ", ".join(f"{k} {v}" for k, v in counters.items()))
        if name in last_errors:
            click.echo(f"cache {name} last error: {last_errors[name]}")


def _thread_counts(text: str) -> list[int]:
    try:
        counts = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        counts = []
    if not counts or any(not 1 <= c <= 256 for c in counts):
        raise click.BadParameter(
            f"give thread counts in 1..256 separated by commas, like 1,4,16; got {text!r}"
        )
    return counts


def _task_counts(text: str) -> list[int]:
    try:
        counts = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        counts = []
    if not counts or any(not 1 <= c <= 10_000 for c in counts):
        raise click.BadParameter(
            f"give task counts in 1..10000 separated by commas, like 16,64,256; got {text!r}"
        )
    return counts


@bench.command("mix")
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="A Pinterest-ID MariaDB or Instagram-ID PostgreSQL config with memcached and Redis (default: "
    "the mix's own, 64 shards on 2 host names on 127.0.0.1:3306; STORE_MIX_URL, STORE_MIX_URL_A/B "
    "override, a postgresql+psycopg:// URL naming a database for 64 schema shards).",
)
@click.option("--threads", "threads_text", default="1,4,16", show_default=True, help="Thread counts to run.")
@click.option(
    "--processes",
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    help="Worker processes per phase, each with the phase's threads, on the same data (P x T callers).",
)
@click.option("--seconds", default=10.0, show_default=True, help="Length of each phase.")
@click.option("--requests", type=int, default=None, help="Calls per thread per phase instead of --seconds.")
@click.option(
    "--rounds",
    default=3,
    show_default=True,
    help="Slices of each phase, the systems taking turns (noise lands on all alike); a cold slice "
    "starts from empty caches.",
)
@click.option("--shards", default=64, show_default=True, help="Shards the data set spreads over.")
@click.option("--users", default=2000, show_default=True, help="Users (2 boards each; 20 pins per user).")
@click.option(
    "--systems",
    default="floor,horizontal_shard,store,store:follow=true",  # store.tools.mix.bench.DEFAULT_SYSTEMS
    show_default=True,
    help="Which systems to run, in order: floor, horizontal_shard, store, store-mysqldb (see --mysqldb), "
    "or the store with cache settings changed, store:KEY=VALUE[,...] "
    "(store:follow=true: with the invalidation log followed by every process; store:invalidation=log or "
    "store:invalidation=binlog: with a `store invalidate` daemon of its own, started for the run).",
)
@click.option(
    "--idle-seconds",
    "idle_s",
    type=click.FloatRange(0, 60),
    default=4.0,
    show_default=True,
    help="After the run, hold each system open this long with no calls and report the database queries a "
    "second its background work costs (followers, daemons, map checks); 0: skip (so does --quick, unless "
    "given).",
)
@click.option(
    "--mysqldb",
    "mysqldb_url",
    default=None,
    help="A mysql+mysqldb:// URL: also run the store on the mysqlclient driver.",
)
@click.option(
    "--async",
    "run_async",
    is_flag=True,
    help="Also run store:async: AsyncStore awaited by --concurrency tasks on one event loop.",
)
@click.option(
    "--concurrency",
    "concurrency_text",
    default="16,64,256",
    show_default=True,
    help="Task counts of store:async's phases (with --async; --quick: 4,32).",
)
@click.option(
    "--async-workers",
    "async_workers",
    type=click.IntRange(1, 1024),
    default=None,
    help="store:async's max_workers: how many calls run at once, each holding at most one connection "
    "per host (threads; default: min(32, pool_size)); native: a cap on the calls running at once on "
    "the loop (default: none).",
)
@click.option(
    "--async-io",
    "async_io",
    type=click.Choice(["native", "threads"]),
    default="native",
    show_default=True,
    help="How store:async runs its calls: greenlets on the event loop, each socket wait the loop's "
    "(native), or an executor's worker threads (threads: see --async-workers).",
)
@click.option(
    "--async-loop",
    "async_loop",
    type=click.Choice(["asyncio", "uvloop"]),
    default="asyncio",
    show_default=True,
    help="store:async's event loop: asyncio's own, or uvloop (what uvicorn runs when it is "
    "installed; pip install 'shardstore[bench]').",
)
@click.option(
    "--async-pool",
    "async_pool",
    type=click.IntRange(1, 1000),
    default=None,
    help="store:async's pool_size (connections kept per host); default: the threaded store's.",
)
@click.option(
    "--async-overflow",
    "async_overflow",
    type=click.IntRange(0, 1000),
    default=None,
    help="store:async's pool_overflow (connections a host may open past --async-pool); default: as "
    "many again as --async-pool.",
)
@click.option("--quick", is_flag=True, help="A small data set, threads 1,2, 2 s phases: under a minute.")
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("mix-results"),
    show_default=True,
    help="Where mix.json and the PNG charts go.",
)
@click.option("--keep", is_flag=True, help="Keep the loaded data sets (removed by default).")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON instead of the tables.")
def bench_mix(
    config_path: Path | None,
    threads_text: str,
    processes: int,
    seconds: float,
    requests: int | None,
    rounds: int,
    shards: int,
    users: int,
    systems: str,
    idle_s: float,
    mysqldb_url: str | None,
    run_async: bool,
    concurrency_text: str,
    async_workers: int | None,
    async_io: str,
    async_loop: str,
    async_pool: int | None,
    async_overflow: int | None,
    quick: bool,
    out: Path,
    keep: bool,
    as_json: bool,
) -> None:
    """A LinkBench-style mix over threads: the store, a hand-written floor, SQLAlchemy's horizontal_shard.

    Each system loads its own copy of the same data set and replays the
    same request streams, cold and warm, at each thread count; afterwards its
    answers are checked against the databases and its round trips counted.
    Each phase reports the client's CPU per call and the CPU the machine's
    server processes (MariaDB, Redis, memcached, PostgreSQL) spent per call:
    run it on a quiet machine. With --processes P each phase runs in P worker processes (spawned, each
    building its own system) of T threads each, on the same loaded data;
    ops/s is all their calls over the wall time of the whole phase.
    With --async, store:async (the same store through store.aio.AsyncStore) runs C tasks on one
    event loop for each C of --concurrency, and each store's database connections are reported.
    """
    from store.tools.mix.bench import QUICK_SHAPE, MixOptions, data_set_summary, run_mix
    from store.tools.mix.workload import Shape, make_data_set

    shape = QUICK_SHAPE if quick else Shape(users=users, pins=20 * users)
    options = MixOptions(
        config=None if config_path is None else load_config(config_path),
        shards=shards,
        shape=shape,
        threads=[1, 2] if quick else _thread_counts(threads_text),
        seconds=2.0 if quick else seconds,
        requests=requests,
        rounds=rounds,
        systems=_system_names(systems)
        + (("store:async",) if run_async and "store:async" not in systems else ()),
        concurrency=[4, 32] if quick and concurrency_text == "16,64,256" else _task_counts(concurrency_text),
        async_workers=async_workers,
        async_io=async_io,
        async_loop=async_loop,
        async_pool=async_pool,
        async_overflow=async_overflow,
        mysqldb_url=mysqldb_url,
        trips=100 if quick else 400,
        out=out,
        keep=keep,
        processes=processes,
        idle_s=0.0 if quick and idle_s == 4.0 else idle_s,  # --quick: no rest measure unless asked
    )
    click.echo(f"data set: {data_set_summary(make_data_set(shape))}", err=True)
    doc = run_mix(options, say=lambda msg: click.echo(msg, err=True))
    if as_json:
        echo_json(doc)
        return
    click.echo(doc["report"])
    charts = ", ".join(doc["charts"]) or "none"
    click.echo(f"\nraw numbers: {out / 'mix.json'}; tables: {out / 'mix.md'}; charts: {charts}")


def _system_names(text: str) -> tuple[str, ...]:
    """``--systems``: names split at commas, where a ``KEY=VALUE`` piece with no system of its own
    belongs to the one before it (``store:invalidation=binlog,list_entries=100``)."""
    names: list[str] = []
    for piece in (p.strip() for p in text.split(",")):
        if not piece:
            continue
        if names and "=" in piece and ":" not in piece and ":" in names[-1]:
            names[-1] += f",{piece}"
        else:
            names.append(piece)
    return tuple(names)
