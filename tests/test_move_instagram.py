"""`store move` of MariaDB shards with Instagram IDs (a counter table and a BEFORE INSERT trigger).

MariaDB refuses to rename a table with triggers into another database (error
1435), which the fence's archive rename does: the move stashes such tables
within their database first. The counter travels with the shard (the
replication stream carries the trigger's row changes), so the target never
hands out an ID the source did, even after a burst right before the fence
with the source's clock running ahead.
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pymysql
import pytest
import yaml

from store import Store, StoreConfig, decode_instagram
from store.admin import check_store, init_shards
from store.admin.move import MoveError, Mover
from store.exceptions import StoreError
from store.ids import INSTAGRAM_EPOCH_MS
from tests.conftest import base_config
from tests.moves import KILL_PHASES, finish_killed_move, kill_move_in_phase
from tests.servers import MariaDBServer, binlog_pair

SHARDS = 16
MOVING = range(8, 16)
BHP = "board_has_pins"

pytestmark = pytest.mark.moves


@pytest.fixture
def pair() -> Iterator[tuple[MariaDBServer, MariaDBServer]]:
    with binlog_pair() as servers:
        yield servers


def config_for(source: MariaDBServer, target: MariaDBServer, tmp_path: Path, poll_s: float) -> dict[str, Any]:
    return base_config(
        ids="instagram",
        shards=SHARDS,
        hosts={"A": source.url, "B": target.url},
        map=[{"range": [0, SHARDS - 1], "master": "A"}],
        map_source={"file": str(tmp_path / "map.yaml"), "poll_s": poll_s},
    )


# A process with the old map (it reloads only when refused): create a pin, read it back.
STALE = """
import os, sys, time, yaml
from store import Store
raw = yaml.safe_load(open(sys.argv[1]))
with Store.from_config(raw) as store:
    print("READY", store.shard_map.version, flush=True)
    while not os.path.exists(sys.argv[2]):
        pin = store.create("pin", {"stale": True}, shard=12)
        assert store.get(pin, type_name="pin") == {"stale": True}
        print("ACK", pin, store.shard_map.version, store.shard_map.master(12), flush=True)
        time.sleep(0.01)
