"""`store.backends.mysql.pymysql_fast`: the installed PyMySQL has every internal the shortcuts use (the
canary for a new release), and a driver that lacks one still writes, through the public cursor."""

from __future__ import annotations

import logging
import tomllib
from pathlib import Path
from typing import Any

import pymysql
import pytest
from hypothesis import given
from hypothesis import strategies as st

from store import Store, StoreConfig
from store.backends.mysql import pymysql_fast
from store.backends.mysql.pymysql_fast import (
    CONNECTION_INTERNALS,
    TESTED_PYMYSQL,
    TLS_INTERNALS,
    WRITE_INTERNALS,
    Internal,
    escape_text,
    missing_internals,
    pymysql_version,
)
from tests.conftest import require_port

ROOT = Path(__file__).resolve().parent.parent
#: The module's logger keeps the name it had before the module moved into the mysql package.
LOGGER = "store.backends.pymysql_fast"


def _root() -> Any:
    require_port("MariaDB", 3306)
    return pymysql.connect(host="127.0.0.1", port=3306, user="root", autocommit=True)


def test_the_installed_pymysql_has_every_internal_the_shortcuts_use() -> None:
    """The canary: on a PyMySQL release that renamed or reshaped a name the shortcuts use, this
    fails naming it (the store itself falls back to the public cursor and logs the same names)."""
    conn = _root()
    try:
        gaps = missing_internals(pymysql, WRITE_INTERNALS + TLS_INTERNALS)
        gaps += missing_internals(pymysql, CONNECTION_INTERNALS, on=conn)
    finally:
        conn.close()
    assert not gaps, (
        f"PyMySQL {pymysql_version(pymysql)} differs from what store.backends.mysql.pymysql_fast was tested "
        f"with (pymysql{TESTED_PYMYSQL}): " + "; ".join(gaps) + ". Adapt the fast path to this "
        "release (or leave it to the fallback), then widen the pin in pyproject.toml and TESTED_PYMYSQL."
    )


def test_the_pin_is_the_tested_range_and_the_installed_driver_is_in_it() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"pymysql{TESTED_PYMYSQL}" in deps
    low, high = (tuple(int(n) for n in bound.lstrip("<>=").split(".")) for bound in TESTED_PYMYSQL.split(","))
    assert low <= tuple(pymysql.VERSION[:3]) < high, (
        f"PyMySQL {pymysql_version(pymysql)} is not {TESTED_PYMYSQL}"
    )


@given(st.text(alphabet=st.sampled_from("ab'\"\\\0\n\r\x1a%é€ {}:"), max_size=40) | st.text(max_size=40))
def test_the_quick_escape_is_the_drivers(text: str) -> None:
    """`escape_text` makes the text PyMySQL's ``escape_string`` makes, for any string."""
    assert escape_text(text) == pymysql.converters.escape_string(text)


def test_a_packet_the_server_split_is_read_whole() -> None:
    """A payload of 16 MB or more comes in parts (the last shorter than 0xFFFFFF bytes, maybe
    empty), each with its own sequence number: read as one."""

    class Conn:
        _next_seq_id = 3
        InternalError = pymysql.err.InternalError

        def __init__(self, parts: list[bytes]) -> None:
            self.data = b"".join(
                len(p).to_bytes(3, "little") + bytes([(3 + k) % 256]) + p for k, p in enumerate(parts)
            )

        def _read_bytes(self, n: int) -> bytes:
            out, self.data = self.data[:n], self.data[n:]
            return out

        def _force_close(self) -> None:
            pass

    big = b"x" * 0xFFFFFF
    for parts in ([b"abc"], [big, b"tail"], [big, big, b""]):
        conn = Conn(parts)
        assert pymysql_fast._read_packet(conn) == b"".join(parts)
        assert conn._next_seq_id == 3 + len(parts)
        assert conn.data == b""
    conn = Conn([b"abc"])
    conn._next_seq_id = 4
    with pytest.raises(pymysql.err.InternalError):
        pymysql_fast._read_packet(conn)


def test_the_check_names_what_is_missing_and_what_has_another_shape() -> None:
    class Driver:
        class connections:  # noqa: N801 (a stand-in for the driver's module)
            class Connection:
                def _read_bytes(self, num_bytes: int, flags: int) -> bytes:
                    return b""

    needs = (
        Internal(
            "connections.Connection._read_bytes", "callable as (self, num_bytes)", WRITE_INTERNALS[3].fits
        ),
        Internal("connections.Connection._force_close", *WRITE_INTERNALS[4][1:]),
        Internal("cursors.Cursor._get_db", *WRITE_INTERNALS[0][1:]),
    )
    assert missing_internals(Driver, needs) == [
        "pymysql.connections.Connection._read_bytes is not callable as (self, num_bytes)",
        "pymysql.connections.Connection._force_close is missing (expected callable as (self))",
        "pymysql.cursors.Cursor._get_db is missing (expected callable as (self))",
    ]
    assert missing_internals(Driver, CONNECTION_INTERNALS[3:4], on=object()) == [
        "a connection's _next_seq_id is missing (expected an int)"
    ]


