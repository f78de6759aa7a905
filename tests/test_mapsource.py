"""The shared shard map: versions, atomic writes, stale writes refused, and rerouting.

The last test moves a shard by hand to a second MariaDB server (dump, fence
by renaming the source tables away, new map version) and shows that a store
still holding the old map is refused by the old host, reloads, and lands
its write on the new host exactly once.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pymysql
import pytest

import store.livemap as livemap
from store import ShardMovedError, StaleMapError, Store, StoreConfig, decode_pinterest
from store.admin import init_shards
from store.mapsource import FileMapSource, MapSource, TableMapSource, ZooKeeperMapSource
from store.shardmap import ShardMap, ShardRange
from tests.conftest import MARIADB_URL, NAMES, NAMESPACE, base_config, db, require_port
from tests.servers import MariaDBServer, ZooKeeperServer


@pytest.fixture(scope="module")
def zookeeper() -> Iterator[ZooKeeperServer]:
    server = ZooKeeperServer()
    try:
        yield server
    finally:
        server.remove()


def two_hosts() -> ShardMap:
    return ShardMap([ShardRange(0, 511, "A", "B")], shards=512)


def test_with_move_splits_and_merges_and_bumps_the_version() -> None:
    m = two_hosts()
    moved = m.with_move(256, 511, "C", "D")
    assert moved.version == 2
    assert [(r.start, r.end, r.master) for r in moved] == [(0, 255, "A"), (256, 511, "C")]
    back = moved.with_move(256, 511, "A", "B")
    assert [(r.start, r.end, r.master) for r in back] == [(0, 511, "A")]  # merged again
    assert m.diff(moved) == [(256, 511, "A", "C")]
    middle = m.with_move(100, 199, "C")
    assert [(r.start, r.end, r.master) for r in middle] == [(0, 99, "A"), (100, 199, "C"), (200, 511, "A")]
    assert ShardMap.from_dict(middle.to_dict()) == middle


@pytest.fixture(params=["file", "table", "zookeeper"])
def source(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MapSource]:
    if request.param == "file":
        yield FileMapSource(tmp_path / "map.yaml")
        return
    if request.param == "zookeeper":
        zk = request.getfixturevalue("zookeeper")
        src = ZooKeeperMapSource(zk.hosts, path=f"/store/{tmp_path.name}")
        yield src
        src.close()
        return
    require_port("MariaDB", 3306)
    meta = f"{NAMESPACE}_meta_test"
    src = TableMapSource(MARIADB_URL, database=meta, poll_s=0.01)
    src.create()
    src._run(f"DELETE FROM `{meta}`.`shard_maps`")
    yield src


def test_versions_are_written_atomically_and_stale_writes_refused(
    source: FileMapSource | TableMapSource,
) -> None:
    assert source.load() is None
    v1 = two_hosts()
    source.write(v1, expected_version=0)
    assert source.load() == v1
    v2 = v1.with_move(256, 511, "C")
    source.write(v2, expected_version=1)
    assert source.load() == v2
    with pytest.raises(StaleMapError, match="at version 2, not 1"):
        source.write(v1.with_move(0, 9, "C"), expected_version=1)  # based on a stale map
    with pytest.raises(StaleMapError, match="must be version 3"):
        source.write(v2, expected_version=2)
    assert source.load() == v2
    if isinstance(source, TableMapSource):
        assert source.versions() == [1, 2]
        assert source.load(1) == v1


def test_a_zookeeper_watch_tells_other_stores_at_once(zookeeper: ZooKeeperServer, tmp_path: Path) -> None:
    import time

    raw = base_config(
        shards=8,
        hosts={"A": f"sqlite:///{tmp_path}/a", "B": f"sqlite:///{tmp_path}/b"},
        map=[{"range": [0, 7], "master": "A"}],
        map_source={"zookeeper": zookeeper.hosts},
    )
    with Store.from_config(raw) as first, Store.from_config(raw) as second:
        assert second.shard_map.version == 1
        assert not second.map_source.changed()
        first.map_source.write(first.shard_map.with_move(0, 3, "B"), expected_version=1)
        deadline = time.monotonic() + 5
        while not second.map_source.changed() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert second.map_source.changed(), "the watch did not fire"
        assert second.refresh_map() is True
        assert second.shard_map.master(2) == "B"
        with pytest.raises(StaleMapError):
            second.map_source.write(second.shard_map.with_move(0, 3, "A"), expected_version=1)


def two_sqlite_hosts(tmp_path: Path, *, poll_s: float) -> dict[str, Any]:
    """8 shards on SQLite host A (host B empty), the map in a file polled every ``poll_s``."""
    return base_config(
        shards=8,
        hosts={"A": f"sqlite:///{tmp_path}/a", "B": f"sqlite:///{tmp_path}/b"},
        map=[{"range": [0, 7], "master": "A"}],
        map_source={"file": str(tmp_path / "map.yaml"), "poll_s": poll_s},
    )


def test_a_running_store_sees_a_new_map_without_a_restart(tmp_path: Path) -> None:
    raw = two_sqlite_hosts(tmp_path, poll_s=0.01)
    with Store.from_config(raw) as first, Store.from_config(raw) as second:
        assert first.shard_map.version == 1  # seeded from the config
        new = first.shard_map.with_move(4, 7, "B")
        first.map_source.write(new, expected_version=1)
        assert second.refresh_map(force=True) is True
        assert second.shard_map.master(5) == "B"
        assert first.refresh_map() in (True, False)
        assert first.shard_map.version == 2


def test_a_call_blocked_behind_a_fence_gets_the_whole_wait_for_the_new_map(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that waited on a move's fence longer than the reroute wait is refused when the
    fence commits; the new map comes a moment later, and the write must still get it (the wait
    runs from the refusal, not from the call's start)."""
    monkeypatch.setattr(livemap, "REROUTE_WAIT_S", 1.0)
    raw = two_sqlite_hosts(tmp_path, poll_s=3600)
    with Store.from_config(raw) as operator, Store.from_config(raw) as stale:
        masters: list[str] = []

        def call() -> str:
            master = stale.shard_map.master(5)
            masters.append(master)
            if master == "A":
                time.sleep(1.5)  # blocked behind the fence, longer than the whole reroute wait
                flip = threading.Timer(
                    0.3,
                    lambda: operator.map_source.write(
                        operator.shard_map.with_move(4, 7, "B"), expected_version=1
                    ),
                )
                flip.start()
                raise ShardMovedError("moved", shard=5, host="A", moved_to="B", map_version=2)
            return master

        assert stale._live.step(call) == "B"
        assert masters == ["A", "B"]


