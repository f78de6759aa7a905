"""Caching the head of each relation list (and its count), guarded by a version.

Each cached list holds up to ``list_entries`` entries (default 1,000) of one
end of the list, its *head*, as members that sort like ``(sequence, to_id)``
(16 bytes, big-endian, the sequence offset so that negative ones sort
first), kept in that order, plus a meta value ``(n, cached)``: the list's
length and how many entries are cached. A list with ``cached == n`` is
complete and serves any read; otherwise only reads within the cached head are
served and the rest fall through to the database.

Which end: the one the read that filled the list asked for. An oldest-first
read fills the oldest entries, a newest-first one (a feed, a board's newest
pins) the newest (`ListRead.newest`); a read of the other end of a list longer
than its head is a miss that fills the list again with its own end. So the
end cached is the end the list's readers ask for, and a list read both ways
pays a database read each time the end changes, what such a read cost before
at every call (only oldest-first heads were cached). A complete list has no end.
Many lists are read in one round trip with `ListCache.read_many` (on Redis,
one pipeline of the read script), and filled in one with `ListCache.fill_many` (a pipeline of
the fill script), by the same rules.

No stale fill: every list has a version. A writer commits, then bumps the
version and deletes the list in one atomic step. A reader that misses notes
the version it saw, reads the database, and fills only if the version is
still the one it saw (checked and written atomically by the backend). So a
reader that read the old rows cannot fill after a writer's invalidation.

Updates in place, in the database's order: where the database keeps a
version per list (``relation_counts.version`` on MariaDB/MySQL and
PostgreSQL, bumped by every change of the list's rows in the writer's
transaction and returned to it: by ``LAST_INSERT_ID`` on MariaDB, by the
counted write's own row on PostgreSQL), a fill records the version it read
(in the same statement as the rows), and a writer that changed a list asks the cache to apply its change
(`ListChange`: the pair added, moved or removed, and the version the change
made) instead of dropping the list. The change is applied only to a cached
list at exactly the version before it; a list already at that version or
later is left alone, and any other (a change missed, out of order, or a
list of unknown version) is dropped as before. So the cached head is always
the database's list at some version, whatever order the writers' calls
arrive in. A fill never replaces a cached list of a later version (nor a
versioned one, if it knows no version): it drops it, and the next reader
fills it again. The
log's followers (`store.cache.follower`) drop a list only if it is older
than the version their log entry names.

Bounded staleness: the meta also holds the time of the database read that
filled the list (taken before the read); a list older than ``max_stale_s``
is a miss and is filled again, so a lost invalidation (Redis unreachable
from the writer, the writer killed after its commit, Redis restarted and its
versions gone) is stale for at most ``max_stale_s`` in any process.
"""

from __future__ import annotations

import struct
import sys
import threading
import time
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from store.cache.leases import TrustSource, wall_ms
from store.cache.stats import CacheStats
from store.forks import at_fork

__all__ = [
    "ListBackend",
    "ListCache",
    "FillItem",
    "ListChange",
    "ListRead",
    "MemoryListBackend",
    "apply_change",
    "split_changes",
    "IN_PLACE_MAX",
    "decode_member",
    "decode_members",
    "decode_to_ids",
    "encode_member",
    "encode_members",
    "lex_bound",
    "split_members",
]

_PACK = struct.Struct(">QQ")
_OFFSET = 1 << 63


def encode_member(sequence: int, to_id: int) -> bytes:
    """16 bytes whose byte order is the order of ``(sequence, to_id)``."""
    return _PACK.pack(sequence + _OFFSET, to_id)


def encode_members(head: Sequence[tuple[int, int]]) -> bytes:
    """The members of ``head``, packed end to end in one call (16 bytes each, in the same order)."""
    off = _OFFSET
    return struct.pack(f">{2 * len(head)}Q", *[x for s, t in head for x in (s + off, t)])


def split_members(packed: bytes) -> list[bytes]:
    """The 16-byte members of an `encode_members` blob."""
    return [packed[i : i + 16] for i in range(0, len(packed), 16)]


def decode_member(member: bytes) -> tuple[int, int]:
    """``(sequence, to_id)`` of a member."""
    s, t = _PACK.unpack(member)
    return s - _OFFSET, t


