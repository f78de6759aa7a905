"""The store's statements, built with SQLAlchemy Core and compiled once to each driver's SQL text.

A statement is built on the table as `store.backends.tables` defines it,
with the shard's schema written as `SHARD`; it is compiled once per
(backend, table), and each shard's text is that text with its own schema
name in place, made the first time the shard is used. A call then costs a
dict look-up, as hand-written SQL would: building a `select()` per call
measured +70-80 us per statement, a prebuilt one +20-25 us, a compiled
text none.

Parameters are positional, in the order each statement's docstring gives
(checked when it is compiled).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
    MetaData,
    and_,
    any_,
    bindparam,
    cast,
    delete,
    exists,
    func,
    insert,
    literal_column,
    or_,
    select,
    update,
)
from sqlalchemy import table as sa_table
from sqlalchemy.sql.elements import BindParameter, ClauseElement, ColumnClause, Label

from store.backends import COUNTED_TAIL, Backend
from store.backends.tables import SHARD, counts_table, object_table, relation_table
from store.cache.follower import VERSION_MARK

__all__ = [
    "GuardedInsertStatements",
    "ObjectStatements",
    "PairRowsStatements",
    "RelationStatements",
    "Statements",
    "counted_with_log",
    "expand_rows",
    "int_array",
    "with_part",
]

_ONE: ColumnClause[Any] = literal_column("1")
_ZERO: ColumnClause[Any] = literal_column("0")
_TRUE: ColumnClause[Any] = literal_column("true")
_PART = "__part__"
_IN = "__in__"
_ROWS = "__rows__"
_CASE_N = "__case_n__"
_CASE_V = "__case_v__"


#: A relation's name, as the config checks it: safe to write into a statement's text.
_RELATION_NAME = re.compile(r"[a-z_][a-z0-9_]{0,63}")


def _p(name: str) -> BindParameter[Any]:
    return bindparam(name)


def int_array(values: Sequence[int]) -> str:
    """An array of ints as its text (``{1,2,3}``), for a ``bigint[]`` parameter: bound as one
    string, where a list would be bound element by element by the driver."""
    return "{" + ",".join(map(str, values)) + "}"


class Statements:
    """Compiled statements of one table on one backend; ``for_shard(n)`` gives shard n's texts."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        # SHARD where statements name the shard's schema; SQLite's run on the shard's own file.
        self.schema = None if backend.statement_schema(0) is None else SHARD
        self._templates: dict[str, str] = {}
        self._shards: dict[int, dict[str, str]] = {}
        #: The parameter names of statements whose order differs by backend (MariaDB writes LIMIT o, n).
        self.orders: dict[str, tuple[str, ...]] = {}

    def _add(self, name: str, stmt: ClauseElement, params: Sequence[str], *, any_order: bool = False) -> None:
        sql, order = self.backend.compile(stmt)
        if any_order:
            if sorted(order) != sorted(params):
                raise AssertionError(f"{name}: compiled parameters {order} are not {tuple(params)}")
            self.orders[name] = tuple(order)
        elif tuple(order) != tuple(params):
            raise AssertionError(f"{name}: compiled parameter order {order} is not {tuple(params)}")
        self._templates[name] = sql

    def _add_counted(
        self,
        name: str,
        write: ClauseElement,
        write_params: Sequence[str],
        count: ClauseElement,
        count_params: Sequence[str],
    ) -> None:
        """Statement ``name``: ``write`` and ``count`` as one, where `Backend.counted_writes`.

        A data-modifying CTE: ``count`` reads the rows ``write`` changed from ``w`` (it runs on
        none if the write changed none), and the statement returns a row per changed row, so its
        rowcount is the write's; the row holds the list's version the count left
        (`store.backends.COUNTED_TAIL`). Parameters: ``write``'s, then ``count``'s.
        """
        texts = []
        for stmt, params in ((write, write_params), (count, count_params)):
            sql, order = self.backend.compile(stmt)
            if tuple(order) != tuple(params):
                raise AssertionError(f"{name}: compiled parameter order {order} is not {tuple(params)}")
            texts.append(sql)
        w, c = texts
        self._templates[name] = f"WITH w AS ({w} RETURNING 1), c AS ({c} RETURNING version){COUNTED_TAIL}"

    def for_shard(self, shard: int) -> dict[str, str]:
        """Every statement's text for shard ``shard`` (made on first use, then kept)."""
        texts = self._shards.get(shard)
        if texts is None:
            name = self.backend.statement_schema(shard)
            quoted = (
                name if name is None else self.backend.sa_dialect.identifier_preparer.quote_identifier(name)
            )
            texts = {
                k: (v if quoted is None else v.replace(SHARD, quoted)) for k, v in self._templates.items()
            }
            self._shards[shard] = texts
        return texts


