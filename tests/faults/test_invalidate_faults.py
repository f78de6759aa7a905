"""Fault scenarios of `store invalidate`: the writers' deletes are all lost and only the daemon's land.

Readers trust cache entries past ``max_stale_s`` on the daemon's heartbeats,
so a daemon that missed a delete or vouched for a break would show as a
read staler than the bound. The faults:

- two daemon processes for the one server (one leads, one stands by); the
  leader is SIGKILLed mid-run and the standby takes over; a third is
  started as the new standby;
- the binlog rotated and purged past the daemon's position while it is cut
  off from its server: its heartbeat stops, and it starts again from the
  current position with a new "since";
- the daemon cut off from memcached and Redis (readers fall back to the
  window, `store check` reports the stale heartbeat), then back;
- MariaDB SIGKILLed and restarted under the daemon: it leads again and
  resumes from its saved position, vouching without a break;
- a `store move` of half the shards to a new host while it runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pymysql
import yaml

from store import Store, StoreConfig
from store.admin import check_store, init_shards, repair_relations
from store.admin.move import Mover
from store.cache.leases import wall_ms
from store.invalidate import Daemon, Heartbeat, HostInvalidator, heartbeat_key
from store.invalidate.heartbeat import decode_heartbeat
from store.invalidate.sources import BinlogSource
from tests.faults.history import History
from tests.faults.proxy import FaultProxy
from tests.faults.test_scenarios import MAX_STALE_S, SHARDS, Caches, raw_config, record, run, settle
from tests.faults.workload import Workload, prepare, seed_history
from tests.servers import MariaDBServer, free_port


def _init(raw: dict[str, Any]) -> None:
    """`store init` for a scenario: with a query timeout for DDL on a server just started on a busy
    machine, not the scenario's 2 s (which bounds the calls under the fault)."""
    init_shards(StoreConfig.from_dict({**raw, "query_timeout_s": 60.0}))


