"""Deletes that may not have arrived are sent again, key by key, before the server is used again.

A memcached of the test's own is stopped (SIGSTOP) while a writer deletes: the delete's reply
does not come within the timeout, so the server is dirty. Before the process uses it again it
sends those deletes again: a value put back under a lost key meanwhile (what a stale fill
would leave) is gone, and every other entry is still cached, where a flush would have emptied
the server. Past `LOST_DELETES_MAX` lost keys the server is flushed instead. Redis lists, the
same: a list whose drop was lost is dropped again, alone; past `LOST_DROPS_MAX`, every list.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pymemcache.client.base import Client

from store.cache.lists import encode_members
from store.cache.memcached import LOST_DELETES_MAX, MemcachedLeaseStore
from store.cache.redis_lists import LOST_DROPS_MAX, RedisListBackend
from tests.conftest import REDIS_TEST_URL
from tests.servers import free_ports, start_memcached


@pytest.fixture
def stopped_memcached() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    (port,) = free_ports(1)
    proc = start_memcached(port)
    try:
        yield proc, port
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGSTOP, returning once every thread of the server is stopped (a signal is delivered
    after `kill` returns: a thread still running could answer the next request)."""
    os.kill(proc.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    tasks = Path(f"/proc/{proc.pid}/task")
    while any(t.joinpath("stat").read_text().rpartition(")")[2].split()[0] != "T" for t in tasks.iterdir()):
        assert time.monotonic() < deadline, "memcached did not stop"
        time.sleep(0.001)


def _lose_deletes(proc: subprocess.Popen[bytes], store: MemcachedLeaseStore, keys: list[str]) -> None:
    _stop(proc)
    try:
        store.delete_many(keys)  # no reply within the timeout
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    assert store.servers[0].breaker.dirty


@pytest.mark.parametrize("how", ["waited", "begun"])
def test_lost_deletes_are_sent_again_and_nothing_else_is_dropped(
    stopped_memcached: tuple[subprocess.Popen[bytes], int], how: str
) -> None:
    proc, port = stopped_memcached
    other = Client(("127.0.0.1", port), default_noreply=False)
    store = MemcachedLeaseStore([f"127.0.0.1:{port}"], timeout_s=0.1, connect_timeout_s=1, cooldown_s=0.2)
    try:
        kept = [f"t:kept:{i}" for i in range(20)]
        lost = ["t:lost:a", "t:lost:b"]
        store.set_many({k: b"v" for k in kept + lost}, 60)
        if how == "waited":
            _lose_deletes(proc, store, lost)
        else:
            _stop(proc)
            try:
                store.delete_many_begin(lost)()
            finally:
                os.kill(proc.pid, signal.SIGCONT)
            assert store.servers[0].breaker.dirty
        time.sleep(0.1)  # (the stopped server has run what it was sent)
        for k in lost:  # a value the database no longer has, put back while the deletes were lost
            assert other.set(k, b"stale", expire=60)
        time.sleep(0.25)  # the breaker's cool-down (a timeout opens it at once)
        seen = store.peek_many(kept + lost)  # the first use: the lost deletes go first
        assert not store.servers[0].breaker.dirty
        assert seen == {k: b"v" for k in kept}, "a lost key served, or a kept one dropped"
        assert other.get_many(lost) == {}
    finally:
        store.close()
        other.close()


def test_more_lost_deletes_than_it_remembers_flush_the_server(
    stopped_memcached: tuple[subprocess.Popen[bytes], int],
) -> None:
    proc, port = stopped_memcached
    store = MemcachedLeaseStore([f"127.0.0.1:{port}"], timeout_s=0.1, connect_timeout_s=1, cooldown_s=0.2)
    try:
        store.set_many({"t:kept": b"v"}, 60)
        _lose_deletes(proc, store, [f"t:many:{i}" for i in range(LOST_DELETES_MAX + 1)])
        time.sleep(0.35)
        assert store.peek_many(["t:kept"]) == {}  # flushed: every entry gone
        assert not store.servers[0].breaker.dirty
    finally:
        store.close()


@pytest.fixture
def red(redis_ready: str) -> Iterator[RedisListBackend]:
    backend = RedisListBackend(
        REDIS_TEST_URL, prefix=f"lost{time.monotonic_ns()}:", timeout_s=2, connect_timeout_s=2
    )
    yield backend
    backend.close()


def _cached(red: RedisListBackend, keys: list[str]) -> list[str]:
    """Which of ``keys`` have a list cached."""
    reads = red.read_many(keys, [("meta",)] * len(keys))
    return [k for k, r in zip(keys, reads, strict=True) if r is not None and r.meta is not None]


def _fill(red: RedisListBackend, keys: list[str]) -> None:
    for key in keys:
        seen = red.read(key, ("meta",))
        assert seen is not None
        assert red.fill(key, seen.version, 1, encode_members([(1, 2)]), 60, 1)


def test_lost_list_drops_are_dropped_again_and_nothing_else(red: RedisListBackend) -> None:
    """Redis: a drop skipped while the breaker was open is redone, alone, before the server is
    trusted again: the list is gone (a fill begun before it refused), the other lists stay."""
    kept = [f"{red.prefix}l:kept:{i}" for i in range(10)]
    lost = [f"{red.prefix}l:lost:{i}" for i in range(2)]
    _fill(red, kept + lost)
    before = red.read(lost[0], ("meta",))
    assert before is not None
    red.breaker.trip()
    red.invalidate(lost, 60)  # skipped: the server may still hold them
    assert red.breaker.dirty
    red.breaker.success()
    assert red._clean()
    assert not red.breaker.dirty
    assert _cached(red, kept + lost) == kept
    # A fill read before the lost drop is refused: the drop bumped the list's version.
    assert not red.fill(lost[0], before.version, 1, encode_members([(1, 2)]), 60, 1)


def test_more_lost_list_drops_than_it_remembers_drop_every_list(red: RedisListBackend) -> None:
    kept = [f"{red.prefix}l:kept:{i}" for i in range(3)]
    _fill(red, kept)
    red.breaker.trip()
    red.invalidate([f"{red.prefix}l:many:{i}" for i in range(LOST_DROPS_MAX + 1)], 60)
    red.breaker.success()
    assert red._clean()
    assert _cached(red, kept) == []
    assert not red.breaker.dirty
