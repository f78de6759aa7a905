"""The live map (`store.livemap`) while its source is down: the last map kept, its age shown.

Two MariaDB servers of the module's own: one holds the shards, the other the
map table (``map_source: {table: ...}``). The map's server is SIGKILLed (its
port refuses) or SIGSTOPped (its port open, nothing answering, like a hung
host) while a store calls shards on the healthy server: the calls go on with
the last map, the map's age grows (on `LiveMap`, in the metrics and on the
operator page's data) and drops back once the server answers again. A call
refused by a tombstone waits for a newer map at most `REROUTE_WAIT_S` and
then raises the refusal.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pymysql
import pytest

from store import BackendError, ShardMovedError, Store, StoreConfig
from store.admin import init_shards
from store.backends.mysql import leave_tombstones
from store.livemap import REROUTE_WAIT_S, LiveMap
from tests.conftest import base_config
from tests.servers import MariaDBServer, free_port

# Servers of the module's own, started and stopped by it (the `moves` suite's kind of test).
pytestmark = pytest.mark.moves

QUERY_TIMEOUT_S = 1.0
POLL_S = 0.2
#: The bound on any call on a healthy host while the map's server is down.
SLOWEST_S = QUERY_TIMEOUT_S + 0.5


@dataclass
class Servers:
    shards: MariaDBServer
    meta: MariaDBServer

    def raw(self) -> dict[str, Any]:
        return base_config(
            shards=8,
            hosts={"A": self.shards.url, "B": self.shards.url},
            map=[{"range": [0, 7], "master": "A"}],
            map_source={"table": self.meta.url, "poll_s": POLL_S},
            connect_timeout_s=1.0,
            query_timeout_s=QUERY_TIMEOUT_S,
        )


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    first = free_port()
    second = free_port()
    while second == first:
        second = free_port()
    s = Servers(MariaDBServer(first), MariaDBServer(second))
    try:
        s.shards.start()
        s.meta.start()
        init_shards(StoreConfig.from_dict(s.raw()))
        yield s
    finally:
        s.meta.remove()
        s.shards.remove()


@contextmanager
def down(server: MariaDBServer, how: str) -> Iterator[None]:
    """The map's server SIGKILLed ("killed") or SIGSTOPped ("frozen") inside the block, back after."""
    if how == "killed":
        server.kill()
    else:
        server.freeze()
    try:
        yield
    finally:
        if how == "killed":
            server.start()
        else:
            server.thaw()


def live_of(store: Store) -> LiveMap:
    return store.admin_context().live


def wait_until_confirmed(store: Store, id_: int, seconds: float = 10.0) -> float:
    """Call ``store`` (a get of ``id_``) until its source has confirmed the map within the last
    second; the age then. Calls are what check the map: an idle store's map grows old."""
    live = live_of(store)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        store.get(id_)
        age = live.age_s
        if age is not None and age < 1.0:
            return age
        time.sleep(0.05)
    raise AssertionError(f"the map's age did not drop back: {live.status()}")


@pytest.mark.parametrize("how", ["killed", "frozen"])
def test_calls_go_on_and_the_maps_age_grows_while_its_source_is_down(servers: Servers, how: str) -> None:
    pytest.importorskip("prometheus_client")
    from store.metrics import Metrics, instrument

    with Store.from_config(servers.raw()) as store:
        metrics = instrument(store, Metrics())
        live = live_of(store)
        pin = store.create("pin", {"v": 0}, shard=1)
        assert (live.age_s or 0.0) < 1.0
        took: list[float] = []
        with down(servers.meta, how):
            began = time.monotonic()
            v = 0
            while time.monotonic() < began + 2.5:
                v += 1
                t0 = time.perf_counter()
                store.update(pin, {"v": v})
                took.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                assert store.get(pin) == {"v": v}
                took.append(time.perf_counter() - t0)
                time.sleep(0.02)
            assert store.get(pin) == {"v": v}
            status = live.status()
            assert (status.age_s or 0.0) > 2.0, status
            assert status.check_errors > 0, status
            assert "shard map table" in status.last_error, status
            assert status.version == 1
            assert (status.since_change_s or 0.0) > status.age_s
            scraped = metrics.render().decode()
            assert _sample(scraped, "store_map_age_seconds") > 2.0
            assert _sample(scraped, "store_map_check_errors_total") > 0
            # An explicit refresh (admin commands, the operator page) is told, within the timeouts.
            t0 = time.perf_counter()
            with pytest.raises(BackendError, match="shard map table"):
                store.refresh_map(force=True)
            assert time.perf_counter() - t0 < SLOWEST_S
        assert max(took) < SLOWEST_S, f"the slowest call took {max(took):.3f} s"
        assert wait_until_confirmed(store, pin) < 1.0
        assert _sample(metrics.render().decode(), "store_map_age_seconds") < 1.0
        assert store.get(pin) == {"v": v}