def _daemon(config: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "store.cli", "invalidate", "--config", str(config)],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _lock_holder(port: int) -> int | None:
    conn = pymysql.connect(host="127.0.0.1", port=port, user="root", autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT IS_USED_LOCK('store_invalidate')")
            got = cur.fetchone()[0]
            return None if got is None else int(got)
    finally:
        conn.close()


def test_the_leading_daemon_sigkilled_with_two_running(fault_report: Any, tmp_path: Path) -> None:
    db = MariaDBServer(free_port(), log_bin=True, server_id=5)
    caches = Caches(free_port(), free_port())
    daemons: list[subprocess.Popen[bytes]] = []
    try:
        db.start()
        cache = {"invalidation": "binlog"}
        writer_raw = raw_config({"A": db.url}, cache={**caches.proxied(), **cache})
        reader_raw = raw_config({"A": db.url}, cache={**caches.direct(), **cache})
        _init(reader_raw)
        config = tmp_path / "daemon.yaml"
        config.write_text(yaml.safe_dump(reader_raw))
        daemons = [_daemon(config)]
        deadline = time.monotonic() + 20
        while _lock_holder(db.port) is None:
            assert time.monotonic() < deadline, "no daemon took the lock"
            time.sleep(0.1)
        daemons.append(_daemon(config))  # the standby: the first leads
        history = History()
        took: list[float] = []
        with Store.from_config(writer_raw) as writer, Store.from_config(reader_raw) as reader:
            owned = prepare(writer, 4, shards=range(SHARDS))
            seed_history(history, owned)

            def cut() -> None:  # every delete of the writer's is lost from here on
                caches.mc_proxy.blackhole()
                caches.redis_proxy.blackhole()

            def kill_leader() -> None:
                leader = _lock_holder(db.port)
                daemons[0].kill()
                killed = time.monotonic()
                while _lock_holder(db.port) in (None, leader) and time.monotonic() - killed < 5:
                    time.sleep(0.02)
                took.append(time.monotonic() - killed)
                daemons.append(_daemon(config))  # the new standby

            run(
                Workload(writer, owned, history, reader=reader, readers=4),
                [(1.0, nothing), (3.0, cut), (4.0, kill_leader), (1.0, nothing)],
            )
            expired = sum(s["expired"] for s in reader.stats().values())
        result = settle(
            reader_raw,
            owned,
            history,
            "store invalidate (binlog): writers' deletes all lost, two daemons, the leader SIGKILLed",
            notes=f"standby led {took[0]:.2f} s after the kill; readers re-read {expired} entries "
            f"older than {MAX_STALE_S:g} s",
        )
        record(fault_report, result)
        assert took[0] < 2.0, took
    finally:
        for proc in daemons:
            proc.kill()
            proc.wait()
        caches.close()
        db.remove()


def nothing() -> None:
    return None


# -- one daemon in this process, through one fault ---------------------------------------

BINLOG = {"invalidation": "binlog"}


def _sql(port: int, *queries: str) -> list[tuple[Any, ...]]:
    """The last query's rows, on the server at ``port`` (root, directly)."""
    conn = pymysql.connect(host="127.0.0.1", port=port, user="root", autocommit=True)
    try:
        with conn.cursor() as cur:
            for query in queries:
                cur.execute(query)
            return list(cur.fetchall())
    finally:
        conn.close()


def _wait_for(check: Any, what: str, *, within_s: float) -> float:
    began = time.monotonic()
    while not check():
        assert time.monotonic() - began < within_s, f"{what}: not within {within_s} s"
        time.sleep(0.05)
    return time.monotonic() - began


def _published(reader: Store, host: str = "A") -> Heartbeat | None:
    """The heartbeat of ``host`` that readers see in memcached now."""
    caches = reader.admin_context().caches
    assert caches.objects is not None
    key = heartbeat_key(caches.prefix, host)
    got = caches.objects.store.peek_many([key])
    return decode_heartbeat(got.get(key))


def _fresh(reader: Store, host: str = "A") -> bool:
    beat = _published(reader, host)
    return beat is not None and beat.covered_ms >= wall_ms() - 1000


def _source(inv: HostInvalidator) -> BinlogSource:
    assert isinstance(inv.source, BinlogSource)
    return inv.source


def _lose_writers_deletes(caches: Caches) -> None:
    """Every cache delete of the writers is lost from here on (their caches go dark)."""
    caches.mc_proxy.blackhole()
    caches.redis_proxy.blackhole()


def test_the_binlog_purged_past_the_daemons_position(fault_report: Any) -> None:
    db = MariaDBServer(free_port(), log_bin=True, server_id=11)
    caches = Caches(free_port(), free_port())
    link = FaultProxy(db.port)  # between the daemon and its server
    daemon: Daemon | None = None
    try:
        db.start()
        link.start()
        reader_raw = raw_config({"A": db.url}, cache={**caches.direct(), **BINLOG})
        writer_raw = raw_config({"A": db.url}, cache={**caches.proxied(), **BINLOG})
        daemon_raw = raw_config(
            {"A": f"mysql+pymysql://root@{link.address}"}, cache={**caches.direct(), **BINLOG}
        )
        _init(reader_raw)
        daemon = Daemon(StoreConfig.from_dict(daemon_raw))
        inv = daemon.invalidators[0]
        daemon.start()
        history = History()
        seen: dict[str, Any] = {}
        with Store.from_config(writer_raw) as writer, Store.from_config(reader_raw) as reader:
            owned = prepare(writer, 4, shards=range(SHARDS))
            seed_history(history, owned)
            _wait_for(lambda: _fresh(reader), "the first heartbeat", within_s=10)

            def cut_and_purge() -> None:
                link.reset()  # the daemon's lock connection and stream go; the server ends its dump
                seen["cut_ms"] = wall_ms()
                _wait_for(
                    lambda: not _sql(db.port, "SELECT id FROM information_schema.processlist "
                                     "WHERE command = 'Binlog Dump'"),
                    "the dump thread's end", within_s=5,
                )  # fmt: skip
                time.sleep(0.3)  # writes go on into the old file
                _sql(db.port, "FLUSH BINARY LOGS")
                time.sleep(0.3)
                current = _sql(db.port, "SHOW MASTER STATUS")[0][0]

                def purged() -> bool:  # the server keeps files until its binlog checkpoint passes them
                    _sql(db.port, f"PURGE BINARY LOGS TO '{current}'")
                    seen["files"] = [r[0] for r in _sql(db.port, "SHOW BINARY LOGS")]
                    return len(seen["files"]) == 1

                _wait_for(purged, "the purge", within_s=5)

            def restore() -> None:
                beat = _published(reader)
                assert beat is not None
                assert beat.covered_ms <= seen["cut_ms"], "vouched while cut off"
                seen["stopped_at_ms"] = beat.covered_ms
                link.restore()

            run(
                Workload(writer, owned, history, reader=reader, readers=4),
                [(1.0, nothing), (1.0, _lose_writers_deletes_of(caches)), (1.5, cut_and_purge),
                 (3.0, restore)],
            )  # fmt: skip
            expired = sum(s["expired"] for s in reader.stats().values())
            _wait_for(lambda: _fresh(reader), "a heartbeat after the restore", within_s=5)
            beat = _published(reader)
            assert beat is not None
            assert beat.since_ms > seen["cut_ms"], "vouched across the purged stretch"
        assert len(seen["files"]) == 1, f"the purge left {seen['files']}"
        assert _source(inv).restarts >= 1, inv.status()
        result = settle(
            reader_raw,
            owned,
            history,
            "store invalidate (binlog): cut off from its server, the binlog rotated and purged past it",
            notes=f"heartbeat stopped {(seen['cut_ms'] - seen['stopped_at_ms']) / 1000:.2f} s before "
            "the cut; "
            f"started again from the current position {_source(inv).restarts} time(s); readers re-read "
            f"{expired} entries older than {MAX_STALE_S:g} s",
        )
        record(fault_report, result)
    finally:
        if daemon is not None:
            daemon.stop()
        link.close()
        caches.close()
        db.remove()


def _lose_writers_deletes_of(caches: Caches) -> Any:
    return lambda: _lose_writers_deletes(caches)


def test_the_daemon_cut_off_from_the_caches_then_back(fault_report: Any) -> None:
    db = MariaDBServer(free_port(), log_bin=True, server_id=12)
    caches = Caches(free_port(), free_port())
    # The daemon's own way to the caches; the readers' stays up.
    mc, rd = FaultProxy(caches.memcached_port), FaultProxy(caches.redis_port)
    daemon: Daemon | None = None
    try:
        db.start()
        mc.start()
        rd.start()
        reader_raw = raw_config({"A": db.url}, cache={**caches.direct(), **BINLOG})
        writer_raw = raw_config({"A": db.url}, cache={**caches.proxied(), **BINLOG})
        daemon_cache = {"memcached": [mc.address], "redis": f"redis://{rd.address}/0", **BINLOG}
        _init(reader_raw)
        daemon = Daemon(StoreConfig.from_dict(raw_config({"A": db.url}, cache=daemon_cache)))
        inv = daemon.invalidators[0]
        daemon.start()
        history = History()
        seen: dict[str, Any] = {}
        with Store.from_config(writer_raw) as writer, Store.from_config(reader_raw) as reader:
            owned = prepare(writer, 4, shards=range(SHARDS))
            seed_history(history, owned)
            _wait_for(lambda: _fresh(reader), "the first heartbeat", within_s=10)

            def cut() -> None:
                mc.blackhole()
                rd.blackhole()
                seen["cut_ms"] = wall_ms()

            def check() -> None:  # past max_stale_s: `store check` reports the host
                report = check_store(reader, sample=5)
                seen["reported"] = [f.line() for f in report.problems if f.kind == "stale heartbeat"]

            def restore() -> None:
                mc.restore()
                rd.restore()

            run(
                Workload(writer, owned, history, reader=reader, readers=4),
                [(1.0, nothing), (1.0, _lose_writers_deletes_of(caches)), (2.5, cut), (0.5, check),
                 (3.0, restore)],
            )  # fmt: skip
            _wait_for(lambda: _fresh(reader), "a heartbeat after the caches came back", within_s=5)
            beat = _published(reader)
            assert beat is not None
            expired = sum(s["expired"] for s in reader.stats().values())
        assert len(seen["reported"]) == 1, seen["reported"]
        assert inv.role == "leader", inv.status()
        # It kept the lead and its stream through the cut: the deletes the caches did not take were
        # kept and sent again, tick after tick, until they were taken.
        assert inv.errors == 0, inv.status()
        assert inv.terms == 1, inv.status()
        assert inv.cache_errors > 0, inv.status()
        result = settle(
            reader_raw,
            owned,
            history,
            "store invalidate (binlog): the daemon cut off from memcached and Redis for 3 s, then back",
            notes=f"store check reported the stale heartbeat; fresh again within 3 s of the restore; "
            f"the lead kept ({inv.cache_errors} ticks' deletes sent again); "
            f"readers re-read {expired} entries older than {MAX_STALE_S:g} s",
        )
        record(fault_report, result)
    finally:
        if daemon is not None:
            daemon.stop()
        mc.close()
        rd.close()
        caches.close()
        db.remove()


def test_mariadb_sigkilled_and_restarted_under_the_daemon(fault_report: Any) -> None:
    db = MariaDBServer(free_port(), log_bin=True, server_id=13)
    caches = Caches(free_port(), free_port())
    daemon: Daemon | None = None
    try:
        db.start()
        reader_raw = raw_config({"A": db.url}, cache={**caches.direct(), **BINLOG})
        writer_raw = raw_config({"A": db.url}, cache={**caches.proxied(), **BINLOG})
        _init(reader_raw)
        daemon = Daemon(StoreConfig.from_dict(reader_raw))
        inv = daemon.invalidators[0]
        daemon.start()
        history = History()
        with Store.from_config(writer_raw) as writer, Store.from_config(reader_raw) as reader:
            owned = prepare(writer, 4, shards=range(SHARDS))
            seed_history(history, owned)
            _wait_for(lambda: _fresh(reader), "the first heartbeat", within_s=10)
            before = _published(reader)
            assert before is not None
            run(
                Workload(writer, owned, history, reader=reader, readers=4),
                [(1.0, nothing), (1.0, _lose_writers_deletes_of(caches)), (1.5, db.kill), (3.0, db.start)],
            )
            _wait_for(lambda: _fresh(reader), "a heartbeat after the restart", within_s=10)
            after = _published(reader)
            assert after is not None
            assert after.since_ms == before.since_ms, "not resumed without a break"
            fixed = repair_relations(writer)  # a pair write cut between its two commits (see the kill above)
            expired = sum(s["expired"] for s in reader.stats().values())
        assert inv.terms >= 2, inv.status()
        assert _source(inv).restarts == 0, inv.status()
        result = settle(
            reader_raw,
            owned,
            history,
            "store invalidate (binlog): MariaDB SIGKILLed and restarted under the daemon",
            notes=f"led again, term {inv.terms}, from its saved position (vouching since the start); "
            f"repair fixed {fixed.changes} pair(s); readers re-read {expired} entries older than "
            f"{MAX_STALE_S:g} s",
        )
        record(fault_report, result)
    finally:
        if daemon is not None:
            daemon.stop()
        caches.close()
        db.remove()


def test_a_move_to_a_new_host_while_the_daemon_runs(fault_report: Any, tmp_path: Path) -> None:
    source = MariaDBServer(free_port(), log_bin=True, server_id=14)
    target = MariaDBServer(free_port(), log_bin=True, server_id=15)
    caches = Caches(free_port(), free_port())
    daemon: Daemon | None = None
    try:
        source.start()
        target.start()
        hosts = {"A": source.url, "B": target.url}
        live = {"map_source": {"file": str(tmp_path / "map.yaml"), "poll_s": 0.2}}
        reader_raw = raw_config(hosts, cache={**caches.direct(), **BINLOG}, **live)
        writer_raw = raw_config(hosts, cache={**caches.proxied(), **BINLOG}, **live)
        for raw in (reader_raw, writer_raw):
            raw["map"] = [{"range": [0, 7], "master": "A"}]
        _init(reader_raw)
        daemon = Daemon(StoreConfig.from_dict(reader_raw))
        by_host = {inv.hosts[0]: inv for inv in daemon.invalidators}
        daemon.start()
        history = History()
        seen: dict[str, Any] = {}
        with (
            Store.from_config(writer_raw) as writer,
            Store.from_config(reader_raw) as reader,
            Store.from_config(reader_raw) as admin,
        ):
            owned = prepare(writer, 4, shards=range(SHARDS))
            seed_history(history, owned)
            _wait_for(
                lambda: _fresh(reader, "A") and _fresh(reader, "B"), "the first heartbeats", within_s=10
            )

            def move() -> None:
                seen["b_before"] = _source(by_host["B"]).transactions
                began = time.monotonic()
                mover = Mover(admin, tmp_path / "move.json", say=lambda line: None)
                mover.start(mover.plan(4, 7, "B"))
                seen["move_s"] = time.monotonic() - began
                seen["b_moved"] = _source(by_host["B"]).transactions

            run(
                Workload(writer, owned, history, reader=reader, readers=4),
                [(1.0, nothing), (1.0, _lose_writers_deletes_of(caches)), (2.0, move)],
            )
            assert {r.master for r in reader.admin_context().router.shard_map} == {"A", "B"}
            trust = reader.admin_context().caches.objects.follower  # type: ignore[union-attr]
            assert trust is not None
            # Both hosts' heartbeats vouch again (on a loaded machine a tick can land late, so
            # this waits for it, within a bound, rather than catching one instant).
            _wait_for(
                lambda: trust.trusted_since_ms(wall_ms(), 2000) is not None,
                "A and B vouched for after the move",
                within_s=10,
            )
            written_on_b = _source(by_host["B"]).transactions - seen["b_moved"]
            expired = sum(s["expired"] for s in reader.stats().values())
        assert written_on_b > 0, "no write reached the new host after the move"
        assert all(inv.errors == 0 for inv in daemon.invalidators), daemon.status()
        result = settle(
            reader_raw,
            owned,
            history,
            "store invalidate (binlog): shards 4-7 moved to a new host while it runs",
            notes=f"move took {seen['move_s']:.1f} s; {written_on_b} transactions on the new host after it, "
            f"deleted by its invalidator; readers re-read {expired} entries older than {MAX_STALE_S:g} s",
        )
        record(fault_report, result)
    finally:
        if daemon is not None:
            daemon.stop()
        caches.close()
        source.remove()
        target.remove()
