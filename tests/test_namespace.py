"""Namespaces (config ``namespace: NAME``): two stores share one MariaDB, PostgreSQL, memcached and Redis.

Each namespace's databases, schemas, map table, invalidation log, ticket
counters and cache keys carry its name; the stores here use the same shard
numbers (and so, on MariaDB, the same IDs) and each must see only its own
data, while running at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pymysql
import pytest

from store import Store, StoreConfig
from store.admin import check_store, init_shards
from store.backends import backend_for
from store.config import CacheConfig, TicketsConfig
from store.exceptions import ConfigError, DuplicateKeyError
from store.grants import apply_grants, grant_plan
from store.naming import DEFAULT_NAMES, Names
from tests.conftest import (
    MARIADB_URL,
    MEMCACHED_PORTS,
    NAMES,
    NAMESPACE,
    PG_TEST_DB,
    PG_URL,
    REDIS_TEST_URL,
    base_config,
    memcached_flush,
    require_port,
    root_sql,
)

#: Two namespaces of this test process's own (`NAMESPACE` + a letter), so that two runs at once
#: never share them.
A, B = NAMESPACE + "a", NAMESPACE + "b"
SHARDS = 4
UNIQUE = {"user_by_username": {"type": "user", "field": "username"}}
BHP, ULP = "board_has_pins", "users_likes_pins"


# -- names, without servers ------------------------------------------------------------------


def test_no_namespace_keeps_todays_names() -> None:
    n = Names()
    assert n == DEFAULT_NAMES
    assert (n.database_name(42), n.schema_name(42)) == ("db00042", "shard0042")
    assert (n.meta_database, n.log_database, n.tickets_database) == ("store_meta", "store_log", "tickets")
    assert n.archive("db00042") == "moved_db00042"
    assert n.archive("shard0042") == "moved_shard0042"
    assert n.cache_prefix("s:") == "s:"
    assert n.replication_name == "store_move"
    assert n.zookeeper_path == "/store/shardmap"
    assert (n.databases_like, n.archive_databases_like) == ("db_____", "moved\\_db_____")
    raw = base_config(shards=4, hosts={"h": "sqlite:///x"}, map=[{"range": [0, 3], "master": "h"}])
    config = StoreConfig.from_dict(raw)
    assert config.names == DEFAULT_NAMES
    assert config.namespace is None
    assert config.tickets is None


def test_a_namespace_prefixes_every_name() -> None:
    n = Names("app")
    assert (n.database_name(42), n.schema_name(42)) == ("app_db00042", "app_shard0042")
    assert (n.meta_database, n.log_database, n.tickets_database) == (
        "app_store_meta",
        "app_store_log",
        "app_tickets",
    )
    assert n.archive("app_db00042") == "app_moved_db00042"
    assert n.unarchive("app_moved_shard0042") == "app_shard0042"
    assert n.cache_prefix("s:") == "app:s:"
    assert n.replication_name == "app_store_move"
    assert n.zookeeper_path == "/store/app/shardmap"
    # `_` is a LIKE wildcard: escaped, so app_db% cannot match appXdb00001.
    assert n.databases_like == "app\\_db_____"
    assert n.schemas_like == "app\\_shard____"
    assert n.archive_schemas_like == "app\\_moved\\_shard____"
    assert (
        n.database_shard("app_db00042"),
        n.database_shard("db00042"),
        n.database_shard("bpp_db00042"),
    ) == (
        42,
        None,
        None,
    )
    assert DEFAULT_NAMES.database_shard("app_db00042") is None
    with pytest.raises(ValueError, match="not a name of namespace"):
        n.archive("db00042")
    longest = Names("a" * 16)
    assert len(longest.archive(longest.schema_name(8191))) <= 63


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ("", "lower-case letter"),
        ("App", "lower-case letter"),
        ("a_b", "no '_'"),
        ("a-b", "no '_' or '-'"),
        ("1ab", "lower-case letter"),
        ("a" * 17, "up to 15"),
        (5, "got int"),
        ("moved", "reserved"),
        ("pg", "reserved"),
    ],
)
def test_bad_namespaces_are_refused_naming_the_fix(bad: object, says: str) -> None:
    raw = base_config(
        shards=4, namespace=bad, hosts={"h": "sqlite:///x"}, map=[{"range": [0, 3], "master": "h"}]
    )
    with pytest.raises(ConfigError, match="namespace") as err:
        StoreConfig.from_dict(raw)
    assert says in str(err.value)


def test_config_namespace_reaches_tickets_and_grants() -> None:
    raw = _mariadb_raw(A)
    raw["tickets"] = {"servers": [MARIADB_URL]}
    config = StoreConfig.from_dict(raw)
    assert config.namespace == A
    assert config.tickets is not None
    assert config.tickets.database == f"{A}_tickets"
    assert backend_for(config.hosts["M1"], config.names).namespace(3) == f"{A}_db00003"
    statements = [s for g in grant_plan(config, "someone") for s in g.statements]
    # `_` is a wildcard in a GRANT's database name: escaped, each grant names one database.
    assert all("`" not in s or "_db" not in s or "\\_db" in s for s in statements)
    named = sorted({s.split("`")[1].replace("\\_", "_") for s in statements})
    assert named == [*[f"{A}_db0000{i}" for i in range(SHARDS)], f"{A}_store_log", f"{A}_store_meta"]
    pg = StoreConfig.from_dict(_pg_raw(A))
    statements = [s for g in grant_plan(pg, "someone") for s in g.statements]
    schemas = {s.split('"')[1] for s in statements if "SCHEMA" in s}
    assert schemas == {f"{A}_shard000{i}" for i in range(SHARDS)}


def test_two_namespaces_in_one_sqlite_folder(tmp_path: Path) -> None:
    stores = [Store(StoreConfig.from_dict(_sqlite_raw(ns, tmp_path))) for ns in (A, B)]
    try:
        made = _run_both(stores, _workload)
        assert made[0] == made[1]  # same shards, same files' sequences: the same IDs
        for store, ns in zip(stores, (A, B), strict=True):
            _verify(store, ns, made[0])
    finally:
        for s in stores:
            s.close()
    files = sorted(p.name for p in (tmp_path / "data").iterdir() if p.suffix == ".sqlite3")
    assert files == sorted(f"{ns}_db0000{i}.sqlite3" for ns in (A, B) for i in range(SHARDS))


def test_local_config_and_the_tests_use_different_namespaces() -> None:
    from tests.conftest import instagram_pg_config, mariadb_config

    local = StoreConfig.from_file(Path(__file__).resolve().parent.parent / "config" / "local.yaml")
    assert local.namespace == "dev"
    assert backend_for(local.hosts["MySQL001A"], local.names).namespace(0) == "dev_db00000"
    for raw in (mariadb_config(), instagram_pg_config()):
        assert StoreConfig.from_dict(raw).namespace != local.namespace


# -- MariaDB, memcached, Redis ---------------------------------------------------------------


@pytest.fixture
def mariadb_namespaces(own_caches: None) -> Iterator[None]:
    """Nothing of namespaces A and B on the test MariaDB, before and after."""
    require_port("MariaDB", 3306)
    _forget_cached()
    _drop_mariadb_namespaces()
    yield
    _drop_mariadb_namespaces()


def _forget_cached() -> None:
    """No cache entries of an earlier run: the IDs come back with other objects behind them."""
    import redis

    memcached_flush(MEMCACHED_PORTS[0])
    client = redis.Redis.from_url(REDIS_TEST_URL)
    for ns in (A, B):
        for key in client.scan_iter(match=f"{ns}:*", count=1000):
            client.delete(key)


def test_two_namespaces_share_mariadb_memcached_and_redis(mariadb_namespaces: None) -> None:
    configs = [StoreConfig.from_dict(_mariadb_raw(ns)) for ns in (A, B)]
    before = _databases()
    init_shards(configs[0])
    after_a = _databases()
    mine = {f"{A}_db0000{i}" for i in range(SHARDS)} | {f"{A}_store_meta", f"{A}_store_log"}
    assert after_a - before == mine
    assert before - after_a == set()
    init_shards(configs[1])
    after_b = _databases()
    assert after_b - after_a == {d.replace(f"{A}_", f"{B}_") for d in mine}
    # Each namespace's backend finds its own databases only; the default finds neither.
    for config, ns in ((configs[0], A), (configs[1], B), (replace(configs[0], names=DEFAULT_NAMES), None)):
        backend = backend_for(config.for_admin().hosts["M1"], config.names)
        with _root() as cur:
            found = {name for name, _what in backend.existing(cur)}
        if ns is None:
            assert not {n for n in found if n.startswith((f"{A}_", f"{B}_"))}
        else:
            assert found == {f"{ns}_db0000{i}" for i in range(SHARDS)}

    stores = [Store(c) for c in configs]
    uncached = [Store(replace(c, cache=CacheConfig())) for c in configs]
    try:
        made = _run_both(stores, _workload)
        # The same shard numbers on one server: the same AUTO_INCREMENT values, the same IDs.
        assert made[0] == made[1]
        for group in (stores, uncached, stores):  # cached, from the databases, cached again
            for store, ns in zip(group, (A, B), strict=True):
                _verify(store, ns, made[0])
        # Cache keys differ by namespace, and hold each namespace's own object.
        u0 = made[0]["users"][0]
        keys = [s.cache_key(u0) for s in stores]
        assert keys[0].startswith(f"{A}:t:")
        assert keys[1].startswith(f"{B}:t:")
        # A write in one namespace leaves the other's cached copy alone.
        stores[0].update(u0, {"note": "a only"})
        assert stores[0].get(u0)["note"] == "a only"
        assert "note" not in (stores[1].get(u0) or {})
        assert "note" not in (uncached[1].get(u0) or {})
        # Unique values are per namespace: B may take what A holds.
        assert stores[0].lookup("user_by_username", "shared") is None
        made_a = stores[0].create("user", {"username": "shared", "ns": A}, shard=0)
        made_b = stores[1].create("user", {"username": "shared", "ns": B}, shard=0)
        assert made_a == made_b
        assert [s.lookup("user_by_username", "shared") for s in stores] == [made_a, made_b]
        with pytest.raises(DuplicateKeyError):
            stores[1].create("user", {"username": "shared"}, shard=1)

        # check reads its own namespace only: no stray copies from the other, the default's db0000N
        # or the archives of either; it changes nothing.
        before_check = _databases()
        for store in stores:
            report = check_store(store, full=True)
            assert report.ok, report.problems
            assert report.notes == []
        assert _databases() == before_check
    finally:
        for s in (*stores, *uncached):
            s.close()


def test_grants_give_one_namespace_only(mariadb_namespaces: None) -> None:
    configs = [StoreConfig.from_dict(_mariadb_raw(ns)) for ns in (A, B)]
    for c in configs:
        init_shards(c)
    user = f"ns_{NAMESPACE}"
    root_sql(f"DROP USER IF EXISTS '{user}'@'%'")
    root_sql(f"CREATE USER '{user}'@'%' IDENTIFIED BY 'ns-pw-5b1d'")
    try:
        before = _databases()
        apply_grants(grant_plan(configs[0], user), user)
        assert _databases() == before
        rows = root_sql(
            "SELECT DISTINCT Db FROM mysql.db WHERE User = %s ORDER BY Db", user
        )  # the grants as the server keeps them
        assert [str(r[0]).replace("\\_", "_") for r in rows] == sorted(
            [*[f"{A}_db0000{i}" for i in range(SHARDS)], f"{A}_store_log", f"{A}_store_meta"]
        )
        conn = pymysql.connect(host="127.0.0.1", port=3306, user=user, password="ns-pw-5b1d", autocommit=True)
        try:
            with conn.cursor() as cur:
                cur.execute(f"SELECT COUNT(*) FROM {A}_db00000.users")
                for other in (f"{B}_db00000", "db00000"):
                    with pytest.raises(pymysql.err.OperationalError) as denied:
                        cur.execute(f"SELECT COUNT(*) FROM {other}.users")
                    assert denied.value.args[0] in (1044, 1142)
                cur.execute("SHOW DATABASES")
                seen = {str(r[0]) for r in cur.fetchall()} - {"information_schema"}
            assert seen == {f"{A}_db0000{i}" for i in range(SHARDS)} | {f"{A}_store_log", f"{A}_store_meta"}
        finally:
            conn.close()
    finally:
        root_sql(f"DROP USER IF EXISTS '{user}'@'%'")


def test_ticket_counters_per_namespace(mariadb_namespaces: None) -> None:
    from store.tickets import TicketAllocator

    allocators = [
        TicketAllocator(TicketsConfig.from_dict({"servers": [MARIADB_URL]}, names=Names(ns))) for ns in (A, B)
    ]
    try:
        for alloc in allocators:
            alloc.init()
        firsts = [[alloc.next() for _ in range(3)] for alloc in allocators]
        assert firsts[0] == firsts[1]  # dense per namespace: neither took the other's IDs
        assert firsts[0] == list(range(firsts[0][0], firsts[0][0] + 3))
        assert {f"{A}_tickets", f"{B}_tickets"} <= _databases()
    finally:
        for alloc in allocators:
            alloc.close()


# -- PostgreSQL --------------------------------------------------------------------------------


def test_two_namespaces_share_a_postgres_database(postgres_ready: StoreConfig, own_caches: None) -> None:
    _forget_cached()
    _drop_pg_namespaces()
    try:
        configs = [StoreConfig.from_dict(_pg_raw(ns, cache=True)) for ns in (A, B)]
        before = _schemas()
        init_shards(configs[0])
        after_a = _schemas()
        assert after_a - before == {f"{A}_shard000{i}" for i in range(SHARDS)}
        init_shards(configs[1])
        assert _schemas() - after_a == {f"{B}_shard000{i}" for i in range(SHARDS)}
        # The default shard schemas of the test database are still there, and untouched by init.
        assert {NAMES.schema_name(i) for i in range(16)} <= _schemas()
        stores = [Store(c) for c in configs]
        uncached = [Store(replace(c, cache=CacheConfig())) for c in configs]
        try:
            made = _run_both(stores, _workload)
            for group in (stores, uncached):
                for store, ns, own in zip(group, (A, B), made, strict=True):
                    _verify(store, ns, own)
            # Instagram IDs carry the time: the two namespaces' IDs differ, and each namespace's
            # IDs are absent from the other (same schema numbers, their own tables).
            theirs = set(made[1]["users"]) - set(made[0]["users"])
            assert theirs
            assert all(stores[0].get(i, type_name="user") is None for i in theirs)
            before_check = _schemas()
            for store in stores:
                report = check_store(store, full=True)
                assert report.ok, report.problems
            assert _schemas() == before_check
        finally:
            for s in (*stores, *uncached):
                s.close()
    finally:
        _drop_pg_namespaces()


# -- the workload both namespaces run at once ------------------------------------------------


def _workload(store: Store, ns: str) -> dict[str, list[int]]:
    """Objects and relations: creates (unique keys), updates, renames, deletes, links, unlinks, reads."""
    users, boards, pins = [], [], []
    for i in range(12):
        u = store.create("user", {"username": f"name{i}", "ns": ns, "i": i}, shard=i % SHARDS)
        b = store.create("board", {"ns": ns, "i": i}, near=u)
        users.append(u)
        boards.append(b)
        for k in range(3):
            p = store.create("pin", {"ns": ns, "i": i, "k": k}, near=b)
            pins.append(p)
            assert store.link(BHP, b, p, sequence=k + 1)
            assert store.link(ULP, u, p, sequence=k + 1)
        assert store.count(BHP, b) == 3
        assert store.page(BHP, b).ids == pins[-3:]
        assert store.lookup("user_by_username", f"name{i}") == u
    for i, u in enumerate(users):
        if i % 2 == 0:
            store.update(u, {"username": f"renamed{i}"}, type_name="user")
        assert store.get(u, type_name="user")["ns"] == ns
    for i, b in enumerate(boards):
        if i % 3 == 0:
            assert store.unlink(BHP, b, pins[3 * i])
    for i in range(0, len(pins), 5):
        assert store.delete(pins[i], type_name="pin")
    return {"users": users, "boards": boards, "pins": pins}


def _verify(store: Store, ns: str, made: dict[str, list[int]]) -> None:
    """What `_workload` left, as ``store`` sees it: its own namespace's objects, exact counts."""
    users, boards, pins = made["users"], made["boards"], made["pins"]
    for i, u in enumerate(users):
        name = f"renamed{i}" if i % 2 == 0 else f"name{i}"
        got = store.get(u, type_name="user")
        assert got is not None
        assert (got["ns"], got["i"], got["username"]) == (ns, i, name)
        assert store.lookup("user_by_username", name) == u
        assert store.lookup("user_by_username", f"name{i}") == (None if i % 2 == 0 else u)
    deleted = set(pins[0::5])
    got_pins = store.get_many(pins, type_name="pin")
    assert set(got_pins) == set(pins) - deleted
    assert all(v["ns"] == ns for v in got_pins.values())
    for i, b in enumerate(boards):
        assert store.get(b, type_name="board") == {"ns": ns, "i": i}
        mine = [p for k, p in enumerate(pins[3 * i : 3 * i + 3]) if not (i % 3 == 0 and k == 0)]
        live = [p for p in mine if p not in deleted]
        assert store.page(BHP, b).ids == live
        assert store.count(BHP, b) == len(live)
    for i, u in enumerate(users):
        live = [p for p in pins[3 * i : 3 * i + 3] if p not in deleted]
        assert store.count(ULP, u) == len(live)
        assert store.links(ULP, u) == live


