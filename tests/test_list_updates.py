"""Cached lists updated in place, in the database's version order, never ahead of or apart from it.

A writer's change reaches the cache after its commit, in any order with
other writers' changes and readers' fills, or not at all (the writer died:
then the log's follower settles the list). Hypothesis draws such histories
against a model of one list in the database (its rows at every version) and
runs them on the real Redis backend and the in-process one alike:

- at every step, a cached list is the database's list at the version it
  records (its first entries, and the length then);
- once every change has been delivered or settled, a cached list is the
  database's list as it is now.

Then the whole store on MariaDB and Redis: threads that link, move and
unlink pairs of hot boards while others read their pages and counts, with
and without the log's follower; every cached list ends equal to the rows,
and most changes were applied in place rather than dropped.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store import Store, StoreConfig
from store.admin import init_shards
from store.cache.lists import ListBackend, MemoryListBackend, apply_change, decode_members, encode_member
from store.cache.redis_lists import RedisListBackend
from tests.conftest import REDIS_TEST_URL, cached_mariadb_config, cached_on, make_app_account

PREFIX = "lu:"
KEY = PREFIX + "l:board_has_pins:1"
BHP = "board_has_pins"
POB = "pin_owned_by_board"
TTL_S = 600


@pytest.fixture(scope="module")
def redis_backend(redis_ready: str) -> Iterator[RedisListBackend]:
    r = RedisListBackend(REDIS_TEST_URL, prefix=PREFIX, timeout_s=2, connect_timeout_s=2)
    yield r
    r.close()


# -- the model ------------------------------------------------------------------------


@dataclass
class Db:
    """One list in the database: its rows at every version (version 1 is the first change)."""

    states: list[dict[int, int]] = field(default_factory=lambda: [{}])  # to_id -> sequence

    @property
    def version(self) -> int:
        return len(self.states) - 1

    def rows(self, version: int) -> list[tuple[int, int]]:
        return sorted((s, t) for t, s in self.states[version].items())

    def write(self, kind: str, to_id: int, sequence: int) -> tuple[str, int, str, bytes, int] | None:
        """Commit one change if it applies to the rows now; the change the cache is told of."""
        now = dict(self.states[-1])
        if (kind == "add" and to_id not in now) or (kind == "move" and now.get(to_id, sequence) != sequence):
            now[to_id] = sequence
        elif kind == "remove" and to_id in now:
            del now[to_id]
        else:
            return None
        self.states.append(now)
        member = b"" if kind == "remove" else encode_member(sequence, to_id)
        return (KEY, self.version, kind, member, to_id)


def cached(backend: ListBackend) -> tuple[int, list[tuple[int, int]], int] | None:
    """(n, the head, the list version it records) as the backend holds it, or None."""
    got = cached_end(backend)
    return None if got is None else got[:3]


def cached_end(backend: ListBackend) -> tuple[int, list[tuple[int, int]], int, bool] | None:
    """(n, the head, the list version it records, whether the head is the newest entries), or None."""
    if isinstance(backend, MemoryListBackend):
        entry = backend._lists.get(KEY)
        if entry is None:
            return None
        (n, _c), members, _exp, _ms, at, newest = entry
        return n, decode_members(members), at, newest
    assert isinstance(backend, RedisListBackend)
    meta = backend.client.get(KEY + ":m")
    if meta is None:
        return None
    parts = meta.split(b":")
    head = backend.client.get(KEY) or b""
    at = int(parts[3]) if len(parts) > 3 else 0
    return int(parts[0]), decode_members([head]), at, int(parts[1]) < 0


def end_of(rows: list[tuple[int, int]], size: int, newest: bool) -> list[tuple[int, int]]:
    """The list's first ``size`` entries, or its last if ``newest`` (in list order)."""
    return rows[len(rows) - size :] if newest and size else rows[:size] if not newest else []


