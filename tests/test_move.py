"""`store move` against real MariaDB servers started by the test, with writers running throughout.

Writers keep creating and updating objects on every shard (the moving ones
too), a separate process that never reloads its map on its own keeps
writing to a moving shard, and shards 8-15 move from host A to host B.
Afterwards every acknowledged write is on the host the map names, exactly
once, and the source holds nothing written after the fence.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pymysql
import pytest
import yaml

from store import Store, StoreConfig, decode_pinterest
from store.admin import init_shards
from store.admin.move import Journal, MariaDBEngine, MoveError, Mover
from store.admin.move import mariadb as mariadb_engine
from tests.conftest import MEMCACHED_PORTS, REDIS_TEST_URL, base_config
from tests.moves import KILL_PHASES, finish_killed_move, kill_move_in_phase
from tests.servers import MariaDBServer, binlog_pair

SHARDS = 16
MOVING = range(8, 16)

pytestmark = pytest.mark.moves


@pytest.fixture
def pair() -> Iterator[tuple[MariaDBServer, MariaDBServer]]:
    with binlog_pair() as servers:
        yield servers


def config_for(source: MariaDBServer, target: MariaDBServer, tmp_path: Path, poll_s: float) -> dict[str, Any]:
    return base_config(
        shards=SHARDS,
        hosts={"A": source.url, "B": target.url},
        map=[{"range": [0, SHARDS - 1], "master": "A"}],
        map_source={"file": str(tmp_path / "map.yaml"), "poll_s": poll_s},
    )


STALE_WRITER = """
import sys, time, yaml
from store import Store
raw = yaml.safe_load(open(sys.argv[1]))
stop = sys.argv[2]
import os
shard = int(sys.argv[3]) if len(sys.argv) > 3 else 12
with Store.from_config(raw) as store:
    print("READY", store.shard_map.version, flush=True)
    while not os.path.exists(stop):
        pin = store.create("pin", {"stale": True}, shard=shard)
        print("ACK", pin, store.shard_map.version, flush=True)
        time.sleep(0.01)
