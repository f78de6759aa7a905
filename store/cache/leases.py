"""Look-aside object caching with leases, over any `LeaseStore` (memcached's meta protocol, or in-process).

memcached 1.6's meta commands carry leases themselves:

1. ``mg key v c N<ttl>`` for each key (one pipelined round trip per server):
   a hit returns the value; a miss *vivifies* the key (an empty item with a
   short TTL) and hands this reader the win (``W``) and the item's cas
   token; a reader that finds another's empty item is told ``Z`` (someone
   else is filling: read the database, do not fill).
2. Read the misses from the database, after the leases are taken.
3. Fill each won key with ``ms key ... C<cas>``: stored only if the item is
   still the one this reader won.

A writer commits to the database first and then deletes the key (``md``).
A delete that lands after step 1 removes the vivified item, so the fill of
step 3 fails: a reader that read the old row can never put it back after
the writer's invalidation. A writer that committed before step 2 is seen by
the read.

Bounded staleness: an entry carries the time of the database read that
filled it (taken before the read), and is trusted for ``max_stale_s`` after
that; an older entry is a miss, read again and replaced with a
compare-and-set on the cas token the lookup returned with it (``ms ...
C<cas>``), so a writer's delete in between makes the replacement fail, as
it makes a leased fill fail. So when a writer's invalidation is lost (the
cache unreachable from the writer only, the writer killed between its
commit and its delete, a cache restarted), no process serves a value older
than the last acknowledged write for longer than ``max_stale_s``. Without
faults the delete is never lost and nothing is ever stale.

An entry is ``ENTRY_TAG``, the read time (13 ASCII digits, ms since the Unix
epoch) and the object's JSON, or nothing after the time when the database
had no live object with that key (a cached miss: a create and a delete
invalidate it like any write). Entries hold no CR or LF (JSON escapes them),
so a pipelined reply can be read up to its end token.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from store import green
from store.cache.stats import CacheStats
from store.forks import at_fork

__all__ = [
    "ENTRY_TAG",
    "LeaseStore",
    "Lookup",
    "Lookups",
    "MemoryLeaseStore",
    "ObjectCache",
    "TrustSource",
    "entry",
    "nothing_owed",
    "wall_ms",
]

#: The first byte of an entry: then the read time and the object's JSON (or nothing: no object).
ENTRY_TAG = b"\x01"
_HEAD = 14  # tag + 13 digits of read time


def wall_ms() -> int:
    """Milliseconds since the Unix epoch: entries are compared across processes and hosts."""
    return time.time_ns() // 1_000_000


def entry(read_ms: int, payload: bytes) -> bytes:
    """An entry: the read time and the JSON (``b""``: the database had no such object)."""
    return ENTRY_TAG + b"%013d" % read_ms + payload


class Lookup(NamedTuple):
    """What a lookup found for one key.

    ``value`` is the cached entry (None if there was none); ``won`` says this
    caller holds the lease on a key that had none, and ``cas`` is the token its
    fill must match.
    """

    value: bytes | None
    cas: int
    won: bool


class Lookups(Mapping[str, Lookup]):
    """What a batch of lookups found, as a `Lookup` per key, and in the raw form the warm read path
    reads without making one per key.

    ``order`` holds the keys in the order the servers answered (a server that failed is left
    out: its keys are misses), ``entries`` each one's item (``b""``: an empty item, a lease) and
    ``heads`` each one's reply line, ``VA <size> c<cas>``, then ``W`` where this caller won the
    lease (memcached's meta protocol; `MemoryLeaseStore` writes the same): its cas and lease are
    read from it only where `lease` asks, on a miss. Heads are checked where they are read from
    a server; one that does not read as above reads as a lease this caller did not win.
    """

    __slots__ = ("_index", "entries", "heads", "order")

    def __init__(self, order: list[str], entries: list[bytes], heads: list[bytes]) -> None:
        self.order = order
        self.entries = entries
        self.heads = heads
        self._index: dict[str, int] | None = None

    def lease(self, i: int) -> tuple[int, bool]:
        """The cas token of the ``i``-th item and whether this caller won its lease."""
        parts = self.heads[i].split(b" ")
        token = parts[2] if len(parts) > 2 else b""
        if token[:1] != b"c" or not token[1:].isdigit():
            return 0, False
        return int(token[1:]), b"W" in parts[3:]

    def extend(self, other: Lookups) -> None:
        """Add ``other``'s items (another server's) after these."""
        if not self.order:  # (the one server's: taken as they are)
            self.order, self.entries, self.heads = other.order, other.entries, other.heads
            self._index = None
            return
        self.order += other.order
        self.entries += other.entries
        self.heads += other.heads
        self._index = None

    def __getitem__(self, key: str) -> Lookup:
        if self._index is None:
            self._index = {k: i for i, k in enumerate(self.order)}
        i = self._index[key]
        cas, won = self.lease(i)
        return Lookup(self.entries[i] or None, cas, won)

    def __iter__(self) -> Iterator[str]:
        return iter(self.order)

    def __len__(self) -> int:
        return len(self.order)


class TrustSource(Protocol):
    """What extends an entry's trust past the window (`store.cache.follower.Follower`)."""

    def trusted_since_ms(self, now_ms: int, window_ms: int) -> int | None:
        """Entries read at or after this time are trusted at any age; None: the window only."""
        ...

    def key_trusted_since_ms(self, key: str, now_ms: int, window_ms: int) -> int | None:
        """The same for the entry under ``key`` alone (by its host), asked only where
        `trusted_since_ms` said None: some sources vouch for some hosts and not others."""
        ...


