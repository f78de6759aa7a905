"""`store init --shards A-B` of a config with unique keys, on a MariaDB server of the test's own.

Unique-key rows hash over all the shards, so an init of some shards makes
the unique-key table on the others too: creates, lookups and renames of
objects on A-B work at once. `store relations repair --shards A-B` stays on
A-B and prints JSON under --json, errors too.
"""

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

from store import DuplicateKeyError, Store, StoreConfig
from store.unique import key_shard
from tests.conftest import base_config
from tests.servers import MariaDBServer, free_port

SHARDS = 16
UNIQUE = {"user_by_username": {"type": "user", "field": "username"}}


@pytest.fixture(scope="module")
def server() -> Iterator[MariaDBServer]:
    server = MariaDBServer(free_port())
    try:
        server.start()
        yield server
    finally:
        server.remove()


@pytest.fixture
def config_file(server: MariaDBServer, tmp_path: Path) -> Iterator[Path]:
    """16 shards (new objects on 0-7) with a unique key, on a server with no shard databases yet."""
    drop_shards(server)
    raw = base_config(
        shards=SHARDS,
        open_shards=[0, 7],
        hosts={"A": server.url},
        map=[{"range": [0, SHARDS - 1], "master": "A"}],
        unique=UNIQUE,
    )
    path = tmp_path / "store.yaml"
    path.write_text(yaml.safe_dump(raw))
    yield path
    drop_shards(server)


def sql(server: MariaDBServer, query: str) -> list[tuple[Any, ...]]:
    conn = pymysql.connect(host="127.0.0.1", port=server.port, user="root", autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(query)
            return list(cur.fetchall())
    finally:
        conn.close()


def drop_shards(server: MariaDBServer) -> None:
    for (db,) in sql(
        server, "SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE 'db%'"
    ):
        sql(server, f"DROP DATABASE `{db}`")


def cli(config_file: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "store.cli", *args, "--config", str(config_file)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def tables(server: MariaDBServer, shard: int) -> set[str]:
    found = sql(
        server, f"SELECT table_name FROM information_schema.tables WHERE table_schema = 'db{shard:05d}'"
    )
    return {str(r[0]) for r in found}


def names_hashing_over(shards: range, per_shard: int = 1) -> list[str]:
    """User names whose unique-key rows land on every shard of ``shards``."""
    out: dict[int, list[str]] = {}
    i = 0
    while any(len(out.get(s, [])) < per_shard for s in shards):
        name = f"user{i}"
        out.setdefault(key_shard("user_by_username", name.encode(), SHARDS), []).append(name)
        i += 1
    return [n for s in shards for n in out[s][:per_shard]]


def test_a_partial_init_makes_unique_keys_work_for_its_shards(
    server: MariaDBServer, config_file: Path
) -> None:
    done = cli(config_file, "init", "--shards", "0-7")
    assert done.returncode == 0, done.stderr
    assert "outside --shards" in done.stdout
    assert "8 shard(s)" in done.stdout
    for shard in range(8, SHARDS):  # the unique-key table, nothing else
        assert tables(server, shard) == {"unique_keys"}
    assert "users" in tables(server, 3)

    config = StoreConfig.from_file(config_file)
    names = names_hashing_over(range(SHARDS))  # a key row on each of the 16 shards
    with Store(config) as store:
        ids = {name: store.create("user", {"username": name}) for name in names}
        for name, id_ in ids.items():
            assert store.lookup("user_by_username", name) == id_
        with pytest.raises(DuplicateKeyError):
            store.create("user", {"username": names[-1]})
        for name in names:  # each rename claims a row somewhere among the 16 shards
            store.update(ids[name], {"username": name + "-renamed"})
            assert store.lookup("user_by_username", name + "-renamed") == ids[name]
            assert store.lookup("user_by_username", name) is None

    # The rest of the shards later: their tables join the unique-key table, the keys stay.
    done = cli(config_file, "init")
    assert done.returncode == 0, done.stderr
    assert "outside --shards" not in done.stdout
    assert "users" in tables(server, 12)
    with Store(config) as store:
        assert store.lookup("user_by_username", names[0] + "-renamed") == ids[names[0]]
        store.create("user", {"username": "late"}, shard=12)
        assert store.lookup("user_by_username", "late") is not None


def repair_json(config_file: Path, *args: str) -> tuple[int, dict[str, Any]]:
    done = cli(config_file, "relations", "repair", "--json", *args)
    return done.returncode, json.loads(done.stdout)


def test_repair_stays_inside_its_shards_and_answers_in_json(server: MariaDBServer, config_file: Path) -> None:
    assert cli(config_file, "init", "--shards", "0-7").returncode == 0
    config = StoreConfig.from_file(config_file)
    names = names_hashing_over(range(SHARDS))
    outside = next(n for n in names if key_shard("user_by_username", n.encode(), SHARDS) >= 8)
    with Store(config) as store:
        ids = {name: store.create("user", {"username": name}) for name in names}
        board = store.create("board", {}, shard=2)
        store.link("board_has_pins", board, store.create("pin", {}, shard=6))
    # A row lost on a shard outside 0-7, for an object on 0-7: it is put back there.
    home = key_shard("user_by_username", outside.encode(), SHARDS)
    sql(server, f"DELETE FROM db{home:05d}.unique_keys WHERE value = '{outside}'")

    code, doc = repair_json(config_file, "--shards", "0-7")
    assert code == 0, doc
    assert doc["rows_scanned"] == 2  # the pair and its inverse
    assert doc["unique_keys"]["added"] == {"user_by_username": 1}
    assert doc["unique_keys"]["removed"] == {}
    assert doc["unique_keys"]["checked"] == sum(
        1 for n in names if key_shard("user_by_username", n.encode(), SHARDS) < 8
    )
    with Store(config) as store:
        assert store.lookup("user_by_username", outside) == ids[outside]

    # Errors are JSON too, and exit 1: shards 8-15 have no relation tables yet; a range off the map.
    code, doc = repair_json(config_file, "--shards", "8-15")
    assert code == 1
    assert "store init" in doc["error"]
    assert doc["error_type"] == "ShardNotInitializedError"
    code, doc = repair_json(config_file, "--shards", "0-99")
    assert code == 1
    assert doc == {"error": "--shards 0-99 must lie within 0-15, low before high", "error_type": "IdError"}
