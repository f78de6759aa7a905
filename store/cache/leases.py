"""Look-aside object caching with emulated leases, over any `LeaseStore`.

memcached has no leases, so they are built from ``add`` and ``cas``:

1. ``gets`` the keys; a value is a hit, a lease marker or nothing a miss.
2. For keys that hold nothing, ``add`` a marker unique to this reader (it
   fails if another reader's marker or a value got there first) and ``gets``
   it back for its cas token: one pipelined round trip per server.
3. Read the misses from the database, after the leases are taken.
4. Fill each leased key with ``cas`` against the marker's token.

A writer commits to the database first and then deletes the key. A delete
that lands after step 2 removes the marker, so the ``cas`` of step 4 fails:
a reader that read the old row can never put it back after the writer's
invalidation. A writer that committed before step 3 is seen by the read.
Readers that find another's marker read the database and do not fill.

Bounded staleness: an entry carries the time of the database read that
filled it (taken before the read), and is trusted for ``max_stale_s`` after
that; an older entry is a miss, read again and replaced (its key is leased
over it: delete, add, gets, in the same round trip). So when a writer's
invalidation is lost (the cache unreachable from the writer only, the writer
killed between its commit and its delete, a cache restarted), no process
serves a value older than the last acknowledged write for longer than
``max_stale_s``. Without faults the delete is never lost and nothing is
ever stale.

An entry is ``ENTRY_TAG``, the read time (8 bytes, ms since the Unix epoch,
big-endian) and the object's JSON, or nothing after the time when the
database had no live object with that key (a cached miss: a create and a
delete invalidate it like any write).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from store.cache.stats import CacheStats

__all__ = ["ENTRY_TAG", "LEASE_PREFIX", "LeaseStore", "MemoryLeaseStore", "ObjectCache", "wall_ms"]

#: Values that start with this are lease markers, never entries.
LEASE_PREFIX = b"\x00lease:"
#: The first byte of an entry: then the read time and the object's JSON (or nothing: no object).
ENTRY_TAG = b"\x01"
_HEAD = 9  # tag + 8 bytes of read time


def wall_ms() -> int:
    """Milliseconds since the Unix epoch: entries are compared across processes and hosts."""
    return time.time_ns() // 1_000_000


class LeaseStore(Protocol):
    """The memcached operations the lease protocol needs, batched.

    Implementations never raise for a server that fails: they leave its keys
    out of the result (a miss), count the error, and remember when a delete
    was lost so that the server is emptied before it is trusted again.
    """

    stats: CacheStats

    def gets_many(self, keys: Sequence[str]) -> dict[str, tuple[bytes, int]]:
        """Value and cas token of every key present."""
        ...

    def lease_many(
        self, keys: Sequence[str], token: bytes, ttl_s: int, *, replace: Sequence[str] = ()
    ) -> dict[str, int]:
        """``add`` ``token`` to each key (deleting each of ``replace`` first); cas tokens of the keys held."""
        ...

    def cas_many(self, items: Mapping[str, tuple[bytes, int]], ttl_s: int) -> int:
        """``cas`` each value against its token; how many were stored."""
        ...

    def delete_many(self, keys: Sequence[str]) -> None:
        """Delete the keys, waiting for each server's reply."""
        ...


