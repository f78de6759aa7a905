"""Measure `store move` of PostgreSQL schema shards (by hand: `.venv/bin/python scripts/bench_move_postgres.py
[OBJECTS] [--runs N]`).

Starts two PostgreSQL clusters of its own (ports 5495/5496, temporary data
directories, ``wal_level = logical``), loads OBJECTS objects into 64 schema
shards (``ids: instagram``) on the source, then moves shards 32-63 while
WRITERS threads update objects on every shard and time each write. Prints
copy rows/s and MB/s, how long the fence held and where that time went, and
the max and p99 time a write to a moving shard waited or was retried.
Writes to the other shards must never fail. With ``--runs N`` it does all
that N times (fresh clusters each time) and ends with one line per run.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orjson
import psycopg

from store import Store, StoreConfig
from store.admin import init_shards
from store.admin.move import Mover
from store_tools.timing import PIN
from tests.conftest import base_config
from tests.servers import PostgresServer, TLSFiles

SHARDS, MOVING = 64, range(32, 64)
OBJECTS = 400_000  # 200,000 on the moving half
WRITERS = 4
PORTS = (5495, 5496)


def main() -> None:
    """Run the benchmark ``--runs`` times; one summary line per run at the end."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("objects", nargs="?", type=int, default=OBJECTS)
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    results = []
    for run in range(args.runs):
        print(f"-- run {run + 1} of {args.runs}")
        results.append(bench(args.objects))
    if args.runs > 1:
        print("-- every run")
        for i, r in enumerate(results):
            print(
                f"run {i + 1}: fence {r['fenced_s']:.3f} s ({r['breakdown']}); "
                f"copy {r['rows_s']:,.0f} rows/s; max write wait {r['max_wait_ms']:,.0f} ms; "
                f"other shards refused {r['refused']}"
            )


def _cluster(port: int, files: TLSFiles) -> PostgresServer:
    """A logical-level cluster on ``port`` with a database ``store``."""
    server = PostgresServer(port, files, wal_level="logical")
    deadline = time.monotonic() + 30
    while True:  # the port opens before the server takes connections
        try:
            with psycopg.connect(
                host="127.0.0.1", port=port, user="postgres", dbname="postgres", sslmode="require",
                autocommit=True,
            ) as conn:  # fmt: skip
                conn.execute("CREATE DATABASE store")
            return server
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                server.remove()
                raise
            time.sleep(0.1)


def bench(objects: int) -> dict[str, Any]:
    """One run: fresh clusters, load, move shards 32-63 under writers; the figures."""
    tmp = Path(tempfile.mkdtemp(prefix="store-bench-move-pg-"))
    files = TLSFiles()
    servers = [_cluster(port, files) for port in PORTS]
    try:
        urls = [f"postgresql+psycopg://postgres@127.0.0.1:{port}/store?sslmode=require" for port in PORTS]
        raw = base_config(
            ids="instagram",
            shards=SHARDS,
            hosts={"A": urls[0], "B": urls[1]},
            map=[{"range": [0, SHARDS - 1], "master": "A"}],
            map_source={"file": str(tmp / "map.yaml"), "poll_s": 0.5},
        )
        config = StoreConfig.from_dict(raw)
        init_shards(config)
        text = orjson.dumps(PIN).decode()
        per_shard = objects // SHARDS
        ids: dict[int, list[int]] = {}
        with psycopg.connect(
            host="127.0.0.1",
            port=PORTS[0],
            user="postgres",
            dbname="store",
            sslmode="require",
            autocommit=True,
        ) as conn:
            for s in range(SHARDS):
                found = conn.execute(
                    f"INSERT INTO shard{s:04d}.pins (data) SELECT %s FROM generate_series(1, %s) "
                    "RETURNING id",
                    (text, per_shard),
                ).fetchall()
                ids[s] = [int(r[0]) for r in found[:: max(1, per_shard // 1000)]]
            conn.execute("ANALYZE")
        moving_rows = per_shard * len(MOVING)
        print(f"loaded {per_shard * SHARDS:,} objects ({moving_rows:,} on the moving shards)")
        with Store(config) as store:
            waits: list[float] = []
            other_errors: list[BaseException] = []
            done = threading.Event()

            def writer(seed: int) -> None:
                rng = random.Random(seed)
                while not done.is_set():
                    shard = rng.randrange(SHARDS)
                    pin = rng.choice(ids[shard])
                    t = time.perf_counter()
                    try:
                        store.update(pin, {"w": seed}, type_name="pin")
                    except Exception as exc:
                        if shard not in MOVING:
                            other_errors.append(exc)
                        continue
                    if shard in MOVING:
                        waits.append(time.perf_counter() - t)

            threads = [threading.Thread(target=writer, args=(i,)) for i in range(WRITERS)]
            for t in threads:
                t.start()
            mover = Mover(store, tmp / "move.json", say=print)
            try:
                plan = mover.plan(MOVING.start, MOVING.stop - 1, "B")
                journal = mover.start(plan)
                time.sleep(1)
            finally:
                done.set()
            for t in threads:
                t.join()
            copy_s = journal.timings["copy_s"]
            mb = journal.timings["copy_bytes"] / 1e6
            print(
                f"copy: {moving_rows:,} rows (plan: about {plan.rows:,}) in {copy_s:.2f} s = "
                f"{moving_rows / copy_s:,.0f} rows/s, {mb / copy_s:.1f} MB/s"
            )
            print(
                f"catch up: {journal.timings['catch_up_s']:.2f} s; "
                f"fence held {journal.timings['fenced_s']:.3f} s"
            )
            breakdown = ", ".join(
                f"{k[6:-2]} {v:.3f}" for k, v in journal.timings.items() if k.startswith("fence_")
            )
            print(f"fence: {breakdown}")
            q = statistics.quantiles(waits, n=100)
            print(
                f"writes to moving shards: {len(waits):,}, median {statistics.median(waits) * 1000:.1f} ms, "
                f"p99 {q[98] * 1000:.1f} ms, max {max(waits) * 1000:.1f} ms"
            )
            print(f"writes to other shards refused: {len(other_errors)}")
            return {
                "fenced_s": journal.timings["fenced_s"],
                "breakdown": breakdown,
                "rows_s": moving_rows / copy_s,
                "max_wait_ms": max(waits) * 1000,
                "refused": len(other_errors),
            }
    finally:
        for server in servers:
            server.remove()
        files.remove()


if __name__ == "__main__":
    main()
