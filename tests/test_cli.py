"""The `store` command: thin, helpful, one clean line per library error."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from store.cli import main
from tests.test_ids import INSTAGRAM_VECTORS, PINTEREST_VECTORS


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("STORE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("STORE_CONFIG", raising=False)
    runner = CliRunner()

    def invoke(*args: str, code: int = 0, stdin: str | None = None):  # type: ignore[no-untyped-def]
        result = runner.invoke(main, list(args), input=stdin)
        assert result.exit_code == code, (result.output, result.exception)
        return result

    return invoke


def all_commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for name, cmd in group.commands.items():
        out.append((*prefix, name))
        if isinstance(cmd, click.Group):
            out += all_commands(cmd, (*prefix, name))
    return out


@pytest.mark.parametrize("path", all_commands(main))
def test_every_command_has_help(run, path: tuple[str, ...]) -> None:  # type: ignore[no-untyped-def]
    out = run(*path, "--help").output
    assert "Usage:" in out
    cmd: click.Command = main
    for name in path:
        assert isinstance(cmd, click.Group)
        cmd = cmd.commands[name]
    assert cmd.help, f"store {' '.join(path)} has no help text"


@pytest.mark.parametrize(("value", "shard", "type_id", "local"), PINTEREST_VECTORS)
def test_ids_decode_pinterest(run, value: int, shard: int, type_id: int, local: int) -> None:  # type: ignore[no-untyped-def]
    out = json.loads(run("ids", "decode", str(value), "--json").output)
    assert out == {"id": value, "shard_id": shard, "type_id": type_id, "local_id": local}
    text = run("ids", "decode", str(value)).output
    assert f"shard_id={shard} type_id={type_id} local_id={local}" in text
    assert run(
        "ids", "encode", "--shard", str(shard), "--type", str(type_id), "--local", str(local)
    ).output.strip() == str(value)


@pytest.mark.parametrize(("value", "ms", "shard", "seq"), INSTAGRAM_VECTORS)
def test_ids_decode_instagram(run, value: int, ms: int, shard: int, seq: int) -> None:  # type: ignore[no-untyped-def]
    out = json.loads(
        run("ids", "decode", "--scheme", "instagram", str(value), "--json", "--epoch-ms", "0").output
    )
    assert (out["ms"], out["shard_id"], out["sequence"]) == (ms, shard, seq)
    assert out["time"].endswith("+00:00")
    encoded = run(
        "ids",
        "encode",
        "--scheme",
        "instagram",
        "--ms",
        str(ms),
        "--shard",
        str(shard),
        "--sequence",
        str(seq),
    )
    assert encoded.output.strip() == str(value)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("ids", "decode", "abc"), "error: 'abc' is not an integer ID\n"),
        (("ids", "decode", str(1 << 63)), "below 2**63"),
        (
            ("ids", "encode", "--shard", "70000", "--type", "1", "--local", "1"),
            "shard_id must be in 0..65535",
        ),
        (("ids", "encode", "--shard", "1"), "needs --shard, --type and --local"),
        (("get", "241294492511762325"), "shard 3429 is not in the shard map"),
        (("create", "photo", "{}"), "unknown type 'photo'"),
        (("create", "pin", "[1]"), "expected a JSON object"),
        (("create", "pin", "{bad"), "not valid JSON"),
        (("init", "--shards", "5-99"), "must lie within 0-15"),
        (("map", "show", "--config", "/nonexistent.yaml"), "cannot read config file"),
    ],
)
def test_library_errors_are_one_line_and_exit_1(run, args: tuple[str, ...], message: str) -> None:  # type: ignore[no-untyped-def]
    result = run(*args, code=1)
    assert message in result.output
    assert "Traceback" not in result.output
    assert result.output.count("\n") == 1


def test_create_get_update_delete_round_trip(run) -> None:  # type: ignore[no-untyped-def]
    board = run("create", "board", '{"name": "kitchen"}').output.strip()
    pin = run("create", "pin", '{"title": "granite"}', "--near", board).output.strip()
    assert json.loads(run("get", pin).output) == {"title": "granite"}
    where = json.loads(run("get", pin, "--json").output)
    assert where["type"] == "pin"
    assert where["shard"] == json.loads(run("get", board, "--json").output)["shard"]
    assert json.loads(run("update", pin, '{"likes": 2}').output) == {"title": "granite", "likes": 2}
    run("delete", pin, code=1, stdin="n\n")  # declined: aborts, changes nothing
    assert json.loads(run("get", pin).output)["likes"] == 2
    assert run("delete", pin, "--yes").output.strip() == "deleted"
    assert "no live object" in run("get", pin, code=1).output


def test_init_and_map_show(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = run("init").output
    assert "16 shards checked on 1 host(s)" in out
    shown = run("map", "show").output
    assert "shard map version 1, 16 shards, 1 range(s)" in shown
    assert "0-15" in shown
    data = json.loads(run("map", "show", "--json").output)
    assert data["ranges"] == [{"range": [0, 15], "shards": 16, "master": "local", "slave": None}]


def test_config_from_the_environment(run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    root = Path(__file__).resolve().parent.parent
    monkeypatch.setenv("STORE_CONFIG", str(root / "config" / "local.yaml"))
    assert "4096 shards" in run("map", "show").output


def test_demo_runs_on_the_embedded_default(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = run("demo").output
    assert "store with 16 shards on 1 host(s): local" in out
    assert "board views = 8" in out
    assert "20 pins; pin 0 is on boards" in out
    assert "get now returns None" in out
    assert any((tmp_path / "data").glob("db000*.sqlite3"))


def test_schema_prints_the_ddl(run) -> None:  # type: ignore[no-untyped-def]
    out = run("schema", "--shard", "42").output
    assert "CREATE DATABASE IF NOT EXISTS `db00042`" in out


def test_link_links_count_unlink_and_repair(run) -> None:  # type: ignore[no-untyped-def]
    board = run("create", "board", "{}").output.strip()
    pins = [run("create", "pin", f'{{"i": {i}}}', "--near", board).output.strip() for i in range(3)]
    for i, p in enumerate(pins):
        assert run("link", "board_has_pins", board, p, "--sequence", str(10 - i)).output.strip() == "linked"
    assert run("link", "board_has_pins", board, pins[0]).output.strip() == "already linked"
    assert run("count", "board_has_pins", board).output.strip() == "3"
    assert run("links", "board_has_pins", board).output.split() == pins[::-1]
    first = json.loads(run("links", "board_has_pins", board, "--limit", "2", "--json").output)
    assert first["ids"] == [int(p) for p in pins[:0:-1]]
    rest = json.loads(
        run("links", "board_has_pins", board, "--cursor", first["next_cursor"], "--json").output
    )
    assert rest == {"ids": [int(pins[0])], "next_cursor": None}
    assert run("links", "board_has_pins", board, "--offset", "1", "--limit", "1").output.split() == [pins[1]]
    assert run("links", "pin_owned_by_board", pins[0]).output.split() == [board]
    assert run("unlink", "board_has_pins", board, pins[0]).output.strip() == "unlinked"
    assert run("unlink", "board_has_pins", board, pins[0]).output.strip() == "not linked"
    out = run("relations", "repair", "--dry-run").output
    assert "0 fix(es)" in out
    report = json.loads(run("relations", "repair", "board_has_pins", "--json").stdout)
    assert report["inverse_added"] == []
    assert report["rows_scanned"] >= 4


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("links", "nope", "1"), "unknown relation 'nope'"),
        (("links", "board_has_pins", "137438953473", "--limit", "5000"), "limit must be an int in 1..1000"),
        (("links", "board_has_pins", "137438953473", "--cursor", "zz"), "is not a cursor"),
        (("count", "board_has_pins", "68719476737"), "is a pin, not a board"),
        (("relations", "repair", "nope"), "unknown relation 'nope'"),
    ],
)
def test_relation_errors_are_one_line(run, args: tuple[str, ...], message: str) -> None:  # type: ignore[no-untyped-def]
    result = run(*args, code=1)
    assert message in result.output
    assert result.output.count("\n") == 1