"""


def rows(server: MariaDBServer, sql: str) -> list[tuple[Any, ...]]:
    conn = pymysql.connect(host="127.0.0.1", port=server.port, user="root", autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return list(cur.fetchall())
    finally:
        conn.close()


def shard_of(i: int) -> int:
    return decode_instagram(i).shard_id


def test_instagram_move_with_writers_loses_nothing_and_repeats_no_id(
    pair: tuple[MariaDBServer, MariaDBServer], tmp_path: Path
) -> None:
    source, target = pair
    raw = config_for(source, target, tmp_path, poll_s=0.2)
    config = StoreConfig.from_dict(raw)
    init_shards(config)
    (tmp_path / "stale.yaml").write_text(yaml.safe_dump(config_for(source, target, tmp_path, 3600)))
    stop_file = tmp_path / "stop"
    made: list[int] = []  # every ID any create returned, here or by SQL
    acked: dict[int, dict[str, Any] | None] = {}  # None: deleted
    links: dict[tuple[int, int], bool] = {}
    lock = threading.Lock()
    errors: list[BaseException] = []
    done = threading.Event()

    with Store(config) as store:
        owned = {
            w: {
                "pins": [store.create("pin", {"n": 0}, shard=(w * 4 + k) % SHARDS) for k in range(16)],
                "boards": [store.create("board", {"w": w}, shard=(w * 4 + k * 5) % SHARDS) for k in range(4)],
            }
            for w in range(4)
        }
        for w in owned:
            made.extend(owned[w]["pins"] + owned[w]["boards"])
            acked.update({p: {"n": 0} for p in owned[w]["pins"]})

        def writer(w: int) -> None:
            rng = random.Random(w)
            pins, boards = list(owned[w]["pins"]), owned[w]["boards"]
            try:
                while not done.is_set():
                    r = rng.random()
                    if r < 0.3:
                        pin = store.create("pin", {"w": w, "n": 0}, shard=rng.randrange(SHARDS))
                        pins.append(pin)
                        with lock:
                            made.append(pin)
                            acked[pin] = {"w": w, "n": 0}
                    elif r < 0.6:
                        p = rng.choice(pins)
                        new = store.update(p, lambda o: {**o, "n": o["n"] + 1}, type_name="pin")
                        with lock:
                            acked[p] = new
                    elif r < 0.9:
                        b, p = rng.choice(boards), rng.choice(pins)
                        if rng.random() < 0.7:
                            store.link(BHP, b, p)
                            links[(b, p)] = True
                        else:
                            store.unlink(BHP, b, p)
                            links[(b, p)] = False
                    elif len(pins) > 8:
                        p = pins.pop(rng.randrange(len(pins)))
                        store.delete(p, type_name="pin")
                        with lock:
                            acked[p] = None
                            for b in boards:  # a deleted pin leaves its boards' lists
                                links[(b, p)] = False
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        stale = subprocess.Popen(
            [sys.executable, "-c", STALE, str(tmp_path / "stale.yaml"), str(stop_file)],
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
        plan = mover.plan(MOVING.start, MOVING.stop - 1, "B")  # the --dry-run path accepts these shards
        assert (plan.source, len(plan.databases())) == ("A", 8)
        assert {t for _d, t, _r, _b in plan.tables} >= {"id_counter", "pins", "boards"}
        ahead_ms = int(time.time() * 1000) + 60_000  # the trigger's clock: ms since 1970
        fence = mover.engine.fence_and_switch
        burst_ids: list[int] = []

        def burst_then_fence(*args: Any) -> None:
            # Right before the lock: a burst of creates, and the source's clock a minute ahead
            # for some of them, so its counter runs far beyond the target's clock.
            burst = [store.create("pin", {"burst": i}, shard=MOVING[i % 8]) for i in range(80)]
            conn = pymysql.connect(host="127.0.0.1", port=source.port, user="root", autocommit=True)
            try:
                with conn.cursor() as cur:
                    cur.execute(f"SET @store_clock_ms = {ahead_ms}")
                    for s in MOVING:
                        cur.execute(
                            f"INSERT INTO db{s:05d}.pins (data) SELECT '{{}}' FROM db{s:05d}.seq_1_to_300"
                        )
                        cur.execute(f"SELECT id FROM db{s:05d}.pins WHERE data = '{{}}'")
                        burst += [int(r[0]) for r in cur.fetchall()]
            finally:
                conn.close()
            burst_ids.extend(burst)
            with lock:
                made.extend(burst)
                acked.update({p: {"burst": i} for i, p in enumerate(burst[:80])})
                acked.update({p: {} for p in burst[80:]})
            fence(*args)

        mover.engine.fence_and_switch = burst_then_fence  # type: ignore[method-assign]
        journal = mover.start(plan)
        assert len(burst_ids) == 80 + 8 * 300
        before_switch = {s: max(p for p in burst_ids if shard_of(p) == s) for s in MOVING}
        assert journal.phase == "done"
        after = [store.create("pin", {"after": s}, shard=s) for s in MOVING]  # on the target now
        made.extend(after)
        acked.update({p: {"after": shard_of(p)} for p in after})
        time.sleep(0.5)  # writers keep going on the new map
        done.set()
        for t in threads:
            t.join()
        stop_file.touch()
        out, _ = stale.communicate(timeout=30)
        assert errors == [], errors
        acks = [line.split() for line in out.splitlines() if line.startswith("ACK")]
        assert acks, "the old-map process acknowledged nothing"
        assert acks[0][2:] == ["1", "A"]
        assert acks[-1][2:] == ["2", "B"], "the old-map process never moved to the target"
        for _ack, pin, _v, _host in acks:
            made.append(int(pin))
            acked[int(pin)] = {"stale": True}

    assert len(made) == len(set(made)), "an ID was handed out twice"
    for p in after:  # the target's counter carried on from the source's, a minute ahead
        assert p > before_switch[shard_of(p)]
        assert decode_instagram(p).ms >= ahead_ms - INSTAGRAM_EPOCH_MS
    with Store(config) as fresh:
        assert fresh.shard_map.version == 2
        assert [(r.start, r.end, r.master) for r in fresh.shard_map] == [(0, 7, "A"), (8, 15, "B")]
        got = fresh.get_many(list(acked), type_name="pin")
        for p, want in acked.items():
            assert got.get(p) == want, f"object {p}: {got.get(p)} != acknowledged {want}"
        for (b, p), linked in links.items():
            assert (p in fresh.links(BHP, b, limit=1000)) == linked
        report = check_store(fresh)
        assert report.ok, [f.line() for f in report.problems]
    for s in MOVING:
        db = f"db{s:05d}"
        assert rows(
            target, f"SELECT trigger_name FROM information_schema.triggers WHERE trigger_schema = '{db}'"
        )
        live = rows(source, f"SELECT table_name FROM information_schema.tables WHERE table_schema = '{db}' "
                    "AND table_type = 'BASE TABLE'")  # fmt: skip
        assert live == [("store_tombstone",)], "a moved table is still a table on the source"
        with pytest.raises(pymysql.err.MySQLError, match="store-tombstone"):
            rows(source, f"SELECT data FROM {db}.pins WHERE id = 1")
    assert rows(target, "SELECT @@slave_run_triggers_for_rbr") == [("NO",)]
    Mover(Store(config), tmp_path / "move.json", say=lambda _m: None).cleanup()
    assert rows(
        source, "SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name LIKE 'moved%'"
    ) == [(0,)]


def test_plan_refuses_what_the_move_cannot_finish(
    pair: tuple[MariaDBServer, MariaDBServer], tmp_path: Path
) -> None:
    source, target = pair
    raw = config_for(source, target, tmp_path, poll_s=1)
    raw["hosts"]["C"] = "postgresql://store@127.0.0.1:5432/store"
    raw["hosts"]["A2"] = source.url
    config = StoreConfig.from_dict(raw)
    init_shards(config)
    with Store(config) as store:
        mover = Mover(store, tmp_path / "move.json", say=lambda _m: None)
        with pytest.raises(MoveError, match="a move copies shards between servers of one kind"):
            mover.plan(8, 15, "C")
        with pytest.raises(MoveError, match="are the same server"):
            mover.plan(8, 15, "A2")
        rows(
            source,
            "CREATE TRIGGER db00009.boards_audit AFTER UPDATE ON db00009.boards FOR EACH ROW SET @x = 1",
        )
        with pytest.raises(MoveError, match=r"db00009.boards on A has the trigger\(s\) boards_audit"):
            mover.plan(8, 15, "B")
        rows(source, "DROP TRIGGER db00009.boards_audit")
        rows(source, "CREATE FUNCTION db00010.f() RETURNS INT DETERMINISTIC RETURN 1")
        with pytest.raises(MoveError, match="has the routine f"):
            mover.plan(8, 15, "B")
        rows(source, "DROP FUNCTION db00010.f")
        rows(source, "CREATE VIEW db00011.v AS SELECT 1 AS one")
        with pytest.raises(MoveError, match="is a view, not a table"):
            mover.plan(8, 15, "B")
        rows(source, "DROP VIEW db00011.v")
        rows(source, "CREATE DATABASE moved_db00012")
        with pytest.raises(MoveError, match="still holds the archive moved_db00012"):
            mover.plan(8, 15, "B")
        rows(source, "DROP DATABASE moved_db00012")
        rows(source, "SET GLOBAL binlog_format = 'MIXED'")
        try:
            with pytest.raises(MoveError, match="binlog-format=ROW"):
                mover.plan(8, 15, "B")
        finally:
            rows(source, "SET GLOBAL binlog_format = 'ROW'")
        assert mover.plan(8, 15, "B").source == "A"


def _rename_stays_refused(server: MariaDBServer) -> None:
    """The server still refuses the plain archive rename (else the stash would be needless)."""
    rows(server, "CREATE DATABASE IF NOT EXISTS scratch_a")
    rows(server, "CREATE DATABASE IF NOT EXISTS scratch_b")
    rows(server, "CREATE TABLE scratch_a.t (id INT PRIMARY KEY)")
    rows(server, "CREATE TRIGGER scratch_a.t_next BEFORE INSERT ON scratch_a.t FOR EACH ROW SET NEW.id = 1")
    with pytest.raises(pymysql.err.MySQLError, match="Trigger in wrong schema"):
        rows(server, "ALTER TABLE scratch_a.t RENAME scratch_b.t")
    rows(server, "DROP DATABASE scratch_a")
    rows(server, "DROP DATABASE scratch_b")


@pytest.mark.parametrize(("phase", "then"), KILL_PHASES)
def test_instagram_move_killed_in_each_phase_resumes_or_aborts_without_loss(
    pair: tuple[MariaDBServer, MariaDBServer], tmp_path: Path, phase: str, then: str
) -> None:
    source, target = pair
    if phase == "copy:":
        _rename_stays_refused(source)
    raw = config_for(source, target, tmp_path, poll_s=0.2)
    config_file = tmp_path / "store.yaml"
    config_file.write_text(yaml.safe_dump(raw))
    config = StoreConfig.from_dict(raw)
    init_shards(config)
    with Store(config) as store:
        made = [store.create("pin", {"n": i}, shard=s) for i, s in enumerate(list(range(SHARDS)) * 3)]
        acked = {p: {"n": i} for i, p in enumerate(made)}
        done = threading.Event()
        errors: list[BaseException] = []

        def writer(w: int) -> None:
            rng = random.Random(w)
            try:
                while not done.is_set():
                    pin = store.create("pin", {"w": w}, shard=rng.randrange(SHARDS))
                    made.append(pin)
                    acked[pin] = {"w": w}
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        journal = tmp_path / "move.json"
        kill_move_in_phase(config_file, journal, phase)
        time.sleep(0.3)  # writers carry on against whatever state the crash left
        expected = finish_killed_move(store, journal, then)
        time.sleep(0.3)
        after = [store.create("pin", {"after": s}, shard=s) for s in MOVING]
        made.extend(after)
        acked.update({p: {"after": shard_of(p)} for p in after})
        done.set()
        for t in threads:
            t.join()
        assert errors == [], errors
    assert len(made) == len(set(made)), "an ID was handed out twice"
    host = source if expected == "A" else target
    for s in MOVING:  # the ID trigger is where the shard is served, and only its own tables are there
        db = f"db{s:05d}"
        triggers = rows(host, "SELECT event_object_table FROM information_schema.triggers "
                        f"WHERE trigger_schema = '{db}' ORDER BY 1")  # fmt: skip
        assert triggers == [("boards",), ("pins",), ("users",)]
        assert rows(host, f"SELECT table_name FROM information_schema.tables WHERE table_schema = '{db}' "
                    "AND table_name LIKE '%moving'") == []  # fmt: skip
    with Store(config) as fresh:
        assert {fresh.shard_map.master(s) for s in MOVING} == {expected}
        got = fresh.get_many(list(acked), type_name="pin")
        assert [p for p in acked if got.get(p) != acked[p]] == [], "acknowledged writes were lost"
        report = check_store(fresh)
        assert report.ok, [f.line() for f in report.problems]


@pytest.mark.parametrize("then", ["abort", "resume"])
def test_a_switch_that_died_between_stash_and_archive_is_finished_or_undone(
    pair: tuple[MariaDBServer, MariaDBServer], tmp_path: Path, then: str
) -> None:
    """The mover dies after the fence renamed the tables with triggers within their databases, with
    one trigger already dropped: those tables are out of reach (never written without their trigger),
    and an abort brings them back with it, a resume archives them."""
    source, target = pair
    config = StoreConfig.from_dict(config_for(source, target, tmp_path, poll_s=0.2))
    init_shards(config)
    with Store(config) as store:
        acked = {store.create("pin", {"n": s}, shard=s): {"n": s} for s in range(SHARDS)}
        made = list(acked)
        mover = Mover(store, tmp_path / "move.json", say=lambda _m: None)
        plan = mover.plan(8, 15, "B")
        real = mover.engine._archive_stashed  # type: ignore[attr-defined]

        def die(host: str, dbs: list[str]) -> int:
            if not rows(source, "SELECT 1 FROM information_schema.tables WHERE table_name LIKE '%moving'"):
                return real(host, dbs)  # the switch's first look: nothing stashed yet
            rows(source, "DROP TRIGGER db00009.pins_next_id")  # the real one had got this far
            raise KeyboardInterrupt  # then the process went

        mover.engine._archive_stashed = die  # type: ignore[attr-defined]
        with pytest.raises(KeyboardInterrupt):
            mover.start(plan)
        stashed = rows(source, "SELECT table_schema, table_name FROM information_schema.tables "
                       "WHERE table_name LIKE '%moving' ORDER BY 1, 2")  # fmt: skip
        assert ("db00009", "pins__moving") in stashed
        assert store.shard_map.version == 1
        with pytest.raises(StoreError):  # the source still serves shard 9, but has no pins table there
            store.create("pin", {}, shard=9)
        fresh_mover = Mover(store, tmp_path / "move.json", say=lambda _m: None)
        if then == "abort":
            fresh_mover.abort()
            host, expected = source, "A"
        else:
            fresh_mover.resume()
            host, expected = target, "B"
        for s in MOVING:
            db = f"db{s:05d}"
            triggers = rows(host, "SELECT event_object_table FROM information_schema.triggers "
                            f"WHERE trigger_schema = '{db}' ORDER BY 1")  # fmt: skip
            assert triggers == [("boards",), ("pins",), ("users",)]
        assert (
            rows(source, "SELECT table_name FROM information_schema.tables WHERE table_name LIKE '%moving'")
            == []
        )
        after = [store.create("pin", {"after": s}, shard=s) for s in MOVING]
        assert all(p > max(q for q in made if shard_of(q) == shard_of(p)) for p in after)
        made += after
        acked.update({p: {"after": shard_of(p)} for p in after})
    assert len(made) == len(set(made))
    with Store(config) as fresh:
        assert {fresh.shard_map.master(s) for s in MOVING} == {expected}
        assert fresh.get_many(list(acked), type_name="pin") == acked
        report = check_store(fresh)
        assert report.ok, [f.line() for f in report.problems]
