"""`store bench`, warm-cache cases: the store next to raw pymemcache and redis-py.

The floors keep their own copies of the same bytes under their own keys, on
the server that owns the store's key, so each side does the same number of
round trips to the same server: a raw ``get``, a raw ``get_many`` per server,
and a raw ``ZRANGE`` plus ``get_many`` for a board page. Both sides decode
the JSON with orjson.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from store.cache.memcached import MemcachedLeaseStore
from store.cache.redis_lists import RedisListBackend
from store.store import Store
from store_tools.timing import PIN, BenchResult, pair

__all__ = ["cache_cases"]

RAW_PREFIX = "bench:raw:"


def cache_cases(store: Store, shard: int, n: int, say: Callable[[str], None]) -> list[BenchResult]:
    """Warm get, warm get_many(50) and a warm board page, each next to the raw calls."""
    try:
        from pymemcache.client.base import Client
    except ImportError:  # the floor needs pymemcache; the store does not
        say("pymemcache is not installed: skipping the warm-cache cases (pip install pymemcache)")
        return []
    objects, lists = store.admin_context().caches.objects, store.admin_context().caches.lists
    assert objects is not None
    assert lists is not None
    mc = objects.store
    assert isinstance(mc, MemcachedLeaseStore)
    backend = lists.backend
    assert isinstance(backend, RedisListBackend)
    raw_redis = backend.client
    clients: dict[str, Any] = {}
    for server in mc.servers:
        host, _, port = server.address.rpartition(":")
        clients[server.address] = Client((host, int(port)), connect_timeout=1, timeout=1, no_delay=True)

    board = store.create("board", {"name": "bench board"}, shard=shard)
    pins = [store.create("pin", PIN, shard=shard) for _ in range(50)]
    for i, p in enumerate(pins):
        store.link("board_has_pins", board, p, sequence=i)
    # Warm the store's caches, and give the floors their copies.
    store.get_many(pins)
    store.board_pins(board, limit=50)
    text = orjson.dumps(PIN)
    owner = {p: mc.server_for(store.cache_key(p)).address for p in pins}
    for p in pins:
        clients[owner[p]].set(f"{RAW_PREFIX}{p}", text)
    zkey = f"{RAW_PREFIX}z:{board}"
    raw_redis.delete(zkey)
    raw_redis.zadd(zkey, {str(p).zfill(20): 0 for p in pins})
    by_server: dict[str, list[str]] = {}
    for p in pins:
        by_server.setdefault(owner[p], []).append(f"{RAW_PREFIX}{p}")

    def raw_get(i: int) -> None:
        p = pins[i % 50]
        orjson.loads(clients[owner[p]].get(f"{RAW_PREFIX}{p}"))

    def raw_get_many(_i: int) -> None:
        for address, keys in by_server.items():
            for value in clients[address].get_many(keys).values():
                orjson.loads(value)

    def raw_board_page(_i: int) -> None:
        ids = [int(m) for m in raw_redis.zrange(zkey, 0, 49)]  # type: ignore[arg-type]
        keys: dict[str, list[str]] = {}
        for p in ids:
            keys.setdefault(owner[p], []).append(f"{RAW_PREFIX}{p}")
        for address, group in keys.items():
            for value in clients[address].get_many(group).values():
                orjson.loads(value)

    results = []
    try:
        for case, store_op, raw_op in (
            ("warm get", lambda i: store.get(pins[i % 50]), raw_get),
            ("warm get_many(50)", lambda _i: store.get_many(pins), raw_get_many),
            ("warm board page", lambda _i: store.board_pins(board, limit=50), raw_board_page),
        ):
            say(case)
            results.append(pair(case, store_op, raw_op, n))
    finally:
        raw_redis.delete(zkey)
        for address, keys in by_server.items():
            clients[address].delete_many(keys)
            clients[address].close()
    return results