def test_the_operator_page_shows_the_maps_age_and_the_sources_error(servers: Servers, tmp_path: Path) -> None:
    pytest.importorskip("starlette")
    from store.serve.app import render_panels
    from store.serve.panels import Panels

    with Store.from_config(servers.raw()) as store:
        panels = Panels(store, journal=None, check_file=None)
        fine = panels.map()
        assert fine["age_s"] < 1.0
        assert fine["source"] == "table"
        assert fine["source_error"] == ""
        pin = store.create("pin", {"v": 0}, shard=3)
        with down(servers.meta, "killed"):
            time.sleep(1.5)
            shown = panels.map()  # the page still shows the last map, and why it is old
            assert shown["version"] == 1
            assert shown["age_s"] > 1.0
            assert "shard map table" in shown["source_error"]
            html = render_panels(panels)
            assert 'id="map-age"' in html
            assert "cannot reach the shard map table" in html
        wait_until_confirmed(store, pin)


@pytest.mark.parametrize(("how", "shard"), [("killed", 5), ("frozen", 6)])
def test_a_refusal_with_the_map_source_down_raises_within_its_wait(
    servers: Servers, how: str, shard: int
) -> None:
    """A tombstone names map version 2, which the source (down) never gives: the call waits for it at
    most `REROUTE_WAIT_S` and raises the refusal; calls on other shards go on meanwhile."""
    with Store.from_config(servers.raw()) as store:
        pin = store.create("pin", {"v": 0}, shard=shard)
        healthy = store.create("pin", {"v": 0}, shard=2)
        fence(servers.shards, shard, moved_to="B", map_version=2)
        others: list[float] = []
        stop = threading.Event()

        def other_calls() -> None:
            while not stop.is_set():
                t0 = time.perf_counter()
                store.get(healthy)
                others.append(time.perf_counter() - t0)
                time.sleep(0.02)

        with down(servers.meta, how):
            time.sleep(0.5)  # the periodic check is failing by now
            prober = threading.Thread(target=other_calls)
            prober.start()
            try:
                for call in (lambda: store.get(pin), lambda: store.update(pin, {"v": 1})):
                    t0 = time.perf_counter()
                    with pytest.raises(ShardMovedError, match="map version 2"):
                        call()
                    waited = time.perf_counter() - t0
                    assert REROUTE_WAIT_S - 0.2 < waited < REROUTE_WAIT_S + 0.5, f"waited {waited:.2f} s"
            finally:
                stop.set()
                prober.join(10)
        assert others, "no call on a healthy shard ran"
        assert max(others) < SLOWEST_S, f"a call on a healthy shard took {max(others):.3f} s"
        wait_until_confirmed(store, healthy)


def fence(server: MariaDBServer, shard: int, *, moved_to: str, map_version: int) -> None:
    """Fence ``shard`` on ``server`` as a move does: its tables archived, a tombstone in their place."""
    db = f"db{shard:05d}"
    conn = pymysql.connect(host="127.0.0.1", port=server.port, user="root", autocommit=True)
    try:
        cur = conn.cursor()
        cur.execute(f"CREATE DATABASE IF NOT EXISTS moved_{db}")
        cur.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (db,))
        for (table,) in cur.fetchall():
            cur.execute(f"ALTER TABLE {db}.`{table}` RENAME moved_{db}.`{table}`")
        leave_tombstones(cur, [shard], moved_to, map_version)
        cur.close()
    finally:
        conn.close()


def _sample(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} is not in the metrics:\n{text}")