class ObjectStatements(Statements):
    """The statements of one object table (``key`` is ``local_id``, or ``id`` for Instagram IDs).

    - insert (data) [RETURNING id]; select (key); select_version (key): data, version;
      lock (key) FOR UPDATE: data, active, version;
    - update (data, key): the new data, one more version;
    - delete: soft, (key); remove: hard, (key); live_shared (key);
    - insert_pending (data) [RETURNING id]: a row not live yet (active 0, version 0), for a
      create whose unique keys are claimed in its ID's name before it goes live;
    - activate (key): a pending row goes live at version 1 (rowcount 0: it was abandoned);
    - abandon (key): a pending row can never go live (it reads as deleted, version 1);
    - state (key): active, version, data of the row whatever its state;
    - `select_many` (key, ...) for n keys, labelled with a part number;
    - select_any (keys as one array text), where the driver pipelines: key, data of each live one.
    """

    def __init__(self, backend: Backend, table: str, *, ids: str) -> None:
        super().__init__(backend)
        self.ids = ids
        t = self.table = object_table(
            MetaData(), table, backend.column_types(), ids=ids, schema=self.schema, shard=0
        )
        key = self.key = t.c["id" if ids == "instagram" else "local_id"]
        k = _p("k")
        ins = insert(t).values(data=_p("data"))
        self._add("insert", ins.returning(key) if ids == "instagram" else ins, ["data"])
        pending = insert(t).values(data=_p("data"), active=_ZERO, version=_ZERO)
        self._add("insert_pending", pending.returning(key) if ids == "instagram" else pending, ["data"])
        self._add("select", select(t.c.data).where(key == k, t.c.active == _ONE), ["k"])
        self._add("select_version", select(t.c.data, t.c.version).where(key == k, t.c.active == _ONE), ["k"])
        self._add("lock", select(t.c.data, t.c.active, t.c.version).where(key == k).with_for_update(), ["k"])
        touch = {} if backend.ts_now() is None else {"ts": backend.ts_now()}
        bump = update(t).where(key == k).values(data=_p("data"), version=t.c.version + _ONE, **touch)
        self._add("update", bump, ["data", "k"])
        soft = update(t).where(key == k, t.c.active == _ONE).values(active=_ZERO, **touch)
        self._add("delete", soft, ["k"])
        is_pending = (key == k, t.c.active == _ZERO, t.c.version == _ZERO)
        self._add("activate", update(t).where(*is_pending).values(active=_ONE, version=_ONE, **touch), ["k"])
        self._add("abandon", update(t).where(*is_pending).values(version=_ONE), ["k"])
        self._add("state", select(t.c.active, t.c.version, t.c.data).where(key == k), ["k"])
        self._add("remove", delete(t).where(key == k), ["k"])
        # For a link: is the object live? Read in share mode, so a delete waits for the link.
        self._add("live_shared", select(t.c.active).where(key == k).with_for_update(read=True), ["k"])
        if backend.pipelines:
            # Many keys of one shard as one array parameter (``{1,2,3}``): one text per shard,
            # whatever the number of keys, so it is prepared once (`ObjectRows.get_many_rows`).
            keys = cast(_p("ks"), ARRAY(BigInteger))
            self._add(
                "select_any", select(key, t.c.data).where(t.c.active == _ONE, key == any_(keys)), ["ks"]
            )
        self._many: dict[int, str] = {}

    def select_many(self, n: int) -> str:
        """``SELECT part, key, data ... WHERE active AND key IN (n keys)``, shard and part to fill in."""
        sql = self._many.get(n)
        if sql is None:
            t, key = self.table, self.key
            names = [f"k{i}" for i in range(n)]
            stmt = select(literal_column(_PART).label("part"), key, t.c.data).where(
                t.c.active == _ONE, key.in_([_p(name) for name in names])
            )
            sql, order = self.backend.compile(stmt)
            assert list(order) == names
            self._many[n] = sql
        return sql

    def select_many_for(self, shard: int, part: int, n: int) -> str:
        """`select_many` for shard ``shard``, labelled ``part``."""
        name = self.backend.statement_schema(shard)
        sql = self.select_many(n).replace(_PART, str(part))
        if name is None:
            return sql
        return sql.replace(SHARD, self.backend.sa_dialect.identifier_preparer.quote_identifier(name))


