"""Lists over several Redis servers: where each list lives, and what a server that is down does.

Placement needs no server (it is a function of the configured servers and the
list's key); the reads and writes run on databases 11-13 of the test Redis,
each taken as a server of its own (a server is named by host:port/db).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
import redis

from store.cache.lists import encode_members
from store.cache.redis_lists import RedisListServers
from store.config import ConfigError, StoreConfig, redis_server_name
from tests.conftest import base_config

HOSTS = {"A": "mysql+pymysql://root@127.0.0.1:3306"}


def _config(redis_urls: object) -> StoreConfig:
    raw = base_config(shards=4, hosts=HOSTS, map=[{"range": [0, 3], "master": "A"}])
    return StoreConfig.from_dict({**raw, "cache": {"redis": redis_urls}})


PREFIX = "rs:"
URLS = [f"redis://127.0.0.1:6379/{db}" for db in (11, 12, 13)]
KEYS = [f"{PREFIX}l:board_has_pins:{i}" for i in range(3000)]


def test_lists_spread_over_every_server_and_stay_put() -> None:
    ring = RedisListServers(URLS, prefix=PREFIX)
    placed = [ring.index_for(k) for k in KEYS]
    shares = Counter(placed)
    assert set(shares) == {0, 1, 2}
    assert min(shares.values()) > 0.25 * len(KEYS), shares  # about a third each
    # The same servers in another process (and in another order) place every list alike.
    again = RedisListServers(list(reversed(URLS)), prefix=PREFIX)
    assert [again.server_for(k).address for k in KEYS] == [ring.server_for(k).address for k in KEYS]
    # A password in a URL is no part of a server's name: changing it moves no list.
    secret = RedisListServers([URLS[0], "redis://:pw@127.0.0.1:6379/12", URLS[2]], prefix=PREFIX)
    assert [secret.index_for(k) for k in KEYS] == placed
    # A server that is down keeps its lists: the breaker is not consulted.
    ring.servers[1].breaker.trip()
    assert [ring.index_for(k) for k in KEYS] == placed
    # Taking a server out of the configuration moves its lists only (rendezvous hashing).
    two = RedisListServers([URLS[0], URLS[2]], prefix=PREFIX)
    for k, i in zip(KEYS, placed, strict=True):
        if i != 1:
            assert two.server_for(k).address == URLS[i].split("//")[1]
    for r in (ring, again, secret, two):
        r.close()


@pytest.fixture
def ring(redis_ready: str) -> Iterator[RedisListServers]:
    for url in URLS:
        redis.Redis.from_url(url).flushdb()
    r = RedisListServers(URLS, prefix=PREFIX, timeout_s=2, connect_timeout_s=2, cooldown_s=60)
    yield r
    r.close()


def test_a_server_down_misses_its_lists_only_and_is_cleaned_before_it_is_trusted(
    ring: RedisListServers,
) -> None:
    keys = KEYS[:60]
    ring.invalidate(keys, 60)  # (each list gets a version key)
    for key in keys:
        got = ring.read(key, ("meta",))
        assert got is not None
        assert got.meta is None
        assert ring.fill(key, got.version, 2, encode_members([(1, 1), (2, 2)]), 60, 1)
    # Each list's keys (head, meta, version) are on its own server, and only there.
    for key in keys:
        for i, url in enumerate(URLS):
            held = redis.Redis.from_url(url).exists(key, key + ":m", key + ":v")
            assert held == (3 if i == ring.index_for(key) else 0), (key, i)
    down = ring.servers[1]
    down.breaker.trip()  # as after a timeout: left alone for the cool-down
    reads = ring.read_many(keys, [("rank", 0, 1, False)] * len(keys))
    for key, read in zip(keys, reads, strict=True):
        if ring.index_for(key) == 1:
            assert read is None  # a miss: the database answers
        else:
            assert read is not None
            assert read.meta == (2, 2)
    # A write's invalidation of its lists cannot reach it: it is marked dirty, the others dropped.
    ring.invalidate(keys, 60)
    assert down.breaker.dirty
    assert all(
        r is not None and r.meta is None
        for k, r in zip(keys, ring.read_many(keys, [("meta",)] * 60), strict=True)
        if ring.index_for(k) != 1
    )
    # Back: its lists (stale now) are never served; it is emptied of lists first.
    down.breaker.success()
    assert all(
        r is None
        for k, r in zip(keys, ring.read_many(keys, [("meta",)] * 60), strict=True)
        if ring.index_for(k) == 1
    )
    for _ in range(100):
        if not down.breaker.dirty:
            break
        down._clean()
    assert not down.breaker.dirty
    mine = [k for k in keys if ring.index_for(k) == 1]
    assert mine
    assert all(r is not None and r.meta is None for r in ring.read_many(mine, [("meta",)] * len(mine)))


def test_the_config_takes_one_url_or_a_list() -> None:
    one = _config(URLS[0])
    assert one.cache.redis == (URLS[0],)
    three = _config(URLS)
    assert three.cache.redis == tuple(URLS)
    for bad, message in (
        ([], "non-empty list"),
        ([URLS[0], "http://x"], r"cache.redis\[1\] must be a redis:// URL"),
        ([URLS[0], "redis://:secret@127.0.0.1:6379/11"], r"names the server 127.0.0.1:6379/11 again"),
        ({"a": 1}, "non-empty list"),
    ):
        with pytest.raises(ConfigError, match=message) as err:
            _config(bad)
        assert "secret" not in str(err.value)
    assert redis_server_name("unix:///run/redis.sock?db=2") == "/run/redis.sock/2"
    assert redis_server_name("rediss://:pw@cache.example:6380/4") == "cache.example:6380/4"
