"""`Store.create_many`: one multi-row INSERT per shard, IDs in input order, unique keys all or none.

On SQLite and MariaDB (each with and without caches) and PostgreSQL with
Instagram IDs (the ``backend`` fixture, with "postgres" added here).
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from dataclasses import replace

import pytest

from store import DataError, DuplicateKeyError, IdError, LimitError, Store, StoreConfig, UnknownTypeError
from store.admin import init_shards
from store.specs import UniqueSpec

UNIQUE = {"user_by_username": UniqueSpec("user_by_username", "user", "username")}


@pytest.fixture(params=["sqlite", "sqlite-memory", "mariadb", "mariadb-cached", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    """SQLite and MariaDB, without and with caches, and PostgreSQL with Instagram IDs."""
    return str(request.param)


@pytest.fixture
def ustore(config: StoreConfig, backend: str) -> Iterator[Store]:
    """The ``store`` fixture's backends, with a unique key on users' usernames."""
    keyed = replace(config, unique=UNIQUE)
    if not backend.startswith("sqlite"):
        init_shards(keyed)  # adds the unique_keys table (idempotent)
    with Store(keyed) as s:
        yield s


def _name(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex[:10]}"


def test_ids_come_back_in_input_order_one_insert_per_shard(store: Store) -> None:
    board = store.create("board", {"name": "b"})
    statements: list[tuple[int, int]] = []
    bulk = store._bulk_creates  # (counts the INSERTs)
    bulk.on_insert = lambda shard, n: statements.append((shard, n))
    same = [{"n": i, "tag": "same"} for i in range(3)]  # alike rows still get distinct IDs
    pins = store.create_many("pin", [{"n": i} for i in range(20)] + same, near=board)
    here = store.locate(board, type_name="board").shard
    assert statements == [(here, 23)]
    assert len(set(pins)) == 23
    assert [store.get(p, type_name="pin") for p in pins] == [{"n": i} for i in range(20)] + same
    assert all(store.locate(p, type_name="pin").shard == here for p in pins)
    statements.clear()
    spread = store.create_many("pin", [{"k": i} for i in range(40)])
    assert store.get_many(spread, type_name="pin") == {p: {"k": i} for i, p in enumerate(spread)}
    shards = {store.locate(p, type_name="pin").shard for p in spread}
    assert len(statements) == len(shards) > 1  # spread as create spreads, one INSERT per shard
    on = store.create_many("board", [{"x": 1}, {"x": 2}], shard=3)
    assert [store.locate(b, type_name="board").shard for b in on] == [3, 3]
    assert store.create_many("pin", []) == []


def test_bad_input_names_the_item_and_writes_nothing(store: Store) -> None:
    before = store.create_many("pin", [{"n": 0}], shard=2)
    for items, error, text in [
        ([{"n": 1}, "x"], DataError, r"items\[1\]"),
        ([{"n": 1}, {"bad": {1, 2}}], DataError, r"items\[1\]"),
        ({"n": 1}, DataError, "list of dicts"),
    ]:
        with pytest.raises(error, match=text):
            store.create_many("pin", items, shard=2)  # type: ignore[arg-type]
    with pytest.raises(UnknownTypeError):
        store.create_many("nothing", [{}])
    with pytest.raises(IdError, match="not both"):
        store.create_many("pin", [{}], near=before[0], shard=2)
    with pytest.raises(IdError, match="shard must be"):
        store.create_many("pin", [{}], shard=10**6)
    small = replace(store.config, max_ids=3)
    with Store(small) as s, pytest.raises(LimitError, match="max_ids"):
        s.create_many("pin", [{}] * 4, shard=2)
    # nothing was written: the next ID on the shard follows the one made before
    after = store.create_many("pin", [{"n": 9}], shard=2)
    if store.config.ids == "pinterest":
        assert after[0] == before[0] + 1


def test_unique_keys_are_claimed_for_all_items_or_none(ustore: Store) -> None:
    taken = _name("ada")
    ada = ustore.create("user", {"username": taken})
    free = [_name("u") for _i in range(4)]
    with pytest.raises(DuplicateKeyError) as err:
        ustore.create_many("user", [{"username": free[0]}, {"username": free[1]}, {"username": taken}])
    assert (err.value.index, err.value.key, err.value.value, err.value.owner) == (
        2,
        "user_by_username",
        taken,
        ada,
    )
    assert "items[2]" in str(err.value)
    # The claims of items 0 and 1 were given back: a create of those values goes through.
    assert ustore.lookup("user_by_username", free[0]) is None
    # A duplicate within the batch is refused before any I/O, naming the later item.
    with pytest.raises(DuplicateKeyError, match=r"items\[2\].*items\[0\]") as err:
        ustore.create_many("user", [{"username": free[2]}, {"n": 1}, {"username": free[2]}])
    assert err.value.index == 2
    made = ustore.create_many("user", [{"username": v} for v in free] + [{"n": 1}])
    assert [ustore.lookup("user_by_username", v) for v in free] == made[:4]
    assert [ustore.get(i, type_name="user") for i in made] == [{"username": v} for v in free] + [{"n": 1}]
    with pytest.raises(DuplicateKeyError):
        ustore.create("user", {"username": free[3]})


def test_keys_by_lastrowid_step_as_the_session_says_and_by_returning_elsewhere(
    mariadb_ready: StoreConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On MariaDB (``innodb_autoinc_lock_mode`` 1) the INSERT returns no rows: the keys are its
    ``lastrowid`` and the next ones by the session's ``auto_increment_increment``, asked once per
    connection. A session stepping by 3 gets keys 3 apart, each naming its own item; where the step
    is not known (None) the same batch reads its keys back with RETURNING."""
    with Store(mariadb_ready) as store:
        h = store.admin_context().engines.shard(4, store.shard_map.master(4))
        with h.connect() as conn:  # the pool's one connection: the next checkout gets it again
            cur = conn.cursor()
            cur.execute("SET SESSION auto_increment_increment = 3")
            cur.close()
        items = [{"n": i} for i in range(12)]
        ids = store.create_many("pin", items, shard=4)
        keys = [store.locate(i, type_name="pin").local_id for i in ids]
        assert [b - a for a, b in itertools.pairwise(keys)] == [3] * 11
        assert [store.get(i, type_name="pin") for i in ids] == items
        asked: list[int] = []
        bulk = store._bulk_creates

        def unknown(_h: object, _conn: object, _cur: object) -> None:
            asked.append(1)
            return None

        monkeypatch.setattr(bulk, "_id_step", unknown)
        again = store.create_many("pin", items, shard=4)
        assert asked == [1]
        assert [store.get(i, type_name="pin") for i in again] == items
        assert not set(again) & set(ids)
