"""Shared fixtures: the store on each backend, and real servers.

Integration tests talk to the real MariaDB on 127.0.0.1:3306. When it is not
reachable they skip on a developer's laptop; with STORE_REQUIRE_SERVICES=1
(set by .ci/run) they fail instead, so CI can never pass on skipped tests.
"""

from __future__ import annotations

import copy
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from store import Store, StoreConfig
from store.admin import init_shards
from store.defaults import EMBEDDED
from tests.servers import start_memcached

#: The admin account of the test MariaDB (init, moves, repairs, DDL the tests make).
MARIADB_URL = os.environ.get("STORE_TEST_MARIADB_URL", "mysql+pymysql://root@127.0.0.1:3306")
TEST_SHARDS = 8
#: The request-path tests run as this application account (no CREATE, DROP, ALTER, GRANT):
#: `app_account` creates it and gives it `store grants`' GRANTs. Its password comes from the
#: environment (password_env), as an application's would.
APP_USER = "store_app_test"
APP_PASSWORD_ENV = "STORE_TEST_APP_PASSWORD"
os.environ.setdefault(APP_PASSWORD_ENV, "app-pw-7f3c1e")


def app_host(admin_url: str = MARIADB_URL) -> dict[str, Any]:
    """A host entry: the application account on ``admin_url``'s server, ``admin_url`` as its admin."""
    from sqlalchemy.engine import make_url

    app = make_url(admin_url).set(username=APP_USER, password=None)
    return {
        "url": app.render_as_string(hide_password=False),
        "password_env": APP_PASSWORD_ENV,
        "admin": {"url": admin_url},
    }


