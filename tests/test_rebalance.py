"""`store rebalance` and `store move --status`.

The planner is pure and property-tested; the dry run of 4,096 shards needs
no server; the real run spreads 64 shards from one MariaDB server over four
(servers the test starts), is killed part-way and resumed, and loses nothing.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pymysql
import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store import ConfigError, Store, StoreConfig
from store.admin import init_shards
from store.admin.rebalance import PlannedMove, apply_plan, minimum_shards_moved, plan_rebalance, run_rebalance
from store.cli import main
from store.shardmap import ShardMap, ShardRange
from tests.conftest import base_config
from tests.servers import MariaDBServer, free_ports

NAMES = ["A", "B", "C", "D", "E", "F"]


@st.composite
def maps(draw: st.DrawFn) -> ShardMap:
    """A map of 1..300 shards in random runs over some of NAMES."""
    holders = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=5, unique=True))
    lengths = draw(st.lists(st.integers(1, 60), min_size=1, max_size=12))
    ranges, start = [], 0
    for length in lengths:
        host = draw(st.sampled_from(holders))
        ranges.append(ShardRange(start, start + length - 1, host))
        start += length
    merged: list[ShardRange] = []
    for r in ranges:
        if merged and merged[-1].master == r.master:
            merged[-1] = ShardRange(merged[-1].start, r.end, r.master)
        else:
            merged.append(r)
    return ShardMap(merged, shards=start)


def brute_minimum(m: ShardMap, targets: list[str]) -> int:
    """The fewest shards moved over every choice of which targets get the ceil quota."""
    held = Counter(m.master(s) for s in range(m.shards))
    base, extra = divmod(m.shards, len(targets))
    best = None
    for ceil in itertools.combinations(targets, extra):
        q = {h: base + (h in ceil) for h in targets}
        moved = sum(max(0, n - q.get(h, 0)) for h, n in held.items())
        best = moved if best is None else min(best, moved)
    assert best is not None
    return best


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=maps(),
    targets=st.lists(st.sampled_from(NAMES), min_size=1, max_size=6, unique=True),
    seed=st.one_of(st.none(), st.integers(0, 2**32)),
)
def test_plan_balances_with_the_fewest_shards_moved(
    m: ShardMap, targets: list[str], seed: int | None
) -> None:
    rng = random.Random(seed)
    rows = None if seed is None else {s: rng.choice((0, 1, rng.randrange(10_000))) for s in range(m.shards)}
    plan = plan_rebalance(m, targets, rows)
    owner = [m.master(s) for s in range(m.shards)]
    moved: set[int] = set()
    for mv in plan:  # applicable in order: the source holds the whole range when its turn comes
        assert 0 <= mv.low <= mv.high < m.shards
        assert mv.source != mv.target
        assert mv.target in targets
        assert {owner[s] for s in range(mv.low, mv.high + 1)} == {mv.source}
        assert mv.drain == (mv.source not in targets)
        if rows is None:
            assert mv.rows is None
        else:
            assert mv.rows == sum(rows[s] for s in range(mv.low, mv.high + 1))
        for s in range(mv.low, mv.high + 1):
            assert s not in moved, f"shard {s} moves twice"
            moved.add(s)
            owner[s] = mv.target
    after = Counter(owner)
    base = m.shards // len(targets)
    for h in targets:
        assert after[h] in (base, base + (m.shards % len(targets) > 0)), (h, after)
    assert set(after) <= set(targets), "a host outside --hosts kept shards"
    assert len(moved) == brute_minimum(m, targets) == minimum_shards_moved(m, targets)
    assert apply_plan(m, plan).shards == m.shards


def test_plan_sheds_the_lightest_end_of_a_run() -> None:
    m = ShardMap([ShardRange(0, 7, "A")], shards=8)
    heavy_end = {s: (100 if s >= 4 else 1) for s in range(8)}
    assert plan_rebalance(m, ["A", "B"], heavy_end) == [PlannedMove(0, 3, "A", "B", 4)]
    assert plan_rebalance(m, ["A", "B"]) == [PlannedMove(4, 7, "A", "B")]
    assert plan_rebalance(m, ["A"]) == []


def test_plan_drains_hosts_not_given() -> None:
    m = ShardMap([ShardRange(0, 3, "A"), ShardRange(4, 7, "OLD")], shards=8)
    plan = plan_rebalance(m, ["A", "B"])
    assert plan == [PlannedMove(4, 7, "OLD", "B", drain=True)]


def write_config(path: Path, raw: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(raw))
    return path


def test_a_moved_range_gets_the_targets_slave_and_the_plan_says_what_becomes_of_its_own() -> None:
    m = ShardMap([ShardRange(0, 47, "A", "A2"), ShardRange(48, 63, "C", "C2")], shards=64)
    plan = plan_rebalance(m, ["A", "C"])
    assert plan == [PlannedMove(32, 47, "A", "C", None, False, slave="C2", old_slaves=("A2",))]
    assert plan[0].line() == (
        "move shards 32-47 from A to C (rows not measured); slave A2 stays with A (it replicates A, not C); "
        "slave C2 (C's)"
    )
    assert apply_plan(m, plan).ranges == (ShardRange(0, 31, "A", "A2"), ShardRange(32, 63, "C", "C2"))
    # A target that names no slave (or several) for its ranges: the range has none, and says so.
    m = ShardMap([ShardRange(0, 63, "A", "A2")], shards=64)
    plan = plan_rebalance(m, ["A", "B"], {s: 1 for s in range(64)})
    assert plan == [PlannedMove(32, 63, "A", "B", 32, False, slave=None, old_slaves=("A2",))]
    assert plan[0].line() == (
        "move shards 32-63 from A to B (32 rows); slave A2 stays with A (it replicates A, not B): "
        "the range has no slave after the move (B has no single slave in the map)"
    )
    assert apply_plan(m, plan).ranges == (ShardRange(0, 31, "A", "A2"), ShardRange(32, 63, "B", None))
    # Without slaves, the line is as before.
    plain = plan_rebalance(ShardMap([ShardRange(0, 63, "A")], shards=64), ["A", "B"])
    assert plain[0].line() == "move shards 32-63 from A to B (rows not measured)"


def test_dry_run_of_4096_shards_over_four_hosts_needs_no_server(tmp_path: Path) -> None:
    # Nothing listens on these ports: the row estimate fails fast and the plan counts shards.
    raw = base_config(
        shards=4096,
        hosts={h: f"mysql+pymysql://root@127.0.0.1:{p}" for h, p in zip("ABCD", (1, 2, 3, 4), strict=True)},
        map=[{"range": [0, 2047], "master": "A"}, {"range": [2048, 4095], "master": "B"}],
        map_source={"file": str(tmp_path / "map.yaml"), "poll_s": 1},
    )
    config = write_config(tmp_path / "store.yaml", raw)
    t0 = time.monotonic()
    result = CliRunner().invoke(
        main, ["rebalance", "--config", str(config), "--hosts", "A,B,C,D", "--dry-run"]
    )
    assert result.exit_code == 0, result.output
    assert time.monotonic() - t0 < 30
    lines = result.output.splitlines()
    moves = [line for line in lines if line.startswith("move shards")]
    assert moves == [
        "move shards 1024-2047 from A to C (rows not measured)",
        "move shards 3072-4095 from B to D (rows not measured)",
    ]
    assert any("2 move(s), 2048 of 4096 shards, rows not measured" in line for line in lines)
    after = {}
    for line in lines:
        parts = line.split()
        if len(parts) == 3 and parts[0] in "ABCD" and parts[1].isdigit():
            after[parts[0]] = (int(parts[1]), int(parts[2]))
    assert after == {"A": (2048, 1024), "B": (2048, 1024), "C": (0, 1024), "D": (0, 1024)}
    shards_moved = sum(int(m.split()[2].split("-")[1]) - int(m.split()[2].split("-")[0]) + 1 for m in moves)
    assert shards_moved == 2048

    bad = CliRunner().invoke(main, ["rebalance", "--config", str(config), "--hosts", "A,X,Y", "--dry-run"])
    assert bad.exit_code == 1
    assert "unknown host(s) X, Y" in bad.output


def test_without_a_map_source_the_dry_run_refuses_as_the_real_run_does(tmp_path: Path) -> None:
    # Nothing listens on these ports: neither run gets as far as a server.
    raw = base_config(
        shards=64,
        hosts={h: f"mysql+pymysql://root@127.0.0.1:{p}" for h, p in zip("AB", (1, 2), strict=True)},
        map=[{"range": [0, 63], "master": "A"}],
    )
    config = write_config(tmp_path / "store.yaml", raw)
    journal = tmp_path / "rebalance.json"
    common = ["rebalance", "--config", str(config), "--hosts", "A,B", "--journal", str(journal)]
    dry = CliRunner().invoke(main, [*common, "--dry-run"])
    real = CliRunner().invoke(main, [*common, "--yes"])
    refusal = (
        "error: a rebalance must publish a new map to every running store, and the config has no "
        "map_source: configure one (map_source: {file: PATH}, {table: URL} or {zookeeper: HOST:2181})\n"
    )
    assert (dry.exit_code, dry.output) == (1, refusal)
    assert (real.exit_code, real.output) == (1, refusal)
    assert not journal.exists(), "a refused rebalance left a journal to --resume"
    resumed = CliRunner().invoke(
        main, ["rebalance", "--config", str(config), "--resume", "--journal", str(journal)]
    )
    assert (resumed.exit_code, resumed.output) == (1, refusal)
    # The library refuses the same, before it writes the journal.
    with (
        Store(StoreConfig.from_dict(raw)) as store,
        pytest.raises(ConfigError, match="a rebalance must publish"),
    ):
        run_rebalance(store, [PlannedMove(32, 63, "A", "B")], journal, say=lambda _m: None)
    assert not journal.exists()
    # With a map_source, the dry run prints its plan and changes nothing.
    raw["map_source"] = {"file": str(tmp_path / "map.yaml")}
    write_config(config, raw)
    planned = CliRunner().invoke(main, [*common, "--dry-run"])
    assert planned.exit_code == 0, planned.output
    assert "move shards 32-63 from A to B (rows not measured)" in planned.output.splitlines()
    assert not journal.exists()


def test_rebalance_refuses_hosts_that_are_not_mariadb(tmp_path: Path) -> None:
    raw = base_config(
        shards=8,
        hosts={"A": f"sqlite:///{tmp_path}/a", "B": f"sqlite:///{tmp_path}/b"},
        map=[{"range": [0, 7], "master": "A"}],
    )
    config = write_config(tmp_path / "store.yaml", raw)
    result = CliRunner().invoke(main, ["rebalance", "--config", str(config), "--hosts", "A,B", "--dry-run"])
    assert result.exit_code == 1
    assert "not MariaDB" in result.output


def test_move_status_without_a_journal_is_one_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "store.cli", "move", "--status", "--journal", str(tmp_path / "none.json")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [f"error: no move journal at {tmp_path / 'none.json'}: "
                                                "no move has run with this --journal"]  # fmt: skip


# -- a real run ------------------------------------------------------------------------

SHARDS = 64
PORTS = free_ports(4)


@pytest.fixture
def four() -> Iterator[list[MariaDBServer]]:
    # One mariadb-install-db at a time: several side by side fail now and then.
    servers: list[MariaDBServer] = []
    try:
        for i, port in enumerate(PORTS):
            servers.append(MariaDBServer(port, log_bin=True, server_id=i + 1))
        with ThreadPoolExecutor(len(servers)) as pool:
            list(pool.map(lambda s: s.start(), servers))
        yield servers
    finally:
        for s in servers:
            s.remove()


def sql(server: MariaDBServer, query: str) -> list[tuple[Any, ...]]:
    conn = pymysql.connect(host="127.0.0.1", port=server.port, user="root")
    try:
        with conn.cursor() as cur:
            cur.execute(query)
            return list(cur.fetchall())
    finally:
        conn.close()


def run_cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "store.cli", *args], capture_output=True, text=True, check=False
    )
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.mark.moves
def test_rebalance_64_shards_over_four_servers_killed_and_resumed(
    four: list[MariaDBServer], tmp_path: Path
) -> None:
    t0 = time.monotonic()
    raw = base_config(
        shards=SHARDS,
        hosts={h: s.url for h, s in zip("ABCD", four, strict=True)},
        map=[{"range": [0, SHARDS - 1], "master": "A"}],
        map_source={"file": str(tmp_path / "map.yaml"), "poll_s": 0.2},
    )
    config_file = write_config(tmp_path / "store.yaml", raw)
    config = StoreConfig.from_dict(raw)
    init_shards(config)
    with Store(config) as store:
        pins = {store.create("pin", {"n": i}, shard=i % SHARDS): {"n": i} for i in range(320)}
        boards = [store.create("board", {"b": b}, shard=(b * 9) % SHARDS) for b in range(8)]
        pin_ids = list(pins)
        links = {(boards[i % 8], pin_ids[(i * 7) % len(pin_ids)]) for i in range(200)}
        for b, p in links:
            store.link("board_has_pins", b, p)
    loaded = time.monotonic()

    journal = tmp_path / "rebalance.json"
    common = ["--config", str(config_file), "--journal", str(journal)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "store.cli", "rebalance", "--hosts", "A,B,C,D", "--yes", *common],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    seen: list[str] = []
    second = False
    for line in proc.stdout:
        seen.append(line.rstrip())
        second = second or line.startswith("rebalance: move 2 of 3")
        if second and line.startswith("catch up:"):
            # Mid-move: its own journal says catch_up, or switch where the child ran on before the
            # signal landed (a busy machine); either way the move is unfinished.
            os.kill(proc.pid, signal.SIGKILL)
            break
    proc.wait()
    proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL, "\n".join(seen)
    planned = [
        line for line in seen if re.fullmatch(r"move shards \d+-\d+ from A to [BCD] \(\d+ rows\)", line)
    ]
    assert len(planned) == 3, seen  # rows measured: every server answered
    state = json.loads(journal.read_text())
    assert state["done"] == [True, False, False]
    second_move, last_move = state["moves"][1], state["moves"][2]

    status = json.loads(run_cli("move", "--status", "--json", "--journal", f"{journal}.move").stdout)
    assert status["phase"] in ("catch_up", "switch"), status
    assert (status["low"], status["high"], status["source"], status["target"]) == (
        second_move["low"], second_move["high"], "A", second_move["target"],
    )  # fmt: skip
    assert status["progress"]["running"] is True  # killed: nobody could say otherwise

    resumed = run_cli("rebalance", "--resume", *common)
    assert "rebalance: done, 3 move(s)" in resumed.stdout
    assert all(json.loads(journal.read_text())["done"])
    status = json.loads(run_cli("move", "--status", "--json", "--journal", f"{journal}.move").stdout)
    assert (status["phase"], status["low"], status["high"], status["target"]) == (
        "done", last_move["low"], last_move["high"], last_move["target"],
    )  # fmt: skip
    assert status["fenced_s"] is not None
    assert status["fenced_s"] >= 0
    assert status["progress"]["running"] is False
    assert status["progress"]["rows_total"] >= 0
    text = run_cli("move", "--status", "--journal", f"{journal}.move").stdout
    assert f"move of shards {status['shards']} from A to {last_move['target']}: phase done" in text
    assert "fenced:" in text
    again = run_cli("rebalance", "--resume", *common, check=False)
    assert again.returncode == 1
    assert "already done" in again.stderr

    with Store(config) as fresh:
        per_host = Counter(fresh.shard_map.master(s) for s in range(SHARDS))
        assert per_host == {"A": 16, "B": 16, "C": 16, "D": 16}
        assert len(fresh.shard_map.ranges) == 4, "each host should hold one contiguous range"
        got = fresh.get_many(pin_ids)
        assert {p: got.get(p) for p in pin_ids} == pins
        assert len(fresh.get_many(boards)) == len(boards)
        for b in boards:
            want = {p for bb, p in links if bb == b}
            assert set(fresh.links("board_has_pins", b, limit=1000)) == want
            assert fresh.count("board_has_pins", b) == len(want)
    check = run_cli("check", "--config", str(config_file), check=False)
    assert check.returncode == 0, check.stdout + check.stderr

    # Every move archived its 16 shards on A; the move journal names only the last move, the
    # rebalance journal all three: --cleanup drops every archive, and the tombstones stay.
    def archives() -> list[str]:
        return [r[0] for r in sql(four[0], "SELECT schema_name FROM information_schema.schemata "
                                           "WHERE schema_name LIKE 'moved\\_%' ORDER BY 1")]  # fmt: skip

    assert len(archives()) == 48
    cleaned = run_cli("rebalance", "--cleanup", *common)
    assert "dropped: 48 archive database(s)" in cleaned.stdout, cleaned.stdout
    assert (
        len(
            re.findall(
                r"rebalance: cleanup of move \d: dropped 16 archive database\(s\) on A", cleaned.stdout
            )
        )
        == 3
    )
    assert archives() == []
    tombstones = sql(
        four[0], "SELECT COUNT(*) FROM information_schema.tables WHERE table_name = 'store_tombstone'"
    )
    assert tombstones == [(48,)]
    again = run_cli("rebalance", "--cleanup", *common)  # idempotent
    assert "dropped: 48 archive database(s)" in again.stdout
    dry = run_cli("rebalance", "--hosts", "A,B,C,D", "--dry-run", *common)
    assert "0 move(s), 0 of 64 shards" in dry.stdout
    print(f"load {loaded - t0:.1f} s, rebalance and checks {time.monotonic() - loaded:.1f} s")
