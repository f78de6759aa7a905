"""SQLAlchemy's QueuePool against `store.pool.ConnectionPool`, at 1, 4 and 16 threads, in one run.

Each thread checks a connection out, runs a primary-key read of a 300-byte
row (or nothing, for the pool's own cost), and gives it back. Both pools
hold real PyMySQL connections to the MariaDB on 127.0.0.1:3306 made by the
same function; QueuePool runs with the settings that fit the store (LIFO, no
reset on return: the store commits or rolls back itself). The figure is the
mean wall time per call, across threads, of `ROUNDS` rounds (each pool's
rounds alternate with the other's).

    .venv/bin/python scripts/bench_pool.py
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy.engine import make_url
from sqlalchemy.pool import QueuePool

from store.backends.mysql import mysql_connector
from store.pool import ConnectionPool

CALLS = 2000
ROUNDS = 5
URL = make_url("mysql+pymysql://root@127.0.0.1:3306")


def setup() -> None:
    conn = mysql_connector(URL)()
    cur = conn.cursor()
    cur.execute("CREATE DATABASE IF NOT EXISTS store_bench_pool")
    cur.execute("CREATE TABLE IF NOT EXISTS store_bench_pool.t (id BIGINT PRIMARY KEY, data TEXT)")
    cur.execute("REPLACE INTO store_bench_pool.t VALUES (1, %s)", ("x" * 300,))
    conn.close()


def store_pool(size: int) -> tuple[Callable[[], Any], Callable[[Any], None]]:
    pool = ConnectionPool(mysql_connector(URL), name="bench", max_open=2 * size, max_idle=size)

    def get() -> Any:
        return pool.checkout()

    def put(held: Any) -> None:
        pool.checkin(*held)

    return get, put


def sa_pool(size: int) -> tuple[Callable[[], Any], Callable[[Any], None]]:
    pool = QueuePool(
        mysql_connector(URL), pool_size=size, max_overflow=size, use_lifo=True, reset_on_return=None
    )
    return pool.connect, lambda fairy: fairy.close()


def run(
    make: Callable[[int], tuple[Callable[[], Any], Callable[[Any], None]]], threads: int, query: bool
) -> float:
    get, put = make(max(threads, 4))
    # Open the connections first: the figure is the steady state.
    held = [get() for _ in range(threads)]
    for h in held:
        put(h)
    per_call: list[float] = []
    lock = threading.Lock()

    def work() -> None:
        started = time.perf_counter()
        for _ in range(CALLS):
            h = get()
            if query:
                raw = h[0] if isinstance(h, tuple) else h
                cur = raw.cursor()
                cur.execute("SELECT data FROM store_bench_pool.t WHERE id = %s", (1,))
                cur.fetchone()
                cur.close()
            put(h)
        with lock:
            per_call.append((time.perf_counter() - started) / CALLS)

    ts = [threading.Thread(target=work) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return statistics.fmean(per_call) * 1e6


def main() -> None:
    setup()
    print("| threads | work | store.pool (us/call) | QueuePool (us/call) | difference |")
    print("|---:|:---|---:|---:|---:|")
    for threads in (1, 4, 16):
        for query in (False, True):
            mine, theirs = [], []
            for _ in range(ROUNDS):
                mine.append(run(store_pool, threads, query))
                theirs.append(run(sa_pool, threads, query))
            a, b = statistics.median(mine), statistics.median(theirs)
            work = "PK read" if query else "checkout + checkin"
            print(f"| {threads} | {work} | {a:.1f} | {b:.1f} | {b - a:+.1f} us |")


if __name__ == "__main__":
    main()
