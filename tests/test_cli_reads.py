"""`store get` (several IDs, stdin, --type), `store page --objects`, `store ping` and `Store.ping`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result

from store import Store, StoreConfig
from store.cli import main
from tests.conftest import cached_mariadb_config, instagram_pg_config, sqlite_config


class Run:
    def __init__(self, config: Path) -> None:
        self.config = config
        self.runner = CliRunner()

    def __call__(self, *args: str, code: int = 0, stdin: str | None = None) -> Result:
        result = self.runner.invoke(main, [*args, "--config", str(self.config)], input=stdin)
        assert result.exit_code == code, (result.output, result.exception)
        return result


def _write(tmp_path: Path, raw: dict[str, Any], name: str = "store.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture
def sqlite_run(tmp_path: Path) -> Run:
    return Run(_write(tmp_path, sqlite_config(tmp_path)))


def test_get_several_ids_and_ids_on_stdin(sqlite_run: Run) -> None:
    run = sqlite_run
    board = int(run("create", "board", '{"name": "b"}').output)
    pins = [int(run("create", "pin", json.dumps({"k": k}), "--near", str(board)).output) for k in range(3)]
    run("delete", str(pins[1]), "--yes")
    # One ID: the object alone, as before.
    assert json.loads(run("get", str(pins[0])).output) == {"k": 0}
    # Several: one JSON line per ID, in order; a gone one has data null, and the exit code is 1.
    out = run("get", str(pins[0]), str(pins[2]), str(board)).output.splitlines()
    assert [json.loads(line) for line in out] == [
        {"id": pins[0], "data": {"k": 0}},
        {"id": pins[2], "data": {"k": 2}},
        {"id": board, "data": {"name": "b"}},
    ]
    got = run("get", "-", code=1, stdin=f"{pins[0]}\n{pins[1]} {pins[2]}\n")
    assert [json.loads(line) for line in got.output.splitlines()] == [
        {"id": pins[0], "data": {"k": 0}},
        {"id": pins[1], "data": None},
        {"id": pins[2], "data": {"k": 2}},
    ]
    located = json.loads(run("get", "-", "--json", stdin=str(board)).output)
    assert located["id"] == board
    assert located["type"] == "board"
    assert {"shard", "local_id", "host", "data"} <= set(located)
    # --type is checked against a Pinterest ID's own type
    assert "error:" in run("get", str(board), "--type", "pin", code=1).output
    assert "not an integer ID" in run("get", "-", code=1, stdin="12 x").output
    assert "no IDs to get" in run("get", "-", code=1, stdin=" \n").output


def test_page_with_objects(sqlite_run: Run) -> None:
    run = sqlite_run
    user = run("create", "user", "{}").output.strip()
    pins = [run("create", "pin", json.dumps({"k": k}), "--near", user).output.strip() for k in range(4)]
    for p in pins:
        run("link", "users_has_pins", user, p)  # no inverse: a deleted pin's entry stays
    run("delete", pins[0], "--yes")
    first = run("page", "users_has_pins", user, "--objects", "--limit", "2")
    assert [json.loads(line) for line in first.stdout.splitlines()] == [
        {"id": int(pins[1]), "data": {"k": 1}},
        {"id": int(pins[2]), "data": {"k": 2}},
    ]
    cursor = first.stderr.split("--cursor ")[1].strip()
    doc = json.loads(run("page", "users_has_pins", user, "--objects", "--cursor", cursor, "--json").output)
    assert doc == {"ids": [int(pins[3])], "objects": [{"k": 3}], "next_cursor": None}
    # without --objects: the IDs, gone ones included (page() does not read objects)
    assert run("page", "users_has_pins", user).stdout.split() == pins


def test_ping_reports_each_server_and_exits_1_on_any_failure(tmp_path: Path) -> None:
    assert '"ok": true' in Run(_write(tmp_path, sqlite_config(tmp_path))).__call__("ping", "--json").output
    raw = sqlite_config(tmp_path)
    raw["hosts"]["ClosedDB"] = "mysql+pymysql://root@127.0.0.1:1"
    raw["connect_timeout_s"] = 2
    raw["cache"] = {"memcached": ["127.0.0.1:2"], "redis": ["redis://127.0.0.1:3/0"]}
    run = Run(_write(tmp_path, raw, "down.yaml"))
    table = run("ping", code=1).stdout
    lines = {line.split()[1]: line for line in table.splitlines()[1:]}
    assert "FAIL" in lines["ClosedDB"]
    assert "FAIL" in lines["127.0.0.1:2"]
    assert "FAIL" in lines["127.0.0.1:3/0"]
    assert " ok " in lines["A"]
    assert " ok " in lines["B"]
    report = json.loads(run("ping", "--json", code=1).stdout)
    assert report["ok"] is False
    assert report["hosts"]["A"] == {"ok": True, "ms": report["hosts"]["A"]["ms"], "error": None}
    assert report["hosts"]["ClosedDB"]["ok"] is False
    assert "ClosedDB" in report["hosts"]["ClosedDB"]["error"]
    assert report["caches"]["memcached"]["127.0.0.1:2"]["ok"] is False
    assert report["caches"]["redis"]["127.0.0.1:3/0"]["ok"] is False
    assert report["map_source"]["ok"] is True
    assert report["map_source"]["kind"] == "static"
    # A map source that cannot be read: the store does not start, and ping says why.
    raw = sqlite_config(tmp_path)
    raw["map_source"] = {"table": "mysql+pymysql://root@127.0.0.1:1"}
    raw["connect_timeout_s"] = 2
    report = json.loads(Run(_write(tmp_path, raw, "nomap.yaml"))("ping", "--json", code=1).stdout)
    assert report["map_source"]["ok"] is False
    assert report["map_source"]["kind"] == "table"


@pytest.mark.mariadb
def test_ping_on_mariadb_memcached_and_redis(
    mariadb_ready: StoreConfig, memcached_pair: list[str], redis_ready: str
) -> None:
    with Store.from_config(cached_mariadb_config(memcached_pair, redis_ready)) as s:
        report = s.ping()
    assert report["ok"] is True, report
    assert sorted(report["hosts"]) == ["MySQL001A", "MySQL002A"]
    assert sorted(report["caches"]["memcached"]) == sorted(memcached_pair)
    assert list(report["caches"]["redis"]) == [redis_ready.removeprefix("redis://")]


def test_instagram_ids_need_type_on_the_command_line(tmp_path: Path) -> None:
    run = Run(_write(tmp_path, instagram_pg_config()))
    for args in (("get", "2217813737473025833"), ("update", "2217813737473025833", "{}")):
        out = run(*args, code=1).output
        assert "pass --type (one of board, pin, user)" in out
        assert "type_name=" not in out
    out = run("delete", "2217813737473025833", "--yes", code=1).output
    assert "pass --type" in out


def test_instagram_get_update_delete_with_type(postgres_ready: StoreConfig, tmp_path: Path) -> None:
    run = Run(_write(tmp_path, instagram_pg_config()))
    pins = [run("create", "pin", json.dumps({"k": k})).output.strip() for k in range(2)]
    assert json.loads(run("get", pins[0], "--type", "pin").output) == {"k": 0}
    assert json.loads(run("update", pins[0], '{"x": 1}', "--type", "pin").output) == {"k": 0, "x": 1}
    out = run("get", "-", "--type", "pin", stdin=" ".join(pins)).output.splitlines()
    assert [json.loads(line)["data"] for line in out] == [{"k": 0, "x": 1}, {"k": 1}]
    assert run("delete", pins[1], "--type", "pin", "--yes").output.strip() == "deleted"
    assert json.loads(run("get", pins[1], pins[0], "--type", "pin", code=1).output.splitlines()[0]) == {
        "id": int(pins[1]),
        "data": None,
    }
