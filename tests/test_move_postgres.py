"""`store move` of PostgreSQL schema shards (``ids: instagram``) between two clusters the tests start.

The move replicates logically (a publication on the source, a subscription
on the target), fences with ``LOCK TABLE ... IN EXCLUSIVE MODE``, verifies
counts and hashes under the lock, carries each schema's ID counter, and
leaves a tombstone on the source that refuses every read and write. Writers
run throughout, and a process holding the old map keeps writing to a moving
shard: it is refused by the tombstone and carries on on the new host.
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from click.testing import CliRunner

from store import ShardMovedError, Store, StoreConfig, decode_instagram
from store.admin import check_store, init_shards
from store.admin.move import Journal, MoveError, Mover, PostgresEngine
from store.admin.pg_move import PgMover
from store.cli import main
from store.ids import INSTAGRAM_EPOCH_MS
from tests.conftest import base_config
from tests.moves import KILL_PHASES, finish_killed_move, kill_move_in_phase
from tests.servers import PostgresServer, TLSFiles, free_ports

SOURCE_PORT, TARGET_PORT = free_ports(2)
BHP = "board_has_pins"

pytestmark = pytest.mark.moves


def url(port: int, host: str = "127.0.0.1") -> str:
    return f"postgresql+psycopg://postgres@{host}:{port}/store?sslmode=require"


def sql(port: int, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(
        host="127.0.0.1", port=port, user="postgres", dbname="store", sslmode="require", autocommit=True
    ) as conn:
        cur = conn.execute(query, params)
        return list(cur.fetchall()) if cur.description else []


@contextmanager
def clusters(
    target_wal_level: str = "logical", ports: tuple[int, int] = (SOURCE_PORT, TARGET_PORT)
) -> Iterator[tuple[int, int]]:
    """Two PostgreSQL clusters on ``ports`` with a database ``store`` each (the source logical), removed
    afterwards; yields their ports."""
    files = TLSFiles()
    servers: list[PostgresServer] = []
    try:
        for port, level in ((ports[0], "logical"), (ports[1], target_wal_level)):
            servers.append(PostgresServer(port, files, wal_level=level))
            servers[-1].create_database("store")
        yield ports
    finally:
        for server in servers:
            server.remove()
        files.remove()


@pytest.fixture
def pair() -> Iterator[None]:
    with clusters():
        yield


def config_for(shards: int, tmp_path: Path, poll_s: float, **extra: Any) -> dict[str, Any]:
    return base_config(
        ids="instagram",
        shards=shards,
        hosts={"A": url(SOURCE_PORT), "B": url(TARGET_PORT)},
        map=[{"range": [0, shards - 1], "master": "A"}],
        map_source={"file": str(tmp_path / "map.yaml"), "poll_s": poll_s},
        **extra,
    )


def shard_of(i: int) -> int:
    return decode_instagram(i).shard_id


def pair_rows(b: int, p: int) -> list[str]:
    """Where the pair (b, p) and the pin's row are on both clusters, as raw SQL sees them (for a failure)."""
    sb, sp = shard_of(b), shard_of(p)
    found = []
    for port, host in ((SOURCE_PORT, "A"), (TARGET_PORT, "B")):
        for prefix in ("shard", "moved_shard"):
            for shard, table, a, z in ((sb, BHP, b, p), (sp, "pin_owned_by_board", p, b)):
                where = f"{host}:{prefix}{shard:04d}.{table}"
                try:
                    rows = sql(port, f"SELECT sequence FROM {prefix}{shard:04d}.{table} "
                               "WHERE from_id = %s AND to_id = %s", (a, z))  # fmt: skip
                    found.append(f"{where}={[r[0] for r in rows]}")
                except psycopg.Error as exc:
                    found.append(f"{where}:{type(exc).__name__}")
            where = f"{host}:{prefix}{sp:04d}.pins"
            try:
                rows = sql(port, f"SELECT active FROM {prefix}{sp:04d}.pins WHERE id = %s", (p,))
                found.append(f"{where}.active={[r[0] for r in rows]}")
            except psycopg.Error as exc:
                found.append(f"{where}:{type(exc).__name__}")
    return found


