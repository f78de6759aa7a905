"""Fault scenarios on real servers, each checked against its recorded history.

Every scenario runs the workload of `tests.faults.workload` (object and list
registers, pairs with inverses) while one fault happens, then reads the
databases back without a cache and checks: no acknowledged write missing,
no read staler than the last acknowledged write by more than
``cache.max_stale_s`` (here `MAX_STALE_S`), no pair whose two sides or whose
counts disagree. The ticket scenario runs threads of ID requests instead and
judges the IDs (see its comment). The rows go to the fault report (see
conftest.py):

    make faults      # or: .venv/bin/pytest tests/faults -m faults

Faults are injected on loopback only: a TCP proxy of the tests' own
(`FaultProxy`) in front of a server, or SIGKILL / SIGSTOP of server
processes the tests started themselves; every phase is bounded in time.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from store import Store, StoreConfig
from store.admin import check_store, init_shards, repair_relations
from store.admin.move import Mover
from store.config import TicketsConfig
from store.metrics import cache_breakers
from store.tickets import TicketAllocator, TicketError
from tests.asyncface import blocking_store
from tests.conftest import base_config
from tests.faults.history import History, ScenarioResult
from tests.faults.proxy import FaultProxy
from tests.faults.workload import BHP, DEFINITE, Owned, Workload, final_state, prepare, seed_history, verdict
from tests.servers import MariaDBServer, free_port, free_ports, start_memcached, start_redis

#: The staleness bound every scenario's caches keep (cache.max_stale_s), and the checker checks.
MAX_STALE_S = 2.0
SHARDS = 8


def raw_config(hosts: dict[str, str], *, cache: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """Eight shards: 0-3 on the first host, 4-7 on the second (or the first again)."""
    names = list(hosts)
    second = names[1] if len(names) > 1 else names[0]
    timeouts = {"connect_timeout_s": 1.0, "query_timeout_s": 2.0, "pool_timeout_s": 2.0}
    raw = base_config(
        shards=SHARDS,
        hosts=hosts,
        map=[{"range": [0, 3], "master": names[0]}, {"range": [4, 7], "master": second}],
        **{**timeouts, **extra},
    )
    if cache is not None:
        raw["cache"] = {
            "max_stale_s": MAX_STALE_S,
            "timeout_ms": 50,
            "connect_timeout_ms": 50,
            "cooldown_s": 1,
            **cache,
        }
    return raw


class Caches:
    """A memcached and a Redis of the scenario's own, each reachable directly and through a proxy."""

    def __init__(self, memcached_port: int, redis_port: int) -> None:
        self.memcached_port, self.redis_port = memcached_port, redis_port
        self.memcached = start_memcached(memcached_port)
        self.redis = start_redis(redis_port)
        self.mc_proxy = FaultProxy(memcached_port).start()
        self.redis_proxy = FaultProxy(redis_port).start()

    def direct(self) -> dict[str, Any]:
        return {
            "memcached": [f"127.0.0.1:{self.memcached_port}"],
            "redis": f"redis://127.0.0.1:{self.redis_port}/0",
        }

    def proxied(self) -> dict[str, Any]:
        return {"memcached": [self.mc_proxy.address], "redis": f"redis://{self.redis_proxy.address}/0"}

    def restart_redis(self) -> None:
        self.redis.kill()
        self.redis.wait()
        time.sleep(0.5)
        self.redis = start_redis(self.redis_port)

    def close(self) -> None:
        for proxy in (self.mc_proxy, self.redis_proxy):
            proxy.close()
        for proc in (self.memcached, self.redis):
            proc.kill()
            proc.wait()


@pytest.fixture
def mariadb() -> Iterator[MariaDBServer]:
    server = MariaDBServer()
    try:
        server.start()
        yield server
    finally:
        server.remove()


@pytest.fixture
def caches() -> Iterator[Caches]:
    c = Caches(*free_ports(2))
    try:
        yield c
    finally:
        c.close()


