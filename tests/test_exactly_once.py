"""Every write applied exactly once when its steps span shards and one of them meets a move.

A write whose later step (a unique key's release, a delete's list sweep)
runs on a shard that moved is refused there by the tombstone; only that
step runs again on the new host. The tests put the object on a shard that
stays and the key (or the other end of a pair) on one that moves, or the
other way round, and use a process that still holds the map from before the
move (it polls never: only a refusal makes it reload): the user's function
is applied once, versions count each write once, deletes report the object
as live and leave no name held.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from store import Store, StoreConfig
from store.admin import init_shards
from store.admin.move import Mover
from store.unique import key_shard
from tests.conftest import base_config
from tests.servers import MariaDBServer, binlog_pair, free_port

SHARDS = 16
MOVING = range(8, 16)
STAYING = range(0, 8)
BHP = "board_has_pins"
UNIQUE = {"user_by_username": {"type": "user", "field": "username"}}

pytestmark = pytest.mark.moves


@pytest.fixture
def pair() -> Iterator[tuple[MariaDBServer, MariaDBServer]]:
    with binlog_pair(free_port(), free_port()) as servers:
        yield servers


def raw_config(source: MariaDBServer, target: MariaDBServer, tmp_path: Path, poll_s: float) -> dict[str, Any]:
    return base_config(
        shards=SHARDS,
        hosts={"A": source.url, "B": target.url},
        map=[{"range": [0, SHARDS - 1], "master": "A"}],
        map_source={"file": str(tmp_path / "map.yaml"), "poll_s": poll_s},
        unique=UNIQUE,
    )


def name_on(shards: range, tag: str, taken: set[str]) -> str:
    """A username whose unique-key row lives on one of ``shards``."""
    for i in range(10_000):
        name = f"{tag}-{i}"
        if name not in taken and key_shard("user_by_username", name.encode(), SHARDS) in shards:
            taken.add(name)
            return name
    raise AssertionError("no name hashes there")


def move(store: Store, tmp_path: Path, low: int, high: int, to: str, tag: str) -> None:
    mover = Mover(store, tmp_path / f"move-{tag}.json", say=lambda _m: None)
    journal = mover.start(mover.plan(low, high, to))
    assert journal.phase == "done"
    mover.cleanup()


def test_a_process_with_the_old_map_applies_each_write_once(
    pair: tuple[MariaDBServer, MariaDBServer], tmp_path: Path
) -> None:
    source, target = pair
    config = StoreConfig.from_dict(raw_config(source, target, tmp_path, 0.2))
    old_map = StoreConfig.from_dict(raw_config(source, target, tmp_path, 3600))
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
        stale = [Store(old_map) for _ in range(5)]
        try:
            for s in stale:  # each one routes by map version 1 from now on
                assert s.get(renamed) is not None
                assert s.shard_map.version == 1
            move(fresh, tmp_path, MOVING.start, MOVING.stop - 1, "B", "out")
            assert fresh.refresh_map(force=True) or fresh.shard_map.version == 2

            calls: list[int] = []

            def bump(new_name: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
                def fn(old: dict[str, Any]) -> dict[str, Any]:
                    calls.append(1)
                    return {**old, "username": new_name, "n": old["n"] + 1}

                return fn

            # A one-step function update that renames: applied once, one version more.
            renamed_new = name_on(STAYING, "ren2", taken)
            got = stale[0].update(renamed, bump(renamed_new))
            assert got["n"] == 1
            assert len(calls) == 1
            assert fresh.get_with_version(renamed) == ({"username": renamed_new, "n": 1}, 2)
            assert fresh.lookup("user_by_username", renamed_old) is None
            assert fresh.lookup("user_by_username", renamed_new) == renamed
            # Compare-and-set that renames: it lands, and raises no conflict over its own write.
            versioned_new = name_on(STAYING, "ver2", taken)
            _data, version = stale[1].get_with_version(versioned) or ({}, 0)
            assert stale[1].update(versioned, {"username": versioned_new}, if_version=version) == {
                "username": versioned_new
            }
            assert fresh.get_with_version(versioned) == ({"username": versioned_new}, version + 1)
            assert fresh.lookup("user_by_username", versioned_old) is None
            # A delete of a live user is a delete of a live user, and frees its name.
            assert stale[2].delete(deleted) is True
            assert fresh.lookup("user_by_username", deleted_name) is None
            assert fresh.create("user", {"username": deleted_name}) != deleted
            # A delete of a pin whose board moved.
            assert stale[3].delete(pin) is True
            assert fresh.links(BHP, board) == []
            assert fresh.count(BHP, board) == 0
            # The object on the moved shard, its keys where they were.
            mover_new = name_on(STAYING, "mov2", taken)
            calls.clear()
            assert stale[4].update(moving, bump(mover_new))["n"] == 1
            assert len(calls) == 1
            assert fresh.get_with_version(moving) == ({"username": mover_new, "n": 1}, 2)
            assert fresh.lookup("user_by_username", mover_old) is None
        finally:
            for s in stale:
                s.close()


def test_counters_during_moves_count_each_acknowledged_call_once(
    pair: tuple[MariaDBServer, MariaDBServer], tmp_path: Path
) -> None:
    """4 threads increment counters (renaming each time) while shards move back and forth."""
    source, target = pair
    config = StoreConfig.from_dict(raw_config(source, target, tmp_path, 0.2))
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


def check(store: Store, users: list[tuple[int, tuple[str, str]]], acked: dict[int, int], run: int) -> None:
    """Each user's count and version are its acknowledged calls; its name is held, the other free."""
    for u, (a, b) in users:
        got = store.get_with_version(u, type_name="user")  # (Instagram IDs carry no type)
        assert got is not None
        assert got.data["n"] == acked[u], f"run {run}, user {u}: n={got.data['n']} after {acked[u]} calls"
        assert got.version == acked[u] + 1
        held = got.data["username"]
        other = b if held == a else a
        assert store.lookup("user_by_username", held) == u
        assert store.lookup("user_by_username", other) is None