class RelationStatements(Statements):
    """The statements of one relation table and its lists' counts. Parameters, in order:

    - insert (from, to, seq): skips a pair that exists (rowcount 0);
    - move (seq, from, to); move_if_other (seq, from, to, seq); delete (from, to);
    - exists (from, to); exists_locked (from, to) FOR UPDATE;
    - count_up (relation, from, n): adds n; count_down (relation, from); bump (relation, from): a
      move; each bumps the list's version and returns it where `Backend.list_versions`;
      count_up_if, count_down_if, bump_if (same parameters), where `Backend.conditional_writes`:
      the same, only if the statement before them in the request changed one row;
      version_of (relation, from); count (relation, from);
    - count_set (relation, from, n); lock_count (from): counts the list, rows locked;
    - counts_kept (relation); counts_actual ();
    - scan (limit); scan_after (from, from, to, limit);
    - list_asc / list_desc: (f, lim, off) in the backend's order, given by ``orders``;
    - page_asc / page_desc (from, limit); page_asc_after / page_desc_after (from, seq, seq, to, limit);
    - page_asc_range / page_desc_range (from, low, high, limit): entries with low <= sequence <= high;
      page_asc_range_after / page_desc_range_after (from, low, high, seq, seq, to, limit);
    - part_page_asc / part_page_desc (from, limit), part_page_asc_after / part_page_desc_after
      (from, seq, seq, to, limit), part_count
      (relation, from), part_head_fits (from, relation, from, fits, limit: the head, only if the
      list's count is <= fits), part_linked (from, tos...): rows labelled with a part number
      (`with_part`), for one UNION ALL query over many lists (`store.relations.reads`);
    - head_packed (relation, from, from, limit), MariaDB/MySQL and PostgreSQL: "count:version"
      (PostgreSQL: the count) and the first entries packed in one value (a list fill's read);
      head_packed_desc: the same with the last entries (still packed in list order);
    - linked (from, tos...): which to_ids are linked from one from_id; the IN list is made
      for n to_ids by `in_list`.
    """

    def __init__(self, backend: Backend, relation: str) -> None:
        super().__init__(backend)
        md = MetaData()
        types = backend.column_types()
        t = self.table = relation_table(md, relation, types, schema=self.schema)
        c = counts_table(md, types, schema=self.schema)
        f, to, seq = t.c.from_id, t.c.to_id, t.c.sequence
        pf, pt, ps = _p("f"), _p("t"), _p("s")
        pair = and_(f == pf, to == pt)
        self._add("insert", backend.upsert_skip(t).values(from_id=pf, to_id=pt, sequence=ps), ["f", "t", "s"])
        self._add("move", update(t).where(pair).values(sequence=ps), ["s", "f", "t"])
        other = update(t).where(pair, seq != _p("s2")).values(sequence=ps)
        self._add("move_if_other", other, ["s", "f", "t", "s2"])
        self._add("delete", delete(t).where(pair), ["f", "t"])
        self._add("exists", select(seq).where(pair), ["f", "t"])
        self._add("exists_locked", select(seq).where(pair).with_for_update(), ["f", "t"])
        if backend.name == "mysql":
            # MariaDB can read a short list's pair for a write (a DELETE, an UPDATE of the
            # sequence) through (from_id, sequence, to_id), locking every row of the list, and in
            # the other order than a write through the primary key takes: the two deadlock. Each
            # write of one pair names the primary key, and then locks that one row.
            for name in ("delete", "move", "move_if_other", "exists_locked"):
                self._templates[name] = _by_primary_key(self._templates[name])
        key = ("relation", "from_id")
        rel, cf, n = _p("r"), _p("cf"), _p("n")
        # Each statement that changes a list's rows bumps its version, and returns the new one
        # where the backend can (`Backend.returned`): a new counts row starts at 1.
        bumped = backend.returned(c.c.version + _ONE)
        up = backend.upsert_add(c, key, "n", also={"version": bumped})
        self._add(
            "count_up",
            up.values(relation=rel, from_id=cf, n=n, version=backend.returned(_ONE)),
            ["r", "cf", "n"],
        )
        this_list = (c.c.relation == rel, c.c.from_id == cf)
        down = update(c).where(*this_list).values(n=c.c.n - _ONE, version=bumped)
        self._add("count_down", down, ["r", "cf"])
        self._add("bump", update(c).where(*this_list).values(version=bumped), ["r", "cf"])
        self._add("version_of", select(c.c.version).where(*this_list), ["r", "cf"])
        if backend.conditional_writes:
            # The same three, run only if the statement before them changed one row
            # (ROW_COUNT() = 1): sent with a pair write in one request, they count what it did.
            did = func.row_count() == _ONE
            src = select(rel, cf, n, backend.returned(_ONE)).where(did)
            up_if = backend.upsert_add(c, key, "n", also={"version": bumped})
            self._add(
                "count_up_if",
                up_if.from_select(["relation", "from_id", "n", "version"], src),
                ["r", "cf", "n"],
            )
            self._add("count_down_if", down.where(did), ["r", "cf"])
            self._add("bump_if", update(c).where(*this_list, did).values(version=bumped), ["r", "cf"])
        if backend.counted_writes:
            # A pair write and its count as one statement (`Statements._add_counted`).
            pair_params = ["s", "f", "t", "s2"]
            self._add_counted("move_if_other_counted", other, pair_params, _bump_of(c, rel, cf), ["r", "cf"])
            self._add_counted(
                "delete_counted", delete(t).where(pair), ["f", "t"], _count_down_of(c, rel, cf), ["r", "cf"]
            )
        self._add("count", select(c.c.n).where(c.c.relation == rel, c.c.from_id == cf), ["r", "cf"])
        # A recount changes no row of the list but its count: a new version all the same, so a
        # cached list that holds the old count is never taken for current.
        setn = backend.upsert_set(c, key, "n", also={"version": c.c.version + _ONE}).values(
            relation=rel, from_id=cf, n=n
        )
        self._add("count_set", setn, ["r", "cf", "n"])
        # PostgreSQL refuses FOR UPDATE with an aggregate: lock the rows in a subquery (all backends).
        locked = select(_ONE).where(f == pf).with_for_update().subquery()
        self._add("lock_count", select(func.count()).select_from(locked), ["f"])
        self._add("counts_kept", select(c.c.from_id, c.c.n).where(c.c.relation == rel, c.c.n != _ZERO), ["r"])
        self._add("counts_actual", select(f, func.count()).group_by(f), [])
        rows = select(f, to, seq).order_by(f, to)
        lim, off = _p("lim"), _p("off")
        # An explicit OFFSET 0: SQLite's compiler adds an OFFSET parameter to a LIMIT otherwise.
        self._add("scan", rows.limit(lim).offset(_ZERO), ["lim"])
        after = and_(f >= _p("a1"), or_(f > _p("a2"), to > _p("a3")))
        self._add("scan_after", rows.where(after).limit(lim).offset(_ZERO), ["a1", "a2", "a3", "lim"])
        ids = select(to).where(f == pf)
        asc_ids = ids.order_by(seq, to).limit(lim).offset(off)
        self._add("list_asc", asc_ids, ["f", "lim", "off"], any_order=True)
        desc_ids = ids.order_by(seq.desc(), to.desc()).limit(lim).offset(off)
        self._add("list_desc", desc_ids, ["f", "lim", "off"], any_order=True)
        # Keyset pages: `sequence >= s` is the index range; the OR only sorts
        # out ties at the boundary, so page 2,000 reads what page 1 reads.
        keyed = select(seq, to).where(f == pf)
        asc, desc = (seq, to), (seq.desc(), to.desc())
        self._add("page_asc", keyed.order_by(*asc).limit(lim).offset(_ZERO), ["f", "lim"])
        self._add("page_desc", keyed.order_by(*desc).limit(lim).offset(_ZERO), ["f", "lim"])
        s1, s2, tk = _p("s1"), _p("s2"), _p("tk")
        fwd = keyed.where(seq >= s1, or_(seq > s2, to > tk)).order_by(*asc).limit(lim).offset(_ZERO)
        back = keyed.where(seq <= s1, or_(seq < s2, to < tk)).order_by(*desc).limit(lim).offset(_ZERO)
        self._add("page_asc_after", fwd, ["f", "s1", "s2", "tk", "lim"])
        self._add("page_desc_after", back, ["f", "s1", "s2", "tk", "lim"])
        # Sequence ranges: the bounds narrow the same index range (from_id, sequence, to_id).
        ranged = keyed.where(seq >= _p("lo"), seq <= _p("hi"))
        bounds = ["f", "lo", "hi"]
        self._add("page_asc_range", ranged.order_by(*asc).limit(lim).offset(_ZERO), [*bounds, "lim"])
        self._add("page_desc_range", ranged.order_by(*desc).limit(lim).offset(_ZERO), [*bounds, "lim"])
        fwd_r = ranged.where(seq >= s1, or_(seq > s2, to > tk)).order_by(*asc).limit(lim).offset(_ZERO)
        back_r = ranged.where(seq <= s1, or_(seq < s2, to < tk)).order_by(*desc).limit(lim).offset(_ZERO)
        self._add("page_asc_range_after", fwd_r, [*bounds, "s1", "s2", "tk", "lim"])
        self._add("page_desc_range_after", back_r, [*bounds, "s1", "s2", "tk", "lim"])
        # Parts of one query over many lists: each list's page is its own subquery, so each
        # reads only its first rows from the index (a ROW_NUMBER() window over all the lists
        # would read every entry of every list first).
        label: Label[Any] = literal_column(_PART).label("part")
        for name, stmt, params in (
            ("part_page_asc", keyed.order_by(*asc).limit(lim).offset(_ZERO), ["f", "lim"]),
            ("part_page_asc_after", fwd, ["f", "s1", "s2", "tk", "lim"]),
            ("part_page_desc", keyed.order_by(*desc).limit(lim).offset(_ZERO), ["f", "lim"]),
            ("part_page_desc_after", back, ["f", "s1", "s2", "tk", "lim"]),
        ):
            q = stmt.subquery("q")
            self._add(name, select(label, q.c.sequence, q.c.to_id), params)
        # A count as a row of the same shape: (part, n, from_id).
        self._add(
            "part_count",
            select(label, c.c.n, c.c.from_id).where(c.c.relation == rel, c.c.from_id == cf),
            ["r", "cf"],
        )
        # A list's head for a fill, only if the whole list fits (its kept count <= fits): a list
        # too long to cache whole costs a key read, not its first rows.
        kept = select(c.c.n).where(c.c.relation == rel, c.c.from_id == cf).scalar_subquery()
        fits = keyed.where(func.coalesce(kept, _ZERO) <= _p("fits")).order_by(*asc).limit(lim).offset(_ZERO)
        q = fits.subquery("q")
        self._add("part_head_fits", select(label, q.c.sequence, q.c.to_id), ["f", "r", "cf", "fits", "lim"])
        if backend.name == "mysql":
            # A list fill's head as one row: the count, and the first entries packed end to end
            # as the list cache's members (`store.cache.lists.encode_members`: 8 bytes of
            # sequence + 2^63, 8 of to_id, big-endian), so the client parses one value, not a
            # row per entry. Truncated by a small group_concat_max_len: the caller checks.
            packed: Label[Any] = literal_column(
                "UNHEX(CONCAT(LPAD(HEX(CAST(sequence AS UNSIGNED) ^ 9223372036854775808), 16, '0'), "
                "LPAD(HEX(to_id), 16, '0')))"
            ).label("m")
            joined: ColumnClause[Any] = literal_column(
                "GROUP_CONCAT(q.m ORDER BY q.sequence, q.to_id SEPARATOR '')"
            )
            # The kept count and the list's version, as "n:version".
            counted = (
                select(func.concat(c.c.n, literal_column("':'"), c.c.version))
                .where(c.c.relation == rel, c.c.from_id == cf)
                .scalar_subquery()
            )
        elif backend.name == "postgresql":
            # The same on PostgreSQL: int8send gives 8 big-endian bytes; the sign bit flipped
            # (XOR) is sequence + 2^63. string_agg over bytea joins them in list order. The
            # count and the list's version as on MariaDB: a pair write's counted statement
            # returns the version it made (`store.backends.COUNTED_TAIL`), so its cached list is
            # changed in place, and an expired head is checked by its version alone
            # (`store.cache.lists.ListCache.read`).
            packed = literal_column(
                "int8send(sequence # '-9223372036854775808'::int8) || int8send(to_id)"
            ).label("m")
            joined = literal_column("string_agg(q.m, ''::bytea ORDER BY q.sequence, q.to_id)")
            counted = (
                select(func.concat(c.c.n, literal_column("':'"), c.c.version))
                .where(c.c.relation == rel, c.c.from_id == cf)
                .scalar_subquery()
            )
        if backend.name in ("mysql", "postgresql"):
            # head_packed_desc: the newest entries (a newest-first read's fill), packed in list order.
            for name, order in (("head_packed", asc), ("head_packed_desc", desc)):
                top = select(seq, to, packed).where(f == pf).order_by(*order).limit(lim).offset(_ZERO)
                q = top.subquery("q")
                self._add(name, select(counted, joined).select_from(q), ["r", "cf", "f", "lim"])
        # Membership: which of the to_ids in `_IN` (n placeholders, see `in_list`) are linked.
        some = to.in_([literal_column(_IN)])
        self._add("linked", select(to).where(f == pf, some), ["f"])
        self._add("part_linked", select(label, seq, to).where(f == pf, some), ["f"])
        if backend.pipelines:
            # The same with the to_ids as one array (``{1,2,3}``): one text, whatever their number.
            # Each to_id is one probe of the primary key (a LATERAL subquery with LIMIT 1): the
            # plan is made once for any list (`store.backends.postgres.driver.GENERIC_PLANS`), and
            # a plan that read the list's rows and kept the ones asked for would read all of a
            # 100,000-pin board to check ten pins.
            asked = func.unnest(cast(_p("ts"), ARRAY(BigInteger))).table_valued("t").render_derived(name="u")
            probe = select(seq, to).where(f == pf, to == asked.c.t).limit(_ONE).lateral("p")
            found = select(probe.c.to_id).select_from(asked).join(probe, _TRUE)
            self._add("linked_any", found, ["ts", "f"])
            found_part = select(label, probe.c.sequence, probe.c.to_id).select_from(asked).join(probe, _TRUE)
            self._add("part_linked_any", found_part, ["ts", "f"])

    def in_list(self, text: str, n: int) -> str:
        """``text`` (``linked``, ``part_linked``) with its IN list of ``n`` placeholders."""
        return text.replace(_IN, self.backend.params(n), 1)


