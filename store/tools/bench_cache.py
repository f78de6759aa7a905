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
from typing import TypeVar

import orjson
from pymemcache.client.base import Client

from store.cache.memcached import MemcachedLeaseStore, MemcachedServer
from store.cache.redis_lists import RedisListBackend
from store.store import Store
from store.tools.timing import PIN, RAW_PREFIX, BenchResult, pair

__all__ = ["cache_cases"]

T = TypeVar("T")

#: A floor's read that times out (the store's own memcached timeout, on a loaded machine) is sent
#: again on another pooled connection, this many times in all; the store's side takes the same
#: timeout as a miss and reads the database, so neither side stops the run.
FLOOR_TRIES = 5


def _on_floor(server: MemcachedServer, call: Callable[[Client], T]) -> T:
    """``call`` on one of ``server``'s pooled connections, sent again on a timeout (`FLOOR_TRIES`)."""
    for attempt in range(FLOOR_TRIES):
        try:
            with server.borrow() as client:
                return call(client)
        except TimeoutError:
            if attempt == FLOOR_TRIES - 1:
                raise
    raise AssertionError("unreachable")


def _floor_get_many(server: MemcachedServer, keys: list[str]) -> dict[str, bytes]:
    """A raw ``get_many`` of ``keys`` on one of ``server``'s pooled connections (see `FLOOR_TRIES`)."""
    found: dict[str, bytes] = _on_floor(server, lambda client: client.get_many(keys))
    return found


def _floor_set_many(server: MemcachedServer, values: dict[str, bytes]) -> None:
    """Set the floors' copies on ``server`` (see `FLOOR_TRIES`)."""
    _on_floor(server, lambda client: client.set_many(values))


def _floor_delete_many(server: MemcachedServer, keys: list[str]) -> None:
    """Delete the floors' copies from ``server`` (see `FLOOR_TRIES`)."""
    _on_floor(server, lambda client: client.delete_many(keys))


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
    by_server: dict[str, list[str]] = {}
    for p in pins:
        by_server.setdefault(owner[p], []).append(f"{RAW_PREFIX}{p}")
    for address, keys in by_server.items():
        _floor_set_many(servers[address], dict.fromkeys(keys, text))
    zkey = f"{RAW_PREFIX}z:{board}"
    raw_redis.delete(zkey)
    raw_redis.zadd(zkey, {str(p).zfill(20): 0 for p in pins})

    def raw_get(i: int) -> None:
        p = pins[i % 50]
        key = f"{RAW_PREFIX}{p}"
        orjson.loads(_floor_get_many(servers[owner[p]], [key])[key])

    def raw_get_many(_i: int) -> None:
        for address, keys in by_server.items():
            for value in _floor_get_many(servers[address], keys).values():
                orjson.loads(value)

    def raw_board_page(_i: int) -> None:
        ids = [int(m) for m in raw_redis.zrange(zkey, 0, 49)]  # type: ignore[arg-type]
        keys: dict[str, list[str]] = {}
        for p in ids:
            keys.setdefault(owner[p], []).append(f"{RAW_PREFIX}{p}")
        for address, group in keys.items():
            for value in _floor_get_many(servers[address], group).values():
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
            _floor_delete_many(servers[address], keys)
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
        _floor_set_many(servers[address], dict.fromkeys(keys, text))
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
            for key, value in _floor_get_many(servers[address], group).items():
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
            _floor_delete_many(servers[address], keys)
    return results
