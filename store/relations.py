"""Ordered relations: from/to lists kept in sequence order, with exact counts.

A relation is a one-directional table on the shard of its ``from`` object
(``board_has_pins`` lives with the board). Each shard also keeps
``relation_counts``, updated in the same transaction as every link and
unlink, so `count` is one primary-key read and always exact.

Inverse pairs cross shards and no transaction covers both sides. The primary
side (the relation declared with ``inverse:``) is written first: a crash
between the two writes leaves either an inverse row missing (after a link)
or an inverse row too many (after an unlink), and `store.admin.repair`
makes the inverse side match the primary again.

`RelationRepository` runs SQL on one shard; `RelationService` validates,
routes and orders the two sides. Reads of many lists at once (membership
checks, the first pages of many lists) are in `store.relation_reads`.
"""

from __future__ import annotations

import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from store.backends.statements import (
    GuardedInsertStatements,
    PairRowsStatements,
    RelationStatements,
    expand_rows,
    with_part,
)
from store.cache.follower import log_entries
from store.cache.lists import ListCache, decode_members, encode_member, lex_bound
from store.cursors import decode_cursor, encode_cursor
from store.engines import Cursor, ShardHandle
from store.exceptions import DataError, LimitError, brief
from store.pairs import ADD, MOVE, REMOVE, Change, Guard, PairWriter, Seen, Side, make_guard, make_side
from store.routing import Router
from store.specs import RelationSpec
from store.steps import Steps

__all__ = ["Page", "RelationRepository", "RelationService", "fill_size"]

_SEQ_MIN, _SEQ_MAX = -(1 << 63), (1 << 63) - 1
#: A list fill reads at least this many entries (up to ``cache.list_entries``), or twice
#: what the read asked for: a first page's fill serves the next page too, and a fill never
#: reads a thousand rows to answer for fifty. (Every row read costs the client its parse:
#: under a mix of writes, where hot lists are dropped and filled again all the time, four
#: times the page cost more than the pages it saved.)
MIN_FILL = 100
#: Pairs of a deleted object's list read (and removed) per round.
REMOVE_CHUNK = 200
#: Multi-row pair statement texts kept (`RelationRepository.rows_sql`), each for one shard and row count.
_ROW_TEXTS = 512


