"""`link_many` and `unlink_many`: many pairs by the pair protocol, a few requests per host pair.

Pairs are grouped by where their two sides live: (the primary side's pool,
the inverse side's pool), that is by host (by shard file on SQLite). Each
group is written by the protocol of `store.pairs`, once for all its pairs:

1. one transaction on the primary host writes every primary row (each write
   locks its pair's key, in key order, so two batches never wait for each
   other in a circle);
2. holding those locks, one transaction on the inverse host makes every
   inverse row that must change match, and commits;
3. the primary host commits.

Every write of a pair still takes the pair's primary lock first and writes
the inverse under it, so a batch racing single `link`/`unlink` calls of the
same pairs converges as they do (`tests/test_pair_interleavings.py`).

Where `Backend.pair_rows` (MariaDB/MySQL), a side is a few multi-row
statements per shard (`SideRows`), not statements per pair: first, behind a
savepoint, as if every pair were new (a link) or there (an unlink): the
objects read in share mode, one INSERT that skips a pair there already (or
one DELETE), one upsert of the counts, and (where a list cache or the log
takes them) one read of the lists' versions, in one request; each list's
count and version change once, by as many as it had changes. If a statement
changed fewer rows than that assumed, or an object was deleted, back to the
savepoint: one read of every key ``FOR UPDATE`` (rows, and the gaps where
absent ones would go) and of the objects, then the writes that read calls
for. Where one transaction holds both sides (one pool reaches both), both
are tried so in one request, the primary side's statements first (each
inverse row is written under its primary row's lock, as the second side
would write it), and if either was wrong both go back to the savepoint and
the sides are written one after the other: a group of new pairs on one host
is two requests in all (both sides, then the COMMIT). The changes are noted
(and the lists' versions read) only where a list cache or the log takes them.
Where statements can be conditional only (`Backend.conditional_writes`),
each side's per-pair writes and counts go in one request; elsewhere the
statements run one by one inside the same two transactions. Where a side of
new pairs is one counted-rows statement (`Backend.counted_rows`: PostgreSQL)
and one pool reaches both sides, both statements and the COMMIT go in one
request behind gates (`Backend.gates`: each fails the request unless it
wrote every pair it was given); a failed gate begins the transaction again,
and the sides go one after the other.

Each group is one step (`store.steps`): a group refused because a shard
moved wrote nothing (both transactions rolled back); it is routed again and
written again alone, and the groups before it stay committed, once. A pair
already as asked (linked, or absent) counts for nothing, so the counts stay
exact when a step runs again.

A pair whose object was deleted is refused as `link` refuses it: its group
is rolled back and written again without it, and after every other pair is
written `NotFound` names the pairs refused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from store.engines import Cursor, ShardHandle, transaction_pair
from store.exceptions import DataError, NotFound, brief
from store.relations.counted_rows import CountedRows
from store.relations.inputs import pair_list
from store.relations.repository import ADD, MOVE, REMOVE, Plan, Side, first_pages_rows
from store.relations.rows import (
    RefusedError,
    RowEntry,
    SideRows,
    Sides,
    both_sides,
    carried_rows,
    write_both,
    write_side,
)
from store.relations.service import REMOVE_CHUNK, RelationService
from store.relations.writer import Change
from store.specs import RelationSpec

__all__ = ["CHUNK", "BulkPairs"]

#: Pairs one group's transactions carry at most (a bigger group is written as several).
CHUNK = 1000
_SEQ_MIN, _SEQ_MAX = -(1 << 63), (1 << 63) - 1


class BulkPairs:
    """`Store.link_many` and `Store.unlink_many` over a `RelationService` (its writer and caches)."""

    def __init__(self, relations: RelationService, *, max_pairs: int) -> None:
        self._rel = relations
        self._max = max_pairs
        #: `Backend.counted_link_rows` (and `counted_unlink_rows`) texts, by (backend, shard,
        #: relation, object table, key; the last two empty for unlinks).
        self._rows = CountedRows()

    # -- the calls ------------------------------------------------------------------------

    def link_many(
        self, relation: str, pairs: Iterable[tuple[int, int]], *, sequence: int | None = None
    ) -> int:
        """Link every pair (see the module's text); how many were new."""
        spec = self._rel.router.relation(relation)
        if sequence is not None and (type(sequence) is not int or not _SEQ_MIN <= sequence <= _SEQ_MAX):
            raise DataError(f"sequence must be a 64-bit signed int, got {brief(sequence)}")
        wanted, routed, routed_by = self._checked(spec, pairs, guarded=True)
        seq = self._rel.clock_us() if sequence is None else sequence
        move = sequence is not None
        refused: list[tuple[str, int, int, NotFound]] = []

        def write(group: list[Sides]) -> int:
            return self._link_group(group, seq, move, refused)

        n = self._run("link many", spec, wanted, (routed, routed_by), write, guarded=True)
        if refused:
            shown = ", ".join(f"{r} ({f}, {t})" for r, f, t, _e in refused[:5])
            more = f" and {len(refused) - 5} more" if len(refused) > 5 else ""
            raise NotFound(
                f"{len(refused)} pair(s) name a deleted object and were not linked: {shown}{more} "
                f"({refused[0][3]}); every other pair was written ({n} new)"
            )
        return n

    def unlink_many(self, relation: str, pairs: Iterable[tuple[int, int]]) -> int:
        """Unlink every pair (and its inverse); how many were there."""
        spec = self._rel.router.relation(relation)
        wanted, routed, routed_by = self._checked(spec, pairs, guarded=False)
        return self._run("unlink many", spec, wanted, (routed, routed_by), self._unlink_group, guarded=False)

    # -- grouping and steps -----------------------------------------------------------------

    def _checked(
        self, spec: RelationSpec, pairs: Iterable[tuple[int, int]], *, guarded: bool
    ) -> tuple[list[tuple[int, int]], list[Sides], int]:
        """Every pair, each once, routed and type-checked before any I/O; and the version of the
        map they were routed by (read before the routing)."""
        wanted = pair_list(pairs, limit=self._max)
        version = self._rel.router.shard_map.version
        return wanted, self._rel.sides_many(spec, wanted, guarded=guarded), version

    def _run(
        self,
        name: str,
        spec: RelationSpec,
        wanted: list[tuple[int, int]],
        routing: tuple[list[Sides], int],
        write: Callable[[list[Sides]], int],
        *,
        guarded: bool,
    ) -> int:
        """Each group as one step: routed as the map is now when it runs again (``routing``: the
        pairs' sides as `_checked` routed them, and the map version it routed by)."""
        total = 0
        routed, routed_by = routing
        router = self._rel.router
        for members in _groups(routed):
            first = [[routed[k] for k in members]]

            def step(members: list[int] = members, first: list[list[Sides]] = first) -> int:
                # The group as `_groups` grouped it, while the map is the one it was routed by: a
                # newer one (read by another thread, or after a refusal) routes it again here, as
                # the step's refusals are judged against the map current when the step began.
                if first and router.shard_map.version == routed_by:
                    return write(first.pop())
                first.clear()
                sides = self._rel.sides_many(spec, [wanted[k] for k in members], guarded=guarded)
                return sum(write([sides[j] for j in part]) for part in _groups(sides))

            total += self._rel.steps(name, step)
        return total

    def _cached(
        self,
        group: list[Sides],
        write: Callable[[list[Change]], int],
        pending: list[Change] | None = None,
    ) -> int:
        """Run ``write``, then update the cached lists it changed (drop them all after a failure);
        with ``pending``, its changes go there for the caller to apply with others."""
        changes: list[Change] = []
        try:
            n = write(changes)
        except BaseException:
            self._rel.invalidate([(s.relation, s.from_id) for p, i in group for s in (p, i) if s is not None])
            raise
        if pending is not None:
            pending += changes
        else:
            self._rel.apply_changes(changes)
        return n

    # -- link -------------------------------------------------------------------------------

    def _link_group(
        self, group: list[Sides], seq: int, move: bool, refused: list[tuple[str, int, int, NotFound]]
    ) -> int:
        """Write one group of pairs (one primary pool, one inverse pool); how many were new."""
        todo = list(group)
        once = self._link_rows if rows_path(group) else self._link_once
        while todo:
            try:
                return self._cached(todo, lambda changes: once(todo, seq, move, changes))
            except RefusedError as exc:
                gone = {k for k, _e in exc.refused}
                for k, error in exc.refused:
                    p, _i = todo[k]
                    refused.append((p.relation, p.from_id, p.to_id, error))
                todo[:] = [pair for k, pair in enumerate(todo) if k not in gone]
        return 0

    def _link_once(self, group: list[Sides], seq: int, move: bool, changes: list[Change]) -> int:
        w = self._rel.pairs
        repo = w.repo
        made: list[Change] = []
        #: per pair: (kind of change on the primary side or None, the sequence it settled on)
        done: list[tuple[str | None, int]] = []

        def first(cur: Cursor) -> int:
            made.clear()
            done.clear()
            w.lock_keys(cur, [p for p, _i in group])
            cs = [Change(p) for p, _i in group]
            fresh = None if move else self._fresh(cur, [(p, seq) for p, _i in group])
            if fresh is not None:  # (a pair not inserted is there already, or its object deleted)
                kinds: list[str | None] = [ADD if f else None for f in fresh]
            elif _link_planned(group):
                plans = [self._link_plan(p, seq, move) for p, _i in group]
                kinds = _outcomes(cur, plans, cs)
            else:
                kinds = [
                    repo.link_in(cur, p, seq, move=move, insert=p.guard is not None, seen=c.seen)
                    for (p, _i), c in zip(group, cs, strict=True)
                ]
            new = 0
            for k, ((p, _i), c, kind) in enumerate(zip(group, cs, kinds, strict=True)):
                settled = seq
                if kind is None:  # the slow way, as `PairWriter.link` takes it
                    try:
                        w._check_live(cur, p)
                    except NotFound as exc:
                        raise RefusedError([(k, exc)]) from None
                    added, settled = repo.add_in(cur, p, seq, move=move, seen=c.seen)
                    kind = ADD if added else MOVE if move else None
                if kind is not None:
                    w._changed(cur, c, kind, settled, made)
                new += kind == ADD
                done.append((kind, settled))
            return new

        def second(cur: Cursor, _new: int) -> None:
            # Only the pairs whose primary row changed: a pair in place on the primary side
            # was written on both sides by the write that put it there, under the same lock.
            todo: list[tuple[int, Side, str, int]] = []
            for k, ((_p, i), (kind, settled)) in enumerate(zip(group, done, strict=True)):
                if i is not None and kind is not None:
                    todo.append((k, i, kind, settled))
            cs = [Change(i) for _k, i, _kind, _s in todo]
            if _link_planned(group):
                kinds: list[str | None] = [None] * len(todo)
                adds = [j for j, (_k, _i, kind, _s) in enumerate(todo) if kind == ADD]
                fresh = self._fresh(cur, [(todo[j][1], todo[j][3]) for j in adds])
                for j, f in zip(adds if fresh is not None else [], fresh or [], strict=True):
                    kinds[j] = ADD if f else None
                others = [j for j in range(len(todo)) if fresh is None or todo[j][2] != ADD]
                plans = []
                for j in others:
                    _k, i, kind, s = todo[j]
                    plans.append(
                        repo.link_plan(i, s, move=kind == MOVE, insert=kind == ADD and i.guard is not None)
                    )
                for j, got in zip(others, _outcomes(cur, plans, [cs[j] for j in others]), strict=True):
                    kinds[j] = got
            else:
                kinds = [
                    repo.link_in(
                        cur, i, s, move=kind == MOVE, insert=kind == ADD and i.guard is not None, seen=c.seen
                    )
                    for (_k, i, kind, s), c in zip(todo, cs, strict=True)
                ]
            for (k, i, _kind, s), c, got in zip(todo, cs, kinds, strict=True):
                if got is None:
                    try:
                        w._check_live(cur, i)
                    except NotFound as exc:
                        raise RefusedError([(k, exc)]) from None
                    got = repo.set_in(cur, i, (True, s), c.seen)
                if got is not None:
                    w._changed(cur, c, got, s, made)

        def together(cur: Cursor) -> int:
            # One connection reaches both sides: every pair as new on both, and the COMMIT, in
            # one request behind gates (each side's statements wrote every pair, or the request
            # ends there); else the two sides as `first` and `second` write them.
            gated = self._fresh_together(cur, group, seq, made)
            if gated is not None:
                return gated
            n = first(cur)
            (self._rel.pairs.step or _no_step)("primary written")
            second(cur, n)
            return n

        gates = group[0][0].h.backend.gates and not move
        n = self._protocol(group, first, second, together=together if gates else None)
        changes += made
        return n

    def _fresh_together(self, cur: Cursor, group: list[Sides], seq: int, made: list[Change]) -> int | None:
        """Both sides of ``group`` (one connection reaches both) inserted as new pairs with their
        counts, and the COMMIT, in one request behind gates (`Backend.gates`, `CountedRows.gated`):
        the number of pairs, every change noted in ``made``. None, and the transaction begun
        again, if a gate ended the request (a pair there already, a deleted object); None, and
        nothing sent, where the backend has no gates, a host logs its writes (its log row goes
        with the COMMIT), or a side cannot be written so (`CountedRows.links`)."""
        w = self._rel.pairs
        primaries = [p for p, _i in group]
        inverses = [i for _p, i in group if i is not None]
        if len(inverses) != len(primaries) or not w.gates([primaries[0], inverses[0]]):
            return None
        backend = primaries[0].h.backend
        mine = self._rows.links([(p, seq) for p in primaries])
        theirs = self._rows.links([(i, seq) for i in inverses])
        if mine is None or theirs is None:
            return None
        made.clear()
        w.lock_keys(cur, primaries)
        statements = self._rows.gated(backend, mine + theirs)
        try:
            cur.commit_with([(text, params) for text, _r, params in statements])
        except Exception as exc:
            if backend.gate(exc) is None:
                raise
            cur.again()  # (rolled back: the two sides go as `first` and `second` write them)
            return None
        for side in (*primaries, *inverses):
            w._changed(cur, Change(side), ADD, seq, made)
        return len(group)

    def _fresh(self, cur: Cursor, items: list[tuple[Side, int]]) -> list[bool] | None:
        """Insert each of ``items`` (a side and its sequence) as a new pair with its count, in one
        request (`CountedRows.links`); whether each was inserted (False: there already, or its
        object not live: the caller asks which, the slow way). None where that cannot be."""
        statements = self._rows.links(items)
        return None if statements is None else self._rows.run(cur, statements, [s for s, _q in items])

    def _link_plan(self, side: Side, seq: int, move: bool) -> Plan:
        """`RelationRepository.link_plan`, also for a side with no guard (a relation without an
        inverse: its insert reads no object, as `link` does not)."""
        repo = self._rel.pairs.repo
        if side.guard is not None:
            return repo.link_plan(side, seq, move=move, insert=True)
        plan: Plan = repo.link_plan(side, seq, move=move, insert=False)
        sql = repo.sql(side.h, side.relation)
        f, t = side.from_id, side.to_id
        plan.add(ADD, (sql.insert, (f, t, seq)), (sql.count_up_if, (side.relation, f, 1)))
        return plan

    def _link_rows(self, group: list[Sides], seq: int, move: bool, changes: list[Change]) -> int:
        """`_link_once` where `Backend.pair_rows`: each side by a few multi-row statements (`SideRows`)."""
        made: list[Change] = []
        versioned = self._rel.lists is not None or self._rel.pairs.log is not None
        together = _one_transaction(group)
        both = both_sides(group)
        mine: list[SideRows] = []  # the primary side, and (where together) whether its writes wait
        waiting: list[SideRows] = []
        folded: list[bool] = []  # [True]: both sides were written by `first`'s one request
        w = self._rel.pairs

        def first(cur: Cursor) -> int:
            made.clear()
            mine.clear()
            waiting.clear()
            folded.clear()
            rows = SideRows(
                w,
                versions=versioned,
                entries=[RowEntry(k, p, seq, move, move, move) for k, (p, _i) in enumerate(group)],
            )
            mine.append(rows)
            if both:
                # As `second` would write the inverse side if every pair is new on the primary side.
                inverse = [
                    RowEntry(e.k, i, seq, True) for e in rows.entries if (i := group[e.k][1]) is not None
                ]
                if write_both(cur, rows, SideRows(w, versions=versioned, entries=inverse), made):
                    folded.append(True)
                else:
                    waiting.extend(write_side(cur, rows, None, made, hope=False, write=False, back=True))
                return sum(e.kind == ADD for e in rows.entries)
            # (its own transaction: written before the inverse side's begins; else with its reads)
            waiting.extend(write_side(cur, rows, None, made, hope=True, write=not together))
            return sum(e.kind == ADD for e in rows.entries)

        def second(cur: Cursor, _new: int) -> None:
            if folded:
                return  # (written with the primary side)
            # Only the pairs whose primary row changed (as `_link_once`).
            entries = []
            for e in mine[0].entries:
                i = group[e.k][1]
                if i is not None and e.kind is not None:
                    entries.append(RowEntry(e.k, i, e.settled, True, e.kind == MOVE, False))
            hope = all(e.kind == ADD for e in mine[0].entries if e.kind is not None)
            write_side(
                cur,
                SideRows(w, versions=versioned, entries=entries),
                carried_rows(waiting),
                made,
                hope=hope,
                write=True,
            )

        def alone(cur: Cursor) -> None:
            write_side(
                cur,
                SideRows(w, versions=versioned, entries=[]),
                carried_rows(waiting),
                made,
                hope=False,
                write=True,
            )

        n = self._protocol(group, first, second, alone=alone)
        changes += made
        return n

    # -- unlink -----------------------------------------------------------------------------

    def _unlink_group(self, group: list[Sides], pending: list[Change] | None = None) -> int:
        """Unlink one group of pairs (one primary pool, one inverse pool); how many were there.
        ``pending``: as `_cached`'s."""
        once = self._unlink_rows if rows_path(group) else self._unlink_once
        return self._cached(group, lambda changes: once(group, changes), pending)

    def _unlink_once(self, group: list[Sides], changes: list[Change]) -> int:
        w = self._rel.pairs
        repo = w.repo
        made: list[Change] = []
        primaries = [p for p, _i in group]
        # Every inverse row goes, whether its primary row was there or not (as `unlink`).
        inverses = [i for _p, i in group if i is not None]

        def remove(cur: Cursor, sides: list[Side], *, commit: bool = False) -> list[bool]:
            cs = [Change(s) for s in sides]
            statements = None if commit else self._rows.unlinks(sides)
            rows = None if statements is None else self._rows.run(cur, statements, sides)
            if rows is not None:  # a statement per shard and relation
                gone = rows
            elif sides and _planned(sides[0]):  # every pair's statements in one request
                kinds = _outcomes(cur, [repo.unlink_plan(s) for s in sides], cs, commit=commit)
                gone = [k is not None for k in kinds]
            else:
                gone = [repo.remove_in(cur, s, c.seen) for s, c in zip(sides, cs, strict=True)]
            for c, g in zip(cs, gone, strict=True):
                if g:
                    w._changed(cur, c, REMOVE, 0, made)
            return gone

        def lock(cur: Cursor) -> None:
            made.clear()
            w.lock_keys(cur, primaries)

        def first(cur: Cursor) -> int:
            lock(cur)
            return sum(remove(cur, primaries))

        def second(cur: Cursor, _gone: int) -> None:
            remove(cur, inverses)

        together = alone = None
        i = group[0][1]
        if i is not None and _planned(i):

            def together(cur: Cursor) -> int:
                # One connection reaches both sides: every primary key locked, then both sides'
                # deletes and counts in one request, each inverse row after its primary row.
                lock(cur)
                return sum(remove(cur, primaries + inverses)[: len(primaries)])

            if (w.log is None or i.h.log_sql() is None) and self._rows.unlinks(inverses) is None:

                def alone(cur: Cursor, _gone: int) -> None:
                    # The inverse side in a transaction of its own, on a host that logs nothing:
                    # its deletes, counts and COMMIT in one request.
                    remove(cur, inverses, commit=True)

        n = self._protocol(group, first, second, together=together, second_alone=alone)
        changes += made
        return n

    def _unlink_rows(self, group: list[Sides], changes: list[Change]) -> int:
        """`_unlink_once` where `Backend.pair_rows` (see `_link_rows`)."""
        made: list[Change] = []
        versioned = self._rel.lists is not None or self._rel.pairs.log is not None
        together = _one_transaction(group)
        both = both_sides(group)
        mine: list[SideRows] = []
        waiting: list[SideRows] = []
        folded: list[bool] = []  # [True]: both sides were written by `first`'s one request
        w = self._rel.pairs

        def inverse() -> SideRows:
            # Every inverse row goes, whether its primary row was there or not (as `unlink`).
            entries = [RowEntry(k, i) for k, (_p, i) in enumerate(group) if i is not None]
            return SideRows(w, versions=versioned, entries=entries, unlink=True)

        def first(cur: Cursor) -> int:
            made.clear()
            mine.clear()
            waiting.clear()
            folded.clear()
            rows = SideRows(
                w,
                versions=versioned,
                entries=[RowEntry(k, p) for k, (p, _i) in enumerate(group)],
                unlink=True,
            )
            mine.append(rows)
            if both:
                if write_both(cur, rows, inverse(), made):
                    folded.append(True)
                else:
                    waiting.extend(write_side(cur, rows, None, made, hope=False, write=False, back=True))
            else:
                waiting.extend(write_side(cur, rows, None, made, hope=True, write=not together))
            return sum(e.kind == REMOVE for e in rows.entries)

        def second(cur: Cursor, _gone: int) -> None:
            if not folded:
                write_side(cur, inverse(), carried_rows(waiting), made, hope=True, write=True)

        def alone(cur: Cursor) -> None:
            write_side(
                cur,
                SideRows(w, versions=versioned, entries=[], unlink=True),
                carried_rows(waiting),
                made,
                hope=False,
                write=True,
            )

        n = self._protocol(group, first, second, alone=alone)
        changes += made
        return n

    # -- a deleted object's lists -------------------------------------------------------------

    def _swept(self, type_name: str) -> list[RelationSpec]:
        """The relations from ``type_name`` with an inverse: the lists a deleted object leaves."""
        rel = self._rel
        return [
            s
            for s in rel.router.config.relations.values()
            if s.from_type == type_name and s.inverse is not None
        ]

    def lists_read(self, type_name: str, obj: int, h: ShardHandle) -> tuple[str, list[int]] | None:
        """The query (and its parameters) of the first page of every list `remove_object` empties,
        on ``h`` (``obj``'s shard), for a request that carries it after the delete's mark; None
        where ``type_name`` has no such list. Its rows go to `remove_object` as ``first``."""
        specs = self._swept(type_name)
        if not specs:
            return None
        return self._rel.repo.first_pages_query(h, [s.name for s in specs], obj, REMOVE_CHUNK)

    def remove_object(self, type_name: str, obj: int, first: Sequence[Sequence[Any]] | None = None) -> int:
        """Take a (deleted) object out of every list that reaches it through an inverse; pairs removed.

        For each relation from ``type_name`` that has an inverse, every pair
        of the object's list goes, both sides, by the pair protocol, a page
        (`REMOVE_CHUNK` pairs of a list) at a time: one step reads the first
        page of every list (one query: they are all on the object's shard),
        one step removes those pairs as a batch (`_sweep`: grouped by host
        pair as `unlink_many` groups them, a few requests per group), then
        each further page of a longer list is a step that reads it and a
        step that removes it. A link racing with this is refused (the object
        is marked deleted first), or committed before this reads the list
        and removed here. A list is paged by key, after the last pair read,
        so the sweep ends even if a pair could not be removed.

        ``first``: the rows of `lists_read`'s query, read by the delete with
        its mark (after the mark took the object's row lock); the first
        step is then not run.
        """
        rel = self._rel
        specs = self._swept(type_name)
        if not specs:
            return 0
        names = [s.name for s in specs]
        if first is not None:
            firsts = first_pages_rows(first, len(specs))
        else:
            firsts = rel.steps(
                "read lists",
                lambda: rel.repo.first_pages(rel.handle(specs[0], obj), names, obj, REMOVE_CHUNK),
            )
        removed = self._sweep(obj, list(zip(specs, firsts, strict=True)))
        for spec, page in zip(specs, firsts, strict=True):
            rows = page
            while len(rows) >= REMOVE_CHUNK:
                after = rows[-1]
                rows = rel.steps(
                    "read lists",
                    lambda spec=spec, after=after: rel.repo.page(  # type: ignore[misc]
                        rel.handle(spec, obj), spec.name, obj, REMOVE_CHUNK, after, False
                    ),
                )
                removed += self._sweep(obj, [(spec, rows)])
        return removed

    def _sweep(self, obj: int, pages: list[tuple[RelationSpec, list[tuple[int, int]]]]) -> int:
        """Unlink the pairs of ``pages`` (a page of ``obj``'s list in each relation: (sequence,
        to_id) rows) as one step, "sweep"; how many were there.

        The pairs are grouped by (primary pool, inverse pool) as `unlink_many` groups them, the
        pairs of every relation together (a group's side has a statement per relation), and
        each group is unlinked as a batch. A step refused because a shard moved runs again with
        the pairs of the groups not yet committed, routed by the newer map; a pair already
        gone is a no-op, so the counts stay exact. The cached lists are updated once, after
        the step.
        """
        todo = [(spec, [to_id for _seq, to_id in rows]) for spec, rows in pages if rows]
        if not todo:
            return 0
        rel = self._rel
        removed = 0
        pending: list[Change] = []

        def step() -> int:
            nonlocal removed, todo
            routed: list[Sides] = []
            whose: list[tuple[int, int]] = []  # each routed pair's (index in todo, index in its list)
            for n, (spec, to_ids) in enumerate(todo):
                routed += rel.sides_many(spec, [(obj, t) for t in to_ids], guarded=False)
                whose += [(n, j) for j in range(len(to_ids))]
            done: set[tuple[int, int]] = set()
            try:
                for members in _groups(routed):
                    removed += self._unlink_group([routed[k] for k in members], pending)
                    done.update(whose[k] for k in members)
            finally:
                if done:  # (committed: a step that runs again leaves them out)
                    todo = [
                        (spec, kept)
                        for n, (spec, to_ids) in enumerate(todo)
                        if (kept := [t for j, t in enumerate(to_ids) if (n, j) not in done])
                    ]
            return removed

        try:
            return rel.steps("sweep", step)
        finally:
            rel.apply_changes(pending)

    # -- the protocol -----------------------------------------------------------------------

    def _protocol(
        self,
        group: list[Sides],
        first: Callable[[Cursor], int],
        second: Callable[[Cursor, int], None],
        *,
        alone: Callable[[Cursor], None] | None = None,
        together: Callable[[Cursor], int] | None = None,
        second_alone: Callable[[Cursor, int], None] | None = None,
    ) -> int:
        """``first`` on the primary host, then ``second`` on the inverse host under its locks
        (`store.pairs`: one transaction where one pool reaches both sides). Where the group has
        no inverse side, ``alone`` (if given) runs after ``first`` in its transaction. Where one
        pool reaches both sides, ``together`` (if given) takes the place of both; where two
        transactions write them, ``second_alone`` (if given) takes ``second``'s (it may commit
        the inverse side's transaction itself)."""
        step = self._rel.pairs.step or _no_step
        step("start")
        p = group[0][0].h
        i = group[0][1].h if group[0][1] is not None else None
        if i is None:
            if alone is None:
                return p.transaction(first)

            def only(cur: Cursor) -> int:
                n = first(cur)
                alone(cur)
                return n

            return p.transaction(only)
        if p.pool is i.pool and together is not None:
            return p.transaction(together)
        if p.pool is i.pool:

            def both(cur: Cursor) -> int:
                n = first(cur)
                step("primary written")
                second(cur, n)
                return n

            return p.transaction(both)
        return transaction_pair(p, i, first, second_alone or second, step=step)


def cur_conditional(group: list[Sides]) -> bool:
    """Whether the group's statements can be conditional (one request per side)."""
    return bool(group[0][0].h.backend.conditional_writes)


def _link_planned(group: list[Sides]) -> bool:
    """Whether each side of the group's links is statements for one request: conditional counts
    (`Backend.conditional_writes`), or writes that count themselves (`Backend.counted_writes`)
    where every primary side is guarded (a guarded insert counts itself; an unguarded one has
    no such statement, and goes pair by pair)."""
    b = group[0][0].h.backend
    return bool(b.conditional_writes or (b.counted_writes and all(p.guard is not None for p, _i in group)))


def _planned(side: Side) -> bool:
    """Whether ``side``'s unlink is statements for one request (`RelationRepository.unlink_plan`):
    conditional counts (`Backend.conditional_writes`) or writes that count themselves
    (`Backend.counted_writes`), so that a batch's plans go out together."""
    b = side.h.backend
    return bool(b.conditional_writes or b.counted_writes)


def _outcomes(cur: Cursor, plans: list[Plan], cs: list[Change], *, commit: bool = False) -> list[str | None]:
    """Run every plan's statements in one request (``commit``: with the transaction's COMMIT);
    each plan's outcome (`Plan.outcome`)."""
    if not plans:
        return []
    statements = [s for plan in plans for s in plan.statements]
    results = cur.commit_with(statements) if commit else cur.batch(statements)
    out: list[str | None] = []
    at = 0
    for plan, c in zip(plans, cs, strict=True):
        n = len(plan.statements)
        out.append(plan.outcome(results[at : at + n], c.seen))
        at += n
    return out


def _groups(routed: list[Sides]) -> list[list[int]]:
    """Indexes of ``routed`` grouped by (primary pool, inverse pool), in key order (shard, relation,
    pair), `CHUNK` at most."""
    pools = [(id(p.h.pool), 0 if i is None else id(i.h.pool)) for p, i in routed]
    order = [(p.h.shard, p.relation, p.from_id, p.to_id) for p, _i in routed]
    by: dict[tuple[int, int], list[int]] = {}
    if len(set(pools)) <= 1:  # (one group, as a batch of one board's pins on one host is)
        by = {pools[0]: list(range(len(routed)))} if routed else {}
    else:
        for k, pool in enumerate(pools):
            by.setdefault(pool, []).append(k)
    out: list[list[int]] = []
    for members in by.values():
        members.sort(key=order.__getitem__)
        out += [members[j : j + CHUNK] for j in range(0, len(members), CHUNK)]
    return out


def rows_path(group: list[Sides]) -> bool:
    """Whether the group's sides are written with multi-row statements (`Backend.pair_rows`)."""
    return bool(group[0][0].h.backend.pair_rows)


def _one_transaction(group: list[Sides]) -> bool:
    """Whether one transaction writes the group's both sides (one pool reaches both), or it has no
    inverse side: the primary side's writes can wait for the next request."""
    i = group[0][1]
    return i is None or i.h.pool is group[0][0].h.pool


def _no_step(_name: str) -> None:
    return None