def leftovers(expected: str, moving: range) -> None:
    """No replication object of the move is left; the shards' tables are where ``expected`` says."""
    assert sql(SOURCE_PORT, "SELECT slot_name FROM pg_replication_slots") == []
    assert sql(SOURCE_PORT, "SELECT pubname FROM pg_publication") == []
    assert sql(TARGET_PORT, "SELECT subname FROM pg_subscription") == []
    schemas = [f"shard{s:04d}" for s in moving]
    tables = "SELECT DISTINCT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace " \
             "WHERE c.relkind = 'r' AND c.relname = 'pins' AND n.nspname = ANY(%s)"  # fmt: skip
    live_on = SOURCE_PORT if expected == "A" else TARGET_PORT
    other = TARGET_PORT if expected == "A" else SOURCE_PORT
    assert len(sql(live_on, tables, (schemas,))) == len(schemas)
    assert sql(other, tables, (schemas,)) == []
    if expected == "A":
        assert sql(SOURCE_PORT, "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'moved%%'") == []
        assert sql(TARGET_PORT, "SELECT nspname FROM pg_namespace WHERE nspname = ANY(%s)", (schemas,)) == []
    else:
        for sc in schemas:
            kinds = sql(SOURCE_PORT, "SELECT c.relkind, c.relname FROM pg_class c JOIN pg_namespace n "
                        "ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind = 'r'",
                        (sc,))  # fmt: skip
            assert kinds == [("r", "store_tombstone")], "a moved table is still a table on the source"


# A process with the old map (it reloads only when refused): create a pin, read it back.
STALE = """
import os, sys, time, yaml
from store import Store
raw = yaml.safe_load(open(sys.argv[1]))
with Store.from_config(raw) as store:
    print("READY", store.shard_map.version, flush=True)
    while not os.path.exists(sys.argv[2]):
        pin = store.create("pin", {"stale": True}, shard=40)
        assert store.get(pin, type_name="pin") == {"stale": True}
        print("ACK", pin, store.shard_map.version, store.shard_map.master(40), flush=True)
        time.sleep(0.01)
"""


