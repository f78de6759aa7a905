"""The Store facade on each backend (SQLite files and the real MariaDB)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from store import (
    DataError,
    IdError,
    NotFound,
    NotSerializableError,
    ObjectTooLargeError,
    RoutingError,
    Store,
    StoreConfig,
    UnknownTypeError,
    WrongTypeError,
    decode_pinterest,
    encode_pinterest,
)
from store.objects import ObjectRepository
from tests.conftest import TEST_SHARDS, row_count

#: The ``store`` fixture's tests run on the sync and the async face (`tests.asyncface`).
BOTH_FACES = True


def test_create_then_get_by_id_alone(store: Store) -> None:
    board = store.create("board", {"name": "kitchen"})
    pin = store.create("pin", {"title": "granite"}, near=board)
    assert store.get(board) == {"name": "kitchen"}
    assert store.get(pin) == {"title": "granite"}
    shard, type_id, local_id = decode_pinterest(pin)
    assert shard == decode_pinterest(board).shard_id  # a pin lives on its board's shard
    assert type_id == store.config.types["pin"].id
    assert local_id >= 1
    loc = store.locate(pin)
    assert (loc.shard, loc.type.name, loc.local_id) == (shard, "pin", local_id)
    assert loc.host == store.shard_map.master(shard)


def test_create_on_a_named_shard_and_random_open_shards(store: Store) -> None:
    pin = store.create("pin", {"n": 1}, shard=TEST_SHARDS - 1)
    assert decode_pinterest(pin).shard_id == TEST_SHARDS - 1
    shards = {decode_pinterest(store.create("user", {"i": i})).shard_id for i in range(40)}
    assert len(shards) > 1
    assert all(0 <= s < TEST_SHARDS for s in shards)


def test_open_shards_limit_where_new_objects_go(config: StoreConfig) -> None:
    from dataclasses import replace

    with Store(replace(config, open_shards=((2, 3),))) as s:
        shards = {decode_pinterest(s.create("user", {"i": i})).shard_id for i in range(30)}
    assert shards <= {2, 3}


def test_get_many_batches_per_host_and_leaves_out_missing(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = [store.create("pin", {"i": i}) for i in range(30)]
    users = [store.create("user", {"u": i}) for i in range(5)]
    store.delete(ids[0])
    missing = encode_pinterest(decode_pinterest(ids[1]).shard_id, 1, 999_999)
    calls: list[int] = []
    real = ObjectRepository.get_many

    def spy(self: ObjectRepository, h: Any, parts: Any) -> Any:
        calls.append(len(parts))
        return real(self, h, parts)

    monkeypatch.setattr(ObjectRepository, "get_many", spy)
    got = store.get_many([*ids, *users, missing])
    assert got == {i: {"i": n} for n, i in enumerate(ids) if n > 0} | {
        u: {"u": n} for n, u in enumerate(users)
    }
    hosts = {store.locate(i).host for i in [*ids, *users]}
    shards = {store.locate(i).shard for i in [*ids, *users]}
    if store.admin_context().engines.backend(next(iter(hosts))).pool_per_shard:
        assert len(calls) == len(shards)  # one query per shard file
    else:
        assert len(calls) == len(hosts)  # one UNION ALL query per host
    assert store.get_many([]) == {}


def test_update_merges_or_applies_a_function(store: Store) -> None:
    pin = store.create("pin", {"title": "a", "likes": 0})
    assert store.update(pin, {"title": "b"}) == {"title": "b", "likes": 0}
    assert store.update(pin, lambda o: {**o, "likes": o["likes"] + 1}) == {"title": "b", "likes": 1}
    assert store.get(pin) == {"title": "b", "likes": 1}


def test_delete_is_soft(store: Store) -> None:
    pin = store.create("pin", {"title": "gone"})
    before = row_count(store, "pins")
    assert store.delete(pin) is True
    assert store.delete(pin) is False
    assert store.get(pin) is None
    assert store.get_many([pin]) == {}
    assert row_count(store, "pins") == before  # the row is kept
    with pytest.raises(NotFound, match=str(pin)):
        store.update(pin, {"title": "back"})
    with pytest.raises(NotFound):
        store.require(pin)


def test_update_of_a_missing_object_is_not_found(store: Store) -> None:
    with pytest.raises(NotFound):
        store.update(encode_pinterest(0, 1, 987_654), {"x": 1})


def test_concurrent_updates_lose_nothing(store: Store) -> None:
    counter = store.create("board", {"n": 0})
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(200):
                store.update(counter, lambda o: {**o, "n": o["n"] + 1})
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert store.get(counter) == {"n": 1600}


# -- bad input: a specific error, and nothing written -----------------------


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ({"x": {1, 2}}, NotSerializableError),
        ({"x": float("nan")}, NotSerializableError),
        (["not", "a", "dict"], NotSerializableError),
        ({"blob": "x" * 300}, ObjectTooLargeError),
    ],
)
def test_bad_data_writes_nothing(config: StoreConfig, data: Any, error: type[Exception]) -> None:
    from dataclasses import replace

    with Store(replace(config, max_object_bytes=256)) as store:
        pin = store.create("pin", {"ok": True})
        before = row_count(store, "pins")
        with pytest.raises(error):
            store.create("pin", data)
        with pytest.raises(error):
            store.update(pin, data if isinstance(data, dict) else lambda _o: data)
        assert row_count(store, "pins") == before
        assert store.get(pin) == {"ok": True}


def test_update_function_must_return_a_dict(store: Store) -> None:
    pin = store.create("pin", {"a": 1})
    with pytest.raises(DataError, match="must return the whole new object"):
        store.update(pin, lambda _o: None)  # type: ignore[arg-type,return-value]
    with pytest.raises(DataError, match="changes must be a dict or a function"):
        store.update(pin, 5)  # type: ignore[arg-type]
    assert store.get(pin) == {"a": 1}


def test_unknown_type_name(store: Store) -> None:
    with pytest.raises(UnknownTypeError, match="unknown type 'photo'; the config defines: pin, board, user"):
        store.create("photo", {})


def test_id_with_an_unknown_type_id(store: Store) -> None:
    with pytest.raises(UnknownTypeError, match="type id 7"):
        store.get(encode_pinterest(0, 7, 1))


def test_id_of_the_wrong_type(store: Store) -> None:
    board = store.create("board", {})
    with pytest.raises(WrongTypeError, match="is a board, not a pin"):
        store.get(board, type_name="pin")
    with pytest.raises(WrongTypeError):
        store.update(board, {"x": 1}, type_name="pin")
    assert store.get(board, type_name="board") == {}


def test_id_whose_shard_is_not_mapped(store: Store) -> None:
    unmapped = encode_pinterest(3429, 1, 7075733)  # the article's pin: shard 3429 of 4096
    before = row_count(store, "pins")
    with pytest.raises(RoutingError, match="shard 3429 is not in the shard map"):
        store.get(unmapped)
    with pytest.raises(RoutingError):
        store.create("pin", {"a": 1}, near=unmapped)
    with pytest.raises(RoutingError):
        store.get_many([unmapped])
    assert row_count(store, "pins") == before


@pytest.mark.parametrize("bad", [-1, 1 << 63, "12", None, (1 << 62) + 1])
def test_malformed_ids(store: Store, bad: Any) -> None:
    with pytest.raises(IdError):
        store.get(bad)


def test_local_id_zero_is_not_an_object(store: Store) -> None:
    with pytest.raises(IdError, match="local id 0"):
        store.get(encode_pinterest(0, 1, 0))


def test_bad_placement_arguments(store: Store) -> None:
    with pytest.raises(IdError, match=r"shard must be an int in 0\.\.7"):
        store.create("pin", {}, shard=8)
    with pytest.raises(IdError, match="not both"):
        store.create("pin", {}, shard=1, near=encode_pinterest(1, 1, 1))
