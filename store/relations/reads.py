"""Batched relation reads: membership checks and first pages of many lists by host, pages with objects.

A feed shows many lists at once (twenty boards' first pins) and asks many
pairs at once (which of these pins the viewer liked). Asked one list at a
time, that is one round trip per list; here it is one per host:

- the list cache first, for every list in one round trip (one Redis
  pipeline of the same atomic read script a single list uses). A membership
  check is answered there only for a list cached whole (its meta says
  ``cached == n``) and trusted (read less than ``max_stale_s`` ago); a page
  when the cached head holds it, by the rules of `RelationService.page`;
- then the database, for the rest: one query per host covering all its
  shards (one per shard file on SQLite), hosts asked at once
  (`Engines.run_all`). Pages are a UNION ALL of one keyset subquery per list
  (``ORDER BY sequence, to_id LIMIT n`` on the ``(from_id, sequence,
  to_id)`` index): each reads only its own first rows. A ``ROW_NUMBER() OVER
  (PARTITION BY from_id ...)`` window would read every entry of every list
  first (MariaDB 10.11 has no top-n-per-partition shortcut: 54 ms against
  4 ms for twenty lists of 5,000). Membership is a primary-key ``to_id IN
  (...)`` per list;
- lists missed in the cache are filled with the version each was seen with,
  in one pipeline, exactly as a single list is (a writer's invalidation in
  between makes the fill fail); the fill's head and the list's count come
  from the same query as the answer (one snapshot). A membership check fills
  a list only if it fits in the cache whole (``cache.list_entries``): the
  query reads its head only if its kept count says so, so that a list too
  long for the cache costs a key read, not its first thousand rows.

Pages with their objects (`ObjectPages`: `Store.page_objects`,
`Store.pages_objects_many`, so `Store.board_pins` and `Store.board_pins_many`)
are one list read, then one batched object read:

- one list read (the list cache, else the list's index; `rows_many` for
  many lists), then one batched object read (one memcached batch per
  server; misses one query per host);
- an entry whose object is gone (soft-deleted; lists of relations without
  an inverse keep such entries) is skipped, and the page is filled from the
  entries after it, reading further in bigger steps (up to
  ``limits.max_page``) only then: a page is short only at the end of the list
  (or of its ``since``/``until`` range);
- ``next_cursor`` is the key of the last entry *read*, skipped or not, so
  the next page never reads a gone entry twice; it is a `page` cursor of
  the same list, direction and range (either call goes on with it).
"""

from __future__ import annotations

import functools
import sys
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar, cast

from store.backends.statements import int_array, with_part
from store.cache.lists import FillItem, decode_members, decode_to_ids, encode_member
from store.engines import Engines, ShardHandle
from store.ids import MAX_ID
from store.relations.inputs import id_list, pair_list
from store.relations.listcache import fill_size
from store.relations.repository import Page
from store.relations.service import RelationService
from store.routing import Router

__all__ = ["IN_CHUNK", "MAX_PARAMS", "Loader", "ObjectPages", "RelationReads", "check_to_ids"]

#: Parameters in one statement at most (SQLite allows 32,766, PostgreSQL 65,535): a batch that
#: needs more goes out as several queries to the host.
MAX_PARAMS = 30_000
#: to_ids per ``IN`` list at most; more for one from_id become several parts of the query.
IN_CHUNK = 1000

T = TypeVar("T")
Row = tuple[int, int]  # (sequence, to_id)
#: One list to read: its from_id, the key to go on after (None: from the start), rows wanted.
Ask = tuple[int, Row | None, int]


def _slices(items: list[T], cap: int, weight: Callable[[T], int]) -> list[list[T]]:
    """``items`` in order, cut into runs whose weights add up to at most ``cap`` (one item at least)."""
    out: list[list[T]] = []
    run: list[T] = []
    total = 0
    for item in items:
        w = weight(item)
        if run and total + w > cap:
            out.append(run)
            run, total = [], 0
        run.append(item)
        total += w
    if run:
        out.append(run)
    return out


