"""`get_many` of 50 IDs on one host against 50 IDs spread over four hosts, on four real MariaDB servers.

Starts four MariaDB servers of its own (ports 3381-3384 by default,
temporary data directories), maps 64 shards onto them (16 per host, one
host name per server, no cache, so every call reads the databases), creates
PINS_PER_SHARD pins on every shard, then times, alternating call by call:

- one host:   `get_many` of 50 IDs all on host H1 (one query);
- spread:     `get_many` of 50 IDs spread evenly over H1-H4 (four queries, asked at once);
- sequential: the spread read again with the fan-out disabled (`Engines.run_all`
  replaced by a loop that asks the hosts one after another), for reference.

Each call reads 50 different IDs picked at random from the pins created.
Prints the median and p99 of each in microseconds and the ratio to the
one-host read; the issue's bar is spread / one host <= 1.5 (medians).
Stops and deletes the servers at the end, also after an error or Ctrl-C.

    .venv/bin/python scripts/bench_fanout.py [--calls 500] [--driver mysqldb]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import signal
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pymysql

from store import Store, StoreConfig
from store.admin import init_shards
from store.engines import Engines
from tests.conftest import base_config
from tests.servers import MariaDBServer

T = TypeVar("T")

HOSTS = 4
SHARDS = 64
PER_HOST = SHARDS // HOSTS
IDS_PER_CALL = 50

_run_all = Engines.run_all
_sequential = False


def _switchable_run_all(self: Engines, jobs: Sequence[Callable[[], T]]) -> list[T]:
    """`Engines.run_all`, or (while `_sequential` is set) the same jobs one after another."""
    if _sequential:
        return [job() for job in jobs]
    return _run_all(self, jobs)


def start_servers(first_port: int) -> list[MariaDBServer]:
    """Four MariaDB servers on first_port..; removed again if one fails to start.

    One after another: two `mariadb-install-db` at once can delete each
    other's temporary tables in the shared tmpdir.
    """
    made: list[MariaDBServer] = []
    try:
        for port in range(first_port, first_port + HOSTS):
            made.append(MariaDBServer(port))
            made[-1].start()
    except BaseException:
        for server in made:
            server.remove()
        raise
    return made


def config_for(servers: Sequence[MariaDBServer], driver: str) -> dict[str, Any]:
    """64 shards, 16 on each of H1-H4 (one server each) through ``driver``, no cache section."""
    return base_config(
        ids="pinterest",
        shards=SHARDS,
        hosts={f"H{i + 1}": s.url.replace("+pymysql:", f"+{driver}:") for i, s in enumerate(servers)},
        map=[
            {"range": [i * PER_HOST, (i + 1) * PER_HOST - 1], "master": f"H{i + 1}"}
            for i in range(len(servers))
        ],
    )


def server_version(server: MariaDBServer) -> str:
    """``SELECT VERSION()`` of one of the servers."""
    conn = pymysql.connect(host="127.0.0.1", port=server.port, user="root")
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT VERSION()")
            return str(cur.fetchone()[0])
    finally:
        conn.close()


def pick_spread(rng: random.Random, by_host: list[list[int]]) -> list[int]:
    """50 IDs, 12 or 13 from each host's pins, interleaved host by host."""
    counts = [IDS_PER_CALL // HOSTS + (1 if i < IDS_PER_CALL % HOSTS else 0) for i in range(HOSTS)]
    picks = [rng.sample(pins, n) for pins, n in zip(by_host, counts, strict=True)]
    return [p[k] for k in range(max(counts)) for p in picks if k < len(p)]


def percentile(samples: list[float], q: int) -> float:
    """The q-th percentile (1-99) of ``samples``."""
    return statistics.quantiles(samples, n=100, method="inclusive")[q - 1]


def measure(store: Store, by_host: list[list[int]], calls: int, seed: int) -> dict[str, list[float]]:
    """Seconds per `get_many`, per kind of read, calls alternating one host / spread / sequential."""
    global _sequential
    rng = random.Random(seed)
    times: dict[str, list[float]] = {"one host": [], "spread": [], "sequential": []}
    clock = time.perf_counter
    for _ in range(calls):
        for kind in times:
            ids = rng.sample(by_host[0], IDS_PER_CALL) if kind == "one host" else pick_spread(rng, by_host)
            _sequential = kind == "sequential"
            try:
                t = clock()
                got = store.get_many(ids)
                elapsed = clock() - t
            finally:
                _sequential = False
            if len(got) != IDS_PER_CALL:
                raise RuntimeError(f"{kind}: asked for {IDS_PER_CALL} objects, got {len(got)}")
            times[kind].append(elapsed)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(
        description="get_many of 50 IDs on one host vs spread over 4 hosts (4 MariaDB servers it starts)."
    )
    parser.add_argument("--calls", type=int, default=500, help="timed calls of each kind (default 500)")
    parser.add_argument(
        "--pins-per-shard", type=int, default=40, help="pins created on each of the 64 shards (default 40)"
    )
    parser.add_argument(
        "--port", type=int, default=3381, help="first of the four server ports (default 3381)"
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of the random ID picks")
    parser.add_argument(
        "--driver",
        choices=("pymysql", "mysqldb"),
        default="pymysql",
        help="the store's MariaDB driver (default pymysql; mysqldb needs mysqlclient)",
    )
    args = parser.parse_args()
    if args.pins_per_shard * PER_HOST < IDS_PER_CALL:
        parser.error(f"--pins-per-shard must give at least {IDS_PER_CALL} pins per host")

    # A kill (SIGTERM) unwinds like Ctrl-C, so the servers are stopped either way.
    def terminated(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminated)
    Engines.run_all = _switchable_run_all  # type: ignore[method-assign]

    started = time.monotonic()
    print(f"starting {HOSTS} MariaDB servers on ports {args.port}-{args.port + HOSTS - 1} ...", flush=True)
    servers = start_servers(args.port)
    try:
        print(
            f"MariaDB {server_version(servers[0])}, {os.cpu_count()} CPUs, "
            f"Python {platform.python_version()}, driver {args.driver}; "
            f"{SHARDS} shards, {PER_HOST} per host, no cache; {IDS_PER_CALL} IDs per get_many, "
            f"{args.calls} calls of each kind, alternating"
        )
        config = StoreConfig.from_dict(config_for(servers, args.driver))
        init_shards(config)
        with Store(config) as store:
            by_host: list[list[int]] = [[] for _ in range(HOSTS)]
            for shard in range(SHARDS):
                for n in range(args.pins_per_shard):
                    pin = store.create("pin", {"title": f"pin {n} of shard {shard}", "n": n}, shard=shard)
                    by_host[shard // PER_HOST].append(pin)
            # Open each host's connections before the clock starts.
            measure(store, by_host, 20, args.seed + 1)
            times = measure(store, by_host, args.calls, args.seed)
        base = statistics.median(times["one host"])
        base_p99 = percentile(times["one host"], 99)
        print()
        print(f"{'read':<34} {'median µs':>10} {'p99 µs':>10} {'median x':>9} {'p99 x':>7}")
        labels = {
            "one host": "50 IDs on 1 host",
            "spread": "50 IDs on 4 hosts, concurrent",
            "sequential": "50 IDs on 4 hosts, sequential",
        }
        for kind, samples in times.items():
            med, p99 = statistics.median(samples), percentile(samples, 99)
            print(
                f"{labels[kind]:<34} {med * 1e6:>10,.0f} {p99 * 1e6:>10,.0f} "
                f"{med / base:>9.2f} {p99 / base_p99:>7.2f}"
            )
        ratio = statistics.median(times["spread"]) / base
        verdict = "within" if ratio <= 1.5 else "NOT within"
        print(f"\nspread / one host (medians): {ratio:.2f}, {verdict} 1.5x")
        print(f"total {time.monotonic() - started:.0f} s")
    finally:
        Engines.run_all = _run_all  # type: ignore[method-assign]
        for server in servers:
            server.remove()


if __name__ == "__main__":
    main()
