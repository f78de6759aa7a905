"""Flickr ticket servers: two real MariaDB servers started by the tests, one killed mid-run."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from store import ConfigError
from store.cli import main
from store.config import TicketsConfig
from store.tickets import TicketAllocator, TicketError
from tests.servers import MariaDBServer

PORTS = (3317, 3318)


@pytest.fixture(scope="module")
def servers() -> Iterator[list[MariaDBServer]]:
    pair = [MariaDBServer(port) for port in PORTS]
    try:
        for s in pair:
            s.start()
        yield pair
    finally:
        for s in pair:
            s.remove()


def allocator(servers: list[MariaDBServer], **options: object) -> TicketAllocator:
    raw = {"servers": [s.url for s in servers], "counters": ["photos", "accounts", "groups"], **options}
    return TicketAllocator(TicketsConfig.from_dict(raw))


def test_eighty_thousand_distinct_tickets_with_a_server_killed_and_back(servers: list[MariaDBServer]) -> None:
    for s in servers:
        if s.proc is None:
            s.start()
    alloc = allocator(servers, retry_after_s=0.5, timeout_s=2)
    alloc.init()
    got: list[list[int]] = [[] for _ in range(8)]
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for _ in range(10_000):
                got[t].append(alloc.next("photos"))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    while sum(len(g) for g in got) < 20_000:
        time.sleep(0.01)
    servers[1].kill()  # mid-run
    at_kill = sum(len(g) for g in got)
    while sum(len(g) for g in got) < at_kill + 15_000:
        time.sleep(0.01)
    servers[1].start()  # back, with its counter where InnoDB left it
    for th in threads:
        th.join()
    assert errors == []
    every = [i for g in got for i in g]
    assert len(every) == 80_000
    assert len(set(every)) == 80_000, "an ID was handed out twice"
    odd = sum(1 for i in every if i % 2)
    served = alloc.served()
    assert odd == served[0], "server 1 hands out the odd IDs"
    assert len(every) - odd == served[1], "server 2 hands out the even IDs"
    assert served[1] > 0
    assert served[0] > served[1]  # server 1 carried the load while server 2 was down
    alloc.close()


def test_counters_are_separate_and_blocks_stay_unique(servers: list[MariaDBServer]) -> None:
    alloc = allocator(servers)
    alloc.init()
    a, b = alloc.next_many("accounts", 5), alloc.next_many("groups", 5)
    assert len(set(a)) == 5
    assert len(set(b)) == 5
    with pytest.raises(TicketError, match="unknown counter 'nope'"):
        alloc.next("nope")
    alloc.close()
    # Block reservation on its own counter: one round trip per 100 IDs.
    blocks = TicketAllocator(
        TicketsConfig.from_dict({"servers": [s.url for s in servers], "counters": ["blocked"], "block": 100})
    )
    blocks.init()
    ids = blocks.next_many("blocked", 1000)
    assert len(set(ids)) == 1000
    assert sum(blocks.served()) == 10
    blocks.close()
    # A client with another block size for the same counter is refused.
    other = TicketAllocator(
        TicketsConfig.from_dict({"servers": [s.url for s in servers], "counters": ["blocked"], "block": 10})
    )
    with pytest.raises(TicketError, match="set up with block 100"):
        other.next("blocked")
    other.close()


def test_all_servers_down_is_a_clear_error() -> None:
    alloc = TicketAllocator(
        TicketsConfig.from_dict(
            {
                "servers": ["mysql+pymysql://root@127.0.0.1:1", "mysql+pymysql://root@127.0.0.1:2"],
                "timeout_s": 0.5,
            }
        )
    )
    with pytest.raises(TicketError, match="no ticket server answered for 'default'"):
        alloc.next()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"servers": []}, "tickets.servers must be a list"),
        ({"servers": ["sqlite:///x"]}, "is not a MariaDB/MySQL URL"),
        ({"servers": ["mysql://h"], "counters": ["Bad"]}, "lower_snake_case"),
        ({"servers": ["mysql://h"], "block": 0}, "tickets.block"),
        ({"servers": ["mysql://h"], "extra": 1}, "unknown tickets key"),
    ],
)
def test_bad_tickets_config(raw: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TicketsConfig.from_dict(raw)


def test_cli_init_and_next(servers: list[MariaDBServer], tmp_path: Path) -> None:
    for s in servers:
        if s.proc is None:
            s.start()
    cfg = tmp_path / "tickets.yaml"
    cfg.write_text(yaml.safe_dump({"tickets": {"servers": [s.url for s in servers], "counters": ["photos"]}}))
    runner = CliRunner()
    out = runner.invoke(main, ["tickets", "init", "--config", str(cfg)])
    assert out.exit_code == 0, out.output
    assert "2 ticket server(s) ready: counters photos, block 1" in out.output
    out = runner.invoke(main, ["tickets", "next", "photos", "-n", "4", "--json", "--config", str(cfg)])
    assert out.exit_code == 0, out.output
    ids = yaml.safe_load(out.output)
    assert len(set(ids)) == 4
    assert {i % 2 for i in ids} == {0, 1}  # round robin over odd and even
    out = runner.invoke(main, ["tickets", "next", "--config", str(tmp_path / "none.yaml")])
    assert out.exit_code == 1
    assert "cannot read config file" in out.output