def run(workload: Workload, phases: list[tuple[float, Callable[[], None]]]) -> None:
    """Start the workload, then for each phase run its action and let the workload go on for its seconds."""
    workload.start()
    try:
        for seconds, action in phases:
            action()
            time.sleep(seconds)
    finally:
        workload.finish()


def settle(
    raw: dict[str, Any], owned: list[Owned], history: History, name: str, notes: str = ""
) -> ScenarioResult:
    """Read everything back without a cache and judge the history."""
    plain = {k: v for k, v in raw.items() if k != "cache"}
    with Store.from_config(plain) as store:
        final = final_state(store, owned)
    return verdict(name, history, final, stale_bound_s=MAX_STALE_S, notes=notes)


def record(fault_report: Any, result: ScenarioResult) -> None:
    fault_report.add(result)
    assert result.passed, result.as_row()
    assert "unexplained" not in result.notes, result.notes


def nothing() -> None:
    return None


# -- the scenarios ---------------------------------------------------------------------


#: The async face (`store.aio.AsyncStore`, its calls awaited on one event loop from the workload's
#: threads; ``native``: each call a greenlet on that loop, its socket waits the loop's) under the
#: scenarios that take a server away: the same history check.
FACES = [
    pytest.param("sync", id="sync"),
    pytest.param("async", id="async"),
    pytest.param("native", id="native"),
]
#: How each face is named in the fault report.
FACE_NOTE = {"sync": "", "async": " (AsyncStore)", "native": " (AsyncStore, native I/O)"}


@pytest.mark.parametrize("face", FACES)
def test_mariadb_killed_during_a_write_burst_and_restarted(
    mariadb: MariaDBServer, caches: Caches, fault_report: Any, face: str
) -> None:
    raw = raw_config({"A": mariadb.url, "B": mariadb.url}, cache=caches.direct())
    init_shards(StoreConfig.from_dict(raw))
    history = History()
    with blocking_store(StoreConfig.from_dict(raw), face) as store:
        owned = prepare(store, 4, shards=range(SHARDS))
        seed_history(history, owned)

        def restart() -> None:
            mariadb.start()

        run(Workload(store, owned, history), [(2.0, nothing), (1.5, mariadb.kill), (2.5, restart)])
    # A pair write whose inverse side committed just before the kill is
    # undone on the primary side by the crash: the repair job puts the
    # inverse side back in step with the primary (its documented job).
    with Store.from_config(raw) as fixer:
        fixed = repair_relations(fixer)
    result = settle(
        raw,
        owned,
        history,
        "MariaDB SIGKILLed during a write burst, restarted" + FACE_NOTE[face],
        notes=f"repair after restart fixed {fixed.changes} pair(s)",
    )
    record(fault_report, result)


def test_one_mariadb_host_blackholed(mariadb: MariaDBServer, caches: Caches, fault_report: Any) -> None:
    proxy = FaultProxy(mariadb.port).start()
    try:
        b_url = f"mysql+pymysql://root@127.0.0.1:{proxy.port}"
        raw = raw_config({"A": mariadb.url, "B": b_url}, cache=caches.direct(), query_timeout_s=1.0)
        init_shards(StoreConfig.from_dict(raw))
        history = History()
        with Store.from_config(raw) as store:
            owned = prepare(store, 4, shards=range(SHARDS))
            seed_history(history, owned)
            a_only = [p for mine in owned for p in mine.pins if store.locate(p).host == "A"]
            window: list[float] = []
            a_latency: list[float] = []

            def blackhole() -> None:
                proxy.blackhole()
                window.append(time.monotonic())

            def probe_a() -> None:  # host A keeps serving while B is dark
                while len(window) < 2:
                    if window:
                        t = time.perf_counter()
                        store.get_many(a_only)
                        a_latency.append(time.perf_counter() - t)
                    time.sleep(0.05)

            prober = threading.Thread(target=probe_a)
            prober.start()

            def restore() -> None:
                window.append(time.monotonic())
                proxy.restore()

            run(Workload(store, owned, history), [(1.5, nothing), (3.0, blackhole), (2.0, restore)])
            prober.join(10)
        b_ops = [
            op
            for op in history.ops()
            if op.invoked_at >= window[0]
            and op.completed_at is not None
            and op.invoked_at < window[1]
            and op.outcome != "ok"
        ]
        worst_b = max((op.latency_s or 0.0) for op in b_ops) if b_ops else 0.0
        assert a_latency, "host A was not probed during the blackhole"
        assert max(a_latency) < 0.5, f"host A slowed down while B was blackholed: {max(a_latency):.3f} s"
        # query_timeout_s 1 (+ a pool wait of up to pool_timeout_s 2 when every B connection hangs)
        assert worst_b < 4.0, f"a call to the blackholed host took {worst_b:.2f} s"
        result = settle(
            raw,
            owned,
            history,
            "one MariaDB host blackholed (query_timeout_s 1)",
            notes=f"host A's reads during it: worst {max(a_latency) * 1000:.0f} ms; "
            f"host B's calls failed within {worst_b:.2f} s",
        )
    finally:
        proxy.close()
    record(fault_report, result)


