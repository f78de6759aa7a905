"""A create drops what the caches hold under its new ID only where that ID can have been cached.

Pinterest IDs are made again (a reset or a restore from an older backup
starts the local ids over): every create invalidates. An Instagram ID is
never made twice (`store.ids.makes_ids_again`), so a plain create of one
sends the caches nothing; a create with unique keys still invalidates,
because its object was visible by ID while pending (a rival create's
`DuplicateKeyError` names it) and a read then cached its absence.

The caches' own counters (memcached's ``stats``, Redis's ``INFO
commandstats``) tell what each create sent; the servers are this test
process's own.
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import replace
from typing import Any

import pytest
import redis

from store import DuplicateKeyError, Store, StoreConfig
from store.admin import init_shards
from store.config import UniqueSpec
from store.ids import makes_ids_again
from tests.conftest import cached_on
from tests.servers import memcached_stats

UNIQUE = {"user_by_username": UniqueSpec("user_by_username", "user", "username")}


def test_only_pinterest_ids_are_made_again() -> None:
    assert makes_ids_again("pinterest") is True
    assert makes_ids_again("instagram") is False
    with pytest.raises(ValueError, match="'pinterest' or 'instagram'"):
        makes_ids_again("snowflake")


@pytest.fixture(params=["mariadb", "postgresql"])
def cached(request: pytest.FixtureRequest) -> tuple[StoreConfig, list[str], str]:
    """(a config with memcached, Redis and a unique key; its memcached addresses; its Redis URL)."""
    raw, memcached, redis_url = cached_on(request, request.param, max_stale_s=60)
    config = replace(StoreConfig.from_dict(raw), unique=UNIQUE)
    init_shards(config)  # (the unique keys' table; idempotent)
    return config, memcached, redis_url


def _commands(memcached: list[str], rd: redis.Redis) -> dict[str, int]:
    """What the caches have been sent so far: memcached's deletes, sets and touches (all servers),
    and Redis's calls of each command but INFO (asked on ``rd``, connected already)."""
    out: dict[str, int] = {}
    for address in memcached:
        counters = memcached_stats(address)
        for name in ("delete_hits", "delete_misses", "cmd_set", "cmd_touch"):
            out[f"memcached {address} {name}"] = counters[name]
    stats: dict[str, Any] = rd.info("commandstats")
    for name, counts in stats.items():
        if name != "cmdstat_info":
            out[f"redis {name}"] = int(counts["calls"])
    return out


def test_a_plain_create_drops_cached_entries_only_where_its_id_can_be_made_again(
    cached: tuple[StoreConfig, list[str], str],
) -> None:
    config, memcached, redis_url = cached
    with Store(config) as store:
        board = store.create("board", {"name": "warm"})
        store.get(board, type_name="board")
        store.count("board_has_pins", board)  # the store's connections and scripts are ready
        rd = redis.Redis.from_url(redis_url)
        rd.ping()  # (its connection's own HELLO and SELECT come before the first count)
        before = _commands(memcached, rd)
        pins = [store.create("pin", {"n": i}) for i in range(5)]
        pins += store.create_many("pin", [{"n": i} for i in range(5, 25)])
        after = _commands(memcached, rd)
        rd.close()
        sent = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
        if makes_ids_again(config.ids):
            deletes = sum(n for k, n in sent.items() if k.endswith(("delete_hits", "delete_misses")))
            assert deletes == 25, sent  # each new pin's entry
            assert sent.get("redis cmdstat_del", 0) + sent.get("redis cmdstat_evalsha", 0) > 0, sent
        else:
            assert sent == {}, f"an Instagram create sent the caches {sent}"
        # Whatever was sent, every new object reads back right, and its lists are empty.
        assert store.get_many(pins, type_name="pin") == {p: {"n": i} for i, p in enumerate(pins)}
        for p in pins[:3]:
            assert store.count("pin_owned_by_board", p) == 0
            assert store.links("pin_owned_by_board", p) == []
        store.link("board_has_pins", board, pins[0])
        assert store.links("pin_owned_by_board", pins[0]) == [board]


def test_a_create_with_unique_keys_drops_the_absence_cached_while_it_was_pending(
    cached: tuple[StoreConfig, list[str], str],
) -> None:
    """A rival create names the pending object; a get of that ID caches its absence (hit on the
    second get); once the first create returns, the object reads back, on either kind of ID."""
    config, _memcached, _redis_url = cached
    name = f"pend{uuid.uuid4().hex[:8]}"
    with Store(config) as store, Store(config) as rival:
        steps = store.admin_context().steps
        pending: list[int] = []
        seen: list[Any] = []
        paused, resume = threading.Event(), threading.Event()

        def hook(step: str) -> None:
            if step == "activate":
                paused.set()
                assert resume.wait(30)

        steps.hook = hook
        made: list[int] = []
        writer = threading.Thread(target=lambda: made.append(store.create("user", {"username": name})))
        writer.start()
        try:
            assert paused.wait(30)
            with pytest.raises(DuplicateKeyError) as err:
                rival.create("user", {"username": name})
            pending.append(err.value.owner)
            caches = rival.admin_context().caches.objects
            assert caches is not None
            hits = caches.stats.hits
            seen += [rival.get(pending[0], type_name="user"), rival.get(pending[0], type_name="user")]
            assert caches.stats.hits == hits + 1  # the second read was the cached absence
        finally:
            resume.set()
            writer.join(30)
            steps.hook = None
        assert seen == [None, None]
        assert made == pending
        # The invalidation is done when create returns: the very next read is the object.
        assert rival.get(pending[0], type_name="user") == {"username": name}
        assert rival.lookup("user_by_username", name) == pending[0]
