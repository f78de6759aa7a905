"""Shared fixtures: the store on each backend, and real servers.

Integration tests talk to the real MariaDB on 127.0.0.1:3306. When it is not
reachable they skip on a developer's laptop; with STORE_REQUIRE_SERVICES=1
(set by .ci/run) they fail instead, so CI can never pass on skipped tests.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from store import Store, StoreConfig
from store.admin import init_shards
from store.defaults import EMBEDDED

MARIADB_URL = os.environ.get("STORE_TEST_MARIADB_URL", "mysql+pymysql://root@127.0.0.1:3306")
TEST_SHARDS = 8


def require_port(name: str, port: int, host: str = "127.0.0.1") -> None:
    """Skip (or, in CI, fail) unless a server listens on host:port."""
    try:
        with socket.create_connection((host, port), timeout=1):
            return
    except OSError:
        msg = f"{name} is not reachable on {host}:{port}"
        if os.environ.get("STORE_REQUIRE_SERVICES") == "1":
            pytest.fail(msg + " (STORE_REQUIRE_SERVICES=1: run scripts/services.sh)")
        pytest.skip(msg)


def base_config(**overrides: Any) -> dict[str, Any]:
    """The embedded default's types and relations with other hosts and map."""
    raw = {k: v for k, v in EMBEDDED.items() if k not in ("hosts", "map", "shards")}
    raw.update(overrides)
    return raw


def sqlite_config(folder: Path) -> dict[str, Any]:
    """Eight shards in SQLite files, split over two host folders."""
    return base_config(
        shards=TEST_SHARDS,
        hosts={"A": f"sqlite:///{folder}/a", "B": f"sqlite:///{folder}/b"},
        map=[{"range": [0, 3], "master": "A"}, {"range": [4, 7], "master": "B"}],
    )


def mariadb_config() -> dict[str, Any]:
    """Eight shards on the one MariaDB, under two host names (to exercise per-host batching)."""
    return base_config(
        shards=TEST_SHARDS,
        hosts={"MySQL001A": MARIADB_URL, "MySQL002A": MARIADB_URL},
        map=[
            {"range": [0, 3], "master": "MySQL001A", "slave": "MySQL002A"},
            {"range": [4, 7], "master": "MySQL002A"},
        ],
    )


def reset_mariadb_shards(shards: range) -> None:
    """Drop and re-create the test shards so every session starts empty."""
    import pymysql

    conn = pymysql.connect(host="127.0.0.1", port=3306, user="root", autocommit=True)
    try:
        with conn.cursor() as cur:
            for s in shards:
                cur.execute(f"DROP DATABASE IF EXISTS db{s:05d}")
    finally:
        conn.close()


@pytest.fixture(scope="session")
def mariadb_ready() -> StoreConfig:
    """The MariaDB test config, with fresh shards 0-7 created by `init_shards`."""
    require_port("MariaDB", 3306)
    reset_mariadb_shards(range(TEST_SHARDS))
    config = StoreConfig.from_dict(mariadb_config())
    init_shards(config)
    return config


@pytest.fixture(params=["sqlite", "mariadb"])
def backend(request: pytest.FixtureRequest) -> str:
    """Each store test runs once per backend."""
    return str(request.param)


@pytest.fixture
def config(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> StoreConfig:
    """A validated config for ``backend``."""
    if backend == "mariadb":
        ready: StoreConfig = request.getfixturevalue("mariadb_ready")
        return ready
    return StoreConfig.from_dict(sqlite_config(tmp_path))


@pytest.fixture
def store(config: StoreConfig) -> Iterator[Store]:
    """A store on ``backend``, closed after the test."""
    with Store(config) as s:
        yield s


def row_count(store: Store, table: str) -> int:
    """Rows of ``table`` over every shard, read straight from the databases."""
    total = 0
    for r in store.shard_map:
        for shard in r.shards():
            h = store.engines.shard(shard, r.master)
            with h.connect() as conn:
                cur = conn.cursor()
                cur.execute(f"SELECT COUNT(*) FROM {h.table(table)}")
                total += cur.fetchone()[0]
                cur.close()
    return int(total)
