"""Relation calls, validated and routed: pair writes by the pair protocol, reads through the list cache.

Inverse pairs cross shards and no transaction covers both sides. The primary
side (the relation declared with ``inverse:``) is written first: a crash
between the two writes leaves either an inverse row missing (after a link)
or an inverse row too many (after an unlink), and `store.admin.repair`
makes the inverse side match the primary again (`PairWriter`,
`store.relations.writer`, says how).

`RelationService` checks each call's input before any I/O, routes its IDs
once, runs each pair write as a step of its call's plan (`store.steps`),
and keeps the list cache (`RelationListCache`) in step with what was
committed. It reads one list at a time; reads of many lists at once
(membership checks, the first pages of many lists, pages with their
objects) are `store.relations.reads`, and writes of many pairs at once
(`link_many`, `unlink_many`, and the sweep of a deleted object's lists)
`store.relations.bulk`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from store.cache.lists import ListCache, encode_member
from store.cursors import decode_cursor, encode_cursor
from store.engines import ShardHandle
from store.exceptions import DataError, LimitError, StoreError, brief
from store.relations.listcache import RelationListCache, list_key
from store.relations.repository import Guard, Page, RelationRepository, Side
from store.relations.writer import Change, PairWriter
from store.routing import Router
from store.specs import RelationSpec
from store.steps import Steps

__all__ = ["REMOVE_CHUNK", "RelationService"]

_SEQ_MIN, _SEQ_MAX = -(1 << 63), (1 << 63) - 1
#: Pairs of a deleted object's list read (and removed) per round (`BulkPairs.remove_object`).
REMOVE_CHUNK = 200
#: ``tuple.__new__``: a named tuple (`Side`, `Guard`) made from a tuple of its fields, as its
#: ``_make`` does, without the Python frame of its ``__new__`` (a batch of pairs makes 300).
_new_tuple = tuple.__new__


class RelationService:
    """Validated, routed relation calls; pair writes go by the protocol of `store.relations.writer`."""

    def __init__(
        self,
        *,
        router: Router,
        shard: Callable[[int, str], ShardHandle],
        repo: RelationRepository | None = None,
        clock_us: Callable[[], int] | None = None,
        lists: ListCache | None = None,
        prefix: str = "s:",
        steps: Steps | None = None,
    ) -> None:
        self._router = router
        #: Runs each pair write as one step of its call's plan (`store.steps`): alone again after a reroute.
        self.steps = steps or Steps()
        self._shard = shard
        self.repo = repo or RelationRepository()
        self._clock_us = clock_us or (lambda: time.time_ns() // 1000)
        self.lists = lists
        self._prefix = prefix
        #: The relation lists in ``lists``: cached reads, fills, writers' changes (None: no list cache).
        self.list_cache = None if lists is None else RelationListCache(lists, repo=self.repo, prefix=prefix)
        self.pairs = PairWriter(self.repo)
        if self.list_cache is not None:
            # Where the host logs writes, a side's list goes in the log with its COMMIT.
            self.pairs.log = self.list_cache.log_entry
            # An expired list is checked by its version before it is read again.
            self.list_cache.cache.revalidate = self._list_version
        self._object_key = "id" if router.config.ids == "instagram" else "local_id"

    def _list_version(self, key: str) -> int | None:
        """The database's version of the list cached under ``key`` now; None if not known (not a
        list of this store's, or the read failed: the list is read again, as it would be)."""
        assert self.list_cache is not None
        which = self.list_cache.list_of(key)
        if which is None:
            return None
        relation, from_id = which
        try:
            spec = self._router.relation(relation)
            return self.list_cache.version_now(self.handle(spec, from_id), relation, from_id)
        except StoreError:
            return None

    @property
    def router(self) -> Router:
        """The router this service routes by."""
        return self._router

    def handle(self, spec: RelationSpec, from_id: int, to_id: int | None = None) -> ShardHandle:
        """The shard handle of ``from_id``'s list, both IDs checked against the relation's types."""
        return self._side(spec, from_id, to_id)

    def clock_us(self) -> int:
        """Now, in microseconds: a link's sequence when none is given."""
        return self._clock_us()

    def sides(
        self, spec: RelationSpec, from_id: int, to_id: int, *, guarded: bool
    ) -> tuple[Side, Side | None]:
        """The pair's (primary side, inverse side or None), routed and type-checked (``guarded``: with
        the object rows a link reads)."""
        return self._sides(spec, from_id, to_id, guarded=guarded)

    def sides_many(
        self, spec: RelationSpec, pairs: Sequence[tuple[int, int]], *, guarded: bool
    ) -> list[tuple[Side, Side | None]]:
        """`sides` of each pair, each ID routed once, its shard handle and guard made once (a batch
        names one board a hundred times)."""
        router = self._router
        inverse = None if spec.inverse is None else router.relation(spec.inverse)
        if inverse is None:
            out: list[tuple[Side, Side | None]] = []
            for from_id, to_id in pairs:
                shard, _t, _key, host = router.route(from_id, spec.from_type)
                router.route(to_id, spec.to_type)  # (None too: it is no ID)
                out.append((Side(self._shard(shard, host), spec.name, from_id, to_id), None))
            return out
        # Each ID's (shard handle, guard), by the end of the pair it is at (its type is that end's).
        froms: dict[int, tuple[ShardHandle, Guard | None]] = {}
        tos: dict[int, tuple[ShardHandle, Guard | None]] = {}
        handles: dict[tuple[int, str], ShardHandle] = {}  # (shard, host): each handle looked up once
        name, other, from_type, to_type = spec.name, inverse.name, spec.from_type, inverse.from_type
        primary = spec.primary
        new = _new_tuple  # (a Side made without its ``__new__``'s Python frame: a call makes two a pair)
        out = []
        for from_id, to_id in pairs:
            here = froms.get(from_id)
            if here is None:
                here = froms[from_id] = self._end(from_id, from_type, guarded, handles)
            there = tos.get(to_id)
            if there is None:
                there = tos[to_id] = self._end(to_id, to_type, guarded, handles)
            side = new(Side, (here[0], name, from_id, to_id, here[1]))
            far = new(Side, (there[0], other, to_id, from_id, there[1]))
            out.append((side, far) if primary else (far, side))
        return out

    def _end(
        self, id_: int, type_name: str, guarded: bool, handles: dict[tuple[int, str], ShardHandle]
    ) -> tuple[ShardHandle, Guard | None]:
        """The shard handle of ``id_`` (of type ``type_name``; ``handles``: those looked up so far),
        and its guard if ``guarded``."""
        shard, t, key, host = self._router.route(id_, type_name)
        h = handles.get((shard, host))
        if h is None:
            h = handles[(shard, host)] = self._shard(shard, host)
        if not guarded:
            return h, None
        return h, _new_tuple(Guard, (f"{type_name} {id_}", t.table, self._object_key, key))

    def apply_changes(self, changes: Sequence[Change]) -> None:
        """Update the cached lists in place with committed pair ``changes``, in their order."""
        self._apply(changes)

    def list_key(self, relation: str, from_id: int) -> str:
        """The cache key of ``from_id``'s ``relation`` list."""
        return list_key(self._prefix, relation, from_id)

    def invalidate(self, pairs: Sequence[tuple[str, int]]) -> None:
        """Drop the cached lists of (relation, from_id) after a committed write."""
        if self.list_cache is not None:
            self.list_cache.invalidate(pairs)

    # -- validation ----------------------------------------------------------

    def _side(self, spec: RelationSpec, from_id: int, to_id: int | None) -> ShardHandle:
        shard, _t, _l, host = self._router.route(from_id, spec.from_type)
        if to_id is not None:
            self._router.route(to_id, spec.to_type)
        return self._shard(shard, host)

    def check_limit(self, limit: int) -> int:
        """``limit`` if it is a page size this store accepts, else `LimitError`."""
        cap = self._router.config.max_page
        if type(limit) is not int or not 1 <= limit <= cap:
            raise LimitError(f"limit must be an int in 1..{cap} (limits.max_page), got {brief(limit)}")
        return limit

    @staticmethod
    def check_order(newest_first: bool) -> None:
        """`LimitError` unless ``newest_first`` is True or False (a string "false" is not False)."""
        if newest_first is not True and newest_first is not False:
            raise LimitError(f"newest_first must be True or False, got {brief(newest_first)}")

    @staticmethod
    def check_range(since: int | None, until: int | None) -> None:
        """`LimitError` unless ``since`` and ``until`` are None or 64-bit signed ints, since <= until."""
        if since is None and until is None:
            return
        for name, value in (("since", since), ("until", until)):
            if value is not None and (type(value) is not int or not _SEQ_MIN <= value <= _SEQ_MAX):
                raise LimitError(
                    f"{name} must be None or a 64-bit signed int (a sequence), got {brief(value)}"
                )
        if since is not None and until is not None and since > until:
            raise LimitError(
                f"since ({since}) is after until ({until}): since is inclusive, until exclusive, "
                "so since <= until"
            )

    def decode_cursor(
        self,
        cursor: str,
        relation: str,
        from_id: int,
        newest_first: bool,
        *,
        since: int | None = None,
        until: int | None = None,
    ) -> tuple[int, int]:
        """`store.cursors.decode_cursor` with this store's ``max_cursor_bytes`` and ``cursor_secret``."""
        return decode_cursor(
            cursor,
            relation,
            from_id,
            newest_first,
            since=since,
            until=until,
            max_bytes=self._router.config.max_cursor_bytes,
            key=self._router.config.cursor_secret,
        )

    def encode_cursor(
        self,
        relation: str,
        from_id: int,
        newest_first: bool,
        sequence: int,
        to_id: int,
        *,
        since: int | None = None,
        until: int | None = None,
    ) -> str:
        """The cursor of a page that ends at ``(sequence, to_id)``, signed if the config has a secret."""
        return encode_cursor(
            relation,
            from_id,
            newest_first,
            sequence,
            to_id,
            since=since,
            until=until,
            key=self._router.config.cursor_secret,
        )

    # -- writes --------------------------------------------------------------

    def link(self, relation: str, from_id: int, to_id: int, *, sequence: int | None = None) -> bool:
        """Add the pair (and its inverse); True if the pair is new. One step: the pair protocol's write."""
        spec = self._router.relation(relation)
        if sequence is not None and (type(sequence) is not int or not _SEQ_MIN <= sequence <= _SEQ_MAX):
            raise DataError(f"sequence must be a 64-bit signed int, got {brief(sequence)}")
        routed_by = self._router.shard_map.version
        sides = self._sides(spec, from_id, to_id, guarded=True)  # bad input raises before any I/O
        seq = self._clock_us() if sequence is None else sequence
        move = sequence is not None
        tries = 0

        def write() -> bool:
            nonlocal tries
            # On the masters of the map current now: as routed above the first time, unless the
            # map changed since (the step judges a refusal against the map it began with).
            fresh = tries == 0 and self._router.shard_map.version == routed_by
            primary, inverse = sides if fresh else self._on_masters(sides)
            tries += 1
            return self._written(
                primary,
                inverse,
                lambda changes: self.pairs.link(primary, inverse, seq, move=move, changes=changes),
            )

        return self.steps("link", write)

    def unlink(self, relation: str, from_id: int, to_id: int) -> bool:
        """Remove the pair (and its inverse); True if it was there. One step, as `link`."""
        spec = self._router.relation(relation)
        routed_by = self._router.shard_map.version
        sides = self._sides(spec, from_id, to_id, guarded=False)
        tries = 0

        def write() -> bool:
            nonlocal tries
            fresh = tries == 0 and self._router.shard_map.version == routed_by
            primary, inverse = sides if fresh else self._on_masters(sides)
            tries += 1
            return self._unlink(primary, inverse)

        return self.steps("unlink", write)

    def _on_masters(self, sides: tuple[Side, Side | None]) -> tuple[Side, Side | None]:
        """``sides``, each on its shard's master by the map current now (a write runs again after a
        reroute: the IDs' shards stay, their hosts may not)."""
        master = self._router.shard_map.master
        moved = []
        for side in sides:
            if side is not None and master(side.h.shard) != side.h.host:
                side = side._replace(h=self._shard(side.h.shard, master(side.h.shard)))
            moved.append(side)
        primary, inverse = moved
        assert primary is not None
        return primary, inverse

    def _unlink(self, primary: Side, inverse: Side | None) -> bool:
        """Remove the pair by the pair protocol (`PairWriter.unlink`), then update the cached lists."""
        return self._written(
            primary, inverse, lambda changes: self.pairs.unlink(primary, inverse, changes=changes)
        )

    def _written(
        self,
        primary: Side,
        inverse: Side | None,
        write: Callable[[list[Change]], bool],
    ) -> bool:
        """Run a pair write, then update (or drop) the cached lists whose rows it changed.

        Commit first, then change the cache, only where rows changed (a
        re-link of a pair in place leaves the cached lists alone): each list
        in place, in its version order (`ListCache.apply`); after a failure
        drop both, since a side may have committed before it.
        """
        changes: list[Change] = []
        try:
            result = write(changes)
        except BaseException:
            self._invalidate_sides(primary, inverse)
            raise
        self._apply(changes)
        return result

    def _apply(self, changes: Sequence[Change]) -> None:
        """Update the cached lists in place with committed ``changes`` (in their order)."""
        if self.list_cache is not None:
            self.list_cache.apply(changes)

    def sync(self, relation: str, from_id: int, to_id: int) -> bool:
        """Make the inverse row of a pair match its primary row (the repair job's fix); True if it changed."""
        spec = self._router.relation(relation)

        def fix() -> bool:
            primary, inverse = self._sides(spec, from_id, to_id, guarded=False)
            if inverse is None:
                return False
            try:
                return self.pairs.sync(primary, inverse)
            finally:
                self._invalidate_sides(primary, inverse)

        return self.steps("sync", fix)

    def _sides(
        self, spec: RelationSpec, from_id: int, to_id: int, *, guarded: bool
    ) -> tuple[Side, Side | None]:
        """(primary side, inverse side or None), routed and type-checked, primary first; ``guarded``:
        with the object rows a link reads. Each ID is routed once, for its shard and its row alike."""
        if spec.inverse is None:
            shard, _t, _key, host = self._router.route(from_id, spec.from_type)
            self._router.route(to_id, spec.to_type)  # (None too: it is no ID)
            return Side(self._shard(shard, host), spec.name, from_id, to_id), None
        inverse = self._router.relation(spec.inverse)  # (its from type is this one's to type)
        # Inline, not by `_end`: each ID is routed, and its side made, here.
        route = self._router.route
        shard, t, key, host = route(from_id, spec.from_type)
        far_shard, far_t, far_key, far_host = route(to_id, inverse.from_type)
        mine = theirs = None
        if guarded:
            mine = Guard(f"{spec.from_type} {from_id}", t.table, self._object_key, key)
            theirs = Guard(f"{inverse.from_type} {to_id}", far_t.table, self._object_key, far_key)
        side = Side(self._shard(shard, host), spec.name, from_id, to_id, mine)
        far = Side(self._shard(far_shard, far_host), inverse.name, to_id, from_id, theirs)
        return (side, far) if spec.primary else (far, side)

    def _invalidate_sides(self, primary: Side, inverse: Side | None) -> None:
        sides = [primary] if inverse is None else [primary, inverse]
        self.invalidate([(s.relation, s.from_id) for s in sides])

    # -- reads ---------------------------------------------------------------

    def links(
        self, relation: str, from_id: int, *, limit: int = 50, offset: int = 0, newest_first: bool = False
    ) -> list[int]:
        """``to_id``s in sequence order: ``ORDER BY sequence LIMIT limit OFFSET offset``."""
        spec = self._router.relation(relation)
        self.check_limit(limit)
        self.check_order(newest_first)
        if type(offset) is not int or not 0 <= offset <= _SEQ_MAX:
            raise LimitError(
                f"offset must be an int in 0..{_SEQ_MAX}, got {brief(offset)}; "
                "for deep pages use page() with a cursor"
            )
        h = self._side(spec, from_id, None)
        if self.list_cache is not None:
            op = ("rank", offset, offset + limit - 1, newest_first)
            rows = self.list_cache.rows(h, relation, from_id, op, offset + limit, newest_first)
            if rows is not None:
                return [t for _s, t in rows]
        return self.repo.list_ids(h, relation, from_id, limit, offset, newest_first)

    def page(
        self,
        relation: str,
        from_id: int,
        *,
        limit: int = 50,
        cursor: str | None = None,
        newest_first: bool = False,
        since: int | None = None,
        until: int | None = None,
    ) -> Page:
        """One keyset page; pass ``next_cursor`` back for the next one.

        ``since`` (inclusive) and ``until`` (exclusive) keep the page to
        entries whose sequence lies in that range; the cursor carries the range.
        """
        spec = self._router.relation(relation)
        self.check_limit(limit)
        self.check_order(newest_first)
        self.check_range(since, until)
        h = self._side(spec, from_id, None)
        after = None
        if cursor is not None:
            after = self.decode_cursor(cursor, relation, from_id, newest_first, since=since, until=until)
        rows, more = self.rows_after(
            relation, from_id, after, limit, newest_first=newest_first, since=since, until=until, h=h
        )
        next_cursor = None
        if more:
            seq, last = rows[-1]
            next_cursor = self.encode_cursor(
                relation, from_id, newest_first, seq, last, since=since, until=until
            )
        return Page([t for _s, t in rows], next_cursor)

    def rows_after(
        self,
        relation: str,
        from_id: int,
        after: tuple[int, int] | None,
        limit: int,
        *,
        newest_first: bool = False,
        since: int | None = None,
        until: int | None = None,
        h: ShardHandle | None = None,
    ) -> tuple[list[tuple[int, int]], bool]:
        """Up to ``limit`` (sequence, to_id) entries after the key ``after``, and whether more follow.

        With ``since``/``until``, only entries with since <= sequence < until (checked by the caller).
        ``h``: the list's shard, where the caller has routed ``from_id`` already.
        """
        if h is None:
            h = self._side(self._router.relation(relation), from_id, None)
        if since is not None or until is not None:
            return self._rows_in_range(h, relation, from_id, after, limit, newest_first, since, until)
        rows = None
        if self.list_cache is not None:
            if after is None:
                op: tuple[object, ...] = ("rank", 0, limit, newest_first)
            else:
                op = ("after", encode_member(*after), limit + 1, newest_first)
            rows = self.list_cache.rows(h, relation, from_id, op, limit + 1, newest_first, after=after)
        if rows is None:
            rows = self.repo.page(h, relation, from_id, limit + 1, after, newest_first)
        return rows[:limit], len(rows) > limit

    def _rows_in_range(
        self,
        h: ShardHandle,
        relation: str,
        from_id: int,
        after: tuple[int, int] | None,
        limit: int,
        newest_first: bool,
        since: int | None,
        until: int | None,
    ) -> tuple[list[tuple[int, int]], bool]:
        """`rows_after` within since <= sequence < until: the cached head if it holds them, else the index."""
        if until is not None and until <= (_SEQ_MIN if since is None else since):
            return [], False  # an empty range
        rows = None
        if self.list_cache is not None:
            rows = self.list_cache.rows_in_range(
                h, relation, from_id, after, limit + 1, newest_first, since, until
            )
        if rows is None:
            span = (_SEQ_MIN if since is None else since, _SEQ_MAX if until is None else until - 1)
            rows = self.repo.page_range(h, relation, from_id, span, limit + 1, after, newest_first)
        return rows[:limit], len(rows) > limit

    def has_link(self, relation: str, from_id: int, to_id: int) -> bool:
        """Whether the pair exists: one primary-key read on ``from_id``'s shard."""
        spec = self._router.relation(relation)
        h = self._side(spec, from_id, None)
        self._router.route(to_id, spec.to_type)  # (None too: it is no ID)
        return self.repo.sequence_of(h, relation, from_id, to_id) is not None

    def count(self, relation: str, from_id: int) -> int:
        """How many pairs start at ``from_id`` (kept exact, no scan)."""
        spec = self._router.relation(relation)
        h = self._side(spec, from_id, None)
        if self.list_cache is not None:
            n = self.list_cache.count(h, relation, from_id)
            if n is not None:
                return n
        return self.repo.count(h, relation, from_id)