@pytest.mark.parametrize(
    ("fault", "face"),
    [
        ("delay", "sync"),
        ("reset", "sync"),
        ("blackhole", "sync"),
        ("reset", "async"),
        ("blackhole", "native"),
    ],
)
def test_memcached_and_redis_fail_and_come_back(
    mariadb: MariaDBServer, caches: Caches, fault_report: Any, fault: str, face: str
) -> None:
    raw = raw_config({"A": mariadb.url}, cache=caches.proxied())
    init_shards(StoreConfig.from_dict(raw))
    history = History()

    def inject() -> None:
        for proxy in (caches.mc_proxy, caches.redis_proxy):
            proxy.delay(0.03) if fault == "delay" else getattr(proxy, fault)()

    def restore() -> None:
        for proxy in (caches.mc_proxy, caches.redis_proxy):
            proxy.restore()

    with blocking_store(StoreConfig.from_dict(raw), face) as store:
        owned = prepare(store, 4, shards=range(SHARDS))
        seed_history(history, owned)
        run(Workload(store, owned, history), [(1.0, nothing), (2.0, inject), (3.0, restore)])
        stats = store.stats()
    errors = sum(s["errors"] + s["skipped"] for s in stats.values())
    what = {"delay": "delayed 30 ms", "reset": "reset", "blackhole": "blackholed"}[fault]
    result = settle(
        raw,
        owned,
        history,
        f"memcached and Redis {what}, then restored" + FACE_NOTE[face],
        notes=f"cache errors or skips: {errors}",
    )
    record(fault_report, result)


@pytest.mark.parametrize("trust_s", [MAX_STALE_S, 3600.0], ids=["bounded", "control"])
def test_caches_unreachable_from_the_writer_only(
    mariadb: MariaDBServer, caches: Caches, fault_report: Any, trust_s: float
) -> None:
    """The writers' invalidations are lost; the readers see the caches fine: stale for at most max_stale_s.

    The control run trusts entries for an hour, as the store did before: the
    checker must then find stale reads, or the scenario proves nothing.
    """
    writer_raw = raw_config({"A": mariadb.url}, cache={**caches.proxied(), "max_stale_s": trust_s})
    reader_raw = raw_config({"A": mariadb.url}, cache={**caches.direct(), "max_stale_s": trust_s})
    init_shards(StoreConfig.from_dict(writer_raw))
    history = History()
    with Store.from_config(writer_raw) as writer, Store.from_config(reader_raw) as reader:
        owned = prepare(writer, 4, shards=range(SHARDS))
        seed_history(history, owned)

        def cut() -> None:
            caches.mc_proxy.blackhole()
            caches.redis_proxy.blackhole()

        def mend() -> None:
            caches.mc_proxy.restore()
            caches.redis_proxy.restore()

        run(
            Workload(writer, owned, history, reader=reader, readers=4),
            [(1.0, nothing), (4.0, cut), (2.0, mend)],
        )
        expired = sum(s["expired"] for s in reader.stats().values())
    result = settle(
        writer_raw,
        owned,
        history,
        "memcached and Redis unreachable from the writer only",
        notes=f"readers re-read {expired} entries older than {MAX_STALE_S:g} s",
    )
    if trust_s > MAX_STALE_S:
        assert result.stale_beyond_bound > 0, (
            "the control run found no stale read: the scenario proves nothing"
        )
        return
    record(fault_report, result)