def decode_members(members: Sequence[bytes]) -> list[tuple[int, int]]:
    """``(sequence, to_id)`` of each member, unpacked in one pass."""
    off = _OFFSET
    return [(s - off, t) for s, t in _PACK.iter_unpack(b"".join(members))]


def decode_to_ids(members: Sequence[bytes]) -> list[int]:
    """The ``to_id`` of each member (for membership checks), unpacked without a Python loop."""
    words = array("Q", b"".join(members))  # 8-byte items: checked below, at import
    if sys.byteorder == "little":
        words.byteswap()
    return words[1::2].tolist()


assert array("Q").itemsize == 8, "decode_to_ids needs 8-byte unsigned array items"


@dataclass(frozen=True, slots=True)
class ListRead:
    """One atomic read: the meta (None if the list is not cached), members and version.

    ``read_ms`` is when the database read that filled the list began (ms since the epoch).
    ``last`` is the cached head's inner edge (``lex`` reads only; None if empty): its last
    member if the head is the list's oldest entries, its first if it is the newest.
    ``newest``: the head is the list's newest entries (else the oldest; a complete list, False).
    ``list_version``: the database's version of the list the head was read at (0: not known).
    """

    meta: tuple[int, int] | None
    members: list[bytes]
    version: bytes | None
    read_ms: int = 0
    last: bytes | None = None
    newest: bool = False
    list_version: int = 0

    @property
    def complete(self) -> bool:
        """True if the whole list is cached (``cached == n``)."""
        return self.meta is not None and self.meta[0] == self.meta[1]


#: One list to fill: key, the version its reader saw, the list's length, the head, the read time,
#: and whether the head is the list's newest entries (else its oldest).
FillItem = tuple[str, bytes | None, int, Sequence[tuple[int, int]], int, bool]

#: How a write changed one cached list: key, the list's version the change made (0: unknown,
#: drop the list), the kind ("add", "move" or "remove"), the member now in place (add, move;
#: `encode_member`; else b""), and the to_id whose entry goes (move, remove).
ListChange = tuple[str, int, str, bytes, int]


def lex_bound(member: bytes | None, *, inclusive: bool, low: bool) -> bytes:
    """A ``lex`` op bound: ``[member`` / ``(member``, or the open end (``-`` low, ``+`` high)."""
    if member is None:
        return b"-" if low else b"+"
    return (b"[" if inclusive else b"(") + member


class ListBackend(Protocol):
    """Atomic operations on cached lists (Redis, or in-process)."""

    stats: CacheStats

    def read(self, key: str, op: tuple[object, ...]) -> ListRead | None:
        """Meta, version and the members that ``op`` selects; None if the server failed.

        ``op`` is ``("rank", start, stop, desc)`` (inclusive ranks) or
        ``("after", member, limit, desc)`` (members strictly after, in
        direction) or ``("meta",)``, or ``("lex", low, high, limit, desc)``
        (up to ``limit`` members between two `lex_bound` bounds, from the low
        end or, ``desc``, the high end; the read also gives the head's inner
        edge) or ``("all",)`` (every member, only if the list is complete).
        Ranks and cursors count within the cached head (from its first member,
        or its last for ``desc``): the caller judges, by `ListRead.newest`,
        whether the head holds what it asked for.
        """
        ...

    def read_many(self, keys: Sequence[str], ops: Sequence[tuple[object, ...]]) -> list[ListRead | None]:
        """`read` of each key with its op, in one round trip; None for each if the server failed."""
        ...

    def fill(
        self,
        key: str,
        version: bytes | None,
        n: int,
        members: bytes,
        ttl_s: int,
        read_ms: int,
        list_version: int = 0,
        newest: bool = False,
        later: Callable[[int], None] | None = None,
    ) -> bool:
        """Replace the cached list if the version is still ``version``; True if filled.

        ``members`` is the head packed by `encode_members` (one bytes object,
        not one per entry: a fill of 100 entries costs one argument to pack),
        the list's first entries, or its last if ``newest``.
        ``list_version`` is the database's version of the list the head was
        read at (0: unknown); a cached list of a later one, or a versioned
        list when this one is unknown, is dropped rather than replaced.

        With ``later``, a backend may return without waiting for the server's reply: it then
        returns False, and tells ``later`` how many lists were filled (1 or 0) once it reads the
        reply (before the connection's next one, or at `read_owed`).
        """
        ...

    def fill_many(
        self,
        items: Sequence[tuple[str, bytes | None, int, bytes, int, bool]],
        ttl_s: int,
        *,
        later: Callable[[int], None] | None = None,
    ) -> int:
        """`fill` of each (key, version, n, packed members, read_ms, newest), in one round trip; how many
        filled (with ``later``: 0, and ``later`` told how many, as for `fill`)."""
        ...

    def read_owed(self) -> None:
        """Read the replies still owed to calls that did not wait for them (`fill`, `fill_many`)."""
        ...

    def invalidate(self, keys: Sequence[str], ttl_s: int) -> None:
        """Bump each list's version and drop it, atomically per key."""
        ...

    def apply(self, changes: Sequence[ListChange], ttl_s: int, cap: int) -> int:
        """Apply each change to its cached list if the list is at the version just before the
        change's, else drop it (unless it is at that version or later); atomically per list.
        A head never grows past ``cap`` entries. How many lists were changed in place."""
        ...

    def settle(self, entries: Sequence[tuple[str, int]], ttl_s: int) -> None:
        """Drop each list unless it is cached at the given version or later (0: drop it)."""
        ...

    def touch(self, key: str, version: bytes | None, list_version: int, read_ms: int) -> bool:
        """Record ``read_ms`` as the list's read time if it is still cached at cache version
        ``version`` and database list version ``list_version`` (its head unchanged); True if so."""
        ...