def _run_both(
    stores: list[Store], work: Callable[[Store, str], dict[str, list[int]]]
) -> list[dict[str, list[int]]]:
    """``work`` on both stores at once, in two threads; their results in order."""
    results: list[dict[str, list[int]] | None] = [None, None]
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def run(n: int) -> None:
        try:
            start.wait()
            results[n] = work(stores[n], (A, B)[n])
        except BaseException as exc:  # re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    assert results[0] is not None
    assert results[1] is not None
    return [results[0], results[1]]


# -- configs and server helpers ----------------------------------------------------------------


def _mariadb_raw(ns: str) -> dict[str, Any]:
    """Four shards on the test MariaDB (two host names), caches on, a map table, the logs followed."""
    return base_config(
        namespace=ns,
        shards=SHARDS,
        hosts={"M1": MARIADB_URL, "M2": MARIADB_URL},
        map=[{"range": [0, 1], "master": "M1"}, {"range": [2, 3], "master": "M2"}],
        unique=UNIQUE,
        map_source={"table": MARIADB_URL},
        cache={
            "memcached": [f"127.0.0.1:{MEMCACHED_PORTS[0]}"],
            "redis": REDIS_TEST_URL,
            "prefix": "t:",
            "follow": True,
        },
    )


def _pg_raw(ns: str, *, cache: bool = False) -> dict[str, Any]:
    """Instagram IDs: four schemas in the test PostgreSQL database (the admin role)."""
    raw = base_config(
        namespace=ns,
        ids="instagram",
        shards=SHARDS,
        hosts={"P1": PG_URL, "P2": PG_URL},
        map=[{"range": [0, 1], "master": "P1"}, {"range": [2, 3], "master": "P2"}],
        unique=UNIQUE,
    )
    if cache:
        raw["cache"] = {
            "memcached": [f"127.0.0.1:{MEMCACHED_PORTS[0]}"],
            "redis": REDIS_TEST_URL,
            "prefix": "t:",
        }
    return raw


