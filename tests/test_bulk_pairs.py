"""`Store.link_many` and `Store.unlink_many`: pairs batched per host pair under `link`'s protocol.

On SQLite and MariaDB (each with and without caches, two host names) and
PostgreSQL with Instagram IDs; the round trips on MariaDB, counted on the
sockets as `tests/test_round_trips.py` counts them.
"""

from __future__ import annotations

import pytest

from store import DataError, IdError, LimitError, NotFound, Store, UnknownRelationError, WrongTypeError
from store.tools.mix.runner import counting_sends, reset_sends, sends

BHP = "board_has_pins"
POB = "pin_owned_by_board"


@pytest.fixture(params=["sqlite", "sqlite-memory", "mariadb", "mariadb-cached", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    """SQLite and MariaDB, without and with caches, and PostgreSQL with Instagram IDs."""
    return str(request.param)


def test_link_many_and_unlink_many_write_both_sides_and_counts(store: Store) -> None:
    boards = store.create_many("board", [{"b": i} for i in range(3)])
    pins = store.create_many("pin", [{"p": i} for i in range(6)])
    pairs = [(b, p) for b in boards for p in pins]
    assert store.link_many(BHP, pairs) == 18
    assert store.link_many(BHP, pairs[:5]) == 0  # in place already: nothing new
    for b in boards:
        assert store.page(BHP, b).ids == sorted(pins)  # one sequence for the batch: ties by to_id
        assert store.count(BHP, b) == 6
    for p in pins:
        assert sorted(store.links(POB, p)) == sorted(boards)
        assert store.count(POB, p) == 3
    # The inverse relation's name writes the same pairs, the other way round.
    extra = store.create("pin", {"p": 9})
    assert store.link_many(POB, [(extra, boards[0])]) == 1
    assert store.has_link(BHP, boards[0], extra)
    # A sequence moves pairs that are there (not new) and places the new ones.
    assert store.link_many(BHP, [(boards[0], pins[0]), (boards[0], extra)], sequence=1) == 0
    assert store.page(BHP, boards[0]).ids[:2] == sorted([pins[0], extra])
    assert store.unlink_many(BHP, [(b, p) for b in boards for p in pins[:2]] + [(boards[1], extra)]) == 6
    assert store.count(BHP, boards[1]) == 4
    assert store.links(POB, pins[0]) == []
    assert store.count(POB, pins[1]) == 0
    assert store.unlink_many(BHP, []) == 0
    # users_has_pins has no inverse: one side only.
    user = store.create("user", {"u": 1})
    assert store.link_many("users_has_pins", [(user, p) for p in pins]) == 6
    assert store.count("users_has_pins", user) == 6
    assert store.unlink_many("users_has_pins", [(user, pins[0])]) == 1


def test_bad_input_raises_before_any_write(store: Store) -> None:
    board = store.create("board", {})
    pin = store.create("pin", {})
    with pytest.raises(UnknownRelationError):
        store.link_many("nothing", [(board, pin)])
    with pytest.raises((IdError, WrongTypeError)):
        store.link_many(BHP, [(board, pin), (board, -5)])  # the second pair names no pin
    if store.config.ids == "pinterest":
        with pytest.raises(WrongTypeError):
            store.link_many(BHP, [(board, pin), (pin, board)])  # the second pair's types are wrong
    with pytest.raises(IdError):
        store.link_many(BHP, [(board, pin), (board,)])  # type: ignore[list-item]
    with pytest.raises(DataError, match="sequence"):
        store.link_many(BHP, [(board, pin)], sequence="1")  # type: ignore[arg-type]
    with pytest.raises(IdError):
        store.unlink_many(BHP, 5)  # type: ignore[arg-type]
    from dataclasses import replace

    with Store(replace(store.config, max_ids=2)) as small, pytest.raises(LimitError, match="max_ids"):
        small.link_many(BHP, [(board, pin)] * 3)
    assert store.count(BHP, board) == 0  # the first pair of each refused call was not written


def test_a_deleted_object_is_refused_and_the_rest_written(store: Store) -> None:
    board = store.create("board", {})
    pins = store.create_many("pin", [{"p": i} for i in range(4)])
    store.delete(pins[1], type_name="pin")
    with pytest.raises(NotFound, match="deleted") as err:
        store.link_many(BHP, [(board, p) for p in pins])
    assert str(pins[1]) in str(err.value)
    assert sorted(store.links(BHP, board)) == sorted([pins[0], pins[2], pins[3]])
    assert store.count(BHP, board) == 3
    assert store.links(POB, pins[1]) == []


@pytest.mark.mariadb
def test_link_many_takes_five_times_fewer_round_trips_than_links(mariadb_ready: object) -> None:
    from store import StoreConfig

    assert isinstance(mariadb_ready, StoreConfig)
    with Store(mariadb_ready) as store:
        boards = store.create_many("board", [{"b": 1}], shard=1) + store.create_many("board", [{}], shard=5)
        pins = store.create_many("pin", [{"p": i} for i in range(125)], shard=2)
        pins += store.create_many("pin", [{"p": i} for i in range(125)], shard=6)
        pairs = [(b, p) for b in boards for p in pins]  # 500 pairs, both hosts on both sides
        assert len(pairs) == 500
        store.link(BHP, boards[0], pins[0])  # warm both pools
        store.unlink(BHP, boards[0], pins[0])
        with counting_sends():
            reset_sends()
            assert store.link_many(BHP, pairs) == 500
            batched = sends()
            assert store.unlink_many(BHP, pairs) == 500
            unbatched_unlink = sends() - batched
            reset_sends()
            for b, p in pairs:
                store.link(BHP, b, p)
            single = sends()
        assert batched * 5 <= single, (batched, single)
        assert unbatched_unlink * 5 <= single
        assert store.count(BHP, boards[0]) == 250
        assert store.count(POB, pins[0]) == 2


def test_a_mixed_batch_over_both_hosts_keeps_both_sides_counts_and_cached_lists_exact(store: Store) -> None:
    """One batch of pairs there already, new pairs and a pair naming a deleted object, over both
    host names (each side written with a few multi-row statements on MariaDB): the new pairs are
    counted, the others not, the deleted object's pair refused; then moves and an unlink with
    pairs that are not there. Cached lists and counts (updated in place where the cache keeps
    versions) match the database read afresh."""
    from dataclasses import replace

    from store.config import CacheConfig

    boards = store.create_many("board", [{}], shard=1) + store.create_many("board", [{}], shard=5)
    pins = store.create_many("pin", [{"p": i} for i in range(4)], shard=2)
    pins += store.create_many("pin", [{"p": i} for i in range(4)], shard=6)
    assert store.link_many(BHP, [(b, p) for b in boards for p in pins[:3]]) == 6
    for b in boards:  # (cached now, where there is a cache: the batches below update them)
        assert store.count(BHP, b) == 3
        assert len(store.page(BHP, b).ids) == 3
    store.delete(pins[7], type_name="pin")
    batch = [(b, p) for b in boards for p in pins]
    with pytest.raises(NotFound, match=r"deleted.*\(8 new\)") as err:
        store.link_many(BHP, batch)
    assert str(pins[7]) in str(err.value)
    for b in boards:
        assert sorted(store.links(BHP, b)) == sorted(pins[:7])
        assert store.count(BHP, b) == 7
    for p in pins[:7]:
        assert sorted(store.links(POB, p)) == sorted(boards)
        assert store.count(POB, p) == 2
    assert store.links(POB, pins[7]) == []
    # A sequence moves the pairs there (in both sides) and places a new one; none is new but it.
    extra = store.create("pin", {"p": 8})
    assert (
        store.link_many(BHP, [(boards[0], pins[5]), (boards[0], pins[1]), (boards[0], extra)], sequence=7)
        == 1
    )
    assert store.page(BHP, boards[0]).ids[:3] == sorted([pins[1], pins[5], extra])
    assert store.count(BHP, boards[0]) == 8
    # Again at the same sequence: nothing new, nothing moved.
    assert store.link_many(BHP, [(boards[0], pins[5]), (boards[0], extra)], sequence=7) == 0
    # An unlink of pairs there and not there: how many were there.
    gone = [(boards[0], pins[0]), (boards[0], pins[7]), (boards[1], pins[2]), (boards[1], extra)]
    assert store.unlink_many(BHP, gone) == 2
    expected = {
        boards[0]: sorted([*pins[1:7], extra]),
        boards[1]: sorted([pins[0], pins[1], *pins[3:7]]),
    }
    with Store(replace(store.config, cache=CacheConfig())) as fresh:
        for b, ids in expected.items():
            for s in (store, fresh):
                assert sorted(s.links(BHP, b)) == ids
                assert s.count(BHP, b) == len(ids)
                assert s.page(BHP, b).ids == fresh.page(BHP, b).ids
        for p in [*pins, extra]:
            linked = sorted(b for b, ids in expected.items() if p in ids)
            for s in (store, fresh):
                assert sorted(s.links(POB, p)) == linked
                assert s.count(POB, p) == len(linked)


def test_a_group_on_one_host_writes_both_sides_in_one_request_then_commits(mariadb_ready: object) -> None:
    """Board and pins on one host: new pairs take two requests (both sides, then the COMMIT), as do
    their unlinks; a batch of pairs partly there takes more, and ends as exact."""
    from store import StoreConfig

    assert isinstance(mariadb_ready, StoreConfig)
    with Store(mariadb_ready) as store:
        board = store.create("board", {}, shard=1)
        pins = store.create_many("pin", [{"p": i} for i in range(30)], shard=2)
        store.link(BHP, board, pins[0])  # warm the pool
        store.unlink(BHP, board, pins[0])
        with counting_sends():
            reset_sends()
            assert store.link_many(BHP, [(board, p) for p in pins[:20]]) == 20
            assert sends() == 2
            reset_sends()
            assert store.unlink_many(BHP, [(board, p) for p in pins[:10]]) == 10
            assert sends() == 2
            reset_sends()
            assert store.link_many(BHP, [(board, p) for p in pins]) == 20  # 10 of 30 are there
            assert sends() > 2
        assert store.count(BHP, board) == 30
        assert all(store.count(POB, p) == 1 for p in pins)
        assert sorted(store.links(BHP, board, limit=100)) == sorted(pins)


def test_postgres_writes_a_side_of_new_pairs_in_one_request_and_repairs_a_torn_pair(
    postgres_ready: object,
) -> None:
    """PostgreSQL, board and pins on one host: each side's new pairs are one statement, and both
    go with the COMMIT behind gates (each statement fails the request unless it wrote every pair
    it was given), so new pairs take one request. Where some pairs are there already, or an
    inverse row is there without its primary row, a gate fails, and the sides go one at a time
    (the primary side, the inverse side, the COMMIT) after the failed request; both sides and
    counts exact. (Sending the inverse side with the primary side behind a savepoint, before
    the gates, saved the round trip and cost more than it saved: PostgreSQL's subtransaction
    made the call slower.)"""
    from store import StoreConfig

    assert isinstance(postgres_ready, StoreConfig)
    with Store(postgres_ready) as store:
        board = store.create("board", {}, shard=1)
        pins = store.create_many("pin", [{"p": i} for i in range(30)], shard=2)
        store.link(BHP, board, pins[0])  # warm the pool
        store.unlink(BHP, board, pins[0])
        with counting_sends():
            reset_sends()
            assert store.link_many(BHP, [(board, p) for p in pins[:20]]) == 20
            assert sends() == 1
            reset_sends()
            assert store.link_many(BHP, [(board, p) for p in pins]) == 10  # 20 of 30 are there
            assert sends() > 3
        assert store.count(BHP, board) == 30
        assert all(store.count(POB, p) == 1 for p in pins)
        assert sorted(store.links(BHP, board, limit=100)) == sorted(pins)
        # An inverse row without its primary row (as a writer killed between the two would leave
        # it): the new primary row is written, the inverse row stays one, its count one.
        other = store.create("board", {}, shard=1)
        store.link(BHP, other, pins[0])
        where = store.locate(other, type_name="board")
        h = store.admin_context().engines.shard(where.shard, where.host)
        h.transaction(
            lambda cur: cur.execute(
                f"DELETE FROM {h.table(BHP)} WHERE from_id = %s AND to_id = %s", (other, pins[0])
            )
        )
        assert store.links(POB, pins[0], limit=10).count(other) == 1
        assert store.link_many(BHP, [(other, p) for p in pins[:5]]) == 5
        assert sorted(store.links(BHP, other)) == sorted(pins[:5])
        for p in pins[:5]:
            assert sorted(store.links(POB, p)) == sorted([board, other])
        assert store.count(POB, pins[0]) == 2


def test_sides_made_fast_are_the_sides_the_dataclass_makes() -> None:
    """`make_side` and `make_guard` (the old names of the constructors) give equal, equal-hashing,
    frozen values."""
    from store.pairs import Guard, Side, make_guard, make_side

    guard = make_guard("pin 7", "pins", "local_id", 7)
    assert guard == Guard("pin 7", "pins", "local_id", 7)
    assert hash(guard) == hash(Guard("pin 7", "pins", "local_id", 7))
    side = make_side(None, BHP, 1, 2, guard)  # type: ignore[arg-type]
    assert side == Side(None, BHP, 1, 2, guard)  # type: ignore[arg-type]
    assert hash(side) == hash(Side(None, BHP, 1, 2, guard))  # type: ignore[arg-type]
    with pytest.raises(AttributeError):
        side.from_id = 3  # type: ignore[misc]