KILLED_WRITER = """
import sys
from store import Store
import yaml
raw = yaml.safe_load(open(sys.argv[1]))
with Store.from_config(raw) as store:
    store.update(int(sys.argv[2]), {"v": int(sys.argv[3])})
    print("RETURNED", flush=True)  # never: killed while its invalidation hangs
"""


def test_a_writer_killed_between_its_commit_and_its_invalidation(
    mariadb: MariaDBServer, caches: Caches, fault_report: Any, tmp_path: Path
) -> None:
    reader_raw = raw_config({"A": mariadb.url}, cache=caches.direct())
    # The writer's cache calls go into a blackhole and wait up to 10 s: it commits, then hangs.
    writer_raw = raw_config({"A": mariadb.url}, cache={**caches.proxied(), "timeout_ms": 10_000})
    init_shards(StoreConfig.from_dict(reader_raw))
    (tmp_path / "writer.yaml").write_text(yaml.safe_dump(writer_raw))
    caches.mc_proxy.blackhole()
    caches.redis_proxy.blackhole()
    history = History()
    plain = {k: v for k, v in reader_raw.items() if k != "cache"}
    with Store.from_config(reader_raw) as reader, Store.from_config(plain) as db:
        owned = prepare(db, 2, shards=range(SHARDS), per_worker=3)
        seed_history(history, owned)
        pins = [p for mine in owned for p in mine.pins]
        wl = Workload(
            reader, owned, history, reader=reader, readers=3, writers=False
        ).start()  # the writes: below
        kills = 0
        try:
            for round_ in range(1, 4):
                for pin in pins:
                    reader.get(pin)  # cached, at the version before the write
                    proc = subprocess.Popen(
                        [
                            sys.executable,
                            "-c",
                            KILLED_WRITER,
                            str(tmp_path / "writer.yaml"),
                            str(pin),
                            str(round_),
                        ],
                        stdout=subprocess.PIPE,
                        text=True,
                    )
                    op = history.invoke("write", ("obj", pin), round_)
                    deadline = time.monotonic() + 20
                    while (db.get(pin) or {}).get(
                        "v"
                    ) != round_:  # committed: the writer now hangs in its delete
                        assert time.monotonic() < deadline, "the killed writer's update never committed"
                        time.sleep(0.01)
                    history.ok(op)  # acknowledged from here on: the database shows it
                    os.kill(proc.pid, signal.SIGKILL)
                    out, _ = proc.communicate(timeout=10)
                    assert "RETURNED" not in out
                    kills += 1
                time.sleep(MAX_STALE_S + 0.5)  # readers go on through the bound
        finally:
            wl.finish()
    result = settle(
        reader_raw,
        owned,
        history,
        "a writer SIGKILLed between its commit and its invalidation",
        notes=f"{kills} writers killed",
    )
    record(fault_report, result)


def test_redis_restarted_under_load(mariadb: MariaDBServer, caches: Caches, fault_report: Any) -> None:
    raw = raw_config({"A": mariadb.url}, cache=caches.direct())
    init_shards(StoreConfig.from_dict(raw))
    history = History()
    with Store.from_config(raw) as store:
        owned = prepare(store, 4, shards=range(SHARDS))
        seed_history(history, owned)
        run(Workload(store, owned, history), [(1.5, nothing), (3.5, caches.restart_redis)])
    result = settle(raw, owned, history, "Redis killed and restarted (its versions gone)")
    record(fault_report, result)


