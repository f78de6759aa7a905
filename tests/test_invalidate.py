"""`store invalidate`: one daemon per server deletes what each commit changed; heartbeats extend trust.

On a MariaDB of the tests' own with a ROW binlog, a memcached and a Redis of
their own: writers whose own deletes are all lost are seen by readers within
a few ticks (log table and binlog); a standby takes over within 2 s of the
leader's SIGKILL; two daemons for one server delete each key once; a writer
SIGKILLed after its commit still has its key deleted; idle store processes
cost the server nothing more, where per-process followers cost 2 queries a
second per host each.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pymysql
import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from store import Store, StoreConfig
from store.admin import check_store, init_shards
from store.cache.leases import wall_ms
from store.invalidate import Daemon
from store.invalidate.heartbeat import Heartbeat
from store.invalidate.metrics import DaemonCollector
from store.invalidate.sources import BinlogSource
from store.invalidate.view import invalidators
from store.metrics import Metrics, instrument
from store.serve.app import render_panels
from store.serve.panels import Panels
from tests.conftest import base_config
from tests.servers import MariaDBServer, free_port, memcached_stats, start_memcached, start_redis
from tests.test_follower import _lose_deletes, _wait_for


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, Any]]:
    """A MariaDB with a ROW binlog, a memcached and a Redis, all the module's own."""
    db = MariaDBServer(free_port(), log_bin=True, server_id=7)
    db.start()
    mc_port, redis_port = free_port(), free_port()
    mc = start_memcached(mc_port)
    rd = start_redis(redis_port)
    try:
        yield {"db": db, "memcached": f"127.0.0.1:{mc_port}", "redis": f"redis://127.0.0.1:{redis_port}/0"}
    finally:
        for proc in (mc, rd):
            proc.kill()
            proc.wait()
        db.remove()


def _raw(servers: dict[str, Any], mode: str, **cache: Any) -> dict[str, Any]:
    raw = base_config(
        shards=8,
        hosts={"A": servers["db"].url},
        map=[{"range": [0, 7], "master": "A"}],
    )
    raw["cache"] = {
        "memcached": [servers["memcached"]],
        "redis": servers["redis"],
        "prefix": f"i{time.monotonic_ns() % 10**6}:",
        "max_stale_s": 30,
        **({"follow": True, "follow_poll_s": 0.5} if mode == "follow" else {"invalidation": mode}),
        **cache,
    }
    init_shards(StoreConfig.from_dict(raw))
    return raw


