"""Fills sent without waiting for their replies, on real memcached and Redis servers.

A read that missed fills the cache for the next reader; nothing it returns
depends on whether the fill stored. So a fill is sent and the call goes on:
the connection reads the fill's reply before the reply of its next request
(`MemcachedServer.post`, `RedisListBackend._send` with a reader). What must
hold, whatever the order of fills and reads on one connection: every read's
reply is its own (never a fill's owed reply taken for it), the fills that
could store did, and the ones that could not are reported as such, late.
"""

from __future__ import annotations

import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
import redis

from store.cache.lists import decode_members, encode_members
from store.cache.memcached import MemcachedLeaseStore
from store.cache.redis_lists import RedisListBackend
from tests.conftest import REDIS_TEST_URL

PREFIX = "unwaited:"


@pytest.fixture
def mc(memcached_pair: list[str]) -> Iterator[MemcachedLeaseStore]:
    store = MemcachedLeaseStore(memcached_pair[:1], timeout_s=2, connect_timeout_s=2)
    yield store
    store.close()


def test_memcached_fills_not_waited_for_leave_every_later_reply_its_own(mc: MemcachedLeaseStore) -> None:
    """Random runs of lookups, fills (some with a lease another took meanwhile), deletes and
    lookups again on one connection: each lookup sees exactly what a waited-for fill would have
    left, and ``later`` is told of exactly the fills that stored."""
    rng = random.Random(7)
    stored: list[int] = []
    for _round in range(40):
        keys = [f"t:{uuid.uuid4().hex}" for _ in range(rng.randint(1, 12))]
        leases = mc.lookup_many(keys, lease_ttl_s=10)
        lost = {k for k in keys if rng.random() < 0.3}
        mc.delete_many(sorted(lost))  # a write: the lease of each of these is void
        values = {k: b"v%d-" % i + k.encode() for i, k in enumerate(keys)}
        before = sum(stored)
        assert mc.fill_many({k: (values[k], leases[k].cas) for k in keys}, 60, later=stored.append) == 0
        # the next request on the connection reads the fills' replies first
        got = mc.lookup_many(keys, lease_ttl_s=10)
        assert sum(stored) - before == len(keys) - len(lost)
        for k in keys:
            if k in lost:
                assert got[k].value is None  # a new lease, not the fill
            else:
                assert got[k].value == values[k]
        assert mc.stats.errors == 0


def test_memcached_fills_not_waited_for_from_many_threads(mc: MemcachedLeaseStore) -> None:
    """16 threads, each filling and reading its own keys through the shared idle connections: no
    reply reaches another thread's call."""
    errors: list[str] = []

    def work(t: int) -> None:
        for i in range(60):
            keys = [f"t:{t}:{i}:{j}:{uuid.uuid4().hex}" for j in range(3)]
            leases = mc.lookup_many(keys, lease_ttl_s=10)
            mc.fill_many({k: (k.encode(), leases[k].cas) for k in keys}, 60, later=lambda n: None)
            got = mc.lookup_many(keys, lease_ttl_s=10)
            if any(got[k].value != k.encode() for k in keys):
                errors.append(f"thread {t} round {i}: {[got[k].value for k in keys]}")

    _in_threads(work, 16)
    assert errors == []
    assert mc.stats.errors == 0


def test_memcached_deletes_begun_are_done_when_finished_whatever_the_connection_owes(
    mc: MemcachedLeaseStore,
) -> None:
    """``delete_many_begin`` sends the deletes and holds the connection; its finish reads the
    reply, after any fill replies that connection owed. Random rounds: entries filled without
    waiting, some deleted begun-then-finished with other calls between; after each finish the
    deleted keys are leases to win again, the others still hold their values."""
    rng = random.Random(11)
    for _round in range(40):
        keys = [f"t:{uuid.uuid4().hex}" for _ in range(rng.randint(1, 10))]
        leases = mc.lookup_many(keys, lease_ttl_s=10)
        mc.fill_many({k: (k.encode(), leases[k].cas) for k in keys}, 60, later=lambda n: None)
        gone = sorted(k for k in keys if rng.random() < 0.5)
        finish = mc.delete_many_begin(gone)
        if rng.random() < 0.5:  # another call meanwhile, on another connection
            other = f"t:{uuid.uuid4().hex}"
            assert mc.lookup_many([other], lease_ttl_s=10)[other].won
        finish()
        got = mc.lookup_many(keys, lease_ttl_s=10)
        for k in keys:
            assert got[k].value == (None if k in gone else k.encode()), k
        assert mc.stats.errors == 0
        assert not mc.servers[0].breaker.dirty