def test_batches_from_a_process_with_the_old_map_apply_once(
    pair: tuple[MariaDBServer, MariaDBServer], tmp_path: Path
) -> None:
    """`create_many`, `link_many` and `unlink_many` from processes that still route by the map
    from before a move, their items on shards that stayed and on shards that moved: the groups on
    the moved shards are refused by the tombstone and written again on the new host, alone;
    every object is made once, every pair is on both sides once, every count is exact."""
    source, target = pair
    config = StoreConfig.from_dict(raw_config(source, target, tmp_path, 0.2))
    old_map = StoreConfig.from_dict(raw_config(source, target, tmp_path, 3600))
    init_shards(config)
    with Store(config) as fresh:
        boards = [fresh.create("board", {"b": s}, shard=s) for s in (2, 12)]  # stays, moves
        pins = [fresh.create("pin", {"p": i}, shard=(5, 13)[i % 2]) for i in range(8)]  # both
        stale = [Store(old_map) for _ in range(4)]
        try:
            for s in stale:
                assert s.get(boards[0]) is not None
            move(fresh, tmp_path, MOVING.start, MOVING.stop - 1, "B", "batch")
            assert fresh.refresh_map(force=True) or fresh.shard_map.version == 2

            # Objects made in one call on a moved shard and on one that stayed.
            moved = stale[0].create_many("pin", [{"m": i} for i in range(5)], shard=13)
            stayed = stale[1].create_many("pin", [{"s": i} for i in range(5)], shard=5)
            assert fresh.get_many(moved) == {p: {"m": i} for i, p in enumerate(moved)}
            assert fresh.get_many(stayed) == {p: {"s": i} for i, p in enumerate(stayed)}
            # Each made once: 4 pins from before and 5 made now, on each shard's host of now.
            assert _rows(fresh, 13, "B", "pins") == _rows(fresh, 5, "A", "pins") == 9

            # Every pair of both boards with every pin: each side crosses the move somewhere.
            everything = [(b, p) for b in boards for p in pins + moved]
            assert stale[2].link_many(BHP, everything) == len(everything)
            half = everything[::2]
            assert stale[3].unlink_many(BHP, half) == len(half)
            left = set(everything) - set(half)
            for b in boards:
                listed = fresh.links(BHP, b, limit=100)
                assert sorted(listed) == sorted(p for bb, p in left if bb == b)
                assert fresh.count(BHP, b) == len(listed)
            for p in pins + moved:
                owners = sorted(b for b, pp in left if pp == p)
                assert sorted(fresh.links("pin_owned_by_board", p)) == owners
                assert fresh.count("pin_owned_by_board", p) == len(owners)
            # Each batch that reached a moved shard met its tombstone (the one on shard 5 did not).
            assert [s.admin_context().live.reroutes > 0 for s in stale] == [True, False, True, True]
        finally:
            for s in stale:
                s.close()


