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
