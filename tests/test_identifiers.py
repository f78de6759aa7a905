"""Every name that reaches SQL is a validated identifier: any other text is refused, the key named.

Type, table, relation, inverse and unique-key names, host names (a tombstone
records them), ticket counters and the application account of `store grants`
each get arbitrary text (SQL metacharacters, quotes, unicode, a trailing
newline, empty, very long); the config either refuses it with a `ConfigError`
naming the key or the text is a plain identifier.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from store import ConfigError, StoreConfig
from store.grants import grant_plan
from tests.conftest import base_config

SQL_NAME = re.compile(r"[a-z_][a-z0-9_]{0,63}")
HOST_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}")
ACCOUNT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}")

HOSTILE = st.one_of(
    st.text(max_size=80),
    st.text(alphabet="abc_`'\";-\\/*%\n\r\t\x00 ()=.ÿ€", max_size=20),
    st.from_regex(r"[a-z_][a-z0-9_]{0,70}", fullmatch=True),
)
EDGES = ["", "pins\n", "pins;", "p`ins", "p'ins", "x" * 65, "Pins", "1pins", "pins -- x", "ü", "\x00", "a b"]
PROPERTY = settings(
    max_examples=500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _config(folder: Path, **overrides: Any) -> dict[str, Any]:
    raw = base_config(shards=2, hosts={"A": f"sqlite:///{folder}/a"}, map=[{"range": [0, 1], "master": "A"}])
    raw.update(overrides)
    return raw


def _check(raw: dict[str, Any], text: str, pattern: re.Pattern[str], key: str) -> None:
    if pattern.fullmatch(text):
        try:
            StoreConfig.from_dict(raw)
        except ConfigError as exc:  # an identifier may still clash (a reserved or repeated name)
            assert key.split(".")[0] in str(exc), f"{exc} does not name {key}"  # noqa: PT017
        return
    with pytest.raises(ConfigError) as info:
        StoreConfig.from_dict(raw)
    assert key in str(info.value), f"{info.value} does not name {key}"


def _with_edges(test: Any) -> Any:
    for edge in EDGES:
        test = example(text=edge)(test)
    return test


@PROPERTY
@_with_edges
@given(text=HOSTILE)
def test_type_names(tmp_path: Path, text: str) -> None:
    raw = _config(tmp_path)
    raw["types"] = {text: {"id": 1, "table": "pins"}, "board": {"id": 2, "table": "boards"}}
    raw["relations"] = {}
    _check(raw, text, SQL_NAME, "types")


@PROPERTY
@_with_edges
@given(text=HOSTILE)
def test_table_names(tmp_path: Path, text: str) -> None:
    raw = _config(tmp_path)
    raw["types"] = {"pin": {"id": 1, "table": text}}
    raw["relations"] = {}
    _check(raw, text, SQL_NAME, "types.pin.table")


@PROPERTY
@_with_edges
@given(text=HOSTILE)
def test_relation_and_inverse_names(tmp_path: Path, text: str) -> None:
    raw = _config(tmp_path)
    raw["relations"] = {text: {"from": "board", "to": "pin"}}
    _check(raw, text, SQL_NAME, "relations")
    raw["relations"] = {"board_has_pins": {"from": "board", "to": "pin", "inverse": text}}
    _check(raw, text, SQL_NAME, "relations.board_has_pins.inverse")


@PROPERTY
@_with_edges
@given(text=HOSTILE)
def test_unique_key_names(tmp_path: Path, text: str) -> None:
    raw = _config(tmp_path, unique={text: {"type": "user", "field": "name"}})
    _check(raw, text, SQL_NAME, "unique")


@PROPERTY
@_with_edges
@given(text=HOSTILE)
def test_host_names(tmp_path: Path, text: str) -> None:
    raw = _config(tmp_path)
    raw["hosts"] = {text: f"sqlite:///{tmp_path}/a"}
    raw["map"] = [{"range": [0, 1], "master": text}]
    _check(raw, text, HOST_NAME, "host names")


@PROPERTY
@_with_edges
@given(text=HOSTILE)
def test_ticket_counters(tmp_path: Path, text: str) -> None:
    raw = _config(tmp_path, tickets={"servers": ["mysql+pymysql://root@127.0.0.1:3317"], "counters": [text]})
    _check(raw, text, re.compile(r"[a-z_][a-z0-9_]{0,50}"), "tickets.counters")


@PROPERTY
@_with_edges
@given(text=HOSTILE)
def test_the_application_account_of_grants(text: str) -> None:
    raw = base_config(
        shards=2, hosts={"A": "mysql+pymysql://root@127.0.0.1:3306"}, map=[{"range": [0, 1], "master": "A"}]
    )
    config = StoreConfig.from_dict(raw)
    if not ACCOUNT.fullmatch(text):
        with pytest.raises(ConfigError, match=r"--app-user"):
            grant_plan(config, text)
        return
    plan = grant_plan(config, text)
    assert all(f"'{text}'@'%'" in stmt for g in plan for stmt in g.statements)


@pytest.mark.parametrize("name", ["pins\n", "pins\r\n", "boards\n"])
def test_a_trailing_newline_is_not_an_identifier(tmp_path: Path, name: str) -> None:
    raw = _config(tmp_path)
    raw["types"]["pin"]["table"] = name
    with pytest.raises(ConfigError, match=r"types.pin.table"):
        StoreConfig.from_dict(raw)