def fill_size(entries: int, want: int) -> int:
    """How many entries a list fill reads for a read of ``want``: see `MIN_FILL`."""
    return min(entries, max(MIN_FILL, 2 * want))


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a relation list: IDs in order, and the cursor of the next page.

    ``next_cursor`` is None on the last page. `Store.page_objects` and
    `Store.pages_objects_many` (so `Store.board_pins` and `Store.board_pins_many`)
    also fill ``objects``, aligned with ``ids`` (IDs whose object is gone are left out).
    """

    ids: list[int]
    next_cursor: str | None
    objects: list[dict[str, Any]] = field(default_factory=list)


class Plan:
    """Pair writes as statements for one request (`RelationRepository.link_plan`): each write is
    followed by its count, which runs only if the write changed the row (`Backend.conditional_writes`)."""

    __slots__ = ("kinds", "statements")

    def __init__(self) -> None:
        self.kinds: list[str] = []
        self.statements: list[tuple[str, Any]] = []

    def add(self, kind: str, write: tuple[str, Any], count: tuple[str, Any]) -> None:
        """A write of ``kind`` (`store.pairs.ADD`, `MOVE`, `REMOVE`) and its conditional count."""
        self.kinds.append(kind)
        self.statements += [write, count]

    def outcome(self, results: Sequence[tuple[int, int]], seen: Seen = None) -> str | None:
        """The kind of the first write that changed its row, or None; from the statements'
        (rowcount, lastrowid). ``seen`` is told the list version its count returned."""
        for i, kind in enumerate(self.kinds):
            if results[2 * i][0] == 1:
                if seen is not None:
                    seen(results[2 * i + 1][1])
                return kind
        return None


class RelationRepository:
    """Pairs of one relation on one shard: add, remove, list, page, count."""

    def __init__(self) -> None:
        self._stmts: dict[tuple[str, str], RelationStatements] = {}
        self._sql: dict[tuple[str, int, str], SimpleNamespace] = {}
        self._guarded: dict[tuple[str, int, str, str, str, str], str] = {}
        self._guarded_stmts: dict[tuple[str, str, str, str], GuardedInsertStatements] = {}
        self._heads: dict[tuple[str, int, str, bool], str] = {}
        self._rows: dict[tuple[str, str, str | None, str | None], PairRowsStatements] = {}
        #: `rows_sql`'s texts made for a number of rows on a shard, the last `_ROW_TEXTS` of them.
        self._row_texts: dict[tuple[tuple[str, str, str | None, str | None], int, str, int], str] = {}

    def statements(self, h: ShardHandle, relation: str) -> RelationStatements:
        """The compiled statements of ``relation`` on ``h``'s backend."""
        key = (h.backend.name, relation)
        stmts = self._stmts.get(key)
        if stmts is None:
            stmts = self._stmts[key] = RelationStatements(h.backend, relation)
        return stmts

    def sql(self, h: ShardHandle, relation: str) -> SimpleNamespace:
        """The statements for ``relation`` on ``h``'s shard, as attributes (see `RelationStatements`)."""
        key = (h.host, h.shard, relation)
        sql = self._sql.get(key)
        if sql is None:
            sql = self._sql[key] = SimpleNamespace(**self.statements(h, relation).for_shard(h.shard))
        return sql

    # -- writes, inside a transaction the caller runs (see store.pairs) ------

    def add_in(
        self, cur: Cursor, side: Side, sequence: int, *, move: bool, seen: Seen = None
    ) -> tuple[bool, int]:
        """Insert the pair, or move it to ``sequence`` if ``move``; (new, the sequence it now has).

        The insert locks the pair's key whether the row was there or not.
        ``seen`` is told the list's new version (`RelationStatements`: count_up, bump).
        """
        sql = self.sql(side.h, side.relation)
        cur.execute(sql.insert, (side.from_id, side.to_id, sequence))
        if cur.rowcount == 1:
            cur.defer(sql.count_up, (side.relation, side.from_id, 1), seen)
            return True, sequence
        if move:
            cur.execute(sql.move, (sequence, side.from_id, side.to_id))
            cur.defer(sql.bump, (side.relation, side.from_id), seen)
            return False, sequence
        cur.execute(sql.exists, (side.from_id, side.to_id))
        row = cur.fetchone()
        return False, sequence if row is None else int(row[0])

    def insert_live_in(self, cur: Cursor, side: Side, sequence: int, seen: Seen = None) -> bool:
        """Insert the pair if it is absent and its guard's object is live, in one statement; True if it did.

        False says only that nothing was inserted: the pair exists, or the
        object is not live (the caller asks which, the slow way).
        """
        g = side.guard
        assert g is not None
        cur.execute(self._guarded_sql(side, "insert_live"), (side.from_id, side.to_id, sequence, g.value))
        if cur.rowcount != 1:
            return False
        cur.defer(self.sql(side.h, side.relation).count_up, (side.relation, side.from_id, 1), seen)
        return True

    def _guarded_sql(self, side: Side, name: str) -> str:
        """Statement ``name`` of `GuardedInsertStatements` for ``side``'s shard and guard."""
        g = side.guard
        assert g is not None
        h = side.h
        key = (h.backend.name, h.shard, side.relation, g.table, g.key, name)
        sql = self._guarded.get(key)
        if sql is None:
            kind = (h.backend.name, side.relation, g.table, g.key)
            stmts = self._guarded_stmts.get(kind)
            if stmts is None:  # compiled once per backend, not per shard
                ids = "instagram" if g.key == "id" else "pinterest"
                stmts = self._guarded_stmts[kind] = GuardedInsertStatements(
                    h.backend, side.relation, g.table, ids=ids
                )
            sql = self._guarded[key] = stmts.for_shard(h.shard)[name]
        return sql

    def rows_sql(self, side: Side, name: str, n: int) -> str:
        """`PairRowsStatements` statement ``name`` for ``n`` rows on ``side``'s shard (its relation,
        and its guard's object table for ``live``)."""
        h, g = side.h, side.guard
        kind = (h.backend.name, side.relation, None if g is None else g.table, None if g is None else g.key)
        made = (kind, h.shard, name, n)
        text = self._row_texts.get(made)
        if text is not None:
            return text
        stmts = self._rows.get(kind)
        if stmts is None:  # compiled once per backend, not per shard
            ids = "instagram" if g is not None and g.key == "id" else "pinterest"
            stmts = self._rows[kind] = PairRowsStatements(h.backend, side.relation, kind[2], ids=ids)
        text = expand_rows(stmts.for_shard(h.shard)[name], stmts.row(name), n)
        if len(self._row_texts) >= _ROW_TEXTS:
            self._row_texts.clear()  # (a bound on what is kept: batch sizes and shards vary)
        self._row_texts[made] = text
        return text

    def link_plan(self, side: Side, sequence: int, *, move: bool, insert: bool) -> Plan:
        """`link_in` as statements for one request, where `Backend.conditional_writes`: the move
        (if ``move``), then the guarded insert (if ``insert``), each followed by its count, which
        runs only if it changed the row. `Plan.outcome` reads what they did."""
        sql = self.sql(side.h, side.relation)
        f, t = side.from_id, side.to_id
        plan = Plan()
        if move:
            plan.add(MOVE, (sql.move_if_other, (sequence, f, t, sequence)), (sql.bump_if, (side.relation, f)))
        if insert:
            g = side.guard
            assert g is not None
            live = (self._guarded_sql(side, "insert_live"), (f, t, sequence, g.value))
            plan.add(ADD, live, (sql.count_up_if, (side.relation, f, 1)))
        return plan

    def unlink_plan(self, side: Side) -> Plan:
        """`remove_in` as statements for one request, where `Backend.conditional_writes`."""
        sql = self.sql(side.h, side.relation)
        plan = Plan()
        plan.add(
            REMOVE,
            (sql.delete, (side.from_id, side.to_id)),
            (sql.count_down_if, (side.relation, side.from_id)),
        )
        return plan

    def link_in(
        self, cur: Cursor, side: Side, sequence: int, *, move: bool, insert: bool, seen: Seen = None
    ) -> str | None:
        """Move the pair to ``sequence`` if ``move``; if that found nothing to move and ``insert``,
        insert it if it is absent and its guard's object is live. `store.pairs.MOVE`, `ADD`, or
        None if neither changed the row (the pair is at ``sequence`` already, or absent and not
        insertable: the caller asks which, the slow way). One request where the backend can."""
        if side.h.backend.conditional_writes:
            plan = self.link_plan(side, sequence, move=move, insert=insert)
            return plan.outcome(cur.batch(plan.statements), seen)
        if move and self.move_in(cur, side, sequence, seen):
            return MOVE
        if insert and self.insert_live_in(cur, side, sequence, seen):
            return ADD
        return None

    def move_in(self, cur: Cursor, side: Side, sequence: int, seen: Seen = None) -> bool:
        """Move an existing pair to ``sequence``; True if it existed at another sequence (and moved)."""
        sql = self.sql(side.h, side.relation)
        cur.execute(sql.move_if_other, (sequence, side.from_id, side.to_id, sequence))
        if cur.rowcount == 1:
            cur.defer(sql.bump, (side.relation, side.from_id), seen)
            return True
        return False

    def remove_in(self, cur: Cursor, side: Side, seen: Seen = None) -> bool:
        """Delete the pair (and count it out); True if it was there."""
        if side.h.backend.conditional_writes:
            plan = self.unlink_plan(side)
            return plan.outcome(cur.batch(plan.statements), seen) is not None
        sql = self.sql(side.h, side.relation)
        cur.execute(sql.delete, (side.from_id, side.to_id))
        if cur.rowcount:
            cur.defer(sql.count_down, (side.relation, side.from_id), seen)
            return True
        return False

    def set_in(self, cur: Cursor, side: Side, state: tuple[bool, int], seen: Seen = None) -> str | None:
        """Make the row present at a sequence, or absent, as ``state`` says; how it changed
        (`store.pairs.ADD`, `MOVE`, `REMOVE`), or None if it was so already."""
        present, sequence = state
        if not present:
            return REMOVE if self.remove_in(cur, side, seen) else None
        sql = self.sql(side.h, side.relation)
        cur.execute(sql.insert, (side.from_id, side.to_id, sequence))
        if cur.rowcount == 1:
            cur.defer(sql.count_up, (side.relation, side.from_id, 1), seen)
            return ADD
        return MOVE if self.move_in(cur, side, sequence, seen) else None

    def locked_sequence(self, cur: Cursor, side: Side) -> int | None:
        """The pair's sequence, locking its key (the row, or the gap where it would be)."""
        cur.execute(self.sql(side.h, side.relation).exists_locked, (side.from_id, side.to_id))
        row = cur.fetchone()
        return None if row is None else int(row[0])

    def remove(self, h: ShardHandle, relation: str, from_id: int, to_id: int) -> bool:
        """Delete one row in a transaction of its own (a relation without an inverse)."""
        return h.transaction(lambda cur: self.remove_in(cur, Side(h, relation, from_id, to_id)))

    def sequence_of(self, h: ShardHandle, relation: str, from_id: int, to_id: int) -> int | None:
        """The pair's sequence, or None if the pair is absent."""
        row = h.read(self.sql(h, relation).exists, (from_id, to_id), one=True)
        return None if row is None else int(row[0])

    def list_ids(
        self, h: ShardHandle, relation: str, from_id: int, limit: int, offset: int, newest_first: bool
    ) -> list[int]:
        """``to_id``s by sequence (ties by to_id), ``LIMIT limit OFFSET offset``."""
        sql = self.sql(h, relation)
        name = "list_desc" if newest_first else "list_asc"
        given = {"f": from_id, "lim": limit, "off": offset}
        args = tuple(given[p] for p in self.statements(h, relation).orders[name])
        return [int(r[0]) for r in h.read(getattr(sql, name), args, one=False)]

    def page(
        self,
        h: ShardHandle,
        relation: str,
        from_id: int,
        limit: int,
        after: tuple[int, int] | None,
        newest_first: bool,
    ) -> list[tuple[int, int]]:
        """Up to ``limit`` (sequence, to_id) rows after the key ``after``, in list order."""
        sql = self.sql(h, relation)
        if after is None:
            query = sql.page_desc if newest_first else sql.page_asc
            params: tuple[int, ...] = (from_id, limit)
        else:
            query = sql.page_desc_after if newest_first else sql.page_asc_after
            params = (from_id, after[0], after[0], after[1], limit)
        return _rows(h.read(query, params, one=False))

    def first_pages(
        self, h: ShardHandle, relations: Sequence[str], from_id: int, limit: int
    ) -> list[list[tuple[int, int]]]:
        """The first ``limit`` (sequence, to_id) rows of ``from_id``'s list in each of ``relations``
        (all on ``h``'s shard), in list order: one query for all of them."""
        parts = [with_part(self.sql(h, relation).part_page_asc, i) for i, relation in enumerate(relations)]
        params = [x for _r in relations for x in (from_id, limit)]
        out: list[list[tuple[int, int]]] = [[] for _r in relations]
        for part, seq, to_id in h.read(" UNION ALL ".join(parts), params, one=False):
            out[int(part)].append((int(seq), int(to_id)))
        for rows in out:
            rows.sort()  # UNION ALL keeps no order across the parts' rows
        return out

    def page_range(
        self,
        h: ShardHandle,
        relation: str,
        from_id: int,
        span: tuple[int, int],
        limit: int,
        after: tuple[int, int] | None,
        newest_first: bool,
    ) -> list[tuple[int, int]]:
        """`page` within ``span`` = (low, high): entries with low <= sequence <= high."""
        sql = self.sql(h, relation)
        low, high = span
        if after is None:
            query = sql.page_desc_range if newest_first else sql.page_asc_range
            params: tuple[int, ...] = (from_id, low, high, limit)
        else:
            query = sql.page_desc_range_after if newest_first else sql.page_asc_range_after
            params = (from_id, low, high, after[0], after[0], after[1], limit)
        return _rows(h.read(query, params, one=False))

    def head_and_count(
        self, h: ShardHandle, relation: str, from_id: int, limit: int, newest: bool = False
    ) -> tuple[int, list[tuple[int, int]], bytes | None, int]:
        """The kept count, the first ``limit`` (sequence, to_id) rows (the last, if ``newest``; in
        list order either way) and the list's version, in one statement.

        One round trip, and one snapshot: the count, the rows and the version
        agree. On MariaDB/MySQL the rows come packed in one value
        (``head_packed``), returned too (the list cache's members as they
        are), else None; elsewhere the version is 0 (not known).
        """
        sql = self.sql(h, relation)
        packed_sql = getattr(sql, "head_packed_desc" if newest else "head_packed", None)
        if packed_sql is not None:
            row = h.read(packed_sql, (relation, from_id, from_id, limit), one=True)
            n = version = 0
            if row is not None and row[0] is not None:
                kept = row[0].decode() if isinstance(row[0], (bytes, bytearray)) else str(row[0])
                count, _colon, at = kept.partition(":")
                n, version = int(count), int(at or 0)
            packed = b"" if row is None or row[1] is None else bytes(row[1])
            got, odd = divmod(len(packed), 16)
            # Fewer entries than the list holds, up to the limit: cut short (group_concat_max_len).
            if not odd and got <= limit and (got == limit or got >= n):
                return n, decode_members([packed]), packed, version
        key = (h.host, h.shard, relation, newest)
        query = self._heads.get(key)
        if query is None:
            page = with_part(sql.part_page_desc if newest else sql.part_page_asc, 0)
            count = with_part(sql.part_count, 1)
            query = self._heads[key] = f"{page} UNION ALL {count}"
        n = 0
        head: list[tuple[int, int]] = []
        for part, a, b in h.read(query, (from_id, limit, relation, from_id), one=False):
            if int(part) == 1:
                n = int(a)
            else:
                head.append((int(a), int(b)))
        head.sort()  # UNION ALL promises no order
        return n, head, None, 0

    def count(self, h: ShardHandle, relation: str, from_id: int) -> int:
        """The kept count of pairs from ``from_id``."""
        row = h.read(self.sql(h, relation).count, (relation, from_id), one=True)
        return 0 if row is None else int(row[0])

    # -- for repair: scans and checks, never on the request path ------------

    def scan(
        self, h: ShardHandle, relation: str, after: tuple[int, int] | None, limit: int
    ) -> list[tuple[int, int, int]]:
        """Up to ``limit`` (from_id, to_id, sequence) rows in key order after ``after``."""
        sql = self.sql(h, relation)
        if after is None:
            rows = h.read(sql.scan, (limit,), one=False)
        else:
            rows = h.read(sql.scan_after, (after[0], after[0], after[1], limit), one=False)
        return [(int(f), int(t), int(q)) for f, t, q in rows]

    def present(
        self, h: ShardHandle, relation: str, pairs: Sequence[tuple[int, int]]
    ) -> set[tuple[int, int]]:
        """Which of ``pairs`` (from_id, to_id) exist on ``h``'s shard."""
        if not pairs:
            return set()
        froms = sorted({f for f, _t in pairs})
        tos = sorted({t for _f, t in pairs})
        b = h.backend
        query = (
            f"SELECT from_id, to_id FROM {h.table(relation)} "
            f"WHERE from_id IN ({b.params(len(froms))}) AND to_id IN ({b.params(len(tos))})"
        )
        wanted = set(pairs)
        return {(int(f), int(t)) for f, t in h.read(query, [*froms, *tos], one=False)} & wanted

    def count_mismatches(self, h: ShardHandle, relation: str) -> list[tuple[int, int, int]]:
        """(from_id, kept, actual) wherever the kept count differs from the rows."""
        sql = self.sql(h, relation)
        kept = {int(f): int(n) for f, n in h.read(sql.counts_kept, (relation,), one=False)}
        actual = {int(f): int(n) for f, n in h.read(sql.counts_actual, (), one=False)}
        return [
            (f, kept.get(f, 0), actual.get(f, 0))
            for f in sorted(kept.keys() | actual.keys())
            if kept.get(f, 0) != actual.get(f, 0)
        ]

    def recount(self, h: ShardHandle, relation: str, from_id: int) -> int:
        """Set the kept count of ``from_id`` to its rows, under lock; return it."""
        sql = self.sql(h, relation)
        counted = 0

        def txn(cur: Any) -> bool:
            nonlocal counted
            cur.execute(sql.lock_count, (from_id,))
            counted = int(cur.fetchone()[0])
            cur.execute(sql.count_set, (relation, from_id, counted))
            return True

        h.transaction(txn)
        return counted


