"""Fault scenarios of `store invalidate`: the writers' deletes are all lost and only the daemon's land.

Readers trust cache entries past ``max_stale_s`` on the daemon's heartbeats,
so a daemon that missed a delete or vouched for a break would show as a
read staler than the bound. Two daemon processes run for the one server
(one leads, one stands by); the leader is SIGKILLed mid-run and the
standby takes over; a third is started as the new standby.
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
from store.admin import init_shards
from tests.faults.history import History
from tests.faults.test_scenarios import MAX_STALE_S, SHARDS, Caches, raw_config, record, run, settle
from tests.faults.workload import Workload, prepare, seed_history
from tests.servers import MariaDBServer, free_port


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
        init_shards(StoreConfig.from_dict(reader_raw))
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
