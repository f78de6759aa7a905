"""Ticket IDs per second: the counter row's UPDATE against the REPLACE path, at 1 and 8 threads, in one run.

Two MariaDB servers of the script's own (as the tests start them:
``innodb_flush_log_at_trx_commit=2``). One counter is set up by `store
tickets init` (one ``UPDATE ... LAST_INSERT_ID(next_id) + 2`` per ID); the
other the way the REPLACE version did it (``REPLACE INTO tickets_<counter>``,
which this version's allocator still sends until init switches the counter),
so both paths run through the same allocator code, pool and round robin.
Each round, T threads take IDs as fast as they can; the rounds of the two
paths alternate. Printed: the median IDs/s over the rounds, the IDs skipped
per 10,000 (per server, the holes between its lowest and highest ID of the
round) and the deadlocks or lock waits retried per 10,000.

    .venv/bin/python scripts/bench_tickets.py [IDS_PER_THREAD]
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pymysql

from store.config import TicketsConfig
from store.tickets import TicketAllocator
from tests.servers import MariaDBServer

PORTS = (3353, 3354)
ROUNDS = 3
THREADS = (1, 8)


def set_up_the_replace_way(server: MariaDBServer, counter: str) -> None:
    """The REPLACE table and block size the REPLACE version's `store tickets init` made."""
    conn = pymysql.connect(host="127.0.0.1", port=server.port, user="root", autocommit=True)
    cur = conn.cursor()
    cur.execute(
        f"CREATE TABLE tickets.tickets_{counter} (id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT, "
        "stub CHAR(1) NOT NULL DEFAULT '', PRIMARY KEY (id), UNIQUE KEY stub (stub)) ENGINE=InnoDB"
    )
    cur.execute("INSERT INTO tickets.ticket_counters VALUES (%s, 1)", (counter,))
    conn.close()


def allocator(urls: list[str], counter: str) -> TicketAllocator:
    return TicketAllocator(TicketsConfig.from_dict({"servers": urls, "counters": [counter]}))


def skipped(ids: list[int], n: int) -> int:
    """IDs never handed out between each server's lowest and highest of ``ids``."""
    total = 0
    for residue in range(n):
        mine = [i for i in ids if i % n == residue]
        if mine:
            total += (max(mine) - min(mine)) // n + 1 - len(mine)
    return total


def run(alloc: TicketAllocator, counter: str, threads: int, each: int) -> tuple[float, list[int]]:
    """IDs per second of ``threads`` threads taking ``each`` IDs; every ID taken."""
    got: list[list[int]] = [[] for _ in range(threads)]

    def work(t: int) -> None:
        for _ in range(each):
            got[t].append(alloc.next(counter))

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    started = time.perf_counter()
    for th in workers:
        th.start()
    for th in workers:
        th.join()
    took = time.perf_counter() - started
    ids = [i for g in got for i in g]
    assert len(ids) == threads * each, "a thread failed"
    assert len(set(ids)) == len(ids), "an ID was handed out twice"
    return len(ids) / took, ids


def main(each: int) -> None:
    servers = [MariaDBServer(port) for port in PORTS]
    try:
        for s in servers:
            s.start()
        urls = [s.url for s in servers]
        allocator(urls, "rows").init()
        for s in servers:
            set_up_the_replace_way(s, "replaced")
        paths = {
            "UPDATE (counter row)": ("rows", allocator(urls, "rows")),
            "REPLACE (old path)": ("replaced", allocator(urls, "replaced")),
        }
        for counter, alloc in paths.values():
            alloc.next_many(counter, 8)  # places checked, first connections open
        head = f"{'threads':>7} | {'path':<22} | {'IDs/s':>7} | {'rounds (IDs/s)':<21}"
        print(f"{head} | skipped /10k | retried /10k")
        for threads in THREADS:
            rates: dict[str, list[float]] = {name: [] for name in paths}
            gaps: dict[str, int] = dict.fromkeys(paths, 0)
            retries_before = {name: sum(s.retries for s in a.stats()) for name, (_c, a) in paths.items()}
            for _ in range(ROUNDS):
                for name, (counter, alloc) in paths.items():
                    rate, ids = run(alloc, counter, threads, each)
                    rates[name].append(rate)
                    gaps[name] += skipped(ids, len(servers))
            taken = ROUNDS * threads * each
            for name, (_counter, alloc) in paths.items():
                retried = sum(s.retries for s in alloc.stats()) - retries_before[name]
                rounds = ", ".join(f"{r:,.0f}" for r in rates[name])
                print(
                    f"{threads:>7} | {name:<22} | {statistics.median(rates[name]):>7,.0f} | {rounds:<21} | "
                    f"{1e4 * gaps[name] / taken:>12.1f} | {1e4 * retried / taken:>12.1f}"
                )
            new, old = (statistics.median(r) for r in rates.values())
            print(f"{threads:>7} | UPDATE / REPLACE: {new / old:.2f}x")
        for _counter, alloc in paths.values():
            alloc.close()
    finally:
        for s in servers:
            s.remove()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2_500)
