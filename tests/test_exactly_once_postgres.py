"""Every write applied exactly once across a PostgreSQL schema move (``ids: instagram``).

The PostgreSQL side of `tests.test_exactly_once`: two clusters the test
starts, shards 8-15 moved from A to B by logical replication, the source
left as tombstones (views whose every read and write raises). The object
stays and its unique key's row moves, or the other way round; a process
that still holds the map from before the move (it polls never: only a
refusal makes it reload) applies the user's function once, counts each
write once in the version, says a delete of a live object found it live,
and leaves no name held and no second object. Instagram IDs carry no type:
every call by ID names it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from store import Store, StoreConfig, decode_instagram
from store.admin import check_store, init_shards
from tests.conftest import base_config
from tests.servers import free_port
from tests.test_exactly_once import (
    BHP,
    MOVING,
    SHARDS,
    STAYING,
    UNIQUE,
    batches_during_moves,
    check,
    move,
    name_on,
)
from tests.test_move_postgres import clusters, sql, url

pytestmark = pytest.mark.moves


@pytest.fixture
def ports() -> Iterator[tuple[int, int]]:
    """The ports of two PostgreSQL clusters (A, the source, and B), removed afterwards."""
    with clusters(ports=(free_port(), free_port())) as found:
        yield found


def raw_config(ports: tuple[int, int], tmp_path: Path, poll_s: float) -> dict[str, Any]:
    return base_config(
        ids="instagram",
        shards=SHARDS,
        hosts={"A": url(ports[0]), "B": url(ports[1])},
        map=[{"range": [0, SHARDS - 1], "master": "A"}],
        map_source={"file": str(tmp_path / "map.yaml"), "poll_s": poll_s},
        unique=UNIQUE,
    )


def users_named(port: int, shard: int, name: str) -> list[tuple[int, int]]:
    """(active, version) of every row of shard ``shard`` on ``port`` with username ``name``, live or not."""
    query = f"SELECT active, version FROM shard{shard:04d}.users WHERE data::jsonb->>'username' = %s"
    return [(int(active), int(version)) for active, version in sql(port, query, (name,))]


def test_a_process_with_the_old_map_applies_each_write_once(ports: tuple[int, int], tmp_path: Path) -> None:
    a_port, b_port = ports
    config = StoreConfig.from_dict(raw_config(ports, tmp_path, 0.2))
    old_map = StoreConfig.from_dict(raw_config(ports, tmp_path, 3600))
    init_shards(config)
    taken: set[str] = set()
    with Store(config) as fresh:
        # The object stays, the key of its old name moves (its release is the refused step).
        renamed_old = name_on(MOVING, "ren", taken)
        renamed = fresh.create("user", {"username": renamed_old, "n": 0}, shard=2)
        versioned_old = name_on(MOVING, "ver", taken)
        versioned = fresh.create("user", {"username": versioned_old}, shard=3)
        deleted_name = name_on(MOVING, "del", taken)
        deleted = fresh.create("user", {"username": deleted_name}, shard=4)
        # A pin that stays on a board that moves: the delete's sweep is the refused step.
        board = fresh.create("board", {}, shard=12)
        pin = fresh.create("pin", {}, shard=5)
        fresh.link(BHP, board, pin)
        # The object moves, its keys stay: its own first step is refused.
        mover_old = name_on(STAYING, "mov", taken)
        moving = fresh.create("user", {"username": mover_old, "n": 0}, shard=13)
        stale = [Store(old_map) for _ in range(7)]
        try:
            for s in stale:  # each one routes by map version 1 from now on
                assert s.get(renamed, type_name="user") is not None
                assert s.shard_map.version == 1
            move(fresh, tmp_path, MOVING.start, MOVING.stop - 1, "B", "out")
            assert fresh.refresh_map(force=True) or fresh.shard_map.version == 2
            assert [(r.start, r.end, r.master) for r in fresh.shard_map] == [(0, 7, "A"), (8, 15, "B")]

            calls: list[int] = []

            def bump(new_name: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
                def fn(old: dict[str, Any]) -> dict[str, Any]:
                    calls.append(1)
                    return {**old, "username": new_name, "n": old["n"] + 1}

                return fn

            # A one-step function update that renames: applied once, one version more.
            renamed_new = name_on(STAYING, "ren2", taken)
            got = stale[0].update(renamed, bump(renamed_new), type_name="user")
            assert got["n"] == 1
            assert len(calls) == 1
            assert fresh.get_with_version(renamed, type_name="user") == ({"username": renamed_new, "n": 1}, 2)
            assert fresh.lookup("user_by_username", renamed_old) is None
            assert fresh.lookup("user_by_username", renamed_new) == renamed
            # Compare-and-set that renames: it lands, and raises no conflict over its own write.
            versioned_new = name_on(STAYING, "ver2", taken)
            _data, version = stale[1].get_with_version(versioned, type_name="user") or ({}, 0)
            assert stale[1].update(
                versioned, {"username": versioned_new}, if_version=version, type_name="user"
            ) == {"username": versioned_new}
            assert fresh.get_with_version(versioned, type_name="user") == (
                {"username": versioned_new},
                version + 1,
            )
            assert fresh.lookup("user_by_username", versioned_old) is None
            # A delete of a live user is a delete of a live user, and frees its name.
            assert stale[2].delete(deleted, type_name="user") is True
            assert fresh.lookup("user_by_username", deleted_name) is None
            assert fresh.create("user", {"username": deleted_name}) != deleted
            # A delete of a pin whose board moved.
            assert stale[3].delete(pin, type_name="pin") is True
            assert fresh.links(BHP, board) == []
            assert fresh.count(BHP, board) == 0
            # The object on the moved shard, its keys where they were.
            mover_new = name_on(STAYING, "mov2", taken)
            calls.clear()
            assert stale[4].update(moving, bump(mover_new), type_name="user")["n"] == 1
            assert len(calls) == 1
            assert fresh.get_with_version(moving, type_name="user") == ({"username": mover_new, "n": 1}, 2)
            assert fresh.lookup("user_by_username", mover_old) is None
            # Creates: one object each, live, holding its name. The object stays and its key moved
            # (the claim, after the pending insert, is the refused step), then the object's shard
            # moved and its key stayed. (Creates that claimed before inserting passed these too.)
            for s, shard, keys, port in ((stale[5], 6, MOVING, a_port), (stale[6], 14, STAYING, b_port)):
                name = name_on(keys, f"new{shard}", taken)
                made = s.create("user", {"username": name}, shard=shard)
                assert decode_instagram(made).shard_id == shard
                assert fresh.lookup("user_by_username", name) == made
                assert fresh.get_with_version(made, type_name="user") == ({"username": name}, 1)
                assert users_named(port, shard, name) == [(1, 1)], "a create made more than one row"
            assert all(s.shard_map.version == 2 for s in stale), "a step never met the moved shard"
            report = check_store(fresh)  # no unique-key row of a dead holder, no value held with no row
            assert report.ok, [f.line() for f in report.problems]
        finally:
            for s in stale:
                s.close()


def test_counters_during_moves_count_each_acknowledged_call_once(
    ports: tuple[int, int], tmp_path: Path
) -> None:
    """4 threads increment counters (renaming each time) while shards move back and forth."""
    config = StoreConfig.from_dict(raw_config(ports, tmp_path, 0.2))
    init_shards(config)
    taken: set[str] = set()
    runs = int(os.environ.get("STORE_TEST_MOVE_RUNS", "4"))
    with Store(config) as store:
        # Each user renames between a name whose key moves and one whose key stays; half the
        # users move themselves.
        users: list[tuple[int, tuple[str, str]]] = []
        for k in range(8):
            names = (name_on(MOVING, f"c{k}a", taken), name_on(STAYING, f"c{k}b", taken))
            shard = 12 if k % 2 else 3
            users.append((store.create("user", {"username": names[0], "n": 0}, shard=shard), names))
        acked = {u: 0 for u, _n in users}
        for run in range(runs):  # each run: writers going, one move, writers stopped, every count checked
            errors: list[BaseException] = []
            done = threading.Event()

            def writer(
                mine: list[tuple[int, tuple[str, str]]],
                done: threading.Event = done,
                errors: list[BaseException] = errors,
            ) -> None:
                try:
                    while not done.is_set():
                        for u, (a, b) in mine:
                            store.update(
                                u,
                                lambda o, a=a, b=b: {
                                    **o,
                                    "username": b if o["username"] == a else a,
                                    "n": o["n"] + 1,
                                },
                                type_name="user",
                            )
                            acked[u] += 1
                except BaseException as exc:  # surfaced below
                    errors.append(exc)

            threads = [threading.Thread(target=writer, args=(users[2 * w : 2 * w + 2],)) for w in range(4)]
            for t in threads:
                t.start()
            try:
                move(store, tmp_path, MOVING.start, MOVING.stop - 1, "B" if run % 2 == 0 else "A", str(run))
            finally:
                done.set()
                for t in threads:
                    t.join()
            assert errors == [], errors
            check(store, users, acked, run)
        assert store.admin_context().live.reroutes > 0, "no step met a moved shard: the test proved nothing"
        report = check_store(store)
        assert report.ok, [f.line() for f in report.problems]


def test_batches_during_a_move_leave_exactly_what_was_acknowledged(
    ports: tuple[int, int], tmp_path: Path
) -> None:
    """`tests.test_exactly_once`'s batches during moves out and back, on PostgreSQL schemas: a
    batch's new pairs are one statement a side there (`Backend.counted_link_rows`), refused by
    the tombstone's views as a whole."""
    config = StoreConfig.from_dict(raw_config(ports, tmp_path, 0.2))
    init_shards(config)
    batches_during_moves(config, tmp_path)