def run_cli(config_file: Path, *args: str) -> str:
    """Run `store ARGS --config FILE` in a process of its own; its stdout (raises if it fails)."""
    done = subprocess.run(
        [sys.executable, "-m", "store.cli", *args, "--config", str(config_file)],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.stdout


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
    raw = {k: copy.deepcopy(v) for k, v in EMBEDDED.items() if k not in ("hosts", "map", "shards", "cache")}
    raw.update(overrides)
    return raw


def root_sql(query: str, *args: Any) -> list[tuple[Any, ...]]:
    """Rows of ``query``, run as root straight on the test MariaDB (3306), in autocommit.

    Without ``args`` the query is sent as written (a ``'%'`` account host needs no doubling)."""
    import pymysql

    conn = pymysql.connect(host="127.0.0.1", port=3306, user="root", autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(query, args or None)
            return list(cur.fetchall())
    finally:
        conn.close()


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
        hosts={"MySQL001A": app_host(), "MySQL002A": app_host()},
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


def make_app_account(config: StoreConfig) -> None:
    """Create the application account afresh and give it exactly `store grants`' GRANTs for ``config``."""
    from store.grants import apply_grants, grant_plan

    password = os.environ[APP_PASSWORD_ENV]
    for g in grant_plan(config, APP_USER):
        assert g.admin_url is not None
        if g.kind == "postgresql":
            import psycopg

            with psycopg.connect(
                host=g.admin_url.host, user=g.admin_url.username, dbname=g.admin_url.database, autocommit=True
            ) as conn:
                found = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (APP_USER,)).fetchone()
                verb = "ALTER" if found else "CREATE"
                conn.execute(
                    f"{verb} ROLE {APP_USER} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD '{password}'"
                )
            continue
        import pymysql

        conn = pymysql.connect(
            host=g.admin_url.host, port=g.admin_url.port or 3306, user="root", autocommit=True
        )
        try:
            with conn.cursor() as cur:
                account = f"'{APP_USER}'@'%%'"  # %% : a literal % beside the %s parameter
                cur.execute(f"CREATE USER IF NOT EXISTS {account} IDENTIFIED BY %s", (password,))
                cur.execute(f"ALTER USER {account} IDENTIFIED BY %s", (password,))
                cur.execute(f"REVOKE ALL PRIVILEGES, GRANT OPTION FROM '{APP_USER}'@'%'")
        finally:
            conn.close()
    apply_grants(grant_plan(config, APP_USER), APP_USER)


@pytest.fixture(scope="session")
def mariadb_ready() -> StoreConfig:
    """The MariaDB test config (the application account), with fresh shards 0-7 made by `init_shards`."""
    require_port("MariaDB", 3306)
    reset_mariadb_shards(range(TEST_SHARDS))
    config = StoreConfig.from_dict(mariadb_config())
    init_shards(config)
    make_app_account(config)
    return config


REDIS_TEST_URL = "redis://127.0.0.1:6379/15"
MEMCACHED_SECOND_PORT = 11212


def memcached_flush(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        sock.sendall(b"flush_all\r\n")
        assert sock.recv(100) == b"OK\r\n"


@pytest.fixture(scope="session")
def memcached_pair() -> Iterator[list[str]]:
    """The memcached on 11211 and a second one the tests start on 11212, both empty."""
    require_port("memcached", 11211)
    second = start_memcached(MEMCACHED_SECOND_PORT)
    try:
        for port in (11211, MEMCACHED_SECOND_PORT):
            memcached_flush(port)
        yield ["127.0.0.1:11211", f"127.0.0.1:{MEMCACHED_SECOND_PORT}"]
    finally:
        second.kill()
        second.wait()


@pytest.fixture(scope="session")
def redis_ready() -> str:
    """Redis on 6379, database 15 emptied for the tests."""
    require_port("Redis", 6379)
    import redis

    redis.Redis.from_url(REDIS_TEST_URL).flushdb()
    return REDIS_TEST_URL


def cached_mariadb_config(memcached: list[str], redis_url: str) -> dict[str, Any]:
    """The MariaDB test config with memcached (two servers) and Redis."""
    raw = mariadb_config()
    raw["cache"] = {"memcached": memcached, "redis": redis_url, "prefix": "t:"}
    return raw


BACKENDS = ("sqlite", "sqlite-memory", "mariadb", "mariadb-cached")
#: Where a module that sets ``BOTH_FACES = True`` runs the ``store`` fixture's tests through
#: `store.aio.AsyncStore` too (two backends, so the suite's time does not double).
ASYNC_FACE_BACKENDS = ("sqlite", "mariadb-cached")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Each store test runs on SQLite and MariaDB, each without and with caches."""
    return str(request.param)


@pytest.fixture
def face() -> str:
    """Which API the ``store`` fixture is: ``sync`` (`Store`), or ``async`` (see `pytest_generate_tests`)."""
    return "sync"


@pytest.hookimpl(tryfirst=True)  # before the fixtures' own params: these replace backend's
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """In a module with ``BOTH_FACES = True``, each test of the ``store`` fixture also runs on the
    async face (`tests.asyncface`: `AsyncStore` behind the sync API) on `ASYNC_FACE_BACKENDS`;
    the sync runs keep their ids (``[sqlite]``), the async ones end in ``-async``. A test that
    parametrizes ``backend`` itself keeps its backends, on the sync face."""
    if not getattr(metafunc.module, "BOTH_FACES", False):
        return
    if "face" not in metafunc.fixturenames or "backend" not in metafunc.fixturenames:
        return
    for mark in metafunc.definition.iter_markers("parametrize"):
        if "backend" in str(mark.args[0]):  # a test that names its own backends: the sync face there
            return
    cases = [pytest.param(b, "sync", id=b) for b in BACKENDS]
    cases += [pytest.param(b, "async", id=f"{b}-async") for b in ASYNC_FACE_BACKENDS]
    metafunc.parametrize(("backend", "face"), cases)


@pytest.fixture
def config(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> StoreConfig:
    """A validated config for ``backend``."""
    if backend == "mariadb":
        ready: StoreConfig = request.getfixturevalue("mariadb_ready")
        return ready
    if backend == "mariadb-cached":
        request.getfixturevalue("mariadb_ready")
        raw = cached_mariadb_config(
            request.getfixturevalue("memcached_pair"), request.getfixturevalue("redis_ready")
        )
        return StoreConfig.from_dict(raw)
    if backend.startswith("postgres"):  # Instagram IDs (modules that list it among their backends)
        request.getfixturevalue("postgres_ready")
        raw = instagram_pg_config()
    else:
        raw = sqlite_config(tmp_path)
    if backend.endswith("-memory"):
        raw["cache"] = {"memory": True}
    return StoreConfig.from_dict(raw)


@pytest.fixture
def store(config: StoreConfig, face: str) -> Iterator[Store]:
    """A store on ``backend`` (through ``face``), closed after the test."""
    from tests.asyncface import blocking_store

    with blocking_store(config, face) as s:
        yield s


def row_count(store: Store, table: str) -> int:
    """Rows of ``table`` over every shard, read straight from the databases."""
    total = 0
    for r in store.shard_map:
        for shard in r.shards():
            h = store.admin_context().engines.shard(shard, r.master)
            with h.connect() as conn:
                cur = conn.cursor()
                cur.execute(f"SELECT COUNT(*) FROM {h.table(table)}")
                total += cur.fetchone()[0]
                cur.close()
    return int(total)


PG_TEST_DB = "storetest"
PG_URL = f"postgresql+psycopg://postgres@127.0.0.1:5432/{PG_TEST_DB}"
IG_SHARDS = 16


def pg_app_host() -> dict[str, Any]:
    """A PostgreSQL host entry: the application role, ``postgres`` as its admin."""
    return {
        "url": PG_URL.replace("postgres@", f"{APP_USER}@"),
        "password_env": APP_PASSWORD_ENV,
        "admin": {"url": PG_URL},
    }


def instagram_pg_config() -> dict[str, Any]:
    """Instagram IDs: 16 logical shards (schemas shard0000-shard0015) under two host names."""
    return base_config(
        ids="instagram",
        shards=IG_SHARDS,
        hosts={"PG1": pg_app_host(), "PG2": pg_app_host()},
        map=[{"range": [0, 7], "master": "PG1"}, {"range": [8, 15], "master": "PG2"}],
    )


@pytest.fixture(scope="session")
def postgres_ready() -> StoreConfig:
    """A fresh PostgreSQL database with the 16 shard schemas made by `init_shards`."""
    require_port("PostgreSQL", 5432)
    import psycopg

    with psycopg.connect("host=127.0.0.1 user=postgres dbname=postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {PG_TEST_DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {PG_TEST_DB}")
    config = StoreConfig.from_dict(instagram_pg_config())
    init_shards(config)
    make_app_account(config)
    return config
