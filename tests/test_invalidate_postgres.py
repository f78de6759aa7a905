"""`store invalidate` on PostgreSQL: the log table read by the daemon only, leadership by an advisory lock.

A database of the module's own on the loopback PostgreSQL (Instagram IDs,
16 schema shards under two host names, the application role with exactly
`store grants`' privileges, which now cover the log), a memcached and a
Redis of its own. Writers whose own deletes are all lost are seen by
readers within a few ticks, the heartbeats vouch for both host names, a
standby takes over within 2 s of the leader's SIGKILL (the advisory lock
goes with the leader's session), and `binlog` is refused for a PostgreSQL
host with the mode it can have.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from store import ConfigError, Store, StoreConfig
from store.admin import init_shards
from store.admin.check import check_store
from store.invalidate import Daemon
from store.invalidate.view import invalidators
from store.tools.mix.runner import counting_sends, reset_sends, sends
from tests.conftest import APP_PASSWORD_ENV, APP_USER, NAMESPACE, base_config, make_app_account, require_port
from tests.servers import free_port, start_memcached, start_redis
from tests.test_follower import _lose_deletes, _wait_for
from tests.test_invalidate import _config_file, _daemon_process, _roles_seen, _stale_heartbeats

DB = f"storeinv_{NAMESPACE}"
ADMIN = f"postgresql+psycopg://postgres@127.0.0.1:5432/{DB}"


@pytest.fixture(scope="module")
def raw() -> Iterator[dict[str, Any]]:
    """The config: a fresh database, its shards and log made, the application role granted."""
    require_port("PostgreSQL", 5432)
    import psycopg

    with psycopg.connect("host=127.0.0.1 user=postgres dbname=postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DB}")
    mc_port, redis_port = free_port(), free_port()
    procs = [start_memcached(mc_port), start_redis(redis_port)]
    host = {
        "url": ADMIN.replace("postgres@", f"{APP_USER}@"),
        "password_env": APP_PASSWORD_ENV,
        "admin": {"url": ADMIN},
    }
    raw = base_config(
        ids="instagram",
        shards=16,
        hosts={"PG1": host, "PG2": host},
        map=[{"range": [0, 7], "master": "PG1"}, {"range": [8, 15], "master": "PG2"}],
    )
    raw["cache"] = {
        "memcached": [f"127.0.0.1:{mc_port}"],
        "redis": f"redis://127.0.0.1:{redis_port}/0",
        "max_stale_s": 30,
        "invalidation": "log",
    }
    config = StoreConfig.from_dict(raw)
    init_shards(config)
    make_app_account(config)
    try:
        yield raw
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _log_rows() -> int:
    import psycopg

    with psycopg.connect(f"host=127.0.0.1 user=postgres dbname={DB}", autocommit=True) as conn:
        got = conn.execute("SELECT COUNT(*) FROM store_log.cache_log").fetchone()
    return 0 if got is None else int(got[0])


def test_the_daemon_deletes_what_writers_lost_on_postgres(raw: dict[str, Any]) -> None:
    daemon = Daemon(StoreConfig.from_dict(raw), tick_s=0.2)
    daemon.start()
    try:
        with Store.from_config(raw) as writer, Store.from_config(raw) as reader:
            _lose_deletes(writer)
            board = writer.create("board", {"n": 0})
            pin = writer.create("pin", {"n": 0}, near=board)
            writer.link("board_has_pins", board, pin)
            _wait_for(lambda: daemon.invalidators[0].heartbeat is not None, within_s=5)
            assert reader.get(pin, type_name="pin") == {"n": 0}  # cached now
            assert reader.links("board_has_pins", board) == [pin]
            logged = _log_rows()
            pin2 = writer.create("pin", {"n": 9}, near=board)
            writer.update(pin, {"n": 1}, type_name="pin")
            writer.link("board_has_pins", board, pin2)
            assert _log_rows() > logged, "the application role writes the log"
            # The window is 30 s: only the daemon's deletes can make the reader see these.
            took = _wait_for(lambda: reader.get(pin, type_name="pin") == {"n": 1}, within_s=5)
            _wait_for(lambda: set(reader.links("board_has_pins", board)) == {pin, pin2}, within_s=5)
            # The daemon counts a pass's deletes after it sends them: the reader can see them first.
            _wait_for(lambda: daemon.status()[0]["keys_deleted"] >= 2, within_s=5)
            (status,) = daemon.status()  # both host names are one server: one invalidator
            assert status["role"] == "leader"
            assert status["hosts"] == ["PG1", "PG2"]
            assert status["keys_deleted"] >= 2
            # (a publish a loaded machine delayed is not a stale heartbeat: a few ticks' grace)
            with contextlib.suppress(AssertionError):
                _wait_for(lambda: _stale_heartbeats(reader) == [], within_s=5)
            stale = [str(f) for f in check_store(reader, sample=5).problems if f.kind == "stale heartbeat"]
            assert stale == []
            print(f"postgres log: the reader saw the lost update after {took:.2f} s")
    finally:
        daemon.stop()


def test_a_logged_delete_is_one_request_and_commits_all_or_nothing(raw: dict[str, Any]) -> None:
    with Store.from_config(raw) as store:
        objects = store._objects
        repo, h = objects.repo, objects._at(0)
        first, pin = store.create("pin", {"n": 0}, shard=0), store.create("pin", {"n": 0}, shard=0)
        assert repo.delete(h, "pins", first, logged="o:test") is True  # (the log's existence: checked once)
        logged = _log_rows()
        with counting_sends():
            reset_sends()
            # BEGIN, the mark, its log row and COMMIT in one pipeline (not one by one).
            assert repo.delete(h, "pins", pin, logged="o:test") is True
            assert sends() == 1
        assert _log_rows() == logged + 1
        assert store.get_with_version(pin, type_name="pin") is None
        assert repo.delete(h, "pins", pin, logged="o:test") is False  # gone already: no change
        # A statement that fails in the pipeline: the mark before it does not commit.
        other = store.create("pin", {"n": 1}, shard=0)
        mark = repo.sql(h, "pins")["delete"]
        with pytest.raises(Exception, match="division by zero"):
            h.transaction(lambda cur: cur.commit_with([(mark, (other,)), ("SELECT 1 / (0 * %s)", (1,))]))
        assert store.get_with_version(other, type_name="pin") == ({"n": 1}, 1)
        # and the connection is fit for the next call
        assert repo.delete(h, "pins", other, logged="o:test") is True


def _log_since(after: int) -> tuple[int, list[str]]:
    """The log rows' entries after row ``after``, and the last row's id."""
    import psycopg

    with psycopg.connect(f"host=127.0.0.1 user=postgres dbname={DB}", autocommit=True) as conn:
        rows = conn.execute(
            "SELECT id, entries FROM store_log.cache_log WHERE id > %s ORDER BY id", (after,)
        ).fetchall()
    return (rows[-1][0] if rows else after), [str(e) for _id, e in rows]


def test_gates_with_logged_hosts_change_a_links_requests_never_its_outcome_or_its_log(
    raw: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hosts that log their writes take gates too on PostgreSQL: each side's write logs its own list
    if it changed its row, and the COMMIT follows behind the gates. From every state a pair can
    be in (`tests.test_gates`), a link with gates and without answers the same, leaves the same
    rows and counts, and logs the same lists; a new same-host pair is one request, log rows and
    all."""
    from store.backends.postgres import driver
    from store.backends.postgres.dialect import PostgresBackend
    from tests.test_gates import ROW_STATES, _linked, _pair_in_state

    def run() -> dict[tuple[str, str, str], tuple[Any, ...]]:
        out = {}
        for primary in ROW_STATES:
            for inverse in ROW_STATES:
                for dead in ("", "board", "pin"):
                    board, pin = _pair_in_state(store, "one host", primary, inverse, dead)
                    last, _entries = _log_since(0)
                    linked = _linked(store, board, pin)
                    _last, entries = _log_since(last)
                    # The lists logged (one row for both sides, or a row each: the same keys).
                    keys = (k for e in entries for k in e.split())
                    named = sorted(k.replace(str(board), "BOARD").replace(str(pin), "PIN") for k in keys)
                    out[(primary, inverse, dead)] = (*linked, named)
        return out

    with Store.from_config(raw) as store:
        gated = run()
        monkeypatch.setattr(PostgresBackend, "gates", False)
        assert run() == gated
        monkeypatch.undo()
        assert gated[("absent", "absent", "")][:4] == (True, 5, 5, (1, 1))
        assert gated[("absent", "absent", "")][4], "a new pair's lists were not logged"
        assert gated[("at 5", "at 5", "")][4] == []  # a pair in place: no news, nothing logged
        board, pin = _pair_in_state(store, "one host", "absent", "absent", "")
        last, _entries = _log_since(0)
        requests: list[int] = []  # (the database's only: the caches' updates go to Redis)
        real = driver.run_pipeline

        def counted(*args: Any, **kwargs: Any) -> Any:
            requests.append(1)
            return real(*args, **kwargs)

        monkeypatch.setattr(driver, "run_pipeline", counted)
        assert store.link("board_has_pins", board, pin, sequence=5) is True
        monkeypatch.undo()
        assert len(requests) == 1
        _last, entries = _log_since(last)
        assert entries, "the gated link logged nothing"