class LeaseStore(Protocol):
    """The cache operations the lease protocol needs, batched per server.

    Implementations never raise for a server that fails: they leave its keys
    out of the result (a miss, and no lease), count the error, and remember
    when a delete was lost so that the server is emptied before it is
    trusted again.
    """

    stats: CacheStats

    def lookup_many(self, keys: Sequence[str], *, lease_ttl_s: int, drop: Sequence[str] = ()) -> Lookups:
        """Each key's entry, or a lease on it (deleting each of ``drop`` first)."""
        ...

    def fill_many(
        self,
        items: Mapping[str, tuple[bytes, int]],
        ttl_s: int,
        *,
        later: Callable[[int], None] | None = None,
    ) -> int:
        """Store each value if its key still holds the lease with that cas token; how many were
        stored. With ``later``, a store may return without waiting for the servers' replies:
        it then returns 0, and tells ``later`` how many were stored once it reads them (before
        the connection's next reply, or at `read_owed`)."""
        ...

    def read_owed(self) -> None:
        """Read the replies still owed to calls that did not wait for them (`fill_many`)."""
        ...

    def delete_many(self, keys: Sequence[str]) -> None:
        """Delete the keys, waiting for each server's reply."""
        ...

    def delete_many_begin(self, keys: Sequence[str]) -> Callable[[], None]:
        """`delete_many` begun: the deletes are sent, and the returned function waits for them."""
        ...

    def peek_many(self, keys: Sequence[str]) -> dict[str, bytes]:
        """What the cache holds under each key (for tools and tests; no lease is taken)."""
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
        #: The invalidation log's follower (`store.cache.follower`), once one runs.
        self.follower: TrustSource | None = None
        #: The reads of this process on their way to the database, by key (`_Reading`): another
        #: call of this process that finds the same cache item (the same cas) waits for it.
        self._reading: dict[str, _Reading] = {}
        self._reading_lock = threading.Lock()
        at_fork(self, ObjectCache._after_fork)

    def _after_fork(self) -> None:
        """In a forked child: the parent's reads on their way are not this process's."""
        self._reading = {}
        self._reading_lock = threading.Lock()

    def get_many(
        self, keys: Sequence[str], load: Callable[[list[str]], dict[str, bytes]], *, logged: bool = True
    ) -> dict[str, bytes]:
        """Cached values of ``keys``, misses read through ``load`` (only those it returns exist).

        ``logged``: the writes of these keys are in the invalidation log, so
        while its follower is current an object entry is trusted at any age
        (a cached absence, which a create does not log, only in the window).
        """
        found = self.store.lookup_many(keys, lease_ttl_s=self._lease_ttl_s)
        # Read times are 13 zero-padded digits: their bytes compare as the numbers do.
        now = self._clock_ms()
        oldest = b"%013d" % max(0, now - self._max_stale_ms)
        follower = self.follower if logged else None
        since = None if follower is None else follower.trusted_since_ms(now, self._max_stale_ms)
        present = oldest if since is None else min(oldest, b"%013d" % since)
        return self._get_many(keys, load, found, oldest, present, follower if since is None else None, now)

    def _get_many(
        self,
        keys: Sequence[str],
        load: Callable[[list[str]], dict[str, bytes]],
        found: Lookups,
        oldest: bytes,
        oldest_present: bytes,
        by_key: TrustSource | None = None,
        now: int = 0,
    ) -> dict[str, bytes]:
        """``by_key``: where the source vouches for no host as a whole, it is asked per key (its
        host) about a present entry older than the window."""
        hits: dict[str, bytes] = {}
        known_absent = 0
        leased: dict[str, int] = {}
        expired: list[str] = []
        missing: list[str] = []
        #: Keys another call of this process is reading with the same cas: wait for its read.
        joined: dict[str, _Reading] = {}
        mine: dict[str, _Reading] = {}
        order = found.order
        if len(order) != len(keys):  # a server failed: its keys are misses, with no lease
            answered = set(order)
            missing += [k for k in keys if k not in answered]
        # (the warm read path: raw values, a key's lease read from its reply only on a miss)
        for i, value in enumerate(found.entries):
            key = order[i]
            if value:
                if value[:1] == ENTRY_TAG and len(value) >= _HEAD:
                    read = value[1:_HEAD]
                    if len(value) > _HEAD:
                        if read >= oldest_present:
                            hits[key] = value[_HEAD:]
                            continue
                        if by_key is not None:
                            since = by_key.key_trusted_since_ms(key, now, self._max_stale_ms)
                            if since is not None and read >= b"%013d" % since:
                                hits[key] = value[_HEAD:]
                                continue
                    elif read >= oldest:
                        known_absent += 1
                        continue
                # Too old to trust, or not an entry this version wrote: read it
                # again and replace it only if it is still the entry seen here
                # (its cas), so a writer's delete meanwhile wins.
                expired.append(key)
                cas, won = found.lease(i)
            else:
                cas, won = found.lease(i)
                if not won:
                    # An empty item another reader won: read, do not fill; or, if that reader is a
                    # call of this process, wait for its read (`_Reading`).
                    reading = self._joinable(key, cas)
                    if reading is not None:
                        joined[key] = reading
                    else:
                        missing.append(key)
                    continue
            reading, own = self._take_reading(key, cas)
            if not own:  # (another call of this process reads it: wait for it)
                joined[key] = reading
                continue
            mine[key] = reading
            leased[key] = cas
            missing.append(key)
        if not missing and not joined:
            self.stats.add(hits=len(hits) + known_absent)
            return hits
        self.stats.add(hits=len(hits) + known_absent, misses=len(missing) + len(joined), expired=len(expired))
        if missing:
            read_ms = self._clock_ms()  # before the database read
            try:
                loaded = load(missing)
            except BaseException:
                self._end_readings(mine, None)
                raise
            self._end_readings(mine, loaded)
            if self.after_load is not None:
                self.after_load()
            fills = {k: (entry(read_ms, loaded.get(k, b"")), cas) for k, cas in leased.items()}
            if fills:
                self.stats.add(fills=self.store.fill_many(fills, self._ttl_s, later=self._filled))
            hits.update(loaded)
        if joined:
            again: list[str] = []
            deadline = time.monotonic() + _JOIN_WAIT_S  # (one wait for all: not one per key)
            for key, reading in joined.items():
                got_value = reading.wait(max(0.0, deadline - time.monotonic()))
                if got_value is _NOT_READ:
                    again.append(key)  # its read failed, or took too long: read it here
                elif got_value is not None:
                    hits[key] = got_value
            if again:
                hits.update(load(again))
        return hits

    def _take_reading(self, key: str, cas: int) -> tuple[_Reading, bool]:
        """(a new `_Reading` of ``key`` at ``cas`` by this call, True), or (the one another call of
        this process makes at that cas already, False: the caller waits for it)."""
        with self._reading_lock:
            other = self._joinable(key, cas)
            if other is not None:
                return other, False
            reading = self._reading[key] = _Reading(cas)
            return reading, True

    def _joinable(self, key: str, cas: int) -> _Reading | None:
        """The read of ``key`` at ``cas`` another call of this process makes that the caller may wait
        for (`_Reading.joinable`), or None."""
        reading = self._reading.get(key)
        return reading if reading is not None and reading.cas == cas and reading.joinable() else None

    def _end_readings(self, mine: dict[str, _Reading], loaded: dict[str, bytes] | None) -> None:
        """The database read of ``mine``'s keys ended (``loaded``: what it found; None: it failed)."""
        if not mine:
            return
        with self._reading_lock:
            for key, reading in mine.items():
                if self._reading.get(key) is reading:
                    del self._reading[key]
        for key, reading in mine.items():
            reading.end(_NOT_READ if loaded is None else loaded.get(key))

    def _filled(self, n: int) -> None:
        """``n`` fills were stored (their replies, read after the call, say so)."""
        self.stats.add(fills=n)

    def invalidate(self, keys: Sequence[str]) -> None:
        """Delete ``keys`` after a committed write."""
        self.store.delete_many(keys)
        self.stats.add(invalidations=len(keys))

    def invalidate_begin(self, keys: Sequence[str]) -> Callable[[], None]:
        """`invalidate`, sent now; the returned function waits for it. The caller overlaps its next
        round trip (another cache's invalidation) with this one, and calls the function, in a
        ``finally``, before it returns: the keys are gone by then, as with `invalidate`."""
        self.stats.add(invalidations=len(keys))
        return self.store.delete_many_begin(keys)


