"""Metrics (`store.metrics`), admin logging (`--log-json`) and the page's endpoints, without a browser."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

pytest.importorskip("prometheus_client")

from store import Store
from store.cache import CacheServers
from store.cli import main
from store.config import redis_server_name
from store.metrics import (
    METRIC_NAMES,
    Metrics,
    cache_breakers,
    instrument,
    move_progress_path,
    redis_address,
    redis_servers,
)
from tests.conftest import sqlite_config


@pytest.fixture
def store(tmp_path: Path) -> Any:
    raw = sqlite_config(tmp_path)
    raw["cache"] = {"memory": True}
    with Store.from_config(raw) as s:
        yield s


def samples(m: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in m.registry.collect():
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_off_costs_nothing_on_the_request_path(store: Store) -> None:
    pin = store.create("pin", {"t": 1})
    assert store.get(pin) == {"t": 1}
    assert "get" not in vars(store)  # the class's method, no wrapper
    engines = store.admin_context().engines
    assert all(h.observe is None for h in engines._handles.values())


def test_ops_are_timed_by_op_and_host(store: Store) -> None:
    m = instrument(store, Metrics())
    board = store.create("board", {"n": "b"}, shard=0)  # shards 0-3 are on host A
    pin = store.create("pin", {"t": 1}, near=board)
    store.link("board_has_pins", board, pin)
    assert store.get(pin) is not None  # a miss: read from A
    assert store.get(pin) is not None  # a hit: no host
    got = samples(m)
    assert got[("store_op_seconds_count", (("host", "A"), ("op", "create")))] == 2
    assert got[("store_op_seconds_count", (("host", "A"), ("op", "link")))] == 1
    assert got[("store_op_seconds_count", (("host", "A"), ("op", "get")))] == 1
    assert got[("store_op_seconds_count", (("host", "none"), ("op", "get")))] == 1
    assert got[("store_op_seconds_sum", (("host", "A"), ("op", "create")))] > 0
    inf = got[("store_op_seconds_bucket", (("host", "A"), ("le", "+Inf"), ("op", "create")))]
    assert inf == 2
    assert got[("store_cache_hits_total", (("cache", "memory-objects"),))] >= 1
    assert got[("store_pool_in_use", (("host", "A/db00000"),))] == 0
    assert got[("store_map_version", ())] == store.shard_map.version
    text = m.render().decode()
    names = (
        "store_op_seconds",
        "store_errors",
        "store_cache_hits",
        "store_pool_waiting",
        "store_map_version",
    )
    for name in names:
        assert name in text
        assert name in METRIC_NAMES


def test_errors_are_counted_by_kind(store: Store) -> None:
    m = instrument(store, Metrics())
    with pytest.raises(Exception, match="type"):
        store.get(12345)
    assert any(k[0] == "get" for k in m.errors())
    kinds = {kind for (_op, kind) in m.errors()}
    assert kinds  # e.g. UnknownTypeError
    assert "store_errors_total" in m.render().decode()


def test_threads_count_without_losing_any(store: Store) -> None:
    m = instrument(store, Metrics())
    pin = store.create("pin", {"t": 1}, shard=5)
    store.get(pin)

    def reader() -> None:
        for _ in range(200):
            store.get(pin)

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = sum(cell[-2] + sum(cell[:-2]) for (op, _h), cell in m.latencies().items() if op == "get")
    assert total == 801


def test_ended_threads_leave_their_counts_not_their_tables(store: Store) -> None:
    """Threads that make calls and end (a thread per request) leave their counts in the totals and
    no table of their own behind."""
    metrics = Metrics()
    instrument(store, metrics)
    pin = store.create("pin", {"a": 1})
    for _ in range(20):
        pool = [threading.Thread(target=store.get, args=(pin,)) for _ in range(10)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    assert len(metrics._threads) <= 1  # this thread's (it made the create)
    counts: dict[str, int] = {}
    for (op, _host), cell in metrics.latencies().items():  # (a cache hit is host "none")
        counts[op] = counts.get(op, 0) + sum(cell[:-1])
    assert counts["get"] == 200
    assert counts["create"] == 1


def test_instrument_twice_wraps_once(store: Store) -> None:
    m = Metrics()
    instrument(store, m)
    wrapped = vars(store)["get"]
    instrument(store, m)
    assert vars(store)["get"] is wrapped


def test_cache_servers_and_their_breakers_are_exported(
    tmp_path: Path, memcached_pair: list[str], redis_ready: str
) -> None:
    """Each memcached and Redis server is a `store_cache_breaker_open` gauge, 1 while this process's
    breaker on it is open; the servers are what `Caches.servers` names (in-process caches: none)."""
    raw = sqlite_config(tmp_path)
    raw["cache"] = {"memcached": memcached_pair, "redis": redis_ready, "prefix": "tm:"}
    with Store.from_config(raw) as s:
        m = instrument(s, Metrics())
        caches = s.admin_context().caches
        servers = caches.servers()
        redis_name = redis_server_name(redis_ready)
        assert [x.address for x in servers["memcached"]] == memcached_pair
        assert [x.address for x in servers["redis"]] == [redis_name]
        assert caches.lists is not None
        assert [redis_address(b) for b in redis_servers(caches.lists.backend)] == [redis_name]

        def gauge(cache: str, server: str) -> float:
            return samples(m)[("store_cache_breaker_open", (("cache", cache), ("server", server)))]

        assert gauge("memcached", memcached_pair[0]) == gauge("memcached", memcached_pair[1]) == 0
        assert gauge("redis", redis_name) == 0
        servers["memcached"][1].breaker.trip()
        servers["redis"][0].breaker.trip()
        assert gauge("memcached", memcached_pair[0]) == 0
        assert gauge("memcached", memcached_pair[1]) == 1
        assert gauge("redis", redis_name) == 1
        assert cache_breakers(s) == {
            ("memcached", memcached_pair[0]): False,
            ("memcached", memcached_pair[1]): True,
            ("redis", redis_name): True,
        }


def test_in_process_caches_have_no_servers(store: Store) -> None:
    caches = store.admin_context().caches
    assert caches.servers() == {}
    assert cache_breakers(store) == {}
    assert caches.lists is not None
    assert not isinstance(caches.lists.backend, CacheServers)


def test_move_progress_is_exported(tmp_path: Path) -> None:
    journal = tmp_path / "store-move.json"
    move_progress_path(journal).write_text(
        json.dumps({"phase": "catch_up", "rows_copied": 10, "rows_total": 20, "lag_s": 2.0, "fenced_s": None})
    )
    m = Metrics(move_journal=journal)
    got = samples(m)
    assert got[("store_move_phase", (("phase", "catch_up"),))] == 1
    assert got[("store_move_phase", (("phase", "copy"),))] == 0
    assert got[("store_move_rows_copied", ())] == 10
    assert got[("store_move_replication_lag_seconds", ())] == 2.0


def test_log_json_lines_for_admin_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["--log-json", "init"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    assert [d["msg"] for d in lines] == ["init: starting", "init: done"]
    for d in lines:
        assert {"ts", "level", "logger", "msg"} <= set(d)
        assert d["logger"] == "store.admin.init"
        assert d["level"] == "INFO"
    assert lines[1]["shards"] > 0
    text = CliRunner().invoke(main, ["init"])
    assert "INFO store.admin.init: init: done shards=" in text.stderr


def test_request_path_logs_nothing_at_info(store: Store, caplog: pytest.LogCaptureFixture) -> None:
    instrument(store, Metrics())
    with caplog.at_level("INFO", logger="store"):
        pin = store.create("pin", {"t": 1})
        store.get(pin)
        store.update(pin, {"t": 2})
        store.delete(pin)
    assert [r for r in caplog.records if r.levelname == "INFO"] == []


# -- the page's endpoints, in process (the browser test drives the real thing) -------------------


class _Reply:
    def __init__(self, status_code: int, text: str) -> None:
        self.status_code = status_code
        self.text = text

    def json(self) -> Any:
        return json.loads(self.text)


class _Client:
    """GETs against a real Uvicorn server on a free port (no extra HTTP client library)."""

    def __init__(self, base: str) -> None:
        self.base = base

    def get(self, path: str, headers: dict[str, str] | None = None) -> _Reply:
        import urllib.error
        import urllib.request

        req = urllib.request.Request(self.base + path, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return _Reply(r.status, r.read().decode())
        except urllib.error.HTTPError as exc:
            return _Reply(exc.code, exc.read().decode())


@pytest.fixture
def client(store: Store, tmp_path: Path) -> Any:
    pytest.importorskip("starlette")
    import socket
    import time

    import uvicorn

    from store.admin.check import CheckReport, save_report
    from store.serve.app import build_app
    from store.serve.panels import Panels

    journal = tmp_path / "store-move.json"
    journal.write_text(json.dumps({"phase": "catch_up", "low": 4, "high": 7, "source": "B", "target": "A"}))
    move_progress_path(journal).write_text(
        json.dumps({"phase": "catch_up", "step": "catch_up", "progress": 0.7, "running": True, "lag_s": 1.0})
    )
    save_report(CheckReport(map_version=1, shards=8), tmp_path / "check.json")
    m = instrument(store, Metrics())
    panels = Panels(store, journal=journal, check_file=tmp_path / "check.json")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    app = build_app(panels, token="s3cret", metrics=m.render)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield _Client(f"http://127.0.0.1:{port}")
    finally:
        server.should_exit = True
        thread.join(10)


def test_endpoints_need_the_token(client: Any) -> None:
    assert client.get("/api/map").status_code == 401
    assert client.get("/api/map?token=wrong").status_code == 401
    assert client.get("/api/map", headers={"X-Store-Token": "s3cret"}).status_code == 200
    assert client.get("/api/map", headers={"Authorization": "Bearer s3cret"}).status_code == 200


def test_every_panel_has_json(client: Any) -> None:
    q = "?token=s3cret"
    m = client.get("/api/map" + q).json()
    assert [(r["start"], r["end"], r["master"]) for r in m["ranges"]] == [(0, 3, "A"), (4, 7, "B")]
    hosts = client.get("/api/hosts" + q).json()
    assert [h["host"] for h in hosts] == ["A", "B"]
    assert all(h["ping_ms"] is not None for h in hosts)
    assert client.get("/api/caches" + q).json() == []  # in-process caches: no servers
    move = client.get("/api/move" + q).json()
    assert move["phase"] == "catch_up"
    assert move["progress"] == 0.7
    assert client.get("/api/check" + q).json()["ok"] is True
    assert client.get("/api/invalidators" + q).json() == []  # no daemon configured
    assert set(client.get("/api/all" + q).json()) == {
        "map",
        "hosts",
        "caches",
        "invalidators",
        "move",
        "check",
    }
    assert "store_map_version" in client.get("/metrics" + q).text
    page = client.get("/" + q).text
    assert page.count('class="bar"') == 2
    assert 'id="move-progress" data-progress="70.0"' in page
    assert "setInterval" in page


def test_serve_refuses_other_addresses_without_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STORE_SERVE_TOKEN", raising=False)
    result = CliRunner().invoke(main, ["serve", "--host", "0.0.0.0"])
    assert result.exit_code == 1
    assert "without a token" in result.output


def test_the_maps_age_is_exported_with_a_map_source_only(store: Store, tmp_path: Path) -> None:
    assert "store_map_age_seconds" not in instrument(store, Metrics()).render().decode()  # static map
    raw = sqlite_config(tmp_path)
    raw["map_source"] = {"file": str(tmp_path / "map.yaml"), "poll_s": 0.05}
    with Store.from_config(raw) as live:
        m = instrument(live, Metrics())
        live.create("pin", {"t": 1})
        got = samples(m)
        assert 0 <= got[("store_map_age_seconds", ())] < 1.0
        assert got[("store_map_version_age_seconds", ())] >= got[("store_map_age_seconds", ())]
        assert got[("store_map_check_errors_total", ())] == 0
        status = live.admin_context().live.status()
        assert (status.source, status.version, status.check_errors, status.last_error) == ("file", 1, 0, "")
        for name in ("store_map_age_seconds", "store_map_version_age_seconds", "store_map_check_errors"):
            assert name in METRIC_NAMES


def test_the_page_shows_the_maps_age(store: Store, tmp_path: Path) -> None:
    pytest.importorskip("starlette")
    from store.serve.app import render_panels
    from store.serve.panels import Panels

    static = Panels(store, journal=None, check_file=None)
    assert static.map()["age_s"] is None
    assert "no map source" in render_panels(static)
    raw = sqlite_config(tmp_path)
    raw["map_source"] = {"file": str(tmp_path / "map.yaml")}
    with Store.from_config(raw) as live:
        panels = Panels(live, journal=None, check_file=None)
        shown = panels.map()
        assert shown["source"] == "file"
        assert 0 <= shown["age_s"] < 1.0
        assert shown["source_error"] == ""
        assert 'id="map-age"' in render_panels(panels)
        assert "confirmed by its file source" in render_panels(panels)