def test_postgres_move_with_writers_loses_nothing_and_repeats_no_id(pair: None, tmp_path: Path) -> None:
    shards, moving = 64, range(32, 64)
    raw = config_for(shards, tmp_path, poll_s=0.2)
    config = StoreConfig.from_dict(raw)
    init_shards(config)
    (tmp_path / "stale.yaml").write_text(yaml.safe_dump(config_for(shards, tmp_path, 3600)))
    stop_file = tmp_path / "stop"
    made: list[int] = []  # every ID any create returned, here or by SQL
    acked: dict[int, dict[str, Any] | None] = {}  # None: deleted
    links: dict[tuple[int, int], bool] = {}
    # Every op on a pair, for a failure to tell: op, start-end (s since t0), map versions, result.
    history: dict[tuple[int, int], list[str]] = {}
    t0 = time.monotonic()
    marks: list[str] = []  # the move's phases, timed alike
    lock = threading.Lock()
    errors: list[BaseException] = []
    done = threading.Event()
    said: list[str] = []

    with Store(config) as store:

        def where(i: int) -> str:
            return store.shard_map.master(shard_of(i))

        def noted(key: tuple[int, int], op: str, started: float, v0: int, hosts: str, result: object) -> None:
            end = time.monotonic() - t0
            history.setdefault(key, []).append(
                f"{op}@{started:.3f}-{end:.3f} v{v0}->v{store.shard_map.version} {hosts} -> {result}"
            )

        owned = {
            w: {
                "pins": [store.create("pin", {"n": 0}, shard=(w * 16 + k * 3) % shards) for k in range(16)],
                "boards": [
                    store.create("board", {"w": w}, shard=(w * 16 + k * 9) % shards) for k in range(4)
                ],
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
                        pin = store.create("pin", {"w": w, "n": 0}, shard=rng.randrange(shards))
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
                        started, v0, hosts = (
                            time.monotonic() - t0,
                            store.shard_map.version,
                            f"b@{where(b)} p@{where(p)}",
                        )
                        if rng.random() < 0.7:
                            got = store.link(BHP, b, p)
                            links[(b, p)] = True
                            noted((b, p), "link", started, v0, hosts, got)
                        else:
                            got = store.unlink(BHP, b, p)
                            links[(b, p)] = False
                            noted((b, p), "unlink", started, v0, hosts, got)
                    elif len(pins) > 8:
                        p = pins.pop(rng.randrange(len(pins)))
                        started, v0, at = time.monotonic() - t0, store.shard_map.version, where(p)
                        got = store.delete(p, type_name="pin")
                        with lock:
                            acked[p] = None
                            for b in boards:  # a deleted pin leaves its boards' lists
                                links[(b, p)] = False
                                noted((b, p), "delete", started, v0, f"b@{where(b)} p@{at}", got)
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        stale = subprocess.Popen(
            [sys.executable, "-c", STALE, str(tmp_path / "stale.yaml"), str(stop_file)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert stale.stdout is not None
        assert stale.stdout.readline().startswith("READY 1")
        threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        time.sleep(0.5)

        def say(message: str) -> None:
            said.append(message)
            marks.append(f"{time.monotonic() - t0:.3f} {message[:60]}")

        mover = Mover(store, tmp_path / "move.json", say=say)
        plan = mover.plan(moving.start, moving.stop - 1, "B")  # the --dry-run path accepts these shards
        assert isinstance(mover.engine, PostgresEngine)  # chosen by the source host
        assert (plan.source, len(plan.databases())) == ("A", 32)
        assert {t for _d, t, _r, _b in plan.tables} >= {"pins", "boards", "users", BHP}
        ahead_ms = int(time.time() * 1000) + 60_000  # next_id()'s clock: ms since 1970
        fence = mover.engine.fence_and_switch
        burst_ids: list[int] = []

        def burst_then_fence(*args: Any) -> None:
            # Right before the lock: a burst of creates, and the source's clock a minute ahead
            # for some of them, so its counters run far beyond the target's clock.
            burst = [store.create("pin", {"burst": i}, shard=moving[i % 32]) for i in range(96)]
            with psycopg.connect(host="127.0.0.1", port=SOURCE_PORT, user="postgres", dbname="store",
                                 sslmode="require", autocommit=True) as conn:  # fmt: skip
                conn.execute(f"SET store.clock_ms = '{ahead_ms}'")
                for s in moving:
                    found = conn.execute(
                        f"INSERT INTO shard{s:04d}.pins (data) SELECT '{{}}' FROM generate_series(1, 100) "
                        "RETURNING id"
                    ).fetchall()
                    burst += [int(r[0]) for r in found]
            marks.append(f"{time.monotonic() - t0:.3f} burst made; fence next")
            burst_ids.extend(burst)
            with lock:
                made.extend(burst)
                acked.update({p: {"burst": i} for i, p in enumerate(burst[:96])})
                acked.update({p: {} for p in burst[96:]})
            fence(*args)
            marks.append(f"{time.monotonic() - t0:.3f} fence committed")

        mover.engine.fence_and_switch = burst_then_fence  # type: ignore[method-assign]
        try:
            journal = mover.start(plan)
            assert journal.phase == "done"
            after = [store.create("pin", {"after": s}, shard=s) for s in moving for _ in range(3)]
            made.extend(after)
            acked.update({p: {"after": shard_of(p)} for p in after})
            time.sleep(0.5)  # writers keep going on the new map
        finally:
            done.set()
            stop_file.touch()
        assert len(burst_ids) == 96 + 32 * 100
        before_switch = {s: max(p for p in burst_ids if shard_of(p) == s) for s in moving}
        for t in threads:
            t.join()
        out, err = stale.communicate(timeout=30)
        assert stale.returncode == 0, err
        assert errors == [], errors
        acks = [line.split() for line in out.splitlines() if line.startswith("ACK")]
        assert acks, "the old-map process acknowledged nothing"
        assert acks[0][2:] == ["1", "A"]
        assert acks[-1][2:] == ["2", "B"], "the old-map process never moved to the target"
        for _ack, pin, _v, _host in acks:
            made.append(int(pin))
            acked[int(pin)] = {"stale": True}

    firsts = [line.split(":")[0] for line in said if line.split(":")[0] in
              ("copy", "catch up", "fence", "verify", "switch", "done")]  # fmt: skip
    assert list(dict.fromkeys(firsts)) == ["copy", "catch up", "fence", "verify", "switch", "done"]
    assert journal.timings["fenced_s"] < 30
    assert len(made) == len(set(made)), "an ID was handed out twice"
    for p in after:  # the target's counter carried on from the source's, a minute ahead
        assert p > before_switch[shard_of(p)]
        assert decode_instagram(p).ms >= ahead_ms - INSTAGRAM_EPOCH_MS
    with Store(config) as fresh:
        assert fresh.shard_map.version == 2
        assert [(r.start, r.end, r.master) for r in fresh.shard_map] == [(0, 31, "A"), (32, 63, "B")]
        got = fresh.get_many(list(acked), type_name="pin")
        lost = [p for p, want in acked.items() if got.get(p) != want]
        assert lost == [], f"acknowledged writes differ: {[(p, got.get(p), acked[p]) for p in lost[:5]]}"
        for (b, p), linked in links.items():
            assert (p in fresh.links(BHP, b, limit=1000)) == linked, (
                f"board {b} (shard {shard_of(b)}) and pin {p} (shard {shard_of(p)}): expected "
                f"{'linked' if linked else 'absent'}; ops: {history.get((b, p))}; rows: {pair_rows(b, p)}; "
                f"move: {marks}"
            )
        report = check_store(fresh)
        assert report.ok, [f.line() for f in report.problems]
    leftovers("B", moving)
    for query in ("SELECT data FROM shard0040.pins WHERE id = 1",
                  "INSERT INTO shard0040.pins (data) VALUES ('{}')",
                  "SELECT shard0040.next_id()", "UPDATE shard0040.boards SET data = '{}'",
                  # A WHERE the planner could answer without a row (equal columns) is refused too.
                  f"DELETE FROM shard0040.{BHP} WHERE from_id = 1 AND to_id = 2",
                  f"UPDATE shard0040.{BHP} SET sequence = 3 WHERE from_id = 1 AND to_id = 2",
                  f"SELECT sequence FROM shard0040.{BHP} WHERE from_id = 1 AND to_id = 2",
                  "UPDATE shard0040.pins SET active = 0 WHERE id = 1 AND active = 1",
                  f"DELETE FROM shard0040.{BHP} WHERE false"):  # fmt: skip
        with pytest.raises(
            psycopg.Error, match="store-tombstone shard=40 moved_to=B map_version=2"
        ) as refused:
            sql(SOURCE_PORT, query)
        assert refused.value.sqlstate == "ST001"
    assert sql(SOURCE_PORT, "SELECT shard, moved_to, map_version FROM shard0040.store_tombstone") == [
        (40, "B", 2)
    ]
    assert sql(SOURCE_PORT, "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'moved_shard%%'") == [(32,)]
    static = StoreConfig.from_dict({k: v for k, v in raw.items() if k != "map_source"})  # all on A
    with pytest.raises(ShardMovedError, match="tombstone"):  # an init by an old config creates nothing
        init_shards(static, shards=[40])
    with Store(config) as fresh:
        assert Mover(fresh, tmp_path / "move.json", say=lambda _m: None).cleanup()[0] == "moved_shard0032"
    assert sql(SOURCE_PORT, "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'moved%%'") == [(0,)]


def test_plan_refuses_what_the_move_cannot_finish(tmp_path: Path) -> None:
    with clusters(target_wal_level="replica"):  # B cannot publish: moves from B are refused
        raw = base_config(
            ids="instagram",
            shards=8,
            hosts={"A": url(SOURCE_PORT), "B": url(TARGET_PORT), "A2": url(SOURCE_PORT, "127.0.0.2")},
            map=[{"range": [0, 3], "master": "A"}, {"range": [4, 7], "master": "B"}],
            map_source={"file": str(tmp_path / "map.yaml"), "poll_s": 1},
        )
        config_file = tmp_path / "store.yaml"
        config_file.write_text(yaml.safe_dump(raw))
        config = StoreConfig.from_dict(raw)
        init_shards(config)
        with Store(config) as store:
            mover = Mover(store, tmp_path / "move.json", say=lambda _m: None)
            with pytest.raises(MoveError, match="wal_level = replica"):
                mover.plan(4, 7, "A")
            assert isinstance(mover.engine, PostgresEngine)
            assert isinstance(PgMover(store, tmp_path / "move.json").engine, PostgresEngine)  # the old name
            with pytest.raises(MoveError, match="are the same server"):
                mover.plan(0, 3, "A2")
            refusals = [
                ("CREATE VIEW shard0001.v AS SELECT 1 AS one", "DROP VIEW shard0001.v",
                 "is a view, not a table"),
                ("CREATE FUNCTION shard0002.f() RETURNS int LANGUAGE sql AS 'SELECT 1'",
                 "DROP FUNCTION shard0002.f()", "has the function f"),
                ("CREATE TABLE shard0003.nokey (x int)", "DROP TABLE shard0003.nokey", "has no primary key"),
                ("CREATE SCHEMA moved_shard0002", "DROP SCHEMA moved_shard0002", "still holds the archive"),
                ("CREATE PUBLICATION store_move_0_3 FOR TABLE shard0000.pins",
                 "DROP PUBLICATION store_move_0_3", "holds the publication store_move_0_3"),
                ("ALTER SCHEMA shard0001 RENAME TO gone", "ALTER SCHEMA gone RENAME TO shard0001",
                 "has no schema shard0001"),
            ]  # fmt: skip
            for make, undo, message in refusals:
                sql(SOURCE_PORT, make)
                with pytest.raises(MoveError, match=message):
                    mover.plan(0, 3, "B")
                sql(SOURCE_PORT, undo)
            sql(TARGET_PORT, "CREATE SCHEMA shard0002; CREATE TABLE shard0002.pins (id bigint PRIMARY KEY)")
            with pytest.raises(MoveError, match="already holds tables of shard0002"):
                mover.plan(0, 3, "B")
            sql(TARGET_PORT, "DROP SCHEMA shard0002 CASCADE")
            plan = mover.plan(0, 3, "B")
            assert (plan.source, plan.databases()[0], len(plan.tables)) == ("A", "shard0000", 4 * 9)
        runner = CliRunner()
        ok = runner.invoke(main, ["move", "--config", str(config_file), "--shards", "0-3", "--to", "B",
                                  "--dry-run", "--journal", str(tmp_path / "j.json")])  # fmt: skip
        assert ok.exit_code == 0, ok.output
        assert "plan: shards 0-3 from A to B: 4 databases, 36 tables" in ok.output
        refused = runner.invoke(main, ["move", "--config", str(config_file), "--shards", "4-7", "--to", "A",
                                       "--dry-run", "--journal", str(tmp_path / "j.json")])  # fmt: skip
        assert refused.exit_code != 0
        assert "wal_level = replica" in refused.output
        assert sql(SOURCE_PORT, "SELECT count(*) FROM pg_replication_slots") == [(0,)]
        assert not (tmp_path / "j.json").exists()


@pytest.mark.parametrize(("phase", "then"), KILL_PHASES)
def test_postgres_move_killed_in_each_phase_resumes_or_aborts_without_loss(
    pair: None, tmp_path: Path, phase: str, then: str
) -> None:
    shards, moving = 8, range(4, 8)
    raw = config_for(shards, tmp_path, poll_s=0.2)
    config_file = tmp_path / "store.yaml"
    config_file.write_text(yaml.safe_dump(raw))
    config = StoreConfig.from_dict(raw)
    init_shards(config)
    with Store(config) as store:
        made = [store.create("pin", {"n": i}, shard=s) for i, s in enumerate(list(range(shards)) * 3)]
        acked = {p: {"n": i} for i, p in enumerate(made)}
        done = threading.Event()
        errors: list[BaseException] = []

        first = list(made)

        def writer(w: int) -> None:
            rng = random.Random(w)
            # Each writer updates only its own pins: with two writers on one pin, which one's
            # acknowledgement is recorded last need not be the one that committed last.
            mine = first[w::4]
            try:
                while not done.is_set():
                    pin = store.create("pin", {"w": w}, shard=rng.randrange(shards))
                    made.append(pin)
                    mine.append(pin)
                    acked[pin] = {"w": w}
                    if rng.random() < 0.3:
                        p = rng.choice(mine)
                        acked[p] = store.update(p, lambda o: {**o, "u": o.get("u", 0) + 1}, type_name="pin")
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        journal = tmp_path / "move.json"
        try:
            kill_move_in_phase(config_file, journal, phase, shards="4-7")
            time.sleep(0.3)  # writers carry on against whatever state the crash left
            expected = finish_killed_move(store, journal, then)
            time.sleep(0.3)
            before = {s: max(q for q in list(made) if shard_of(q) == s) for s in moving}
            after = [store.create("pin", {"after": s}, shard=s) for s in moving]
            assert all(p > before[shard_of(p)] for p in after)
            made.extend(after)
            acked.update({p: {"after": shard_of(p)} for p in after})
        finally:
            done.set()
            for t in threads:
                t.join()
        assert errors == [], errors
        assert Journal.load(journal).phase == ("aborted" if expected == "A" else "done")
    assert len(made) == len(set(made)), "an ID was handed out twice"
    leftovers(expected, moving)
    with Store(config) as fresh:
        assert {fresh.shard_map.master(s) for s in moving} == {expected}
        got = fresh.get_many(list(acked), type_name="pin")
        assert [p for p in acked if got.get(p) != acked[p]] == [], "acknowledged writes were lost"
        report = check_store(fresh)
        assert report.ok, [f.line() for f in report.problems]


@pytest.mark.parametrize("then", ["abort", "resume"])
def test_a_switch_that_died_before_the_map_was_written_is_undone_or_finished(
    pair: None, tmp_path: Path, then: str
) -> None:
    """The source committed its tombstones, then the mover died before writing the map: the source
    refuses (nothing can be written anywhere), an abort brings the tables and next_id() back under
    their names, a resume writes the map."""
    config = StoreConfig.from_dict(config_for(8, tmp_path, poll_s=0.2))
    init_shards(config)
    with Store(config) as store:
        acked = {store.create("pin", {"n": s}, shard=s): {"n": s} for s in range(8) for _ in range(5)}
        mover = Mover(store, tmp_path / "move.json", say=lambda _m: None)

        def die(_j: Journal) -> None:
            raise KeyboardInterrupt  # the process went

        mover._write_map = die  # type: ignore[method-assign]
        with pytest.raises(KeyboardInterrupt):
            mover.start(mover.plan(4, 7, "B"))
        assert store.shard_map.version == 1
        with pytest.raises(psycopg.Error, match="store-tombstone shard=5 moved_to=B map_version=2"):
            sql(SOURCE_PORT, "SELECT data FROM shard0005.pins")
        fresh_mover = Mover(store, tmp_path / "move.json", say=lambda _m: None)
        if then == "abort":
            fresh_mover.abort()
        else:
            fresh_mover.resume()
        expected = "A" if then == "abort" else "B"
        after = {store.create("pin", {"after": s}, shard=s): {"after": s} for s in range(8)}
        assert all(p > max(q for q in acked if shard_of(q) == shard_of(p)) for p in after)
        acked.update(after)
    leftovers(expected, range(4, 8))
    with Store(config) as fresh:
        assert {fresh.shard_map.master(s) for s in range(4, 8)} == {expected}
        assert fresh.get_many(list(acked), type_name="pin") == acked
        report = check_store(fresh)
        assert report.ok, [f.line() for f in report.problems]


def test_a_verify_mismatch_releases_the_fence_and_keeps_the_journal(pair: None, tmp_path: Path) -> None:
    """A row on the target that the source never had: verify refuses, the source keeps serving,
    and the move can be aborted."""
    config = StoreConfig.from_dict(config_for(8, tmp_path, poll_s=0.2))
    init_shards(config)
    with Store(config) as store:
        acked = {store.create("pin", {"n": s}, shard=s): {"n": s} for s in range(8)}
        mover = Mover(store, tmp_path / "move.json", say=lambda _m: None)
        plan = mover.plan(4, 7, "B")
        real = mover.engine.fence_and_switch

        def stray_then_fence(*args: Any) -> None:
            sql(TARGET_PORT, "INSERT INTO shard0006.pins (id, data) VALUES (42, '{}')")
            real(*args)

        mover.engine.fence_and_switch = stray_then_fence  # type: ignore[method-assign]
        with pytest.raises(MoveError, match=r"verify: rows differ for shard0006\.pins"):
            mover.start(plan)
        assert Journal.load(tmp_path / "move.json").phase == "switch"
        status = CliRunner().invoke(main, ["move", "--status", "--journal", str(tmp_path / "move.json")])
        assert status.exit_code == 0, status.output
        assert "move of shards 4-7 from A to B: phase switch" in status.output
        assert "error: MoveError: verify: rows differ" in status.output
        more = store.create("pin", {"more": 1}, shard=6)  # unfenced: the source serves on
        acked[more] = {"more": 1}
        assert store.shard_map.master(6) == "A"
        Mover(store, tmp_path / "move.json", say=lambda _m: None).abort()
    leftovers("A", range(4, 8))
    with Store(config) as fresh:
        assert fresh.get_many(list(acked), type_name="pin") == acked


def test_a_row_changed_on_the_target_before_the_fence_is_compared_under_it(
    pair: None, tmp_path: Path
) -> None:
    """A row the target holds otherwise than the source, changed behind replication's back before the
    snapshots (same count, not the newest key): the comparison before the fence makes it a suspect,
    the fence compares it, refuses and unlocks; the source serves on and the move aborts."""
    config = StoreConfig.from_dict(config_for(8, tmp_path, poll_s=0.2))
    init_shards(config)
    with Store(config) as store:
        acked = {store.create("pin", {"n": i}, shard=s): {"n": i} for i, s in enumerate(list(range(8)) * 3)}
        said: list[str] = []
        mover = Mover(store, tmp_path / "move.json", say=said.append)
        plan = mover.plan(4, 7, "B")
        real = mover.engine.verify_before_fence

        def changed_then_verify(*args: Any) -> str:
            sql(TARGET_PORT, "UPDATE shard0005.pins SET data = '{\"n\": -1}' "
                "WHERE id = (SELECT min(id) FROM shard0005.pins)")  # fmt: skip
            return real(*args)

        mover.engine.verify_before_fence = changed_then_verify  # type: ignore[method-assign]
        with pytest.raises(
            MoveError, match=r"verify: rows differ for shard0005\.pins; the source was unlocked"
        ):
            mover.start(plan)
        before = [m for m in said if m.startswith("catch up:") and "before the fence" in m]
        assert len(before) == 1, said
        assert "1 row(s) changed meanwhile" in before[0]
        assert [m for m in said if m.startswith("fence:")], said  # found under the fence, not before
        assert Journal.load(tmp_path / "move.json").phase == "switch"
        more = store.create("pin", {"more": 1}, shard=5)  # unfenced: the source serves on
        acked[more] = {"more": 1}
        assert store.shard_map.master(5) == "A"
        Mover(store, tmp_path / "move.json", say=lambda _m: None).abort()
    leftovers("A", range(4, 8))
    with Store(config) as fresh:
        assert fresh.get_many(list(acked), type_name="pin") == acked


def test_a_postgres_fence_compares_before_the_lock_and_reports_where_its_time_went(
    pair: None, tmp_path: Path
) -> None:
    config = StoreConfig.from_dict(config_for(8, tmp_path, poll_s=0.2))
    init_shards(config)
    with Store(config) as store:
        acked = {store.create("pin", {"n": i}, shard=s): {"n": i} for i, s in enumerate(list(range(8)) * 3)}
        said: list[str] = []
        mover = Mover(store, tmp_path / "move.json", say=said.append)
        journal = mover.start(mover.plan(4, 7, "B"))
        assert journal.phase == "done"
        assert store.get_many(list(acked), type_name="pin") == acked
    steps = [k for k in journal.timings if k.startswith("fence_")]
    assert steps == ["fence_lock_s", "fence_level_s", "fence_verify_s", "fence_ids_s", "fence_archive_s"]
    assert abs(sum(journal.timings[k] for k in steps) - journal.timings["fenced_s"]) < 0.01
    assert journal.timings["checksum_s"] > 0
    before = [m for m in said if m.startswith("catch up:") and "before the fence" in m]
    assert len(before) == 1, said
    assert before[0].startswith("catch up: 36 tables compared on both sides at ")
    assert "0 row(s) changed meanwhile" in before[0]
    verify = [m for m in said if m.startswith("verify:")]
    assert verify[-1].startswith("verify: 36 tables ("), said
    assert verify[-1].endswith(" rows) end alike on both sides"), said


def test_a_move_while_wal_daemons_follow_both_servers(
    pair: None, tmp_path: Path, memcached_pair: list[str], redis_ready: str
) -> None:
    """`cache.invalidation: wal` on both clusters, one daemon following both, writers whose own cache
    deletes are all lost. Shards 4-7 move from A to B (the move's subscription writes on B too,
    which B's slot decodes). Afterwards writes to the moved shards, the store's and one made
    with plain SQL on B, are seen by a reader within a few ticks under a 30 s window (only the
    daemon's deletes explain it), and both servers' heartbeats vouch again."""
    from store.invalidate import Daemon
    from tests.test_follower import _lose_deletes, _wait_for

    raw = config_for(8, tmp_path, poll_s=0.2)
    raw["cache"] = {
        "memcached": memcached_pair,
        "redis": redis_ready,
        "prefix": f"mw{time.monotonic_ns() % 10**6}:",
        "max_stale_s": 30,
        "invalidation": "wal",
    }
    init_shards(StoreConfig.from_dict(raw))
    daemon = Daemon(StoreConfig.from_dict(raw), tick_s=0.2)
    by_host = {inv.hosts[0]: inv for inv in daemon.invalidators}
    assert sorted(by_host) == ["A", "B"]
    daemon.start()
    try:
        with (
            Store.from_config(raw) as writer,
            Store.from_config(raw) as reader,
            Store.from_config(raw) as admin,
        ):
            _lose_deletes(writer)
            pins = [writer.create("pin", {"n": 0}, shard=s) for s in range(8)]
            _wait_for(lambda: all(inv.heartbeat is not None for inv in by_host.values()), within_s=15)
            time.sleep(0.6)  # past both heartbeats' S
            assert [reader.get(p, type_name="pin") for p in pins] == [{"n": 0}] * 8  # cached
            mover = Mover(admin, tmp_path / "move.json", say=lambda _m: None)
            mover.start(mover.plan(4, 7, "B"))
            for p in pins:
                writer.update(p, {"n": 1}, type_name="pin")
            _wait_for(lambda: [reader.get(p, type_name="pin") for p in pins] == [{"n": 1}] * 8, within_s=15)
            moved = pins[7]
            sql(
                TARGET_PORT,
                f"UPDATE shard{shard_of(moved):04d}.pins SET data = '{{\"n\": 2}}' WHERE id = {moved}",
            )
            _wait_for(lambda: reader.get(moved, type_name="pin") == {"n": 2}, within_s=10)
            now = int(time.time() * 1000)
            _wait_for(
                lambda: all(
                    (beat := inv.heartbeat) is not None and beat.covered_ms > now for inv in by_host.values()
                ),
                within_s=10,
            )
        assert by_host["B"].source.transactions > 0  # type: ignore[attr-defined]
        assert daemon.status()[0]["role"] == daemon.status()[1]["role"] == "leader"
    finally:
        daemon.stop()
