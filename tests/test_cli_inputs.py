"""The `store` command on bad input: each case exits non-zero with one line that says what to fix,
no traceback, and changes nothing.

Malformed and unreadable configs, options out of range or in conflict, and hosts on ports nothing
listens on (no server is needed: the OS picks a free port, `tests.servers.free_port`).
"""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result

from store.cli import main
from tests.servers import free_port

#: A line of an admin command's log on stderr (`store.cli.logs`): kept, and not the error.
LOG = re.compile(r"^\d{4}-\d\d-\d\dT[\d:.]+Z [A-Z]+ store\.")


class Run:
    """`store ARGS` in-process (without --config: on the embedded default, in the test's folder)."""

    def __init__(self) -> None:
        self.runner = CliRunner()

    def __call__(self, *args: str, code: int = 0) -> Result:
        result = self.runner.invoke(main, list(args))
        assert result.exit_code == code, (result.output, result.exception)
        return result

    def fails(self, *args: str, message: str, code: int = 1) -> str:
        """The one line `store ARGS` prints (besides admin commands' log lines), checked to hold
        ``message``."""
        out = "".join(
            line for line in self(*args, code=code).output.splitlines(keepends=True) if not LOG.match(line)
        )
        assert "Traceback" not in out
        if code == 1:
            assert out.startswith("error: "), out
            assert out.count("\n") == 1, out
        assert message in out, out
        return out


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Run:
    monkeypatch.setenv("STORE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("STORE_CONFIG", raising=False)
    return Run()


def _config(tmp_path: Path, **changes: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "shards": 16,
        "hosts": {"local": f"sqlite:///{tmp_path}/shards"},
        "map": [{"range": [0, 15], "master": "local"}],
        "types": {"pin": {"id": 1, "table": "pins"}, "board": {"id": 2, "table": "boards"}},
        "relations": {"board_has_pins": {"from": "board", "to": "pin", "inverse": "pin_owned_by_board"}},
    }
    raw.update(changes)
    return raw


def _write(tmp_path: Path, raw: dict[str, Any] | str | bytes, name: str = "store.yaml") -> str:
    path = tmp_path / name
    if isinstance(raw, bytes):
        path.write_bytes(raw)
    else:
        path.write_text(raw if isinstance(raw, str) else yaml.safe_dump(raw))
    return str(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ids: [\n", "is not valid YAML: line 2, column 1: expected the node content"),
        ("a: [1\nb: 2\n", "is not valid YAML: line 2, column 2: expected ',' or ']'"),
        ("a: b: c\n", "is not valid YAML: line 1, column 5: mapping values are not allowed here"),
    ],
)
def test_malformed_yaml_is_one_line_with_its_place(run: Run, tmp_path: Path, text: str, message: str) -> None:
    run.fails("map", "show", "--config", _write(tmp_path, text), message=message)
    run.fails("get", "68719476737", "--config", _write(tmp_path, text), message=message)


def test_a_config_that_is_not_utf8_says_so(run: Run, tmp_path: Path) -> None:
    path = _write(tmp_path, b"\xff\xfeshards: 16\n")
    run.fails("map", "show", "--config", path, message="is not UTF-8 text (byte 0): save it as UTF-8 YAML")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        # Unknown keys by their names, not as a Python list of quoted strings.
        ({"cache": {"memory": True, "bogus": 1}}, "error: unknown cache key(s) bogus: cache must be"),
        ({"limits": {"nope": 1}}, "error: unknown limits key(s) nope; known: id_chunk,"),
        (
            {"map": [{"range": [0, 15], "master": "local", "slav": "local"}]},
            "map[0] has unknown key(s) slav; known",
        ),
        ({"hosts": {"local": {"url": "sqlite:///x", "pasword_env": "X"}}}, "unknown key(s) pasword_env;"),
        # A number out of range names its section.
        ({"cache": {"memory": True, "timeout_ms": -5}}, "cache.timeout_ms must be an int in 1..60000"),
        ({"limits": {"max_page": 0}}, "limits.max_page must be an int in 1..1000000, got 0"),
        ({"hosts": {"local": "foo://x"}}, "hosts.local: backend 'foo' is not supported; supported:"),
    ],
)
def test_config_errors_name_the_key(run: Run, tmp_path: Path, changes: dict[str, Any], message: str) -> None:
    out = run.fails(
        "map", "show", "--config", _write(tmp_path, _config(tmp_path, **changes)), message=message
    )
    assert "['" not in out, out  # not a Python list of the keys
    assert "[\"'" not in out, out


def test_schema_refuses_a_shard_no_id_can_name(run: Run) -> None:
    # Before, --shard -1 printed the DDL of a database `db-0001`.
    for shard in ("-1", "65536"):
        run.fails("schema", "--shard", shard, message=f"--shard {shard} must lie within 0-65535")
    assert "db65535" in run("schema", "--shard", "65535").output


def test_check_refuses_a_negative_sample(run: Run) -> None:
    out = run("check", "--sample", "-5", code=2).output
    assert "Invalid value for '--sample': -5 is not in the range x>=0" in out


