"""Ordered relations on each backend: order, idempotence, moves, counts, cursors, inverses."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from store import (
    CursorError,
    DataError,
    LimitError,
    Store,
    StoreConfig,
    UnknownRelationError,
    WrongTypeError,
    encode_pinterest,
)
from store.backends.mysql import pymysql_fast
from store.cache.lists import encode_members

BHP = "board_has_pins"
POB = "pin_owned_by_board"

#: The ``store`` fixture's tests run on the sync and the async face (`tests.asyncface`).
BOTH_FACES = True


@pytest.fixture
def board(store: Store) -> int:
    return store.create("board", {"name": "kitchen"})


def pins(store: Store, n: int, *, spread: bool = True) -> list[int]:
    return [store.create("pin", {"i": i}, shard=(i % store.config.shards) if spread else 0) for i in range(n)]


def test_default_sequence_is_time_of_adding(store: Store, board: int) -> None:
    ps = pins(store, 5)
    for p in ps:
        assert store.link(BHP, board, p) is True
    assert store.links(BHP, board) == ps
    assert store.links(BHP, board, newest_first=True) == ps[::-1]
    assert store.count(BHP, board) == 5


def test_order_by_sequence_with_ties_broken_by_to_id(store: Store, board: int) -> None:
    ps = pins(store, 6)
    seqs = [30, 10, 20, 10, 30, 10]
    for p, s in zip(ps, seqs, strict=True):
        store.link(BHP, board, p, sequence=s)
    expected = [p for _s, p in sorted(zip(seqs, ps, strict=True))]
    assert store.links(BHP, board) == expected
    assert store.links(BHP, board, newest_first=True) == expected[::-1]
    assert store.links(BHP, board, limit=2, offset=3) == expected[3:5]
    assert store.links(BHP, board, offset=6) == []


def test_link_is_idempotent_and_keeps_its_position(store: Store, board: int) -> None:
    a, b, c = pins(store, 3)
    for p in (a, b, c):
        store.link(BHP, board, p)
    assert store.link(BHP, board, a) is False
    assert store.links(BHP, board) == [a, b, c]
    assert store.count(BHP, board) == 3
    assert store.count(POB, a) == 1


def test_has_link_answers_for_each_pair_and_checks_types(store: Store, board: int) -> None:
    from store import WrongTypeError

    a, b = pins(store, 2)
    store.link(BHP, board, a)
    assert store.has_link(BHP, board, a) is True
    assert store.has_link(BHP, board, b) is False
    assert store.has_link(POB, a, board) is True  # the inverse side
    store.unlink(BHP, board, a)
    assert store.has_link(BHP, board, a) is False
    with pytest.raises(WrongTypeError):
        store.has_link(BHP, a, board)


def test_relinking_a_pair_in_place_keeps_the_cached_lists(store: Store, board: int) -> None:
    lists = store.admin_context().caches.lists
    a, b = pins(store, 2)
    store.link(BHP, board, a)
    store.link(BHP, board, b)
    assert store.links(BHP, board) == [a, b]  # cached now, where a list cache is configured
    before = None if lists is None else lists.stats.as_dict()["invalidations"]
    assert store.link(BHP, board, a) is False  # both sides in place: nothing changes
    if lists is not None:
        assert lists.stats.as_dict()["invalidations"] == before
    assert store.links(BHP, board) == [a, b]
    store.link(BHP, board, a, sequence=1 << 62)  # a move changes both sides: dropped and read again
    assert store.links(BHP, board) == [b, a]
    assert store.links(POB, a) == [board]


def test_relinking_with_a_sequence_moves_the_pair_on_both_sides(store: Store, board: int) -> None:
    a, b, c = pins(store, 3)
    for i, p in enumerate((a, b, c)):
        store.link(BHP, board, p, sequence=100 + i)
    assert store.link(BHP, board, a, sequence=500) is False
    assert store.links(BHP, board) == [b, c, a]
    assert store.count(BHP, board) == 3
    h = store.admin_context().engines.shard(store.locate(a).shard, store.locate(a).host)
    assert store.admin_context().relation_repository.sequence_of(h, POB, a, board) == 500


def test_unlink_removes_both_sides(store: Store, board: int) -> None:
    a, b = pins(store, 2)
    store.link(BHP, board, a)
    store.link(BHP, board, b)
    assert store.unlink(BHP, board, a) is True
    assert store.unlink(BHP, board, a) is False
    assert store.links(BHP, board) == [b]
    assert store.links(POB, a) == []
    assert store.count(BHP, board) == 1
    assert store.count(POB, a) == 0


def test_inverse_lists_match_and_can_be_written_through_either_name(store: Store) -> None:
    boards = [store.create("board", {"b": i}) for i in range(3)]
    (pin,) = pins(store, 1)
    store.link(BHP, boards[0], pin, sequence=1)
    store.link(POB, pin, boards[1], sequence=2)  # written as the inverse: primary side first
    store.link(BHP, boards[2], pin, sequence=3)
    assert store.links(POB, pin) == boards
    for b in boards:
        assert store.links(BHP, b) == [pin]
    assert store.count(POB, pin) == 3
    assert store.unlink(POB, pin, boards[1]) is True
    assert store.links(BHP, boards[1]) == []
    assert store.links(POB, pin) == [boards[0], boards[2]]


def test_relation_without_inverse(store: Store) -> None:
    user = store.create("user", {"name": "ada"})
    (pin,) = pins(store, 1)
    store.link("users_has_pins", user, pin)
    assert store.links("users_has_pins", user) == [pin]
    assert store.count("users_has_pins", user) == 1
    assert store.unlink("users_has_pins", user, pin) is True


def walk(store: Store, board: int, limit: int, newest_first: bool = False) -> Iterator[list[int]]:
    cursor = None
    while True:
        page = store.page(BHP, board, limit=limit, cursor=cursor, newest_first=newest_first)
        yield page.ids
        if page.next_cursor is None:
            return
        cursor = page.next_cursor


def test_cursor_pages_cover_the_list_once_in_order(store: Store, board: int) -> None:
    ps = pins(store, 23)
    for i, p in enumerate(ps):
        store.link(BHP, board, p, sequence=i // 3)  # many ties, across page boundaries
    expected = store.links(BHP, board, limit=100)
    pages = list(walk(store, board, 5))
    assert [len(p) for p in pages] == [5, 5, 5, 5, 3]
    assert [i for p in pages for i in p] == expected
    assert [i for p in walk(store, board, 4, newest_first=True) for i in p] == expected[::-1]
    assert store.page(BHP, board, limit=23).next_cursor is None
    empty = store.create("board", {})
    assert store.page(BHP, empty) == store.page(BHP, empty, limit=1)


def test_cursor_pages_while_pins_are_added(store: Store, board: int) -> None:
    before = pins(store, 120)
    for p in before:
        store.link(BHP, board, p)
    later = pins(store, 80)
    done = threading.Event()

    def add() -> None:
        for p in later:
            store.link(BHP, board, p)
        done.set()

    adder = threading.Thread(target=add)
    adder.start()
    seen: list[int] = []
    for page in walk(store, board, 7):
        seen += page
    adder.join()
    assert len(seen) == len(set(seen)), "a pin came back twice"
    assert set(before) <= set(seen), "a pin that existed before paging began was skipped"
    assert set(seen) <= set(before) | set(later)


def test_counts_stay_exact_under_concurrent_link_and_unlink(store: Store, board: int) -> None:
    ps = pins(store, 25)
    errors: list[BaseException] = []

    def churn(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(200):
                p = rng.choice(ps)
                if rng.random() < 0.6:
                    store.link(BHP, board, p)
                else:
                    store.unlink(BHP, board, p)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=churn, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    linked = store.links(BHP, board, limit=1000)
    assert store.count(BHP, board) == len(linked)
    for p in ps:
        assert store.links(POB, p) == ([board] if p in linked else [])
        assert store.count(POB, p) == (1 if p in linked else 0)


def test_board_pins_returns_objects_in_order(store: Store, board: int) -> None:
    ps = pins(store, 5)
    for p in ps:
        store.link(BHP, board, p)
    store.delete(ps[2])  # leaves the board's list too
    page = store.board_pins(board, limit=3)
    assert page.ids == [ps[0], ps[1], ps[3]]
    assert page.objects == [{"i": 0}, {"i": 1}, {"i": 3}]
    rest = store.board_pins(board, limit=3, cursor=page.next_cursor)
    assert rest.ids == [ps[4]]
    assert rest.next_cursor is None


def test_board_pins_skips_entries_whose_pin_is_gone_and_fills_the_page(store: Store, board: int) -> None:
    """Entries no object answers for (a pin lost outside the store) never make a page short."""
    ps = pins(store, 4)
    for i, p in enumerate(ps):
        store.link(BHP, board, p, sequence=100 * i)
        for k in range(7):  # seven entries whose pins do not exist, after each real one
            store.link(BHP, board, encode_pinterest(1, 1, 900_000 + 10 * i + k), sequence=100 * i + 1 + k)
    seen: list[int] = []
    cursor = None
    while True:
        page = store.board_pins(board, limit=3, cursor=cursor)
        assert page.ids == ps[len(seen) : len(seen) + 3]
        seen += page.ids
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == ps


def test_bad_relation_calls(store: Store, board: int) -> None:
    (pin,) = pins(store, 1)
    user = store.create("user", {})
    with pytest.raises(
        UnknownRelationError, match="unknown relation 'likes'; the config defines: board_has_pins"
    ):
        store.link("likes", board, pin)
    with pytest.raises(WrongTypeError, match="is a user, not a board"):
        store.link(BHP, user, pin)
    with pytest.raises(WrongTypeError, match="is a user, not a pin"):
        store.link(BHP, board, user)
    with pytest.raises(WrongTypeError):
        store.links(BHP, pin)
    with pytest.raises(LimitError, match=r"limit must be an int in 1\.\.1000 \(limits.max_page\)"):
        store.links(BHP, board, limit=1001)
    with pytest.raises(LimitError):
        store.page(BHP, board, limit=0)
    with pytest.raises(LimitError, match="offset"):
        store.links(BHP, board, offset=-1)
    with pytest.raises(DataError, match="sequence must be a 64-bit signed int"):
        store.link(BHP, board, pin, sequence=1 << 63)
    assert store.links(BHP, board) == []
    assert store.count(BHP, board) == 0


def test_bad_cursors(store: Store, board: int) -> None:
    ps = pins(store, 3)
    for p in ps:
        store.link(BHP, board, p)
    cursor = store.page(BHP, board, limit=1).next_cursor
    assert cursor is not None
    other = store.create("board", {})
    with pytest.raises(CursorError, match="not a cursor that page"):
        store.page(BHP, board, cursor="garbage!")
    with pytest.raises(CursorError, match="made for board_has_pins of"):
        store.page(BHP, other, cursor=cursor)
    with pytest.raises(CursorError, match="oldest first"):
        store.page(BHP, board, cursor=cursor, newest_first=True)


def test_unmapped_to_id_writes_nothing(store: Store, board: int) -> None:
    from store import RoutingError

    with pytest.raises(RoutingError):
        store.link(BHP, board, encode_pinterest(3429, 1, 5))
    assert store.count(BHP, board) == 0


def test_many_threads_with_a_small_pool_never_wait_for_each_other(config: StoreConfig) -> None:
    """Each cross-host pair write needs a connection from each of two pools: taken in a fixed order."""
    from dataclasses import replace

    with Store(replace(config, pool_size=1, pool_timeout_s=20.0)) as store:  # 2 connections per pool
        boards = [store.create("board", {}, shard=s) for s in (0, 5)]
        ps = [store.create("pin", {}, shard=s) for s in (1, 6, 2, 7)]
        errors: list[BaseException] = []

        def churn(seed: int) -> None:
            rng = random.Random(seed)
            try:
                for _ in range(30):
                    b, p = rng.choice(boards), rng.choice(ps)
                    (store.link if rng.random() < 0.6 else store.unlink)(BHP, b, p)
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=churn, args=(i,)) for i in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == []
        for b in boards:
            linked = store.links(BHP, b)
            assert store.count(BHP, b) == len(linked)
            for p in ps:
                assert (b in store.links(POB, p)) == (p in linked)


def test_deleting_a_board_with_more_pins_than_one_round_empties_every_list(store: Store) -> None:
    from store.relations import REMOVE_CHUNK

    board = store.create("board", {}, shard=1)
    ps = pins(store, REMOVE_CHUNK + 30)
    for p in ps:
        store.link(BHP, board, p)
    assert store.delete(board) is True
    assert store.count(BHP, board) == 0
    assert store.links(BHP, board) == []
    assert all(store.links(POB, p) == [] for p in ps[:: len(ps) // 7])
    assert store.delete(board) is False  # again: nothing left to do, nothing fails


def test_deleting_a_pin_takes_it_out_of_every_list_of_every_relation(store: Store) -> None:
    """A pin on more boards than one round of the sweep takes, and liked by users: each list of
    both relations loses it, on both sides, with its count; another pin stays where it was."""
    from store.relations import REMOVE_CHUNK

    shards = store.config.shards
    pin, other = store.create("pin", {}, shard=2), store.create("pin", {}, shard=2)
    boards = [store.create("board", {"i": i}, shard=i % shards) for i in range(REMOVE_CHUNK + 3)]
    users = [store.create("user", {"i": i}, shard=(i * 3) % shards) for i in range(5)]
    for b in boards:
        store.link(BHP, b, pin)
    for u in users:
        store.link("users_likes_pins", u, pin)
    store.link(BHP, boards[0], other)
    store.link("users_likes_pins", users[0], other)
    assert store.count(POB, pin) == len(boards)
    assert store.delete(pin) is True
    assert (store.links(POB, pin), store.count(POB, pin)) == ([], 0)
    assert (store.links("pin_liked_by_user", pin), store.count("pin_liked_by_user", pin)) == ([], 0)
    assert [store.links(BHP, b) for b in boards] == [[other]] + [[]] * (len(boards) - 1)
    assert [store.count(BHP, b) for b in boards] == [1] + [0] * (len(boards) - 1)
    assert [store.links("users_likes_pins", u) for u in users] == [[other]] + [[]] * (len(users) - 1)
    assert store.links(POB, other) == [boards[0]]
    assert store.links("pin_liked_by_user", other) == [users[0]]


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_a_fills_packed_head_on_postgresql_is_the_head_the_rows_give(store: Store, board: int) -> None:
    """PostgreSQL packs a fill's head too (int8send of the sequence with its sign bit flipped, then
    of to_id, joined by string_agg): the same entries, in the same order, as the rows, at both
    ends of BIGINT, below zero and with ties; newest first, the last entries in list order; and
    the list's version, read in the same statement."""
    ps = pins(store, 12)
    sequences = [-(1 << 63), -5, -5, 0, 1, 1 << 40, (1 << 63) - 1, 7, 7, 7, -1, 3]
    for p, s in zip(ps, sequences, strict=True):
        store.link(BHP, board, p, sequence=s)
    relations = store.admin_context().relations
    h = relations.handle(store.config.relations[BHP], board)
    rows = relations.repo.page(h, BHP, board, 100, None, False)
    assert rows == sorted((s, p) for p, s in zip(ps, sequences, strict=True))
    assert relations.repo.sql(h, BHP).head_packed is not None
    # The list's version with them: bumped by each of the 12 links, as the counts row keeps it.
    kept = h.read(relations.repo.sql(h, BHP).version_of, (BHP, board), one=True)
    assert kept is not None
    assert int(kept[0]) == 12
    for limit in (1, 5, 12, 100):
        n, head, packed, version = relations.repo.head_and_count(h, BHP, board, limit)
        assert (n, head, version) == (12, rows[:limit], 12)
        assert packed == encode_members(rows[:limit])
        n, newest, packed, _v = relations.repo.head_and_count(h, BHP, board, limit, newest=True)
        assert (n, newest) == (12, rows[-limit:])
        assert packed == encode_members(rows[-limit:])
    empty = store.create("board", {"name": "empty"})
    assert relations.repo.head_and_count(relations.handle(store.config.relations[BHP], empty), BHP, empty, 5)[
        :3
    ] == (0, [], b"")


