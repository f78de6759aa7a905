"""`store bench`, ticket cases: IDs from one server, the pair, and the pair with blocks.

The floor is the raw ``REPLACE INTO ... (stub) VALUES ('a')`` on a PyMySQL
connection of its own to the first server (LAST_INSERT_ID() comes back in the
same round trip, as it does for the allocator). Throughput is one thread's:
1e6 / mean microseconds per ID.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from sqlalchemy.engine import make_url

from store.backends.mysql import mysql_connector
from store.config import TicketsConfig
from store.tickets import TICKETS_DATABASE, TicketAllocator
from store_tools.timing import BenchResult, pair

__all__ = ["BLOCK", "ticket_cases"]

BLOCK = 100


def _next_of(alloc: TicketAllocator, counter: str) -> Callable[[int], int]:
    return lambda _i: alloc.next(counter)


def ticket_cases(config: TicketsConfig, n: int, say: Callable[[str], None]) -> list[BenchResult]:
    """Per-ID latency of the allocator next to the raw REPLACE, in one run."""
    one = TicketAllocator(replace(config, servers=config.servers[:1], counters=("bench",), block=1))
    both = TicketAllocator(replace(config, counters=("bench",), block=1))
    blocked = TicketAllocator(replace(config, counters=("bench_block",), block=BLOCK))
    allocators = (one, both, blocked)
    try:
        raw = mysql_connector(make_url(config.servers[0]))()
        for a in allocators:
            a.init()
    except Exception as exc:  # the servers are optional for the rest of the bench
        say(f"skipping the ticket cases: the ticket servers are not reachable ({exc})")
        for a in allocators:
            a.close()
        return []
    try:
        cur = raw.cursor()
        sql = f"REPLACE INTO `{TICKETS_DATABASE}`.`tickets_bench` (stub) VALUES ('a')"

        def raw_ticket(_i: int) -> None:
            cur.execute(sql)
            _ = cur.lastrowid

        results = []
        for case, alloc, counter in (
            ("ticket, 1 server", one, "bench"),
            (f"ticket, {len(config.servers)} servers", both, "bench"),
            (f"ticket, block {BLOCK}", blocked, "bench_block"),
        ):
            say(case)
            results.append(pair(case, _next_of(alloc, counter), raw_ticket, n))
        cur.close()
        return results
    finally:
        raw.close()
        for a in allocators:
            a.close()
