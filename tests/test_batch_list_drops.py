"""A batch write's changes of one cached list reach Redis as one drop, not one per pair.

`link_many` of a board to 30 pins changes 31 lists: the board's (30 times)
and each pin's inverse. Where the changes' list versions are unknown (the
one-request gated insert on PostgreSQL), each list is dropped and its
version bumped once (`store.cache.lists.split_changes`), so Redis runs at
most 31 ``INCR`` for the call, counted by the server itself (a Redis of this
test process's own). The lists read back whole afterwards.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis

from store import Store, StoreConfig
from tests.conftest import cached_on

PAIRS = 30


def _incrs(rd: redis.Redis) -> int:
    stats: dict[str, Any] = rd.info("commandstats")
    return int(stats.get("cmdstat_incr", {}).get("calls", 0))


@pytest.fixture(params=["mariadb", "postgresql"])
def cached(request: pytest.FixtureRequest) -> tuple[StoreConfig, str]:
    raw, _memcached, redis_url = cached_on(request, request.param)
    return StoreConfig.from_dict(raw), redis_url


def test_a_batch_bumps_each_list_once(cached: tuple[StoreConfig, str]) -> None:
    config, redis_url = cached
    rd = redis.Redis.from_url(redis_url)
    with Store(config) as store:
        board = store.create("board", {"name": "b"}, shard=1)
        pins = store.create_many("pin", [{"n": i} for i in range(PAIRS)], shard=1)  # the board's host
        assert store.links("board_has_pins", board) == []  # the board's list cached (empty)
        for p in pins[:5]:
            assert store.links("pin_owned_by_board", p) == []
        before = _incrs(rd)
        assert store.link_many("board_has_pins", [(board, p) for p in pins]) == PAIRS
        bumps = _incrs(rd) - before
        assert bumps <= PAIRS + 1, f"{bumps} version bumps for {PAIRS + 1} lists"
        assert sorted(store.links("board_has_pins", board, limit=100)) == sorted(pins)
        assert store.count("board_has_pins", board) == PAIRS
        for p in pins[:5]:
            assert store.links("pin_owned_by_board", p) == [board]
    rd.close()
