"""`get_many` over several hosts asks them at once, on four real MariaDB servers the tests start.

Sixteen shards, four on each of the hosts DB1-DB4, one server per host and
no cache, so every `get_many` reads the databases with one query per host
(`store.engines.Engines.run_all` runs them side by side).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from store import Store, StoreConfig, decode_pinterest, encode_pinterest
from store.admin import init_shards
from store.engines import FANOUT_WORKERS, ShardHandle
from store.exceptions import ConnectionLostError
from store.objects import ObjectRepository
from tests.conftest import base_config
from tests.servers import MariaDBServer, free_ports

pytestmark = pytest.mark.moves

PORTS = free_ports(4)
HOSTS = tuple(f"DB{i + 1}" for i in range(len(PORTS)))
SHARDS = 16
PER_HOST = SHARDS // len(HOSTS)
SLEEP_S = 0.3


@dataclass
class Cluster:
    """The running servers, the store's config and the objects made on them."""

    servers: list[MariaDBServer]
    raw: dict[str, Any]
    config: StoreConfig
    pins: dict[int, dict[str, Any]]  # live pins, by ID
    boards: dict[int, dict[str, Any]]  # live boards, by ID
    deleted: list[int]  # deleted pins and boards


def host_of(shard: int) -> str:
    """The host name that holds ``shard``."""
    return HOSTS[shard // PER_HOST]


def shard_of(id_: int) -> int:
    """The shard field of a Pinterest ID."""
    return decode_pinterest(id_).shard_id


def on_hosts(ids: Sequence[int], hosts: Sequence[str]) -> list[int]:
    """The IDs among ``ids`` whose shard is on one of ``hosts``."""
    return [i for i in ids if host_of(shard_of(i)) in hosts]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """Four MariaDB servers, their shards made and filled.

    One after another: two `mariadb-install-db` at once can delete each
    other's temporary tables in the shared tmpdir.
    """
    servers: list[MariaDBServer] = []
    try:
        for port in PORTS:
            servers.append(MariaDBServer(port))
            servers[-1].start()
        raw = base_config(
            ids="pinterest",
            shards=SHARDS,
            hosts={host: s.url for host, s in zip(HOSTS, servers, strict=True)},
            map=[
                {"range": [i * PER_HOST, (i + 1) * PER_HOST - 1], "master": host}
                for i, host in enumerate(HOSTS)
            ],
        )
        config = StoreConfig.from_dict(raw)
        init_shards(config)
        pins: dict[int, dict[str, Any]] = {}
        boards: dict[int, dict[str, Any]] = {}
        deleted: list[int] = []
        with Store(config) as store:
            for shard in range(SHARDS):
                for n in range(3):
                    data = {"kind": "pin", "shard": shard, "n": n}
                    pins[store.create("pin", data, shard=shard)] = data
                data = {"kind": "board", "shard": shard}
                boards[store.create("board", data, shard=shard)] = data
            # One pin on every shard and a board on every other shard are deleted.
            for shard in range(SHARDS):
                gone = next(p for p in pins if shard_of(p) == shard)
                assert store.delete(gone)
                del pins[gone]
                deleted.append(gone)
                if shard % 2:
                    gone = next(b for b in boards if shard_of(b) == shard)
                    assert store.delete(gone)
                    del boards[gone]
                    deleted.append(gone)
        yield Cluster(servers, raw, config, pins, boards, deleted)
    finally:
        for server in servers:
            server.remove()


@pytest.fixture
def store(cluster: Cluster) -> Iterator[Store]:
    """A store on the four servers, closed after the test."""
    with Store(cluster.config) as s:
        yield s


def spying(
    monkeypatch: pytest.MonkeyPatch, sleep_s: float = 0.0
) -> tuple[list[tuple[str, str, float, float]], Callable[[], int]]:
    """Wrap `ObjectRepository.get_many` (one call per host): record (host, thread, start, end), sleep first.

    Returns the records and a function giving the most calls that ran at once.
    """
    real = ObjectRepository.get_many
    calls: list[tuple[str, str, float, float]] = []
    lock = threading.Lock()
    running = [0, 0]  # now, most

    def wrapped(
        self: ObjectRepository, h: ShardHandle, parts: Sequence[tuple[int, str, Sequence[int]]]
    ) -> list[tuple[int, str, int, str]]:
        with lock:
            running[0] += 1
            running[1] = max(running)
        started = time.perf_counter()
        try:
            if sleep_s:
                time.sleep(sleep_s)
            return real(self, h, parts)
        finally:
            with lock:
                running[0] -= 1
                calls.append((h.host, threading.current_thread().name, started, time.perf_counter()))

    monkeypatch.setattr(ObjectRepository, "get_many", wrapped)
    return calls, lambda: running[1]


def test_get_many_over_four_hosts_returns_exactly_the_live_objects(
    cluster: Cluster, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls, _ = spying(monkeypatch)
    absent = [encode_pinterest(s, 1, 999_999) for s in (1, 6, 11, 14)]  # never created
    live = {**cluster.pins, **cluster.boards}
    ids = [*live, *cluster.deleted, *absent]
    got = store.get_many(ids)
    assert got == live
    assert sorted(c[0] for c in calls) == list(HOSTS)  # one query per host
    # Pins alone, and a mix of one pin and one board per host.
    assert store.get_many(list(cluster.pins), type_name="pin") == cluster.pins
    mixed = [
        next(i for i in objs if host_of(shard_of(i)) == host)
        for host in HOSTS
        for objs in (cluster.pins, cluster.boards)
    ]
    assert store.get_many([*mixed, *cluster.deleted]) == {i: live[i] for i in mixed}
    # Only deleted and absent IDs: nothing, from every host.
    assert store.get_many([*cluster.deleted, *absent]) == {}


def test_hosts_are_queried_at_once(cluster: Cluster, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = list(cluster.pins)
    assert store.get_many(ids) == cluster.pins  # connections open before the clock starts
    calls, most_at_once = spying(monkeypatch, SLEEP_S)
    started = time.perf_counter()
    got = store.get_many(ids)
    elapsed = time.perf_counter() - started
    assert got == cluster.pins
    assert sorted(c[0] for c in calls) == list(HOSTS)
    # One after another would take 4 x 0.3 s; at once, one 0.3 s and a little.
    assert SLEEP_S <= elapsed < 0.9, f"get_many over 4 hosts took {elapsed:.3f} s"
    assert most_at_once() == len(HOSTS)
    assert len({c[1] for c in calls}) == len(HOSTS)  # each on a thread of its own
    assert any(c[1].startswith("store-fanout") for c in calls)


def test_fanout_is_bounded(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    # The same 16 shards, but each under a host name of its own: 16 queries for one call.
    raw = {
        **cluster.raw,
        "hosts": {f"S{s:02d}": cluster.servers[s // PER_HOST].url for s in range(SHARDS)},
        "map": [{"range": [s, s], "master": f"S{s:02d}"} for s in range(SHARDS)],
    }
    with Store(StoreConfig.from_dict(raw)) as store:
        ids = list(cluster.pins)
        assert store.get_many(ids) == cluster.pins
        calls, most_at_once = spying(monkeypatch, 0.1)
        assert store.get_many(ids) == cluster.pins
    assert len(calls) == SHARDS
    # The caller's thread runs one query, the fan-out pool at most FANOUT_WORKERS more.
    assert 4 <= most_at_once() <= FANOUT_WORKERS + 1
    assert len({c[1] for c in calls if c[1].startswith("store-fanout")}) <= FANOUT_WORKERS


def test_close_stops_the_fanout_threads(cluster: Cluster) -> None:
    def fanout_threads() -> list[str]:
        return [t.name for t in threading.enumerate() if t.name.startswith("store-fanout")]

    store = Store(cluster.config)
    try:
        assert store.get_many(list(cluster.pins)) == cluster.pins
        assert fanout_threads(), "a get_many over 4 hosts started no fan-out thread"
    finally:
        store.close()
    assert fanout_threads() == []


def test_one_host_down_names_it_and_spares_the_others(cluster: Cluster, store: Store) -> None:
    ids = list(cluster.pins)
    assert store.get_many(ids) == cluster.pins  # every host's pool holds connections now
    down = cluster.servers[2]
    down.kill()
    try:
        for _ in range(2):  # the first time with its pooled connections, then with none
            with pytest.raises(ConnectionLostError, match=r"on host DB3\b"):
                store.get_many(ids)
        others = on_hosts(ids, ("DB1", "DB2", "DB4"))
        assert store.get_many(others) == {i: cluster.pins[i] for i in others}
        started = time.perf_counter()
        assert store.get_many(on_hosts(ids, ("DB1",))) == {
            i: cluster.pins[i] for i in on_hosts(ids, ("DB1",))
        }
        assert time.perf_counter() - started < 1.0
    finally:
        down.start()
    assert store.get_many(ids) == cluster.pins  # and DB3 again once it is back