def test_one_of_three_redis_servers_killed_and_restarted_under_load(
    mariadb: MariaDBServer, caches: Caches, fault_report: Any
) -> None:
    """Lists over three Redis servers; the one holding the most of the workload's lists is SIGKILLed
    mid-run, then started again. Every answer is checked against the history; a probe counts
    that the dead server's lists are misses (the database answers) while the others' stay cached,
    and that its lists are cached again once it is back."""
    ports = [free_port() for _ in range(3)]
    servers = [start_redis(port) for port in ports]
    urls = [f"redis://127.0.0.1:{port}/0" for port in ports]
    raw = raw_config({"A": mariadb.url}, cache={**caches.direct(), "redis": urls})
    init_shards(StoreConfig.from_dict(raw))
    history = History()
    try:
        with Store.from_config(raw) as store, Store.from_config(raw) as probe:
            owned = prepare(store, 4, shards=range(SHARDS))
            seed_history(history, owned)
            ring = probe.admin_context().caches.lists
            assert ring is not None
            backend: Any = ring.backend
            boards = sorted({m.board for m in owned} | {b for m in owned for b, _p in m.pairs})
            keys = {b: f"{raw['cache'].get('prefix', 's:')}l:{BHP}:{b}" for b in boards}
            where = {b: backend.index_for(keys[b]) for b in boards}
            victim = max(range(3), key=lambda i: sum(1 for b in boards if where[b] == i))
            lost = [b for b in boards if where[b] == victim]
            kept = [b for b in boards if where[b] != victim]
            assert lost, where
            assert kept, where

            def hits(board: int) -> int:
                """Cache hits of up to eight newest-first reads of the board's list, stopping at the
                first (the probe's thread only). Eight, not one: the workload's writes drop lists
                and its readers hold fill leases, which on a busy machine last a while."""
                before = probe.stats()["redis"]["hits"]
                for _ in range(8):
                    probe.links(BHP, board, limit=1, newest_first=True)
                    if probe.stats()["redis"]["hits"] > before:
                        break
                    time.sleep(0.01)
                return probe.stats()["redis"]["hits"] - before

            counted: dict[str, dict[str, int]] = {}

            def count(phase: str) -> None:
                counted[phase] = {
                    "lost": sum(hits(b) > 0 for b in lost),
                    "kept": sum(hits(b) > 0 for b in kept),
                }

            def kill() -> None:
                servers[victim].kill()  # SIGKILL
                servers[victim].wait()

            def down() -> None:
                for b in lost:  # trip the probe's breaker on the dead server
                    probe.links(BHP, b, limit=1)
                count("down")
                assert cache_breakers(probe)[("redis", f"127.0.0.1:{ports[victim]}/0")]  # open

            def back() -> None:
                servers[victim] = start_redis(ports[victim])

            def after() -> None:
                time.sleep(1.2)  # the breaker's cool-down (cache.cooldown_s: 1)
                count("back")

            run(
                Workload(store, owned, history, readers=4),
                [
                    (1.0, nothing),
                    (0.5, lambda: count("before")),
                    (0.2, kill),
                    (2.0, down),
                    (0.5, back),
                    (1.5, after),
                ],
            )
            stats = store.stats()["redis"]
    finally:
        for proc in servers:
            proc.kill()
            proc.wait()
    assert counted["before"] == {"lost": len(lost), "kept": len(kept)}, counted
    assert counted["down"] == {"lost": 0, "kept": len(kept)}, counted  # misses, and only those
    assert counted["back"] == {"lost": len(lost), "kept": len(kept)}, counted
    result = settle(
        raw,
        owned,
        history,
        "one of three Redis servers SIGKILLed under load, then restarted",
        notes=f"{len(lost)} of {len(boards)} lists on it: cached before, "
        f"{counted['down']['lost']} cached while down (others: {counted['down']['kept']} of {len(kept)}), "
        f"{counted['back']['lost']} after; Redis errors or skips: {stats['errors'] + stats['skipped']}",
    )
    record(fault_report, result)


