"""`store invalidate` on PostgreSQL's WAL (``cache.invalidation: wal``): no log rows, a logical slot.

The change lines of ``test_decoding`` parse to the values the keys need; on a
PostgreSQL of the tests' own with ``wal_level = logical`` (and a memcached and
a Redis of their own), writers whose own deletes are all lost are seen by
readers within a few ticks, entries are trusted past the window while the
heartbeat is fresh, a standby takes the slot over when the leader stops,
and a server without logical WAL, or a slot of another plugin, is refused
by name.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from store import ConfigError, Store, StoreConfig, StoreError, decode_instagram
from store.admin import init_shards
from store.cache.leases import wall_ms
from store.invalidate import Daemon
from store.invalidate.wal import parse_change, slot_name
from tests.conftest import base_config
from tests.faults.proxy import FaultProxy
from tests.servers import PostgresServer, TLSFiles, free_port, start_memcached, start_redis
from tests.test_follower import _lose_deletes, _wait_for

# -- the change lines ---------------------------------------------------------------------


def test_change_lines_parse_to_their_leading_values() -> None:
    four = {"relation_counts": 4}.get
    line = (
        "table shard0003.pins: INSERT: id[bigint]:4040005359505509376 data[text]:'{\"t\": \"it''s a pin\"}' "
        "active[smallint]:1 ts[timestamp(3) with time zone]:'2026-11-28 00:36:38.123+00' version[bigint]:1"
    )
    assert parse_change(line) == ("shard0003", "pins", [4040005359505509376])
    assert parse_change(line, columns=lambda _t: 3) == (
        "shard0003",
        "pins",
        [4040005359505509376, '{"t": "it\'s a pin"}', 1],
    )
    counts = (
        "table ns_shard0012.relation_counts: UPDATE: relation[text]:'board_has_pins' "
        "from_id[bigint]:77 n[bigint]:5 version[bigint]:9"
    )
    assert parse_change(counts, columns=lambda t: four(t, 1)) == (
        "ns_shard0012",
        "relation_counts",
        ["board_has_pins", 77, 5, 9],
    )
    # A DELETE names the key's columns only; an UPDATE that moved the key gives the new row.
    assert parse_change(
        "table shard0001.board_has_pins: DELETE: from_id[bigint]:5 to_id[bigint]:6", columns=lambda _t: 2
    ) == ("shard0001", "board_has_pins", [5, 6])
    assert parse_change(
        "table shard0001.pins: UPDATE: old-key: id[bigint]:1 new-tuple: id[bigint]:2 data[text]:'x'"
    ) == ("shard0001", "pins", [2])
    # Quoted names, a value with spaces and quotes, null, an array type.
    assert parse_change(
        'table "odd ""s""".t: INSERT: "a b"[text]:\'x y\' n[integer]:null k[bigint[]]:\'{1,2}\'',
        columns=lambda _t: 3,
    ) == ('odd "s"', "t", ["x y", None, "{1,2}"])
    assert slot_name("", "Store-Prod") == "store_invalidate_store_prod"
    assert slot_name("ns_", "x" * 80) == ("ns_store_invalidate_" + "x" * 80)[:63]
    for other in ("BEGIN", "COMMIT", "table shard0001.pins: TRUNCATE: (no-flags)", "message: x"):
        assert parse_change(other) is None


# -- on a server --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, Any]]:
    """A PostgreSQL with logical WAL and a database ``store``, a memcached and a Redis: the module's own."""
    files = TLSFiles()
    port, mc_port, redis_port = free_port(), free_port(), free_port()
    pg = PostgresServer(port, files, wal_level="logical")
    mc = start_memcached(mc_port)
    rd = start_redis(redis_port)
    try:
        pg.create_database("store")
        yield {
            "pg": pg,
            "port": port,
            "url": f"postgresql+psycopg://postgres@127.0.0.1:{port}/store?sslmode=require",
            "memcached": f"127.0.0.1:{mc_port}",
            "redis": f"redis://127.0.0.1:{redis_port}/0",
        }
    finally:
        for proc in (mc, rd):
            proc.kill()
            proc.wait()
        pg.remove()
        files.remove()


def _raw(servers: dict[str, Any], **cache: Any) -> dict[str, Any]:
    raw = base_config(
        ids="instagram",
        shards=8,
        hosts={"A": servers["url"]},
        map=[{"range": [0, 7], "master": "A"}],
    )
    raw["cache"] = {
        "memcached": [servers["memcached"]],
        "redis": servers["redis"],
        "prefix": f"w{time.monotonic_ns() % 10**6}:",
        "max_stale_s": 30,
        "invalidation": "wal",
        **cache,
    }
    init_shards(StoreConfig.from_dict(raw))
    return raw


