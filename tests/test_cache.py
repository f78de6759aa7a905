"""Caches: the lease and version rules, read-after-write across processes, counters."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from store import Store, StoreConfig
from store.cache import Breaker, CacheStats, MemoryLeaseStore, ObjectCache
from store.cache.leases import Lookup
from store.cache.lists import decode_member, decode_members, encode_member
from store.cache.memcached import MemcachedLeaseStore
from tests.conftest import cached_mariadb_config, run_cli

BHP = "board_has_pins"


@pytest.fixture(params=["sqlite-memory", "mariadb-cached"])
def backend(request: pytest.FixtureRequest) -> str:
    """Only the cached backends."""
    return str(request.param)


# -- pure pieces ------------------------------------------------------------------


@given(
    st.tuples(st.integers(-(1 << 63), (1 << 63) - 1), st.integers(0, (1 << 63) - 1)),
    st.tuples(st.integers(-(1 << 63), (1 << 63) - 1), st.integers(0, (1 << 63) - 1)),
)
def test_members_sort_like_sequence_then_to_id(a: tuple[int, int], b: tuple[int, int]) -> None:
    assert decode_member(encode_member(*a)) == a
    assert (encode_member(*a) < encode_member(*b)) == (a < b)


@given(
    st.lists(st.tuples(st.integers(-(1 << 63), (1 << 63) - 1), st.integers(0, (1 << 63) - 1)), max_size=60)
)
def test_members_decode_in_one_pass(rows: list[tuple[int, int]]) -> None:
    assert decode_members([encode_member(*r) for r in rows]) == rows


def test_breaker_opens_after_failures_and_closes_after_cooldown() -> None:
    now = [0.0]
    b = Breaker(failures_to_trip=2, cooldown_s=5, clock=lambda: now[0])
    b.failure()
    assert b.allow()
    b.failure()
    assert not b.allow()
    now[0] = 5.1
    assert b.allow()
    b.success()
    b.failure()
    assert b.allow()  # the count started again
    b.trip()
    assert not b.allow()


def test_keys_spread_over_both_servers_and_stay_put() -> None:
    two = MemcachedLeaseStore(["127.0.0.1:1", "127.0.0.1:2"])
    three = MemcachedLeaseStore(["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"])
    keys = [f"s:o:{i}" for i in range(2000)]
    owners = [two.server_for(k).address for k in keys]
    assert 800 < owners.count("127.0.0.1:1") < 1200
    moved = sum(two.server_for(k).address != three.server_for(k).address for k in keys)
    assert 450 < moved < 900  # a third server takes about a third, the rest stay


def test_memory_lease_store_has_memcached_meta_semantics() -> None:
    m = MemoryLeaseStore()
    first = m.lookup_many(["a", "b"], lease_ttl_s=10)
    assert [first[k].won for k in "ab"] == [True, True]  # misses: vivified, this caller wins
    again = m.lookup_many(["a"], lease_ttl_s=10)
    assert again["a"] == Lookup(None, first["a"].cas, False)  # another's lease: read, do not fill
    m.delete_many(["b"])  # a writer's invalidation voids b's lease
    assert m.fill_many({"a": (b"A", first["a"].cas), "b": (b"B", first["b"].cas)}, 60) == 1
    assert m.peek_many(["a", "b"]) == {"a": b"A"}
    assert m.lookup_many(["a"], lease_ttl_s=10)["a"].value == b"A"


def test_memcached_meta_leases_against_a_real_server(memcached_pair: list[str]) -> None:
    """The same semantics on memcached itself: vivify-and-win, Z for the others, cas fill, delete voids."""
    import uuid

    mc = MemcachedLeaseStore(memcached_pair[:1], timeout_s=1, connect_timeout_s=1)
    a, b = f"t:{uuid.uuid4().hex}", f"t:{uuid.uuid4().hex}"
    first = mc.lookup_many([a, b], lease_ttl_s=10)
    assert [first[k].won for k in (a, b)] == [True, True]
    assert [first[k].value for k in (a, b)] == [None, None]
    assert mc.lookup_many([a], lease_ttl_s=10)[a].won is False
    mc.delete_many([b])
    assert mc.fill_many({a: (b"A", first[a].cas), b: (b"B", first[b].cas)}, 60) == 1
    assert mc.peek_many([a, b]) == {a: b"A"}
    assert mc.lookup_many([a], lease_ttl_s=10)[a] == Lookup(
        b"A", mc.lookup_many([a], lease_ttl_s=10)[a].cas, False
    )
    dropped = mc.lookup_many([a], lease_ttl_s=10, drop=[a])  # replace an old entry: delete, then lease
    assert dropped[a].won is True
    assert mc.stats.errors == 0
    mc.close()


def test_a_reply_spanning_many_reads_is_read_whole(memcached_pair: list[str]) -> None:
    """A 300-key batch of 2 KB values (a reply of 600 KB, many socket reads) comes back whole and in
    order, values ending in "MN" included; the same client then serves a one-key batch."""
    import uuid

    mc = MemcachedLeaseStore(memcached_pair[:1], timeout_s=2, connect_timeout_s=1)
    keys = [f"t:{uuid.uuid4().hex}" for _ in range(300)]
    values = {k: (b"%04d" % i) * 500 + (b"MN" if i % 2 else b"") for i, k in enumerate(keys)}
    leases = mc.lookup_many(keys, lease_ttl_s=10)
    assert all(leases[k].won for k in keys)
    assert mc.fill_many({k: (values[k], leases[k].cas) for k in keys}, 60) == len(keys)
    got = mc.lookup_many(keys, lease_ttl_s=10)
    assert [got[k].value for k in keys] == [values[k] for k in keys]
    assert mc.peek_many(keys) == values
    assert mc.lookup_many(keys[:1], lease_ttl_s=10)[keys[0]].value == values[keys[0]]
    assert mc.stats.errors == 0
    mc.close()


def test_a_value_the_reply_framing_cannot_carry_is_refused(memcached_pair: list[str]) -> None:
    """A value with CR or LF, or one that reads "MN", would break the framing of a pipelined reply:
    refused with a ValueError before anything is sent."""
    import uuid

    mc = MemcachedLeaseStore(memcached_pair[:1], timeout_s=1, connect_timeout_s=1)
    key = f"t:{uuid.uuid4().hex}"
    cas = mc.lookup_many([key], lease_ttl_s=10)[key].cas
    for bad in (b"a\r\nb", b"a\nb", b"MN"):
        with pytest.raises(ValueError, match="CR, LF"):
            mc.fill_many({key: (bad, cas)}, 60)
    assert mc.peek_many([key]) == {key: b""}
    mc.close()


def test_a_value_another_client_wrote_with_cr_lf_fails_its_batch_not_the_framing(
    memcached_pair: list[str],
) -> None:
    """A batch's reply lines are read in place (no parsing per key): a value some other client
    stored with CR LF inside, even one that fakes a reply line, is caught by the checks on the
    whole reply. The batch is a miss (its keys are left out, an error counted), never values out
    of place; once the key is gone the server serves again."""
    import uuid

    from pymemcache.client.base import Client

    mc = MemcachedLeaseStore(memcached_pair[:1], timeout_s=1, connect_timeout_s=1, failures_to_trip=100)
    good, bad, last = (f"t:{uuid.uuid4().hex}" for _ in range(3))
    leases = mc.lookup_many([good, last], lease_ttl_s=10)
    assert mc.fill_many({k: (b"V" + k.encode(), leases[k].cas) for k in (good, last)}, 60) == 2
    host, port = memcached_pair[0].rsplit(":", 1)
    other = Client((host, int(port)))
    for sneaky in (b"x\r\nVA 1 c1\r\ny", b"x\r\nVA 1", b"\r\n", b"a\nb\r\nVA 0 c5 W"):
        other.set(bad, sneaky)
        errors = mc.stats.errors
        got = mc.lookup_many([good, bad, last], lease_ttl_s=10)
        assert dict(got) == {}, sneaky
        assert mc.stats.errors == errors + 1
    other.delete(bad)
    got = mc.lookup_many([good, bad, last], lease_ttl_s=10)
    assert [got[good].value, got[last].value, got[bad].won] == [
        b"V" + good.encode(),
        b"V" + last.encode(),
        True,
    ]
    assert list(got) == [good, bad, last]
    other.close()
    mc.close()


def test_lookups_read_a_lease_from_its_reply_line_only_when_asked() -> None:
    """The raw form the warm path reads, and the `Lookup` a caller that asks gets; a reply line
    whose cas does not read as one is a lease not won (a miss that fills nothing)."""
    from store.cache.leases import Lookups

    found = Lookups(["a", "b", "c"], [b"A", b"", b""], [b"VA 1 c7", b"VA 0 c8 W", b"VA 0 cX W"])
    assert found["a"] == Lookup(b"A", 7, False)
    assert found["b"] == Lookup(None, 8, True)
    assert found.lease(2) == (0, False)
    assert dict(found) == {"a": found["a"], "b": found["b"], "c": Lookup(None, 0, False)}
    found.extend(Lookups(["d"], [b"D"], [b"VA 1 c9"]))
    assert (list(found), found["d"]) == (["a", "b", "c", "d"], Lookup(b"D", 9, False))


# -- the forced races: a slow reader must not fill after a writer's invalidation ---


def test_slow_reader_cannot_refill_an_object_a_writer_invalidated(store: Store) -> None:
    cache = store.admin_context().caches.objects
    assert isinstance(cache, ObjectCache)
    pin = store.create("pin", {"v": "old"})
    ran: list[bool] = []

    def writer_commits_in_between() -> None:
        cache.after_load = None  # the writer's own reads must not recurse
        store.update(pin, {"v": "new"})  # commit to the database, then invalidate
        ran.append(True)

    cache.after_load = writer_commits_in_between
    fills = cache.stats.fills
    assert store.get(pin) == {"v": "old"}  # read before the write: the old row
    assert ran == [True]
    assert cache.stats.fills == fills, "the stale value was put back"
    key = store.cache_key(pin)
    cached = cache.store.peek_many([key]).get(key)
    assert not cached or b"new" in cached  # nothing, an empty lease item, or the new value
    assert store.get(pin) == {"v": "new"}
    assert store.get(pin) == {"v": "new"}  # and now from the cache
    assert cache.stats.fills == fills + 1


def test_slow_reader_cannot_refill_a_list_a_writer_invalidated(store: Store) -> None:
    lists = store.admin_context().caches.lists
    assert lists is not None
    board = store.create("board", {})
    a, b = (store.create("pin", {"i": i}) for i in range(2))
    store.link(BHP, board, a)
    ran: list[bool] = []

    def writer_links_in_between() -> None:
        lists.after_load = None
        store.link(BHP, board, b)
        ran.append(True)

    lists.after_load = writer_links_in_between
    fills = lists.stats.fills
    assert store.page(BHP, board).ids == [a]  # the reader's view from before the link
    assert ran == [True]
    assert lists.stats.fills == fills, "the stale list was put back"
    assert store.page(BHP, board).ids == [a, b]
    assert store.count(BHP, board) == 2
    assert lists.stats.fills == fills + 1


def test_lists_longer_than_the_cached_head_fall_through(config: StoreConfig) -> None:
    from dataclasses import replace

    with Store(replace(config, cache=replace(config.cache, list_entries=5))) as store:
        board = store.create("board", {})
        pins = [store.create("pin", {"i": i}) for i in range(12)]
        for i, p in enumerate(pins):
            store.link(BHP, board, p, sequence=i)
        assert store.links(BHP, board, limit=3) == pins[:3]  # fills the head of 5
        hits = store.stats()[store.admin_context().caches.lists.stats.name]["hits"]  # type: ignore[union-attr]
        assert store.links(BHP, board, limit=3, offset=2) == pins[2:5]  # inside the head
        assert store.links(BHP, board, limit=3, offset=4) == pins[4:7]  # beyond: the database
        # The other end: a miss that fills the list again with its newest 5, which answer next.
        assert store.links(BHP, board, limit=3, newest_first=True) == pins[::-1][:3]
        assert store.links(BHP, board, limit=3, offset=1, newest_first=True) == pins[::-1][1:4]
        page = store.page(BHP, board, limit=4)  # oldest first again: the oldest end filled again
        page2 = store.page(BHP, board, limit=4, cursor=page.next_cursor)
        assert page.ids + page2.ids == pins[:8]
        assert store.count(BHP, board) == 12
        assert store.stats()[store.admin_context().caches.lists.stats.name]["hits"] >= hits + 3  # type: ignore[union-attr]


def test_stats_count_hits_misses_fills_and_invalidations(store: Store) -> None:
    pin = store.create("pin", {"a": 1})
    before = {name: dict(s) for name, s in store.stats().items()}
    store.get(pin)
    store.get(pin)
    store.update(pin, {"a": 2})
    name = store.admin_context().caches.objects.stats.name  # type: ignore[union-attr]
    after = store.stats()[name]
    assert after["misses"] - before[name]["misses"] == 1
    assert after["hits"] - before[name]["hits"] == 1
    assert after["fills"] - before[name]["fills"] == 1
    assert after["invalidations"] - before[name]["invalidations"] == 1


def test_get_many_reads_only_misses_from_the_database(store: Store) -> None:
    pins = [store.create("pin", {"i": i}) for i in range(10)]
    assert store.get_many(pins[:5]) == {p: {"i": i} for i, p in enumerate(pins[:5])}
    name = store.admin_context().caches.objects.stats.name  # type: ignore[union-attr]
    before = store.stats()[name]
    assert store.get_many(pins) == {p: {"i": i} for i, p in enumerate(pins)}
    after = store.stats()[name]
    assert after["hits"] - before["hits"] == 5
    assert after["misses"] - before["misses"] == 5


# -- read-after-write from another process -----------------------------------------


cli = run_cli


def test_read_after_write_across_processes(
    mariadb_ready: StoreConfig, memcached_pair: list[str], redis_ready: str, tmp_path: Path
) -> None:
    raw = cached_mariadb_config(memcached_pair, redis_ready)
    config_file = tmp_path / "store.yaml"
    config_file.write_text(yaml.safe_dump(raw))
    with Store.from_config(raw) as store:
        pin = store.create("pin", {"v": 1})
        board = store.create("board", {})
        assert store.get(pin) == {"v": 1}  # now cached here
        assert store.links(BHP, board) == []  # and the empty list
        cli(config_file, "update", str(pin), '{"v": 2}')
        cli(config_file, "link", BHP, str(board), str(pin))
        assert store.get(pin) == {"v": 2}
        assert store.links(BHP, board) == [pin]
        assert store.count(BHP, board) == 1
        store.update(pin, {"v": 3})
        assert '"v": 3' in cli(config_file, "get", str(pin))


def test_a_warm_board_page_is_two_round_trips(
    mariadb_ready: StoreConfig, memcached_pair: list[str], redis_ready: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import redis.connection

    from store.cache import memcached

    raw = cached_mariadb_config(memcached_pair[:1], redis_ready)  # one memcached: one get_many
    with Store.from_config(raw) as store:
        board = store.create("board", {})
        pins = [store.create("pin", {"i": i}) for i in range(50)]
        for p in pins:
            store.link(BHP, board, p)
        assert store.board_pins(board).ids == pins  # cold: fills both caches
        sends: list[str] = []
        real_mc, real_redis = (
            memcached.MemcachedServer.pipeline,
            redis.connection.Connection.send_packed_command,
        )

        def mc_send(self: memcached.MemcachedServer, commands: Any, parse: Any) -> Any:
            sends.append("memcached")
            return real_mc(self, commands, parse)

        def redis_send(self: redis.connection.Connection, command: object, check_health: bool = True) -> None:
            sends.append("redis")
            real_redis(self, command, check_health)  # type: ignore[arg-type]

        from store.pool import ConnectionPool

        real_checkout = ConnectionPool.checkout

        def db_checkout(self: ConnectionPool) -> tuple[object, float]:
            sends.append("database")
            return real_checkout(self)

        monkeypatch.setattr(memcached.MemcachedServer, "pipeline", mc_send)
        monkeypatch.setattr(redis.connection.Connection, "send_packed_command", redis_send)
        monkeypatch.setattr(ConnectionPool, "checkout", db_checkout)
        page = store.board_pins(board)
        assert page.ids == pins
        assert page.objects == [{"i": i} for i in range(50)]
        assert sends == ["redis", "memcached"]  # and no database call


# -- bounded staleness: an entry is trusted for max_stale_s after the read that filled it ---


class Clock:
    """A wall clock the test moves by hand (ms since the epoch)."""

    def __init__(self) -> None:
        self.now = 1_800_000_000_000

    def __call__(self) -> int:
        return self.now


def test_an_object_entry_older_than_max_stale_s_is_read_again() -> None:
    clock = Clock()
    cache = ObjectCache(MemoryLeaseStore(), max_stale_s=2.0, clock_ms=clock)
    db = {"k": b'{"v":1}'}
    reads: list[list[str]] = []

    def load(missing: list[str]) -> dict[str, bytes]:
        reads.append(missing)
        return {k: db[k] for k in missing if k in db}

    assert cache.get_many(["k"], load) == {"k": b'{"v":1}'}
    db["k"] = b'{"v":2}'  # committed, and its invalidation was lost
    clock.now += 2000
    assert cache.get_many(["k"], load) == {"k": b'{"v":1}'}  # still trusted: 2.0 s old
    clock.now += 1
    assert cache.get_many(["k"], load) == {"k": b'{"v":2}'}  # too old: read again, replaced
    assert cache.stats.expired == 1
    assert cache.get_many(["k"], load) == {"k": b'{"v":2}'}
    assert reads == [["k"], ["k"]]


def test_the_age_counts_from_the_read_not_the_fill() -> None:
    """A reader that stalls between its database read and its fill does not extend the trust."""
    clock = Clock()
    cache = ObjectCache(MemoryLeaseStore(), max_stale_s=2.0, clock_ms=clock)

    def slow_load(missing: list[str]) -> dict[str, bytes]:
        clock.now += 1500  # the read took 1.5 s, then the fill
        return dict.fromkeys(missing, b'{"v":1}')

    cache.get_many(["k"], slow_load)
    clock.now += 600  # 2.1 s after the read began
    hits = cache.stats.hits
    cache.get_many(["k"], slow_load)
    assert cache.stats.hits == hits, "an entry was trusted for longer than max_stale_s after its read"


def test_a_miss_is_cached_too_and_a_create_invalidates_it(config: StoreConfig) -> None:
    from store import encode_pinterest

    with Store(config) as store:
        ghost = encode_pinterest(2, 1, 999_999)
        assert store.get(ghost) is None
        name = store.admin_context().caches.objects.stats.name  # type: ignore[union-attr]
        hits = store.stats()[name]["hits"]
        assert store.get(ghost) is None  # a cached "no such object"
        assert store.stats()[name]["hits"] == hits + 1
        pin = store.create("pin", {"new": True}, shard=3)
        assert store.get(pin) == {"new": True}
        gone = store.create("pin", {"x": 1}, shard=3)
        assert store.get(gone) == {"x": 1}
        store.delete(gone)
        assert store.get(gone) is None


def test_a_create_drops_a_cached_absence_of_its_own_new_id(config: StoreConfig) -> None:
    """A create's two invalidations (the object's entry, its lists) go out at once; when it returns
    both are done: a miss cached for the ID it made (read before it existed) is gone."""
    with Store(config) as store:
        name = store.admin_context().caches.objects.stats.name  # type: ignore[union-attr]
        for _attempt in range(20):
            before = store.create("pin", {"n": 0}, shard=5)
            ghost = before + 1  # the next row of that shard's pins, most likely
            if store.get(ghost) is not None:
                continue  # another test's pin: try again
            hits = store.stats()[name]["hits"]
            assert store.get(ghost) is None
            assert store.stats()[name]["hits"] == hits + 1  # the absence is cached
            made = store.create("pin", {"n": 1}, shard=5)
            if made != ghost:
                continue  # another writer took that ID meanwhile: try again
            assert store.get(made) == {"n": 1}
            return
        pytest.fail("20 creates in a row did not make the ID after the one before")


def test_a_list_older_than_max_stale_s_is_read_again() -> None:
    from store.cache.lists import ListCache, MemoryListBackend

    clock = Clock()
    lists = ListCache(MemoryListBackend(), max_stale_s=2.0, clock_ms=clock)
    key = "s:l:board_has_pins:1"
    read = lists.read(key, ("meta",))
    assert read is not None
    lists.fill(key, read.version, 1, [(5, 7)], clock())
    got = lists.read(key, ("rank", 0, 9, False))
    assert got is not None
    assert got.meta == (1, 1)
    clock.now += 2001
    stale = lists.read(key, ("rank", 0, 9, False))
    assert stale is not None
    assert stale.meta is None, "a list older than max_stale_s was served"
    assert lists.stats.expired == 1


def test_cache_counters_lose_no_count_across_threads() -> None:
    """Each thread counts into its own table (no lock on the request path); the sums are exact."""
    stats = CacheStats("t")
    threads, rounds = 16, 2000
    start = threading.Barrier(threads)

    def count(k: int) -> None:
        start.wait()
        for _ in range(rounds):
            stats.add(hits=1, misses=k % 2)
        stats.error("server", OSError(f"thread {k}"))

    pool = [threading.Thread(target=count, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert stats.hits == threads * rounds
    assert stats.misses == threads // 2 * rounds
    assert stats.errors == threads
    assert stats.as_dict() == {
        "hits": threads * rounds,
        "misses": threads // 2 * rounds,
        "fills": 0,
        "invalidations": 0,
        "updates": 0,
        "errors": threads,
        "skipped": 0,
        "expired": 0,
    }
    assert stats.last_error.startswith("server: OSError: thread ")


def test_ended_threads_leave_their_counts_not_their_tables() -> None:
    """A thread per request: 500 threads that count and end leave no table each, and lose no count,
    while threads still running keep counting into their own."""
    stats = CacheStats("t")
    stats.add(hits=1)  # this thread's table stays
    stop = threading.Event()
    live = [
        threading.Thread(target=lambda: (stats.add(misses=1), stop.wait(30)), daemon=True) for _ in range(3)
    ]
    for t in live:
        t.start()
    try:
        for wave in range(50):
            pool = [threading.Thread(target=stats.add, kwargs={"hits": 2, "fills": 1}) for _ in range(10)]
            for t in pool:
                t.start()
            for t in pool:
                t.join()
            assert stats.hits == 1 + 20 * (wave + 1)
        assert len(stats._tables) <= 1 + 3
        assert stats.as_dict()["fills"] == 500
    finally:
        stop.set()
    for t in live:
        t.join()
    assert stats.misses == 3
    assert len(stats._tables) == 1