"""


def rows(server: MariaDBServer, sql: str) -> list[tuple[Any, ...]]:
    conn = pymysql.connect(host="127.0.0.1", port=server.port, user="root")
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return list(cur.fetchall())
    finally:
        conn.close()


@pytest.fixture
def meta() -> Iterator[MariaDBServer]:
    server = MariaDBServer()  # the third server: it holds the live map
    try:
        server.start()
        yield server
    finally:
        server.remove()


BIG_SHARDS = 64
BIG_MOVING = range(32, 64)


def test_move_with_writers_loses_nothing(
    pair: tuple[MariaDBServer, MariaDBServer], meta: MariaDBServer, tmp_path: Path, own_caches: None
) -> None:
    import uuid

    source, target = pair
    prefix = f"mv{uuid.uuid4().hex[:8]}:"  # these servers' IDs repeat other tests' IDs

    def raw_config(poll_s: float) -> dict[str, Any]:
        return base_config(
            shards=BIG_SHARDS,
            hosts={"A": source.url, "B": target.url},
            map=[{"range": [0, BIG_SHARDS - 1], "master": "A"}],
            map_source={"table": meta.url, "poll_s": poll_s},
            cache={
                "memcached": [f"127.0.0.1:{MEMCACHED_PORTS[0]}"],
                "redis": REDIS_TEST_URL,
                "prefix": prefix,
            },
        )

    config = StoreConfig.from_dict(raw_config(0.2))
    init_shards(config)
    (tmp_path / "stale.yaml").write_text(yaml.safe_dump(raw_config(3600)))  # only a refusal reloads it
    stop_file = tmp_path / "stop"

    with Store(config) as store:
        # Each writer owns its objects and boards, so the final state of each is known.
        owned = {
            w: {
                "pins": [store.create("pin", {"n": 0}, shard=(w * 16 + k) % BIG_SHARDS) for k in range(32)],
                "boards": [
                    store.create("board", {"w": w}, shard=(w * 16 + k * 7) % BIG_SHARDS) for k in range(4)
                ],
            }
            for w in range(4)
        }
        acked: dict[int, dict[str, Any] | None] = {}  # None: deleted
        links: dict[tuple[int, int], bool] = {}
        for w in owned:
            for p in owned[w]["pins"]:
                acked[p] = {"n": 0}
        lock = threading.Lock()
        errors: list[BaseException] = []
        unmoved_errors: list[BaseException] = []
        done = threading.Event()

        def writer(w: int) -> None:
            rng = random.Random(w)
            pins, boards = list(owned[w]["pins"]), owned[w]["boards"]
            try:
                while not done.is_set():
                    r = rng.random()
                    shard = -1
                    try:
                        if r < 0.3:
                            shard = rng.randrange(BIG_SHARDS)
                            pin = store.create("pin", {"w": w, "n": 0}, shard=shard)
                            pins.append(pin)
                            with lock:
                                acked[pin] = {"w": w, "n": 0}
                        elif r < 0.6:
                            p = rng.choice(pins)
                            shard = decode_pinterest(p).shard_id
                            new = store.update(p, lambda o: {**o, "n": o["n"] + 1})
                            with lock:
                                acked[p] = new
                        elif r < 0.9:
                            b, p = rng.choice(boards), rng.choice(pins)
                            shard = decode_pinterest(b).shard_id
                            if rng.random() < 0.7:
                                store.link("board_has_pins", b, p)
                                links[(b, p)] = True
                            else:
                                store.unlink("board_has_pins", b, p)
                                links[(b, p)] = False
                        elif len(pins) > 10:
                            p = pins.pop(rng.randrange(len(pins)))
                            shard = decode_pinterest(p).shard_id
                            store.delete(p)
                            with lock:
                                acked[p] = None
                                for b in boards:  # a deleted pin leaves its boards' lists
                                    links[(b, p)] = False
                    except Exception as exc:
                        if shard not in BIG_MOVING:
                            unmoved_errors.append(exc)
                        raise
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        for w in owned:  # warm the caches: objects and lists cached before the move must stay right
            store.get_many(owned[w]["pins"])
            for b in owned[w]["boards"]:
                store.links("board_has_pins", b)
        stale = subprocess.Popen(
            [sys.executable, "-c", STALE_WRITER, str(tmp_path / "stale.yaml"), str(stop_file), "40"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert stale.stdout is not None
        assert stale.stdout.readline().startswith("READY 1")
        threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        mover = Mover(store, tmp_path / "move.json", say=lambda _m: None)
        plan = mover.plan(BIG_MOVING.start, BIG_MOVING.stop - 1, "B")
        assert plan.source == "A"
        assert len(plan.databases()) == 32
        journal = mover.start(plan)
        time.sleep(0.5)  # writers keep going on the new map
        done.set()
        for t in threads:
            t.join()
        stop_file.touch()
        out, _ = stale.communicate(timeout=30)
        assert errors == [], errors
        assert unmoved_errors == [], "a write to a shard that was not moving was refused"
        assert journal.phase == "done"
        stale_acks = [line.split() for line in out.splitlines() if line.startswith("ACK")]
        assert stale_acks, "the stale writer acknowledged nothing"
        assert stale_acks[-1][2] == "2", "the stale writer never saw the new map"
        for _ack, pin, _v in stale_acks:
            acked[int(pin)] = {"stale": True}

    with Store(config) as fresh:  # a new process's view: map version 2 from the meta server; caches on
        assert fresh.shard_map.version == 2
        assert fresh.stats()["memcached"]["errors"] == 0
        assert [(r.start, r.end, r.master) for r in fresh.shard_map] == [(0, 31, "A"), (32, 63, "B")]
        got = fresh.get_many(list(acked))
        for p, want in acked.items():
            assert got.get(p) == want, f"object {p}: {got.get(p)} != acknowledged {want}"
        for (b, p), linked in links.items():
            assert (p in fresh.links("board_has_pins", b, limit=1000)) == linked
            assert (b in fresh.links("pin_owned_by_board", p, limit=1000)) == linked
    for s in BIG_MOVING:
        db = f"db{s:05d}"
        on_b = {r[0] for r in rows(target, f"SELECT local_id FROM {db}.pins")}
        on_a = {r[0] for r in rows(source, f"SELECT local_id FROM moved_{db}.pins")}
        assert on_a <= on_b, f"shard {s}: rows on the fenced source that the target lacks"
        assert rows(
            source,
            "SELECT table_name FROM information_schema.tables "
            f"WHERE table_schema = '{db}' AND table_type = 'BASE TABLE'",
        ) == [("store_tombstone",)], "a moved table is still a table on the source"
        with pytest.raises(pymysql.err.MySQLError, match="store-tombstone"):
            rows(source, f"SELECT data FROM {db}.pins WHERE local_id = 1")
    print(
        f"fenced for {journal.timings['fenced_s']:.3f} s by {journal.timings['fenced_sessions']} session(s); "
        f"copy {journal.timings['copy_s']:.2f} s; "
        + ", ".join(f"{k} {v}" for k, v in journal.timings.items() if k.startswith("fence_"))
    )


def test_abort_before_the_switch_leaves_the_source_serving(
    pair: tuple[MariaDBServer, MariaDBServer], tmp_path: Path
) -> None:
    source, target = pair
    config = StoreConfig.from_dict(config_for(source, target, tmp_path, poll_s=0.2))
    init_shards(config)
    with Store(config) as store:
        pin = store.create("pin", {"n": 1}, shard=9)
        mover = Mover(store, tmp_path / "move.json", say=lambda _m: None)
        plan = mover.plan(8, 15, "B")
        j = Journal(plan.low, plan.high, plan.source, plan.target, None, map_version=1)
        j.save(tmp_path / "move.json")
        mover.engine.copy(j, plan.databases())  # copied, then "crashed" before catching up
        with pytest.raises(MoveError, match="is in phase catch_up"):
            mover.start(plan)
        mover.abort()
        assert Journal.load(tmp_path / "move.json").phase == "aborted"
        assert store.shard_map.version == 1
        assert store.update(pin, {"n": 2}) == {"n": 2}
        assert rows(
            target, "SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name LIKE 'db%'"
        ) == [(0,)]


def test_plan_refuses_what_it_cannot_do(pair: tuple[MariaDBServer, MariaDBServer], tmp_path: Path) -> None:
    source, target = pair
    with Store(StoreConfig.from_dict(config_for(source, target, tmp_path, poll_s=1))) as store:
        mover = Mover(store, tmp_path / "move.json", say=lambda _m: None)
        with pytest.raises(MoveError, match="already on A"):
            mover.plan(0, 3, "A")
        with pytest.raises(MoveError, match="not under hosts"):
            mover.plan(0, 3, "C")
        with pytest.raises(MoveError, match="must lie within"):
            mover.plan(10, 99, "B")


def test_the_target_replicates_from_the_sources_replication_host(
    pair: tuple[MariaDBServer, MariaDBServer], tmp_path: Path
) -> None:
    """The application reaches the source by one address, the target by another (replication_host).

    As in docker-compose.yml, where the application uses a published port and
    the servers each other's service names: here the application's URL for A
    is a proxy in front of it, and A's replication_host is its own port.
    """
    from store.admin.move import REPLICATION_NAME
    from tests.faults.proxy import FaultProxy

    source, target = pair
    with FaultProxy(source.port) as proxy:
        raw = config_for(source, target, tmp_path, poll_s=0.2)
        raw["hosts"]["A"] = {
            "url": f"mysql+pymysql://root@127.0.0.1:{proxy.port}",
            "replication_host": f"127.0.0.1:{source.port}",
        }
        config = StoreConfig.from_dict(raw)
        init_shards(config)
        seen: dict[str, Any] = {}
        with Store(config) as store:
            before = store.create("pin", {"n": 1}, shard=9)

            def say(msg: str) -> None:
                if msg.startswith("copy: loading"):  # after the dump: only replication carries it
                    seen["during"] = store.create("pin", {"n": 2}, shard=10)
                elif msg.startswith("catch up:") and "replicating" in msg:
                    conn = pymysql.connect(host="127.0.0.1", port=target.port, user="root")
                    try:
                        with conn.cursor(pymysql.cursors.DictCursor) as cur:
                            cur.execute(f"SHOW SLAVE '{REPLICATION_NAME}' STATUS")
                            seen["status"] = cur.fetchone()
                    finally:
                        conn.close()

            mover = Mover(store, tmp_path / "move.json", say=say)
            mover.start(mover.plan(8, 15, "B"))
            status = seen["status"]
            assert (status["Master_Host"], status["Master_Port"]) == ("127.0.0.1", source.port)
            assert proxy.port != source.port
            assert store.shard_map.master(10) == "B"
            assert store.get(before) == {"n": 1}
            assert store.get(seen["during"]) == {"n": 2}
        local = decode_pinterest(seen["during"]).local_id
        [(data,)] = rows(target, f"SELECT data FROM db00010.pins WHERE local_id = {local}")
        assert json.loads(data) == {"n": 2}


@pytest.mark.parametrize(("phase", "then"), KILL_PHASES)
def test_a_move_killed_in_each_phase_resumes_or_aborts_without_loss(
    pair: tuple[MariaDBServer, MariaDBServer], tmp_path: Path, phase: str, then: str
) -> None:
    source, target = pair
    raw = config_for(source, target, tmp_path, poll_s=0.2)
    config_file = tmp_path / "store.yaml"
    config_file.write_text(yaml.safe_dump(raw))
    config = StoreConfig.from_dict(raw)
    init_shards(config)
    with Store(config) as store:
        acked = {
            store.create("pin", {"n": i}, shard=s): {"n": i} for i, s in enumerate(list(range(SHARDS)) * 5)
        }
        done = threading.Event()
        errors: list[BaseException] = []

        def writer() -> None:
            rng = random.Random(1)
            try:
                while not done.is_set():
                    pin = store.create("pin", {"w": 1}, shard=rng.randrange(SHARDS))
                    acked[pin] = {"w": 1}
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        w = threading.Thread(target=writer)
        w.start()
        journal = tmp_path / "move.json"
        kill_move_in_phase(config_file, journal, phase)
        time.sleep(0.3)  # writers carry on against whatever state the crash left
        expected_master = finish_killed_move(store, journal, then)
        time.sleep(0.3)
        done.set()
        w.join()
        assert errors == [], errors
    with Store(config) as fresh:
        assert {fresh.shard_map.master(s) for s in MOVING} == {expected_master}
        got = fresh.get_many(list(acked))
        assert [p for p in acked if p not in got] == [], "acknowledged writes were lost"


def test_a_copy_that_differs_is_caught_before_the_fence_and_the_source_keeps_serving(
    pair: tuple[MariaDBServer, MariaDBServer], tmp_path: Path
) -> None:
    source, target = pair
    config = StoreConfig.from_dict(config_for(source, target, tmp_path, poll_s=0.2))
    init_shards(config)
    with Store(config) as store:
        pins = [store.create("pin", {"n": i}, shard=8 + i % 8) for i in range(16)]
        said: list[str] = []

        def say(msg: str) -> None:
            said.append(msg)
            if msg.startswith("catch up:") and sum(m.startswith("catch up:") for m in said) == 1:
                # The target's copy goes wrong behind replication's back (no event tells the source).
                conn = pymysql.connect(host="127.0.0.1", port=target.port, user="root", autocommit=True)
                try:
                    with conn.cursor() as cur:
                        cur.execute("SET SESSION sql_log_bin = 0")
                        cur.execute("UPDATE db00009.pins SET data = '{\"n\": -1}' LIMIT 1")
                        assert cur.rowcount == 1
                finally:
                    conn.close()

        mover = Mover(store, tmp_path / "move.json", say=say)
        with pytest.raises(MoveError, match=r"checksums differ for db00009\.pins at .*, before the fence"):
            mover.start(mover.plan(8, 15, "B"))
        assert not [m for m in said if m.startswith(("fence:", "verify:", "switch:"))], said
        assert Journal.load(tmp_path / "move.json").phase == "switch"
        assert store.shard_map.version == 1
        assert store.update(pins[1], {"n": 100}) == {"n": 100}  # the source never stopped serving
        mover.abort()
        assert store.get(pins[1]) == {"n": 100}


def seq(position: str) -> int:
    """The sequence number of a GTID position of one domain and server (``0-1-42``)."""
    return int(position.split("-")[2])


@contextmanager
def status_readers(
    server: MariaDBServer, errors: list[BaseException], *, table: str = "db00014.pins", snapshots: int = 3
) -> Iterator[None]:
    """While the block runs, sessions on ``server``: a writer inserting one row into ``table`` each
    transaction (its only column without a default: ``data``), one running ``SHOW GLOBAL STATUS``
    (as a monitoring agent does), and ``snapshots`` holding an old consistent snapshot that ask for
    its binlog position again and again. MariaDB hands a session its ``binlog_snapshot_position``
    through globals of the server that the others' SHOW STATUS overwrite. Their errors go to
    ``errors``."""
    done = threading.Event()

    def loop(statements: list[str], after: list[str]) -> None:
        conn = pymysql.connect(host="127.0.0.1", port=server.port, user="root", autocommit=True)
        try:
            with conn.cursor() as cur:
                for sql in statements:
                    cur.execute(sql)
                while not done.is_set():
                    for sql in after:
                        cur.execute(sql)
                        cur.fetchall()
        except BaseException as exc:  # surfaced by the caller
            errors.append(exc)
        finally:
            conn.close()

    snapshot_of_long_ago = ["START TRANSACTION WITH CONSISTENT SNAPSHOT"]
    threads = [
        threading.Thread(target=loop, args=([], [f"INSERT INTO {table} (data) VALUES ('{{}}')"])),
        threading.Thread(target=loop, args=([], ["SHOW GLOBAL STATUS"])),
        *(
            threading.Thread(
                target=loop, args=(snapshot_of_long_ago, ["SHOW STATUS LIKE 'binlog_snapshot_%'"])
            )
            for _ in range(snapshots)
        ),
    ]
    for t in threads:
        t.start()
    try:
        yield
    finally:
        done.set()
        for t in threads:
            t.join()


def test_the_checksums_snapshot_is_at_its_position_while_other_sessions_read_the_status(
    pair: tuple[MariaDBServer, MariaDBServer], tmp_path: Path
) -> None:
    """The position the checksum before the fence stops the target at is its source snapshot's own,
    while other sessions run SHOW STATUS (a monitoring agent's SHOW GLOBAL STATUS, another
    snapshot's): MariaDB hands each session its ``binlog_snapshot_position`` through globals of the
    server that those overwrite, a few transactions off. Every transaction here inserts one row
    into a moving table, so a snapshot at a position holds one row per GTID since the start."""
    source, target = pair
    config = StoreConfig.from_dict(config_for(source, target, tmp_path, poll_s=0.2))
    init_shards(config)
    errors: list[BaseException] = []
    with Store(config) as store:
        engine = MariaDBEngine(Mover(store, tmp_path / "move.json", say=lambda _m: None))
        j = Journal(8, 15, "A", "B", None)
        tables = [(d, t) for d, t, _r, _b in engine._tables("A", engine.units(8, 15))]
        conn = pymysql.connect(host="127.0.0.1", port=source.port, user="root", autocommit=True)
        with conn.cursor() as cur:
            cur.execute("SELECT @@gtid_binlog_pos")
            start = seq(str(cur.fetchone()[0]))
            cur.execute("SELECT COUNT(*) FROM db00014.pins")
            rows = int(cur.fetchone()[0])
        wrong = []
        try:
            with status_readers(source, errors), conn.cursor() as cur:
                for _ in range(1000):
                    at = engine._snapshot_at(j, cur, tables)
                    cur.execute("SELECT COUNT(*) FROM db00014.pins")
                    seen = int(cur.fetchone()[0]) - rows
                    cur.execute("ROLLBACK")
                    if seen != seq(at) - start:
                        wrong.append((at, seen, seq(at) - start))
        finally:
            conn.close()
        assert errors == [], errors
        assert wrong == [], f"{len(wrong)} snapshots off their position (at, rows seen, GTIDs): {wrong[:5]}"


#: How long the copy's dumps are taken again and again, and by how many threads at once.
DUMPING_S = 12
DUMPERS = 3


def test_the_copys_position_is_its_dumps_while_other_sessions_read_the_status(
    pair: tuple[MariaDBServer, MariaDBServer], tmp_path: Path
) -> None:
    """The GTID position the target replicates from after the copy is the one its dump holds, while
    other sessions run SHOW STATUS: mariadb-dump reads the position it prints from the same globals
    of the server as above. Every transaction here inserts one row into the dumped table, so a dump
    at a position holds one row per GTID since the start: none fewer (replication would never bring
    the missing rows), none more (strict replication would stop on a duplicate). A database of one
    table, so that a dump is quick: `DUMPERS` threads take the copy's dump (`MariaDBEngine._dump`)
    again and again for `DUMPING_S`, the writer writing throughout (a dump's position was wrong
    about once in a hundred)."""
    source, target = pair
    config = StoreConfig.from_dict(config_for(source, target, tmp_path, poll_s=0.2))
    rows(source, "CREATE DATABASE copied")
    rows(source, "CREATE TABLE copied.t (id BIGINT AUTO_INCREMENT PRIMARY KEY, data TEXT NOT NULL)")
    ((start,),) = rows(source, "SELECT @@gtid_binlog_pos")
    errors: list[BaseException] = []
    dumps: list[tuple[str, int, float]] = []  # (position, rows in the dump, the tables held still for)

    def dump_again_and_again(engine: MariaDBEngine, until: float) -> None:
        try:
            while time.monotonic() < until:
                j = Journal(14, 14, "A", "B", None)
                dump, at = engine._dump(j, ["copied"])
                dumps.append((at, len(re.findall(rb"\(\d+,'\{\}'\)", dump)), j.timings["copy_held_s"]))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    with Store(config) as store:
        engine = MariaDBEngine(Mover(store, tmp_path / "move.json", say=lambda _m: None))
        with status_readers(source, errors, table="copied.t"):
            until = time.monotonic() + DUMPING_S
            threads = [
                threading.Thread(target=dump_again_and_again, args=(engine, until)) for _ in range(DUMPERS)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    assert errors == [], errors
    wrong = [(at, n, seq(at) - seq(start)) for at, n, _held in dumps if n != seq(at) - seq(start)]
    assert wrong == [], (
        f"{len(wrong)} of {len(dumps)} dumps off their position (at, rows, GTIDs): {wrong[:5]}"
    )
    assert len(dumps) >= 100, len(dumps)  # enough to have met a wrong position before
    assert len({at for at, _n, _held in dumps}) >= 10, dumps[-5:]  # the writer wrote between them
    assert max(held for *_, held in dumps) < 2, sorted(held for *_, held in dumps)[-5:]  # writers' pause


def test_a_wait_for_the_target_longer_than_the_read_timeout_ends_in_its_own_error(
    pair: tuple[MariaDBServer, MariaDBServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The target is waited for in one statement (``MASTER_GTID_WAIT``): its connection waits for
    the reply as long as the wait takes, not only a session's read timeout (60 s, under the catch
    up's 120 s, where it ended in "Lost connection"). Scaled down: a read timeout of 1 s, a wait of
    3 s for a position the target never reaches."""
    source, target = pair
    config = StoreConfig.from_dict(config_for(source, target, tmp_path, poll_s=0.2))
    rows(source, "CREATE DATABASE db00014")
    rows(source, "CREATE TABLE db00014.t (id BIGINT PRIMARY KEY)")
    with Store(config) as store:
        engine = MariaDBEngine(Mover(store, tmp_path / "move.json", say=lambda _m: None))
        j = Journal(14, 14, "A", "B", None)
        engine.copy(j, ["db00014"])
        engine._start_replication(j, ["db00014"])
        monkeypatch.setattr(mariadb_engine, "READ_TIMEOUT_S", 1.0)
        t0 = time.monotonic()
        with pytest.raises(MoveError, match=r"did not catch up with A within 3 s \(IO Yes, SQL Yes"):
            engine._wait_level(j, "0-1-999999999", 3)
        # Past the read timeout, so the reply outlived it. (Not ">= 3": the server's own timer may
        # end its 3 s wait a few ms before the client's clock says so; a CI run saw 2.987 s.)
        assert time.monotonic() - t0 >= 2


def test_a_target_that_may_skip_row_events_is_checksummed_in_full_under_the_fence(
    pair: tuple[MariaDBServer, MariaDBServer], tmp_path: Path
) -> None:
    source, target = pair
    conn = pymysql.connect(host="127.0.0.1", port=target.port, user="root", autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute("SET GLOBAL slave_exec_mode = 'IDEMPOTENT'")
    finally:
        conn.close()
    config = StoreConfig.from_dict(config_for(source, target, tmp_path, poll_s=0.2))
    init_shards(config)
    with Store(config) as store:
        pins = [store.create("pin", {"n": i}, shard=8 + i % 8) for i in range(16)]
        said: list[str] = []
        mover = Mover(store, tmp_path / "move.json", say=said.append)
        journal = mover.start(mover.plan(8, 15, "B"))
        assert journal.phase == "done"
        assert not [m for m in said if "before the fence" in m], said
        verify = [m for m in said if m.startswith("verify:")]
        assert verify == ["verify: 72 table checksums equal on both sides"], said
        assert "checksum_s" not in journal.timings
        assert store.get_many(pins) == {p: {"n": i} for i, p in enumerate(pins)}


def test_the_fence_reports_where_its_time_went(
    pair: tuple[MariaDBServer, MariaDBServer], tmp_path: Path
) -> None:
    source, target = pair
    config = StoreConfig.from_dict(config_for(source, target, tmp_path, poll_s=0.2))
    init_shards(config)
    with Store(config) as store:
        for i in range(16):
            store.create("pin", {"n": i}, shard=8 + i % 8)
        said: list[str] = []
        mover = Mover(store, tmp_path / "move.json", say=said.append)
        journal = mover.start(mover.plan(8, 15, "B"))
    steps = [k for k in journal.timings if k.startswith("fence_")]
    assert steps == ["fence_lock_s", "fence_level_s", "fence_verify_s", "fence_rename_s", "fence_map_s",
                     "fence_unlock_s"]  # fmt: skip
    assert abs(sum(journal.timings[k] for k in steps) - journal.timings["fenced_s"]) < 0.01
    assert journal.timings["fenced_sessions"] == 4  # no writer: the sessions' locks never crossed one
    before = [m for m in said if m.startswith("catch up:") and "before the fence" in m]
    assert len(before) == 1, said
    assert before[0].startswith("catch up: 72 table checksums equal on both sides at 0-1-")
    held = [m for m in said if m.startswith("fence: held ")]
    assert len(held) == 1, said
    assert f"fence: held {journal.timings['fenced_s']:.3f} s (lock " in held[0]
    verify = [m for m in said if m.startswith("verify:")]
    assert len(verify) == 1, said
    assert "72 tables end with the same row on both sides" in verify[0]


def test_fence_sessions_whose_locks_cross_a_writer_give_way_to_one_session(
    pair: tuple[MariaDBServer, MariaDBServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:

    source, target = pair
    config = StoreConfig.from_dict(config_for(source, target, tmp_path, poll_s=0.2))
    init_shards(config)

    def connect() -> Any:
        return pymysql.connect(host="127.0.0.1", port=source.port, user="root", autocommit=True)

    with Store(config) as store:
        pins = [store.create("pin", {"n": i}, shard=8 + i % 2) for i in range(4)]
        mover = Mover(store, tmp_path / "move.json", say=lambda _m: None)
        j = Journal(8, 15, "A", "B", None)
        # A writer's transaction holds db00008.pins and goes on to db00009.pins, which the second
        # session locked while the first waits for db00008.pins: a wait MariaDB cannot see.
        writer, fence = connect(), [connect(), connect()]
        w = writer.cursor()
        w.execute("BEGIN")
        w.execute("UPDATE db00008.pins SET data = data")
        result: list[bool] = []
        locking = threading.Thread(
            target=lambda: result.append(
                MariaDBEngine(mover)._lock_together(
                    j, [c.cursor() for c in fence], [[("db00008", "pins")], [("db00009", "pins")]]
                )
            )
        )
        t0 = time.monotonic()
        locking.start()
        time.sleep(0.2)
        w.execute("UPDATE db00009.pins SET data = data")  # waits for the second session until it gives way
        w.execute("COMMIT")
        locking.join()
        assert result == [False]
        assert time.monotonic() - t0 < 5  # not the 10 s lock wait timeout
        for c in [writer, *fence]:
            c.close()
        assert store.update(pins[0], {"n": 10}) == {"n": 10}  # nothing is left locked
        assert store.update(pins[1], {"n": 11}) == {"n": 11}
        # A whole move whose sessions always give way: one session fences, and loses nothing.
        # (Giving way is forced: with no time to lock together, sessions could still win the
        # race on an idle machine.)
        monkeypatch.setattr(MariaDBEngine, "_lock_together", lambda _self, _j, _sessions, _groups: False)
        journal = mover.start(mover.plan(8, 15, "B"))
        assert journal.timings["fenced_sessions"] == 1
        assert store.shard_map.master(8) == "B"
        assert store.get_many(pins) == {
            pins[0]: {"n": 10},
            pins[1]: {"n": 11},
            pins[2]: {"n": 2},
            pins[3]: {"n": 3},
        }
