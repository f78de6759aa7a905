"""`Store.ping`: did each database host, cache server and the map source answer within its timeout.

A health check for a load balancer, a deploy script or an operator
(`store ping`): every server the config names is asked one cheap question,
all at once, each within the timeout the store itself gives it:

- each host, by its config name: ``SELECT 1`` on a pooled connection of the
  request path's account (``connect_timeout_s``, ``query_timeout_s``); a
  SQLite host opens one of its shard files;
- each memcached server: ``version`` on a new connection, each Redis
  server: ``PING`` on a new connection (``cache.connect_timeout_ms``,
  ``cache.timeout_ms``; the store's circuit breakers are neither asked nor
  moved: a server a breaker skips is still asked);
- the map source (``map_source``): the newest map read from it
  (a static map, the config's own, is always there).

A server that is down, refuses, or does not answer in time is reported,
never raised: ``{"ok": False, "ms": ..., "error": "..."}``. Errors name
servers by their config name or ``host:port``, never with a password.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from store.config import StoreConfig, redis_server_name
from store.engines import Engines
from store.mapsource import MapSource
from store.shardmap import ShardMap

__all__ = ["ERROR_CHARS", "Probe", "ping"]

#: The longest error message a probe reports (a driver's message can run long).
ERROR_CHARS = 300
#: One probe's answer: ``{"ok": bool, "ms": float, "error": str | None}`` (and extra keys).
Probe = dict[str, Any]


def _probe(ask: Callable[[], Any]) -> Probe:
    """Run ``ask``; how long it took and whether it raised (never raises itself)."""
    started = time.perf_counter()
    try:
        extra = ask()
    except Exception as exc:
        text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
        if len(text) > ERROR_CHARS:
            text = text[: ERROR_CHARS - 3] + "..."
        return {"ok": False, "ms": _ms(started), "error": text}
    out: Probe = {"ok": True, "ms": _ms(started), "error": None}
    if isinstance(extra, dict):
        out.update(extra)
    return out


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)


def _host_shard(shard_map: ShardMap, host: str) -> int:
    """A shard ``host`` holds (as master, else as slave) in the map, else 0.

    A server host's pool is the host's whatever the shard; a SQLite host opens that shard's file.
    """
    for r in shard_map:
        if r.master == host:
            return r.shards().start
    for r in shard_map:
        if r.slave == host:
            return r.shards().start
    return 0


def _ask_host(engines: Engines, shard: int, host: str) -> Callable[[], None]:
    def ask() -> None:
        engines.shard(shard, host).read("SELECT 1", [], one=True)

    return ask


def _ask_memcached(address: str, timeout_s: float, connect_timeout_s: float) -> Callable[[], Probe]:
    def ask() -> Probe:
        from pymemcache.client.base import Client

        host, _, port = address.rpartition(":")
        client = Client(
            (host or "127.0.0.1", int(port)), connect_timeout=connect_timeout_s, timeout=timeout_s
        )
        try:
            version = client.version()
        finally:
            client.close()
        return {"version": version.decode() if isinstance(version, bytes) else str(version)}

    return ask


def _ask_redis(url: str, timeout_s: float, connect_timeout_s: float) -> Callable[[], None]:
    def ask() -> None:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        client = redis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=connect_timeout_s,
            retry=Retry(NoBackoff(), 0),
            retry_on_timeout=False,
            health_check_interval=0,
        )
        try:
            if not client.ping():
                raise ConnectionError("PING had no PONG")
        finally:
            client.close()

    return ask


def _ask_map_source(source: MapSource) -> Callable[[], Probe]:
    def ask() -> Probe:
        found = source.load()
        if found is None:
            raise LookupError("the map source holds no map yet (a store seeds it when it starts)")
        return {"version": found.version}

    return ask


def ping(config: StoreConfig, engines: Engines, map_source: MapSource, shard_map: ShardMap) -> dict[str, Any]:
    """Ask every host, cache server and the map source at once; their answers (see the module).

    ``{"ok": bool, "hosts": {name: probe}, "caches": {"memcached": {address: probe},
    "redis": {host:port/db: probe}}, "map_source": probe}``, each probe
    ``{"ok": bool, "ms": float, "error": str | None}``; ``ok`` is True when every probe is.
    """
    c = config.cache
    timeout_s, connect_s = c.timeout_ms / 1000, c.connect_timeout_ms / 1000
    jobs: list[tuple[str, str, Callable[[], Any]]] = [
        ("hosts", name, _ask_host(engines, _host_shard(shard_map, name), name)) for name in config.hosts
    ]
    jobs += [("memcached", a, _ask_memcached(a, timeout_s, connect_s)) for a in c.memcached]
    jobs += [("redis", redis_server_name(u), _ask_redis(u, timeout_s, connect_s)) for u in c.redis]
    jobs.append(("map_source", "", _ask_map_source(map_source)))
    with ThreadPoolExecutor(max_workers=min(16, len(jobs)), thread_name_prefix="store-ping") as pool:
        answers = list(pool.map(lambda job: _probe(job[2]), jobs))
    report: dict[str, Any] = {"hosts": {}, "caches": {}, "map_source": {}}
    for (group, name, _ask), answer in zip(jobs, answers, strict=True):
        if group == "hosts":
            report["hosts"][name] = answer
        elif group == "map_source":
            kind = "static" if config.map_source is None else config.map_source[0]
            report["map_source"] = {"kind": kind, **answer}
        else:
            report["caches"].setdefault(group, {})[name] = answer
    probes = [*report["hosts"].values(), report["map_source"]]
    probes += [p for servers in report["caches"].values() for p in servers.values()]
    report["ok"] = all(p["ok"] for p in probes)
    return report