@pytest.mark.parametrize("backend", ["mariadb"], indirect=True)
def test_a_fills_packed_head_is_the_head_the_rows_give(
    store: Store, board: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MariaDB packs a fill's head into one value: the same entries, in the same order, as the rows.

    Sequences below zero, at both ends of BIGINT, and ties broken by to_id;
    then a group_concat_max_len too small for the head, which must not cut
    the list short (the rows are read instead).
    """
    ps = pins(store, 12)
    sequences = [-(1 << 63), -5, -5, 0, 1, 1 << 40, (1 << 63) - 1, 7, 7, 7, -1, 3]
    for p, s in zip(ps, sequences, strict=True):
        store.link(BHP, board, p, sequence=s)
    ctx = store.admin_context()
    relations = ctx.relations
    h = relations.handle(store.config.relations[BHP], board)
    rows = relations.repo.page(h, BHP, board, 100, None, False)
    assert rows == sorted((s, p) for p, s in zip(ps, sequences, strict=True))
    for limit in (1, 5, 12, 100):
        n, head, packed, version = relations.repo.head_and_count(h, BHP, board, limit)
        assert (n, head, version) == (12, rows[:limit], 12)  # a version per change: 12 links
        assert packed is not None
        assert len(packed) == 16 * min(limit, 12)
    with h.connect() as conn:
        cur = conn.cursor()
        cur.execute("SET SESSION group_concat_max_len = 40")  # two and a half entries
        cur.execute(relations.repo.sql(h, BHP).head_packed, (BHP, board, board, 12))
        n_cut, cut = cur.fetchone()
        cur.execute("SET SESSION group_concat_max_len = DEFAULT")
    assert (n_cut.decode() if isinstance(n_cut, bytes) else n_cut) == "12:12"  # count:version
    assert len(cut) == 40
    # The new store's connections start so, as under a server whose global setting is 40 (set
    # here on this process's new connections only: the server's global setting is everyone's).
    real_adopt = pymysql_fast.adopt

    def adopt_short(conn: Any, module: Any) -> None:
        real_adopt(conn, module)
        cur = conn.cursor()
        cur.execute("SET SESSION group_concat_max_len = 40")
        cur.close()

    monkeypatch.setattr(pymysql_fast, "adopt", adopt_short)
    with Store(store.config) as short:
        sh = short.admin_context().relations
        side = sh.handle(short.config.relations[BHP], board)
        with sh.handle(short.config.relations[BHP], board).connect() as conn:
            cur = conn.cursor()
            cur.execute("SELECT @@SESSION.group_concat_max_len")
            assert int(cur.fetchone()[0]) == 40
        assert sh.repo.head_and_count(side, BHP, board, 12) == (
            12,
            rows,
            None,
            0,
        )  # rows, not a cut head (and no version: the list is dropped on its next change)
        assert short.page(BHP, board, limit=12).ids == [p for _s, p in rows]
    monkeypatch.undo()
    # The cache gets the same members either way, and pages from it are the rows'.
    assert store.page(BHP, board, limit=12).ids == [p for _s, p in rows]
    assert store.page(BHP, board, limit=12).ids == [p for _s, p in rows]