_LOW4 = bytes(b & 0x0F for b in range(256))
_LOW6 = bytes(b & 0x3F for b in range(256))
_HIGH4 = bytes(b & 0xF0 for b in range(256))
#: Where the byte that holds bits 8 * (7 - k) + 7 .. 8 * (7 - k) of an ID sits in its 8 native bytes.
_BYTE = [k if sys.byteorder == "big" else 7 - k for k in range(8)]


def check_to_ids(router: Router, ids: list[int], type_name: str) -> None:
    """`Router.check_ids` for a long list, the common case checked without a Python loop.

    A Pinterest ID of type T has T in bits 45-36 (the low six bits of its
    third byte, most significant first, and the high four of its fourth) and
    a local id other than 0 in bits 35-0: the whole list is checked with
    slices of its bytes, and its top byte (or largest ID) for the shard. Anything this
    does not pass (a non-int, a negative ID, another type, local id 0) goes
    to `Router.check_ids`, which raises the precise error.
    """
    n = len(ids)
    if router.config.ids == "instagram":
        if n >= 16 and _instagram_ids_fit(ids, router.shard_map.shards):
            router.type(type_name)
            return
        router.check_ids(ids, type_name)
        return
    if router.config.ids == "pinterest" and n >= 16:
        type_id = router.type(type_name).id
        try:
            raw = array("Q", ids).tobytes()  # 8-byte items: see store.cache.lists
        except (TypeError, OverflowError):
            raw = b""
        shards = router.shard_map.shards
        b = _BYTE
        # The shard: with shards a multiple of 1,024, the top byte alone says (it also holds the
        # two reserved bits, which must be 0). Type 0 is left to check_ids: True and False pass it.
        if (
            raw
            and type_id
            and (max(raw[b[0] :: 8]) < shards >> 10 if shards % 1024 == 0 else max(ids) >> 46 < shards)
        ):
            local = int.from_bytes(raw[b[3] :: 8].translate(_LOW4))
            for k in (4, 5, 6, 7):
                local |= int.from_bytes(raw[b[k] :: 8])
            if (
                raw[b[2] :: 8].translate(_LOW6) == bytes([type_id >> 4]) * n
                and raw[b[3] :: 8].translate(_HIGH4) == bytes([(type_id & 0xF) << 4]) * n
                and b"\0" not in local.to_bytes(n)
            ):
                return
    router.check_ids(ids, type_name)


def _instagram_ids_fit(ids: list[int], shards: int) -> bool:
    """True if every one of ``ids`` is a positive 63-bit int whose shard bits (22-10) are below
    ``shards``, checked without a Python loop; False where that is not so or not checked this way.

    With ``shards`` a power of two, the bits of a shard at or above it are
    bits of the ID's 8 bytes, checked with slices of its bytes.
    """
    if set(map(type, ids)) != {int} or min(ids) <= 0 or max(ids) > MAX_ID:
        return False
    if shards >= 8192:
        return True
    if shards & (shards - 1):
        return False
    raw = array("Q", ids).tobytes()
    n = len(ids)
    above = (0x1FFF & ~(shards - 1)) << 10  # the shard bits of shards >= ``shards``
    for k in range(8):
        mask = (above >> (8 * (7 - k))) & 0xFF
        if mask and raw[_BYTE[k] :: 8].translate(_bits(mask)) != bytes(n):
            return False
    return True


@functools.cache
def _bits(mask: int) -> bytes:
    """A translate table keeping the bits of ``mask`` in every byte."""
    return bytes(b & mask for b in range(256))