def test_a_standby_takes_over_the_advisory_lock_within_2s(raw: dict[str, Any], tmp_path: Path) -> None:
    config = _config_file(tmp_path, raw)
    first = _daemon_process(config)
    second = None
    try:
        with Store.from_config(raw) as operator:
            _wait_for(lambda: _roles_seen(operator)[0] == first.pid, within_s=15)
            second = _daemon_process(config)
            _wait_for(lambda: _roles_seen(operator) == (first.pid, second.pid), within_s=10)
            first.kill()
            killed = time.monotonic()
            # The leader's status lives on in the caches for a while: the new leader's replaces it.
            _wait_for(lambda: _roles_seen(operator)[0] == second.pid, within_s=3)
            print(f"standby led {time.monotonic() - killed:.2f} s after the leader's SIGKILL")
            (row,) = invalidators(operator)
            assert row["mode"] == "log"
            with Store.from_config(raw) as writer:
                _lose_deletes(writer)
                pin = writer.create("pin", {"n": 0})
                assert operator.get(pin, type_name="pin") == {"n": 0}
                writer.update(pin, {"n": 1}, type_name="pin")
                _wait_for(lambda: operator.get(pin, type_name="pin") == {"n": 1}, within_s=5)
    finally:
        for proc in (first, second):
            if proc is not None:
                proc.kill()
                proc.wait()


def test_binlog_is_refused_for_a_postgresql_host_with_the_mode_it_can_have(raw: dict[str, Any]) -> None:
    bad = {**raw, "cache": {**raw["cache"], "invalidation": {"default": "log", "PG2": "binlog"}}}
    with pytest.raises(ConfigError, match=r"hosts\.PG2.*by log or wal only.*set it to log or wal for PG2"):
        StoreConfig.from_dict(bad)