def _sql(servers: dict[str, Any], query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(
        host="127.0.0.1",
        port=servers["port"],
        user="postgres",
        dbname="store",
        sslmode="require",
        autocommit=True,
    ) as conn:
        cur = conn.execute(query)
        return list(cur.fetchall()) if cur.description else []


def _set_pin(servers: dict[str, Any], pin: int, n: int) -> None:
    """The pin's data made ``{"n": n}`` with plain SQL, around the store (no store deletes anything)."""
    schema = f"shard{decode_instagram(pin).shard_id:04d}"
    _sql(servers, f"UPDATE {schema}.pins SET data = '{{\"n\": {n}}}' WHERE id = {pin}")


def test_the_daemon_deletes_what_writers_lost_from_the_wal(servers: dict[str, Any]) -> None:
    raw = _raw(servers)
    daemon = Daemon(StoreConfig.from_dict(raw), tick_s=0.2)
    daemon.start()
    try:
        with Store.from_config(raw) as writer, Store.from_config(raw) as reader:
            _lose_deletes(writer)
            board = writer.create("board", {"n": 0})
            pin = writer.create("pin", {"n": 0}, near=board)
            writer.link("board_has_pins", board, pin)
            _wait_for(lambda: daemon.invalidators[0].heartbeat is not None, within_s=10)
            assert reader.get(pin, type_name="pin") == {"n": 0}  # cached now
            assert reader.links("board_has_pins", board) == [pin]
            assert reader.count("board_has_pins", board) == 1
            # A write made around the store (plain SQL: no store deletes anything) ...
            _set_pin(servers, pin, 7)
            # ... and the store's own writes with their deletes lost. The window is 30 s: only the
            # daemon's deletes can make the reader see these.
            pin2 = writer.create("pin", {"n": 9}, near=board)
            writer.link("board_has_pins", board, pin2)
            took = _wait_for(lambda: reader.get(pin, type_name="pin") == {"n": 7}, within_s=10)
            _wait_for(lambda: set(reader.links("board_has_pins", board)) == {pin, pin2}, within_s=10)
            _wait_for(lambda: reader.count("board_has_pins", board) == 2, within_s=10)
            writer.update(pin, {"n": 8}, type_name="pin")
            _wait_for(lambda: reader.get(pin, type_name="pin") == {"n": 8}, within_s=10)
            logs = _sql(
                servers, "SELECT count(*) FROM information_schema.tables WHERE table_name = 'cache_log'"
            )
            assert logs == [(0,)], "wal hosts write no log rows"
            status = daemon.status()[0]
            assert status["role"] == "leader"
            assert status["mode"] == "wal"
            assert status["keys_deleted"] >= 3
            slots = _sql(servers, "SELECT slot_name, plugin FROM pg_replication_slots")
            assert (
                slots
                == [(slot_name("", "store"), "test_decoding")]
                == [("store_invalidate_store", "test_decoding")]
            )
            print(f"wal: the reader saw the write made around the store after {took:.2f} s")
    finally:
        daemon.stop()


def test_heartbeats_extend_trust_past_the_window_while_the_daemon_runs(servers: dict[str, Any]) -> None:
    raw = _raw(servers, max_stale_s=1, timeout_ms=1000)
    daemon = Daemon(StoreConfig.from_dict(raw), tick_s=0.2)
    daemon.start()
    try:
        with Store.from_config(raw) as s:
            pin = s.create("pin", {"n": 0})
            _wait_for(lambda: daemon.invalidators[0].heartbeat is not None, within_s=10)
            time.sleep(0.6)  # past the heartbeat's S: entries filled from now on are vouched for
            assert s.get(pin, type_name="pin") == {"n": 0}
            time.sleep(1.6)  # older than the 1 s window
            expired = s.stats()["memcached"]["expired"]
            assert s.get(pin, type_name="pin") == {"n": 0}
            assert s.stats()["memcached"]["expired"] == expired, "not trusted past the window"
            daemon.stop()
            time.sleep(1.6)  # the heartbeat grows older than the window
            assert s.get(pin, type_name="pin") == {"n": 0}
            assert s.stats()["memcached"]["expired"] == expired + 1, ("back to the window", s.stats())
    finally:
        daemon.stop()


def test_a_server_without_logical_wal_is_refused_by_name(
    postgres_ready: StoreConfig, memcached_pair: list[str], redis_ready: str
) -> None:
    from dataclasses import replace

    cache = replace(
        postgres_ready.cache, memcached=tuple(memcached_pair), redis=(redis_ready,), invalidation="wal"
    )
    daemon = Daemon(replace(postgres_ready, cache=cache), tick_s=0.2)
    daemon.start()
    try:
        _wait_for(lambda: "wal_level" in daemon.invalidators[0].last_error, within_s=10)
        assert "set wal_level = logical" in daemon.invalidators[0].last_error
        assert daemon.invalidators[0].heartbeat is None
    finally:
        daemon.stop()


def test_wal_is_for_postgresql_hosts_only(mariadb_ready: StoreConfig) -> None:
    from tests.conftest import mariadb_config

    raw = mariadb_config()
    raw["cache"] = {"memcached": ["127.0.0.1:11211"], "invalidation": "wal"}
    with pytest.raises(ConfigError, match="by log or binlog only"):
        StoreConfig.from_dict(raw)


def test_a_slot_of_another_plugin_is_named_not_read(servers: dict[str, Any]) -> None:
    raw = _raw(servers)
    slot = slot_name("", "store")
    _sql(
        servers,
        f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '{slot}'",
    )
    _sql(servers, f"SELECT 1 FROM pg_create_logical_replication_slot('{slot}', 'pgoutput')")
    daemon = Daemon(StoreConfig.from_dict(raw), tick_s=0.2)
    daemon.start()
    try:
        _wait_for(lambda: "with plugin pgoutput" in daemon.invalidators[0].last_error, within_s=10)
        assert f"pg_drop_replication_slot('{slot}')" in daemon.invalidators[0].last_error
        assert daemon.invalidators[0].heartbeat is None
    finally:
        daemon.stop()
        _sql(servers, f"SELECT pg_drop_replication_slot('{slot}')")


def test_a_standby_takes_the_slot_over_when_the_leader_stops(servers: dict[str, Any]) -> None:
    """Two daemons for one server: one leads; once it stops, the other leads on the same slot and
    deletes what writes made around the store changed."""
    raw = _raw(servers)
    first, second = (
        Daemon(StoreConfig.from_dict(raw), tick_s=0.2),
        Daemon(StoreConfig.from_dict(raw), tick_s=0.2),
    )
    first.start()
    try:
        _wait_for(lambda: first.invalidators[0].heartbeat is not None, within_s=10)
        second.start()
        time.sleep(0.5)
        assert (first.status()[0]["role"], second.status()[0]["role"]) == ("leader", "standby")
        with Store.from_config(raw) as reader:
            pin = reader.create("pin", {"n": 0})
            other = reader.create("pin", {"n": 0})
            assert reader.get(other, type_name="pin") == {"n": 0}
            _set_pin(servers, other, 2)
            _wait_for(lambda: reader.get(other, type_name="pin") == {"n": 2}, within_s=10)
            # Only the leader reads the slot and deletes: the standby has deleted nothing.
            assert first.status()[0]["keys_deleted"] >= 1
            assert second.status()[0]["keys_deleted"] == 0
            first.stop()
            _wait_for(lambda: second.invalidators[0].heartbeat is not None, within_s=10)
            assert second.status()[0]["role"] == "leader"
            time.sleep(0.6)  # past the new leader's start: what it reads from now on it deletes
            assert reader.get(pin, type_name="pin") == {"n": 0}
            _set_pin(servers, pin, 5)
            _wait_for(lambda: reader.get(pin, type_name="pin") == {"n": 5}, within_s=10)
        assert len(_sql(servers, "SELECT 1 FROM pg_replication_slots")) == 1  # the one slot, taken over
    finally:
        first.stop()
        second.stop()


def _read_through(reader: Store, pin: int) -> Any:
    """The pin as ``reader`` reads it now; None while its server is down (a miss goes to it)."""
    try:
        return reader.get(pin, type_name="pin")
    except StoreError:
        return None


def test_a_write_made_before_postgresql_crashed_is_deleted_after_it_restarts(
    servers: dict[str, Any],
) -> None:
    """The server crashes (an immediate shutdown: it recovers from the WAL at the start) right after
    a write the daemon has not read yet (its ticks are 2 s apart, and a tick reads up to the
    position the tick before took). The slot outlives the crash: the daemon leads again, reads
    the write and deletes its key, and the reader sees it within the 30 s window only so. Then it
    goes on: a later write is seen too."""
    raw = _raw(servers)
    daemon = Daemon(StoreConfig.from_dict(raw), tick_s=2.0)
    daemon.start()
    try:
        with Store.from_config(raw) as reader:
            pin = reader.create("pin", {"n": 0})
            _wait_for(lambda: daemon.invalidators[0].heartbeat is not None, within_s=15)
            assert reader.get(pin, type_name="pin") == {"n": 0}  # cached
            _set_pin(servers, pin, 5)
            terms = daemon.invalidators[0].terms
            servers["pg"].restart(crash=True)
            _wait_for(lambda: _read_through(reader, pin) == {"n": 5}, within_s=25)
            # It lost the server and leads again (a tick may have read the write before the crash,
            # and the reader seen it before the daemon is back: wait for the new term).
            _wait_for(lambda: daemon.invalidators[0].terms > terms, within_s=15)
            _wait_for(lambda: daemon.status()[0]["role"] == "leader", within_s=5)
            _set_pin(servers, pin, 6)
            _wait_for(lambda: _read_through(reader, pin) == {"n": 6}, within_s=15)
    finally:
        daemon.stop()


def test_a_dropped_slot_is_made_again_and_vouched_for_from_then(servers: dict[str, Any]) -> None:
    """An operator drops the daemon's slot while it runs (the changes since its last read are gone
    with it, as a purged binlog's are). The daemon's next read fails, it steps down, leads again
    with a new slot, and its heartbeat vouches only from then (its S past the drop): entries
    cached before are trusted for the window alone. Writes after it are deleted."""
    raw = _raw(servers)
    daemon = Daemon(StoreConfig.from_dict(raw), tick_s=0.2)
    daemon.start()
    try:
        inv = daemon.invalidators[0]
        _wait_for(lambda: inv.heartbeat is not None, within_s=10)
        slot = slot_name("", "store")

        def dropped() -> bool:  # (refused while a read holds it: tried again)
            try:
                _sql(servers, f"SELECT pg_drop_replication_slot('{slot}')")
            except psycopg.errors.ObjectInUse:
                return False
            return True

        _wait_for(dropped, within_s=10)
        at = wall_ms()
        _wait_for(lambda: inv.heartbeat is not None and inv.heartbeat.since_ms >= at, within_s=10)
        assert inv.errors >= 1
        assert "does not exist" in inv.last_error, inv.last_error
        assert _sql(servers, f"SELECT plugin FROM pg_replication_slots WHERE slot_name = '{slot}'") == [
            ("test_decoding",)
        ]
        with Store.from_config(raw) as reader:
            pin = reader.create("pin", {"n": 0})
            time.sleep(0.6)
            assert reader.get(pin, type_name="pin") == {"n": 0}
            _set_pin(servers, pin, 3)
            _wait_for(lambda: reader.get(pin, type_name="pin") == {"n": 3}, within_s=10)
    finally:
        daemon.stop()


def test_the_daemon_cut_off_from_the_caches_sends_its_deletes_again_once_back(
    servers: dict[str, Any],
) -> None:
    """The daemon's way to memcached and Redis goes dark (a proxy swallows every byte) while writes
    made around the store land: the slot has moved past them, so the source keeps their keys and
    sends them again each tick, its heartbeat held (no T past the cut), its lead and term kept.
    Once the caches are back, the keys are deleted and the heartbeat moves on."""
    # (The reader's reads must not time out on a loaded machine: a miss would read the new value.)
    raw = _raw(servers, timeout_ms=1000, connect_timeout_ms=1000)
    mc_port = int(servers["memcached"].rpartition(":")[2])
    redis_port = int(servers["redis"].rpartition(":")[2].partition("/")[0])
    mc, rd = FaultProxy(mc_port).start(), FaultProxy(redis_port).start()
    daemon_raw = {
        **raw,
        "cache": {
            **raw["cache"],
            "memcached": [mc.address],
            "redis": f"redis://{rd.address}/0",
            "timeout_ms": 200,
        },
    }
    daemon = Daemon(StoreConfig.from_dict(daemon_raw), tick_s=0.2)
    daemon.start()
    try:
        inv = daemon.invalidators[0]
        _wait_for(lambda: inv.heartbeat is not None, within_s=10)
        with Store.from_config(raw) as reader:
            pin = reader.create("pin", {"n": 0})
            time.sleep(0.6)
            assert reader.get(pin, type_name="pin") == {"n": 0}  # cached
            mc.blackhole()
            rd.blackhole()
            cut = wall_ms()
            _set_pin(servers, pin, 4)
            _wait_for(lambda: inv.cache_errors >= 3, within_s=15)
            beat = inv.heartbeat
            assert beat is not None
            assert beat.covered_ms <= cut + 1000, "vouched past a write whose delete the caches missed"
            assert reader.get(pin, type_name="pin") == {"n": 0}  # not deleted: the window trusts it
            mc.restore()
            rd.restore()
            _wait_for(lambda: reader.get(pin, type_name="pin") == {"n": 4}, within_s=10)
            _wait_for(
                lambda: inv.heartbeat is not None and inv.heartbeat.covered_ms > cut + 1000, within_s=10
            )
        assert (inv.role, inv.terms, inv.errors) == ("leader", 1, 0), inv.status()
    finally:
        daemon.stop()
        mc.close()
        rd.close()


def test_a_writer_killed_between_its_commit_and_its_deletes_has_its_keys_deleted(
    servers: dict[str, Any], tmp_path: Path
) -> None:
    """A writer process SIGKILLed after its COMMIT, before any cache delete (its invalidation is the
    kill): the WAL has the commit, and the daemon deletes its key."""
    raw = _raw(servers)
    config = tmp_path / "store.yaml"
    config.write_text(yaml.safe_dump(raw))
    daemon = Daemon(StoreConfig.from_dict(raw), tick_s=0.2)
    daemon.start()
    try:
        with Store.from_config(raw) as reader:
            pin = reader.create("pin", {"n": 0})
            _wait_for(lambda: daemon.invalidators[0].heartbeat is not None, within_s=10)
            assert reader.get(pin, type_name="pin") == {"n": 0}  # cached
            script = textwrap.dedent(f"""
                import os, signal
                from store import Store
                s = Store.from_config({str(config)!r})
                caches = s.admin_context().caches
                caches.objects.invalidate = lambda keys: os.kill(os.getpid(), signal.SIGKILL)
                s.update({pin}, {{"n": 1}}, type_name="pin")
            """)
            done = subprocess.run(
                [sys.executable, "-c", script],
                env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
                timeout=60,
            )
            assert done.returncode == -signal.SIGKILL
            assert _sql(
                servers, f"SELECT data FROM shard{decode_instagram(pin).shard_id:04d}.pins WHERE id = {pin}"
            ) == [('{"n":1}',)]  # committed
            _wait_for(lambda: reader.get(pin, type_name="pin") == {"n": 1}, within_s=10)
    finally:
        daemon.stop()


def test_a_backlog_is_read_in_batches_and_every_key_deleted(
    servers: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With 4 lines a read, ten one-row transactions and one of ten rows (made around the store) come
    out of one tick's read whole: every pin's key, each transaction once."""
    from store.invalidate import wal
    from store.invalidate.daemon import _connector

    monkeypatch.setattr(wal, "READ_BATCH", 4)
    raw = _raw(servers)
    config = StoreConfig.from_dict(raw)
    daemon = Daemon(config)  # (not started: its keys' names only)
    applied: list[list[str]] = []
    with Store(config) as store:
        source = wal.WalSource("A", "", daemon._schema_keys, applied.append, from_now=True)
        conn = _connector(store.admin_context().engines.backend("A"), config.hosts["A"])()
        try:
            source.start(conn)
            pins = [store.create("pin", {"n": 0}) for _ in range(20)]
            source.tick()  # the first target: the creates are before it
            source.tick()  # their keys read and deleted; the next target
            applied.clear()

            def schema(p: int) -> str:
                return f"shard{decode_instagram(p).shard_id:04d}"

            for p in pins[:10]:
                _sql(servers, f"UPDATE {schema(p)}.pins SET data = '{{\"n\": 1}}' WHERE id = {p}")
            _sql(
                servers,
                "BEGIN; "
                + " ".join(
                    f"UPDATE {schema(p)}.pins SET data = '{{\"n\": 2}}' WHERE id = {p};" for p in pins[10:]
                )
                + " COMMIT",
            )
            source.tick()  # reads up to the target taken before the updates: none of them
            source.tick()  # reads up to one taken after them: all, in batches of 4 lines
        finally:
            source.stop()
            conn.close()
    texts = [t for call in applied for t in call]
    assert len(applied) == 1, "one tick's read gave every transaction at once"
    assert len(texts) == 11
    keyed = " ".join(texts)
    assert all(str(p) in keyed for p in pins)
    daemon.stop()