def check_at_its_version(backend: ListBackend, db: Db) -> None:
    got = cached_end(backend)
    if got is None:
        return
    n, head, at, newest = got
    if at == 0:
        return  # a fill that knew no version (checked at the end: any change drops it)
    rows = db.rows(at)
    assert n == len(rows), f"length {n} recorded at version {at}, the list then had {len(rows)}"
    which = "last" if newest else "first"
    assert head == end_of(rows, len(head), newest), (
        f"the head is not the list's {which} entries at version {at}"
    )


step_st = st.one_of(
    st.tuples(
        st.just("write"),
        st.sampled_from(["add", "add", "move", "remove"]),
        st.integers(1, 7),
        st.integers(0, 5),
    ),
    st.tuples(st.just("deliver"), st.integers(0, 10)),
    st.tuples(st.just("lose"), st.integers(0, 10)),
    st.tuples(st.just("settle")),
    st.tuples(st.just("start_read"), st.integers(1, 8), st.booleans()),
    st.tuples(st.just("fill"), st.integers(0, 10)),
    st.tuples(st.just("fill_unknown"), st.integers(0, 10)),
)


def run_history(backend: ListBackend, steps: list[tuple[Any, ...]], cap: int) -> tuple[Db, int]:
    """Run ``steps`` on ``backend``; the model, and how many changes were applied in place."""
    backend.invalidate([KEY], TTL_S)  # a clean start (and a new version key)
    db = Db()
    pending: list[tuple[str, int, str, bytes, int]] = []
    lost: list[tuple[str, int]] = []
    # (cache version seen, list version read, size, the newest end)
    readers: list[tuple[bytes | None, int, int, bool]] = []
    kept = 0
    for step in steps:
        what = step[0]
        if what == "write":
            change = db.write(step[1], step[2], step[3])
            if change is not None:
                pending.append(change)
        elif what in ("deliver", "lose") and pending:
            change = pending.pop(step[1] % len(pending))
            if what == "deliver":
                kept += backend.apply([change], TTL_S, cap)
            else:
                lost.append((KEY, change[1]))  # its log row: the follower settles it
        elif what == "settle" and lost:
            backend.settle(lost, TTL_S)
            lost.clear()
        elif what == "start_read":
            read = backend.read(KEY, ("meta",))
            assert read is not None
            newest = bool(step[2]) if len(step) > 2 else False
            readers.append((read.version, db.version, min(step[1], cap), newest))
        elif what in ("fill", "fill_unknown") and readers:
            seen, at, size, newest = readers.pop(step[1] % len(readers))
            rows = db.rows(at)
            head = end_of(rows, size, newest)
            packed = b"".join(encode_member(s, t) for s, t in head)
            version = at if what == "fill" else 0
            backend.fill(KEY, seen, len(rows), packed, TTL_S, int(time.time() * 1000), version, newest)
        check_at_its_version(backend, db)
    for change in pending:  # every change arrives in the end, or its log row is followed
        kept += backend.apply([change], TTL_S, cap)
        check_at_its_version(backend, db)
    if lost:
        backend.settle(lost, TTL_S)
    got = cached_end(backend)
    if got is not None:
        n, head, at, newest = got
        rows = db.rows(db.version)
        assert at in (0, db.version), "a cached list behind the database after every change"
        assert n == len(rows)
        assert head == end_of(rows, len(head), newest)
    return db, kept


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(step_st, max_size=60), cap=st.integers(1, 6))
def test_every_history_leaves_the_cache_at_a_version_of_the_list(
    redis_backend: RedisListBackend, steps: list[tuple[Any, ...]], cap: int
) -> None:
    for backend in (redis_backend, MemoryListBackend()):
        run_history(backend, steps, cap)


