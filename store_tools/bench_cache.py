"""`store bench`, warm-cache cases: the store next to raw pymemcache and redis-py.

The floors keep their own copies of the same bytes under their own keys, on
the server that owns the store's key, and use the store's own connections
(pymemcache clients borrowed from its pool, the same redis-py client), so
each side does the same number of round trips on the same sockets: a raw
``get``, a raw ``get_many`` per server, and a raw ``ZRANGE`` plus
``get_many`` for a board page. Both sides decode the JSON with orjson.
"""

from __future__ import annotations

from collections.abc import Callable

import orjson

from store.cache.memcached import MemcachedLeaseStore
from store.cache.redis_lists import RedisListBackend
from store.store import Store
from store_tools.timing import PIN, BenchResult, pair

__all__ = ["cache_cases"]

RAW_PREFIX = "bench:raw:"


def cache_cases(store: Store, shard: int, n: int, say: Callable[[str], None]) -> list[BenchResult]:
    """Warm get, warm get_many(50) and a warm board page, each next to the raw calls."""
    objects, lists = store.admin_context().caches.objects, store.admin_context().caches.lists
    assert objects is not None
    assert lists is not None
    mc = objects.store
    assert isinstance(mc, MemcachedLeaseStore)
    backend = lists.backend
    assert isinstance(backend, RedisListBackend)
    raw_redis = backend.client
    # The floors borrow the store's own pooled connections: the same socket is
    # served by the same memcached worker thread, and which thread (and core)
    # serves a connection moves a loopback round trip between 40 and 100 us.
    servers = {server.address: server for server in mc.servers}

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
        with servers[owner[p]].borrow() as client:
            client.set(f"{RAW_PREFIX}{p}", text)
    zkey = f"{RAW_PREFIX}z:{board}"
    raw_redis.delete(zkey)
    raw_redis.zadd(zkey, {str(p).zfill(20): 0 for p in pins})
    by_server: dict[str, list[str]] = {}
    for p in pins:
        by_server.setdefault(owner[p], []).append(f"{RAW_PREFIX}{p}")

    def raw_get(i: int) -> None:
        p = pins[i % 50]
        with servers[owner[p]].borrow() as client:
            orjson.loads(client.get(f"{RAW_PREFIX}{p}"))

    def raw_get_many(_i: int) -> None:
        for address, keys in by_server.items():
            with servers[address].borrow() as client:
                for value in client.get_many(keys).values():
                    orjson.loads(value)

    def raw_board_page(_i: int) -> None:
        ids = [int(m) for m in raw_redis.zrange(zkey, 0, 49)]  # type: ignore[arg-type]
        keys: dict[str, list[str]] = {}
        for p in ids:
            keys.setdefault(owner[p], []).append(f"{RAW_PREFIX}{p}")
        for address, group in keys.items():
            with servers[address].borrow() as client:
                for value in client.get_many(group).values():
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
            with servers[address].borrow() as client:
                client.delete_many(keys)
    return results
