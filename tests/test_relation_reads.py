"""Reads of many lists and sequence ranges: has_links(_many), pages_many, board_pins_many, page ranges.

Each call is checked against a Python model of the lists after random link,
unlink and move sequences (hypothesis), on SQLite (with and without the
in-process caches), MariaDB (without and with memcached and Redis) and
PostgreSQL with Instagram IDs (without and with the in-process caches), each
read twice so that the cached paths answer too. Then the cache rules: whole
lists only, trusted only for ``max_stale_s``, no fill after a writer's
invalidation, and after concurrent writers every answer equals the database.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store import (
    CursorError,
    IdError,
    LimitError,
    Store,
    StoreConfig,
    UnknownRelationError,
    WrongTypeError,
    encode_instagram,
    encode_pinterest,
)
from store.config import CacheConfig
from store.pool import ConnectionPool
from store.relations.repository import Side
from tests.conftest import sqlite_config

BHP = "board_has_pins"
POB = "pin_owned_by_board"
LIKES = "users_likes_pins"
CLOCK_START = 1_000


@pytest.fixture(
    params=["sqlite", "sqlite-memory", "mariadb", "mariadb-cached", "postgres", "postgres-memory"]
)
def backend(request: pytest.FixtureRequest) -> str:
    """Every call on each backend; PostgreSQL with Instagram IDs."""
    return str(request.param)


class Ticks:
    """The store's clock for default sequences: one tick per call, so a model can follow it."""

    def __init__(self) -> None:
        self.now = CLOCK_START

    def __call__(self) -> int:
        self.now += 1
        return self.now


@dataclass
class World:
    store: Store
    ticks: Ticks
    instagram: bool
    ghosts: int = 0

    def ghost(self, shard: int) -> int:
        """A pin ID no object has (a pin lost outside the store), new each time."""
        self.ghosts += 1
        if self.instagram:
            return encode_instagram(1 + self.ghosts, shard % 16, 1)
        return encode_pinterest(shard % 8, 1, 10**9 + self.ghosts)


@pytest.fixture
def world(config: StoreConfig) -> Iterator[World]:
    ticks = Ticks()
    with Store(config, clock_us=ticks) as s:
        yield World(s, ticks, config.ids == "instagram")


@dataclass
class Model:
    """The lists as they should be: board -> {pin: sequence}."""

    lists: dict[int, dict[int, int]] = field(default_factory=dict)

    def order(self, board: int) -> list[int]:
        return [p for _s, p in sorted((s, p) for p, s in self.lists.get(board, {}).items())]

    def in_range(self, board: int, since: int | None, until: int | None) -> list[int]:
        entries = sorted((s, p) for p, s in self.lists.get(board, {}).items())
        return [p for s, p in entries if (since is None or s >= since) and (until is None or s < until)]


def walk(store: Store, board: int, first: Any, **kw: Any) -> list[int]:
    """Every ID from a first page on, following cursors with `page`."""
    ids = list(first.ids)
    cursor = first.next_cursor
    while cursor is not None:
        page = store.page(BHP, board, cursor=cursor, **kw)
        ids += page.ids
        cursor = page.next_cursor
    return ids


def apply(
    w: World,
    model: Model,
    boards: list[int],
    pins: list[int],
    ops: list[tuple[Any, ...]],
    store: Store | None = None,
) -> None:
    s = store or w.store
    for kind, bi, pi, seq in ops:
        b, p = boards[bi], pins[pi]
        lst = model.lists.setdefault(b, {})
        if kind == "link":
            new = s.link(BHP, b, p, sequence=seq)
            assert new == (p not in lst)
            if seq is not None:
                lst[p] = seq
            elif p not in lst:
                lst[p] = w.ticks.now  # the tick this link took
        else:
            assert s.unlink(BHP, b, p) == (p in lst)
            lst.pop(p, None)


SEQS = st.none() | st.integers(0, 12)
OPS = st.lists(
    st.tuples(st.sampled_from(["link", "link", "unlink"]), st.integers(0, 2), st.integers(0, 7), SEQS),
    max_size=24,
)
BOUND = st.none() | st.integers(0, 14) | st.integers(CLOCK_START, CLOCK_START + 30)
RANGES = st.tuples(BOUND, BOUND).filter(lambda r: None in r or r[0] <= r[1])
PROPERTY = settings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


CHECKS = ["has_links", "has_links_many", "pages_many", "board_pins_many", "ranges"]