def test_pool_exhaustion_and_a_mariadb_restart_under_load(mariadb: MariaDBServer, fault_report: Any) -> None:
    raw = raw_config({"A": mariadb.url}, pool_size=1, pool_timeout_s=0.3)  # two connections, twelve threads
    init_shards(StoreConfig.from_dict(raw))
    history = History()

    def restart() -> None:
        mariadb.kill()
        time.sleep(0.5)
        mariadb.start()

    roomy = raw_config({"A": mariadb.url})  # for the setup and the repair: the starved pool is the workload's
    with Store.from_config(roomy) as helper:
        owned = prepare(helper, 8, shards=range(SHARDS), per_worker=2)
    seed_history(history, owned)
    restarted: list[float] = []
    with Store.from_config(raw) as store:
        run(
            Workload(store, owned, history, readers=4, pause_s=0.0),
            [
                (2.0, nothing),
                (0.0, restart),
                (0.0, lambda: restarted.append(time.monotonic())),
                (3.0, nothing),
            ],
        )
    with Store.from_config(roomy) as helper:
        repair_relations(helper)
    late = [op for op in history.ops() if op.invoked_at > restarted[0] + 1.0]
    assert late, "nothing ran after the restart"
    assert sum(op.outcome == "ok" for op in late) > len(late) // 2, (
        "the store did not recover from the restart"
    )
    failed = [op for op in history.ops() if op.outcome == "fail" or op.indeterminate]
    result = settle(
        raw,
        owned,
        history,
        "pool exhaustion (2 connections, 12 threads), MariaDB restarted",
        notes=f"{len(failed)} calls refused or lost; ok again within 1 s of the restart",
    )
    record(fault_report, result)


OLD_MAP_WRITER = """
import sys, time
from store import Store
import yaml
raw = yaml.safe_load(open(sys.argv[1]))
pins = [int(p) for p in sys.argv[3].split(",")]
with Store.from_config(raw) as store:
    print("READY", flush=True)
    v = 0
    while True:
        v += 1
        for pin in pins:
            t0 = time.monotonic()
            try:
                store.update(pin, {"v": v})
                print("OK", pin, v, t0, time.monotonic(), store.shard_map.version, flush=True)
            except Exception as exc:
                print("ERR", pin, v, t0, time.monotonic(), type(exc).__name__, flush=True)
        if sys.stdin.closed:
            break
        import os
        if os.path.exists(sys.argv[2]):
            break
        time.sleep(0.01)
"""


def test_a_move_with_writers_an_old_map_process_and_an_init_in_the_middle(
    caches: Caches, fault_report: Any, tmp_path: Path
) -> None:
    source = MariaDBServer(log_bin=True, server_id=1)
    target = MariaDBServer(log_bin=True, server_id=2)
    try:
        source.start()
        target.start()
        hosts = {"A": source.url, "B": target.url}
        raw = raw_config(
            hosts, cache=caches.direct(), map_source={"file": str(tmp_path / "map.yaml"), "poll_s": 0.2}
        )
        raw["map"] = [{"range": [0, 7], "master": "A"}]
        config = StoreConfig.from_dict(raw)
        init_shards(config)
        history = History()
        with Store(config) as store:
            owned = prepare(store, 4, shards=range(SHARDS))
            seed_history(history, owned)
            old_pins = [store.create("pin", {"v": 0}, shard=s) for s in (4, 5, 6, 7)]
            for p in old_pins:
                history.ok(history.invoke("write", ("obj", p), 0))
            old_raw = {**raw, "map_source": {**raw["map_source"], "poll_s": 3600}}
            (tmp_path / "old.yaml").write_text(yaml.safe_dump(old_raw))
            stop_file = tmp_path / "stop"
            old = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    OLD_MAP_WRITER,
                    str(tmp_path / "old.yaml"),
                    str(stop_file),
                    ",".join(map(str, old_pins)),
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            assert old.stdout is not None
            assert old.stdout.readline().strip() == "READY"
            inits: list[str] = []

            # An operator adds a type and runs init in the middle of the move.
            grown = StoreConfig.from_dict(
                {**raw, "types": {**raw["types"], "comment": {"id": 9, "table": "comments"}}}
            )

            def say(line: str) -> None:
                if line.startswith("catch up:"):
                    report = init_shards(grown)
                    inits.append(f"{report.tables_created} tables created")

            def move() -> None:
                mover = Mover(store, tmp_path / "move.json", say=say)
                mover.start(mover.plan(4, 7, "B"))

            run(Workload(store, owned, history), [(1.0, nothing), (1.0, move), (1.0, nothing)])
            stop_file.touch()
            out, _ = old.communicate(timeout=60)
            saw = set()
            for line in out.splitlines():
                parts = line.split()
                if parts and parts[0] in ("OK", "ERR"):
                    op = history.invoke("write", ("obj", int(parts[1])), int(parts[2]))
                    # The process's own clock: CLOCK_MONOTONIC is the machine's, shared by processes.
                    op.invoked_at = float(parts[3])
                    if parts[0] == "OK":
                        history.ok(op)
                        saw.add(parts[5])
                    else:
                        history.unknown(op, parts[5])
                    op.completed_at = float(parts[4])
            assert "2" in saw, "the old-map process never wrote by the new map"
        with Store(grown) as after:  # every shard whole where it lives now, the new type's table included
            report = check_store(after)
            assert report.ok, [f.line() for f in report.problems]
        result = settle(
            raw,
            [*owned, Owned(old_pins, owned[0].board, owned[0].spare, [])],
            history,
            "a move during the writers, an old-map process, init re-run mid-move",
            notes=f"init mid-move: {', '.join(inits) or 'not run'}; store check ok after",
        )
    finally:
        source.remove()
        target.remove()
    assert inits, "init did not run during the move"
    record(fault_report, result)


