"""Flickr ticket servers: real MariaDB servers started by the tests, killed, stopped and locked mid-run."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pymysql
import pymysql.cursors
import pytest
import yaml
from click.testing import CliRunner
from sqlalchemy.engine import URL

import store.tickets
from store import ConfigError
from store.cli import main
from store.config import TicketsConfig
from store.tickets import TicketAllocator, TicketError
from tests.servers import MariaDBServer

COUNTERS = ["photos", "accounts", "groups", "split", "contended", "deadlocked", "vanished"]


@pytest.fixture(scope="module")
def servers() -> Iterator[list[MariaDBServer]]:
    pair = [MariaDBServer() for _ in range(2)]
    try:
        for s in pair:
            s.start()
        yield pair
    finally:
        for s in pair:
            s.remove()


def running(servers: list[MariaDBServer]) -> list[MariaDBServer]:
    """The servers, restarted if an earlier test left one killed."""
    for s in servers:
        if s.proc is None:
            s.start()
    return servers


def allocator(servers: list[MariaDBServer], **options: object) -> TicketAllocator:
    raw = {"servers": [s.url for s in servers], "counters": COUNTERS, **options}
    return TicketAllocator(TicketsConfig.from_dict(raw))


def wait_until(done: Callable[[], bool], what: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() > deadline:
            pytest.fail(f"gave up after {seconds} s waiting for {what}")
        time.sleep(0.01)


def root(server: MariaDBServer) -> Any:
    """A plain autocommit connection of the test's own."""
    return pymysql.connect(host="127.0.0.1", port=server.port, user="root", autocommit=True)


class Hammer:
    """``threads`` threads, each taking ``each`` IDs from ``counter`` as fast as it can."""

    def __init__(self, alloc: TicketAllocator, counter: str, threads: int, each: int) -> None:
        self.got: list[list[int]] = [[] for _ in range(threads)]
        self.errors: list[BaseException] = []
        self._workers = [
            threading.Thread(target=self._work, args=(alloc, counter, t, each)) for t in range(threads)
        ]
        for th in self._workers:
            th.start()

    def _work(self, alloc: TicketAllocator, counter: str, t: int, each: int) -> None:
        try:
            for _ in range(each):
                self.got[t].append(alloc.next(counter))
        except BaseException as exc:  # surfaced by the test
            self.errors.append(exc)

    def total(self) -> int:
        return sum(len(g) for g in self.got)

    def reached(self, n: int) -> bool:
        """True once ``n`` IDs are out, or a thread failed (the test then reports it)."""
        return self.total() >= n or bool(self.errors)

    def join(self) -> list[int]:
        """Every ID handed out, after checking that no thread failed."""
        for th in self._workers:
            th.join()
        assert self.errors == []
        return [i for g in self.got for i in g]


def test_distinct_tickets_with_a_server_killed_and_back(servers: list[MariaDBServer]) -> None:
    alloc = allocator(running(servers), retry_after_s=0.5, timeout_s=2)
    alloc.init()
    run = Hammer(alloc, "photos", 8, 4_000)
    wait_until(lambda: run.reached(8_000), "8,000 tickets")
    servers[1].kill()  # mid-run
    at_kill = run.total()
    wait_until(lambda: run.reached(at_kill + 8_000), "8,000 more tickets from server 1 alone")
    servers[1].start()  # back, with its counter where InnoDB left it
    at_restart = alloc.served()
    every = run.join()
    # Server 2 is asked again retry_after_s after its last failure; if the hammer finished first,
    # go on taking tickets (a bounded while) until it serves.
    deadline = time.monotonic() + 15
    while alloc.served()[1] == at_restart[1] and time.monotonic() < deadline:
        every.append(alloc.next("photos"))
    assert len(every) >= 32_000
    assert len(set(every)) == len(every), "an ID was handed out twice"
    odd = sum(1 for i in every if i % 2)
    served = alloc.served()
    assert odd == served[0], "server 1 hands out the odd IDs"
    assert len(every) - odd == served[1], "server 2 hands out the even IDs"
    assert served[1] > at_restart[1], "server 2 serves again after its restart"
    assert served[0] > served[1]  # server 1 carried the load while server 2 was down
    assert alloc.stats()[1].failures >= 1
    # Server 1 stayed up: no ID of its is skipped. Server 2 skips an ID only
    # for an UPDATE that committed while its reply was lost to the kill.
    odd_ids, even_ids = sorted(i for i in every if i % 2), sorted(i for i in every if i % 2 == 0)
    assert odd_ids == list(range(odd_ids[0], odd_ids[-1] + 1, 2)), "server 1 skipped an ID"
    skipped = (even_ids[-1] - even_ids[0]) // 2 + 1 - len(even_ids)
    assert alloc.stats()[0].unknown == 0
    assert skipped <= alloc.stats()[1].unknown, f"server 2 skipped {skipped} IDs, more than its lost replies"
    alloc.close()