#: How long a read waits for another call's read of the same key before it reads the key itself.
_JOIN_WAIT_S = 1.0
#: What a `_Reading` ends with when its read failed: a waiter reads the key itself.
_NOT_READ: Any = object()


class _Reading:
    """One call's database read of a key it found missing (or expired) in the cache, which other
    calls of the process that find the same cache item (the same cas) wait for instead of
    reading the database too (a hot key after a write: a herd of misses).

    Joining keeps read-your-writes: a write deletes the item, so a call whose own write came
    before its lookup never finds the cas of a read begun before that write. A waiter on the
    loop of the reading call waits on the loop (`green.pause`); a thread waits on an event. A
    call on a loop never waits for another thread's read (it reads the key itself).
    """

    __slots__ = ("cas", "event", "loop", "pauses", "value")

    def __init__(self, cas: int) -> None:
        self.cas = cas
        self.event = threading.Event()
        self.loop = green.current_loop()
        self.pauses: list[green.Pause] = []
        self.value: Any = _NOT_READ

    def joinable(self) -> bool:
        """Whether the calling call may wait for this read (not done; a loop's call: same loop)."""
        if self.event.is_set():
            return False
        here = green.current_loop()
        return here is None or here is self.loop

    def end(self, value: Any) -> None:
        """The read ended with ``value`` (bytes, None: no such object, `_NOT_READ`: it failed)."""
        self.value = value
        self.event.set()
        pauses, self.pauses = self.pauses, []
        for pause in pauses:
            green.wake(pause)

    def wait(self, timeout: float) -> Any:
        """What the read found (`end`), or `_NOT_READ` after ``timeout`` seconds."""
        if not self.event.is_set():
            if green.current_loop() is None:
                self.event.wait(timeout)
            else:
                pause = green.pause()
                self.pauses.append(pause)
                if not self.event.is_set():  # (on the loop's thread: `end` cannot run between)
                    green.wait(pause, timeout)
        return self.value if self.event.is_set() else _NOT_READ


