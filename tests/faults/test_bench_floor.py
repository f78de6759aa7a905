"""`store bench`'s warm-cache floors ride out their connection's timeout (owned by tests/faults).

The floors borrow the store's pooled memcached connections, whose timeout is
the store's (50 ms by default); on a loaded machine a raw ``get_many`` can take
longer. A floor's read is sent again on a fresh connection, up to
``FLOOR_TRIES`` times, and a server that never answers still fails the run.
"""

from __future__ import annotations

import threading
import time

import pytest

from store.cache.memcached import MemcachedServer
from store.cache.stats import Breaker, CacheStats
from store.tools import bench_cache
from store.tools.bench_cache import FLOOR_TRIES, _floor_get_many
from tests.faults.proxy import FaultProxy

TIMEOUT_S = 0.05


def _server(port: int) -> MemcachedServer:
    return MemcachedServer(
        f"127.0.0.1:{port}",
        timeout_s=TIMEOUT_S,
        connect_timeout_s=1.0,
        breaker=Breaker(failures_to_trip=1000, cooldown_s=1.0),
        stats=CacheStats("memcached"),
    )


def test_a_floor_read_slower_than_its_timeout_is_sent_again(
    memcached_pair: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Room for a loaded machine's late timer: the proxy's switch back may come many tries later.
    monkeypatch.setattr(bench_cache, "FLOOR_TRIES", 50)
    port = int(memcached_pair[0].rpartition(":")[2])
    direct = _server(port)
    with direct.borrow() as client:
        client.set_many({"bench:floor:a": b"1", "bench:floor:b": b"2"})
    direct.close()
    with FaultProxy(port) as proxy:
        server = _server(proxy.port)
        assert _floor_get_many(server, ["bench:floor:a"]) == {"bench:floor:a": b"1"}
        proxy.delay(4 * TIMEOUT_S)  # every reply now comes after the connection's timeout...
        restored = threading.Timer(2.5 * TIMEOUT_S, proxy.pass_through)  # ...until a later try
        started = time.monotonic()
        restored.start()
        try:
            found = _floor_get_many(server, ["bench:floor:a", "bench:floor:b"])
        finally:
            restored.join()
            server.close()
        assert found == {"bench:floor:a": b"1", "bench:floor:b": b"2"}
        assert time.monotonic() - started >= 2 * TIMEOUT_S  # it did wait out a timeout or two
        assert proxy.accepted >= 2  # each try after a timeout on a new connection


def test_a_floor_read_of_a_server_that_never_answers_fails(memcached_pair: list[str]) -> None:
    port = int(memcached_pair[0].rpartition(":")[2])
    with FaultProxy(port) as proxy:
        server = _server(proxy.port)
        proxy.blackhole()
        with pytest.raises(TimeoutError):
            _floor_get_many(server, ["bench:floor:a"])
        server.close()
        assert proxy.accepted == FLOOR_TRIES
