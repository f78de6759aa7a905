"""`store bench`, ticket cases: IDs from the pair, and from the pair with blocks.

The floor is the allocator's own statement, ``UPDATE tickets.ticket_ids SET
next_id = LAST_INSERT_ID(next_id) + N`` on the counter's row of the first
server, sent on a PyMySQL connection of its own (the ID comes back in the
same round trip, as it does for the allocator). Throughput is one thread's:
1e6 / mean microseconds per ID. Threads against the REPLACE path:
``scripts/bench_tickets.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from sqlalchemy.engine import make_url

from store.backends.mysql.driver import mysql_connector
from store.config import TicketsConfig
from store.tickets import IDS_TABLE, TICKETS_DATABASE, TicketAllocator
from store.tools.timing import BenchResult, pair

__all__ = ["BLOCK", "ticket_cases"]

BLOCK = 100


def _next_of(alloc: TicketAllocator, counter: str) -> Callable[[int], int]:
    return lambda _i: alloc.next(counter)


def ticket_cases(config: TicketsConfig, n: int, say: Callable[[str], None]) -> list[BenchResult]:
    """Per-ID latency of the allocator next to its raw UPDATE, in one run."""
    # No one-server case: a client listing one server of an initialised
    # pair is refused (its place says "offset 1 of 2").
    both = TicketAllocator(replace(config, counters=("bench",), block=1))
    blocked = TicketAllocator(replace(config, counters=("bench_block",), block=BLOCK))
    allocators = (both, blocked)
    try:
        raw = mysql_connector(make_url(config.servers[0]))()
        for a in allocators:
            a.init()
    except Exception as exc:  # the servers are optional for the rest of the bench
        say(f"skipping the ticket cases: the ticket servers are not set up or reachable ({exc})")
        for a in allocators:
            a.close()
        return []
    try:
        cur = raw.cursor()
        # The same row the allocator's server 1 advances, by the same step:
        # the floor's IDs are server 1's too, never the allocator's.
        sql = (
            f"UPDATE `{TICKETS_DATABASE}`.`{IDS_TABLE}` SET `next_id` = LAST_INSERT_ID(`next_id`) + "
            f"{len(config.servers)} WHERE `counter` = 'bench'"
        )

        def raw_ticket(_i: int) -> None:
            cur.execute(sql)
            _ = cur.lastrowid

        results = []
        for case, alloc, counter in (
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
