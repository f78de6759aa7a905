"""Compare-and-set: every object carries a version; ``update(..., if_version=)`` refuses a changed one.

On every backend of the ``store`` fixture (SQLite, MariaDB, each with and
without caches) and on PostgreSQL with Instagram IDs; the version column is
added by ``store init`` to tables made before versions, on MariaDB and on
SQLite's first use.
"""

from __future__ import annotations

import random
import sqlite3
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from store import CacheConfig, ConflictError, DataError, NotFound, Store, StoreConfig, Versioned
from store.admin import init_shards
from tests.conftest import db, sqlite_config

#: The ``store`` fixture's tests run on the sync and the async face (`tests.asyncface`).
BOTH_FACES = True


def test_a_new_object_is_at_version_one_and_each_update_adds_one(store: Store) -> None:
    pin = store.create("pin", {"n": 0})
    assert store.get_with_version(pin) == Versioned({"n": 0}, 1)
    data, version = store.get_with_version(pin) or ({}, 0)  # unpacks as a pair
    assert (data, version) == ({"n": 0}, 1)
    for i in range(1, 6):
        store.update(pin, {"n": i})
        assert store.get_with_version(pin) == Versioned({"n": i}, i + 1)


def test_if_version_writes_only_the_version_it_names(store: Store) -> None:
    pin = store.create("pin", {"title": "a"})
    got = store.get_with_version(pin)
    assert got is not None
    assert store.update(pin, {"title": "b"}, if_version=got.version) == {"title": "b"}
    assert store.get_with_version(pin) == Versioned({"title": "b"}, got.version + 1)
    # The old version is refused, and nothing is written.
    with pytest.raises(ConflictError) as err:
        store.update(pin, {"title": "c"}, if_version=got.version)
    assert (err.value.expected, err.value.actual) == (got.version, got.version + 1)
    assert "get_with_version" in str(err.value)
    assert store.get(pin) == {"title": "b"}
    assert store.get_with_version(pin) == Versioned({"title": "b"}, got.version + 1)


def test_a_change_and_its_undo_still_count_as_changes(store: Store) -> None:
    """A to B and back to A: the data is as it was, the version is not (no ABA)."""
    pin = store.create("pin", {"x": 1})
    seen = store.get_with_version(pin)
    assert seen is not None
    store.update(pin, {"x": 2})
    store.update(pin, {"x": 1})
    assert store.get(pin) == seen.data
    with pytest.raises(ConflictError):
        store.update(pin, {"x": 3}, if_version=seen.version)
    assert store.get(pin) == {"x": 1}


def test_versions_of_gone_objects_and_bad_versions(store: Store) -> None:
    pin = store.create("pin", {"x": 1})
    for bad in (0, -1, "1", 1.0, True):
        with pytest.raises(DataError, match="if_version"):
            store.update(pin, {"x": 9}, if_version=bad)  # type: ignore[arg-type]
    assert store.get_with_version(pin) == Versioned({"x": 1}, 1)
    store.delete(pin)
    assert store.get_with_version(pin) is None
    with pytest.raises(NotFound):
        store.update(pin, {"x": 2}, if_version=1)


def test_update_without_if_version_still_merges_under_the_lock(store: Store) -> None:
    """The read-modify-write update is not weakened: concurrent increments all land."""
    pin = store.create("pin", {"n": 0})

    def bump() -> None:
        for _ in range(25):
            store.update(pin, lambda old: {"n": old["n"] + 1})

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.get_with_version(pin) == Versioned({"n": 100}, 101)


def test_racing_compare_and_set_writers_lose_no_update(store: Store) -> None:
    """Eight threads read-version-then-write; every success is one increment, every version used once."""
    pin = store.create("pin", {"n": 0, "by": []})
    wins: list[tuple[int, int]] = []
    conflicts = [0]
    bad: list[int] = []
    lock = threading.Lock()

    def writer(me: int) -> None:
        rng = random.Random(me)
        done = 0
        while done < 10:
            seen = store.get_with_version(pin)
            assert seen is not None
            try:
                store.update(pin, {"n": seen.data["n"] + 1}, if_version=seen.version)
            except ConflictError as exc:
                newer = exc.actual > seen.version
                with lock:
                    if not newer:
                        bad.append(exc.actual)
                    conflicts[0] += 1
                if rng.random() < 0.5:
                    threading.Event().wait(0.001)
                continue
            with lock:
                wins.append((me, seen.version))
            done += 1

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    final = store.get_with_version(pin)
    assert final is not None
    assert final.data["n"] == len(wins) == 80
    assert final.version == 81
    assert bad == [], "a conflict named a version no newer than the one read"
    # Each version was written from exactly once: no two writers won on one read.
    assert sorted(v for _me, v in wins) == list(range(1, 81))


@pytest.mark.parametrize("cached", [False, True], ids=["uncached", "memory-cache"])
def test_instagram_ids_on_postgresql_carry_versions(postgres_ready: StoreConfig, cached: bool) -> None:
    config = replace(postgres_ready, cache=CacheConfig(memory=True)) if cached else postgres_ready
    with Store(config) as store:
        user = store.create("user", {"name": "ada"})
        assert store.get_with_version(user, type_name="user") == Versioned({"name": "ada"}, 1)
        store.update(user, {"name": "ada l."}, type_name="user", if_version=1)
        with pytest.raises(ConflictError):
            store.update(user, {"name": "x"}, type_name="user", if_version=1)
        assert store.get_with_version(user, type_name="user") == Versioned({"name": "ada l."}, 2)


def test_init_adds_the_version_column_to_older_tables_once(mariadb_ready: StoreConfig) -> None:
    import pymysql

    shard1 = db(1)
    with Store(mariadb_ready) as store:
        pin = store.create("pin", {"old": True}, shard=1)
    conn = pymysql.connect(host="127.0.0.1", port=3306, user="root", autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(f"ALTER TABLE {shard1}.pins DROP COLUMN version")
            report = init_shards(mariadb_ready, shards=[1])
            assert report.tables_created == 0
            cur.execute(
                f"SELECT COUNT(*) FROM information_schema.columns WHERE table_schema = '{shard1}' "
                "AND table_name = 'pins' AND column_name = 'version'"
            )
            assert cur.fetchone()[0] == 1
    finally:
        conn.close()
    with Store(mariadb_ready) as store:
        assert store.get_with_version(pin) == Versioned({"old": True}, 1)
        store.update(pin, {"old": False}, if_version=1)
        assert store.get_with_version(pin) == Versioned({"old": False}, 2)
    # A second run finds every column: no DDL at all.
    assert init_shards(mariadb_ready, shards=[1]).tables_created == 0


def test_sqlite_files_from_before_versions_get_the_column_on_first_use(tmp_path: Path) -> None:
    config = StoreConfig.from_dict(sqlite_config(tmp_path))
    with Store(config) as store:
        pin = store.create("pin", {"old": True}, shard=0)
    # Take the column away, as a file made by an earlier version would be.
    path = tmp_path / "a" / "db00000.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("ALTER TABLE pins DROP COLUMN version")
        assert "version" not in [r[1] for r in db.execute("PRAGMA table_info(pins)")]
    with Store(config) as store:
        assert store.get_with_version(pin) == Versioned({"old": True}, 1)
        store.update(pin, {"old": False}, if_version=1)
        assert store.get_with_version(pin) == Versioned({"old": False}, 2)
    with Store(config) as store:  # and again: nothing to add
        assert store.get(pin) == {"old": False}
