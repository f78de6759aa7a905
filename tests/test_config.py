"""Config validation: every broken key is named with its fix; the examples load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from store import ConfigError, StoreConfig
from store.config import host_env_var
from store.defaults import EMBEDDED, embedded_config

ROOT = Path(__file__).resolve().parent.parent


def valid() -> dict[str, Any]:
    return {
        "ids": "pinterest",
        "shards": 4096,
        "open_shards": [0, 4095],
        "hosts": {
            "MySQL001A": "mysql+pymysql://root@127.0.0.1:3306",
            "MySQL001B": "mysql+pymysql://root@127.0.0.1:3306",
        },
        "map": [{"range": [0, 4095], "master": "MySQL001A", "slave": "MySQL001B"}],
        "types": {"pin": {"id": 1, "table": "pins"}, "board": {"id": 2, "table": "boards"}},
        "relations": {"board_has_pins": {"from": "board", "to": "pin", "inverse": "pin_owned_by_board"}},
    }


def test_the_issue_example_is_valid() -> None:
    c = StoreConfig.from_dict(valid())
    assert c.shards == 4096
    assert c.shard_map.master(3429) == "MySQL001A"
    assert c.types["pin"].id == 1
    assert c.relations["pin_owned_by_board"].from_type == "pin"
    assert c.relations["pin_owned_by_board"].inverse == "board_has_pins"
    assert c.open_shards == ((0, 4095),)
    assert c.max_object_bytes == 1 << 20


@pytest.mark.parametrize(
    "name", ["embedded.yaml", "local.yaml", "compose.yaml", "compose-instagram.yaml", "instagram.yaml"]
)
def test_example_configs_load(name: str) -> None:
    c = StoreConfig.from_file(ROOT / "config" / name)
    assert set(c.types) == {"pin", "board", "user"}


def test_embedded_yaml_matches_the_builtin_default(tmp_path: Path) -> None:
    from_file = yaml.safe_load((ROOT / "config" / "embedded.yaml").read_text())
    assert {k: v for k, v in from_file.items() if k != "hosts"} == {
        k: v for k, v in EMBEDDED.items() if k != "hosts"
    }
    assert embedded_config(tmp_path).hosts["local"].database == str(tmp_path.resolve())


def test_relative_sqlite_folder_resolves_against_the_config_file(tmp_path: Path) -> None:
    raw = valid() | {"hosts": {"MySQL001A": "sqlite:///shards", "MySQL001B": "sqlite:///other"}}
    path = tmp_path / "sub" / "store.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(raw))
    c = StoreConfig.from_file(path)
    assert c.hosts["MySQL001A"].database == str(tmp_path / "sub" / "shards")


def test_environment_overrides_a_host_url() -> None:
    env = {host_env_var("MySQL001A"): "mysql+pymysql://app:secret@db1:3306"}
    assert host_env_var("MySQL001A") == "STORE_HOST_MYSQL001A"
    c = StoreConfig.from_dict(valid(), environ=env)
    assert c.hosts["MySQL001A"].password == "secret"
    assert c.hosts["MySQL001B"].host == "127.0.0.1"


def broken(path: str, value: Any) -> dict[str, Any]:
    raw = valid()
    node = raw
    keys = path.split(".")
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node[k]
    if value is DELETE:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    return raw


DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("ids", "snowflake", "ids must be 'pinterest' or 'instagram'"),
        ("shards", DELETE, "shards is required"),
        ("shards", 70000, r"shards must be an int in 1..65536"),
        ("shards", "many", "shards must be an int"),
        ("map", [{"range": [0, 100], "master": "MySQL001A"}], r"gap: shards 101..4095"),
        (
            "map",
            [{"range": [0, 2000], "master": "MySQL001A"}, {"range": [1999, 4095], "master": "MySQL001A"}],
            "overlap at shard 1999",
        ),
        ("map", [{"range": [0, 5000], "master": "MySQL001A"}], r"goes beyond shards 0..4095"),
        ("map", [{"range": [0, 4095], "master": "MySQL009A"}], "'MySQL009A', which is not under hosts"),
        ("map", [{"range": [0, 4095], "master": "MySQL001A", "slave": "X"}], "map\\[0\\].slave is 'X'"),
        ("map", [{"range": [0, 4095], "master": "MySQL001A", "hosts": 1}], "unknown key"),
        ("map", [{"range": "all", "master": "MySQL001A"}], r"must be \[first, last\]"),
        ("map", [], "map must be a list of ranges"),
        ("types.board.id", 1, "already used by type 'pin'"),
        ("types.board.id", 1024, r"0..1023"),
        ("types.board.id", -1, r"0..1023"),
        ("types.board.table", "pins", "also the table of type 'pin'"),
        ("types.board.table", "Bad Name", "lower_snake_case"),
        ("types", {}, "types must map type names"),
        ("relations.board_has_pins.to", "photo", "'photo', which is not a type"),
        ("relations.board_has_pins.inverse", "board_has_pins", "names the relation itself"),
        ("relations.board_has_pins.inverse", "pins", "same name as an object table"),
        ("hosts", {}, "hosts must map host names"),
        ("hosts.MySQL001A", "not a url", "not a valid SQLAlchemy URL"),
        ("hosts.MySQL001A", "oracle://x@y", "supported: mariadb, mysql, postgresql, sqlite"),
        ("hosts.MySQL001A", "mysql+pymysql://root@h/db00001", "leave it out"),
        ("hosts.MySQL001A", "sqlite://", "names a folder"),
        ("open_shards", [10, 5000], "goes beyond shards"),
        ("open_shards", [9, 5], "reversed"),
        ("cache", {"memcache": ["a:1"]}, "cache must be a mapping with memcached"),
        ("cache", {"redis": "http://x"}, "redis:// URL"),
        ("cache", {"memcached": ["127.0.0.1:99999"]}, r"cache.memcached must be .*port 1-65535"),
        ("cache", {"memcached": ["127.0.0.1:0"]}, r"cache.memcached must be .*port 1-65535"),
        ("map_source", {"zookeeper": "zk1:2181,zk2:70000"}, r"map_source.zookeeper .*port 1-65535"),
        ("limits", {"max_object_bytes": 1 << 30}, "max_object_bytes must be an int in 2..16777215"),
        ("limits", {"max_objects": 5}, "unknown limits key"),
        ("shard_count", 5, "unknown config key\\(s\\) shard_count"),
        ("pool_idle_s", 0, r"pool_idle_s must be a number of seconds"),
        ("pool_overflow", -1, r"pool_overflow must be an int in 0..1000"),
        ("pool_overflow", "many", r"pool_overflow must be an int in 0..1000"),
        ("pool_idle_s", "soon", r"pool_idle_s must be a number of seconds"),
    ],
)
def test_broken_config_names_the_key(path: str, value: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        StoreConfig.from_dict(broken(path, value))


def test_pool_overflow_sets_how_many_a_host_opens_past_pool_size() -> None:
    assert StoreConfig.from_dict(broken("pool_size", 4)).max_open == 8  # as many again by default
    overflow = {**broken("pool_size", 2), "pool_overflow": 1}
    assert StoreConfig.from_dict(overflow).max_open == 3
    assert StoreConfig.from_dict({**overflow, "pool_overflow": 0}).max_open == 2


def test_pool_idle_s_defaults_to_ten_seconds() -> None:
    assert StoreConfig.from_dict(broken("pool_size", 4)).pool_idle_s == 10.0
    assert StoreConfig.from_dict(broken("pool_idle_s", 2.5)).pool_idle_s == 2.5


def test_inverse_declared_twice_must_agree() -> None:
    raw = valid()
    raw["relations"]["pin_owned_by_board"] = {"from": "pin", "to": "board", "inverse": "board_has_pins"}
    StoreConfig.from_dict(raw)  # consistent: fine
    raw["relations"]["pin_owned_by_board"] = {"from": "board", "to": "pin"}
    with pytest.raises(ConfigError, match="defined twice"):
        StoreConfig.from_dict(raw)


def test_open_shards_may_list_several_ranges() -> None:
    c = StoreConfig.from_dict(valid() | {"open_shards": [[0, 9], [100, 109]]})
    assert c.open_shards == ((0, 9), (100, 109))


def test_unreadable_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        StoreConfig.from_file(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("ids: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        StoreConfig.from_file(bad)
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        StoreConfig.from_file(bad)


def test_config_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="shards"):
        StoreConfig.from_dict(broken("shards", 0))


def with_replication_host(value: Any, host: str = "MySQL001A") -> dict[str, Any]:
    raw = valid()
    raw["hosts"][host] = {"url": raw["hosts"][host], "replication_host": value}
    return raw


@pytest.mark.parametrize(
    ("value", "address"),
    [
        ("mariadb-a", ("mariadb-a", 3306)),
        ("mariadb-a:3307", ("mariadb-a", 3307)),
        ("10.0.0.7:13306", ("10.0.0.7", 13306)),
        ("[fd00::7]:3306", ("fd00::7", 3306)),
        ("[fd00::7]", ("fd00::7", 3306)),
    ],
)
def test_replication_host_is_where_a_replica_reaches_the_host(value: str, address: tuple[str, int]) -> None:
    c = StoreConfig.from_dict(with_replication_host(value))
    assert c.replication_address("MySQL001A", 3306) == address
    assert c.for_admin().replication_address("MySQL001A", 3306) == address
    # Without one, the URL's host and port.
    assert c.replication_address("MySQL001B", 3306) == ("127.0.0.1", 3306)


def test_replication_host_keeps_the_urls_port_and_survives_an_environment_override() -> None:
    raw = valid()
    raw["hosts"]["MySQL001A"] = {"url": "mysql+pymysql://root@127.0.0.1:3307", "replication_host": "db-a"}
    assert StoreConfig.from_dict(raw).replication_address("MySQL001A", 3306) == ("db-a", 3307)
    env = {host_env_var("MySQL001A"): "mysql+pymysql://app@10.1.1.1:3308"}
    c = StoreConfig.from_dict(raw, environ=env)
    assert c.hosts["MySQL001A"].host == "10.1.1.1"
    assert c.replication_address("MySQL001A", 3306) == ("db-a", 3308)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "must be HOST or HOST:PORT"),
        ("mysql://db-a:3306", "must be HOST or HOST:PORT"),
        ("root@db-a", "must be HOST or HOST:PORT"),
        ("db a", "must be HOST or HOST:PORT"),
        ("fd00::7", "must be HOST or HOST:PORT"),
        ("db-a:", "must be HOST or HOST:PORT"),
        (3306, "must be HOST or HOST:PORT"),
        (["db-a"], "must be HOST or HOST:PORT"),
        ("db-a:0", "port 0, outside 1..65535"),
        ("db-a:70000", "port 70000, outside 1..65535"),
    ],
)
def test_a_bad_replication_host_is_named_with_its_fix(value: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=f"hosts.MySQL001A.replication_host .*{message}|{message}"):
        StoreConfig.from_dict(with_replication_host(value))


def test_replication_host_belongs_to_the_host_entry_not_its_admin_nor_sqlite() -> None:
    raw = valid()
    raw["hosts"]["MySQL001A"] = {
        "url": "mysql+pymysql://app@127.0.0.1:3306",
        "admin": {"url": "mysql+pymysql://root@127.0.0.1:3306", "replication_host": "db-a"},
    }
    with pytest.raises(
        ConfigError, match=r"hosts.MySQL001A.admin has unknown key\(s\) .*replication_host.*; known: pass"
    ):
        StoreConfig.from_dict(raw)
    raw = valid()
    raw["hosts"]["MySQL001A"] = {"url": "sqlite:///shards", "replication_host": "db-a"}
    with pytest.raises(ConfigError, match="replication_host is for MariaDB and PostgreSQL hosts"):
        StoreConfig.from_dict(raw)
