"""A shard is live on exactly one host: tombstones, init by the live map, admin locks.

One move (shards 0-3 from A to B) is made once for the module; each test
then looks at it from another side: an old-map process, an operator's
`init` with the old seed map, a new type, a cleanup, an init racing a switch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pymysql
import pytest
from sqlalchemy.engine import make_url

from store import ShardMovedError, Store, StoreConfig
from store.admin import init_shards
from store.admin.move import Mover
from store.backends.mysql import MySQLBackend, leave_tombstones
from tests.conftest import base_config
from tests.servers import MariaDBServer

BHP = "board_has_pins"

pytestmark = pytest.mark.moves


@dataclass
class Moved:
    source: MariaDBServer
    target: MariaDBServer
    folder: Path
    before: dict[int, dict[str, Any]]  # pins on the moved shards, written before the move
    board: int  # on shard 1 (moved), with the pins linked
    stale: Store | None = None  # opened before the move; it would not look at the map for an hour

    def raw(self, *, poll_s: float = 0.2, map_source: bool = True, **extra: Any) -> dict[str, Any]:
        raw = base_config(
            shards=8,
            hosts={"A": self.source.url, "B": self.target.url},
            map=[{"range": [0, 7], "master": "A"}],  # the seed: every shard on A
            **extra,
        )
        if map_source:
            raw["map_source"] = {"file": str(self.folder / "map.yaml"), "poll_s": poll_s}
        return raw

    def sql(self, server: MariaDBServer, query: str) -> list[tuple[Any, ...]]:
        conn = pymysql.connect(host="127.0.0.1", port=server.port, user="root", autocommit=True)
        try:
            with conn.cursor() as cur:
                cur.execute(query)
                return list(cur.fetchall())
        finally:
            conn.close()


@pytest.fixture(scope="module")
def moved(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Moved]:
    source = MariaDBServer(log_bin=True, server_id=1)
    target = MariaDBServer(log_bin=True, server_id=2)
    try:
        source.start()
        target.start()
        m = Moved(source, target, tmp_path_factory.mktemp("moved"), {}, 0)
        config = StoreConfig.from_dict(m.raw())
        init_shards(config)
        m.stale = Store.from_config(m.raw(poll_s=3600))
        with Store(config) as store:
            m.board = store.create("board", {"b": 1}, shard=1)
            for s in range(8):
                pin = store.create("pin", {"s": s}, shard=s)
                m.before[pin] = {"s": s}
                store.link(BHP, m.board, pin)
            mover = Mover(store, m.folder / "move.json", say=lambda _m: None)
            mover.start(mover.plan(0, 3, "B"))
        yield m
        m.stale.close()
    finally:
        source.remove()
        target.remove()


def test_the_old_host_keeps_a_tombstone_and_the_new_one_the_rows(moved: Moved) -> None:
    tables = moved.sql(
        moved.source,
        "SELECT table_schema, table_name, table_type FROM information_schema.tables "
        "WHERE table_schema = 'db00002' ORDER BY 2",
    )
    kinds = {name: kind for _db, name, kind in tables}
    assert kinds.pop("store_tombstone") == "BASE TABLE"
    assert kinds
    assert set(kinds.values()) == {"VIEW"}, kinds
    assert moved.sql(moved.source, "SELECT shard, moved_to, map_version FROM db00002.store_tombstone") == [
        (2, "B", 2)
    ]
    for query in (
        "SELECT data FROM db00002.pins WHERE local_id = 1",
        "SELECT COUNT(*) FROM db00002.board_has_pins",
        "INSERT INTO db00002.pins (data) VALUES ('{}')",
        "UPDATE db00002.pins SET data = '{}' WHERE local_id = 1",
        "DELETE FROM db00002.relation_counts",
    ):
        with pytest.raises(pymysql.err.MySQLError):
            moved.sql(moved.source, query)
    # `CREATE TABLE IF NOT EXISTS` (an old init, a tool) finds the name taken and changes nothing.
    moved.sql(moved.source, "CREATE TABLE IF NOT EXISTS db00002.pins (local_id BIGINT PRIMARY KEY)")
    with pytest.raises(pymysql.err.MySQLError, match="store-tombstone shard=2 moved_to=B map_version=2"):
        moved.sql(moved.source, "SELECT data FROM db00002.pins WHERE local_id = 1")


def test_every_call_of_a_process_with_the_old_map_is_refused_there_and_rerouted(moved: Moved) -> None:
    with Store.from_config(moved.raw()) as fresh:
        pins = list(moved.before)
        assert fresh.get_many(pins) == moved.before
    # A store whose map never changes by itself (no map source) routes by the
    # seed map: every call to a moved shard is refused by the tombstone.
    with Store.from_config(moved.raw(map_source=False)) as static:
        on_moved = [p for p, v in moved.before.items() if v["s"] < 4]
        calls = {
            "get": lambda: static.get(on_moved[0]),
            "get_many": lambda: static.get_many(on_moved),
            "create": lambda: static.create("pin", {}, shard=2),
            "update": lambda: static.update(on_moved[0], {"x": 1}),
            "delete": lambda: static.delete(on_moved[0]),
            "link": lambda: static.link(BHP, moved.board, on_moved[0]),
            "unlink": lambda: static.unlink(BHP, moved.board, on_moved[0]),
            "page": lambda: static.page(BHP, moved.board),
            "count": lambda: static.count(BHP, moved.board),
        }
        for name, call in calls.items():
            with pytest.raises(ShardMovedError) as caught:
                call()
            err = caught.value
            assert (err.host, err.moved_to, err.map_version) == ("A", "B", 2), name
    # A process with the live map source but the old map in memory reloads and retries.
    stale = moved.stale
    assert stale is not None
    assert stale.shard_map.version == 1
    pin = next(p for p, v in moved.before.items() if v["s"] == 2)
    assert stale.get(pin) == {"s": 2}
    assert stale.shard_map.version == 2
    with Store.from_config(moved.raw()) as fresh:
        assert fresh.get_many(list(moved.before)) == moved.before, "a refused call wrote something"
        assert fresh.count(BHP, moved.board) == 8


def test_init_places_shards_by_the_live_map_and_a_new_type_lands_on_the_new_host(moved: Moved) -> None:
    types = {**base_config()["types"], "comment": {"id": 9, "table": "comments"}}
    report = init_shards(StoreConfig.from_dict(moved.raw(types=types)))
    assert report.per_host == {"B": 4, "A": 4}
    assert report.tables_created == 8  # one comments table per shard, each where the shard lives
    on_a = moved.sql(
        moved.source,
        "SELECT table_schema FROM information_schema.tables WHERE table_name = 'comments' ORDER BY 1",
    )
    assert on_a == [("db00004",), ("db00005",), ("db00006",), ("db00007",)]
    on_b = moved.sql(
        moved.target,
        "SELECT table_schema FROM information_schema.tables WHERE table_name = 'comments' ORDER BY 1",
    )
    assert on_b == [("db00000",), ("db00001",), ("db00002",), ("db00003",)]
    again = init_shards(StoreConfig.from_dict(moved.raw(types=types)))
    assert (again.tables_created, again.databases_created) == (0, 0)


def test_init_refuses_a_live_map_that_gives_a_shard_to_its_tombstone(moved: Moved, tmp_path: Path) -> None:
    raw = moved.raw()
    raw["map_source"] = {"file": str(tmp_path / "behind.yaml")}  # an empty source: seeded with A for all
    before = moved.sql(moved.source, "SELECT COUNT(*) FROM information_schema.tables")
    with pytest.raises(ShardMovedError, match="gives shard 0 to A, but A holds a tombstone of it"):
        init_shards(StoreConfig.from_dict(raw))
    assert moved.sql(moved.source, "SELECT COUNT(*) FROM information_schema.tables") == before


def test_an_init_that_waits_on_a_switch_finds_the_tombstone(moved: Moved) -> None:
    """Shard 6 is switched away by hand while an init waits on its admin lock."""
    conn = pymysql.connect(host="127.0.0.1", port=moved.source.port, user="root", autocommit=True)
    cur = conn.cursor()
    outcome: list[BaseException | None] = []
    types = {**base_config()["types"], "note": {"id": 10, "table": "notes"}}
    try:
        with MySQLBackend().admin_lock(cur, [6], timeout_s=60):
            # What a move's switch does, under the lock: tables away, then the tombstone.
            cur.execute("CREATE DATABASE moved_db00006")
            for (table,) in moved.sql(
                moved.source,
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'db00006'",
            ):
                cur.execute(f"ALTER TABLE db00006.`{table}` RENAME moved_db00006.`{table}`")

            def init() -> None:
                try:
                    init_shards(StoreConfig.from_dict(moved.raw(types=types)), shards=[6])
                    outcome.append(None)
                except BaseException as exc:  # surfaced below
                    outcome.append(exc)

            t = threading.Thread(target=init)
            t.start()
            time.sleep(1.0)
            assert outcome == [], "init did not wait for the shard's admin lock"
            leave_tombstones(cur, [6], "B", 3)
        t.join(30)
        assert len(outcome) == 1
        assert isinstance(outcome[0], ShardMovedError)
        assert "moved from A to B (map version 3) while init ran" in str(outcome[0])
        base = moved.sql(
            moved.source,
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = 'db00006' AND table_type = 'BASE TABLE'",
        )
        assert base == [("store_tombstone",)], "init created a table in a tombstone"
    finally:
        cur.close()
        conn.close()


def test_cleanup_drops_the_archives_and_keeps_the_tombstones(moved: Moved) -> None:
    with Store.from_config(moved.raw()) as store:
        dropped = Mover(store, moved.folder / "move.json", say=lambda _m: None).cleanup()
    assert dropped == [f"moved_db{s:05d}" for s in range(4)]
    conn = pymysql.connect(host="127.0.0.1", port=moved.source.port, user="root")
    try:
        inventory = MySQLBackend().inventory(make_url(moved.source.url), conn.cursor)
    finally:
        conn.close()
    assert {s: c.state for s, c in inventory.copies.items() if s < 4} == {s: "tombstone" for s in range(4)}
    assert all(inventory.copies[s].moved_to == "B" for s in range(4))
    assert 0 not in inventory.archives
    with Store.from_config(moved.raw(map_source=False)) as static, pytest.raises(ShardMovedError):
        static.get(next(p for p, v in moved.before.items() if v["s"] == 0))


def test_a_move_to_a_host_that_already_holds_the_shards_is_refused(moved: Moved) -> None:
    from store.admin.move import MoveError

    # B holds shards 0-3 live; a stray copy of shard 5 is made there by hand.
    moved.sql(moved.target, "CREATE DATABASE db00005")
    moved.sql(moved.target, "CREATE TABLE db00005.pins (local_id BIGINT PRIMARY KEY)")
    try:
        with Store.from_config(moved.raw()) as store:
            mover = Mover(store, moved.folder / "second.json", say=lambda _m: None)
            with pytest.raises(MoveError, match=r"B already holds tables of db00005, which the live map"):
                mover.plan(4, 5, "B")
            with pytest.raises(MoveError, match="shards 0-1 are already on B"):
                mover.plan(0, 1, "B")
        assert not (moved.folder / "second.json").exists(), "a refused move wrote a journal"
    finally:
        moved.sql(moved.target, "DROP DATABASE db00005")