def test_store_connections_take_the_fast_path_on_the_installed_driver(mariadb_ready: StoreConfig) -> None:
    with Store(mariadb_ready) as store:
        board = store.create("board", {"b": 1}, shard=2)
        pin = store.create("pin", {"p": 1}, near=board)
        assert store.link("board_has_pins", board, pin)
        assert _cursor_of(store, 2).execute_oks is not None
    assert pymysql_fast.fast_writes() is True


def _cursor_of(store: Store, shard: int) -> Any:
    pool = store.admin_context().engines.shard(shard, store.shard_map.master(shard)).pool
    conn, born = pool.checkout()
    try:
        return conn.cursor()
    finally:
        pool.checkin(conn, born)


def _without_a_class_internal(monkeypatch: pytest.MonkeyPatch) -> str:
    # The driver itself calls this only when a connection breaks, so its own path still works
    # (not an error packet's ``raise_for_error``: a re-link's gate answers with an error packet).
    monkeypatch.delattr(pymysql.connections.Connection, "_force_close")
    return "pymysql.connections.Connection._force_close is missing"


def _without_a_connection_internal(monkeypatch: pytest.MonkeyPatch) -> str:
    # The driver sets it on every query() and reads it only in affected_rows().
    real = pymysql.connections.Connection.connect

    def connect(self: Any, sock: Any = None) -> None:
        real(self, sock)
        del self._affected_rows

    monkeypatch.setattr(pymysql.connections.Connection, "connect", connect)
    return "a connection's _affected_rows is missing"


@pytest.mark.parametrize("lose", [_without_a_class_internal, _without_a_connection_internal])
def test_a_driver_without_an_internal_still_writes_through_the_public_cursor(
    mariadb_ready: StoreConfig, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, lose: Any
) -> None:
    """Warned once, naming the attribute; every connection then writes with execute and nextset,
    and each kind of write (an object, a pair of lists with its counts, a change, a removal)
    lands on the real MariaDB as it would through the fast path."""
    monkeypatch.setattr(pymysql_fast, "_MADE", {})  # as in a new process, on this driver
    named = lose(monkeypatch)
    caplog.set_level(logging.WARNING, logger=LOGGER)
    with Store(mariadb_ready) as store:
        board = store.create("board", {"name": "kitchen"}, shard=3)
        pins = [store.create("pin", {"n": n}, near=board) for n in range(3)]
        other = store.create("board", {"name": "hall"}, shard=6)  # the other host: another pool
        for pin in pins:
            assert store.link("board_has_pins", board, pin)
        assert not store.link("board_has_pins", board, pins[0])  # already there: nothing changes
        assert store.unlink("board_has_pins", board, pins[1])
        store.update(pins[0], lambda data: {**data, "n": 10})
        assert store.delete(pins[2])
        assert _cursor_of(store, 3).execute_oks is None
        assert _cursor_of(store, 6).execute_oks is None
    assert pymysql_fast.fast_writes() is False
    with Store(mariadb_ready) as fresh:  # read back on new connections, past any cache
        assert fresh.get(pins[0]) == {"n": 10}
        assert fresh.get(pins[2]) is None
        assert fresh.get(other) == {"name": "hall"}
        assert fresh.links("board_has_pins", board) == [pins[0]]
        assert fresh.count("board_has_pins", board) == 1
    warned = [
        r.getMessage() for r in caplog.records if r.name == LOGGER and "fast write path" in r.getMessage()
    ]
    assert len(warned) == 1, warned
    assert named in warned[0]
    assert "public cursor" in warned[0]
    assert f"pymysql{TESTED_PYMYSQL}" in warned[0]


def test_a_driver_without_the_tls_hook_uses_its_own_connection_class(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(pymysql_fast, "_MADE", {})
    monkeypatch.delattr(pymysql.connections.Connection, "_create_ssl_ctx")
    caplog.set_level(logging.WARNING, logger=LOGGER)
    assert pymysql_fast.connection_class(pymysql) is pymysql.connections.Connection
    assert pymysql_fast.connection_class(pymysql) is pymysql.connections.Connection
    warned = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(warned) == 1
    assert "pymysql.connections.Connection._create_ssl_ctx is missing" in warned[0]
