"""Pages of a relation list with the objects they name: one list read, one batched object read.

A page of a list of IDs is rarely shown as IDs: a board shows its pins, a
user their followers. `ObjectPages` reads a page of any relation (the
to-type's objects), and the first pages of many lists at once, with the
objects:

- one list read (the list cache, else the list's index), then one batched
  object read (one memcached batch per server; misses one query per host);
- an entry whose object is gone (soft-deleted; lists of relations without
  an inverse keep such entries) is skipped, and the page is filled from the
  entries after it, reading further in bigger steps (up to
  ``limits.max_page``) only then: a page is short only at the end of the list
  (or of its ``since``/``until`` range);
- ``next_cursor`` is the key of the last entry *read*, skipped or not, so
  the next page never reads a gone entry twice; it is a `page` cursor of
  the same list, direction and range (either call goes on with it).

`Store.page_objects` and `Store.pages_objects_many` call it;
`Store.board_pins` and `Store.board_pins_many` are those for ``board_has_pins``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, cast

from store.relation_reads import RelationReads, id_list
from store.relations import Page, RelationService

__all__ = ["Loader", "ObjectPages"]

#: Reads objects by ID, all of one type: ``load(ids, type_name)`` -> the live ones, by ID.
Loader = Callable[[list[int], str], dict[int, dict[str, Any]]]
Row = tuple[int, int]  # (sequence, to_id)


@dataclass
class _Filling:
    """One list's page while it fills: what to read next and what it holds so far."""

    want: int
    after: Row | None = None
    more: bool = True
    ids: list[int] = field(default_factory=list)
    objects: list[dict[str, Any]] = field(default_factory=list)

    def take(self, rows: list[Row], more: bool, found: dict[int, dict[str, Any]], limit: int) -> None:
        """Add ``rows``' live objects (up to ``limit`` in all); ``more``: entries follow ``rows``."""
        ids = [t for _s, t in rows]
        objects = [found.get(t) for t in ids]
        if None not in objects and len(self.ids) + len(rows) <= limit:
            # The usual case: every object is there and the page takes every row.
            self.ids += ids
            self.objects += cast(list[dict[str, Any]], objects)  # (no None in it)
            if rows:
                self.after = rows[-1]
            self.more = more
            return
        for i, (seq, to_id) in enumerate(rows):
            self.after = (seq, to_id)
            obj = found.get(to_id)
            if obj is not None:
                self.ids.append(to_id)
                self.objects.append(obj)
                if len(self.ids) == limit:
                    more = more or i + 1 < len(rows)
                    break
        self.more = more

    def done(self, limit: int) -> bool:
        """True once the page is full or the list (range) has no more entries."""
        return len(self.ids) >= limit or not self.more


class ObjectPages:
    """Pages of relation lists with their objects (see the module)."""

    def __init__(self, relations: RelationService, reads: RelationReads, load: Loader) -> None:
        self._rel = relations
        self._reads = reads
        self._load = load
        self._router = relations.router

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
        """One page of ``from_id``'s list with the objects, as `RelationService.page` pages it.

        ``since``/``until`` and ``cursor`` mean what they mean for `page`; the
        objects are of the relation's to-type, aligned with ``ids``.
        """
        spec = self._router.relation(relation)
        rel = self._rel
        rel.check_limit(limit)
        rel.check_order(newest_first)
        rel.check_range(since, until)
        h = rel.handle(spec, from_id)
        state = _Filling(limit)
        if cursor is not None:
            state.after = rel.decode_cursor(cursor, relation, from_id, newest_first, since=since, until=until)
        cap = self._router.config.max_page
        while True:
            rows, more = rel.rows_after(
                relation,
                from_id,
                state.after,
                state.want,
                newest_first=newest_first,
                since=since,
                until=until,
                h=h,
            )
            found = self._load([t for _s, t in rows], spec.to_type)
            state.take(rows, more, found, limit)
            if state.done(limit):
                break
            state.want = min(cap, 2 * state.want)  # gone objects: read further, in bigger steps
        return self._page(relation, from_id, newest_first, state, since, until)

    def first_pages(
        self, relation: str, from_ids: Iterable[int], *, limit: int = 50, newest_first: bool = False
    ) -> dict[int, Page]:
        """The first page of each list with its objects, by from_id, as `page` fills one.

        The lists as `RelationReads.rows_many` reads them (the list cache in
        one round trip, the rest one query per host), then every page's
        objects in one batched read. Only the lists that lost entries to gone
        objects are read again, all of them together, in bigger steps.
        """
        spec = self._router.relation(relation)
        self._rel.check_limit(limit)
        self._rel.check_order(newest_first)
        ids = id_list(from_ids, "from_ids", limit=self._router.config.max_ids)
        cap = self._router.config.max_page
        state = {f: _Filling(limit) for f in ids}
        pending = ids
        while pending:
            asks = [(f, state[f].after, state[f].want + 1) for f in pending]
            got = self._reads.rows_many(relation, asks, newest_first=newest_first)
            found = self._load(list(dict.fromkeys(t for rows in got for _s, t in rows)), spec.to_type)
            again: list[int] = []
            for f, rows in zip(pending, got, strict=True):
                s = state[f]
                s.take(rows[: s.want], len(rows) > s.want, found, limit)
                if not s.done(limit):
                    s.want = min(cap, 2 * s.want)
                    again.append(f)
            pending = again
        return {f: self._page(relation, f, newest_first, s) for f, s in state.items()}

    def _page(
        self,
        relation: str,
        from_id: int,
        newest_first: bool,
        s: _Filling,
        since: int | None = None,
        until: int | None = None,
    ) -> Page:
        """The `Page` of a filled list: its cursor goes on after the last entry read."""
        cursor = None
        if s.more and s.after is not None:
            cursor = self._rel.encode_cursor(
                relation, from_id, newest_first, *s.after, since=since, until=until
            )
        return Page(s.ids, cursor, s.objects)