write_st = st.tuples(
    st.just("write"), st.sampled_from(["add", "add", "move", "remove"]), st.integers(1, 7), st.integers(0, 5)
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    before=st.lists(write_st, max_size=8),
    size=st.integers(1, 8),
    after=st.lists(write_st, min_size=1, max_size=8),
    data=st.data(),
    cap=st.integers(1, 8),
)
def test_a_cached_list_meets_changes_in_every_order(
    redis_backend: RedisListBackend,
    before: list[tuple[Any, ...]],
    size: int,
    after: list[tuple[Any, ...]],
    data: st.DataObject,
    cap: int,
) -> None:
    """A list cached at some version (its oldest or its newest entries), then later changes
    delivered in any order, some lost and followed from the log, and readers filling in between."""
    newest = data.draw(st.booleans())
    steps: list[tuple[Any, ...]] = [s for w in before for s in (w, ("deliver", 0))]
    steps += [("start_read", size, newest), ("fill", 0), ("start_read", size, newest), *after]
    reads = [("start_read", size, newest), ("start_read", size, not newest)]
    reads += [("fill", 0), ("fill_unknown", 0), ("pass",)]
    for _ in range(len(after)):
        steps.append(
            (data.draw(st.sampled_from(["deliver", "deliver", "lose"])), data.draw(st.integers(0, 10)))
        )
        # Readers that missed (a head too short, or too old) fill later, some knowing no version.
        steps.append(data.draw(st.sampled_from(reads)))
        if data.draw(st.integers(0, 3)) == 0:
            steps.append(("settle",))
    steps += [("fill_unknown", 0), ("fill", 0)]
    for backend in (redis_backend, MemoryListBackend()):
        run_history(backend, steps, cap)


def test_changes_in_order_are_applied_in_place_and_out_of_order_drop_the_list(
    redis_backend: RedisListBackend,
) -> None:
    for backend in (redis_backend, MemoryListBackend()):
        steps: list[tuple[Any, ...]] = []
        for t in range(1, 6):  # nothing cached: each change only drops (bumps) the list
            steps += [("write", "add", t, t), ("deliver", 0)]
        steps += [("start_read", 8), ("fill", 0)]
        steps += [("write", "add", 6, 0), ("deliver", 0), ("write", "move", 2, 9), ("deliver", 0)]
        steps += [("write", "remove", 3, 0), ("deliver", 0)]
        db, kept = run_history(backend, steps, cap=10)
        assert kept == 3, "each change in order was applied in place"
        got = cached(backend)
        assert got is not None
        assert got[1] == db.rows(db.version)
        # Two changes; the second arrives first: the list is dropped, and the first finds nothing.
        change_a = db.write("add", 7, 1)
        change_b = db.write("remove", 1, 0)
        assert change_a is not None
        assert change_b is not None
        assert backend.apply([change_b], TTL_S, 10) == 0
        assert cached(backend) is None
        assert backend.apply([change_a], TTL_S, 10) == 0
        assert cached(backend) is None


def test_apply_change_keeps_the_head_a_prefix() -> None:
    """The head holds the list's first entries: a member past a partial head stays out of it."""
    m = [encode_member(s, t) for s, t in [(1, 1), (2, 2), (3, 3)]]
    assert apply_change(m, 5, "add", encode_member(9, 9), 9, 10) == (m, 6)  # past the head
    assert apply_change(m, 3, "add", encode_member(9, 9), 9, 10) == ([*m, encode_member(9, 9)], 4)
    assert apply_change(m, 5, "add", encode_member(0, 7), 7, 10) == ([encode_member(0, 7), *m], 6)
    assert apply_change(m, 5, "remove", b"", 8, 10) == (m, 4)  # removed past the head
    assert apply_change(m, 3, "remove", b"", 8, 10) is None  # not in a whole list: drop it
    assert apply_change(m, 5, "move", encode_member(9, 1), 1, 10) == (m[1:], 5)  # moved past it
    assert apply_change(m, 5, "add", encode_member(0, 2), 2, 10) is None  # a new pair already there
    assert apply_change(m, 3, "add", encode_member(0, 7), 7, 3) == ([encode_member(0, 7), *m[:2]], 4)  # cap


