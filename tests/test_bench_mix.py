"""`store bench mix`: the workload is the same for every system, and a quick run works end to end.

No timing is asserted: the run must finish, every system must answer what
the database holds, and the report, the JSON and the charts must be there.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from store.cli import main
from store_tools.mix.workload import MIX, Shape, Zipf, make_data_set, requests
from tests.conftest import require_port


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
def test_quick_mix_runs_every_system_and_checks_their_answers(tmp_path: Path) -> None:
    for name, port in (("MariaDB", 3306), ("memcached", 11211), ("Redis", 6379)):
        require_port(name, port)
    out = tmp_path / "mix"
    result = CliRunner().invoke(main, ["bench", "mix", "--quick", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "mix.json").read_text())
    systems = {p["system"] for p in doc["phases"]}
    assert systems == {"floor", "horizontal_shard", "store"}
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
    for check in doc["checks"]:
        assert check["checked"] > 100
        assert check["mismatches"] == [], check
    for name in ("floor", "store"):
        assert set(doc["round_trips"][name]) <= set(MIX)
        assert doc["round_trips"][name]["get_node"] >= 1
    assert (out / "mix-throughput.png").stat().st_size > 1000
    assert (out / "mix-latency.png").stat().st_size > 1000
    assert "vs floor" in doc["report"]
    assert "| 2 | warm | store |" in (out / "mix.md").read_text()
