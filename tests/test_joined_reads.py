"""Calls of one process that miss the same key wait for one database read (a herd after a write).

On a real memcached: a reader wins a key's lease and reads slowly (its ``load`` held on an
event); calls that look the key up meanwhile find that lease, see that a call of their own
process holds it, and wait for its read instead of reading the database too. What must hold:
- threads, and tasks of one event loop (`store.green`), each get the reader's value, and the
  database is read once;
- a call whose lookup comes after a write's delete never waits for a read begun before it (the
  delete removed the lease: it wins a new one and reads the database itself);
- a reader whose read fails leaves the waiters to read the key themselves.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Iterator

import pytest

from store import green
from store.cache.leases import ObjectCache
from store.cache.memcached import MemcachedLeaseStore


@pytest.fixture
def cache(memcached_pair: list[str]) -> Iterator[ObjectCache]:
    mc = MemcachedLeaseStore(memcached_pair[:1], timeout_s=2, connect_timeout_s=2)
    yield ObjectCache(mc, ttl_s=60)
    mc.close()


class _Db:
    """The database read ``load`` stands for: counts its calls; the first waits for ``release``."""

    def __init__(self, values: dict[str, bytes], *, fail_first: bool = False) -> None:
        self.values = values
        self.calls: list[list[str]] = []
        self.started = threading.Event()
        self.release = threading.Event()
        self.fail_first = fail_first

    def load(self, keys: list[str]) -> dict[str, bytes]:
        self.calls.append(list(keys))
        found = {k: self.values[k] for k in keys if k in self.values}  # (read as the call begins)
        if len(self.calls) == 1:
            self.started.set()
            if green.active():
                while not self.release.is_set():
                    green.sleep(0.005)
            else:
                self.release.wait(10)
            if self.fail_first:
                raise RuntimeError("the first read failed")
        return found


def _in_threads(n: int, fn: Callable[[], object]) -> list[object]:
    out: list[object] = [None] * n

    def run(i: int) -> None:
        out[i] = fn()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    return [t.join(10) for t in threads] and out


def test_threads_that_miss_one_key_wait_for_one_read(cache: ObjectCache) -> None:
    key = f"t:{uuid.uuid4().hex}"
    db = _Db({key: b'{"n":1}'})
    first = threading.Thread(target=lambda: cache.get_many([key], db.load))
    first.start()
    assert db.started.wait(10)  # the first call holds the lease, reading
    waiting = threading.Timer(0.2, db.release.set)
    waiting.start()
    got = _in_threads(8, lambda: cache.get_many([key], db.load))
    first.join(10)
    waiting.join()
    assert got == [{key: b'{"n":1}'}] * 8
    assert db.calls == [[key]]  # one database read for nine calls
    assert cache.get_many([key], db.load) == {key: b'{"n":1}'}  # filled by the first
    assert len(db.calls) == 1


def test_tasks_of_one_loop_that_miss_one_key_wait_for_one_read(cache: ObjectCache) -> None:
    keys = [f"t:{uuid.uuid4().hex}" for _ in range(3)]
    db = _Db({k: b"v" + k.encode() for k in keys[:2]})  # the third: no such object

    async def main() -> list[dict[str, bytes]]:
        first = asyncio.ensure_future(green.run(cache.get_many, keys, db.load))
        while not db.started.is_set():
            await asyncio.sleep(0.001)
        others = [asyncio.ensure_future(green.run(cache.get_many, keys, db.load)) for _ in range(20)]
        await asyncio.sleep(0.05)  # every other task is waiting for the first one's read now
        db.release.set()
        return [await first, *await asyncio.gather(*others)]

    got = asyncio.run(main())
    assert got == [{k: b"v" + k.encode() for k in keys[:2]}] * 21
    assert db.calls == [keys]


def test_a_lookup_after_a_writes_delete_never_waits_for_a_read_begun_before(cache: ObjectCache) -> None:
    key = f"t:{uuid.uuid4().hex}"
    db = _Db({key: b"old"})
    before: list[dict[str, bytes]] = []
    first = threading.Thread(target=lambda: before.append(cache.get_many([key], db.load)))
    first.start()
    assert db.started.wait(10)  # its read has begun: it sees "old"
    db.values[key] = b"new"  # a write commits ...
    cache.store.delete_many([key])  # ... and deletes the key: the first reader's lease is void
    assert cache.get_many([key], db.load) == {key: b"new"}  # its own read, not the first one's
    db.release.set()
    first.join(10)
    assert before == [{key: b"old"}]  # (a read that overlapped the write)
    assert cache.get_many([key], db.load) == {key: b"new"}  # the void lease filled nothing


def test_waiters_read_the_key_themselves_when_the_read_they_wait_for_fails(cache: ObjectCache) -> None:
    key = f"t:{uuid.uuid4().hex}"
    db = _Db({key: b"v"}, fail_first=True)
    errors: list[BaseException] = []

    def first_call() -> None:
        try:
            cache.get_many([key], db.load)
        except RuntimeError as exc:
            errors.append(exc)

    first = threading.Thread(target=first_call)
    first.start()
    assert db.started.wait(10)
    threading.Timer(0.2, db.release.set).start()
    got = _in_threads(4, lambda: cache.get_many([key], db.load))
    first.join(10)
    assert [str(e) for e in errors] == ["the first read failed"]
    assert got == [{key: b"v"}] * 4
    assert len(db.calls) == 5  # the failed read, then each waiter's own