def test_apply_change_keeps_a_head_of_the_newest_entries_a_suffix() -> None:
    """The mirror: a head of the list's last entries takes a member after its first one (a new
    pin, newest of all, goes in) and loses its oldest entry over the cap."""
    m = [encode_member(s, t) for s, t in [(7, 7), (8, 8), (9, 9)]]
    new = encode_member(10, 10)
    assert apply_change(m, 5, "add", new, 10, 10, newest=True) == ([*m, new], 6)
    assert apply_change(m, 5, "add", new, 10, 3, newest=True) == ([*m[1:], new], 6)  # cap: oldest goes
    assert apply_change(m, 5, "add", encode_member(1, 1), 1, 10, newest=True) == (m, 6)  # before the head
    assert apply_change(m, 3, "add", encode_member(1, 1), 1, 10, newest=True) == (
        [encode_member(1, 1), *m],
        4,
    )
    assert apply_change(m, 5, "remove", b"", 8, 10, newest=True) == ([m[0], m[2]], 4)
    assert apply_change(m, 5, "remove", b"", 2, 10, newest=True) == (m, 4)  # removed before the head
    assert apply_change(m, 5, "move", encode_member(0, 8), 8, 10, newest=True) == ([m[0], m[2]], 5)
    assert apply_change(m, 5, "move", encode_member(20, 2), 2, 10, newest=True) == (
        [*m, encode_member(20, 2)],
        5,
    )


# -- the whole store ----------------------------------------------------------------------


