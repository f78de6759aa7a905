"""The `store` command on bad input: each case exits non-zero with one line that says what to fix,
no traceback, and changes nothing.

Malformed configs and config keys that are wrong.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result

from store.cli import main

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