class ObjectCache:
    """Cache-aside reads and delete-on-write invalidation of object JSON."""

    def __init__(
        self,
        store: LeaseStore,
        *,
        ttl_s: int = 3600,
        lease_ttl_s: int = 10,
        max_stale_s: float = 5.0,
        clock_ms: Callable[[], int] = wall_ms,
    ) -> None:
        self.store = store
        self.stats = store.stats
        self._ttl_s = ttl_s
        self._lease_ttl_s = lease_ttl_s
        self._max_stale_ms = int(max_stale_s * 1000)
        self._clock_ms = clock_ms
        #: Test hook: called after the database read, before the fill.
        self.after_load: Callable[[], None] | None = None

    def get_many(
        self, keys: Sequence[str], load: Callable[[list[str]], dict[str, bytes]]
    ) -> dict[str, bytes]:
        """Cached values of ``keys``, misses read through ``load`` (only those it returns exist)."""
        found = self.store.gets_many(keys)
        oldest = self._clock_ms() - self._max_stale_ms
        hits: dict[str, bytes] = {}
        known_absent = 0
        free: list[str] = []  # nothing there: lease it
        expired: list[str] = []  # an entry too old to trust: lease over it
        missing: list[str] = []
        for key in keys:
            entry = found.get(key)
            if entry is None:
                free.append(key)
                missing.append(key)
                continue
            value = entry[0]
            if value[:1] == ENTRY_TAG and len(value) >= _HEAD:
                if int.from_bytes(value[1:_HEAD], "big") >= oldest:
                    if len(value) > _HEAD:
                        hits[key] = value[_HEAD:]
                    else:
                        known_absent += 1
                    continue
                expired.append(key)
            elif not value.startswith(LEASE_PREFIX):
                expired.append(key)  # not an entry this version wrote: replace it
            missing.append(key)  # (a lease marker: another reader is filling; read, do not fill)
        if not missing:
            self.stats.add(hits=len(hits) + known_absent)
            return hits
        self.stats.add(hits=len(hits) + known_absent, misses=len(missing), expired=len(expired))
        token = LEASE_PREFIX + os.urandom(12).hex().encode()
        leased = (
            self.store.lease_many(free + expired, token, self._lease_ttl_s, replace=expired)
            if free or expired
            else {}
        )
        read_at = self._clock_ms().to_bytes(8, "big")  # before the database read
        loaded = load(missing)
        if self.after_load is not None:
            self.after_load()
        fills = {k: (ENTRY_TAG + read_at + loaded.get(k, b""), cas) for k, cas in leased.items()}
        if fills:
            self.stats.add(fills=self.store.cas_many(fills, self._ttl_s))
        hits.update(loaded)
        return hits

    def invalidate(self, keys: Sequence[str]) -> None:
        """Delete ``keys`` after a committed write."""
        self.store.delete_many(keys)
        self.stats.add(invalidations=len(keys))


class MemoryLeaseStore:
    """An in-process `LeaseStore` with memcached's add/cas semantics (one process only)."""

    def __init__(self, *, name: str = "memory", clock: Callable[[], float] = time.monotonic) -> None:
        self.stats = CacheStats(name)
        self._clock = clock
        self._lock = threading.Lock()
        self._data: dict[str, tuple[bytes, int, float]] = {}
        self._cas = 0

    def _live(self, key: str) -> tuple[bytes, int, float] | None:
        entry = self._data.get(key)
        if entry is not None and entry[2] <= self._clock():
            del self._data[key]
            return None
        return entry

    def gets_many(self, keys: Sequence[str]) -> dict[str, tuple[bytes, int]]:
        """Value and cas token of every key present."""
        with self._lock:
            out = {}
            for key in keys:
                entry = self._live(key)
                if entry is not None:
                    out[key] = (entry[0], entry[1])
            return out

    def _store(self, key: str, value: bytes, ttl_s: int) -> int:
        self._cas += 1
        self._data[key] = (value, self._cas, self._clock() + ttl_s)
        return self._cas

    def lease_many(
        self, keys: Sequence[str], token: bytes, ttl_s: int, *, replace: Sequence[str] = ()
    ) -> dict[str, int]:
        """``add`` ``token`` to each absent key (deleting ``replace`` first); cas tokens of the keys held."""
        with self._lock:
            for key in replace:
                self._data.pop(key, None)
            return {key: self._store(key, token, ttl_s) for key in keys if self._live(key) is None}

    def cas_many(self, items: Mapping[str, tuple[bytes, int]], ttl_s: int) -> int:
        """Store each value whose key still has the given cas token."""
        stored = 0
        with self._lock:
            for key, (value, cas) in items.items():
                entry = self._live(key)
                if entry is not None and entry[1] == cas:
                    self._store(key, value, ttl_s)
                    stored += 1
        return stored

    def delete_many(self, keys: Sequence[str]) -> None:
        """Delete the keys."""
        with self._lock:
            for key in keys:
                self._data.pop(key, None)