# -- a stale writer, fenced on the old host, lands on the new one -----------------

SHARD = 12  # outside the shards 0-7 that the other MariaDB tests share
SHARD_DB = db(SHARD)
MOVED_DB = NAMES.archive(SHARD_DB)


@pytest.fixture
def second_server() -> Iterator[MariaDBServer]:
    server = MariaDBServer()
    server.start()
    try:
        yield server
    finally:
        server.remove()


def test_a_process_with_the_old_map_is_refused_reloads_and_writes_once(
    second_server: MariaDBServer, tmp_path: Path
) -> None:
    require_port("MariaDB", 3306)
    conn = pymysql.connect(host="127.0.0.1", port=3306, user="root", autocommit=True)
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {SHARD_DB}")
        cur.execute(f"DROP DATABASE IF EXISTS {MOVED_DB}")
    raw = base_config(
        namespace=NAMESPACE,
        shards=16,
        hosts={"A": MARIADB_URL, "B": second_server.url},
        map=[{"range": [0, 15], "master": "A"}],
        map_source={"file": str(tmp_path / "map.yaml"), "poll_s": 3600},  # never polls by itself
    )
    config = StoreConfig.from_dict(raw)
    init_shards(config, shards=[SHARD])
    with Store(config) as stale, Store(config) as operator:
        board = stale.create("board", {"n": 0}, shard=SHARD)
        # The move, by hand: copy shard 5 to B, fence it on A, flip the map.
        dump = shutil.which("mariadb-dump") or "mariadb-dump"
        client = shutil.which("mariadb") or "mariadb"
        data = subprocess.run(
            [
                dump,
                "-uroot",
                "-h127.0.0.1",
                "-P3306",
                "--single-transaction",
                "--databases",
                SHARD_DB,
            ],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run([client, "-uroot", "-h127.0.0.1", f"-P{second_server.port}"], input=data, check=True)
        with conn.cursor() as cur:  # fence: the source copy is renamed away at once
            cur.execute(f"CREATE DATABASE {MOVED_DB}")
            cur.execute(f"SHOW TABLES FROM {SHARD_DB}")
            for (table,) in cur.fetchall():
                cur.execute(f"RENAME TABLE {SHARD_DB}.{table} TO {MOVED_DB}.{table}")
        moved = operator.shard_map.with_move(SHARD, SHARD, "B")
        operator.map_source.write(moved, expected_version=operator.shard_map.version)

        assert stale.shard_map.version == 1  # still the old map
        pin = stale.create("pin", {"n": 1}, near=board)  # refused by A, reloaded, written on B
        assert stale.shard_map.version == 2
        assert decode_pinterest(pin).shard_id == SHARD
        assert stale.update(board, {"n": 2}) == {"n": 2}
        b = pymysql.connect(host="127.0.0.1", port=second_server.port, user="root")
        with b.cursor() as cur:
            cur.execute(f"SELECT data FROM {SHARD_DB}.pins")
            assert cur.fetchall() == (('{"n":1}',),)  # exactly once, on the new host
        b.close()
        with conn.cursor() as cur:
            cur.execute(f"SELECT COUNT(*) FROM {MOVED_DB}.pins")
            assert cur.fetchone() == (0,)  # nothing on the old host after the fence
            cur.execute(f"DROP DATABASE {MOVED_DB}")
    conn.close()


def test_cli_map_show_and_diff_read_the_table_source(tmp_path: Path) -> None:
    import yaml
    from click.testing import CliRunner

    from store.cli import main

    require_port("MariaDB", 3306)
    meta = NAMES.meta_database  # the namespace's: the config below names it
    src = TableMapSource(MARIADB_URL, database=meta)
    src.create()
    src._run(f"DELETE FROM `{meta}`.`shard_maps`")
    raw = base_config(
        namespace=NAMESPACE,
        shards=8,
        hosts={"A": f"sqlite:///{tmp_path}/a", "B": f"sqlite:///{tmp_path}/b"},
        map=[{"range": [0, 7], "master": "A"}],
        map_source={"table": MARIADB_URL},
    )
    cfg = tmp_path / "store.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    runner = CliRunner()
    shown = runner.invoke(main, ["map", "show", "--config", str(cfg)])
    assert shown.exit_code == 0, shown.output
    assert "shard map version 1, 8 shards" in shown.output
    current = src.load()
    assert current is not None
    src.write(current.with_move(4, 7, "B"), expected_version=1)
    out = runner.invoke(main, ["map", "diff", "--config", str(cfg)])
    assert out.exit_code == 0, out.output
    assert "map version 1 -> 2: 1 span(s) changed master" in out.output
    assert "shards 4-7: A -> B" in out.output
    assert "version 2" in runner.invoke(main, ["map", "show", "--config", str(cfg)]).output
    src._run(f"DELETE FROM `{meta}`.`shard_maps`")


def test_a_map_file_that_cannot_be_read_keeps_the_last_map(tmp_path: Path) -> None:
    """A broken map file fails the periodic check, never a call: the last map stays, the failure is
    counted and the map's age grows; once the file is whole again, the age drops back."""
    import time

    map_file = tmp_path / "map.yaml"
    raw = base_config(
        shards=8,
        hosts={"A": f"sqlite:///{tmp_path}/a", "B": f"sqlite:///{tmp_path}/b"},
        map=[{"range": [0, 7], "master": "A"}],
        map_source={"file": str(map_file), "poll_s": 0.05},
    )
    with Store.from_config(raw) as store:
        live = store.admin_context().live
        pin = store.create("pin", {"v": 0})
        whole = map_file.read_text()
        map_file.write_text("ranges: [oops\n")
        for v in range(1, 30):
            assert store.update(pin, {"v": v}) == {"v": v}
            time.sleep(0.02)
        status = live.status()
        assert status.check_errors > 0
        assert "cannot read the shard map file" in status.last_error
        assert (status.age_s or 0.0) > 0.4
        assert store.shard_map.version == 1
        map_file.write_text(whole)
        deadline = time.monotonic() + 5
        while (live.age_s or 0.0) > 0.3 and time.monotonic() < deadline:
            store.get(pin)
            time.sleep(0.02)
        assert (live.age_s or 0.0) <= 0.3
        assert live.status().last_error == ""