def _sqlite_raw(ns: str, folder: Path) -> dict[str, Any]:
    return base_config(
        namespace=ns,
        shards=SHARDS,
        hosts={"L": f"sqlite:///{folder}/data"},
        map=[{"range": [0, SHARDS - 1], "master": "L"}],
        unique=UNIQUE,
        cache={"memory": True},
    )


@contextmanager
def _root() -> Iterator[Any]:
    """A root cursor on the test MariaDB."""
    conn = pymysql.connect(host="127.0.0.1", port=3306, user="root", autocommit=True)
    try:
        yield conn.cursor()
    finally:
        conn.close()


def _databases() -> set[str]:
    """The test MariaDB's databases of this test process's namespaces.

    Other test runs, benchmarks and a developer's `config/local.yaml` store share the server and
    make and drop their own databases at any moment; this process can speak for its own only.
    """
    return {n for n in (str(r[0]) for r in root_sql("SHOW DATABASES")) if n.startswith(NAMESPACE)}


def _drop_mariadb_namespaces() -> None:
    for db in _databases():
        if db.startswith((f"{A}_", f"{B}_")):
            root_sql(f"DROP DATABASE IF EXISTS `{db}`")


def _pg(sql: str, *args: Any) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(f"host=127.0.0.1 user=postgres dbname={PG_TEST_DB}", autocommit=True) as conn:
        cur = conn.execute(sql, args or None)
        return list(cur.fetchall()) if cur.description else []


