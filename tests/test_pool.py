"""The connection pool's rules, on real SQLite connections."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from store import BackendError
from store.backends.sqlite import sqlite_connector
from store.pool import ConnectionPool


def make(tmp_path: Path, **kw: float) -> ConnectionPool:
    return ConnectionPool(sqlite_connector(tmp_path / "p.sqlite3"), name="test", **kw)  # type: ignore[arg-type]


def test_reuses_idle_connections(tmp_path: Path) -> None:
    pool = make(tmp_path)
    conn, born = pool.checkout()
    pool.checkin(conn, born)
    again, _ = pool.checkout()
    assert again is conn
    assert pool.opened == 1
    assert pool.in_use == 1


def test_caps_open_connections_and_times_out(tmp_path: Path) -> None:
    pool = make(tmp_path, max_open=2, timeout_s=0.2)
    a, b = pool.checkout(), pool.checkout()
    with pytest.raises(BackendError, match="all 2 are in use"):
        pool.checkout()
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(pool.checkout()[0]))
    pool._timeout_s = 5  # now wait for the connection that the main thread gives back
    waiter.start()
    pool.checkin(*a)
    waiter.join(5)
    assert got == [a[0]]
    pool.checkin(*b)


def test_discard_closes_and_a_disconnect_empties_the_idle_list(tmp_path: Path) -> None:
    pool = make(tmp_path)
    a, b, c = pool.checkout(), pool.checkout(), pool.checkout()
    pool.checkin(*a)
    pool.checkin(*b)
    assert pool.idle == 2
    pool.discard(c[0], disconnected=True)
    assert pool.idle == 0
    assert pool.in_use == 0
    with pytest.raises(sqlite3.ProgrammingError):
        a[0].execute("SELECT 1")


def test_old_connections_are_recycled(tmp_path: Path) -> None:
    pool = make(tmp_path, recycle_s=0.0)
    conn, born = pool.checkout()
    pool.checkin(conn, born)
    fresh, _ = pool.checkout()
    assert fresh is not conn
    assert pool.opened == 2


def test_keeps_at_most_max_idle_past_idle_s(tmp_path: Path) -> None:
    pool = make(tmp_path, max_idle=1, idle_s=0.0)
    a, b = pool.checkout(), pool.checkout()
    pool.checkin(*a)
    pool.checkin(*b)
    assert pool.idle == 1
    assert pool.idle_connections() == [b[0]]  # the one unused longest went


def test_a_burst_past_max_idle_is_kept_until_idle_s(tmp_path: Path) -> None:
    """Connections beyond max_idle are not closed at each return (a load around max_idle
    would open and close one every few calls); one unused for idle_s is."""
    pool = make(tmp_path, max_open=4, max_idle=1, idle_s=0.3)
    for _ in range(20):  # a load of 3 at once, again and again: no connection made twice
        held = [pool.checkout() for _ in range(3)]
        for conn, born in held:
            pool.checkin(conn, born)
    assert pool.opened == 3
    assert pool.idle == 3
    time.sleep(0.35)
    conn, born = pool.checkout()  # the most recent; the two others have sat for idle_s
    pool.checkin(conn, born)
    assert pool.idle == 1
    assert pool.idle_connections() == [conn]
    assert pool.opened == 3


def test_a_store_s_pools_open_pool_size_plus_pool_overflow(tmp_path: Path) -> None:
    from store import Store
    from tests.conftest import sqlite_config

    raw = {**sqlite_config(tmp_path), "pool_size": 2, "pool_overflow": 1}
    with Store.from_config(raw) as store:
        store.create("pin", {"i": 1}, shard=0)
        pools = list(store.admin_context().engines.pools().values())
        assert pools
        assert {p.max_open for p in pools} == {3}