class RelationService:
    """Validated, routed relation calls; pair writes go by the protocol of `store.pairs`."""

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
        self.pairs = PairWriter(self.repo)
        if lists is not None:
            # Where the host logs writes, a side's list goes in the log with its COMMIT.
            self.pairs.log = lambda side: log_entries(lists=[self.list_key(side.relation, side.from_id)])
        self._object_key = "id" if router.config.ids == "instagram" else "local_id"

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
        name, other, from_type, to_type = spec.name, inverse.name, spec.from_type, inverse.from_type
        primary = spec.primary
        out = []
        for from_id, to_id in pairs:
            here = froms.get(from_id)
            if here is None:
                here = froms[from_id] = self._end(from_id, from_type, guarded=guarded)
            there = tos.get(to_id)
            if there is None:
                there = tos[to_id] = self._end(to_id, to_type, guarded=guarded)
            side = make_side(here[0], name, from_id, to_id, here[1])
            far = make_side(there[0], other, to_id, from_id, there[1])
            out.append((side, far) if primary else (far, side))
        return out

    def _end(self, id_: int, type_name: str, *, guarded: bool) -> tuple[ShardHandle, Guard | None]:
        """The shard handle of ``id_`` (of type ``type_name``), and its guard if ``guarded``."""
        shard, t, key, host = self._router.route(id_, type_name)
        guard = make_guard(f"{type_name} {id_}", t.table, self._object_key, key) if guarded else None
        return self._shard(shard, host), guard

    def apply_changes(self, changes: Sequence[Change]) -> None:
        """Update the cached lists in place with committed pair ``changes``, in their order."""
        self._apply(changes)

    def list_key(self, relation: str, from_id: int) -> str:
        """The cache key of ``from_id``'s ``relation`` list."""
        return f"{self._prefix}l:{relation}:{from_id}"

    def invalidate(self, pairs: Sequence[tuple[str, int]]) -> None:
        """Drop the cached lists of (relation, from_id) after a committed write."""
        if self.lists is not None and pairs:
            self.lists.invalidate([self.list_key(r, f) for r, f in pairs])

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
        first = [self._sides(spec, from_id, to_id, guarded=True)]  # bad input raises before any I/O
        seq = self._clock_us() if sequence is None else sequence
        move = sequence is not None

        def write() -> bool:
            # Routed as the map is now: again after a reroute (the first time, as routed above).
            primary, inverse = first.pop() if first else self._sides(spec, from_id, to_id, guarded=True)
            return self._written(
                primary,
                inverse,
                lambda changes: self.pairs.link(primary, inverse, seq, move=move, changes=changes),
            )

        return self.steps("link", write)

    def unlink(self, relation: str, from_id: int, to_id: int) -> bool:
        """Remove the pair (and its inverse); True if it was there. One step, as `link`."""
        spec = self._router.relation(relation)
        first = [self._sides(spec, from_id, to_id, guarded=False)]

        def write() -> bool:
            return self._unlink(*(first.pop() if first else self._sides(spec, from_id, to_id, guarded=False)))

        return self.steps("unlink", write)

    def _unlink(self, primary: Side, inverse: Side | None, pending: list[Change] | None = None) -> bool:
        return self._written(
            primary, inverse, lambda changes: self.pairs.unlink(primary, inverse, changes=changes), pending
        )

    def _written(
        self,
        primary: Side,
        inverse: Side | None,
        write: Callable[[list[Change]], bool],
        pending: list[Change] | None = None,
    ) -> bool:
        """Run a pair write, then update (or drop) the cached lists whose rows it changed.

        Commit first, then change the cache, only where rows changed (a
        re-link of a pair in place leaves the cached lists alone): each list
        in place, in its version order (`ListCache.apply`); after a failure
        drop both, since a side may have committed before it. With
        ``pending``, the changes are added there for the caller to apply
        with others (`_apply`: one call to the cache for many writes).
        """
        changes: list[Change] = []
        try:
            result = write(changes)
        except BaseException:
            self._invalidate_sides(primary, inverse)
            raise
        if pending is not None:
            pending += changes
        else:
            self._apply(changes)
        return result

    def _apply(self, changes: Sequence[Change]) -> None:
        """Update the cached lists in place with committed ``changes`` (in their order)."""
        if self.lists is not None and changes:
            self.lists.apply(
                [
                    (
                        self.list_key(c.side.relation, c.side.from_id),
                        c.version,
                        c.kind,
                        b"" if c.kind == REMOVE else encode_member(c.sequence, c.side.to_id),
                        c.side.to_id,
                    )
                    for c in changes
                ]
            )

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

    def remove_object(self, type_name: str, obj: int) -> int:
        """Take a (deleted) object out of every list that reaches it through an inverse; pairs removed.

        For each relation from ``type_name`` that has an inverse, every pair
        of the object's list goes, both sides, by the pair protocol: one
        step per pair, and one per page read (`store.steps`). A link racing
        with this is refused (the object is marked deleted first), or
        committed before this reads the list and removed here.
        """
        removed = 0
        pending: list[Change] = []  # the cached lists are updated in one call per chunk
        specs = [
            s
            for s in self._router.config.relations.values()
            if s.from_type == type_name and s.inverse is not None
        ]
        if not specs:
            return 0
        # (every list of ``obj`` is on its shard)
        firsts = self.steps(
            "read lists",
            lambda: self.repo.first_pages(
                self._side(specs[0], obj, None), [s.name for s in specs], obj, REMOVE_CHUNK
            ),
        )
        try:
            for spec, rows in zip(specs, firsts, strict=True):
                while True:  # by key, so that it ends even if a pair could not be removed
                    for _seq, to_id in rows:
                        removed += self.steps(
                            "sweep",
                            lambda spec=spec, to_id=to_id: self._unlink(  # type: ignore[misc]
                                *self._sides(spec, obj, to_id, guarded=False), pending
                            ),
                        )
                    if len(pending) >= REMOVE_CHUNK:
                        self._apply(pending)
                        pending.clear()
                    if len(rows) < REMOVE_CHUNK:
                        break
                    after = rows[-1]
                    rows = self.steps(
                        "read lists",
                        lambda spec=spec, after=after: self.repo.page(  # type: ignore[misc]
                            self._side(spec, obj, None), spec.name, obj, REMOVE_CHUNK, after, False
                        ),
                    )
        finally:
            self._apply(pending)
        return removed

    def _sides(
        self, spec: RelationSpec, from_id: int, to_id: int, *, guarded: bool
    ) -> tuple[Side, Side | None]:
        """(primary side, inverse side or None), routed and type-checked, primary first."""
        here = self._side(spec, from_id, None)
        side = Side(here, spec.name, from_id, to_id)
        if spec.inverse is None:
            self._router.route(to_id, spec.to_type)  # (None too: it is no ID)
            return side, None
        inverse = self._router.relation(spec.inverse)
        there = self._side(inverse, to_id, None)  # the inverse's from type is this one's to type
        other = Side(there, inverse.name, to_id, from_id)
        if guarded:
            side = Side(here, spec.name, from_id, to_id, self._guard(spec.from_type, from_id))
            other = Side(there, inverse.name, to_id, from_id, self._guard(inverse.from_type, to_id))
        return (side, other) if spec.primary else (other, side)

    def _guard(self, type_name: str, id_: int) -> Guard:
        _shard, spec, row_key, _host = self._router.route(id_, type_name)
        return Guard(f"{type_name} {id_}", spec.table, self._object_key, row_key)

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
        if self.lists is not None:
            op = ("rank", offset, offset + limit - 1, newest_first)
            rows = self._cached(h, relation, from_id, op, offset + limit, newest_first)
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
        if self.lists is not None:
            if after is None:
                op: tuple[object, ...] = ("rank", 0, limit, newest_first)
            else:
                op = ("after", encode_member(*after), limit + 1, newest_first)
            rows = self._cached(h, relation, from_id, op, limit + 1, newest_first, after=after)
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
        if self.lists is not None:
            rows = self._cached_range(h, relation, from_id, after, limit + 1, newest_first, since, until)
        if rows is None:
            span = (_SEQ_MIN if since is None else since, _SEQ_MAX if until is None else until - 1)
            rows = self.repo.page_range(h, relation, from_id, span, limit + 1, after, newest_first)
        return rows[:limit], len(rows) > limit

    def _cached_range(
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
        assert self.lists is not None
        # IDs are > 0: (since, 0) sorts before every entry at since.
        low = None if since is None else (since, 0)
        high = None if until is None else (until, 0)
        start, start_open, end = low, False, high
        if after is not None and newest_first and (high is None or after < high):
            end = after
        elif after is not None and not newest_first and (low is None or after >= low):
            start, start_open = after, True  # a cursor's key is not repeated
        read = self.lists.read(
            self.list_key(relation, from_id),
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
        stats = self.lists.stats
        if read.meta is not None:
            rows = decode_members(read.members)
            edge = None if read.last is None else decode_members([read.last])[0]
            complete, newest = read.complete, read.newest
        else:
            stats.add(misses=1)
            n, head = self._fill(h, relation, from_id, read.version, want, newest=newest_first)
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
        if self.lists is not None:
            read = self.lists.read(self.list_key(relation, from_id), ("meta",))
            if read is not None and read.meta is not None:
                self.lists.stats.add(hits=1)
                return read.meta[0]
            if read is not None:
                self.lists.stats.add(misses=1)
                return self._fill(h, relation, from_id, read.version, 0)[0]
        return self.repo.count(h, relation, from_id)

    # -- the list cache --------------------------------------------------------

    def _cached(
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
        assert self.lists is not None
        read = self.lists.read(self.list_key(relation, from_id), op)
        if read is None:
            return None  # the cache failed: a miss, and no fill
        stats = self.lists.stats
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
        n, head = self._fill(h, relation, from_id, read.version, want, newest=newest_first)
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

    def _fill(
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
        assert self.lists is not None
        size = fill_size(self.lists.entries, want)
        read_ms = self.lists.clock_ms()  # before the reads: the entry's age counts from here
        n, head, packed, at = self.repo.head_and_count(h, relation, from_id, size, newest)
        key = self.list_key(relation, from_id)
        self.lists.fill(key, version, n, head, read_ms, packed=packed, list_version=at, newest=newest)
        return n, head


def _rows(rows: Any) -> list[tuple[int, int]]:
    """A driver's (sequence, to_id) rows as a list: every driver the store runs on reads a BIGINT as
    an int already (a conversion per value measured about 4 us on a page of 50)."""
    return rows if type(rows) is list else list(rows)