@PROPERTY
@given(
    ops=OPS,
    limit=st.integers(1, 5),
    span=RANGES,
    newest_first=st.booleans(),
    order=st.permutations(CHECKS),
    short=st.booleans(),
)
def test_every_many_lists_read_matches_a_model(
    world: World,
    config: StoreConfig,
    ops: list[tuple[Any, ...]],
    limit: int,
    span: tuple[int | None, int | None],
    newest_first: bool,
    order: list[str],
    short: bool,
) -> None:
    """Each call after random links, unlinks and moves, in a random order (whichever fills the cache),
    pages oldest or newest first. With ``short``, a store whose cached heads hold 3 entries (lists
    are longer: heads of either end answer, or miss) makes every call instead."""
    s = world.store
    if short and config.cache.enabled:
        s = Store(replace(config, cache=replace(config.cache, list_entries=3)), clock_us=world.ticks)
    world.ticks.now = CLOCK_START
    boards = [s.create("board", {"b": i}, shard=i * 3 % 8) for i in range(3)]
    real = [s.create("pin", {"i": i}, shard=i % 8) for i in range(6)]
    pins = [*real, world.ghost(3), world.ghost(6)]  # entries whose pin object does not exist
    model = Model()
    apply(world, model, boards, pins, ops, s)
    objects = {p: {"i": i} for i, p in enumerate(real)}
    since, until = span

    def has_links() -> None:
        for b in boards:
            assert s.has_links(BHP, b, pins) == set(model.lists.get(b, {}))
            assert s.has_links(BHP, b, []) == set()

    def has_links_many() -> None:
        every = [(b, p) for b in boards for p in pins]
        assert s.has_links_many(BHP, every) == {(b, p) for b in boards for p in model.lists.get(b, {})}
        assert s.has_links_many(POB, [(p, b) for b, p in every if p in real]) == {
            (p, b) for b in boards for p in model.lists.get(b, {}) if p in real
        }

    def pages_many() -> None:
        for newest in (newest_first, not newest_first):
            pages = s.pages_many(BHP, boards, limit=limit, newest_first=newest)
            assert list(pages) == boards
            for b in boards:
                order = model.order(b)[::-1] if newest else model.order(b)
                assert pages[b].ids == order[:limit]
                assert (pages[b].next_cursor is None) == (len(order) <= limit)
                assert pages[b] == s.page(BHP, b, limit=limit, newest_first=newest)
                assert walk(s, b, pages[b], limit=limit, newest_first=newest) == order
                assert s.links(BHP, b, limit=limit, offset=1, newest_first=newest) == order[1 : limit + 1]

    def board_pins_many() -> None:
        with_objects = s.board_pins_many(boards, limit=limit, newest_first=newest_first)
        for b in boards:
            shown = [p for p in model.order(b) if p in objects]
            if newest_first:
                shown.reverse()
            page = with_objects[b]
            assert page.ids == shown[:limit]
            assert page.objects == [objects[p] for p in shown[:limit]]
            assert page == s.board_pins(b, limit=limit, newest_first=newest_first)
            seen = list(page.ids)
            cursor = page.next_cursor
            while cursor is not None:
                more = s.board_pins(b, limit=limit, cursor=cursor, newest_first=newest_first)
                seen += more.ids
                cursor = more.next_cursor
            assert seen == shown

    def ranges() -> None:
        for b in boards:
            expected = model.in_range(b, since, until)
            first = s.page(BHP, b, limit=limit, since=since, until=until, newest_first=newest_first)
            got = walk(s, b, first, limit=limit, since=since, until=until, newest_first=newest_first)
            assert got == (expected[::-1] if newest_first else expected)

    checks = {f.__name__: f for f in (has_links, has_links_many, pages_many, board_pins_many, ranges)}
    try:
        for _round in ("cold", "warm"):
            for name in order:
                checks[name]()
        # More changes, updating (or dropping) the heads each read cached, then every read again.
        apply(world, model, boards, pins, ops[: len(ops) // 2], s)
        for name in order:
            checks[name]()
    finally:
        if s is not world.store:
            s.close()


def test_a_feed_one_call_per_question(world: World) -> None:
    """Twenty boards' first pins, and which of them the viewer liked."""
    s = world.store
    viewer = s.create("user", {"name": "viewer"})
    boards = [s.create("board", {"b": i}, shard=i % 8) for i in range(20)]
    pins = {b: [s.create("pin", {"b": i, "k": k}, near=b) for k in range(4)] for i, b in enumerate(boards)}
    for b, ps in pins.items():
        for p in ps:
            s.link(BHP, b, p)
    liked = [ps[k % 4] for k, ps in enumerate(pins.values())]
    for p in liked:
        s.link(LIKES, viewer, p)
    feed = s.board_pins_many(boards, limit=3)
    assert [feed[b].ids for b in boards] == [ps[:3] for ps in pins.values()]
    shown = [p for b in boards for p in feed[b].ids]
    hearts = s.has_links(LIKES, viewer, shown)
    assert hearts == {p for p in liked if p in shown}
    assert s.has_links_many(LIKES, [(viewer, p) for p in shown]) == {(viewer, p) for p in hearts}
    assert s.has_links("pin_liked_by_user", liked[0], [viewer]) == {viewer}
    # the next page of any board, from the cursor the feed gave
    cursor = feed[boards[0]].next_cursor
    assert cursor is not None
    assert s.board_pins(boards[0], limit=3, cursor=cursor).ids == pins[boards[0]][3:]
    assert s.page(BHP, boards[0], limit=3, cursor=cursor).ids == pins[boards[0]][3:]


def test_pages_many_of_long_lists_and_duplicates(world: World) -> None:
    s = world.store
    boards = [s.create("board", {}, shard=i) for i in (0, 5)]
    # Longer than a fill's head; pins on their board's shard, IDs in creation order.
    pins = [s.create("pin", {"i": i}, near=boards[i % 2]) for i in range(260)]
    for i, p in enumerate(pins):
        s.link(BHP, boards[i % 2], p, sequence=i // 3)
    for _round in (1, 2):
        pages = s.pages_many(BHP, [boards[1], boards[0], boards[1]], limit=7)
        assert list(pages) == [boards[1], boards[0]]
        for k, b in enumerate(boards):
            order = pins[k::2]
            assert pages[b].ids == order[:7]
            assert walk(s, b, pages[b], limit=50) == order
        assert s.has_links(BHP, boards[0], pins) == set(pins[0::2])
    empty = s.create("board", {})
    assert s.pages_many(BHP, [empty]) == {empty: s.page(BHP, empty)}
    assert s.board_pins_many([empty]) == {empty: s.board_pins(empty)}
    assert s.pages_many(BHP, []) == {}
    assert s.board_pins_many(iter([])) == {}
    assert s.has_links_many(BHP, []) == set()


def test_board_pins_many_fills_pages_past_gone_pins(world: World) -> None:
    s = world.store
    boards = [s.create("board", {}, shard=i) for i in (1, 6)]
    real = {b: [s.create("pin", {"b": k, "i": i}, near=b) for i in range(4)] for k, b in enumerate(boards)}
    for b, ps in real.items():
        for i, p in enumerate(ps):
            s.link(BHP, b, p, sequence=100 * i)
            for k in range(7):  # seven entries whose pins do not exist after each real one
                s.link(BHP, b, world.ghost(s.locate(b, type_name="board").shard), sequence=100 * i + 1 + k)
    for _round in (1, 2):
        got = s.board_pins_many(boards, limit=3)
        for b in boards:
            assert got[b].ids == real[b][:3]
            assert got[b] == s.board_pins(b, limit=3)
            rest = s.board_pins(b, limit=3, cursor=got[b].next_cursor)
            assert rest.ids == real[b][3:]
            assert rest.next_cursor is None


def test_sequence_ranges_and_their_cursors(world: World) -> None:
    s = world.store
    board = s.create("board", {})
    pins = [s.create("pin", {"i": i}, near=board) for i in range(30)]
    for i, p in enumerate(pins):
        s.link(BHP, board, p, sequence=10 * (i // 2))  # ties in pairs
    for _round in (1, 2):
        page = s.page(BHP, board, limit=4, since=40, until=100)  # since inclusive, until exclusive
        assert page.ids == pins[8:12]
        assert walk(s, board, page, limit=4, since=40, until=100) == pins[8:20]
        back = s.page(BHP, board, limit=3, since=40, until=100, newest_first=True)
        assert walk(s, board, back, limit=3, since=40, until=100, newest_first=True) == pins[8:20][::-1]
        assert s.page(BHP, board, since=140).ids == pins[28:]
        assert s.page(BHP, board, until=10).ids == pins[:2]
        assert s.page(BHP, board, since=55, until=55).ids == []
        assert s.page(BHP, board, since=1000).ids == []
        assert s.page(BHP, board, until=-(1 << 63)).ids == []  # nothing sorts before the least
        assert s.page(BHP, board, since=-(1 << 63), until=(1 << 63) - 1).ids == pins
    cursor = s.page(BHP, board, limit=2, since=40, until=100).next_cursor
    assert cursor is not None
    with pytest.raises(CursorError, match="since=40 until=100, not for the whole list"):
        s.page(BHP, board, limit=2, cursor=cursor)
    with pytest.raises(CursorError, match="not for sequences since=40 until=90"):
        s.page(BHP, board, limit=2, cursor=cursor, since=40, until=90)
    plain = s.page(BHP, board, limit=2).next_cursor
    assert plain is not None
    with pytest.raises(CursorError, match="made for the whole list"):
        s.page(BHP, board, limit=2, cursor=plain, since=0)


def test_bad_input_raises_and_changes_nothing(world: World) -> None:
    s = world.store
    board = s.create("board", {})
    pin = s.create("pin", {}, near=board)
    s.link(BHP, board, pin)
    before = s.stats()
    bad: list[tuple[type[Exception], Any]] = [
        (UnknownRelationError, lambda: s.has_links("likes", board, [pin])),
        (UnknownRelationError, lambda: s.has_links_many("likes", [(board, pin)])),
        (UnknownRelationError, lambda: s.pages_many("likes", [board])),
        (LimitError, lambda: s.pages_many(BHP, [board], limit=0)),
        (LimitError, lambda: s.pages_many(BHP, [board], limit=1001)),
        (LimitError, lambda: s.board_pins_many([board], limit=0)),
        (LimitError, lambda: s.board_pins_many([board], limit=5000)),
        (LimitError, lambda: s.page(BHP, board, since=10, until=9)),
        (LimitError, lambda: s.page(BHP, board, since="10")),
        (LimitError, lambda: s.page(BHP, board, until=1 << 63)),
        (IdError, lambda: s.has_links(BHP, board, pin)),
        (IdError, lambda: s.has_links(BHP, board, ["x"])),
        (IdError, lambda: s.has_links_many(BHP, [board, pin])),
        (IdError, lambda: s.pages_many(BHP, "123")),
        (IdError, lambda: s.board_pins_many([board, -1])),
    ]
    if not world.instagram:  # Instagram IDs carry no type: only Pinterest IDs can be the wrong one
        bad += [
            (WrongTypeError, lambda: s.has_links(BHP, pin, [pin])),
            (WrongTypeError, lambda: s.has_links(BHP, board, [pin, board])),
            (WrongTypeError, lambda: s.has_links_many(BHP, [(board, pin), (pin, pin)])),
            (WrongTypeError, lambda: s.pages_many(BHP, [board, pin])),
            (WrongTypeError, lambda: s.board_pins_many([board, pin])),
        ]
    for error, call in bad:
        with pytest.raises(error):
            call()
    assert s.stats() == before, "a refused call touched a cache"
    assert s.links(BHP, board) == [pin]
    assert s.count(BHP, board) == 1


def test_after_concurrent_writers_every_answer_equals_the_database(world: World, config: StoreConfig) -> None:
    import random

    s = world.store
    boards = [s.create("board", {}, shard=i) for i in (0, 2, 5, 7)]
    pins = [s.create("pin", {"i": i}, shard=i % 8) for i in range(10)]
    stop = threading.Event()
    errors: list[BaseException] = []

    def write(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(60):
                b, p = rng.choice(boards), rng.choice(pins)
                if rng.random() < 0.6:
                    s.link(BHP, b, p, sequence=rng.randrange(50))
                else:
                    s.unlink(BHP, b, p)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    def read() -> None:
        try:
            while not stop.is_set():
                s.pages_many(BHP, boards, limit=4)
                s.board_pins_many(boards, limit=3)
                s.has_links_many(BHP, [(b, p) for b in boards for p in pins])
                s.has_links(BHP, boards[0], pins)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    writers = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    readers = [threading.Thread(target=read) for _ in range(3)]
    for t in writers + readers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    for t in readers:
        t.join()
    assert errors == []
    with Store(replace(config, cache=CacheConfig())) as db:  # the databases, no cache
        truth = {b: db.links(BHP, b, limit=100) for b in boards}
    for _round in (1, 2):
        pages = s.pages_many(BHP, boards, limit=4)
        shown = s.board_pins_many(boards, limit=3)
        for b in boards:
            assert pages[b].ids == truth[b][:4]
            assert shown[b].ids == truth[b][:3]
            assert s.has_links(BHP, b, pins) == set(truth[b])
            assert s.count(BHP, b) == len(truth[b])
        assert s.has_links_many(BHP, [(b, p) for b in boards for p in pins]) == {
            (b, p) for b in boards for p in truth[b]
        }


# -- the list cache's rules ---------------------------------------------------------


#: The tests of the list cache's rules run where there is a list cache (Redis, or in-process).
on_cached_backends = pytest.mark.parametrize(
    "backend", ["sqlite-memory", "mariadb-cached", "postgres-memory"]
)


def cached(world: World) -> Any:
    lists = world.store.admin_context().caches.lists
    assert lists is not None
    return lists


def database_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every connection checkout from then on, by pool name."""
    calls: list[str] = []
    real = ConnectionPool.checkout

    def checkout(self: ConnectionPool) -> tuple[object, float]:
        calls.append(self.name)
        return real(self)

    monkeypatch.setattr(ConnectionPool, "checkout", checkout)
    return calls


@on_cached_backends
def test_has_links_answers_from_a_whole_cached_list_only(
    world: World, config: StoreConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    lists = cached(world)
    s = world.store
    board = s.create("board", {})
    pins = [s.create("pin", {"i": i}, near=board) for i in range(8)]
    for p in pins[:5]:
        s.link(BHP, board, p)
    assert s.page(BHP, board).ids == pins[:5]  # caches the whole list
    calls = database_calls(monkeypatch)
    assert s.has_links(BHP, board, pins) == set(pins[:5])
    assert s.has_links_many(BHP, [(board, p) for p in pins]) == {(board, p) for p in pins[:5]}
    assert calls == []
    # A list nobody cached: the membership query caches it whole too, then the cache answers.
    fresh = s.create("board", {})
    for p in pins[2:6]:
        s.link(BHP, fresh, p)
    calls.clear()
    fills = lists.stats.fills
    assert s.has_links(BHP, fresh, pins) == set(pins[2:6])
    assert (len(calls), lists.stats.fills) == (1, fills + 1)
    assert s.has_links(BHP, fresh, pins[:3]) == {pins[2]}
    assert s.has_links_many(BHP, [(fresh, p) for p in pins]) == {(fresh, p) for p in pins[2:6]}
    assert s.page(BHP, fresh).ids == pins[2:6]
    assert len(calls) == 1
    with Store(replace(config, cache=replace(config.cache, list_entries=3))) as short:
        short_lists = short.admin_context().caches.lists
        assert short_lists is not None
        other = short.create("board", {})
        for p in pins[:5]:
            short.link(BHP, other, p)
        before, fills = len(calls), short_lists.stats.fills
        assert short.has_links(BHP, other, pins) == set(pins[:5])  # 5 > 3: read, not cached
        assert short.has_links_many(BHP, [(other, p) for p in pins]) == {(other, p) for p in pins[:5]}
        assert (len(calls), short_lists.stats.fills) == (before + 2, fills)
        assert short.page(BHP, other, limit=2).ids == pins[:2]  # caches a head of 3 of 5
        assert short.has_links(BHP, other, pins) == set(pins[:5])
        assert len(calls) == before + 4  # the page (head and count in one), then not whole: the database


@on_cached_backends
def test_a_cached_list_is_trusted_for_max_stale_s_only(world: World) -> None:
    lists = cached(world)
    s = world.store
    board = s.create("board", {})
    a, b = (s.create("pin", {"i": i}, near=board) for i in range(2))
    s.link(BHP, board, a)
    now = [lists.clock_ms()]
    lists.clock_ms = lambda: now[0]
    assert s.pages_many(BHP, [board])[board].ids == [a]  # cached at `now`
    # A pair written behind the cache's back: a writer whose invalidation was lost.
    where = s.locate(board, type_name="board")
    h = s.admin_context().engines.shard(where.shard, where.host)
    repo = s.admin_context().relation_repository
    h.transaction(lambda cur: repo.add_in(cur, Side(h, BHP, board, b), 10**15, move=False))
    try:
        assert s.has_links(BHP, board, [a, b]) == {a}  # trusted, and stale (within the bound)
        assert s.pages_many(BHP, [board])[board].ids == [a]
        now[0] += int(s.config.cache.max_stale_s * 1000) + 1
        assert s.has_links(BHP, board, [a, b]) == {a, b}  # too old to trust: the database
        assert s.pages_many(BHP, [board])[board].ids == [a, b]  # read again and filled again
        assert s.has_links(BHP, board, [a, b]) == {a, b}
    finally:
        s.unlink(BHP, board, b)  # no half pair left for the repair tests to find


@on_cached_backends
def test_a_slow_batch_reader_cannot_refill_a_list_a_writer_invalidated(world: World) -> None:
    lists = cached(world)
    s = world.store
    boards = [s.create("board", {}, shard=i) for i in (0, 5)]
    a, b, c = (s.create("pin", {"i": i}, shard=i) for i in range(3))
    for board in boards:
        s.link(BHP, board, a)
    ran: list[bool] = []

    def writer_links_in_between() -> None:
        lists.after_load = None
        s.link(BHP, boards[0], b)  # commit, then invalidate boards[0]'s list
        ran.append(True)

    lists.after_load = writer_links_in_between
    fills = lists.stats.fills
    pages = s.pages_many(BHP, boards)
    assert [pages[x].ids for x in boards] == [[a], [a]]  # read before the link
    assert ran == [True]
    assert lists.stats.fills == fills + 1, "only the list nobody wrote may be filled"
    assert s.has_links(BHP, boards[0], [a, b, c]) == {a, b}
    assert s.pages_many(BHP, boards)[boards[0]].ids == [a, b]
    assert s.board_pins_many(boards)[boards[0]].ids == [a, b]
    # and the other way round: a fill that lands is invalidated by a later write
    s.link(BHP, boards[1], c)
    assert s.pages_many(BHP, boards)[boards[1]].ids == [a, c]
    assert s.has_links(BHP, boards[1], [a, b, c]) == {a, c}


@on_cached_backends
def test_cached_heads_answer_ranges_within_them(world: World, config: StoreConfig) -> None:
    cached(world)
    with Store(replace(config, cache=replace(config.cache, list_entries=6))) as short:
        board = short.create("board", {})
        pins = [short.create("pin", {"i": i}, near=board) for i in range(12)]
        for i, p in enumerate(pins):
            short.link(BHP, board, p, sequence=i)
        short_lists = short.admin_context().caches.lists
        assert short_lists is not None
        assert short.page(BHP, board, limit=1).ids == pins[:1]  # caches a head of 6
        hits = short_lists.stats.hits
        assert short.page(BHP, board, since=1, until=4).ids == pins[1:4]  # inside the head
        assert short.page(BHP, board, since=2, until=5, newest_first=True).ids == pins[2:5][::-1]
        assert short_lists.stats.hits == hits + 2
        assert short.page(BHP, board, since=3, until=9).ids == pins[3:9]  # past the head: the database
        assert short.page(BHP, board, since=8).ids == pins[8:]
        assert short.page(BHP, board, limit=2, since=1, until=9).ids == pins[1:3]  # enough rows in the head
        assert short_lists.stats.hits == hits + 3


def test_a_dead_list_cache_makes_many_list_reads_slower_never_wrong(tmp_path: Path) -> None:
    raw = sqlite_config(tmp_path)
    raw["cache"] = {"redis": "redis://127.0.0.1:1/15", "timeout_ms": 20, "connect_timeout_ms": 20}
    with Store.from_config(raw) as s:
        boards = [s.create("board", {}, shard=i) for i in (0, 5)]
        pins = [s.create("pin", {"i": i}, shard=i) for i in range(6)]
        for b in boards:
            for p in pins[:4]:
                s.link(BHP, b, p)
        for _round in (1, 2):  # failing, then skipped by the breaker
            assert {b: p.ids for b, p in s.pages_many(BHP, boards).items()} == {b: pins[:4] for b in boards}
            assert s.board_pins_many(boards)[boards[1]].objects == [{"i": i} for i in range(4)]
            assert s.has_links(BHP, boards[0], pins) == set(pins[:4])
            assert s.has_links_many(BHP, [(b, p) for b in boards for p in pins]) == {
                (b, p) for b in boards for p in pins[:4]
            }
            assert s.page(BHP, boards[0], since=0).ids == pins[:4]
        counters = s.stats()["redis"]
        assert counters["errors"] + counters["skipped"] > 0
        assert counters["fills"] == 0


@pytest.mark.parametrize("backend", ["mariadb-cached"])
def test_batch_fills_load_their_script_after_a_redis_restart(world: World) -> None:
    from store.cache.redis_lists import RedisListBackend

    lists = cached(world)
    assert isinstance(lists.backend, RedisListBackend)
    s = world.store
    boards = [s.create("board", {}, shard=i) for i in (1, 6)]
    pin = s.create("pin", {}, shard=2)
    for b in boards:
        s.link(BHP, b, pin)
    lists.backend.client.script_flush()  # as after a restart: the server knows no script
    fills = lists.stats.fills
    assert {b: p.ids for b, p in s.pages_many(BHP, boards).items()} == {b: [pin] for b in boards}
    assert lists.stats.fills == fills + 2
    assert lists.stats.errors == 0


# -- EXPLAIN on MariaDB: the new statements read the indexes, without a filesort --


@pytest.mark.parametrize(
    "statement",
    ["page_asc_range", "page_desc_range", "page_asc_range_after", "page_desc_range_after"],
)
def test_range_pages_use_the_sequence_index_without_filesort(
    mariadb_ready: StoreConfig, statement: str
) -> None:
    with Store(mariadb_ready) as store, _five_hundred_pins(store) as (h, board, rows):
        sql = getattr(store.admin_context().relation_repository.sql(h, BHP), statement)
        after = (200, 200, rows[200][1]) if statement.endswith("after") else ()
        plan = _explain(h, sql, (board, 100, 400, *after, 51))
    assert len(plan) == 1, plan
    assert plan[0]["key"] == "board_has_pins_from_sequence_to", plan
    assert plan[0]["type"] == "range", plan
    assert "filesort" not in (plan[0]["Extra"] or ""), plan


def test_many_pages_read_each_list_by_the_index_and_membership_by_the_key(mariadb_ready: StoreConfig) -> None:
    from store.backends.statements import with_part

    with Store(mariadb_ready) as store, _five_hundred_pins(store) as (h, board, rows):
        sql = store.admin_context().relation_repository.sql(h, BHP)
        stmts = store.admin_context().relation_repository.statements(h, BHP)
        union = " UNION ALL ".join(
            [
                with_part(sql.part_page_asc, 0),
                with_part(sql.part_page_asc_after, 1),
                with_part(sql.part_head_fits, 2),
                with_part(sql.part_count, 3),
                stmts.in_list(with_part(sql.part_linked, 4), 2),
            ]
        )
        params = (board, 51, board, 200, 200, rows[200][1], 51, board, BHP, board, 1000, 1000, BHP, board)
        plan = _explain(h, union, (*params, board, rows[1][1], 5))
        member_plan = _explain(h, stmts.in_list(sql.linked, 3), (board, rows[1][1], rows[2][1], 5))
    derived = [p for p in plan if p["table"] == "board_has_pins" and p["select_type"] == "DERIVED"]
    assert len(derived) == 3, plan
    for p in derived:
        assert p["key"] == "board_has_pins_from_sequence_to", plan
        assert "filesort" not in (p["Extra"] or ""), plan
    members = [p for p in plan if p["table"] == "board_has_pins" and p["select_type"] == "UNION"]
    assert [p["key"] for p in members] == ["PRIMARY"], plan
    assert member_plan[0]["key"] == "PRIMARY", member_plan
    assert member_plan[0]["type"] == "range", member_plan


class _five_hundred_pins:  # noqa: N801 - used as a context manager, like a function
    """A board with 500 entries and three other lists of 500 beside it on shard 6, removed after."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def __enter__(self) -> tuple[Any, int, list[tuple[int, int, int]]]:
        store = self.store
        board = store.create("board", {}, shard=6)
        self.h = h = store.admin_context().engines.shard(6, store.shard_map.master(6))
        self.froms = [board] + [encode_pinterest(6, 2, 10**9 + k) for k in range(3)]
        rows = [(f, encode_pinterest(6, 1, 10**9 + j), j) for f in self.froms for j in range(500)]
        with h.connect() as conn:
            cur = conn.cursor()
            cur.executemany(
                f"INSERT INTO {h.table(BHP)} (from_id, to_id, sequence) VALUES (%s, %s, %s)", rows
            )
            cur.execute(f"ANALYZE TABLE {h.table(BHP)}")
            cur.fetchall()
        return h, board, rows

    def __exit__(self, *exc: object) -> None:
        with self.h.connect() as conn:
            cur = conn.cursor()
            cur.executemany(f"DELETE FROM {self.h.table(BHP)} WHERE from_id = %s", [(f,) for f in self.froms])


def _explain(h: Any, sql: str, params: tuple[Any, ...]) -> list[dict[str, Any]]:
    with h.connect() as conn:
        cur = conn.cursor()
        cur.execute("EXPLAIN " + sql, params)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


# -- the command line ---------------------------------------------------------------


def test_cli_has_link_and_links_with_a_range(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from click.testing import CliRunner

    from store.cli import main

    monkeypatch.setenv("STORE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("STORE_CONFIG", raising=False)
    runner = CliRunner()

    def run(*args: str, code: int = 0) -> str:
        result = runner.invoke(main, list(args))
        assert result.exit_code == code, (result.output, result.exception)
        return result.output

    board = run("create", "board", "{}").strip()
    pins = [run("create", "pin", json.dumps({"i": i}), "--near", board).strip() for i in range(5)]
    for i, p in enumerate(pins[:4]):
        run("link", BHP, board, p, "--sequence", str(10 * i))
    assert run("has-link", BHP, board, pins[0]) == "true\n"
    assert run("has-link", BHP, board, pins[4]) == "false\n"  # exit 0 either way
    assert json.loads(run("has-link", BHP, board, pins[1], "--json")) is True
    assert json.loads(run("has-link", BHP, board, pins[4], "--json")) is False
    assert "unknown relation" in run("has-link", "likes", board, pins[0], code=1)
    out = json.loads(run("links", BHP, board, "--since", "10", "--until", "40", "--limit", "2", "--json"))
    assert out["ids"] == [int(p) for p in pins[1:3]]
    more = json.loads(
        run("links", BHP, board, "--since", "10", "--until", "40", "--cursor", out["next_cursor"], "--json")
    )
    assert more == {"ids": [int(pins[3])], "next_cursor": None}
    assert run("links", BHP, board, "--until", "20").split() == pins[:2]
    assert "cursor was made for sequences since=10 until=40" in run(
        "links", BHP, board, "--cursor", out["next_cursor"], code=1
    )
    assert "since (30) is after until (20)" in run(
        "links", BHP, board, "--since", "30", "--until", "20", code=1
    )
    assert "leave out --offset" in run("links", BHP, board, "--since", "1", "--offset", "0", code=1)


# -- the quick check of many to_ids agrees with routing's ------------------------------

ID_PARTS = st.tuples(
    st.sampled_from([0, 1, 2, 3, 7, 4095, 4096, 65535]),  # shard
    st.sampled_from([0, 1, 2, 3, 17, 1023]),  # type
    st.sampled_from([0, 1, 5, (1 << 32), (1 << 36) - 1]),  # local id
)
ODD = st.sampled_from([True, False, -1, 0, 1 << 62, 1 << 63, (1 << 64) + 5, "7", 2.0, None])


@settings(max_examples=300, deadline=None, database=None)
@given(
    shards=st.sampled_from([8, 4096, 5000]),
    parts=st.lists(ID_PARTS, min_size=1, max_size=3),
    fill=st.integers(15, 40),
    odd=st.lists(st.tuples(st.integers(0, 40), ODD), max_size=2),
)
def test_the_quick_check_of_many_ids_refuses_what_routing_refuses(
    shards: int, parts: list[tuple[int, int, int]], fill: int, odd: list[tuple[int, Any]]
) -> None:
    from store.relations.reads import check_to_ids
    from store.routing import Router
    from tests.conftest import base_config

    raw = base_config(
        shards=shards, hosts={"A": "sqlite:///unused"}, map=[{"range": [0, shards - 1], "master": "A"}]
    )
    router = Router(StoreConfig.from_dict(raw))
    good = encode_pinterest(min(1, shards - 1), 1, 42)
    ids: list[Any] = [good] * fill
    for k, (shard, type_id, local) in enumerate(parts):
        ids[k * 7 % fill] = (shard << 46) | (type_id << 36) | local
    for at, value in odd:
        ids[at % fill] = value

    def outcome(check: Any) -> str:
        try:
            check(router, ids, "pin")
        except Exception as exc:  # the type is what must agree
            return type(exc).__name__
        return "ok"

    assert outcome(check_to_ids) == outcome(lambda r, i, t: r.check_ids(i, t))


@pytest.mark.parametrize("shards", [8, 4096])
def test_the_quick_check_passes_good_ids_without_routing_each(shards: int) -> None:
    from store.relations.reads import check_to_ids
    from store.routing import Router
    from tests.conftest import base_config

    raw = base_config(
        shards=shards, hosts={"A": "sqlite:///unused"}, map=[{"range": [0, shards - 1], "master": "A"}]
    )
    router = Router(StoreConfig.from_dict(raw))
    ids = [encode_pinterest(s % shards, 1, 1 + (s << 20)) for s in range(0, 600, 7)]

    def slow(_ids: Any, _type: Any = None) -> None:
        raise AssertionError("routed one by one")

    router.check_ids = slow  # type: ignore[method-assign]
    check_to_ids(router, ids, "pin")
    with pytest.raises(AssertionError):
        check_to_ids(router, [*ids, encode_pinterest(0, 2, 1)], "pin")  # a board among them