@pytest.mark.parametrize("server", ["mariadb", "postgresql"])
@pytest.mark.parametrize(
    ("follow", "entries"), [(False, 1000), (True, 1000), (False, 4)], ids=["window", "follow", "short-heads"]
)
def test_concurrent_writers_and_readers_leave_every_cached_list_equal_to_the_rows(
    request: pytest.FixtureRequest, server: str, follow: bool, entries: int
) -> None:
    """With ``short-heads``, lists are longer than their cached heads: readers page them from both
    ends, so heads of the oldest and of the newest entries meet the writers' changes. On
    PostgreSQL a pair write's counted statement returns the list's version (and its log row names
    it), as MariaDB's count does: lists are updated in place there too."""
    raw, _memcached, _redis_url = cached_on(
        request, server, follow=follow, follow_poll_s=0.1, list_entries=entries
    )
    if follow:
        init_shards(StoreConfig.from_dict(raw))  # makes the logs: the application account may not
        if server == "postgresql":
            make_app_account(StoreConfig.from_dict(raw))  # (its grants name the log's schema)
    shards = StoreConfig.from_dict(raw).shards
    with Store.from_config(raw) as s, Store.from_config(raw) as other:
        boards = [s.create("board", {"b": b}, shard=b) for b in range(2)]
        # Pins on the boards' shards and on the other host's: pairs in one transaction and in two.
        pins = [s.create("pin", {"i": i}, shard=(i * shards // 8) % shards) for i in range(12)]
        for b in boards:
            for p in pins[:6]:
                s.link(BHP, b, p)
        errors: list[BaseException] = []
        stop = time.monotonic() + 4.0

        def write(seed: int, store: Store) -> None:
            rng = random.Random(seed)
            try:
                while time.monotonic() < stop:
                    b, p = rng.choice(boards), rng.choice(pins)
                    r = rng.random()
                    if r < 0.4:
                        store.link(BHP, b, p)
                    elif r < 0.7:
                        store.link(BHP, b, p, sequence=rng.randrange(-50, 50))
                    else:
                        store.unlink(BHP, b, p)
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        def read(seed: int, store: Store) -> None:
            rng = random.Random(seed)
            try:
                while time.monotonic() < stop:
                    b = rng.choice(boards)
                    store.page(BHP, b, limit=rng.choice([2, 5, 50]), newest_first=rng.random() < 0.5)
                    store.links(BHP, b, limit=2, newest_first=True)
                    store.count(BHP, b)
                    store.links(POB, rng.choice(pins))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=write, args=(i, (s, other)[i % 2])) for i in range(4)]
        threads += [threading.Thread(target=read, args=(10 + i, (s, other)[i % 2])) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        client = redis.Redis.from_url(raw["cache"]["redis"])
        try:
            truth = Store.from_config({**raw, "cache": {}})
            with truth:
                lists = [(BHP, b) for b in boards] + [(POB, p) for p in pins]
                for relation, f in lists:
                    rows = truth.page(relation, f, limit=100).ids
                    key = f"{raw['cache']['prefix']}l:{relation}:{f}"
                    meta = client.get(key + ":m")
                    if meta is not None:
                        n, cached_n = (int(x) for x in meta.split(b":")[:2])
                        head = [t for _s, t in decode_members([client.get(key) or b""])]
                        assert n == len(rows), f"{relation} {f}: cached length {n}, rows {len(rows)}"
                        want = rows[len(rows) + cached_n :] if cached_n < 0 else rows[:cached_n]
                        assert head == want, f"{relation} {f}: the cached head is not the rows'"
                    for reader in (s, other):
                        assert reader.page(relation, f, limit=100).ids == rows
                        newest = [reader.page(relation, f, limit=2, newest_first=True).ids for _ in range(2)]
                        assert newest == [rows[::-1][:2]] * 2  # (a fill, then the cache)
                        assert reader.count(relation, f) == len(rows)
        finally:
            client.close()
        updates = sum(st["updates"] for st in (s.stats()["redis"], other.stats()["redis"]))
        assert updates > 0, "no list was updated in place"


def test_a_list_ahead_of_the_database_is_dropped_by_the_next_fill(redis_backend: RedisListBackend) -> None:
    """A shard restored from an older backup: the cached list holds a later version than the rows.
    The next fill drops it rather than leave it for good, and the one after fills it."""
    for backend in (redis_backend, MemoryListBackend()):
        backend.invalidate([KEY], TTL_S)

        def seen(backend: ListBackend = backend) -> bytes | None:
            read = backend.read(KEY, ("meta",))
            assert read is not None
            return read.version

        assert backend.fill(KEY, seen(), 1, encode_member(1, 1), TTL_S, 1, 9)
        assert not backend.fill(KEY, seen(), 0, b"", TTL_S, 2, 3)  # the database says 3
        assert cached(backend) is None
        assert backend.fill(KEY, seen(), 0, b"", TTL_S, 3, 3)
        assert cached(backend) == (0, [], 3)


def test_a_recount_is_a_new_version_of_the_list(
    mariadb_ready: Any, memcached_pair: list[str], redis_ready: str
) -> None:
    """A count fixed by a recount (the repair job) moves the list's version on: a list cached with
    the wrong count is dropped by the next write, not updated in place from the wrong count."""
    raw = cached_mariadb_config(memcached_pair, redis_ready)
    with Store.from_config(raw) as s:
        board = s.create("board", {})
        pins = [s.create("pin", {"i": i}, near=board) for i in range(4)]
        for p in pins[:3]:
            s.link(BHP, board, p)
        ctx = s.admin_context()
        h = ctx.relations.handle(s.config.relations[BHP], board)
        with h.connect() as conn:  # the kept count drifts (rows written behind the store's back)
            cur = conn.cursor()
            cur.execute(
                f"UPDATE {h.table('relation_counts')} SET n = 2 WHERE relation = %s AND from_id = %s",
                (BHP, board),
            )
        ctx.relations.invalidate([(BHP, board)])
        assert s.count(BHP, board) == 2  # cached with the drifted count
        assert ctx.relations.repo.recount(h, BHP, board) == 3  # fixed, its invalidation lost
        s.link(BHP, board, pins[3])
        assert s.count(BHP, board) == 4
        assert s.page(BHP, board).ids == pins