def _rows(store: Store, shard: int, host: str, table: str) -> int:
    """Rows of ``table`` in ``shard`` on ``host``, read straight from the database."""
    h = store.admin_context().engines.shard(shard, host)
    with h.connect() as conn:
        cur = conn.cursor()
        cur.execute(f"SELECT COUNT(*) FROM {h.table(table)}")
        return int(cur.fetchone()[0])


def test_batches_during_a_move_leave_exactly_what_was_acknowledged(
    pair: tuple[MariaDBServer, MariaDBServer], tmp_path: Path
) -> None:
    """Threads link and unlink batches whose pairs cross the moving shards, and make objects in
    batches there, while the shards move out and back: afterwards each thread's pairs are as its
    last acknowledged batch left them, on both sides, with exact counts, and every object a
    batch acknowledged exists once (no batch wrote a group twice)."""
    source, target = pair
    config = StoreConfig.from_dict(raw_config(source, target, tmp_path, 0.2))
    init_shards(config)
    batches_during_moves(config, tmp_path)


def batches_during_moves(config: StoreConfig, tmp_path: Path) -> None:
    """The body of the test above, on any two-host config whose shards 8-15 can move to B and back
    (MariaDB here, PostgreSQL schemas in `tests.test_exactly_once_postgres`)."""
    with Store(config) as store:
        mine = []
        for w in range(3):
            boards = [store.create("board", {"w": w}, shard=s) for s in (1 + w, 9 + w)]
            pins = [store.create("pin", {"w": w, "i": i}, shard=(4, 12)[i % 2]) for i in range(6)]
            mine.append([(b, p) for b in boards for p in pins])
        last: dict[int, str] = {}
        made: list[int] = []
        users: list[tuple[int, str]] = []
        for run, to in enumerate(("B", "A")):
            errors: list[BaseException] = []
            done = threading.Event()

            def pairs_writer(
                w: int, done: threading.Event = done, errors: list[BaseException] = errors
            ) -> None:
                try:
                    while not done.is_set():
                        if last.get(w) != "link":
                            assert store.link_many(BHP, mine[w]) == len(mine[w])
                            last[w] = "link"
                        else:
                            assert store.unlink_many(BHP, mine[w]) == len(mine[w])
                            last[w] = "unlink"
                except BaseException as exc:  # surfaced below
                    errors.append(exc)

            def maker(done: threading.Event = done, errors: list[BaseException] = errors) -> None:
                try:
                    while not done.is_set():
                        made.extend(
                            store.create_many("pin", [{"made": len(made) + i} for i in range(4)], shard=14)
                        )
                        # Users with unique names whose key rows land on both sides of the move.
                        names = [f"b{len(users)}-{i}" for i in range(4)]
                        ids = store.create_many("user", [{"username": n} for n in names], shard=6)
                        users.extend(zip(ids, names, strict=True))
                except BaseException as exc:  # surfaced below
                    errors.append(exc)

            threads = [threading.Thread(target=pairs_writer, args=(w,)) for w in range(3)]
            threads.append(threading.Thread(target=maker))
            for t in threads:
                t.start()
            try:
                move(store, tmp_path, MOVING.start, MOVING.stop - 1, to, f"batches{run}")
            finally:
                done.set()
                for t in threads:
                    t.join()
            assert errors == [], errors
            for w, pairs in enumerate(mine):
                present = last[w] == "link"
                for b in {b for b, _p in pairs}:
                    assert store.count(BHP, b) == (6 if present else 0), (run, w)
                    assert len(store.links(BHP, b, limit=100)) == (6 if present else 0), (run, w)
                for p in {p for _b, p in pairs}:
                    assert len(store.links("pin_owned_by_board", p)) == (2 if present else 0), (run, w)
                    assert store.count("pin_owned_by_board", p) == (2 if present else 0), (run, w)
            assert len(made) == len(set(made))
            assert len(store.get_many(made, type_name="pin")) == len(made)
            host = store.shard_map.master(14)
            assert _rows(store, 14, host, "pins") == len(made), "a batch's rows written twice"
            for u, name in users:  # each name held once, by the user made with it
                assert store.lookup("user_by_username", name) == u, (run, name)
            assert len(store.get_many([u for u, _n in users], type_name="user")) == len(users)
            assert sorted(key_shard("user_by_username", n.encode(), SHARDS) in MOVING for _u, n in users)[-1]
        assert store.admin_context().live.reroutes > 0, "no batch met a moved shard: the test proved nothing"