@dataclass
class _Want:
    """What one list needs from the database: a page, a head to fill the cache with, membership."""

    h: ShardHandle
    from_id: int
    page: tuple[Row | None, int] | None = None  # (the key to go on after, rows)
    head: int = 0  # rows of the head to fill the cache with (0: no fill)
    fits: bool = False  # the head only if the whole list fits in it (its count <= head)
    newest: bool = False  # the page and the head from the newest end
    linked: list[int] | None = None  # to_ids whose membership is asked


@dataclass
class _Got:
    """What the database answered for one `_Want`."""

    page: list[Row] = field(default_factory=list)
    head: list[Row] = field(default_factory=list)
    count: int = 0
    linked: set[int] = field(default_factory=set)


@dataclass
class _Batch:
    """One query's parts for one host (or shard file): texts and parameters."""

    h: ShardHandle
    texts: list[str] = field(default_factory=list)
    params: list[Any] = field(default_factory=list)


class RelationReads:
    """Membership checks and first pages of many lists, one round trip per host (see the module)."""

    def __init__(self, relations: RelationService, engines: Engines) -> None:
        self._rel = relations
        self._engines = engines
        self._router = relations.router

    # -- membership ------------------------------------------------------------

    def has_links(self, relation: str, from_id: int, to_ids: Iterable[int]) -> set[int]:
        """Which of ``to_ids`` are in ``from_id``'s list: the cached list if whole, else one query.

        A list the cache does not hold is cached by the same query when it is
        short enough to be cached whole (``cache.list_entries``).
        """
        spec = self._router.relation(relation)
        h = self._rel.handle(spec, from_id)
        wanted = id_list(to_ids, "to_ids", unique=False, limit=self._router.config.max_ids)
        check_to_ids(self._router, wanted, spec.to_type)  # (repeats do no harm)
        if not wanted:
            return set()
        lists = self._rel.lists
        if lists is not None:
            read = lists.read(self._rel.list_key(relation, from_id), ("all",))
            if read is not None and read.complete:
                lists.stats.add(hits=1)
                return set(decode_to_ids(read.members)).intersection(wanted)
            if read is not None:
                lists.stats.add(misses=1)
                if read.meta is None:  # not cached: fill it (if whole) from the same query
                    want = _Want(h, from_id, head=lists.entries, fits=True, linked=wanted)
                    return self._answer_and_fill(relation, [want], [read.version])[0].linked
        if h.backend.pipelines:  # (the to_ids as one array: one prepared text)
            sql = self._rel.repo.sql(h, relation).linked_any
            return {int(t) for (t,) in h.read(sql, [int_array(wanted), from_id], one=False)}
        stmts = self._rel.repo.statements(h, relation)
        linked = self._rel.repo.sql(h, relation).linked
        chunk = max(1, self._router.config.id_chunk - 1)  # to_ids beside the from_id
        if len(wanted) <= chunk:
            sql = stmts.in_list(linked, len(wanted))
            return {int(t) for (t,) in h.read(sql, [from_id, *wanted], one=False)}
        # More than one query carries (limits.id_chunk): several bounded ones, at once.
        ids = list(dict.fromkeys(wanted))
        jobs = [
            partial(h.read, stmts.in_list(linked, len(part)), [from_id, *part], one=False)
            for part in (ids[k : k + chunk] for k in range(0, len(ids), chunk))
        ]
        return {int(t) for rows in self._engines.run_all(jobs) for (t,) in rows}

    def has_links_many(self, relation: str, pairs: Iterable[tuple[int, int]]) -> set[tuple[int, int]]:
        """Which of ``pairs`` (from_id, to_id) exist: cached whole lists, then one query per host."""
        spec = self._router.relation(relation)
        config = self._router.config
        wanted = pair_list(pairs, limit=config.max_ids)
        check_to_ids(self._router, [t for _f, t in wanted], spec.to_type)
        groups: dict[int, list[int]] = {}
        for f, t in wanted:
            groups.setdefault(f, []).append(t)
        wants = [_Want(self._rel.handle(spec, f), f, linked=ts) for f, ts in groups.items()]
        if len(wanted) <= config.id_chunk:
            return self._has_links_of(relation, wants)
        # Every ID is checked above; the call goes on in pieces of at most limits.id_chunk pairs.
        found: set[tuple[int, int]] = set()
        for piece in _slices(wants, config.id_chunk, lambda w: len(w.linked or ())):
            found |= self._has_links_of(relation, piece)
        return found

    def _has_links_of(self, relation: str, wants: list[_Want]) -> set[tuple[int, int]]:
        """`has_links_many` for checked lists: cached whole lists, then one query per host."""
        if not wants:
            return set()
        found: set[tuple[int, int]] = set()
        versions: list[bytes | None] = [None] * len(wants)
        lists = self._rel.lists
        if lists is not None:
            keys = [self._rel.list_key(relation, w.from_id) for w in wants]
            reads = lists.read_many(keys, [("all",)] * len(keys))
            asked: list[_Want] = []
            hits = misses = 0
            for w, read in zip(wants, reads, strict=True):
                if read is not None and read.complete:
                    members = set(decode_to_ids(read.members))
                    found.update((w.from_id, t) for t in members.intersection(w.linked or ()))
                    hits += 1
                    continue
                if read is not None:
                    misses += 1
                    if read.meta is None:  # not cached: fill it (if whole) from the same query
                        w.head, w.fits = lists.entries, True
                        versions[len(asked)] = read.version
                asked.append(w)
            lists.stats.add(hits=hits, misses=misses)
            wants = asked
        got = self._answer_and_fill(relation, wants, versions[: len(wants)])
        for w, g in zip(wants, got, strict=True):
            found.update((w.from_id, t) for t in g.linked)
        return found

    def _answer_and_fill(
        self, relation: str, wants: list[_Want], versions: Sequence[bytes | None]
    ) -> list[_Got]:
        """`_query`, then fill the lists that asked for a head (with the version each was seen with)."""
        lists = self._rel.lists
        read_ms = 0 if lists is None else lists.clock_ms()  # before the database read
        got = self._query(relation, wants)
        if lists is not None:
            fills: list[FillItem] = [
                (self._rel.list_key(relation, w.from_id), v, g.count, g.head, read_ms, w.newest)
                for w, g, v in zip(wants, got, versions, strict=True)
                if w.head and (not w.fits or g.count <= w.head)
            ]
            lists.fill_many(fills)
        return got

    # -- pages -------------------------------------------------------------------

    def pages_many(
        self, relation: str, from_ids: Iterable[int], *, limit: int = 50, newest_first: bool = False
    ) -> dict[int, Page]:
        """The first page of each list (oldest first, or newest), as `RelationService.page` gives it,
        by from_id."""
        self._router.relation(relation)
        self._rel.check_limit(limit)
        self._rel.check_order(newest_first)
        ids = id_list(from_ids, "from_ids", limit=self._router.config.max_ids)
        got = self.rows_many(relation, [(f, None, limit + 1) for f in ids], newest_first=newest_first)
        out: dict[int, Page] = {}
        for f, rows in zip(ids, got, strict=True):
            cursor = None
            if len(rows) > limit:
                cursor = self._rel.encode_cursor(relation, f, newest_first, *rows[limit - 1])
            out[f] = Page([t for _s, t in rows[:limit]], cursor)
        return out

    def rows_many(self, relation: str, asks: Sequence[Ask], *, newest_first: bool = False) -> list[list[Row]]:
        """For each (from_id, after, want): up to ``want`` rows after ``after``, oldest first (or newest).

        Cached lists answer from one pipeline; the rest come from one query
        per host, and lists the cache did not hold are filled (version-checked).
        """
        spec = self._router.relation(relation)
        handles = [self._rel.handle(spec, f) for f, _a, _w in asks]
        chunk = self._router.config.id_chunk
        if len(asks) <= chunk:
            return self._rows_of(relation, asks, handles, newest_first)
        # Every ID is checked above; the lists are read in pieces of at most limits.id_chunk.
        out: list[list[Row]] = []
        for k in range(0, len(asks), chunk):
            out += self._rows_of(relation, asks[k : k + chunk], handles[k : k + chunk], newest_first)
        return out

    def _rows_of(
        self, relation: str, asks: Sequence[Ask], handles: list[ShardHandle], newest_first: bool
    ) -> list[list[Row]]:
        """`rows_many` for checked lists, ``handles`` their shards: the cache, then one query per host.

        A cached head serves a list when it is complete, or when it is the end the read starts
        from and holds the rows asked for; a head of the other end is a miss that fills the list
        again with this read's end (as `RelationService.page` does)."""
        out: list[list[Row] | None] = [None] * len(asks)
        seen: dict[int, bytes | None] = {}  # ask -> the version its list had when it missed
        lists = self._rel.lists
        if lists is not None and asks:
            keys = [self._rel.list_key(relation, f) for f, _a, _w in asks]
            ops: list[tuple[object, ...]] = [
                ("rank", 0, want - 1, newest_first)
                if after is None
                else ("after", encode_member(*after), want, newest_first)
                for _f, after, want in asks
            ]
            hits = misses = 0
            for i, read in enumerate(lists.read_many(keys, ops)):
                if read is None:
                    continue  # the cache failed: the database answers, and nothing is filled
                _f, after, want = asks[i]
                if read.meta is None:
                    misses += 1
                    seen[i] = read.version
                    continue
                rows = decode_members(read.members)
                mine = read.newest == newest_first  # the head is the end this read starts from
                if read.complete or (
                    mine and (len(rows) >= want if after is not None else want <= read.meta[1])
                ):
                    out[i] = rows
                    hits += 1
                else:
                    misses += 1  # beyond the cached head
                    if not mine:
                        seen[i] = read.version  # the other end: filled again with this one
            lists.stats.add(hits=hits, misses=misses)
        pending = [i for i in range(len(asks)) if out[i] is None]
        if not pending:
            return [rows for rows in out if rows is not None]
        size = 0 if lists is None else fill_size(lists.entries, max(w for _f, _a, w in asks))
        wants: list[_Want] = []
        for i in pending:
            f, after, want = asks[i]
            w = _Want(handles[i], f, newest=newest_first)
            if i in seen:
                w.head = size
            if i not in seen or after is not None or size < want:
                w.page = (after, want)
            wants.append(w)
        got = self._answer_and_fill(relation, wants, [seen.get(i) for i in pending])
        for i, w, g in zip(pending, wants, got, strict=True):
            if w.page is not None:
                out[i] = g.page
            else:
                out[i] = g.head[::-1][: asks[i][2]] if newest_first else g.head[: asks[i][2]]
        return [rows if rows is not None else [] for rows in out]

    def _query(self, relation: str, wants: list[_Want]) -> list[_Got]:
        """What each of ``wants`` asks of the database: one UNION ALL query per host, hosts at once.

        Part labels: 4 * want for its page, + 1 for its head, + 2 for its count, + 3 for membership.
        """
        repo = self._rel.repo
        parts: list[_Part] = []
        for i, w in enumerate(wants):
            h, f = w.h, w.from_id
            sql = repo.sql(h, relation)
            first, further = (
                (sql.part_page_desc, sql.part_page_desc_after)
                if w.newest
                else (sql.part_page_asc, sql.part_page_asc_after)
            )
            if w.page is not None:
                after, n = w.page
                if after is None:
                    parts.append((h, first, 4 * i, [f, n]))
                else:
                    seq, to_id = after
                    parts.append((h, further, 4 * i, [f, seq, seq, to_id, n]))
            if w.head:
                if w.fits:
                    parts.append((h, sql.part_head_fits, 4 * i + 1, [f, relation, f, w.head, w.head]))
                else:
                    parts.append((h, first, 4 * i + 1, [f, w.head]))
                parts.append((h, sql.part_count, 4 * i + 2, [relation, f]))
            if w.linked and h.backend.pipelines:  # (the to_ids as one array: one prepared text)
                parts.append((h, sql.part_linked_any, 4 * i + 3, [int_array(w.linked), f]))
            elif w.linked:
                stmts = repo.statements(h, relation)
                step = max(1, min(IN_CHUNK, self._router.config.id_chunk - 1))  # (+ the from_id)
                for k in range(0, len(w.linked), step):
                    chunk = w.linked[k : k + step]
                    parts.append((h, stmts.in_list(sql.part_linked, len(chunk)), 4 * i + 3, [f, *chunk]))
        got = [_Got() for _ in wants]
        for label, a, b in self._run(parts):
            i, kind = divmod(int(label), 4)
            g = got[i]
            if kind == 0:
                g.page.append((int(a), int(b)))
            elif kind == 1:
                g.head.append((int(a), int(b)))
            elif kind == 2:
                g.count = int(a)
            else:
                g.linked.add(int(b))
        for w, g in zip(wants, got, strict=True):
            g.page.sort(reverse=w.newest)  # UNION ALL keeps no order across the parts' rows
            g.head.sort()  # (a head is kept in list order, whichever end it is)
        return got

    # -- running the parts ---------------------------------------------------------

    def _run(self, parts: list[_Part]) -> list[Any]:
        """Every row of ``parts`` (a statement's text with its rows' label to put in, and its
        parameters), each row led by its part's label: one request per host (per shard file),
        the hosts at once.

        Where the driver pipelines (`Backend.pipelines`), a host's parts are its statements in
        one pipeline, each text as it always is (its label 0, put back on its rows here): every
        one is prepared once per connection. Elsewhere they are one UNION ALL, labelled in the
        text; a query carries at most ``limits.id_chunk`` parameters (and `MAX_PARAMS`): a host
        given more gets several queries.
        """
        cap = min(MAX_PARAMS, self._router.config.id_chunk)
        batches: dict[tuple[str, int], list[_Batch]] = {}
        pipelined: dict[str, list[_Part]] = {}
        for part in parts:
            h, text, label, params = part
            if h.backend.pipelines:
                pipelined.setdefault(h.host, []).append(part)
                continue
            key = (h.host, h.shard if h.backend.pool_per_shard else -1)
            queue = batches.setdefault(key, [])
            if not queue or len(queue[-1].params) + len(params) > cap:
                queue.append(_Batch(h))
            queue[-1].texts.append(with_part(text, label))
            queue[-1].params.extend(params)
        jobs: list[Callable[[], list[Any]]] = [
            partial(b.h.read, " UNION ALL ".join(b.texts), b.params, one=False)
            for queue in batches.values()
            for b in queue
        ]
        jobs += [partial(_pipelined, mine) for mine in pipelined.values()]
        rows: list[Any] = []
        for got in self._engines.run_all(jobs):
            rows.extend(got)
        return rows


#: One statement of a multi-list read: its shard, its text (with a label to put in,
#: `with_part`), the label, its parameters.
_Part = tuple[ShardHandle, str, int, list[Any]]


def _pipelined(parts: list[_Part]) -> list[Any]:
    """The rows of one host's ``parts`` in one request (`ShardHandle.read_pipelined`), each led
    by its part's label."""
    answers = parts[0][0].read_pipelined([(with_part(text, 0), params) for _h, text, _l, params in parts])
    return [
        (label, *row[1:]) for (_h, _t, label, _p), rows in zip(parts, answers, strict=True) for row in rows
    ]


# -- pages with their objects ----------------------------------------------------------

#: Reads objects by ID, all of one type: ``load(ids, type_name)`` -> the live ones, by ID.
Loader = Callable[[list[int], str], dict[int, dict[str, Any]]]


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