#: The rows a counted write changed (`Statements._add_counted`).
_CHANGED = sa_table("w")


def _changed_any() -> Any:
    """True if the counted write changed a row."""
    return exists(select(_ONE).select_from(_CHANGED))


def _count_up_of(backend: Backend, c: Any) -> ClauseElement:
    """count_up for each row the counted write changed: (relation, from, n)."""
    typed = [
        bindparam(n, type_=c.c[col].type) for n, col in (("r", "relation"), ("cf", "from_id"), ("n", "n"))
    ]
    src = select(*typed, _ONE).select_from(_CHANGED)
    up = backend.upsert_add(c, ("relation", "from_id"), "n", also={"version": c.c.version + _ONE})
    stmt: ClauseElement = up.from_select(["relation", "from_id", "n", "version"], src)
    return stmt


def _count_down_of(c: Any, rel: Any, cf: Any) -> ClauseElement:
    """count_down if the counted write changed a row: (relation, from)."""
    this_list = (c.c.relation == rel, c.c.from_id == cf, _changed_any())
    return update(c).where(*this_list).values(n=c.c.n - _ONE, version=c.c.version + _ONE)


def _bump_of(c: Any, rel: Any, cf: Any) -> ClauseElement:
    """bump if the counted write changed a row: (relation, from)."""
    this_list = (c.c.relation == rel, c.c.from_id == cf, _changed_any())
    return update(c).where(*this_list).values(version=c.c.version + _ONE)