def _sql(servers: dict[str, Any], query: str) -> list[tuple[Any, ...]]:
    conn = pymysql.connect(host="127.0.0.1", port=servers["db"].port, user="root", autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(query)
            return list(cur.fetchall())
    finally:
        conn.close()


def _mc_stat(servers: dict[str, Any], name: str) -> int:
    return memcached_stats(servers["memcached"])[name]


def _deletes(servers: dict[str, Any]) -> int:
    return _mc_stat(servers, "delete_hits") + _mc_stat(servers, "delete_misses")


def _lock_holder(servers: dict[str, Any]) -> int | None:
    got = _sql(servers, "SELECT IS_USED_LOCK('store_invalidate')")[0][0]
    return None if got is None else int(got)


@pytest.mark.parametrize("mode", ["binlog", "log"])
def test_daemon_deletes_what_writers_lost(servers: dict[str, Any], mode: str) -> None:
    raw = _raw(servers, mode)
    daemon = Daemon(StoreConfig.from_dict(raw), tick_s=0.2)
    daemon.start()
    try:
        with Store.from_config(raw) as writer, Store.from_config(raw) as reader:
            _lose_deletes(writer)
            board = writer.create("board", {"n": 0})
            pin = writer.create("pin", {"n": 0}, near=board)
            writer.link("board_has_pins", board, pin)
            _wait_for(lambda: daemon.invalidators[0].heartbeat is not None, within_s=5)
            assert reader.get(pin) == {"n": 0}  # cached now
            assert reader.links("board_has_pins", board) == [pin]
            pin2 = writer.create("pin", {"n": 9}, near=board)
            writer.update(pin, {"n": 1})
            writer.link("board_has_pins", board, pin2)
            # The window is 30 s: only the daemon's deletes can make the reader see these.
            took = _wait_for(lambda: reader.get(pin) == {"n": 1}, within_s=5)
            _wait_for(lambda: set(reader.links("board_has_pins", board)) == {pin, pin2}, within_s=5)
            logged = _sql(
                servers, "SELECT COUNT(*) FROM information_schema.tables WHERE table_name = 'cache_log'"
            )
            if mode == "binlog":
                rows = _sql(servers, "SELECT COUNT(*) FROM store_log.cache_log")[0][0] if logged[0][0] else 0
                assert rows == 0, "binlog hosts write no log rows"
            status = daemon.status()[0]
            assert status["role"] == "leader"
            assert status["keys_deleted"] >= 2
            registry = CollectorRegistry()
            registry.register(DaemonCollector(daemon))
            scraped = generate_latest(registry).decode()
            assert 'store_invalidator_role{host="A",role="leader"} 1.0' in scraped
            assert 'store_invalidator_heartbeat_age_seconds{host="A"}' in scraped
            print(f"{mode}: the reader saw the lost update after {took:.2f} s")
    finally:
        daemon.stop()


def test_the_binlog_reader_decodes_only_the_rows_that_name_keys(
    servers: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows of another database, and of a shard database's table that names no key, are skipped
    by the reader before they are decoded; the store's own rows still reach the keys."""
    from store.invalidate.sources import BinlogKeys

    seen: list[tuple[str, str]] = []
    entries = BinlogKeys.entries

    def recording(self: BinlogKeys, changes: list[tuple[str, str, list[Any]]]) -> str:
        seen.extend((schema, table) for schema, table, _values in changes)
        return entries(self, changes)

    monkeypatch.setattr(BinlogKeys, "entries", recording)
    raw = _raw(servers, "binlog")
    _sql(servers, "CREATE DATABASE IF NOT EXISTS other_app")
    _sql(servers, "CREATE TABLE IF NOT EXISTS other_app.t (id INT PRIMARY KEY AUTO_INCREMENT, v TEXT)")
    _sql(servers, "CREATE TABLE IF NOT EXISTS db00000.scratch (id INT PRIMARY KEY AUTO_INCREMENT, v TEXT)")
    daemon = Daemon(StoreConfig.from_dict(raw), tick_s=0.2)
    daemon.start()
    try:
        with Store.from_config(raw) as writer, Store.from_config(raw) as reader:
            _lose_deletes(writer)
            board = writer.create("board", {"n": 0}, shard=0)
            pin = writer.create("pin", {"n": 0}, near=board)
            _wait_for(lambda: daemon.invalidators[0].heartbeat is not None, within_s=5)
            assert reader.get(pin) == {"n": 0}
            for _ in range(20):
                _sql(servers, "INSERT INTO other_app.t (v) VALUES (REPEAT('x', 1000))")
                _sql(servers, "INSERT INTO db00000.scratch (v) VALUES (REPEAT('y', 1000))")
            writer.update(pin, {"n": 1})
            _wait_for(lambda: reader.get(pin) == {"n": 1}, within_s=5)
        tables = {table for _schema, table in seen}
        assert ("db00000", "pins") in seen
        assert not tables & {"t", "scratch", "invalidator"}, sorted(set(seen))
        assert {schema for schema, _table in seen} <= {f"db{n:05d}" for n in range(8)}
    finally:
        daemon.stop()
        _sql(servers, "DROP DATABASE IF EXISTS other_app")
        _sql(servers, "DROP TABLE IF EXISTS db00000.scratch")


def test_heartbeats_extend_trust_and_the_window_comes_back(servers: dict[str, Any]) -> None:
    # A generous cache timeout: on a loaded machine a read that times out is a miss, which says
    # nothing of whether the entry was trusted (the counts below tell the two apart).
    raw = _raw(servers, "binlog", max_stale_s=1, timeout_ms=1000)
    daemon = Daemon(StoreConfig.from_dict(raw), tick_s=0.2)
    daemon.start()
    try:
        with Store.from_config(raw) as s:
            pin = s.create("pin", {"n": 0})
            _wait_for(lambda: daemon.invalidators[0].heartbeat is not None, within_s=5)
            time.sleep(0.6)  # past the heartbeat's S: entries filled from now on are vouched for
            assert s.get(pin) == {"n": 0}
            time.sleep(1.6)  # older than the 1 s window
            expired = s.stats()["memcached"]["expired"]
            assert s.get(pin) == {"n": 0}
            assert s.stats()["memcached"]["expired"] == expired, "trusted past the window"
            assert _stale_heartbeats(s) == []
            daemon.stop()
            time.sleep(1.6)  # the heartbeat grows older than the window
            assert s.get(pin) == {"n": 0}
            assert s.stats()["memcached"]["expired"] == expired + 1, ("back to the window", s.stats())
            assert _stale_heartbeats(s) == ["A"], "store check reports the host"
    finally:
        daemon.stop()


def test_trust_is_per_host_a_host_without_a_daemon_keeps_only_its_own_entries_to_the_window(
    servers: dict[str, Any], second_db: MariaDBServer
) -> None:
    """Host A has a daemon, host B none (``invalidation: {A: binlog, B: window}``): A's objects and
    lists are trusted past the window, B's are read again once older than it; then A's daemon
    stops and A's entries go back to the window too."""
    raw = _raw(servers, "binlog", max_stale_s=1, timeout_ms=1000)
    raw["hosts"]["B"] = second_db.url
    raw["map"] = [{"range": [0, 3], "master": "A"}, {"range": [4, 7], "master": "B"}]
    raw["cache"]["invalidation"] = {"A": "binlog", "B": "window"}
    init_shards(StoreConfig.from_dict(raw))
    daemon = Daemon(StoreConfig.from_dict(raw), tick_s=0.2)
    assert [inv.hosts for inv in daemon.invalidators] == [["A"]]
    daemon.start()
    try:
        with Store.from_config(raw) as s:
            board_a, board_b = s.create("board", {"n": 0}, shard=1), s.create("board", {"n": 0}, shard=5)
            pin_a, pin_b = s.create("pin", {"n": 0}, shard=1), s.create("pin", {"n": 0}, shard=5)
            s.link("board_has_pins", board_a, pin_a)
            s.link("board_has_pins", board_b, pin_b)
            _wait_for(lambda: daemon.invalidators[0].heartbeat is not None, within_s=5)
            time.sleep(0.6)  # past the heartbeat's S
            assert s.get_many([pin_a, pin_b]) == {pin_a: {"n": 0}, pin_b: {"n": 0}}
            assert s.links("board_has_pins", board_a) == [pin_a]
            assert s.links("board_has_pins", board_b) == [pin_b]

            def expired_after_reads() -> tuple[int, int]:
                before = s.stats()
                assert s.get(pin_a) == {"n": 0}
                assert s.get(pin_b) == {"n": 0}
                assert s.links("board_has_pins", board_a) == [pin_a]
                assert s.links("board_has_pins", board_b) == [pin_b]
                after = s.stats()
                return (
                    after["memcached"]["expired"] - before["memcached"]["expired"],
                    after["redis"]["expired"] - before["redis"]["expired"],
                )

            time.sleep(1.6)  # every entry older than the 1 s window
            assert expired_after_reads() == (1, 1), ("only B's object and list", s.stats())
            assert _stale_heartbeats(s) == [], "B has no daemon to miss"
            time.sleep(1.6)
            assert expired_after_reads() == (1, 1), "A's still trusted, B's filled again and old again"
            daemon.stop()
            time.sleep(1.6)
            assert expired_after_reads() == (2, 2), ("A's back to the window", s.stats())
    finally:
        daemon.stop()


def test_a_lost_stream_resumes_from_the_saved_position_not_the_terms_start(servers: dict[str, Any]) -> None:
    """mysql-replication reconnects a lost stream by itself, from where the reader began: the
    source refuses that, steps down and resumes from its saved position, vouching without a break."""
    raw = _raw(servers, "binlog")
    daemon = Daemon(StoreConfig.from_dict(raw), tick_s=0.2)
    daemon.start()
    inv = daemon.invalidators[0]
    try:
        with Store.from_config(raw) as writer, Store.from_config(raw) as reader:
            _lose_deletes(writer)
            pin = writer.create("pin", {"n": 0})
            _wait_for(lambda: inv.heartbeat is not None, within_s=5)
            assert inv.heartbeat is not None
            since = inv.heartbeat.since_ms
            assert reader.get(pin) == {"n": 0}
            writer.update(pin, {"n": 1})
            _wait_for(lambda: reader.get(pin) == {"n": 1}, within_s=5)
            dumps = _sql(
                servers, "SELECT id FROM information_schema.processlist WHERE command = 'Binlog Dump'"
            )
            assert len(dumps) == 1, dumps
            _sql(servers, f"KILL CONNECTION {dumps[0][0]}")
            writer.update(pin, {"n": 2})
            _wait_for(lambda: reader.get(pin) == {"n": 2}, within_s=5)
            # The reader can see n=2 before the daemon sees its stream gone (on a loaded machine the
            # heartbeat ages past the window and the reader reads again): wait for the step down.
            _wait_for(lambda: inv.errors >= 1 and inv.terms >= 2 and inv.role == "leader", within_s=10)
            assert inv.errors >= 1, inv.status()
            assert "stream" in inv.last_error, inv.status()
            assert inv.terms >= 2, inv.status()
            assert inv.role == "leader", inv.status()
            assert isinstance(inv.source, BinlogSource)
            assert inv.source.restarts == 0
            _wait_for(lambda: inv.heartbeat is not None and inv.heartbeat.since_ms == since, within_s=5)
    finally:
        daemon.stop()


def test_from_now_starts_at_the_binlogs_end_and_vouches_only_from_then(servers: dict[str, Any]) -> None:
    """``--from-now`` skips a saved position (a backlog) and vouches from its own start, where a
    daemon that resumes keeps vouching from where the saved position began."""
    raw = _raw(servers, "binlog")
    config = StoreConfig.from_dict(raw)
    beats: list[Heartbeat] = []
    for from_now in (False, False, True):
        began = wall_ms()
        daemon = Daemon(config, tick_s=0.2, from_now=from_now)
        daemon.start()
        inv = daemon.invalidators[0]
        try:
            with Store.from_config(raw) as writer:
                writer.create("pin", {"n": 0})  # the binlog moves on between the daemons
            _wait_for(
                lambda inv=inv, began=began: inv.heartbeat is not None and inv.heartbeat.covered_ms > began,
                within_s=5,
            )
            assert inv.heartbeat is not None
            beats.append(inv.heartbeat)
        finally:
            daemon.stop()
        time.sleep(0.3)
    first, resumed, fresh = beats
    assert resumed.since_ms == first.since_ms, "a resumed daemon vouches from where its position began"
    assert fresh.since_ms > resumed.covered_ms, "--from-now vouches only from its own start"


def _stale_heartbeats(store: Store) -> list[str]:
    report = check_store(store, sample=5)
    return [f.server for f in report.problems if f.kind == "stale heartbeat"]


def _roles_seen(store: Store) -> tuple[int | None, int | None]:
    """The processes the view shows as the one server's leader and standby."""
    (row,) = invalidators(store)
    return tuple(  # type: ignore[return-value]
        None if row[role] is None else int(str(row[role]["instance"]).rsplit(":", 1)[1])
        for role in ("leader", "standby")
    )


def _config_file(tmp_path: Path, raw: dict[str, Any]) -> Path:
    path = tmp_path / "store.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _daemon_process(config: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "store.cli", "invalidate", "--config", str(config)],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def test_standby_takes_over_within_2s_of_the_leaders_sigkill(servers: dict[str, Any], tmp_path: Path) -> None:
    raw = _raw(servers, "binlog")
    config = _config_file(tmp_path, raw)
    first = _daemon_process(config)
    second: subprocess.Popen[bytes] | None = None
    try:
        _wait_for(lambda: _lock_holder(servers) is not None, within_s=15)
        leader = _lock_holder(servers)
        second = _daemon_process(config)
        time.sleep(3)  # the second is up and waiting
        assert _lock_holder(servers) == leader
        with Store.from_config(raw) as operator:
            # What `store serve` and its /metrics show: the leader and the standby, by process.
            _wait_for(lambda: _roles_seen(operator) == (first.pid, second.pid), within_s=5)
            (row,) = invalidators(operator)
            assert row["mode"] == "binlog"
            assert row["hosts"] == ["A"]
            assert row["leader"]["position"]
            assert row["leader"]["lag_s"] is not None
            assert not row["stale"]
            assert row["heartbeat_age_s"]["A"] < 2
            html = render_panels(Panels(operator, journal=None, check_file=None))
            assert 'id="invalidators-panel"' in html
            assert f":{first.pid}" in html
            metrics = instrument(operator, Metrics())
            text = generate_latest(metrics.registry).decode()
            assert re.search(r'store_invalidation_leader\{server="mysql://[^"]+"\} 1\.0', text)
            assert re.search(r'store_invalidation_standby\{server="mysql://[^"]+"\} 1\.0', text)
            assert 'store_invalidation_heartbeat_age_seconds{host="A"}' in text
        first.kill()
        killed = time.monotonic()
        _wait_for(lambda: _lock_holder(servers) not in (None, leader), within_s=2)
        print(f"standby took the lock {time.monotonic() - killed:.2f} s after the leader's SIGKILL")
        with Store.from_config(raw) as operator:
            _wait_for(lambda: _roles_seen(operator)[0] == second.pid, within_s=5)
        with Store.from_config(raw) as writer, Store.from_config(raw) as reader:
            _lose_deletes(writer)
            pin = writer.create("pin", {"n": 0})
            assert reader.get(pin) == {"n": 0}
            writer.update(pin, {"n": 1})
            _wait_for(lambda: reader.get(pin) == {"n": 1}, within_s=5)
    finally:
        for proc in (first, second):
            if proc is not None:
                proc.kill()
                proc.wait()


def test_two_daemons_for_one_server_delete_each_key_once(servers: dict[str, Any], tmp_path: Path) -> None:
    raw = _raw(servers, "binlog")
    config = _config_file(tmp_path, raw)
    procs = [_daemon_process(config), _daemon_process(config)]
    try:
        _wait_for(lambda: _lock_holder(servers) is not None, within_s=15)
        time.sleep(3)  # both up: one leads, one waits
        with Store.from_config(raw) as writer:
            _lose_deletes(writer)
            pins = [writer.create("pin", {"n": 0}) for _ in range(20)]
            time.sleep(2)  # the creates' deletes are done
            before = _deletes(servers)
            for pin in pins:
                writer.update(pin, {"n": 1})
            _wait_for(lambda: _deletes(servers) - before >= len(pins), within_s=5)
            time.sleep(1.5)  # a second deleter would show by now
            assert _deletes(servers) - before == len(pins)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_a_writer_killed_after_its_commit_still_has_its_key_deleted(
    servers: dict[str, Any], tmp_path: Path
) -> None:
    raw = _raw(servers, "binlog")
    config = _config_file(tmp_path, raw)
    daemon = Daemon(StoreConfig.from_dict(raw), tick_s=0.2)
    daemon.start()
    try:
        with Store.from_config(raw) as reader:
            pin = reader.create("pin", {"n": 0})
            assert reader.get(pin) == {"n": 0}
            script = textwrap.dedent(f"""
                import os, signal
                from store import Store
                s = Store.from_config({str(config)!r})
                caches = s.admin_context().caches
                # Killed between the commit and the cache delete.
                caches.objects.invalidate = lambda keys: os.kill(os.getpid(), signal.SIGKILL)
                s.update({pin}, {{"n": 1}})
            """)
            done = subprocess.run(
                [sys.executable, "-c", script],
                env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
                timeout=60,
            )
            assert done.returncode == -signal.SIGKILL
            _wait_for(lambda: reader.get(pin) == {"n": 1}, within_s=5)
    finally:
        daemon.stop()


_IDLE = """
import sys, time
from store import Store
s = Store.from_config(sys.argv[1])
for pin in sys.argv[2:]:
    s.get(int(pin))
print("ready", flush=True)
time.sleep(120)
"""


@pytest.fixture(scope="module")
def second_db() -> Iterator[MariaDBServer]:
    """A second MariaDB with a ROW binlog, for the two-host figures."""
    db = MariaDBServer(free_port(), log_bin=True, server_id=8)
    db.start()
    try:
        yield db
    finally:
        db.remove()


def _questions(conn: Any) -> int:
    with conn.cursor() as cur:
        cur.execute("SHOW GLOBAL STATUS LIKE 'Questions'")
        return int(cur.fetchone()[1])


def _query_rate(ports: list[int], seconds: float) -> float:
    """Queries a second on the servers, less this reading's own: one connection a server, open
    across both reads, so that only the second SHOW STATUS of each counts (a connection opened
    for each read would add its own setup statements)."""
    conns = [pymysql.connect(host="127.0.0.1", port=p, user="root", autocommit=True) for p in ports]
    try:
        q0, t0 = sum(_questions(c) for c in conns), time.monotonic()
        time.sleep(seconds)
        q1, t1 = sum(_questions(c) for c in conns), time.monotonic()
    finally:
        for c in conns:
            c.close()
    return (q1 - q0 - len(ports)) / (t1 - t0)


def test_idle_processes_cost_the_server_nothing_with_the_daemon(
    servers: dict[str, Any], second_db: MariaDBServer, tmp_path: Path
) -> None:
    """Two hosts; 0, 1, 4 and 16 idle store processes: the servers' queries a second, and the cache
    deletes per write (the writer's own and the followers' or the daemon's)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    ports = [servers["db"].port, second_db.port]
    rates: dict[str, list[float]] = {}
    deletes: dict[str, float] = {}
    for mode in ("binlog", "follow"):
        raw = _raw(servers, mode)
        raw["hosts"]["B"] = second_db.url
        raw["map"] = [{"range": [0, 3], "master": "A"}, {"range": [4, 7], "master": "B"}]
        init_shards(StoreConfig.from_dict(raw))
        config = _config_file(tmp_path, raw)
        daemon = Daemon(StoreConfig.from_dict(raw)) if mode == "binlog" else None
        procs: list[subprocess.Popen[bytes]] = []
        try:
            if daemon is not None:
                daemon.start()
            with Store.from_config(raw) as writer:
                pins = [writer.create("pin", {"n": 0}, shard=shard) for shard in (0, 4) * 5]
                time.sleep(1)
                rates[mode] = [round(_query_rate(ports, 2.5), 1)]
                for count in (1, 4, 16):
                    started = [
                        subprocess.Popen(
                            [sys.executable, "-c", _IDLE, str(config), *map(str, pins)],
                            env=env,
                            stdout=subprocess.PIPE,
                        )
                        for _ in range(count - len(procs))
                    ]
                    procs += started
                    for proc in started:
                        assert proc.stdout is not None
                        assert proc.stdout.readline().strip() == b"ready"
                    time.sleep(1)
                    rates[mode].append(round(_query_rate(ports, 2.5), 1))
                before = _deletes(servers)
                for pin in pins:  # ten keys: a follower's pass deletes each key once, however often written
                    writer.update(pin, {"n": 1})
                # The daemon's or every follower's deletes land (later where other work loads the
                # machine), and then no more come.
                least = 2 if mode == "binlog" else 16
                _wait_for(lambda: _deletes(servers) - before >= least * len(pins), within_s=30)  # noqa: B023
                time.sleep(1.5)
                deletes[mode] = (_deletes(servers) - before) / len(pins)
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
                if proc.stdout is not None:
                    proc.stdout.close()
            if daemon is not None:
                daemon.stop()
    print(f"queries a second on 2 hosts with 0/1/4/16 idle processes: {rates}; deletes a write: {deletes}")
    # The daemon's ticks, one query each, 2 a second a host, whatever the processes: over 2.5 s that is
    # at most 6 a host counting the window's edges, and one position save (on the lock's connection,
    # only after the binlog moved, at most every 30 s).
    assert max(rates["binlog"]) <= (2 * (6 + 0.5)) / 2.5, rates
    assert max(rates["binlog"]) - min(rates["binlog"]) <= 1.5, rates
    assert rates["follow"][3] > 16 * 2, rates  # each process reads each host's log twice a second
    assert deletes["binlog"] == 2, deletes  # the writer's and the daemon's
    assert deletes["follow"] >= 16, deletes  # the writer's, then every process's follower's