def test_create_with_near_and_shard_names_the_options(run: Run) -> None:
    board = run("create", "board", "{}").output.strip()
    run.fails(
        "create",
        "pin",
        "{}",
        "--near",
        board,
        "--shard",
        "3",
        message="give --near ID or --shard N, not both",
    )
    exported = run("export").output.splitlines()
    assert json.loads(exported[-1]) == {"kind": "end", "objects": 1, "links": 0}  # the board alone


def test_serve_refuses_a_port_out_of_range_or_taken(run: Run) -> None:
    out = run("serve", "--port", "99999", code=2).output
    assert "Invalid value for '--port': 99999 is not in the range 1<=x<=65535" in out
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = run.fails(
            "serve", "--port", str(port), message=f"cannot listen on 127.0.0.1:{port}: Address already in use"
        )
    assert "serving on" not in out


def test_export_to_a_missing_folder_says_which_file(run: Run, tmp_path: Path) -> None:
    target = tmp_path / "no" / "such" / "x.ndjson"
    run.fails(
        "export", "--out", str(target), message=f"cannot write --out {target}: No such file or directory"
    )
    assert not target.parent.exists()


def _unreachable_mariadb(tmp_path: Path, **changes: Any) -> str:
    """A config of two MariaDB hosts, master and slave, on ports nothing listens on (and ``changes``)."""
    a, b = free_port(), free_port()
    raw = _config(
        tmp_path,
        hosts={
            "MySQL001A": f"mysql+pymysql://root@127.0.0.1:{a}",
            "MySQL001B": f"mysql+pymysql://root@127.0.0.1:{b}",
        },
        map=[{"range": [0, 15], "master": "MySQL001A", "slave": "MySQL001B"}],
        connect_timeout_s=2,
        **changes,
    )
    return _write(tmp_path, raw)


@pytest.mark.parametrize(
    "args",
    [
        ("init", "--shards", "0-1"),
        ("check",),
        ("relations", "repair", "--shards", "0-1"),
        ("get", "68719476737"),
    ],
)
def test_an_unreachable_host_is_one_line(run: Run, tmp_path: Path, args: tuple[str, ...]) -> None:
    # Before, the admin commands printed their progress bar's label ("shards") on a line of its own.
    run.fails(*args, "--config", _unreachable_mariadb(tmp_path), message="Connection refused")


def test_promote_with_an_unreachable_slave_is_one_line(run: Run, tmp_path: Path) -> None:
    config = _unreachable_mariadb(tmp_path, map_source={"file": str(tmp_path / "map.yaml")})
    out = run.fails("promote", "--shards", "0-15", "--yes", "--config", config, message="Connection refused")
    assert "promote of shards 0-15 stopped, the map unchanged: the slave's server failed" in out
    shown = run("map", "show", "--json", "--config", config).output
    assert json.loads(shown)["ranges"][0]["master"] == "MySQL001A"


def test_promote_with_an_unreachable_postgresql_slave_is_one_line(run: Run, tmp_path: Path) -> None:
    # psycopg's refusal ends in a hint on a line of its own; the master is down too (nothing
    # answers its port), so the slave is the one tried.
    hosts = {
        name: f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/store" for name in ("PG001A", "PG001B")
    }
    raw = _config(
        tmp_path,
        ids="instagram",
        hosts=hosts,
        map=[{"range": [0, 15], "master": "PG001A", "slave": "PG001B"}],
        map_source={"file": str(tmp_path / "map.yaml")},
        connect_timeout_s=2,
    )
    config = _write(tmp_path, raw)
    out = run.fails("promote", "--shards", "0-15", "--yes", "--config", config, message="Connection refused")
    assert "promote of shards 0-15 stopped, the map unchanged: the slave's server failed" in out
    assert "promote needs the slave PG001B up and reachable" in out
    shown = run("map", "show", "--json", "--config", config).output
    assert json.loads(shown)["ranges"][0]["master"] == "PG001A"


def test_promote_without_a_map_source_is_refused_before_any_server(run: Run, tmp_path: Path) -> None:
    # Before, the slave's replication was stopped and only then did the map write fail.
    out = run.fails(
        "promote", "--shards", "0-15", "--yes", "--config", _unreachable_mariadb(tmp_path),
        message="a promote must publish a new map to every running store",
    )  # fmt: skip
    assert "configure one (map_source: {file: PATH}" in out


def test_a_multi_line_driver_message_is_one_line(run: Run, tmp_path: Path) -> None:
    # psycopg's refusal ends in a hint on a line of its own ("Is the server running ..."); the ID is
    # an Instagram ID on shard 3.
    raw = _config(
        tmp_path,
        ids="instagram",
        hosts={"PG001": f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/store"},
        map=[{"range": [0, 15], "master": "PG001"}],
        connect_timeout_s=2,
    )
    run.fails(
        "get",
        str((1 << 23) | (3 << 10)),
        "--type",
        "pin",
        "--config",
        _write(tmp_path, raw),
        message="Connection refused; Is the server running",
    )
