"""One side of a group of pairs as a few multi-row statements per shard (`Backend.pair_rows`).

`SideRows` holds a side's rows, grouped by shard: the statements that read
them under locks, the speculative writes behind a savepoint (as if every
pair were new, or there), the writes a locked read calls for, and how to
check and note what changed. `write_side` and `write_both` drive one side,
or both sides in one transaction, over a cursor (`store.relations.bulk`
groups the pairs and runs the protocol).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from store.engines import Cursor
from store.exceptions import NotFound, StoreError
from store.relations.repository import ADD, MOVE, REMOVE, Side
from store.relations.writer import Change

__all__ = [
    "Answer",
    "RefusedError",
    "RowEntry",
    "SideRows",
    "Sides",
    "Statement",
    "both_sides",
    "carried_rows",
    "exchange",
    "write_both",
    "write_side",
]

#: A pair's two sides, the primary first (None: the relation has no inverse).
Sides = tuple[Side, Side | None]

Statement = tuple[str, Sequence[Any]]
Answer = tuple[int, list[Any]]


class RefusedError(StoreError):
    """Pairs of the group name a deleted object: roll the group back, write it without them."""

    def __init__(self, refused: list[tuple[int, NotFound]]) -> None:
        super().__init__(str(refused[0][1]))
        #: (the pair's index in the group, the error), in the group's order.
        self.refused = refused


#: How a change moves its list's count; the order of a side's rows (the order their locks are taken).
_DELTA = {ADD: 1, MOVE: 0, REMOVE: -1}
_KEY_ORDER = attrgetter("side.from_id", "side.to_id")
_SAVEPOINT = "SAVEPOINT pair_rows"
_BACK = "ROLLBACK TO SAVEPOINT pair_rows"


def exchange(cur: Cursor, parts: list[list[Statement]]) -> list[list[Answer]]:
    """Every part's statements in one request (`Cursor.batch_rows`); each part's answers."""
    flat = [s for part in parts for s in part]
    answers = cur.batch_rows(flat) if flat else []
    out: list[list[Answer]] = []
    at = 0
    for part in parts:
        out.append(answers[at : at + len(part)])
        at += len(part)
    return out


def both_sides(group: list[Sides]) -> bool:
    """Whether one transaction writes the group's two sides (one pool reaches both): then both are
    tried in one request (`write_both`)."""
    i = group[0][1]
    return bool(group) and i is not None and i.h.pool is group[0][0].h.pool


def write_both(cur: Cursor, rows: SideRows, inverse: SideRows, made: list[Change]) -> bool:
    """Both sides of a group in one request, as if every pair were new (a link) or there (an
    unlink) on both: the primary side's statements first, after the savepoint, then the inverse
    side's, so each inverse row is written under its primary row's lock, as `second` would write
    it. True if both were right (every change noted); else nothing is noted and the caller goes
    back to the savepoint (`write_side` with ``back``)."""
    mine, theirs = exchange(cur, [rows.speculate(), inverse.speculate(savepoint=False)])
    first = rows.checked(mine)
    then = None if first is None else inverse.checked(theirs)
    if first is None or then is None:
        return False
    rows.noted(cur, first, made)
    inverse.noted(cur, then, made)
    return True


def carried_rows(waiting: list[SideRows]) -> SideRows | None:
    return waiting[0] if waiting else None


def write_side(
    cur: Cursor,
    rows: SideRows,
    carried: SideRows | None,
    made: list[Change],
    *,
    hope: bool,
    write: bool,
    back: bool = False,
) -> list[SideRows]:
    """Write one side of a group (`SideRows`), with ``carried``'s writes (a side decided, not yet
    written) first in the first request; ``[rows]`` if ``write`` is False and its writes are
    to go with the next request, else [].

    ``hope``: first as if every pair were new (a link) or there (an unlink), in one request:
    the writes behind a savepoint, checked by what they changed (`SideRows.speculate`); if that
    was wrong, back to the savepoint, and the side is read under locks and then written
    (`SideRows.reads`, `decide`, `writes`). ``back``: back to the savepoint first (a speculation
    of `write_both` was wrong).
    """
    before = [] if carried is None else carried.writes()
    if back:
        before = [(_BACK, ()), *before]
    reads: list[Statement] = rows.reads()
    if hope and rows.entries:
        done, tried = exchange(cur, [before, rows.speculate()])
        if carried is not None:
            carried.written(cur, done, made)
            carried = None
        if rows.written(cur, tried, made):
            return []
        before, reads = [(_BACK, ())], reads
    done, read = exchange(cur, [before, reads])
    if carried is not None:
        carried.written(cur, done, made)
    rows.decide(read)
    if not write:
        return [rows]
    (wrote,) = exchange(cur, [rows.writes()])
    rows.written(cur, wrote, made)
    return []


@dataclass(slots=True)
class RowEntry:
    """One side of one pair in `SideRows`: the row it must end as, and what it did."""

    k: int  # the pair's index in its group
    side: Side
    seq: int = 0  # the sequence the row must have (a link)
    reposition: bool = False  # a row at another sequence moves to ``seq``
    free_move: bool = False  # ... without reading its object (the pair exists)
    bump: bool = False  # a row already at ``seq`` counts as moved (as `link` at a sequence does)
    kind: str | None = None  # ADD, MOVE, REMOVE, or None: the row is as asked
    settled: int = 0  # the row's sequence after the write
    write: bool = False  # the row itself changes (a bumped row does not)


class SideRows:
    """One side of a group written with multi-row statements (`PairRowsStatements`), shard by shard.

    `reads`: per shard, one read of every pair's key ``FOR UPDATE`` (present rows and the gaps
    where absent ones would go stay locked to the end of the transaction: nothing else can
    write these pairs), and of the ``from`` objects in share mode (a delete of one waits).
    `decide`: what each pair needs, from what the reads found, as `PairWriter.link` (and
    `unlink`) would decide it pair by pair; a pair naming a deleted object is refused
    (`RefusedError`). `writes`: one INSERT of the new rows, one upsert of the moved ones (or
    one DELETE), one upsert (or UPDATE) of the counts, each list's count and version changed
    once by as many as it had changes, and one read of the versions it leaves. `written`: each
    change gets its version (a list's changes, in order, take the versions it went through,
    as a write of each pair would have given them) and is noted (`PairWriter._changed`).

    `speculate` is `writes` as if each pair were new (a link) or there (an unlink), after a
    savepoint, with the objects' read in share mode: the INSERT skips a pair that exists, the
    DELETE one that does not, and `written` finds whether each row changed and no object was
    deleted (else the caller rolls back to the savepoint and reads first). The INSERT, or the
    DELETE, locks every key it names, as the read does.
    """

    def __init__(self, writer: Any, entries: list[RowEntry], *, versions: bool, unlink: bool = False) -> None:
        self.writer = writer
        self.repo = writer.repo
        #: Read the versions the lists are left at and note each change (for the list cache, or the
        #: log): else neither.
        self.versions = versions
        self.entries = entries
        self.unlink = unlink
        # Its rows by (shard, relation): each part's statements name one table. (One part, as a
        # batch of one board's pins is.)
        if not entries or (
            [e.side.h for e in entries].count(entries[0].side.h) == len(entries)
            and [e.side.relation for e in entries].count(entries[0].side.relation) == len(entries)
        ):
            self.shards = [entries] if entries else []
        else:
            shards: dict[tuple[str, int, str], list[RowEntry]] = {}
            for e in entries:
                shards.setdefault((e.side.h.host, e.side.h.shard, e.side.relation), []).append(e)
            self.shards = list(shards.values())
        #: Per shard: what `writes` sent, by role, and how many rows each must change (-1: any).
        self._sent: list[list[tuple[str, int]]] = []
        #: Per shard: (relation, from_id) -> [changes, count delta] of the lists `writes` changed.
        self._lists: list[dict[tuple[str, int], list[int]]] = []
        self._hoped = False
        self._savepoint = False

    def _dead(self, entries: list[RowEntry]) -> Statement | None:
        side = entries[0].side
        if self.unlink or side.guard is None:
            return None
        keys = tuple(dict.fromkeys([g.value for e in entries if (g := e.side.guard) is not None]))
        return self.repo.rows_sql(side, "dead", len(keys)) % keys, ()

    def reads(self) -> list[Statement]:
        out: list[Statement] = []
        for entries in self.shards:
            side = entries[0].side
            keys = tuple([x for e in entries for x in (e.side.from_id, e.side.to_id)])
            out.append((self.repo.rows_sql(side, "locked", len(entries)) % keys, ()))
            dead = self._dead(entries)
            if dead is not None:
                out.append(dead)
        return out

    def decide(self, answers: list[Answer]) -> None:
        self._hoped = False
        refused: list[tuple[int, NotFound]] = []
        at = 0
        for entries in self.shards:
            present = {(int(f), int(t)): int(s) for f, t, s in answers[at][1]}
            at += 1
            dead: set[int] = set()
            if not self.unlink and entries[0].side.guard is not None:
                dead = {int(key) for (key,) in answers[at][1]}
                at += 1
            for e in entries:
                s = e.side
                found = present.get((s.from_id, s.to_id))
                e.kind, e.write, e.settled = None, False, e.seq
                if self.unlink:
                    if found is not None:
                        e.kind, e.write = REMOVE, True
                elif found is not None and e.reposition and found != e.seq and e.free_move:
                    e.kind, e.write = MOVE, True
                elif s.guard is not None and s.guard.value in dead:
                    deleted = NotFound(f"{s.guard.what} was deleted: a deleted object cannot be linked")
                    refused.append((e.k, deleted))
                elif found is None:
                    e.kind, e.write = ADD, True
                elif e.reposition and found != e.seq:
                    e.kind, e.write = MOVE, True
                elif e.bump:
                    e.kind = MOVE
                else:
                    e.settled = found
        if refused:
            refused.sort(key=lambda r: r[0])
            raise RefusedError(refused)

    def speculate(self, *, savepoint: bool = True) -> list[Statement]:
        """`writes` as if each pair were new (a link) or there (an unlink), after a savepoint
        (``savepoint`` False: the caller's, set before another side's speculation in the same request)."""
        for e in self.entries:
            e.kind, e.write, e.settled = (REMOVE if self.unlink else ADD), True, e.seq
        self._hoped = True
        self._savepoint = savepoint
        return [(_SAVEPOINT, ()), *self.writes()] if savepoint else self.writes()

    def writes(self) -> list[Statement]:
        out: list[Statement] = []
        self._sent.clear()
        self._lists.clear()
        sql = self.repo.rows_sql
        for entries in self.shards:
            side = entries[0].side
            sent: list[tuple[str, int]] = []
            if self._hoped:
                dead = self._dead(entries)
                if dead is not None:
                    out.append(dead)
                    sent.append(("dead", 0))
            rows_of: dict[str, list[RowEntry]] = {}
            # Each list the rows change (a side is of one relation): (from_id, changes, count
            # delta), in the order of their first change.
            changed: list[tuple[int, int, int]]
            if self._hoped:  # (`speculate`: every pair one kind, each row written)
                same = REMOVE if self.unlink else ADD
                rows_of[same] = list(entries)
                delta = _DELTA[same]
                counted = Counter([e.side.from_id for e in entries])
                changed = [(f, c, c * delta) for f, c in counted.items()]
            else:
                by_list: dict[int, list[int]] = {}
                for e in entries:
                    kind = e.kind
                    if kind is None:
                        continue
                    if e.write:
                        rows_of.setdefault(kind, []).append(e)
                    got = by_list.get(e.side.from_id)
                    if got is None:
                        by_list[e.side.from_id] = [1, _DELTA[kind]]
                    else:
                        got[0] += 1
                        got[1] += _DELTA[kind]
                changed = [(f, c, n) for f, (c, n) in by_list.items()]
            # (read by `checked` for the versions: made only where they are read)
            lists = {(side.relation, f): [c, n] for f, c, n in changed} if self.versions else {}
            for role, kind in (("insert", ADD), ("move", MOVE), ("delete", REMOVE)):
                rows = rows_of.get(kind)
                if not rows:
                    continue
                rows.sort(key=_KEY_ORDER)  # (locks taken in key order)
                if role == "delete":
                    params = tuple([x for e in rows for x in (e.side.from_id, e.side.to_id)])
                else:
                    params = tuple([x for e in rows for x in (e.side.from_id, e.side.to_id, e.settled)])
                if role == "insert" and self._hoped:
                    role = "insert_new"  # (a pair there already is skipped, and `written` sees it)
                out.append((sql(side, role, len(rows)) % params, ()))
                # (a row an upsert changed counts twice)
                sent.append((role, len(rows) * (2 if role == "move" else 1)))
            if changed:
                grown = [x for x in changed if x[2] > 0]
                other = [x for x in changed if x[2] <= 0] if len(grown) < len(changed) else []
                if grown:
                    # Each list one new pair (as a speculation whose lists all differ has it)?
                    if (self._hoped and len(grown) == len(entries)) or not [
                        f for f, c, n in grown if n != 1 or c != 1
                    ]:
                        ones = tuple([f for f, _c, _n in grown])
                        out.append((sql(side, "count_add_ones", len(grown)) % ones, ()))
                    else:
                        added = tuple([x for f, c, n in grown for x in (f, n, c)])
                        out.append((sql(side, "count_add", len(grown)) % added, ()))
                    sent.append(("count_add", -1))
                if other:
                    whens_n = [x for f, _c, n in other for x in (f, n)]
                    whens_v = [x for f, c, _n in other for x in (f, c)]
                    cases = (*whens_n, *whens_v, *[f for f, _c, _n in other])
                    out.append((sql(side, "count_change", len(other)) % cases, ()))
                    sent.append(("count_change", -1))
                if self.versions:
                    froms = tuple([f for f, _c, _n in changed])
                    out.append((sql(side, "versions", len(changed)) % froms, ()))
                    sent.append(("versions", -1))
            self._sent.append(sent)
            self._lists.append(lists)
        return out

    def written(self, cur: Cursor, answers: list[Answer], made: list[Change]) -> bool:
        """Read what `writes` (or `speculate`) did, and note each change; False if a speculation
        was wrong (nothing noted: the caller goes back to the savepoint)."""
        versions = self.checked(answers)
        if versions is None:
            return False
        self.noted(cur, versions, made)
        return True

    def checked(self, answers: list[Answer]) -> dict[tuple[str, int], int] | None:
        """Read what `writes` (or `speculate`) did: the version each list had before it (where they
        were read), or None if a speculation was wrong (the caller goes back to the savepoint)."""
        at = 1 if self._hoped and self._savepoint else 0  # (the savepoint)
        versions: dict[tuple[str, int], int] = {}
        for sent, lists in zip(self._sent, self._lists, strict=True):
            for role, expected in sent:
                count, rows = answers[at]
                at += 1
                if role == "dead":
                    count = len(rows)
                if expected >= 0 and count != expected:
                    if self._hoped:
                        return None
                    raise StoreError(
                        f"a batch's {role} of {expected} pair row(s) changed {count}, under their locks"
                    )
                if role == "versions" and rows and rows[0][0]:
                    relation = next(iter(lists))[0]
                    for item in str(rows[0][0]).split(";")[:-1]:  # (an item cut short is left out)
                        f, _sep, v = item.partition(":")
                        key = (relation, int(f))
                        if key in lists:
                            versions[key] = int(v) - lists[key][0]  # the version before
        return versions

    def noted(self, cur: Cursor, versions: dict[tuple[str, int], int], made: list[Change]) -> None:
        """Note each change (`PairWriter._changed`), with the version it made where ``versions``
        (from `checked`) has its list's; nothing where no list cache nor log takes them
        (``versions`` False: the caller's changes go nowhere)."""
        if not self.versions:
            return
        for e in self.entries:
            if e.kind is None:
                continue
            c = Change(e.side)
            key = (e.side.relation, e.side.from_id)
            before = versions.get(key)
            if before is not None:  # (else 0: the list has no counts row, as a write of one pair finds)
                versions[key] = c.version = before + 1
            self.writer._changed(cur, c, e.kind, 0 if e.kind == REMOVE else e.settled, made)