def counted_with_log(text: str, change_log: str) -> str:
    """A ``*_counted`` statement's ``text`` (`Statements._add_counted`) that also inserts a row of
    the invalidation log ``change_log`` (its at_ms and entry: two more parameters, last) for
    each row the write changed. The entry names the list's version the count left
    (``entry@version``, `store.cache.follower.VERSION_MARK`), as the writer's own log entries do
    where the version is known: a follower then keeps a cached list at that version or later."""
    if not text.endswith(COUNTED_TAIL):
        raise AssertionError(f"not a counted statement: {text[:200]}")
    versioned = f"%s || coalesce('{VERSION_MARK}' || (SELECT version FROM c), '')"
    log = f", l AS (INSERT INTO {change_log} (at_ms, entries) SELECT %s, {versioned} FROM w)"
    return text[: -len(COUNTED_TAIL)] + log + COUNTED_TAIL


def with_part(text: str, part: int) -> str:
    """A ``part_*`` statement's text with its rows labelled ``part``."""
    return text.replace(_PART, str(part))


class GuardedInsertStatements(Statements):
    """A pair's insert that reads its ``from`` object's row in the same statement.

    - insert_live (from, to, seq, key): inserts the pair only if the object
      row ``key`` of ``table`` is live, reading it in share mode (a delete of
      the object waits for this transaction, as with ``live_shared``), and
      skips a pair that exists. Rowcount 1: the pair is new and the object
      live; 0: the pair exists, or the object is not live (ask which).

    One round trip where a link otherwise reads the object first.
    """

    def __init__(self, backend: Backend, relation: str, table: str, *, ids: str) -> None:
        super().__init__(backend)
        md = MetaData()
        types = backend.column_types()
        rel = relation_table(md, relation, types, schema=self.schema)
        obj = object_table(md, table, types, ids=ids, schema=self.schema, shard=0)
        key = obj.c["id" if ids == "instagram" else "local_id"]
        f, t, s = (bindparam(n, type_=c.type) for n, c in zip("fts", rel.c, strict=True))
        source = select(f, t, s).where(key == bindparam("k", type_=key.type), obj.c.active == _ONE)
        stmt = backend.upsert_skip(rel).from_select(
            ["from_id", "to_id", "sequence"], source.with_for_update(read=True)
        )
        self._add("insert_live", stmt, ["f", "t", "s", "k"])
        if backend.counted_writes:
            # The same with its count, as one statement (`Statements._add_counted`); parameters
            # (f, t, s, k, relation, from, n).
            c = counts_table(md, types, schema=self.schema)
            self._add_counted(
                "insert_live_counted", stmt, ["f", "t", "s", "k"], _count_up_of(backend, c), ["r", "cf", "n"]
            )


