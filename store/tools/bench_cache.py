"""`store bench`, warm-cache cases: the store next to raw pymemcache and redis-py.

The floors keep their own copies of the same bytes under their own keys, on
the server that owns the store's key, and use the store's own connections
(pymemcache clients borrowed from its pool, the same redis-py client), so
each side does the same number of round trips on the same sockets: a raw
``get``, a raw ``get_many`` per server, and a raw ``ZRANGE`` plus
``get_many`` for a board page. Both sides decode the JSON with orjson.
The many-lists cases: ``has_links`` of 500 pins against a user's cached
likes next to a raw ``ZRANGE`` of the whole list and a set intersection, and
``board_pins_many`` of 20 boards next to one raw pipeline of 20 ``ZRANGE`` calls
plus one ``get_many`` per server.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import orjson

from store.cache.memcached import MemcachedLeaseStore
from store.cache.redis_lists import RedisListBackend
from store.store import Store
from store.tools.timing import PIN, BenchResult, pair

__all__ = ["cache_cases"]

RAW_PREFIX = "bench:raw:"


def cache_cases(store: Store, shard: int, n: int, say: Callable[[str], None]) -> list[BenchResult]:
    """Warm get, get_many(50), board page, has_links(500) and board_pins_many(20), each next to raw calls."""
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
    store.get_many(pins, type_name="pin")
    store.board_pins(board, limit=50)
    text = orjson.dumps(PIN)
    owner = {p: mc.server_for(store.cache_key(p, type_name="pin")).address for p in pins}
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
            ("warm get", lambda i: store.get(pins[i % 50], type_name="pin"), raw_get),
            ("warm get_many(50)", lambda _i: store.get_many(pins, type_name="pin"), raw_get_many),
            ("warm board page", lambda _i: store.board_pins(board, limit=50), raw_board_page),
        ):
            say(case)
            results.append(pair(case, store_op, raw_op, n))
    finally:
        raw_redis.delete(zkey)
        for address, keys in by_server.items():
            with servers[address].borrow() as client:
                client.delete_many(keys)
    say(f"loading {MANY_BOARDS} boards of {MANY_PINS} pins and a user's likes")
    results += _many_lists_cases(store, shard, n, say)
    return results


#: ``has_links`` asks this many pins, half of them liked; ``board_pins_many`` reads this many boards.
HAS_LINKS, MANY_BOARDS, MANY_PINS = 500, 20, 50


def _many_lists_cases(store: Store, shard: int, n: int, say: Callable[[str], None]) -> list[BenchResult]:
    """Warm ``has_links(500)`` and ``board_pins_many(20)``, each next to the raw calls."""
    caches = store.admin_context().caches
    assert caches.objects is not None
    assert caches.lists is not None
    mc, backend = caches.objects.store, caches.lists.backend
    assert isinstance(mc, MemcachedLeaseStore)
    assert isinstance(backend, RedisListBackend)
    raw_redis = backend.client
    servers = {server.address: server for server in mc.servers}
    # A fresh name each run: a config may key users by name (unique:).
    user = store.create("user", {"name": f"bench viewer {time.time_ns()}"}, shard=shard)
    boards = [store.create("board", {"name": f"bench board {b}"}, shard=shard) for b in range(MANY_BOARDS)]
    pages = {b: [store.create("pin", PIN, shard=shard) for _ in range(MANY_PINS)] for b in boards}
    for board, pins in pages.items():
        for k, p in enumerate(pins):
            store.link("board_has_pins", board, p, sequence=k)
    every = [p for pins in pages.values() for p in pins]
    liked, asked = every[: HAS_LINKS // 2], every[:HAS_LINKS]
    for k, p in enumerate(liked):
        store.link("users_likes_pins", user, p, sequence=k)
    # Warm the store's caches (whole lists, every pin), and give the floors their copies.
    store.has_links("users_likes_pins", user, asked)
    store.count("users_likes_pins", user)
    store.board_pins_many(boards, limit=MANY_PINS)
    text = orjson.dumps(PIN)
    owner = {p: mc.server_for(store.cache_key(p, type_name="pin")).address for p in every}
    by_server: dict[str, list[str]] = {}
    for p in every:
        by_server.setdefault(owner[p], []).append(f"{RAW_PREFIX}{p}")
    for address, keys in by_server.items():
        with servers[address].borrow() as client:
            client.set_many(dict.fromkeys(keys, text))
    likes_key = f"{RAW_PREFIX}likes:{user}"
    board_keys = {b: f"{RAW_PREFIX}z:{b}" for b in boards}
    raw_redis.delete(likes_key, *board_keys.values())
    raw_redis.zadd(likes_key, {str(p): 0 for p in liked})
    for b, pins in pages.items():
        raw_redis.zadd(board_keys[b], {str(p).zfill(20): 0 for p in pins})

    def raw_has_links(_i: int) -> None:
        members: list[bytes] = raw_redis.zrange(likes_key, 0, -1)  # type: ignore[assignment]
        {int(m) for m in members}.intersection(asked)

    def raw_board_pins_many(_i: int) -> None:
        pipe = raw_redis.pipeline(transaction=False)
        for b in boards:
            pipe.zrange(board_keys[b], 0, MANY_PINS)
        firsts = [[int(m) for m in members[:MANY_PINS]] for members in pipe.execute()]
        keys: dict[str, list[str]] = {}
        for ids in firsts:
            for p in ids:
                keys.setdefault(owner[p], []).append(f"{RAW_PREFIX}{p}")
        found: dict[str, object] = {}
        for address, group in keys.items():
            with servers[address].borrow() as client:
                for key, value in client.get_many(group).items():
                    found[key] = orjson.loads(value)
        [[found[f"{RAW_PREFIX}{p}"] for p in ids] for ids in firsts]

    results = []
    try:
        for case, store_op, raw_op, times in (
            (
                f"warm has_links({HAS_LINKS})",
                lambda _i: store.has_links("users_likes_pins", user, asked),
                raw_has_links,
                n,
            ),
            (
                f"warm board_pins_many({MANY_BOARDS})",
                lambda _i: store.board_pins_many(boards, limit=MANY_PINS),
                raw_board_pins_many,
                max(1, n // 10),
            ),
        ):
            say(case)
            results.append(pair(case, store_op, raw_op, times))
    finally:
        raw_redis.delete(likes_key, *board_keys.values())
        for address, keys in by_server.items():
            with servers[address].borrow() as client:
                client.delete_many(keys)
    return results