class ListCache:
    """Reads relation lists from a `ListBackend`, filling misses from the database."""

    def __init__(
        self,
        backend: ListBackend,
        *,
        entries: int = 1000,
        ttl_s: int = 3600,
        max_stale_s: float = 5.0,
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        self.backend = backend
        self.stats = backend.stats
        self.entries = entries
        self._ttl_s = ttl_s
        self._max_stale_ms = int(max_stale_s * 1000)
        self.clock_ms = clock_ms or wall_ms
        #: Test hook: called after the database read, before the fill.
        self.after_load: Callable[[], None] | None = None
        #: The database's version of a cached list now, by its key (None: not known), where the
        #: lists come from a database that keeps one (`store.relations.listcache`): a list older
        #: than ``max_stale_s`` whose version is unchanged is vouched for again (`read`).
        self.revalidate: Callable[[str], int | None] | None = None
        #: The invalidation log's follower (`store.cache.follower`), once one runs.
        self.follower: TrustSource | None = None

    def _limits(self) -> tuple[int, int, int]:
        """(oldest read time trusted, the same for a non-empty list while the invalidation log's
        follower or daemon vouches for every host, now: -1 if it vouches for none as a whole)."""
        now = self.clock_ms()
        oldest = now - self._max_stale_ms
        f = self.follower
        since = None if f is None else f.trusted_since_ms(now, self._max_stale_ms)
        if since is None:
            return oldest, oldest, now if f is not None else -1
        return oldest, min(oldest, since), -1

    def _stale(self, key: str, got: ListRead | None, limits: tuple[int, int, int]) -> bool:
        if got is None or got.meta is None:
            return False
        # Links and unlinks are logged; an empty list may be one whose object was just made.
        if not got.meta[0]:
            return got.read_ms < limits[0]
        if got.read_ms >= limits[1]:
            return False
        f = self.follower
        if f is None or limits[2] < 0:
            return True
        # No host vouched for as a whole: perhaps this list's host.
        since = f.key_trusted_since_ms(key, limits[2], self._max_stale_ms)
        return since is None or got.read_ms < since

    def read(self, key: str, op: tuple[object, ...]) -> ListRead | None:
        """The backend's atomic read (None on failure); a list older than ``max_stale_s`` is not cached
        (unless the invalidation log's follower is current, or the database's version of the list
        is still the one its head was read at: `_still`)."""
        got = self.backend.read(key, op)
        if got is not None and self._stale(key, got, self._limits()):
            self.stats.add(expired=1)
            if self._still(key, got):
                return got
            return ListRead(None, [], got.version)
        return got

    def _still(self, key: str, got: ListRead) -> bool:
        """Whether the expired list ``got`` is vouched for again: the database's version of it,
        read now, is the one its head was read at, so the head is the database's list as of that
        read. Its read time becomes that read's (taken before it), if the list is still cached
        as it was read (a writer's drop in between wins). One key read instead of a fill.

        A version changes with every change of the list's rows, in the writer's transaction, so
        an equal version is an equal list; a shard restored from an older backup takes its
        versions back (flush the caches after a restore, as for the writers' changes)."""
        check = self.revalidate
        if check is None or got.list_version <= 0 or got.meta is None:
            return False
        at = self.clock_ms()  # (before the read: the entry's age counts from here)
        if check(key) != got.list_version:
            return False
        self.backend.touch(key, got.version, got.list_version, at)
        return True

    def read_many(self, keys: Sequence[str], ops: Sequence[tuple[object, ...]]) -> list[ListRead | None]:
        """`read` of many lists in one round trip, with the same staleness rule."""
        if not keys:
            return []
        limits = self._limits()
        out: list[ListRead | None] = []
        expired = 0
        for key, got in zip(keys, self.backend.read_many(keys, ops), strict=True):
            if got is not None and self._stale(key, got, limits):
                expired += 1
                got = ListRead(None, [], got.version)
            out.append(got)
        if expired:
            self.stats.add(expired=expired)
        return out

    def fill(
        self,
        key: str,
        version: bytes | None,
        n: int,
        head: Sequence[tuple[int, int]],
        read_ms: int,
        *,
        packed: bytes | None = None,
        list_version: int = 0,
        newest: bool = False,
    ) -> None:
        """Cache ``head`` (the first entries, or the last if ``newest``, in list order) and the
        length ``n``, unless invalidated meanwhile.

        ``read_ms`` is when the database read began (`clock_ms` before it);
        ``packed`` is ``head`` already packed (`encode_members`), if the database gave it so;
        ``list_version`` is the database's version of the list that was read (0: unknown).
        """
        if self.after_load is not None:
            self.after_load()
        members = encode_members(head) if packed is None else packed
        if self.backend.fill(
            key, version, n, members, self._ttl_s, read_ms, list_version, newest, later=self._filled
        ):
            self.stats.add(fills=1)

    def fill_many(self, items: Sequence[FillItem]) -> None:
        """`fill` of many lists in one round trip, each only if its version is still the one seen."""
        if not items:
            return
        if self.after_load is not None:
            self.after_load()
        batch = [(k, v, n, encode_members(head), ms, newest) for k, v, n, head, ms, newest in items]
        filled = self.backend.fill_many(batch, self._ttl_s, later=self._filled)
        if filled:
            self.stats.add(fills=filled)

    def _filled(self, n: int) -> None:
        """``n`` lists were filled (their replies, read after the call, say so)."""
        self.stats.add(fills=n)

    def invalidate(self, keys: Sequence[str]) -> None:
        """Drop lists after a committed write."""
        self.backend.invalidate(keys, self._ttl_s)
        self.stats.add(invalidations=len(keys))

    def apply(self, changes: Sequence[ListChange]) -> None:
        """Update cached lists in place after a committed write, in version order (else drop them)."""
        if not changes:
            return
        updated = self.backend.apply(changes, self._ttl_s, self.entries)
        self.stats.add(updates=updated, invalidations=len(changes) - updated)

    def settle(self, entries: Sequence[tuple[str, int]]) -> None:
        """Drop each list that is not cached at the given version or later (the log's followers)."""
        if entries:
            self.backend.settle(entries, self._ttl_s)


class MemoryListBackend:
    """An in-process `ListBackend` (one process only), same rules as Redis."""

    def __init__(self, *, name: str = "memory-lists", clock: Callable[[], float] = time.monotonic) -> None:
        self.stats = CacheStats(name)
        self._lock = threading.Lock()
        self._clock = clock
        #: key -> ((n, cached), members, expires at, read_ms, the database's list version, newest end).
        self._lists: dict[str, tuple[tuple[int, int], list[bytes], float, int, int, bool]] = {}
        self._versions: dict[str, int] = {}
        at_fork(self, MemoryListBackend._after_fork)

    def _after_fork(self) -> None:
        """In a forked child: start empty, with a lock of its own (the parent's lists are its own
        process's cache)."""
        self._lock = threading.Lock()
        self._lists = {}
        self._versions = {}

    def read(self, key: str, op: tuple[object, ...]) -> ListRead | None:
        """Meta, version and selected members, under one lock."""
        with self._lock:
            version = self._versions.get(key)
            vbytes = None if version is None else str(version).encode()
            entry = self._lists.get(key)
            if entry is not None and entry[2] <= self._clock():
                del self._lists[key]
                entry = None
            if entry is None:
                return ListRead(None, [], vbytes)
            meta, members, _exp, read_ms, db, newest = entry
            if op[0] == "all" and meta[0] != meta[1]:
                return ListRead(meta, [], vbytes, read_ms, None, newest, db)
            last = (members[0 if newest else -1] if members else None) if op[0] == "lex" else None
            return ListRead(meta, _select(members, op), vbytes, read_ms, last, newest, db)

    def read_many(self, keys: Sequence[str], ops: Sequence[tuple[object, ...]]) -> list[ListRead | None]:
        """`read` of each key (each under the lock)."""
        return [self.read(k, op) for k, op in zip(keys, ops, strict=True)]

    def fill(
        self,
        key: str,
        version: bytes | None,
        n: int,
        members: bytes,
        ttl_s: int,
        read_ms: int,
        list_version: int = 0,
        newest: bool = False,
        later: Callable[[int], None] | None = None,
    ) -> bool:
        """Replace the list if its version is unchanged (and it holds no later list version)."""
        entries = split_members(members)
        with self._lock:
            current = self._versions.get(key)
            if (None if current is None else str(current).encode()) != version:
                return False
            held = self._held(key)
            if held > list_version or (held and not list_version):
                self._drop(key)  # never replaced by an older read: dropped (see the Redis script)
                return False
            self._lists[key] = (
                (n, len(entries)),
                sorted(entries),
                self._clock() + ttl_s,
                read_ms,
                list_version,
                newest and 0 < len(entries) < n,  # (as the Redis meta can tell)
            )
            return True

    def _held(self, key: str) -> int:
        """The list version of the cached list (0: none, or not known)."""
        entry = self._lists.get(key)
        if entry is None or entry[2] <= self._clock():
            return 0
        return entry[4]

    def _drop(self, key: str) -> None:
        self._versions[key] = self._versions.get(key, 0) + 1
        self._lists.pop(key, None)

    def fill_many(
        self,
        items: Sequence[tuple[str, bytes | None, int, bytes, int, bool]],
        ttl_s: int,
        *,
        later: Callable[[int], None] | None = None,
    ) -> int:
        """`fill` of each item; how many were filled."""
        return sum(self.fill(k, v, n, m, ttl_s, ms, 0, newest) for k, v, n, m, ms, newest in items)

    def read_owed(self) -> None:
        """Nothing is owed here: every call is done when it returns."""

    def invalidate(self, keys: Sequence[str], ttl_s: int) -> None:
        """Bump versions and drop the lists."""
        with self._lock:
            for key in keys:
                self._drop(key)

    def apply(self, changes: Sequence[ListChange], ttl_s: int, cap: int) -> int:
        """Each change in place if its list is at the version before it (see `ListBackend.apply`)."""
        kept = 0
        with self._lock:
            for key, version, kind, member, to_id in changes:
                held = self._held(key)
                if held and version and held >= version:
                    kept += 1
                    continue
                entry = self._lists.get(key)
                if entry is None or not held or held != version - 1:
                    self._drop(key)
                    continue
                (n, _cached), members, expires, read_ms, _db, newest = entry
                changed = apply_change(members, n, kind, member, to_id, cap, newest=newest)
                if changed is None:
                    self._drop(key)
                    continue
                members, n = changed
                newest = newest and 0 < len(members) < n
                self._lists[key] = ((n, len(members)), members, expires, read_ms, version, newest)
                kept += 1
        return kept

    def touch(self, key: str, version: bytes | None, list_version: int, read_ms: int) -> bool:
        """Record ``read_ms`` if the list is still cached at ``version`` and ``list_version``."""
        with self._lock:
            held = self._versions.get(key)
            entry = self._lists.get(key)
            if entry is None or (None if held is None else str(held).encode()) != version:
                return False
            meta, members, expires, _read_ms, db, newest = entry
            if db != list_version:
                return False
            self._lists[key] = (meta, members, expires, read_ms, db, newest)
            return True

    def settle(self, entries: Sequence[tuple[str, int]], ttl_s: int) -> None:
        """Drop each list not cached at the given version or later."""
        with self._lock:
            for key, version in entries:
                held = self._held(key)
                if not (held and version and held >= version):
                    self._drop(key)


#: A list with more changes than this in one write is dropped, not changed in place: each change
#: costs the cache call about as much as a fill of the list's head costs the next reader.
IN_PLACE_MAX = 16


def split_changes(changes: Sequence[ListChange]) -> tuple[list[str], list[ListChange]]:
    """``changes`` as the lists to drop and the changes to make in place (in their order).

    A change of unknown version (0) drops its list, and a dropped list takes no
    change in place, so a list with such a change ends dropped whatever its
    other changes did (only its version is bumped fewer times): it is only
    dropped. So is a list with more than `IN_PLACE_MAX` changes (a board's
    100 new pins in one `link_many`): dropping is always right, and cheaper
    than a hundred changes in place.
    """
    seen: dict[str, int] = {}
    unknown: set[str] = set()
    for c in changes:
        seen[c[0]] = seen.get(c[0], 0) + 1
        if not c[1]:
            unknown.add(c[0])
    drops = [key for key, n in seen.items() if key in unknown or n > IN_PLACE_MAX]
    if not drops:
        return [], list(changes)
    gone = set(drops)
    return drops, [c for c in changes if c[0] not in gone]


def apply_change(
    members: list[bytes], n: int, kind: str, member: bytes, to_id: int, cap: int, *, newest: bool = False
) -> tuple[list[bytes], int] | None:
    """A cached head (the list's first members of ``n``, or its last if ``newest``; in list order)
    after one change, and the new ``n``; None if the head cannot be the list's (then it is
    dropped). The rules of the Redis script."""
    if kind not in ("add", "move", "remove"):
        return None
    out = list(members)
    tail = to_id.to_bytes(8, "big")
    found = [i for i, m in enumerate(out) if m[8:] == tail]
    if found:
        if kind == "add":
            return None  # a new pair already in the head
        del out[found[0]]
    elif kind != "add" and len(members) == n:
        return None  # the whole list is cached and the pair is not in it
    if kind == "remove":
        return out, n - 1
    if kind == "add":
        n += 1
    # The head is the first entries of the list without this pair (the last, if newest): the
    # member goes in if the head holds every other entry, or if it sorts before the head's last
    # one (after its first one). A head over the cap loses entries at its inner edge.
    whole = len(out) == n - 1
    i = bisect_left(out, member)
    if whole or (i > 0 if newest else i < len(out)):
        out.insert(i, member)
    if len(out) > cap:
        out = out[len(out) - cap :] if newest else out[:cap]
    return out, n


def _select(members: list[bytes], op: tuple[object, ...]) -> list[bytes]:
    kind = op[0]
    if kind == "meta":
        return []
    if kind == "all":
        return list(members)
    if kind == "lex":
        low, high, count, desc = op[1], op[2], op[3], op[4]
        assert isinstance(low, bytes)
        assert isinstance(high, bytes)
        assert isinstance(count, int)
        picked = members[_lex_index(members, low, low=True) : _lex_index(members, high, low=False)]
        return picked[::-1][:count] if desc else picked[:count]
    if kind == "rank":
        start, stop, desc = op[1], op[2], op[3]
        assert isinstance(start, int)
        assert isinstance(stop, int)
        ordered = members[::-1] if desc else members
        return ordered[start : stop + 1]
    member, limit, desc = op[1], op[2], op[3]
    assert isinstance(member, bytes)
    assert isinstance(limit, int)
    if desc:
        i = bisect_left(members, member)
        return members[max(0, i - limit) : i][::-1]
    i = bisect_right(members, member)
    return members[i : i + limit]


def _lex_index(members: list[bytes], bound: bytes, *, low: bool) -> int:
    """Where a `lex_bound` bound cuts ``members`` (sorted), as Redis's BYLEX reads it."""
    if bound in (b"-", b"+"):
        return 0 if bound == b"-" else len(members)
    member = bound[1:]
    inclusive = bound[:1] == b"["
    if low:
        return bisect_left(members, member) if inclusive else bisect_right(members, member)
    return bisect_right(members, member) if inclusive else bisect_left(members, member)
