"""`store bench mix`: the workload is the same for every system, and a quick run works end to end.

No timing is asserted: the run must finish, every system must answer what
the database holds, and the report, the JSON and the charts must be there.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from store.cli import main
from store.tools.mix.servers_cpu import server_cpu_s, since
from store.tools.mix.workload import MIX, Shape, Zipf, make_data_set, requests
from tests.conftest import one_run_at_a_time, require_port


@pytest.fixture(scope="module", autouse=True)
def _one_mix_at_a_time() -> Iterator[None]:
    """The mix has no namespace: it uses shards 2048-2111 of the shared MariaDB and the caches of its
    config; two test runs at once take turns here."""
    with one_run_at_a_time("mix-bench"):
        yield


def test_the_data_set_and_streams_repeat_for_the_same_seed() -> None:
    shape = Shape(users=100, pins=2000, likes_per_user=4)
    one, two = make_data_set(shape), make_data_set(shape)
    assert one.pin_board == two.pin_board
    assert one.user_likes == two.user_likes
    a, b = requests(one, 5, 3), requests(two, 5, 3)
    assert [next(a) for _ in range(500)] == [next(b) for _ in range(500)]
    c, d = requests(one, 5, 3), requests(one, 5, 4)
    assert [next(c) for _ in range(50)] != [next(d) for _ in range(50)]  # each thread its own stream


def test_the_biggest_board_holds_a_few_thousand_pins_at_full_size() -> None:
    data = make_data_set(Shape())
    biggest = len(data.board_pins[data.boards_by_size[0]])
    assert 2000 <= biggest <= 8000
    assert sum(len(p) for p in data.board_pins) == 40_000
    assert all(len(liked) == 10 for liked in data.user_likes)


def test_the_stream_follows_the_mix() -> None:
    data = make_data_set(Shape(users=100, pins=2000))
    stream = requests(data, 1, 0)
    seen: dict[str, int] = {}
    n = 20_000
    for _ in range(n):
        r = next(stream)
        seen[r.op] = seen.get(r.op, 0) + 1
    total = sum(MIX.values())
    for op, share in MIX.items():
        assert abs(seen.get(op, 0) / n - share / total) < 0.01, op


def test_zipf_ranks_fall_off() -> None:
    import random

    z = Zipf(1000, 0.8)
    rng = random.Random(1)
    counts = [0] * 1000
    for _ in range(50_000):
        counts[z.sample(rng)] += 1
    assert counts[0] > counts[9] > counts[99] > 0


@pytest.mark.mariadb
def test_quick_mix_runs_every_system_and_checks_their_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, port in (("MariaDB", 3306), ("memcached", 11211), ("Redis", 6379)):
        require_port(name, port)
    from store.tools.mix import bench

    # What ran, in order: each slice, and each emptying of a system's caches.
    events: list[tuple[str, ...]] = []
    timed, empty = bench._timed, bench._empty

    def slice_(config: Any, system: Any, *args: Any, **kwargs: Any) -> Any:
        events.append(("slice", system.name, str(args[4]), str(args[3])))  # temperature, threads
        return timed(config, system, *args, **kwargs)

    def emptied(system: Any, memcached: Any) -> None:
        events.append(("empty", system.name))
        empty(system, memcached)

    monkeypatch.setattr(bench, "_timed", slice_)
    monkeypatch.setattr(bench, "_empty", emptied)
    out = tmp_path / "mix"
    result = CliRunner().invoke(
        main, ["bench", "mix", "--quick", "--requests", "200", "--out", str(out), "--json"]
    )
    assert result.exit_code == 0, result.output
    # Both phases run in slices (3 by default), the systems taking turns; a cold slice starts
    # from its system's caches emptied, so no system is always first on a fresh server.
    for threads in ("1", "2"):
        for temperature in ("cold", "warm"):
            order = [e[1] for e in events if e[0] == "slice" and e[2:] == (temperature, threads)]
            assert len(order) == 3 * 4, order
            firsts = {order[r * 4] for r in range(3)}
            assert len(firsts) == 3, order
    for i, e in enumerate(events):
        if e[0] == "slice" and e[2] == "cold":
            assert events[i - 1] == ("empty", e[1]), events[i - 1 : i + 1]
    doc = json.loads((out / "mix.json").read_text())
    systems = {p["system"] for p in doc["phases"]}
    assert systems == {"floor", "horizontal_shard", "store", "store:follow=true"}
    assert {(p["threads"], p["temperature"]) for p in doc["phases"]} == {
        (1, "cold"),
        (1, "warm"),
        (2, "cold"),
        (2, "warm"),
    }
    for p in doc["phases"]:
        assert p["calls"] > 0
        assert p["ops_per_s"] > 0
        assert p["errors"] == 0, (p["system"], {k: v["first_error"] for k, v in p["operations"].items()})
        # Every system made MariaDB work (the store and the floor Redis and memcached too).
        assert p["server_cpu_us_per_call"]["mariadbd"] > 0, p
    for check in doc["checks"]:
        assert check["checked"] > 100
        # The floor's fills race its writes (no leases): answers it gave stale from its caches
        # are reported apart, and its rows are checked with its caches empty. The others promise.
        assert check["mismatches"] == [], check
        if check["system"] != "floor":
            assert check["stale"] == [], check
    for name in ("floor", "store"):
        assert set(doc["round_trips"][name]) <= set(MIX)
        assert doc["round_trips"][name]["get_node"] >= 1
    assert (out / "mix-throughput.png").stat().st_size > 1000
    assert (out / "mix-latency.png").stat().st_size > 1000
    assert "vs floor" in doc["report"]
    assert "server CPU us per call by program" in doc["report"]
    assert "| 2 | warm | store |" in (out / "mix.md").read_text()
    assert "CPU per call vs floor" in (out / "mix.md").read_text()
    assert "CPU per call" in doc["report"]


#: The database the PostgreSQL quick mix makes its 64 schema shards in (dropped and made again).
PG_MIX_DB = "storemix"


def test_quick_mix_runs_on_postgresql_with_instagram_ids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, port in (("PostgreSQL", 5432), ("memcached", 11211), ("Redis", 6379)):
        require_port(name, port)
    import psycopg

    with psycopg.connect("host=127.0.0.1 user=postgres dbname=postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {PG_MIX_DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {PG_MIX_DB}")
    monkeypatch.setenv("STORE_MIX_URL", f"postgresql+psycopg://postgres@127.0.0.1:5432/{PG_MIX_DB}")
    out = tmp_path / "mix"
    # store:invalidation=log: with a `store invalidate` daemon reading PostgreSQL's log table;
    # floor:promised: the floor with the store's write promises by hand, in PostgreSQL's SQL.
    systems = ("floor", "floor:promised", "horizontal_shard", "store", "store:invalidation=log")
    args = ["bench", "mix", "--quick", "--requests", "30", "--systems", ",".join(systems)]
    result = CliRunner().invoke(main, [*args, "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "mix.json").read_text())
    assert doc["shards"] == 64
    assert doc["hosts"] == ["MixA", "MixB"]
    assert "psycopg" in doc["machine"]["drivers"]
    assert {p["system"] for p in doc["phases"]} == set(systems)
    for p in doc["phases"]:
        assert p["calls"] > 0
        assert p["errors"] == 0, (p["system"], {k: v["first_error"] for k, v in p["operations"].items()})
    for check in doc["checks"]:
        assert check["checked"] > 100
        assert check["mismatches"] == [], check
    for name in systems:
        # psycopg's statements are counted: every system reads a pin from PostgreSQL or memcached.
        assert doc["round_trips"][name]["get_node"] >= 1, doc["round_trips"]
    with psycopg.connect(f"host=127.0.0.1 user=postgres dbname={PG_MIX_DB}") as conn:
        left = conn.execute('SELECT count(*) FROM "shard0000".pins').fetchone()
        # Every loaded table was vacuumed and analyzed before the phases, not left to autovacuum.
        unsettled = conn.execute(
            "SELECT schemaname, relname FROM pg_stat_user_tables WHERE schemaname LIKE 'shard%%' "
            "AND relname IN ('pins', 'boards', 'users', 'board_has_pins', 'relation_counts') "
            "AND (last_vacuum IS NULL OR last_analyze IS NULL)"
        ).fetchall()
    assert left == (0,)  # every copy removed
    assert unsettled == []


@pytest.mark.mariadb
def test_mix_over_two_processes_merges_their_calls_and_removes_what_they_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, port in (("MariaDB", 3306), ("memcached", 11211), ("Redis", 6379)):
        require_port(name, port)
    from store.tools.mix import bench
    from store.tools.mix.dataset_db import Copy, raw_connection, remove_copy
    from store.tools.mix.system import MixSchema

    removed: list[tuple[MixSchema, Copy]] = []

    def remove_and_remember(schema: MixSchema, copy: Copy) -> None:
        remove_copy(schema, copy)
        removed.append((schema, copy))

    monkeypatch.setattr(bench, "remove_copy", remove_and_remember)
    out = tmp_path / "mix"
    options = bench.MixOptions(
        shape=bench.QUICK_SHAPE,
        threads=[1],
        requests=150,
        systems=("floor", "floor:promised", "store:invalidation=log"),
        trips=50,
        out=out,
        processes=2,
        idle_s=1.0,
    )
    doc = bench.run_mix(options, say=lambda _msg: None)
    assert doc["processes"] == 2
    daemon = "store:invalidation=log"
    assert {(p["system"], p["temperature"]) for p in doc["phases"]} == {
        (system, temperature)
        for system in ("floor", "floor:promised", daemon)
        for temperature in ("cold", "warm")
    }
    # The store ran with a daemon of its own: each write's keys deleted (by the writer, and again by
    # the daemon), and its background work measured at rest beside the floor's (which has none).
    for p in doc["phases"]:
        assert p["cache_deletes_per_write"] is not None
        assert p["cache_deletes_per_write"] > 0
    assert set(doc["queries_per_s_at_rest"]) == {"floor", "floor:promised", daemon}
    assert doc["queries_per_s_at_rest"][daemon] > 0.5, "the daemon reads the log table twice a second"
    assert "invalidation: cache deletes per write" in doc["report"]
    for p in doc["phases"]:
        assert (p["threads"], p["processes"]) == (1, 2)
        assert len(p["process_calls"]) == 2
        assert all(n > 0 for n in p["process_calls"]), p["process_calls"]  # both processes made calls
        assert sum(p["process_calls"]) == p["calls"]
        assert p["errors"] == 0, (p["system"], {k: v["first_error"] for k, v in p["operations"].items()})
        # ops/s is every process's calls over the phase's wall time (not one process's)
        assert p["ops_per_s"] == pytest.approx(p["calls"] / p["seconds"], rel=0.01)
    for check in doc["checks"]:
        assert check["checked"] > 100
        assert check["mismatches"] == [], check
    assert "1 thread(s) x 2 process(es), cold" in doc["report"]
    assert "| 1 x 2 | warm | store:invalidation=log |" in (out / "mix.md").read_text()
    saved = json.loads((out / "mix.json").read_text())
    assert saved["phases"][0]["process_calls"] == doc["phases"][0]["process_calls"]

    # The objects the workers created came back to the parent and were removed with the copies.
    assert len(removed) == 3
    for schema, copy in removed:
        assert copy.created, "the workers' add_node IDs did not reach the parent"
        tables = {t: table for _name, (t, table) in schema.types.items()}
        ids = copy.created + copy.users[:5] + copy.boards[:5] + copy.pins[:20]
        conn = raw_connection(next(iter(schema.hosts.values())))
        try:
            cur = conn.cursor()
            for id_ in ids:
                shard, type_id, local = id_ >> 46, (id_ >> 36) & 0x3FF, id_ & ((1 << 36) - 1)
                cur.execute(
                    f"SELECT COUNT(*) FROM `{MixSchema.database(shard)}`.`{tables[type_id]}` "
                    "WHERE local_id = %s",
                    (local,),
                )
                assert cur.fetchone()[0] == 0, f"object {id_} is still there after the run"
        finally:
            conn.close()


def test_a_worker_that_fails_says_why_in_the_parent() -> None:
    from store.tools.mix.dataset_db import Copy, mix_schema
    from store.tools.mix.options import MixOptions, mix_config
    from store.tools.mix.procs import WorkerError, Workers

    options = MixOptions(shape=Shape(users=10, pins=50), threads=[1])
    config = mix_config(options)
    schema = mix_schema(config, [2048])
    workers = Workers("no-such-system", config, schema, options, Copy([], [], []), 2)
    try:
        with pytest.raises(WorkerError, match="unknown system 'no-such-system'"):
            workers.wait_up(timeout=60)
    finally:
        workers.close()


def test_server_cpu_counts_a_busy_program_and_only_while_it_works() -> None:
    """The sampler reads /proc by program name: a program that burns CPU between two samples shows it,
    and the difference of two samples is what it used between them."""
    if not Path("/proc/self/stat").exists():
        pytest.skip("no /proc on this system")
    import subprocess
    import sys

    before = server_cpu_s(("python3-busy",))
    assert before == {}
    script = "import ctypes, time\n"
    script += "ctypes.CDLL(None).prctl(15, b'python3-busy', 0, 0, 0)\n"  # PR_SET_NAME: its /proc comm
    script += "import sys; print('up', flush=True); end = time.process_time() + 0.3\n"
    script += "while time.process_time() < end: pass\n"
    script += "print('done', flush=True); sys.stdin.read()\n"
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "up\n"
        first = server_cpu_s(("python3-busy",))
        assert {name for name, _pid, _start in first} == {"python3-busy"}
        assert proc.stdout.readline() == "done\n"  # after 0.3 s of CPU
        second = server_cpu_s(("python3-busy",))
        used = since(first, second)["python3-busy"]
        assert 0.2 <= used <= 0.6, used
        time.sleep(0.2)
        assert since(second, server_cpu_s(("python3-busy",)))["python3-busy"] < 0.05  # idle now
    finally:
        proc.communicate("")
    assert since({("gone", 1, 1): 1.0}, {}) == {}
    # Another server that ended between the samples neither subtracts its CPU nor hides the rest's;
    # one that started between them is not counted.
    before_end = {("mariadbd", 10, 5): 9.0, ("mariadbd", 11, 5): 1.0}
    after_end = {("mariadbd", 11, 5): 1.5, ("mariadbd", 12, 7): 4.0}
    assert since(before_end, after_end) == {"mariadbd": 0.5}
    assert since({("mariadbd", 10, 5): 9.0}, {("mariadbd", 10, 8): 0.1}) == {}  # a pid used again


def test_server_cpu_counts_the_children_a_server_forks_per_connection() -> None:
    """A server that forks a process per connection (PostgreSQL): children started between the two
    samples count, both one still running and one that ended (reaped by its parent)."""
    if not Path("/proc/self/stat").exists():
        pytest.skip("no /proc on this system")
    import subprocess
    import sys

    script = "import ctypes, os, sys, time\n"
    script += "ctypes.CDLL(None).prctl(15, b'python3-forks', 0, 0, 0)\n"
    script += "def burn(s):\n    end = time.process_time() + s\n    while time.process_time() < end: pass\n"
    script += "print('up', flush=True); sys.stdin.readline()\n"
    script += "pid = os.fork()\n"  # a child that works and ends: reaped below
    script += "if pid == 0:\n    burn(0.3); os._exit(0)\n"
    script += "os.waitpid(pid, 0)\n"
    script += "r, w = os.pipe()\npid = os.fork()\n"  # a child that works and stays
    script += "if pid == 0:\n    burn(0.3); os.write(w, b'x'); time.sleep(60); os._exit(0)\n"
    script += "os.read(r, 1); print('done', flush=True); sys.stdin.read(); os.kill(pid, 9)\n"
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdin is not None
        assert proc.stdout.readline() == "up\n"
        first = server_cpu_s(("python3-forks",))
        assert len(first) == 1
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "done\n"
        second = server_cpu_s(("python3-forks",))
        assert set(second) == set(first)  # the children are their parent's
        used = since(first, second)["python3-forks"]
        assert 0.5 <= used <= 1.0, used
    finally:
        proc.communicate("")


@pytest.mark.mariadb
def test_round_trips_are_counted_on_both_drivers() -> None:
    """PyMySQL's requests are sends on Python sockets; mysqlclient's, in C, are counted at its query."""
    require_port("MariaDB", 3306)
    mysqldb = pytest.importorskip("MySQLdb")
    import pymysql
    from pymysql.constants import CLIENT

    from store.tools.mix.runner import counting_sends, reset_sends, sends

    c_conn = mysqldb.connect(host="127.0.0.1", user="root", autocommit=True)
    py_conn = pymysql.connect(
        host="127.0.0.1", user="root", autocommit=True, client_flag=CLIENT.MULTI_STATEMENTS
    )
    try:
        with counting_sends():
            for conn in (c_conn, py_conn):
                reset_sends()
                cur = conn.cursor()
                cur.execute("SELECT 1")
                cur.execute("SELECT 1; SELECT 2")  # one request, two statements
                while cur.nextset():
                    pass
                assert sends() == 2, type(conn)
        reset_sends()
        c_conn.cursor().execute("SELECT 1")  # counting is over: nothing counts
        assert sends() == 0
    finally:
        c_conn.close()
        py_conn.close()


def test_the_commands_default_systems_are_the_benchmarks() -> None:
    from store.cli import main
    from store.tools.mix.bench import DEFAULT_SYSTEMS

    mix = main.commands["bench"].commands["mix"]  # type: ignore[attr-defined]
    option = next(p for p in mix.params if p.name == "systems")
    assert option.default == ",".join(DEFAULT_SYSTEMS)


def test_system_names_are_checked_before_anything_runs() -> None:
    """A store variant names its cache settings (store:KEY=VALUE, store-mysqldb:KEY=VALUE); a bad name,
    knob or value is refused with what to write instead."""
    from store.config import StoreConfig
    from store.exceptions import ConfigError
    from store.tools.mix import bench, systems
    from store.tools.mix.dataset_db import default_config

    url = "mysql+pymysql://root@127.0.0.1:3306"
    config = StoreConfig.from_dict(default_config(url, url, shards=4))
    options = bench.MixOptions(threads=[1])
    schema = None  # (not reached: names are refused first)
    for name, said in (
        ("postgres", "unknown system 'postgres'"),
        ("store:colour=red", "give store:KEY=VALUE with KEY one of max_stale_s"),
        ("store:follow=maybe", "'maybe' is not a value of follow"),
        (
            "floor:cheap",
            "unknown system 'floor:cheap'; choose from floor, horizontal_shard, store, floor:promised",
        ),
        ("store:invalidation=often", "'often' is not a value of invalidation"),
        ("store:follow=true,invalidation=log", "follow and invalidation are two ways of one thing"),
        ("store-mysqldb:follow=true", "--mysqldb URL runs on the mix's own config"),
    ):
        with pytest.raises(ConfigError, match=re.escape(said)):
            systems.make_system(name, config, schema, options)  # type: ignore[arg-type]


def test_a_store_variant_with_several_knobs_is_one_system_on_the_command_line() -> None:
    from store.cli.bench import _system_names

    assert _system_names("floor,store:invalidation=binlog,list_entries=100, store , store:ttl_s=5") == (
        "floor",
        "store:invalidation=binlog,list_entries=100",
        "store",
        "store:ttl_s=5",
    )
    assert _system_names("floor,,horizontal_shard") == ("floor", "horizontal_shard")


def test_cpu_per_call_vs_the_floor_counts_the_client_and_every_server() -> None:
    from store.tools.mix.report import cpu_vs

    floor = {
        "process_cpu_us_per_call": 300.0,
        "server_cpu_us_per_call": {"mariadbd": 150.0, "redis-server": 50.0},
    }
    store = {
        "process_cpu_us_per_call": 400.0,
        "server_cpu_us_per_call": {"mariadbd": 200.0, "memcached": 25.0},
    }
    assert cpu_vs(store, floor) == pytest.approx(625 / 500)
    assert cpu_vs(floor, floor) == pytest.approx(1.0)
    assert cpu_vs({**store, "server_cpu_us_per_call": {}}, floor) is None  # the servers not measured


@pytest.mark.parametrize("io", ["threads", "native"])
def test_mix_runs_the_async_store_by_tasks_and_reports_connections(tmp_path: Path, io: str) -> None:
    for name, port in (("MariaDB", 3306), ("memcached", 11211), ("Redis", 6379)):
        require_port(name, port)
    from store.tools.mix import bench

    options = bench.MixOptions(
        shape=bench.QUICK_SHAPE,
        threads=[2],
        concurrency=[24],  # more tasks than the async store has workers, or connections
        requests=25,
        rounds=1,
        systems=("store", bench.ASYNC_SYSTEM),
        trips=30,
        out=tmp_path / "mix",
        async_io=io,
        async_pool=2 if io == "native" else None,
    )
    doc = bench.run_mix(options, say=lambda _msg: None)
    phases = {(p["system"], p["threads"], p["temperature"]): p for p in doc["phases"]}
    assert set(phases) == {
        ("store", 2, "cold"),
        ("store", 2, "warm"),
        ("store:async", 24, "cold"),
        ("store:async", 24, "warm"),
    }
    for p in phases.values():
        assert p["errors"] == 0, (p["system"], {k: v["first_error"] for k, v in p["operations"].items()})
        assert p["calls"] == p["threads"] * 25
        assert p["connections"] >= 1
        assert "cache_faults" not in p, p["cache_faults"]  # every cache call answered
    # 24 tasks, min(32, pool_size) workers, two host names: at most one connection per worker per host.
    from store.aio import default_max_workers
    from store.tools.mix.options import mix_config

    workers = default_max_workers(mix_config(options))
    assert workers < 24
    # Native: no workers; the pools bound the connections (pool_size 2: 4 open a host, 2 hosts).
    most = 2 * workers if io == "threads" else 2 * 4
    for temperature in ("cold", "warm"):
        assert phases[("store:async", 24, temperature)]["connections"] <= most
    for check in doc["checks"]:
        assert check["checked"] > 100
        assert check["mismatches"] == [], check
    assert "store:async: its thread count is tasks" in doc["report"]
    assert "most database connections in use at once" in doc["report"]


def test_a_phase_whose_cache_failed_says_so_in_its_summary_and_tables() -> None:
    """Cache calls that failed or were skipped in a phase (a breaker open: the phase ran partly
    uncached) are summed over its slices and named in the JSON and the tables; none, nothing."""
    from store.tools.mix.report import as_json, markdown, summary
    from store.tools.mix.runner import OpSamples, Phase, merge

    def phase(faults: dict[str, int]) -> Phase:
        ops = {op: OpSamples() for op in MIX}
        ops["get_node"].wall_ns.extend([1_000_000] * 10)
        p = Phase("store:async", 256, "warm", 1.0, 0.5, ops)
        p.cache_faults = faults
        return p

    merged = merge([phase({"redis": 30, "memcached": 0}), phase({"redis": 12, "memcached": 0})])
    assert summary(merged)["cache_faults"] == {"redis": 42, "memcached": 0}
    assert "- store:async, 256 warm: redis 42" in markdown(as_json([merged], [], {}, {}))
    clean = merge([phase({"redis": 0}), phase({})])
    assert "cache_faults" not in summary(clean)
    assert "Cache calls failed" not in markdown(as_json([clean], [], {}, {}))