def test_a_ticket_server_killed_and_restarted_under_load(fault_report: Any) -> None:
    # The tickets' promise in this table's terms: "missing" counts IDs handed
    # out twice, and IDs skipped beyond the ID statements whose reply was lost
    # (a lost reply may hide a commit: the one way an ID is skipped).
    pair = [MariaDBServer(free_port()) for _ in range(2)]
    try:
        for s in pair:
            s.start()
        alloc = TicketAllocator(
            TicketsConfig.from_dict(
                {
                    "servers": [s.url for s in pair],
                    "counters": ["photos"],
                    "timeout_s": 1,
                    "retry_after_s": 0.5,
                }
            )
        )
        alloc.init()
        stop = threading.Event()
        lock = threading.Lock()
        ids: list[int] = []
        calls = {"attempted": 0, "failed": 0}
        worst = [0.0]

        def take() -> None:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    value = alloc.next("photos")
                except TicketError:
                    value = None
                took = time.monotonic() - started
                with lock:
                    calls["attempted"] += 1
                    worst[0] = max(worst[0], took)
                    if value is None:
                        calls["failed"] += 1
                    else:
                        ids.append(value)

        def restart() -> None:
            pair[1].start()

        threads = [threading.Thread(target=take) for _ in range(8)]
        for th in threads:
            th.start()
        try:
            for seconds, action in [(2.0, nothing), (1.5, pair[1].kill), (2.5, restart)]:
                action()
                time.sleep(seconds)
        finally:
            stop.set()
            for th in threads:
                th.join()
        stats = alloc.stats()
        alloc.close()
    finally:
        for s in pair:
            s.remove()
    twice = len(ids) - len(set(ids))
    skipped = []
    for residue in (1, 0):
        mine = [i for i in set(ids) if i % 2 == residue]
        skipped.append((max(mine) - min(mine)) // 2 + 1 - len(mine))
    unknown = [s.unknown for s in stats]
    assert skipped[0] == 0, "server 1 stayed up and skipped an ID"
    assert calls["failed"] == 0, "a call failed while server 1 was up"
    assert stats[1].served > 0
    result = ScenarioResult(
        "ticket pair, 8 threads, server 2 SIGKILLed and restarted",
        attempted=calls["attempted"],
        acknowledged=len(ids),
        failed=calls["failed"],
        unknown=sum(unknown),
        missing=twice + sum(max(0, s - u) for s, u in zip(skipped, unknown, strict=True)),
        stale_beyond_bound=0,
        inverse_mismatches=0,
        worst_latency_s=worst[0],
        notes=f"IDs skipped: server 1 {skipped[0]}, server 2 {skipped[1]} (lost replies {unknown[1]}); "
        f"handed out twice: {twice}",
    )
    record(fault_report, result)


def test_the_map_tables_server_killed_then_frozen(fault_report: Any) -> None:
    """The live map's table on a server of its own, SIGKILLed, restarted, then SIGSTOPped: calls on
    the shards' healthy host go on with the last map, none fails, none waits on the map's server."""
    query_timeout_s = 1.0
    shards, meta = MariaDBServer(free_port()), MariaDBServer(free_port())
    try:
        shards.start()
        meta.start()
        raw = raw_config(
            {"A": shards.url, "B": shards.url},
            query_timeout_s=query_timeout_s,
            map_source={"table": meta.url, "poll_s": 0.2},
        )
        init_shards(StoreConfig.from_dict(raw))
        history = History()
        with Store.from_config(raw) as store:
            live = store.admin_context().live
            owned = prepare(store, 4, shards=range(SHARDS))
            seed_history(history, owned)
            ages: list[tuple[float, float | None]] = []
            stop = threading.Event()

            def create() -> None:  # creates and their first link: new rows on every shard
                rng = random.Random(3)
                user = store.create("user", {"creates": 1}, shard=0)
                while not stop.is_set():
                    pin = history.run(
                        "create",
                        ("create", None),
                        None,
                        lambda: store.create("pin", {"new": 1}, shard=rng.randrange(SHARDS)),
                        definite_failures=DEFINITE,
                        reraise=False,
                    )
                    if pin is not None:
                        history.run(
                            "create",
                            ("create-link", pin),
                            None,
                            lambda p=pin: store.link("users_has_pins", user, p),
                            definite_failures=DEFINITE,
                            reraise=False,
                        )
                    ages.append((time.monotonic(), live.age_s))
                    time.sleep(0.01)

            marks: dict[str, float] = {}

            def mark(name: str, action: Callable[[], None]) -> Callable[[], None]:
                def marked() -> None:
                    action()
                    marks[name] = time.monotonic()

                return marked

            creator = threading.Thread(target=create, name="creator")
            creator.start()
            try:
                run(
                    Workload(store, owned, history),
                    [
                        (1.0, nothing),
                        (3.0, mark("killed", meta.kill)),
                        (2.0, mark("restarted", meta.start)),
                        (3.0, mark("frozen", meta.freeze)),
                        (2.0, mark("thawed", meta.thaw)),
                    ],
                )
            finally:
                stop.set()
                creator.join(30)
            deadline = time.monotonic() + 10
            while (live.age_s or 0.0) > 1.0 and time.monotonic() < deadline:
                time.sleep(0.05)
            after = live.age_s
            errors = live.status().check_errors

        def oldest_between(start: str, end: str) -> float:
            return max((age or 0.0) for t, age in ages if marks[start] <= t <= marks[end])

        killed, frozen = oldest_between("killed", "restarted"), oldest_between("frozen", "thawed")
        ops = history.ops()
        not_ok = [op for op in ops if op.outcome != "ok"]
        worst = max((op.latency_s or 0.0) for op in ops)
        assert not_ok == [], f"{len(not_ok)} calls failed, e.g. {not_ok[:3]}"
        assert worst <= query_timeout_s + 0.5, f"the slowest call took {worst:.3f} s"
        assert killed > 2.5, f"the map's age did not grow while its server was down ({killed:.2f} s)"
        assert frozen > 2.5, f"the map's age did not grow while its server was frozen ({frozen:.2f} s)"
        assert after is not None
        assert after <= 1.0, f"the map's age did not drop back: {after:.2f} s"
        creates = sum(1 for op in ops if op.kind == "create")
        result = settle(
            raw,
            owned,
            history,
            "the map table's server SIGKILLed, restarted, then SIGSTOPped (query_timeout_s 1)",
            notes=f"{creates} creates and links among them; the map's age rose to {killed:.1f} s "
            f"(killed) and {frozen:.1f} s (frozen), {errors} failed reads of it, {after:.1f} s after",
        )
    finally:
        meta.thaw()
        meta.remove()
        shards.remove()
    record(fault_report, result)