def _schemas() -> set[str]:
    return {str(r[0]) for r in _pg("SELECT nspname FROM pg_namespace")}


def _drop_pg_namespaces() -> None:
    for schema in _schemas():
        if schema.startswith((f"{A}_", f"{B}_")):
            _pg(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


# -- a move in one namespace ------------------------------------------------------------------


@pytest.mark.moves
def test_a_move_in_one_namespace_leaves_the_other_alone(tmp_path: Path) -> None:
    from store.admin.move import Mover
    from tests.servers import binlog_pair, free_port

    with binlog_pair(free_port(), free_port()) as (source, target):

        def raw(ns: str) -> dict[str, Any]:
            return base_config(
                namespace=ns,
                shards=8,
                hosts={"S": source.url, "T": target.url},
                map=[{"range": [0, 7], "master": "S"}],
                map_source={"file": str(tmp_path / f"{ns}-map.yaml"), "poll_s": 0.2},
            )

        configs = [StoreConfig.from_dict(raw(ns)) for ns in (A, B)]
        for c in configs:
            init_shards(c)
        stores = [Store(c) for c in configs]
        try:
            pins = [
                [s.create("pin", {"ns": ns, "n": n}, shard=n) for n in range(8)]
                for s, ns in zip(stores, (A, B), strict=True)
            ]
            assert pins[0] == pins[1]
            Mover(stores[0], tmp_path / "move.json", say=lambda _m: None).start(
                Mover(stores[0], tmp_path / "move.json", say=lambda _m: None).plan(4, 7, "T")
            )
            on_source = {str(r[0]) for r in _rows(source.port, "SHOW DATABASES")}
            on_target = {str(r[0]) for r in _rows(target.port, "SHOW DATABASES")}
            assert {f"{A}_moved_db0000{i}" for i in range(4, 8)} <= on_source
            assert {f"{B}_db0000{i}" for i in range(8)} <= on_source
            assert not {d for d in on_source if d.startswith(f"{B}_moved") or d.startswith("moved_")}
            assert {d for d in on_target if d.startswith((f"{A}_", f"{B}_"))} == {
                f"{A}_db0000{i}" for i in range(4, 8)
            }
            # nsa's moved shards have tombstones; nsb's shards of the same numbers serve on.
            tomb = _rows(
                source.port,
                "SELECT table_schema FROM information_schema.tables WHERE table_name = 'store_tombstone'",
            )
            assert {str(r[0]) for r in tomb} == {f"{A}_db0000{i}" for i in range(4, 8)}
            for s, ns, own in zip(stores, (A, B), pins, strict=True):
                s.refresh_map(force=True)
                assert [s.get(p)["ns"] for p in own] == [ns] * 8
                assert s.update(own[5], {"after": True})["ns"] == ns
            assert stores[0].shard_map.master(5) == "T"
            assert stores[1].shard_map.master(5) == "S"
            notes = check_store(stores[0]).notes
            assert {n.detail.split()[0] for n in notes if n.kind == "archive"} == {
                f"{A}_moved_db0000{i}" for i in range(4, 8)
            }
            assert check_store(stores[1]).ok
            dropped = Mover(stores[0], tmp_path / "move.json", say=lambda _m: None).cleanup()
            assert sorted(dropped) == [f"{A}_moved_db0000{i}" for i in range(4, 8)]
            assert {f"{B}_db0000{i}" for i in range(8)} <= {
                str(r[0]) for r in _rows(source.port, "SHOW DATABASES")
            }
        finally:
            for s in stores:
                s.close()


def _rows(port: int, sql: str) -> list[tuple[Any, ...]]:
    conn = pymysql.connect(host="127.0.0.1", port=port, user="root", autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return list(cur.fetchall())
    finally:
        conn.close()
