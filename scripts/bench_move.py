"""Measure `store move` (run by hand: `.venv/bin/python scripts/bench_move.py [OBJECTS] [--runs N]`).

Starts two MariaDB servers of its own (ports 3351/3352, temporary data
directories, ROW binlogs), loads OBJECTS objects into 64 shards on the
source, then moves shards 32-63 while WRITERS threads write to every shard
and time each write. Prints copy rows/s and MB/s, how long the fence held
and where that time went, and the max and p99 time a write to a moving
shard waited or was retried. Writes to the other shards must never fail.
With ``--runs N`` it does all that N times (fresh servers each time) and
ends with one line per run.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orjson
from move_bench import MOVING, SHARDS, main, move_under_writers, report

from store import Store, StoreConfig
from store.admin import init_shards
from store.ids import encode_pinterest
from store.tools.timing import PIN
from tests.conftest import base_config
from tests.servers import MariaDBServer


def bench(objects: int) -> dict[str, Any]:
    """One run: fresh servers, load, move shards 32-63 under writers; the figures."""
    tmp = Path(tempfile.mkdtemp(prefix="store-bench-move-"))
    source = MariaDBServer(3351, log_bin=True, server_id=1)
    target = MariaDBServer(3352, log_bin=True, server_id=2)
    source.start()
    target.start()
    try:
        raw = base_config(
            shards=SHARDS,
            hosts={"A": source.url, "B": target.url},
            map=[{"range": [0, SHARDS - 1], "master": "A"}],
            map_source={"file": str(tmp / "map.yaml"), "poll_s": 0.5},
        )
        config = StoreConfig.from_dict(raw)
        init_shards(config)
        with Store(config) as store:
            text = orjson.dumps(PIN).decode()
            per_shard = objects // SHARDS
            for s in range(SHARDS):
                h = store.admin_context().engines.shard(s, "A")
                with h.connect() as conn:
                    cur = conn.cursor()
                    cur.executemany(
                        f"INSERT INTO {h.table('pins')} (data) VALUES (%s)", [(text,)] * per_shard
                    )
            print(f"loaded {per_shard * SHARDS:,} objects ({per_shard * len(MOVING):,} on the moving shards)")
            journal, rows, waits, other_errors = move_under_writers(
                store,
                tmp / "move.json",
                lambda rng, shard: encode_pinterest(shard, 1, rng.randrange(1, per_shard)),
            )
            checksums = f"; checksums before the fence {journal.timings.get('checksum_s', 0):.2f} s"
            return report(journal, rows, waits, other_errors, fence_said=checksums)
    finally:
        source.remove()
        target.remove()


if __name__ == "__main__":
    main(__doc__, bench)
