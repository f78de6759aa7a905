"""The list cache of relation lists: reads that answer from a cached head, fills, and writers' changes.

Each list's head (one end of it, up to ``cache.list_entries`` entries) and
its count are cached as `store.cache.lists` keeps them, versioned so that no
reader puts back what a writer dropped. `RelationListCache` is what
`RelationService` asks before the database: a read that the cached head
holds is answered from it (a hit), one it does not is a miss that fills
the list from the database (`RelationRepository.head_and_count`: the head
and the count in one statement) and answers from what it read; a failed
cache is a miss that fills nothing. After a committed write, the service
hands it the rows that changed (`apply`), or the lists to drop
(`invalidate`).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence

from store.cache.follower import LIST
from store.cache.lists import ListCache, decode_members, encode_member, lex_bound
from store.engines import ShardHandle
from store.relations.repository import REMOVE, RelationRepository, Side
from store.relations.writer import Change

__all__ = ["MIN_FILL", "RelationListCache", "fill_size", "list_key"]

#: A list fill reads at least this many entries (up to ``cache.list_entries``), or twice
#: what the read asked for: a first page's fill serves the next page too, and a fill never
#: reads a thousand rows to answer for fifty. (Every row read costs the client its parse:
#: under a mix of writes, where hot lists are dropped and filled again all the time, four
#: times the page cost more than the pages it saved.)
MIN_FILL = 100


def fill_size(entries: int, want: int) -> int:
    """How many entries a list fill reads for a read of ``want``: see `MIN_FILL`."""
    return min(entries, max(MIN_FILL, 2 * want))


def list_key(prefix: str, relation: str, from_id: int) -> str:
    """The cache key of ``from_id``'s ``relation`` list, under the store's key ``prefix``."""
    return f"{prefix}l:{relation}:{from_id}"


class RelationListCache:
    """Relation lists in a `ListCache`: cached reads (filled from ``repo`` on a miss) and writers' changes."""

    def __init__(self, cache: ListCache, *, repo: RelationRepository, prefix: str) -> None:
        #: The list cache itself (`store.cache.lists.ListCache`).
        self.cache = cache
        self._repo = repo
        self._prefix = prefix

    def key(self, relation: str, from_id: int) -> str:
        """The cache key of ``from_id``'s ``relation`` list."""
        return list_key(self._prefix, relation, from_id)

    def list_of(self, key: str) -> tuple[str, int] | None:
        """(relation, from_id) of a list's cache `key`; None for a key that is not one."""
        head, _sep, from_id = key.rpartition(":")
        lead = f"{self._prefix}l:"
        if not head.startswith(lead) or not from_id.isdigit():
            return None
        return head[len(lead) :], int(from_id)

    def version_now(self, h: ShardHandle, relation: str, from_id: int) -> int:
        """The database's version of the list now (0: it has none yet), one key read."""
        row = h.read(self._repo.sql(h, relation).version_of, (relation, from_id), one=True)
        return 0 if row is None else int(row[0])

    def log_entry(self, side: Side) -> str:
        """The invalidation log's entry for ``side``'s list (`store.cache.follower`)."""
        return LIST + self.key(side.relation, side.from_id)  # (`log_entries` of the one key)

    # -- after a committed write -----------------------------------------------------

    def invalidate(self, pairs: Sequence[tuple[str, int]]) -> None:
        """Drop the cached lists of (relation, from_id)."""
        if pairs:
            self.cache.invalidate([self.key(r, f) for r, f in pairs])

    def apply(self, changes: Sequence[Change]) -> None:
        """Update the cached lists in place with committed ``changes`` (in their order)."""
        if changes:
            self.cache.apply(
                [
                    (
                        self.key(c.side.relation, c.side.from_id),
                        c.version,
                        c.kind,
                        b"" if c.kind == REMOVE else encode_member(c.sequence, c.side.to_id),
                        c.side.to_id,
                    )
                    for c in changes
                ]
            )

    # -- reads -------------------------------------------------------------------------

    def count(self, h: ShardHandle, relation: str, from_id: int) -> int | None:
        """The list's count from the cache (filling the list on a miss), or None if the cache failed."""
        read = self.cache.read(self.key(relation, from_id), ("meta",))
        if read is None:
            return None
        if read.meta is not None:
            self.cache.stats.add(hits=1)
            return read.meta[0]
        self.cache.stats.add(misses=1)
        return self.fill(h, relation, from_id, read.version, 0)[0]

    def rows(
        self,
        h: ShardHandle,
        relation: str,
        from_id: int,
        op: tuple[object, ...],
        want: int,
        newest_first: bool,
        *,
        after: tuple[int, int] | None = None,
    ) -> list[tuple[int, int]] | None:
        """Rows from the cache (filling it on a miss), or None if the database must answer.

        ``want`` is how many rows the caller needs, or, for ranks, the end of
        the rank range. A cached head answers when the list is complete, or
        when it is the end the read starts from (`ListRead.newest`) and holds
        every row asked for. A head of the other end is a miss that fills the
        list again with this read's end (see `store.cache.lists`).
        """
        read = self.cache.read(self.key(relation, from_id), op)
        if read is None:
            return None  # the cache failed: a miss, and no fill
        stats = self.cache.stats
        if read.meta is not None:
            n, cached = read.meta
            complete = cached == n
            rows = decode_members(read.members)
            if complete or (
                read.newest == newest_first and (len(rows) >= want if op[0] == "after" else want <= cached)
            ):
                stats.add(hits=1)
                return rows
            stats.add(misses=1)
            if read.newest == newest_first:
                return None  # beyond the cached head
        else:
            stats.add(misses=1)
        n, head = self.fill(h, relation, from_id, read.version, want, newest=newest_first)
        complete = len(head) == n
        if op[0] == "rank":
            start, stop = int(op[1]), int(op[2])  # type: ignore[call-overload]
            if not complete and stop + 1 > len(head):
                return None
            ordered = head[::-1] if newest_first else head
            return ordered[start : stop + 1]
        assert after is not None
        if newest_first:
            i = bisect_left(head, after)
            rows = head[max(0, i - want) : i][::-1]
        else:
            i = bisect_right(head, after)
            rows = head[i : i + want]
        return rows if complete or len(rows) >= want else None

    def fill(
        self,
        h: ShardHandle,
        relation: str,
        from_id: int,
        version: bytes | None,
        want: int,
        *,
        newest: bool = False,
    ) -> tuple[int, list[tuple[int, int]]]:
        """Read the head (the newest entries if ``newest``) and the kept count from the database
        and cache them (if still current).

        The head is ``2 * want`` entries, at least `MIN_FILL`, at most
        ``list_entries``; it and the count are one statement (`head_and_count`).
        """
        size = fill_size(self.cache.entries, want)
        read_ms = self.cache.clock_ms()  # before the reads: the entry's age counts from here
        n, head, packed, at = self._repo.head_and_count(h, relation, from_id, size, newest)
        key = self.key(relation, from_id)
        self.cache.fill(key, version, n, head, read_ms, packed=packed, list_version=at, newest=newest)
        return n, head

    def rows_in_range(
        self,
        h: ShardHandle,
        relation: str,
        from_id: int,
        after: tuple[int, int] | None,
        want: int,
        newest_first: bool,
        since: int | None,
        until: int | None,
    ) -> list[tuple[int, int]] | None:
        """Up to ``want`` entries of the range from the cached head (filled on a miss), or None.

        The head answers when the list is complete, or when it is the end the
        read starts from and holds ``want`` entries of the range, or when it
        reaches past the far end of the range: a head of the oldest entries
        past the range's high end (``until``; newest first, also a cursor's
        key), a head of the newest to or below its low end (``since``; oldest
        first, also a cursor's key). A miss fills the end the read starts from.
        """
        # IDs are > 0: (since, 0) sorts before every entry at since.
        low = None if since is None else (since, 0)
        high = None if until is None else (until, 0)
        start, start_open, end = low, False, high
        if after is not None and newest_first and (high is None or after < high):
            end = after
        elif after is not None and not newest_first and (low is None or after >= low):
            start, start_open = after, True  # a cursor's key is not repeated
        read = self.cache.read(
            self.key(relation, from_id),
            (
                "lex",
                lex_bound(
                    None if start is None else encode_member(*start), inclusive=not start_open, low=True
                ),
                lex_bound(None if end is None else encode_member(*end), inclusive=False, low=False),
                want,
                newest_first,
            ),
        )
        if read is None:
            return None  # the cache failed: a miss, and no fill
        stats = self.cache.stats
        if read.meta is not None:
            rows = decode_members(read.members)
            edge = None if read.last is None else decode_members([read.last])[0]
            complete, newest = read.complete, read.newest
        else:
            stats.add(misses=1)
            n, head = self.fill(h, relation, from_id, read.version, want, newest=newest_first)
            complete, newest = len(head) == n, newest_first
            edge = (head[0] if newest else head[-1]) if head else None
            i = 0 if start is None else (bisect_right if start_open else bisect_left)(head, start)
            j = len(head) if end is None else bisect_left(head, end)
            picked = head[i:j]
            rows = picked[::-1][:want] if newest_first else picked[:want]
        covered = (
            complete
            or (newest == newest_first and len(rows) >= want)
            or (not newest and end is not None and edge is not None and edge >= end)
            or (newest and start is not None and edge is not None and edge <= start)
        )
        if read.meta is not None and covered:
            stats.add(hits=1)
        elif read.meta is not None:
            stats.add(misses=1)
        return rows if covered else None