def nothing_owed() -> None:
    """A begun invalidation's wait where nothing was sent: nothing to wait for."""


class MemoryLeaseStore:
    """An in-process `LeaseStore` with memcached's meta semantics (one process only)."""

    def __init__(self, *, name: str = "memory", clock: Callable[[], float] = time.monotonic) -> None:
        self.stats = CacheStats(name)
        self._clock = clock
        self._lock = threading.Lock()
        # key -> (value, cas, expires at, lease already handed out)
        self._data: dict[str, tuple[bytes, int, float, bool]] = {}
        self._cas = 0
        at_fork(self, MemoryLeaseStore._after_fork)

    def _after_fork(self) -> None:
        """In a forked child: start empty, with a lock of its own (the parent's entries are its
        own process's cache, and a lease a parent's thread held would never be filled here)."""
        self._lock = threading.Lock()
        self._data = {}

    def _live(self, key: str) -> tuple[bytes, int, float, bool] | None:
        got = self._data.get(key)
        if got is not None and got[2] <= self._clock():
            del self._data[key]
            return None
        return got

    def _store(self, key: str, value: bytes, ttl_s: float, *, leased: bool = False) -> int:
        self._cas += 1
        self._data[key] = (value, self._cas, self._clock() + ttl_s, leased)
        return self._cas

    def lookup_many(self, keys: Sequence[str], *, lease_ttl_s: int, drop: Sequence[str] = ()) -> Lookups:
        """Each key's value; a miss makes an empty item and wins it, as ``mg ... N`` does."""
        values: list[bytes] = []
        heads: list[bytes] = []
        with self._lock:
            for key in drop:
                self._data.pop(key, None)
            for key in keys:
                got = self._live(key)
                if got is None:
                    cas = self._store(key, b"", lease_ttl_s, leased=True)
                    values.append(b"")
                    heads.append(b"VA 0 c%d W" % cas)
                else:  # (an empty value: someone else's lease)
                    values.append(got[0])
                    heads.append(b"VA %d c%d" % (len(got[0]), got[1]))
        return Lookups(list(keys), values, heads)

    def fill_many(
        self,
        items: Mapping[str, tuple[bytes, int]],
        ttl_s: int,
        *,
        later: Callable[[int], None] | None = None,
    ) -> int:
        """Store each value whose key still has the given cas token (at once: ``later`` is never told)."""
        stored = 0
        with self._lock:
            for key, (value, cas) in items.items():
                got = self._live(key)
                if got is not None and got[1] == cas:
                    self._store(key, value, ttl_s)
                    stored += 1
        return stored

    def read_owed(self) -> None:
        """Nothing is owed here: every call is done when it returns."""

    def delete_many(self, keys: Sequence[str]) -> None:
        """Delete the keys."""
        with self._lock:
            for key in keys:
                self._data.pop(key, None)

    def delete_many_begin(self, keys: Sequence[str]) -> Callable[[], None]:
        """`delete_many` now (nothing to wait for in memory)."""
        self.delete_many(keys)
        return nothing_owed

    def peek_many(self, keys: Sequence[str]) -> dict[str, bytes]:
        """The value under each key that holds one."""
        with self._lock:
            out = {}
            for key in keys:
                got = self._live(key)
                if got is not None:
                    out[key] = got[0]
            return out
