"""An expired cached list checked by its version: served again if the database's version of the
list is the one its head was read at, read again otherwise (`store.cache.lists.ListCache.read`).

The unit tests drive `ListCache` on the in-process backend and on Redis with a clock moved by
hand; the store tests run on MariaDB and PostgreSQL with memcached and Redis, where a write the
cache never hears of (a second store without caches, as a writer whose invalidation was lost)
must show once the window has passed, and an unchanged list must not be read again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from store import Store, StoreConfig
from store.cache.lists import ListBackend, ListCache, MemoryListBackend
from tests.conftest import cached_mariadb_config, instagram_pg_config

KEY = "t:l:board_has_pins:1"
BHP = "board_has_pins"


class Clock:
    """Milliseconds since the epoch, moved by hand."""

    def __init__(self) -> None:
        self.now = 1_800_000_000_000

    def __call__(self) -> int:
        return self.now


@pytest.fixture(params=["memory", "redis"])
def backend(request: pytest.FixtureRequest) -> Iterator[ListBackend]:
    """Each list backend, empty."""
    if request.param == "memory":
        yield MemoryListBackend()
        return
    from store.cache.redis_lists import RedisListBackend

    url: str = request.getfixturevalue("redis_ready")
    b = RedisListBackend(url, prefix="t:")
    try:
        yield b
    finally:
        b.close()


def _filled(backend: ListBackend, version: int) -> tuple[ListCache, Clock, list[str]]:
    """A cache over ``backend`` with one list (two entries) filled at database version ``version``,
    and the keys its ``revalidate`` is asked about (it answers ``version``; tests change it)."""
    clock = Clock()
    lists = ListCache(backend, max_stale_s=2.0, clock_ms=clock)
    asked: list[str] = []
    lists.revalidate = lambda key: (asked.append(key), version)[1]
    seen = lists.read(KEY, ("meta",))
    assert seen is not None
    lists.fill(KEY, seen.version, 2, [(5, 7), (6, 8)], clock(), list_version=version)
    lists.backend.read_owed()
    return lists, clock, asked


def test_an_expired_list_at_the_same_version_is_served_and_vouched_for_again(backend: ListBackend) -> None:
    lists, clock, asked = _filled(backend, 3)
    clock.now += 2001
    got = lists.read(KEY, ("rank", 0, 9, False))
    assert got is not None
    assert got.meta == (2, 2)
    assert len(got.members) == 2
    assert asked == [KEY]
    assert lists.stats.expired == 1
    # Its read time is the check's: fresh for another max_stale_s, with no check.
    clock.now += 1500
    again = lists.read(KEY, ("rank", 0, 9, False))
    assert again is not None
    assert again.meta == (2, 2)
    assert asked == [KEY]
    clock.now += 600  # (2.1 s after the check: expired again, checked again)
    assert lists.read(KEY, ("meta",)) is not None
    assert asked == [KEY, KEY]


@pytest.mark.parametrize("now", [4, 2, None])
def test_an_expired_list_whose_version_moved_or_is_unknown_is_read_again(
    backend: ListBackend, now: int | None
) -> None:
    lists, clock, asked = _filled(backend, 3)
    lists.revalidate = lambda key: (asked.append(key), now)[1]
    clock.now += 2001
    got = lists.read(KEY, ("rank", 0, 9, False))
    assert got is not None
    assert got.meta is None, "a list whose version moved (or is unknown) was served after its window"
    assert asked == [KEY]
    # Nothing was vouched for: still expired.
    assert lists.read(KEY, ("meta",)) == got


def test_a_list_of_no_known_version_is_never_checked(backend: ListBackend) -> None:
    lists, clock, asked = _filled(backend, 0)
    clock.now += 2001
    got = lists.read(KEY, ("rank", 0, 9, False))
    assert got is not None
    assert got.meta is None
    assert asked == []


def test_a_writers_drop_between_the_check_and_the_new_read_time_wins(backend: ListBackend) -> None:
    """The check read the database's version before a writer's commit; the writer then drops the
    list. This read's answer is the list as of the check (served), but the list is not put back:
    the next read is a miss."""
    lists, clock, _asked = _filled(backend, 3)

    def racing(key: str) -> int:
        lists.invalidate([key])  # (the writer's drop, after its commit, after our version read)
        return 3

    lists.revalidate = racing
    clock.now += 2001
    got = lists.read(KEY, ("rank", 0, 9, False))
    assert got is not None
    assert got.meta == (2, 2)
    after = lists.read(KEY, ("meta",))
    assert after is not None
    assert after.meta is None


def test_a_list_changed_in_place_is_checked_at_its_new_version(backend: ListBackend) -> None:
    """A writer's change in place moves the cached list's version with the database's: the check
    compares against the version the list is at now, not the one it was filled at."""
    lists, clock, asked = _filled(backend, 3)
    from store.cache.lists import encode_member

    assert lists.backend.apply([(KEY, 4, "add", encode_member(9, 10), 10)], 3600, 1000) == 1
    lists.revalidate = lambda key: (asked.append(key), 4)[1]
    clock.now += 2001
    got = lists.read(KEY, ("rank", 0, 9, False))
    assert got is not None
    assert got.meta == (3, 3)


# -- on real servers ---------------------------------------------------------------------


@pytest.fixture(params=["mariadb", "postgres"])
def configs(request: pytest.FixtureRequest) -> tuple[StoreConfig, StoreConfig]:
    """(a config with memcached and Redis and a 0.3 s window, the same without caches)."""
    memcached = request.getfixturevalue("memcached_pair")
    redis_url = request.getfixturevalue("redis_ready")
    if request.param == "mariadb":
        request.getfixturevalue("mariadb_ready")
        raw: dict[str, Any] = cached_mariadb_config(memcached, redis_url)
    else:
        request.getfixturevalue("postgres_ready")
        raw = instagram_pg_config()
        raw["cache"] = {"memcached": memcached, "redis": redis_url, "prefix": "t:"}
    raw["cache"]["max_stale_s"] = 0.3
    raw["cache"]["follow_poll_s"] = 0.1  # (at most half the window, though nothing follows here)
    cached = StoreConfig.from_dict(raw)
    del raw["cache"]
    return cached, StoreConfig.from_dict(raw)


def _counting_fills(store: Store) -> list[int]:
    """A list whose length is the number of list fills ``store`` reads from the database."""
    rel = store.admin_context().relations
    assert rel.list_cache is not None
    fills: list[int] = []
    real: Callable[..., Any] = rel.repo.head_and_count

    def counted(*args: Any, **kwargs: Any) -> Any:
        fills.append(1)
        return real(*args, **kwargs)

    rel.repo.head_and_count = counted  # type: ignore[method-assign]
    return fills


def test_past_its_window_an_unchanged_list_is_checked_and_a_changed_one_read_again(
    configs: tuple[StoreConfig, StoreConfig],
) -> None:
    cached, plain = configs
    with Store(cached) as store, Store(plain) as behind:
        board = store.create("board", {})
        pins = [store.create("pin", {"i": i}, near=board) for i in range(3)]
        for p in pins[:2]:
            store.link(BHP, board, p)
        fills = _counting_fills(store)
        assert store.links(BHP, board) == pins[:2]
        assert len(fills) == 1
        for _ in range(3):  # past the window each time, the list unchanged: no fill
            time.sleep(0.35)
            assert store.links(BHP, board) == pins[:2]
            assert store.count(BHP, board) == 2
        assert len(fills) == 1, "an unchanged list was read again after its window"
        # A write the cache never hears of (as if its invalidation were lost).
        assert behind.link(BHP, board, pins[2]) is True
        time.sleep(0.35)
        assert store.links(BHP, board) == pins
        assert store.count(BHP, board) == 3
        assert len(fills) == 2
        assert behind.unlink(BHP, board, pins[0]) is True
        time.sleep(0.35)
        assert store.links(BHP, board) == pins[1:]
        assert len(fills) == 3