class PairRowsStatements(Statements):
    """Many pairs of one relation on one shard in a few multi-row statements, where
    `Backend.pair_rows` (MariaDB/MySQL): `store.relations.bulk` writes a side of a batch so.

    Each text is for one row; `expand_rows` (name, n) makes it for n. Parameters, per row:

    - locked (from, to): ``SELECT from_id, to_id, sequence ... FOR UPDATE`` through the primary
      key, with a row-constructor IN: each present row is locked, and under REPEATABLE READ
      the gap where each absent one would go (no other write can insert it);
    - dead (key), if the side's ``from`` objects are in ``table``: the keys of those that are
      deleted (or not live yet), every row read in share mode (as ``live_shared``: a delete of
      the object waits for the transaction); a key with no row is not dead (as ``live_shared``);
    - insert (from, to, seq): a plain INSERT; its caller holds each key's lock and knows the row
      absent, so a duplicate is an error, never skipped;
    - insert_new (from, to, seq): the same, skipping a pair that exists (rowcount: the new ones);
    - move (from, to, seq): an upsert of rows known present, setting their sequence;
    - delete (from, to): through the primary key;
    - count_add (from, n, k): the count grows by n and the version by k (a new counts row
      starts at n, version k); the relation's name is in the text; count_add_ones (from): the
      same with n = k = 1 in the text;
    - count_change: (from, n) per row, then (from, k) per row, then (from) per row: a counts
      row that is there changes by n, its version by k (none is made);
    - versions (from) per row: one row, one value, ``from:version;`` for each list that has a
      counts row, read locked (so it is the transaction's own version).

    Every parameter is an int (the relation's name is in the texts): `literal_rows` writes them
    into the text, where a batch is bound.
    """

    def __init__(self, backend: Backend, relation: str, table: str | None, *, ids: str) -> None:
        super().__init__(backend)
        md = MetaData()
        types = backend.column_types()
        t = relation_table(md, relation, types, schema=self.schema)
        c = counts_table(md, types, schema=self.schema)
        pf, pt, ps = _p("f"), _p("t"), _p("s")
        rows: ColumnClause[Any] = literal_column(f"(from_id, to_id) IN ({_ROWS})")
        locked = select(t.c.from_id, t.c.to_id, t.c.sequence).where(rows).with_for_update()
        self._add("locked", locked, [])
        self._add("delete", delete(t).where(rows), [])
        for name in ("locked", "delete"):
            # (through the primary key, as RelationStatements' writes of one pair)
            self._templates[name] = _by_primary_key(self._templates[name])
        self._add("insert", insert(t).values(from_id=pf, to_id=pt, sequence=ps), ["f", "t", "s"])
        skip = backend.upsert_skip(t).values(from_id=pf, to_id=pt, sequence=ps)
        self._add("insert_new", skip, ["f", "t", "s"])
        move = backend.upsert_set(t, ("from_id", "to_id"), "sequence", also={})
        self._add("move", move.values(from_id=pf, to_id=pt, sequence=ps), ["f", "t", "s"])
        cf = _p("cf")
        added: ColumnClause[Any] = literal_column("VALUES(version)")
        up = backend.upsert_add(c, ("relation", "from_id"), "n", also={"version": c.c.version + added})
        # The relation's name is written into the count rows' text, not bound once a row (a batch of
        # new pairs of one board grows a hundred pins' counts): config names are plain identifiers.
        if not _RELATION_NAME.fullmatch(relation):
            raise ValueError(f"relation name {relation!r} is not a lower_snake_case identifier")
        named: ColumnClause[Any] = literal_column(f"'{relation}'")
        count_add = up.values(relation=named, from_id=cf, n=_p("n"), version=_p("k"))
        self._add("count_add", count_add, ["cf", "n", "k"])
        # Each list grown by one pair, its version by one: the common case of a batch of new pairs.
        one: ColumnClause[Any] = literal_column("1")
        self._add("count_add_ones", up.values(relation=named, from_id=cf, n=one, version=one), ["cf"])
        some = c.c.from_id.in_([literal_column(_ROWS)])
        change = update(c).where(c.c.relation == named, some)
        change = change.values(
            n=c.c.n + literal_column(_CASE_N), version=c.c.version + literal_column(_CASE_V)
        )
        self._add("count_change", change, [])
        packed: ColumnClause[Any] = literal_column("GROUP_CONCAT(from_id, ':', version, ';' SEPARATOR '')")
        self._add("versions", select(packed).where(c.c.relation == named, some).with_for_update(), [])
        self._rows = {
            "locked": "(%s, %s)",
            "delete": "(%s, %s)",
            "insert": "(%s, %s, %s)",
            "insert_new": "(%s, %s, %s)",
            "move": "(%s, %s, %s)",
            "count_add": f"('{relation}', %s, %s, %s)",
            "count_add_ones": f"('{relation}', %s, 1, 1)",
            "count_change": "%s",
            "versions": "%s",
            "dead": "%s",
        }
        if table is not None:
            obj = object_table(md, table, types, ids=ids, schema=self.schema, shard=0)
            key = obj.c["id" if ids == "instagram" else "local_id"]
            # (InnoDB locks every row the read reaches, live or not, to the end of the transaction)
            dead = select(key).where(key.in_([literal_column(_ROWS)]), obj.c.active == _ZERO)
            self._add("dead", dead.with_for_update(read=True), [])
        # The texts above are written in PyMySQL's placeholder; a row is repeated as it is.
        assert backend.param == "%s", backend.param

    def row(self, name: str) -> str:
        """One row's placeholders in statement ``name``."""
        return self._rows[name]


