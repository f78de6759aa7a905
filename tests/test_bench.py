"""`store bench` runs every case on each backend and reports ratios (no timing asserts)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from store import Store
from store.cli import main
from store.config import StoreConfig
from store.tools.bench import format_results, run_bench
from tests.conftest import instagram_pg_config, mariadb_config


def test_bench_reports_every_case(store: Store) -> None:
    results = run_bench(store, n=60)
    expected = ["create", "get", "get_many(50)", "page 1", "page 200 cursor", "page 200 offset", "count"]
    expected += ["has_links(500)", "board_pins_many(20)", "create_many(100)", "link_many(100)"]
    if store.config.cache.memcached or store.config.cache.redis:
        expected += ["cached create_many(100)", "cached link_many(100)"]
    if store.config.cache.memcached and store.config.cache.redis:
        expected += ["warm get", "warm get_many(50)", "warm board page"]
        expected += ["warm has_links(500)", "warm board_pins_many(20)"]
    assert [r.case for r in results] == expected
    for r in results:
        for v in (r.store_median_us, r.raw_median_us, r.store_p99_us, r.raw_p99_us):
            assert math.isfinite(v)
            assert v > 0
        assert r.as_dict()["ratio_median"] == r.store_median_us / r.raw_median_us
    table = format_results(results)
    assert table.splitlines()[0].startswith("case")
    assert len(table.splitlines()) == len(expected) + 2
    assert "cursor page 200 (depth 9,950) costs" in table


def test_bench_runs_to_the_end_on_postgres_with_caches(
    postgres_ready: StoreConfig, memcached_pair: list[str], redis_ready: str, tmp_path: Path
) -> None:
    """`store bench` on an Instagram config with memcached and Redis: every case, every ratio."""
    raw = instagram_pg_config()
    raw["cache"] = {"memcached": memcached_pair, "redis": redis_ready, "prefix": "tb:"}
    path = tmp_path / "instagram.yaml"
    path.write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(main, ["bench", "-n", "20", "--config", str(path), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    cases = [r["case"] for r in doc["results"]]
    assert cases == [
        "create (instagram)",
        "get",
        "get_many(50)",
        "page 1",
        "page 200 cursor",
        "page 200 offset",
        "count",
        "has_links(500)",
        "board_pins_many(20)",
        "create_many(100)",
        "link_many(100)",
        "cached create_many(100)",
        "cached link_many(100)",
        "warm get",
        "warm get_many(50)",
        "warm board page",
        "warm has_links(500)",
        "warm board_pins_many(20)",
    ]
    assert all(math.isfinite(r["ratio_median"]) and r["ratio_median"] > 0 for r in doc["results"])


def test_bench_runs_only_the_cases_asked_for(store: Store) -> None:
    """``--cases create_many,link_many``: those two rows and no other; a name of no case is refused."""
    from store.tools.bench import Wanted

    results = run_bench(store, n=40, cases=Wanted(["create_many", "link_many"]))
    assert [r.case for r in results] == ["create_many(100)", "link_many(100)"]
    assert [r.case for r in run_bench(store, n=20, cases=Wanted(["get"]))] == ["get"]
    if store.config.cache.redis:  # the batch writes again on the store with its caches
        cached = run_bench(store, n=20, cases=Wanted(["cached link_many"]))
        assert [r.case for r in cached] == ["cached link_many(100)"]
    result = CliRunner().invoke(main, ["bench", "--cases", "create_many,nosuch"])
    assert result.exit_code == 2
    assert "no bench case is named 'nosuch'" in result.output


def test_the_floors_use_the_drivers_own_cursor_unless_asked_for_the_stores(store: Store) -> None:
    """The floors' statements go through PyMySQL's plain ``Cursor`` (a hand-written program's), even on
    the store's own connection class; ``driver_cursor=False`` keeps the store's quicker cursor."""
    import pymysql.connections
    import pymysql.cursors

    from store.tools.bench import _PooledCursor

    shard = store.config.open_shards[0][0]
    h = store.admin_context().engines.shard(shard, store.shard_map.master(shard))

    def cursor_class(floor: _PooledCursor) -> tuple[type, object]:
        floor.execute("SELECT 1", ())
        try:
            return type(floor._cur), floor._held[0].raw if floor._held else None
        finally:
            floor.fetchall()

    driver, raw = cursor_class(_PooledCursor(h))
    strict, _ = cursor_class(_PooledCursor(h, driver_cursor=False))
    if isinstance(raw, pymysql.connections.Connection):
        assert type(raw).__module__.startswith("store."), "the store's own connection class"
        assert driver is pymysql.cursors.Cursor
        assert strict is not pymysql.cursors.Cursor
        assert issubclass(strict, pymysql.cursors.Cursor)
    else:
        assert driver is strict
    with pytest.raises(ValueError, match="floor_cursor is 'driver' or 'store'"):
        run_bench(store, n=1, floor_cursor="mine")


@pytest.mark.parametrize("servers", [1, 2])
def test_the_link_floor_drops_its_cached_lists_on_the_server_of_each(
    mariadb_ready: StoreConfig, redis_ready: str, servers: int
) -> None:
    """With lists cached in Redis, `link_many`'s floor deletes its own lists' keys, as a program
    that caches lists must: each on the server the store's placement gives it."""
    import redis

    from store.tools.bench_bulk import _list_drops

    base = redis_ready.rpartition("/")[0]
    urls = [f"{base}/{db}" for db in (13, 14)][:servers]
    raw = {**mariadb_config(), "cache": {"redis": urls if servers > 1 else urls[0], "prefix": "fl:"}}
    clients = [redis.Redis.from_url(u) for u in urls]
    keys = [f"bench:raw:{kind}:pin_owned_by_board:{i}" for i in range(40) for kind in ("l", "c")]
    with Store(StoreConfig.from_dict(raw)) as store:
        drop = _list_drops(store)
        assert drop is not None
        for c in clients:
            c.mset(dict.fromkeys(keys, b"x"))
        others = keys[1::2]  # (keys a server does not hold must survive on it: placed, not sprayed)
        drop(keys[::2])
    held = [{k for k in keys if c.exists(k)} for c in clients]
    for c in clients:
        c.delete(*keys)
    if servers == 1:
        assert held == [set(others)]
    else:
        # Each dropped key left exactly one server (its own), so it is still on the other.
        for k in keys[::2]:
            assert sum(k in h for h in held) == 1, k
        assert all(set(others) <= h for h in held)
    with Store(StoreConfig.from_dict(mariadb_config())) as plain:
        assert _list_drops(plain) is None  # no list cache: nothing to drop