def test_many_threads_on_healthy_servers_split_evenly_without_tripping(servers: list[MariaDBServer]) -> None:
    # Concurrent REPLACEs of the one stub row deadlocked now and then; counted
    # as failures, they used to trip the breaker and skew the split (9,369
    # vs 10,631 in one run). Lock waits on the counter row are no failures.
    alloc = allocator(running(servers))
    alloc.init()
    every = Hammer(alloc, "split", 8, 2_500).join()
    assert len(set(every)) == len(every) == 20_000
    odd = sum(1 for i in every if i % 2)
    assert alloc.served() == [odd, 20_000 - odd]
    assert abs(odd - (20_000 - odd)) <= 8, f"round robin skewed: {odd} odd, {20_000 - odd} even"
    for s in alloc.stats():
        assert s.failures == 0, f"{s.server} was counted as failed: {s}"
        assert s.available
    alloc.close()


def dense_per_server(ids: list[int], servers: int) -> list[list[int]]:
    """The IDs grouped by server (residue), each group checked to be an arithmetic run with no skip."""
    groups = []
    for offset in range(1, servers + 1):
        mine = sorted(i for i in ids if i % servers == offset % servers)
        if mine:
            expected = list(range(mine[0], mine[-1] + 1, servers))
            skipped = sorted(set(expected) - set(mine))
            assert mine == expected, f"server {offset} skipped {len(skipped)} IDs, the first {skipped[:10]}"
        groups.append(mine)
    return groups


def test_eight_threads_on_a_healthy_pair_skip_no_id(servers: list[MariaDBServer]) -> None:
    # Under REPLACE, a deadlock's rollback used the auto-increment value and
    # the retry took the next one: 11-25 IDs per 10,000 were never handed out.
    alloc = allocator(running(servers), counters=["dense"])
    alloc.init()
    every = Hammer(alloc, "dense", 8, 2_500).join()
    assert len(set(every)) == len(every) == 20_000
    odd, even = dense_per_server(every, 2)
    assert (odd[0], even[0]) == (1, 2), "a new counter starts at each server's offset"
    assert alloc.served() == [len(odd), len(even)]
    alloc.close()


def test_a_lock_wait_is_retried_on_the_same_server(servers: list[MariaDBServer]) -> None:
    running(servers)
    allocator(servers).init()
    admin = root(servers[0])
    holder = root(servers[0])
    cur = admin.cursor()
    cur.execute("SELECT @@GLOBAL.innodb_lock_wait_timeout")
    (old_wait,) = cur.fetchone()
    # New sessions give up on a lock after 1 s with error 1205; the client's
    # read timeout (5 s) must not fire first.
    cur.execute("SET GLOBAL innodb_lock_wait_timeout = 1")
    try:
        alloc = allocator(servers, timeout_s=5)
        first = alloc.next_many("contended", 2)  # the stub rows exist on both servers
        holder.begin()
        holder.cursor().execute(
            "SELECT next_id FROM tickets.ticket_ids WHERE counter = 'contended' FOR UPDATE"
        )
        result: list[int] = []
        taker = threading.Thread(target=lambda: result.append(alloc.next("contended")))  # server 1's turn
        taker.start()
        wait_until(lambda: alloc.stats()[0].retries >= 1, "a lock wait timeout on server 1", 10)
        holder.rollback()
        taker.join(10)
        assert len(result) == 1, "the call did not finish once the lock was released"
        assert result[0] % 2 == 1, "the retry went to server 1, not to the other server"
        assert result[0] not in first
        one = alloc.stats()[0]
        assert one.failures == 0
        assert one.available
        assert one.retries >= 1
        assert alloc.served() == [2, 1]
        alloc.close()
    finally:
        cur.execute(f"SET GLOBAL innodb_lock_wait_timeout = {int(old_wait)}")
        holder.close()
        admin.close()