def test_memcached_deletes_begun_from_many_threads(mc: MemcachedLeaseStore) -> None:
    """16 threads, each deleting its own keys begun-then-finished around a lookup of its own: every
    delete is done at its finish, and no reply reaches another thread's call."""
    errors: list[str] = []

    def work(t: int) -> None:
        for i in range(40):
            keys = [f"t:{t}:{i}:{j}:{uuid.uuid4().hex}" for j in range(3)]
            mc.set_many({k: b"x" for k in keys}, 60)
            finish = mc.delete_many_begin(keys[:2])
            mine = mc.peek_many(keys[2:])
            finish()
            left = mc.peek_many(keys)
            if mine != {keys[2]: b"x"} or left != {keys[2]: b"x"}:
                errors.append(f"thread {t} round {i}: {mine} {left}")

    _in_threads(work, 16)
    assert errors == []
    assert mc.stats.errors == 0


def test_memcached_deletes_begun_on_a_server_that_is_not_there_mark_it_dirty() -> None:
    """A delete that may not have arrived leaves the server to be emptied before it is trusted
    again, as a waited-for delete does."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # (closed again: nothing listens there)
    down = MemcachedLeaseStore([f"127.0.0.1:{port}"], timeout_s=0.2, connect_timeout_s=0.2)
    try:
        finish = down.delete_many_begin(["t:a", "t:b"])
        finish()
        assert down.servers[0].breaker.dirty
    finally:
        down.close()


@pytest.fixture
def lists(redis_ready: str) -> Iterator[RedisListBackend]:
    backend = RedisListBackend(REDIS_TEST_URL, prefix=PREFIX, timeout_s=2, connect_timeout_s=2)
    yield backend
    backend.close()


def test_redis_fills_not_waited_for_are_read_before_the_next_reply(lists: RedisListBackend) -> None:
    """A list filled without waiting is read back whole by the next call on the connection; a fill
    whose version was bumped meanwhile is reported as not done; a server that lost its scripts
    loses that fill, says so, and takes the next one."""
    done: list[int] = []
    head = [(i, 1000 + i) for i in range(5)]
    first = PREFIX + uuid.uuid4().hex
    seen = lists.read(first, ("all",))
    assert seen is not None
    # until a fill that waited has found the fill script on the server, fills wait
    assert lists.fill(first, seen.version, 5, encode_members(head), 3600, 0, later=done.append) is True
    assert done == []
    key = PREFIX + uuid.uuid4().hex
    seen = lists.read(key, ("all",))
    assert seen is not None
    assert lists.fill(key, seen.version, 5, encode_members(head), 3600, 0, later=done.append) is False
    got = lists.read(key, ("all",))
    assert got is not None
    assert got.meta == (5, 5)
    assert decode_members(got.members) == head
    assert done == [1]
    # a fill whose version is stale: an invalidation came between its read and it
    other = PREFIX + uuid.uuid4().hex
    seen = lists.read(other, ("all",))
    assert seen is not None
    lists.invalidate([other], 3600)
    item = (other, seen.version, 5, encode_members(head), 0, False)
    assert lists.fill_many([item], 3600, later=done.append) == 0
    got = lists.read(other, ("all",))
    assert got is not None
    assert got.meta is None  # not filled
    assert done == [1, 0]
    # the server forgets its scripts (as after a restart): that fill is lost and said so
    redis.Redis.from_url(REDIS_TEST_URL).script_flush()
    third = PREFIX + uuid.uuid4().hex
    seen = lists.read(third, ("all",))
    assert seen is not None
    assert lists.fill(third, seen.version, 5, encode_members(head), 3600, 0, later=done.append) is False
    seen = lists.read(third, ("all",))  # reads the lost fill's reply
    assert seen is not None
    assert seen.meta is None
    assert done == [1, 0, 0]
    # the next fill waits, loads the script and is sent again; the ones after it do not wait
    assert lists.fill(third, seen.version, 5, encode_members(head), 3600, 0, later=done.append) is True
    got = lists.read(third, ("all",))
    assert got is not None
    assert got.meta == (5, 5)
    fourth = PREFIX + uuid.uuid4().hex
    seen = lists.read(fourth, ("all",))
    assert seen is not None
    assert lists.fill(fourth, seen.version, 5, encode_members(head), 3600, 0, later=done.append) is False
    assert lists.read(fourth, ("all",)) is not None
    assert done == [1, 0, 0, 1]
    assert lists.stats.errors == 0


def test_counters_read_what_connections_still_owe(mc: MemcachedLeaseStore, lists: RedisListBackend) -> None:
    """A fill not waited for is counted once its reply is read; reading the counters reads the
    replies the idle connections owe first, so they count every fill made before them."""
    key = f"t:{uuid.uuid4().hex}"
    lease = mc.lookup_many([key], lease_ttl_s=10)[key]
    fills = mc.stats.fills
    mc.fill_many({key: (b"v", lease.cas)}, 60, later=lambda n: mc.stats.add(fills=n))
    assert mc.stats.fills == fills + 1
    assert mc.peek_many([key]) == {key: b"v"}
    head = [(1, 2)]
    warm = PREFIX + uuid.uuid4().hex  # (a fill that waits first: then the script is known)
    assert lists.fill(warm, None, 1, encode_members(head), 3600, 0, later=lambda n: None) is True
    lkey = PREFIX + uuid.uuid4().hex
    seen = lists.read(lkey, ("all",))
    assert seen is not None
    before = lists.stats.as_dict()["fills"]
    lists.fill(lkey, seen.version, 1, encode_members(head), 3600, 0, later=lambda n: lists.stats.add(fills=n))
    assert lists.stats.as_dict()["fills"] == before + 1


def test_owed_replies_are_split_at_their_own_mn_lines_however_the_bytes_arrive() -> None:
    """The framing alone, over a socket pair: replies owed by fills and the reply of the request
    just sent, arriving in pieces of every size (an MN line cut anywhere, values that end in
    "MN"), are each handed to their own reader, the last one returned."""
    import socket

    from store.cache import memcached as mcmod

    rng = random.Random(11)
    for _trial in range(300):
        owed = [
            b"".join(rng.choice([b"HD\r\n", b"NS\r\n", b"EX\r\n"]) for _ in range(rng.randint(1, 4)))
            for _ in range(rng.randint(0, 3))
        ]
        # (a value is never exactly "MN": `MemcachedLeaseStore.fill_many` refuses one)
        values = [
            b"x" * rng.randint(0, 30) + rng.choice([b"", b"MN", b"M", b"N"]) for _ in range(rng.randint(0, 5))
        ]
        values = [b"yMN" if v == b"MN" else v for v in values]
        last = b"".join(b"VA %d c1\r\n%s\r\n" % (len(v), v) for v in values)
        wire = b"".join(r + b"MN\r\n" for r in owed) + last + b"MN\r\n"
        a, b = socket.socketpair()
        try:
            client = mcmod._Client(("127.0.0.1", 1))
            got: list[bytes] = []
            client.owed = [got.append for _ in owed]
            pieces = []
            i = 0
            while i < len(wire):
                n = rng.randint(1, 7)
                pieces.append(wire[i : i + n])
                i += n

            def feed(end: socket.socket, pieces: list[bytes]) -> None:
                for p in pieces:
                    end.sendall(p)

            t = threading.Thread(target=feed, args=(b, pieces))
            t.start()
            reply = mcmod._read(a, client)
            t.join()
            assert got == owed
            assert reply == last
            assert client.owed == []
        finally:
            a.close()
            b.close()


def test_a_server_restarted_while_its_connections_owe_replies_costs_misses_only() -> None:
    """memcached and Redis of the test's own are killed while idle connections owe fill replies,
    then started again: the calls in between are misses (no error reaches the caller, nothing
    wrong is returned), and after the restart fills and reads work again on new connections."""
    from tests.servers import free_ports, start_memcached, start_redis

    mport, rport = free_ports(2)
    mproc, rproc = start_memcached(mport), start_redis(rport)
    mc = MemcachedLeaseStore([f"127.0.0.1:{mport}"], timeout_s=2, connect_timeout_s=2, cooldown_s=0.2)
    lists = RedisListBackend(
        f"redis://127.0.0.1:{rport}/0", prefix=PREFIX, timeout_s=2, connect_timeout_s=2, cooldown_s=0.2
    )
    head = [(1, 2), (3, 4)]
    try:
        keys = [f"t:{uuid.uuid4().hex}" for _ in range(5)]
        leases = mc.lookup_many(keys, lease_ttl_s=10)
        warm = PREFIX + uuid.uuid4().hex
        assert lists.fill(warm, None, 2, encode_members(head), 3600, 0, later=lambda n: None) is True
        lkey = PREFIX + uuid.uuid4().hex
        seen = lists.read(lkey, ("all",))
        assert seen is not None
        # fills sent, not waited for; then both servers die before anyone reads the replies
        mc.fill_many({k: (b"v", leases[k].cas) for k in keys}, 60, later=lambda n: None)
        lists.fill(lkey, seen.version, 2, encode_members(head), 3600, 0, later=lambda n: None)
        mproc.kill()
        rproc.kill()
        mproc.wait()
        rproc.wait()
        assert mc.lookup_many(keys, lease_ttl_s=10) == {}  # a miss for each: no lease, no value
        assert lists.read(lkey, ("all",)) is None
        mproc, rproc = start_memcached(mport), start_redis(rport)
        time.sleep(0.3)  # (past the breakers' cool-down)
        deadline = time.monotonic() + 5
        while not mc.lookup_many(keys, lease_ttl_s=10) and time.monotonic() < deadline:
            time.sleep(0.1)
        again = mc.lookup_many(keys, lease_ttl_s=10)
        assert set(again) == set(keys)
        assert all(again[k].value is None for k in keys)  # the new server holds nothing from before
        fresh = mc.lookup_many([k + "x" for k in keys], lease_ttl_s=10)
        mc.fill_many({k: (b"w", fresh[k].cas) for k in fresh}, 60, later=lambda n: None)
        assert {k: v.value for k, v in mc.lookup_many(list(fresh), lease_ttl_s=10).items()} == dict.fromkeys(
            fresh, b"w"
        )
        while lists.read(lkey, ("all",)) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        seen = lists.read(lkey, ("all",))
        assert seen is not None
        assert seen.meta is None  # nothing cached from before the restart
        lists.fill(lkey, seen.version, 2, encode_members(head), 3600, 0, later=lambda n: None)
        got = lists.read(lkey, ("all",))
        assert got is not None
        assert got.meta is None  # that fill met a server without the script: lost, said so
        assert lists.fill(lkey, got.version, 2, encode_members(head), 3600, 0, later=lambda n: None) is True
        got = lists.read(lkey, ("all",))  # (that one waited: it loaded the script and went again)
        assert got is not None
        assert got.meta == (2, 2)
        assert decode_members(got.members) == head
    finally:
        mc.close()
        lists.close()
        for proc in (mproc, rproc):
            proc.kill()
            proc.wait()


def _in_threads(work: Callable[[int], None], n: int) -> None:
    """``work(t)`` for t in 0..n-1, each on a thread of its own, all started, then all joined."""
    threads = [threading.Thread(target=work, args=(t,)) for t in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
