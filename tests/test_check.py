"""`store check`: every shard live exactly once where the live map says; strays, tombstones, drift named."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pymysql
import pytest
import yaml

from store import Store, StoreConfig
from store.admin import check_store, init_shards
from store.admin.move import Mover
from tests.conftest import base_config, sqlite_config
from tests.servers import MariaDBServer, binlog_pair

BHP = "board_has_pins"
POB = "pin_owned_by_board"

pytestmark = pytest.mark.moves


def run_check(config_file: Path, *args: str) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "store.cli", "check", "--config", str(config_file), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, done.stdout


@pytest.fixture
def pair() -> Iterator[tuple[MariaDBServer, MariaDBServer]]:
    with binlog_pair() as servers:
        yield servers


def sql(server: MariaDBServer, *queries: str) -> None:
    conn = pymysql.connect(host="127.0.0.1", port=server.port, user="root", autocommit=True)
    try:
        with conn.cursor() as cur:
            for q in queries:
                cur.execute(q)
    finally:
        conn.close()


def test_after_a_move_an_init_and_a_cleanup_every_shard_is_live_exactly_once(
    pair: tuple[MariaDBServer, MariaDBServer], tmp_path: Path
) -> None:
    source, target = pair
    raw: dict[str, Any] = base_config(
        shards=8,
        hosts={"A": source.url, "B": target.url},
        map=[{"range": [0, 7], "master": "A"}],
        map_source={"file": str(tmp_path / "map.yaml"), "poll_s": 0.2},
    )
    config_file = tmp_path / "store.yaml"
    config_file.write_text(yaml.safe_dump(raw))
    config = StoreConfig.from_dict(raw)
    init_shards(config)
    with Store(config) as store:
        board = store.create("board", {}, shard=1)
        for s in range(8):
            store.link(BHP, board, store.create("pin", {"s": s}, shard=s))
        assert check_store(store, full=True).ok
        mover = Mover(store, tmp_path / "move.json", say=lambda _m: None)
        mover.start(mover.plan(0, 3, "B"))
        init_shards(config)  # an operator re-runs init after the move
        report = check_store(store)
        assert report.ok, [f.line() for f in report.problems]
        assert {f.kind for f in report.notes} == {"tombstone", "archive"}
        mover.cleanup()
    code, out = run_check(config_file, "--json")
    assert code == 0, out
    got = json.loads(out)
    assert got["ok"] is True
    assert got["map_version"] == 2
    assert got["live_exactly_once"] == 8
    assert sorted(n["shard"] for n in got["notes"] if n["kind"] == "tombstone") == [0, 1, 2, 3]
    assert not [n for n in got["notes"] if n["kind"] == "archive"], "cleanup dropped the archives"
    assert got["pairs_checked"] >= 8

    # A hand-made stray copy: shard 5 lives on A; someone made a copy of it on B.
    sql(
        target,
        "CREATE DATABASE db00005",
        "CREATE TABLE db00005.pins (local_id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY, data TEXT)",
    )
    code, out = run_check(config_file)
    assert code == 1
    assert "problem: stray copy: shard 5 on B: a live copy where map version 2 does not put the shard" in out
    code, out = run_check(config_file, "--json")
    assert code == 1
    problems = json.loads(out)["problems"]
    assert [(p["kind"], p["shard"], p["server"]) for p in problems] == [("stray copy", 5, "B")]


def test_check_names_a_missing_table_a_drifted_count_and_a_lost_inverse(tmp_path: Path) -> None:
    config = StoreConfig.from_dict(sqlite_config(tmp_path))
    init_shards(config)
    with Store(config) as store:
        board = store.create("board", {}, shard=1)
        pins = [store.create("pin", {}, shard=5) for _ in range(3)]
        for p in pins:
            store.link(BHP, board, p)
        assert check_store(store, full=True).ok
        b1 = store.admin_context().engines.shard(1, "A")
        with b1.connect() as conn:
            conn.cursor().execute(f"UPDATE relation_counts SET n = 7 WHERE from_id = {board}")
        b5 = store.admin_context().engines.shard(5, "B")
        with b5.connect() as conn:
            conn.cursor().execute(f"DELETE FROM {POB} WHERE from_id = {pins[0]}")
        with store.admin_context().engines.shard(6, "B").connect() as conn:
            conn.cursor().execute("DROP TABLE users")
        store.admin_context().engines.dispose()
        for full in (False, True):
            report = check_store(store, full=full)
            kinds = sorted((f.kind, f.shard) for f in report.problems)
            # The row deleted by hand also leaves its own list's count too high.
            assert kinds == [("count", 1), ("count", 5), ("inverse", 1), ("missing tables", 6)], (full, kinds)
            by_kind = {(f.kind, f.shard): f for f in report.problems}
            assert by_kind[("count", 1)].detail == f"{BHP} of {board} counts 7, holds 3"
            assert by_kind[("count", 5)].detail == f"{POB} of {pins[0]} counts 1, holds 0"
            assert (
                by_kind[("inverse", 1)].detail
                == f"{BHP} {board} -> {pins[0]} has no {POB} {pins[0]} -> {board}"
            )
            assert by_kind[("missing tables", 6)].fix == "store init --shards 6-6"


def test_sqlite_shards_not_made_yet_are_a_note(tmp_path: Path) -> None:
    with Store(StoreConfig.from_dict(sqlite_config(tmp_path))) as store:
        store.create("pin", {}, shard=2)  # SQLite makes a shard's file on first use
        report = check_store(store)
    assert report.ok
    assert [(f.kind, f.detail) for f in report.notes] == [
        ("not created yet", "shards 0-1: no copy where map version 1 puts them"),
        ("not created yet", "shard 3: no copy where map version 1 puts it"),
        ("not created yet", "shards 4-7: no copy where map version 1 puts them"),
    ]
