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

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orjson
import psycopg
from move_bench import MOVING, SHARDS, main, move_under_writers, report

from store import Store, StoreConfig
from store.admin import init_shards
from store.tools.timing import PIN
from tests.conftest import base_config
from tests.servers import PostgresServer, TLSFiles

PORTS = (5495, 5496)


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
            journal, plan_rows, waits, other_errors = move_under_writers(
                store, tmp / "move.json", lambda rng, shard: rng.choice(ids[shard]), type_name="pin"
            )
            return report(
                journal, moving_rows, waits, other_errors, rows_said=f" (plan: about {plan_rows:,})"
            )
    finally:
        for server in servers:
            server.remove()
        files.remove()


if __name__ == "__main__":
    main(__doc__, bench)