def test_a_deadlock_is_retried_on_the_same_server(
    servers: list[MariaDBServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A single-row UPDATE does not deadlock with its like, but it can with
    # someone's own transaction on the row; this one is injected so that the
    # 1213 path runs every time.
    running(servers)
    real = store.tickets._connector
    pending = [1213]

    class DeadlockOnceCursor(pymysql.cursors.Cursor):  # type: ignore[misc]
        """Fails the first ID statement with error 1213, as InnoDB does to a deadlock victim."""

        def execute(self, query: str, args: object = None) -> int:
            if query.startswith("UPDATE") and pending:
                raise pymysql.err.OperationalError(pending.pop(), "Deadlock found when trying to get lock")
            return int(super().execute(query, args))

    def deadlocking(
        url: URL, timeout_s: float, setup: str | None
    ) -> tuple[Callable[[], Any], type[Exception]]:
        connect, error = real(url, timeout_s, setup)

        def connect_deadlocking() -> Any:
            conn = connect()
            conn.cursorclass = DeadlockOnceCursor
            return conn

        return connect_deadlocking, error

    monkeypatch.setattr(store.tickets, "_connector", deadlocking)
    alloc = allocator(servers)
    alloc.init()
    value = alloc.next("deadlocked")
    assert value % 2 == 1, "the retry went to server 1, not to the other server"
    assert pending == [], "the deadlock was injected"
    one = alloc.stats()[0]
    assert (one.served, one.failures, one.retries, one.available) == (1, 0, 1, True)
    alloc.close()


def test_a_reordered_or_shorter_server_list_is_refused(servers: list[MariaDBServer]) -> None:
    s1, s2 = running(servers)
    allocator([s1, s2]).init()
    swapped = allocator([s2, s1])
    for _ in range(2):  # and it stays refused
        with pytest.raises(
            TicketError,
            match=rf"server 1 \(mysql\+pymysql://root@127\.0\.0\.1:{s2.port}\) was set up as offset 2 of 2 "
            r"by `store tickets init`; this client lists it at position 1 of 2: put the servers in the same "
            r"order as when they were initialised",
        ):
            swapped.next("photos")
    assert swapped.served() == [0, 0]
    swapped.close()
    # init with the swapped list changes nothing on either server.
    with pytest.raises(TicketError, match="was set up as offset 2 of 2"):
        allocator([s2, s1]).init()
    alone = allocator([s2])
    with pytest.raises(TicketError, match=r"offset 2 of 2 .* position 1 of 1: list all 2 servers"):
        alone.next("photos")
    assert alone.served() == [0]
    alone.close()
    with pytest.raises(TicketError, match=r"offset 1 of 2 .* position 1 of 1"):
        allocator([s1]).next("photos")
    # The right order still works: odd from server 1, even from server 2.
    good = allocator([s1, s2])
    assert [i % 2 for i in good.next_many("photos", 2)] == [1, 0]
    good.close()
    # init also set the servers' GLOBAL defaults, for other clients.
    for s, offset in ((s1, 1), (s2, 2)):
        conn = root(s)
        try:
            cur = conn.cursor()
            cur.execute("SELECT @@GLOBAL.auto_increment_increment, @@GLOBAL.auto_increment_offset")
            assert cur.fetchone() == (2, offset)
        finally:
            conn.close()


def init_the_replace_way(server: MariaDBServer, position: int, n: int, counter: str) -> None:
    """What `store tickets init` did before counter rows: a place, a block size and a REPLACE table."""
    conn = root(server)
    try:
        cur = conn.cursor()
        cur.execute("CREATE DATABASE IF NOT EXISTS tickets")
        cur.execute(
            "CREATE TABLE IF NOT EXISTS tickets.ticket_server (`one` TINYINT UNSIGNED NOT NULL DEFAULT 1 "
            "PRIMARY KEY CHECK (`one` = 1), auto_increment_increment INT UNSIGNED NOT NULL, "
            "auto_increment_offset INT UNSIGNED NOT NULL, "
            "recorded_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP) ENGINE=InnoDB"
        )
        cur.execute("INSERT IGNORE INTO tickets.ticket_server VALUES (1, %s, %s, DEFAULT)", (n, position))
        cur.execute(
            "CREATE TABLE IF NOT EXISTS tickets.ticket_counters "
            "(counter VARCHAR(64) NOT NULL PRIMARY KEY, block INT NOT NULL) ENGINE=InnoDB"
        )
        cur.execute(
            f"CREATE TABLE IF NOT EXISTS tickets.tickets_{counter} ("
            "id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT, stub CHAR(1) NOT NULL DEFAULT '', "
            "PRIMARY KEY (id), UNIQUE KEY stub (stub)) ENGINE=InnoDB"
        )
        cur.execute("INSERT IGNORE INTO tickets.ticket_counters VALUES (%s, 1)", (counter,))
        cur.execute(f"SET GLOBAL auto_increment_increment = {n}, auto_increment_offset = {position}")
    finally:
        conn.close()


class OldClient:
    """Threads sending what a client of the REPLACE version sent, round robin, until stopped."""

    def __init__(self, servers: list[MariaDBServer], counter: str, threads: int) -> None:
        self.got: list[int] = []
        self.refusals: list[int] = []  # error numbers of the statements the servers refused
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._sql = f"REPLACE INTO tickets.tickets_{counter} (stub) VALUES ('a')"
        self._workers = [threading.Thread(target=self._work, args=(servers, t)) for t in range(threads)]
        for th in self._workers:
            th.start()

    def _work(self, servers: list[MariaDBServer], t: int) -> None:
        conns = [root(s) for s in servers]
        for position, conn in enumerate(conns, 1):
            conn.cursor().execute(
                f"SET SESSION auto_increment_increment = {len(conns)}, auto_increment_offset = {position}"
            )
        turn = t
        while not self.stop.is_set():
            cur = conns[turn % len(conns)].cursor()
            turn += 1
            try:
                cur.execute(self._sql)
                value = int(cur.lastrowid)
            except pymysql.err.MySQLError as exc:
                with self._lock:
                    self.refusals.append(int(exc.args[0]))
                time.sleep(0.001)
                continue
            with self._lock:
                self.got.append(value)
        for conn in conns:
            conn.close()

    def join(self) -> None:
        self.stop.set()
        for th in self._workers:
            th.join()


class Until:
    """Threads taking IDs from ``counter`` through ``alloc`` until stopped."""

    def __init__(self, alloc: TicketAllocator, counter: str, threads: int) -> None:
        self.got: list[list[int]] = [[] for _ in range(threads)]
        self.errors: list[BaseException] = []
        self.stop = threading.Event()
        self._workers = [
            threading.Thread(target=self._work, args=(alloc, counter, t)) for t in range(threads)
        ]
        for th in self._workers:
            th.start()

    def _work(self, alloc: TicketAllocator, counter: str, t: int) -> None:
        try:
            while not self.stop.is_set():
                self.got[t].append(alloc.next(counter))
        except BaseException as exc:  # surfaced by the test
            self.errors.append(exc)

    def total(self) -> int:
        return sum(len(g) for g in self.got)

    def join(self) -> list[int]:
        self.stop.set()
        for th in self._workers:
            th.join()
        assert self.errors == []
        return [i for g in self.got for i in g]


def test_an_upgrade_from_replace_while_old_clients_run() -> None:
    pair = [MariaDBServer() for _ in range(2)]  # set up the way the REPLACE version did it
    try:
        for position, s in enumerate(pair, 1):
            s.start()
            init_the_replace_way(s, position, 2, "photos")
        old = OldClient(pair, "photos", 2)
        new_alloc = allocator(pair, counters=["photos"])
        new = Until(new_alloc, "photos", 4)  # no counter row yet: the REPLACE path, the same table
        wait_until(lambda: len(old.got) >= 500 and new.total() >= 1_000, "IDs from old and new clients")
        allocator(pair, counters=["photos"]).init()  # while both kinds of client run
        at_switch = new.total()
        wait_until(lambda: new.total() >= at_switch + 4_000, "4,000 IDs after the switch")
        from_new, from_old = new.join(), old.got
        old.join()
        every = from_new + from_old
        assert len(set(every)) == len(every), "an ID was handed out twice"
        assert from_old, "the old clients took IDs before the switch"
        assert set(old.refusals) <= {1213, 1471}, f"old clients met other errors: {old.refusals}"
        assert 1471 in old.refusals, "after the switch the old clients' REPLACE is refused"
        assert all(s.failures == 0 for s in new_alloc.stats())
        for position, s in enumerate(pair, 1):
            conn = root(s)
            cur = conn.cursor()
            cur.execute(
                "SELECT TABLE_NAME, TABLE_TYPE FROM information_schema.TABLES WHERE TABLE_SCHEMA = 'tickets' "
                "AND TABLE_NAME IN ('tickets_photos', 'replaced_photos') ORDER BY TABLE_NAME"
            )
            assert cur.fetchall() == (("replaced_photos", "BASE TABLE"), ("tickets_photos", "VIEW"))
            cur.execute(
                "SELECT AUTO_INCREMENT FROM information_schema.TABLES "
                "WHERE TABLE_SCHEMA = 'tickets' AND TABLE_NAME = 'replaced_photos'"
            )
            (auto_increment,) = cur.fetchone()
            conn.close()
            mine = sorted(i for i in every if i % 2 == position % 2)
            start = store.tickets._first_above(int(auto_increment) - 1, position, 2)
            before = [i for i in mine if i < start]
            after = [i for i in mine if i >= start]
            assert set(before) & set(from_new), f"the new client took IDs by REPLACE from server {position}"
            # From the switch on, one counter row: no ID skipped, none an old client's.
            assert after == list(range(start, after[-1] + 1, 2)), f"server {position} skipped an ID"
            assert not set(after) & set(from_old)
        new_alloc.close()
        # init again changes nothing; an older version's init meets the view and leaves it.
        rows_before = [ticket_rows(s) for s in pair]
        allocator(pair, counters=["photos"]).init()
        assert [ticket_rows(s) for s in pair] == rows_before
        for position, s in enumerate(pair, 1):
            init_the_replace_way(s, position, 2, "photos")
        late = OldClient(pair, "photos", 1)
        wait_until(lambda: len(late.refusals) >= 4, "an old client's calls after the switch")
        late.join()
        assert late.got == []
        assert set(late.refusals) == {1471}
        again = allocator(pair, counters=["photos"])
        odd_next, even_next = (row["photos"] for row in rows_before)
        assert again.next_many("photos", 4) == [odd_next, even_next, odd_next + 2, even_next + 2]
        again.close()
    finally:
        for s in pair:
            s.remove()


def ticket_rows(server: MariaDBServer) -> dict[str, int]:
    """The counter rows of ``server``: counter -> next_id."""
    conn = root(server)
    try:
        cur = conn.cursor()
        cur.execute("SELECT counter, next_id FROM tickets.ticket_ids")
        return {str(c): int(v) for c, v in cur.fetchall()}
    finally:
        conn.close()


def test_a_counter_row_deleted_by_hand_is_not_started_again(servers: list[MariaDBServer]) -> None:
    s1, _s2 = running(servers)
    alloc = allocator(servers)
    alloc.init()
    taken = alloc.next_many("vanished", 6)
    conn = root(s1)
    try:
        cur = conn.cursor()
        cur.execute("SELECT next_id FROM tickets.ticket_ids WHERE counter = 'vanished'")
        (next_id,) = cur.fetchone()
        cur.execute("DELETE FROM tickets.ticket_ids WHERE counter = 'vanished'")
        with pytest.raises(TicketError, match=r"no tickets\.ticket_ids row for 'vanished' any more"):
            alloc.next("vanished")  # server 1's turn
        # init would start it at 1 again: it refuses, and says what to do.
        with pytest.raises(
            TicketError,
            match=r"server 1 .* no tickets\.ticket_ids row for 'vanished', made .* and deleted since: "
            r"the highest ID it handed out is unknown, so init will not start the counter again; insert "
            r"the row by hand, next_id above every ID of 'vanished' and equal to 1 modulo 2",
        ):
            allocator(servers).init()
        cur.execute("INSERT INTO tickets.ticket_ids VALUES ('vanished', %s)", (next_id,))
    finally:
        conn.close()
    alloc.init()
    more = alloc.next_many("vanished", 4)
    assert not set(more) & set(taken)
    assert sorted(i for i in more if i % 2) == [next_id, next_id + 2]
    alloc.close()


def test_a_server_never_initialised_says_to_run_init() -> None:
    fresh = MariaDBServer()  # a server that `store tickets init` never saw
    try:
        fresh.start()
        alloc = allocator([fresh])
        with pytest.raises(
            TicketError,
            match=rf"server 1 \(mysql\+pymysql://root@127\.0\.0\.1:{fresh.port}\) has no recorded place .*"
            r"run `store tickets init`",
        ):
            alloc.next("photos")
        alloc.init()
        assert alloc.next_many("photos", 3) == [1, 2, 3]  # one server: offset 1 of 1
        alloc.close()
    finally:
        fresh.remove()


def test_a_hung_server_is_skipped_within_the_timeout(servers: list[MariaDBServer]) -> None:
    running(servers)
    alloc = allocator(servers, timeout_s=1.0, retry_after_s=1.0)
    alloc.init()
    ids = alloc.next_many("photos", 4)  # both servers checked, connections pooled
    # On a loaded machine a call of the warm-up can itself pass the 1 s timeout and skip its
    # server for a while: start from both servers available, and count failures from here.
    deadline = time.monotonic() + 10
    while not all(s.available for s in alloc.stats()):
        assert time.monotonic() < deadline, alloc.stats()
        time.sleep(0.1)
    failures = alloc.stats()[1].failures
    hung = servers[1].proc
    assert hung is not None
    servers[1].freeze()  # (returns once every thread of it has stopped)
    try:
        took: list[float] = []
        for _ in range(6):
            started = time.monotonic()
            ids.append(alloc.next("photos"))
            took.append(time.monotonic() - started)
        assert max(took) < 1.0 + 0.5, f"a call waited too long for the hung server: {took}"
        assert sum(t > 0.5 for t in took) == 1, f"only one call should wait, then it is skipped: {took}"
        assert all(i % 2 for i in ids[4:]), f"server 2 served while it hung: {ids}, {took}, {alloc.stats()}"
        hung_stats = alloc.stats()[1]
        assert hung_stats.failures == failures + 1
        assert not hung_stats.available
    finally:
        os.kill(hung.pid, signal.SIGCONT)
    time.sleep(1.0)  # retry_after_s
    assert alloc.stats()[1].available
    more = alloc.next_many("photos", 4)
    assert [i % 2 for i in more].count(0) == 2, "server 2 serves again"
    ids += more
    assert len(set(ids)) == len(ids)
    # The UPDATE that timed out ran once the server woke up: the one gap,
    # and the one statement counted as a lost reply.
    even = sorted(i for i in ids if i % 2 == 0)
    assert hung_stats.unknown == 1
    assert (even[-1] - even[0]) // 2 + 1 - len(even) <= 1
    alloc.close()


def test_counters_are_separate_and_blocks_stay_unique(servers: list[MariaDBServer]) -> None:
    alloc = allocator(running(servers))
    alloc.init()
    a, b = alloc.next_many("accounts", 5), alloc.next_many("groups", 5)
    assert len(set(a)) == 5
    assert len(set(b)) == 5
    with pytest.raises(TicketError, match="unknown counter 'nope'"):
        alloc.next("nope")
    alloc.close()
    # Block reservation on its own counter: one round trip per 100 IDs.
    blocks = TicketAllocator(
        TicketsConfig.from_dict({"servers": [s.url for s in servers], "counters": ["blocked"], "block": 100})
    )
    blocks.init()
    ids = blocks.next_many("blocked", 1000)
    assert len(set(ids)) == 1000
    assert sum(blocks.served()) == 10
    blocks.close()
    # A client with another block size for the same counter is refused.
    other = TicketAllocator(
        TicketsConfig.from_dict({"servers": [s.url for s in servers], "counters": ["blocked"], "block": 10})
    )
    with pytest.raises(TicketError, match="set up with block 100"):
        other.next("blocked")
    other.close()


def test_all_servers_down_is_a_clear_error() -> None:
    alloc = TicketAllocator(
        TicketsConfig.from_dict(
            {
                "servers": ["mysql+pymysql://app:s3cret@127.0.0.1:1", "mysql+pymysql://root@127.0.0.1:2"],
                "timeout_s": 0.5,
            }
        )
    )
    with pytest.raises(TicketError, match="no ticket server answered for 'default'") as caught:
        alloc.next()
    assert "server 1 (mysql+pymysql://app:***@127.0.0.1:1)" in str(caught.value)
    assert "s3cret" not in str(caught.value)
    with pytest.raises(
        TicketError, match=r"cannot connect to ticket server 1 \(mysql\+pymysql://app:\*\*\*@"
    ):
        alloc.init()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"servers": []}, "tickets.servers must be a list"),
        ({"servers": ["sqlite:///x"]}, "is not a MariaDB/MySQL URL"),
        ({"servers": ["mysql://h"], "counters": ["Bad"]}, "lower_snake_case"),
        ({"servers": ["mysql://h"], "block": 0}, "tickets.block"),
        ({"servers": ["mysql://h"], "extra": 1}, "unknown tickets key"),
    ],
)
def test_bad_tickets_config(raw: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TicketsConfig.from_dict(raw)


def test_cli_init_and_next(servers: list[MariaDBServer], tmp_path: Path) -> None:
    running(servers)
    cfg = tmp_path / "tickets.yaml"
    cfg.write_text(yaml.safe_dump({"tickets": {"servers": [s.url for s in servers], "counters": ["photos"]}}))
    runner = CliRunner()
    out = runner.invoke(main, ["tickets", "init", "--config", str(cfg)])
    assert out.exit_code == 0, out.output
    assert "2 ticket server(s) ready: counters photos, block 1" in out.output
    out = runner.invoke(main, ["tickets", "next", "photos", "-n", "4", "--json", "--config", str(cfg)])
    assert out.exit_code == 0, out.output
    ids = yaml.safe_load(out.output)
    assert len(set(ids)) == 4
    assert {i % 2 for i in ids} == {0, 1}  # round robin over odd and even
    out = runner.invoke(main, ["tickets", "next", "--config", str(tmp_path / "none.yaml")])
    assert out.exit_code == 1
    assert "cannot read config file" in out.output


def test_forked_children_never_hand_out_the_parents_ids(servers: list[MariaDBServer]) -> None:
    """A block of IDs reserved before a fork stays the parent's: each child reserves its own (were
    both to go on from it, they would hand out the same IDs), on connections of its own."""
    alloc = allocator(running(servers), counters=["forked"], block=100)
    alloc.init()
    first = alloc.next("forked")  # reserves a block, on a pooled connection the children inherit
    read_end, write_end = os.pipe()
    children = []
    for _ in range(4):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                ids = alloc.next_many("forked", 30)
                os.write(write_end, (" ".join(map(str, ids)) + "\n").encode())  # one write: atomic
                code = 0
            finally:
                os._exit(code)
        children.append(pid)
    os.close(write_end)
    mine = alloc.next_many("forked", 30)
    deadline = time.monotonic() + 30
    codes = []
    for pid in children:
        while not (done := os.waitpid(pid, os.WNOHANG))[0] and time.monotonic() < deadline:
            time.sleep(0.02)
        if not done[0]:
            os.kill(pid, signal.SIGKILL)
            done = os.waitpid(pid, 0)
        codes.append(os.waitstatus_to_exitcode(done[1]))
    with os.fdopen(read_end) as lines:
        theirs = [int(i) for line in lines for i in line.split()]
    assert codes == [0, 0, 0, 0]
    every = [first, *mine, *theirs]
    assert len(every) == 1 + 30 + 4 * 30
    assert len(set(every)) == len(every), f"{len(every) - len(set(every))} IDs handed out twice"
    alloc.close()
