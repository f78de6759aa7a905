"""The store's promises, one test per way it was seen to break them (tickets: test_tickets.py).

1. a re-run of `store init` after a move must not open a moved shard again;
2. `link` and `unlink` of one pair at once must leave both sides in step;
3. a lost invalidation must not stay stale for other processes beyond
   ``cache.max_stale_s``;
4. a deleted object leaves the lists that reach it through an inverse;
5. Instagram IDs: the type is part of every cached read;
7. a create is a write: a new object is never answered from a cache entry
   that an older object with the same ID left behind.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pymysql
import pytest
import yaml

from store import NotFound, Store, StoreConfig, decode_pinterest
from store.admin import init_shards
from store.admin.move import Mover
from tests.asyncface import blocking_store
from tests.conftest import base_config, cached_mariadb_config, run_cli
from tests.servers import MariaDBServer, binlog_pair, free_port

BHP = "board_has_pins"
POB = "pin_owned_by_board"
#: The tests of the ``store`` fixture also run through `store.aio.AsyncStore` (`tests.conftest`).
BOTH_FACES = True
# Each test below fails on commit b1f43ba (they landed marked xfail, strict, in 0720bce).


# -- 1. init after a move --------------------------------------------------------


@pytest.fixture
def pair() -> Iterator[tuple[MariaDBServer, MariaDBServer]]:
    with binlog_pair() as servers:
        yield servers


def base_tables(server: MariaDBServer, db: str) -> list[str]:
    conn = pymysql.connect(host="127.0.0.1", port=server.port, user="root")
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = %s AND table_type = 'BASE TABLE' ORDER BY 1",
                (db,),
            )
            return [str(r[0]) for r in cur.fetchall()]
    finally:
        conn.close()


@pytest.mark.moves
def test_init_after_a_move_does_not_open_the_moved_shards_again(
    pair: tuple[MariaDBServer, MariaDBServer], tmp_path: Path
) -> None:
    source, target = pair

    def raw(poll_s: float) -> dict[str, Any]:
        return base_config(
            shards=8,
            hosts={"A": source.url, "B": target.url},
            map=[{"range": [0, 7], "master": "A"}],  # the seed: every shard on A
            map_source={"file": str(tmp_path / "map.yaml"), "poll_s": poll_s},
        )

    config = StoreConfig.from_dict(raw(0.2))
    init_shards(config)
    # A process that started before the move and would not look at the map
    # again on its own for an hour: only a refusal makes it reload.
    stale = Store(StoreConfig.from_dict(raw(3600)))
    try:
        with Store(config) as store:
            on_b = store.create("pin", {"who": "before the move"}, shard=2)
            mover = Mover(store, tmp_path / "move.json", say=lambda _m: None)
            mover.start(mover.plan(0, 3, "B"))
        assert stale.shard_map.version == 1
        init_shards(config)  # an operator re-runs init, e.g. after adding a type
        assert "pins" not in base_tables(source, "db00002"), "init put a moved table back on the old host"
        made = stale.create("pin", {"who": "stale process"}, shard=2)
        assert stale.shard_map.version == 2, "the stale process was not made to reload the map"
        with Store(config) as fresh:
            assert fresh.get(on_b) == {"who": "before the move"}
            assert fresh.get(made) == {"who": "stale process"}
            assert made != on_b
        assert "pins" not in base_tables(source, "db00002")
    finally:
        stale.close()


# -- 2. link and unlink of one pair at once ----------------------------------------


@pytest.mark.parametrize(
    ("where", "face"), [("two pools", "sync"), ("one pool", "sync"), ("two pools", "async")]
)
def test_concurrent_link_and_unlink_of_one_pair_keep_both_sides_in_step(
    mariadb_ready: StoreConfig, where: str, face: str
) -> None:
    # Two pools: a transaction a side. One pool: both sides in one transaction, each side's
    # write sent with the other's in one request (`store.relations.writer`, at once), moves included.
    # Async: the same calls awaited on one event loop (`store.aio.AsyncStore`) from the threads.
    with blocking_store(mariadb_ready, face) as store:
        board = store.create("board", {}, shard=0)  # host MySQL001A
        if where == "two pools":
            pins = [store.create("pin", {"i": i}, shard=5) for i in range(1)]  # host MySQL002A
        else:
            pins = [store.create("pin", {"i": i}, near=board) for i in range(2)]
        for round_ in range(10):
            errors: list[BaseException] = []
            barrier = threading.Barrier(8)

            def churn(
                seed: int, barrier: threading.Barrier = barrier, errors: list[BaseException] = errors
            ) -> None:
                rng = random.Random(seed)
                try:
                    barrier.wait()
                    for _ in range(100):
                        p = rng.choice(pins)
                        roll = rng.random()
                        if roll < 0.35:
                            store.link(BHP, board, p)
                        elif roll < 0.5:
                            store.link(BHP, board, p, sequence=rng.randrange(3))
                        else:
                            store.unlink(BHP, board, p)
                except BaseException as exc:  # surfaced below
                    errors.append(exc)

            threads = [threading.Thread(target=churn, args=(round_ * 10 + i,)) for i in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert errors == []
            linked = set(store.links(BHP, board, limit=100))
            repo = store.admin_context().relation_repository
            for p in pins:
                assert (board in store.links(POB, p)) == (p in linked), f"round {round_}: sides differ"
                assert store.count(POB, p) == (1 if p in linked else 0)
                sides = [
                    repo.sequence_of(_handle(store, f, kind), rel, f, t)
                    for rel, f, t, kind in ((BHP, board, p, "board"), (POB, p, board, "pin"))
                ]
                assert sides[0] == sides[1], f"round {round_}: sequences differ"
            assert store.count(BHP, board) == len(linked)


def _handle(store: Store, id_: int, type_name: str) -> Any:
    loc = store.locate(id_, type_name=type_name)
    return store.admin_context().engines.shard(loc.shard, loc.host)


def test_a_link_mends_a_split_pair_whichever_side_is_missing(mariadb_ready: StoreConfig) -> None:
    # The speculative one-request link writes the inverse side before it knows the primary
    # side's outcome: where the primary side exists (not to move), the inverse side it
    # inserted is rolled back and the link runs a side at a time, as the primary side says.
    with Store(mariadb_ready) as store:
        repo = store.admin_context().relation_repository
        board = store.create("board", {}, shard=0)
        for missing in (POB, BHP):
            pin = store.create("pin", {}, near=board)
            store.link(BHP, board, pin, sequence=5)
            h = _handle(store, pin if missing == POB else board, "pin" if missing == POB else "board")
            f, t = (pin, board) if missing == POB else (board, pin)
            assert repo.remove(h, missing, f, t)  # a split pair, as a crash between commits leaves
            assert store.link(BHP, board, pin) is (missing == BHP)
            seqs = [
                repo.sequence_of(_handle(store, board, "board"), BHP, board, pin),
                repo.sequence_of(_handle(store, pin, "pin"), POB, pin, board),
            ]
            assert seqs[0] == seqs[1] is not None, missing
            if missing == POB:
                assert seqs[0] == 5  # the primary side's sequence stands
            assert store.count(POB, pin) == 1
        assert store.count(BHP, board) == 2


# -- 3. a lost invalidation, seen from another process -----------------------------

DEAD_PORT = free_port()  # nothing listens here: every cache call of the writer fails


cli = run_cli


def test_a_lost_invalidation_is_stale_for_other_processes_at_most_max_stale_s(
    mariadb_ready: StoreConfig, memcached_pair: list[str], redis_ready: str, tmp_path: Path
) -> None:
    raw = cached_mariadb_config(memcached_pair, redis_ready)
    writer = {**raw, "cache": {**raw["cache"], "memcached": [f"127.0.0.1:{DEAD_PORT}"]}}
    writer["cache"]["redis"] = f"redis://127.0.0.1:{DEAD_PORT}/0"
    writer_file = tmp_path / "writer.yaml"
    writer_file.write_text(yaml.safe_dump(writer))
    max_stale_s = 5.0  # the default of cache.max_stale_s
    with Store.from_config(raw) as reader:
        pin = reader.create("pin", {"v": 1})
        board = reader.create("board", {})
        assert reader.get(pin) == {"v": 1}  # cached in this process's memcached
        assert reader.links(BHP, board) == []  # and the list in Redis
        cli(writer_file, "update", str(pin), '{"v": 2}')  # commits; its invalidations are lost
        cli(writer_file, "link", BHP, str(board), str(pin))
        acked = time.monotonic()
        while time.monotonic() < acked + max_stale_s + 1.0:
            if reader.get(pin) == {"v": 2} and reader.links(BHP, board) == [pin]:
                break
            time.sleep(0.1)
        assert reader.get(pin) == {"v": 2}, "still the value from before the acknowledged update"
        assert reader.links(BHP, board) == [pin], "still the list from before the acknowledged link"
        assert reader.count(BHP, board) == 1


# -- 4. delete takes an object out of its lists ------------------------------------


def test_deleted_objects_leave_their_lists(store: Store) -> None:
    board = store.create("board", {})
    pins = [store.create("pin", {"i": i}, shard=i % 8) for i in range(5)]
    user = store.create("user", {})
    for p in pins:
        store.link(BHP, board, p)
        store.link("users_likes_pins", user, p)
    assert store.count(BHP, board) == 5
    for p in pins[:4]:
        assert store.delete(p) is True
    assert store.count(BHP, board) == 1
    assert store.links(BHP, board) == [pins[4]]
    page = store.board_pins(board, limit=4)
    assert page.ids == [pins[4]]
    assert page.next_cursor is None
    assert store.count("users_likes_pins", user) == 1
    assert store.links("pin_liked_by_user", pins[0]) == []


@pytest.mark.parametrize(
    ("caches", "face"),
    [
        ("none", "sync"),
        ("shared", "sync"),
        ("shared, followed", "sync"),
        ("shared", "async"),
        ("shared", "native"),
    ],
)
def test_deletes_racing_links_leave_no_deleted_object_in_any_list(
    mariadb_ready: StoreConfig, request: pytest.FixtureRequest, caches: str, face: str
) -> None:
    # Threads link, move, unlink and like pins on two boards (one on each host, so each pin's pair
    # is written on one host or across two) while others delete pins. Whatever the interleaving,
    # afterwards no list (cached or not) holds a deleted pin, both sides of every pair agree, and
    # each count is its list's length. A link that loses to the delete is refused (NotFound).
    if caches == "none":
        config: StoreConfig | dict[str, Any] = mariadb_ready
    else:
        config = cached_mariadb_config(
            request.getfixturevalue("memcached_pair"), request.getfixturevalue("redis_ready")
        )
        config["cache"]["follow"] = caches.endswith("followed")
        if config["cache"]["follow"]:
            init_shards(StoreConfig.from_dict(config))  # makes the invalidation logs
    checked = config if isinstance(config, StoreConfig) else StoreConfig.from_dict(config)
    with blocking_store(checked, face) as store:
        boards = [store.create("board", {}, shard=0), store.create("board", {}, shard=5)]
        user = store.create("user", {}, shard=2)
        pins = [store.create("pin", {"i": i}, shard=i % 8) for i in range(24)]
        deleted: set[int] = set()
        refused: set[int] = set()
        errors: list[BaseException] = []
        barrier = threading.Barrier(8)

        def writer(seed: int) -> None:
            rng = random.Random(seed)
            try:
                barrier.wait()
                for _ in range(60):
                    p, b = rng.choice(pins), rng.choice(boards)
                    roll = rng.random()
                    try:
                        if roll < 0.45:
                            store.link(BHP, b, p)
                        elif roll < 0.6:
                            store.link(BHP, b, p, sequence=rng.randrange(4))
                        elif roll < 0.8:
                            store.link("users_likes_pins", user, p)
                        else:
                            store.unlink(BHP, b, p)
                    except NotFound:
                        refused.add(p)
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        def deleter(seed: int) -> None:
            rng = random.Random(seed)
            mine = [p for i, p in enumerate(pins) if i % 2 == seed % 2]
            rng.shuffle(mine)
            try:
                barrier.wait()
                for p in mine[:5]:
                    time.sleep(rng.random() * 0.05)
                    assert store.delete(p) is True
                    deleted.add(p)
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(6)]
        threads += [threading.Thread(target=deleter, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert len(deleted) == 10
        assert refused <= deleted  # only a deleted pin is refused
        with Store(mariadb_ready) as truth:  # no caches: the database's own answers
            for b in boards:
                listed = truth.links(BHP, b, limit=100)
                assert not deleted & set(listed)
                assert store.links(BHP, b, limit=100) == listed
                assert store.count(BHP, b) == truth.count(BHP, b) == len(listed)
                assert store.board_pins(b, limit=100).ids == listed
            liked = truth.links("users_likes_pins", user, limit=100)
            assert not deleted & set(liked)
            assert store.links("users_likes_pins", user, limit=100) == liked
            assert store.count("users_likes_pins", user) == len(liked)
            for p in pins:
                owners = truth.links(POB, p)
                assert owners == store.links(POB, p)
                assert sorted(owners) == sorted(b for b in boards if p in truth.links(BHP, b, limit=100))
                assert (user in truth.links("pin_liked_by_user", p)) == (p in liked)
                if p in deleted:
                    assert owners == []
                    assert truth.count(POB, p) == 0
                    assert truth.links("pin_liked_by_user", p) == []


# -- 5. Instagram IDs: the type is part of every cached read --------------------------


def test_instagram_get_of_another_type_is_none_cached_or_not(postgres_ready: StoreConfig) -> None:
    raw = base_config(
        namespace=postgres_ready.namespace,
        ids="instagram",
        shards=postgres_ready.shards,
        hosts={name: str(url) for name, url in postgres_ready.hosts.items()},
        map=[{"range": [r.start, r.end], "master": r.master} for r in postgres_ready.shard_map],
        cache={"memory": True},
    )
    with Store.from_config(raw) as store:
        board = store.create("board", {"name": "b"})
        assert store.get(board, type_name="board") == {"name": "b"}  # now cached
        assert store.get(board, type_name="board") == {"name": "b"}
        assert store.stats()["memory-objects"]["hits"] == 1
        assert store.get(board, type_name="pin") is None
        assert store.get_many([board], type_name="pin") == {}
        other = store.create("board", {"name": "c"})
        assert store.get(other, type_name="pin") is None  # not cached: read from the pins table


# -- 7. a create is a write ------------------------------------------------------------


def test_a_new_object_is_not_answered_from_an_older_objects_cache_entry(
    memcached_pair: list[str], redis_ready: str, tmp_path: Path
) -> None:
    import uuid

    prefix = f"p7{uuid.uuid4().hex[:6]}:"  # the same cache, before and after the reset

    def raw(folder: Path) -> dict[str, Any]:
        return base_config(
            shards=2,
            hosts={"A": f"sqlite:///{folder}"},
            map=[{"range": [0, 1], "master": "A"}],
            cache={"memcached": memcached_pair, "redis": redis_ready, "prefix": prefix},
        )

    with Store.from_config(raw(tmp_path / "before")) as before:
        old_pin = before.create("pin", {"who": "old"}, shard=1)
        old_board = before.create("board", {}, shard=1)
        before.link(BHP, old_board, old_pin)
        assert before.get(old_pin) == {"who": "old"}
        assert before.count(BHP, old_board) == 1
    # The shard databases are reset (a development reset, or a restore from an
    # older backup): local ids start again, the caches still hold the old entries.
    with Store.from_config(raw(tmp_path / "after")) as after:
        new_pin = after.create("pin", {"who": "new"}, shard=1)
        new_board = after.create("board", {}, shard=1)
        assert (new_pin, new_board) == (old_pin, old_board)  # the same IDs again
        assert after.get(new_pin) == {"who": "new"}
        assert after.count(BHP, new_board) == 0
        assert after.links(BHP, new_board) == []
    assert decode_pinterest(new_pin).local_id == 1