def expand_rows(text: str, row: str, n: int) -> str:
    """A `PairRowsStatements` text made for ``n`` rows (``row``: `PairRowsStatements.row`)."""
    rows = ", ".join([row] * n)
    if _ROWS in text:
        text = text.replace(_ROWS, rows, 1)
        if _CASE_N in text:  # count_change: its two CASEs, one WHEN per row
            whens = " ".join(["WHEN %s THEN %s"] * n)
            text = text.replace(_CASE_N, f"CASE from_id {whens} END", 1)
            text = text.replace(_CASE_V, f"CASE from_id {whens} END", 1)
        return text
    head, sep, tail = text.partition(f"VALUES {row}")
    assert sep, text
    return f"{head}VALUES {rows}{tail}"


def _by_primary_key(text: str) -> str:
    """A MySQL statement on one table that reads it by its primary key (``FORCE INDEX``); a DELETE
    takes the multi-table form, the one that allows an index hint."""
    if text.startswith("DELETE FROM "):
        head, where = text.split(" WHERE ", 1)
        target = head.removeprefix("DELETE FROM ")
        return f"DELETE {target} FROM {target} FORCE INDEX (PRIMARY) WHERE {where}"
    if text.startswith("UPDATE "):
        head, rest = text.split(" SET ", 1)
        return f"{head} FORCE INDEX (PRIMARY) SET {rest}"
    if text.startswith("SELECT "):
        head, where = text.split(" \nWHERE ", 1)
        return f"{head} FORCE INDEX (PRIMARY) \nWHERE {where}"
    raise AssertionError(f"no index hint for: {text}")
