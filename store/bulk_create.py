"""`create_many`: many objects in one multi-row INSERT per shard, IDs in the order given.

The plan is `ObjectService.create`'s, with each step taking a whole batch:

1. every item is checked (type, data, near/shard, unique values, duplicates
   within the batch) before any I/O: a bad one raises, naming its index, and
   nothing is written;
2. one multi-row ``INSERT ... RETURNING`` per shard (per ``limits.id_chunk``
   rows), each one step (`store.steps`: a shard that moved is written again
   alone, on its new host). Where the session's keys follow each other
   (`Backend.id_step`: MariaDB with ``innodb_autoinc_lock_mode`` 0 or 1, asked
   once per connection) the INSERT returns no rows: the keys are its
   ``lastrowid`` and the next ones by ``auto_increment_increment``. Where the
   type has unique keys, the rows go in *pending* (not visible);
3. with unique keys: each value is claimed in its new ID's name (one step
   each, as `create` claims them). A value another object holds raises
   `DuplicateKeyError` naming the item; the claims this call took are given
   back and its pending rows removed, so nothing was created;
4. one UPDATE per shard makes the pending rows live.

Without unique keys a failure after some shards' inserts removes the rows
made (best effort: an ID nobody was given). The caches are invalidated as
`create` does, in one call per cache (none where no cache is configured,
or where the IDs are Instagram's and none was pending: `makes_ids_again`).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sqlalchemy import bindparam, delete, insert, literal_column, update
from sqlalchemy.sql.elements import BindParameter, ColumnClause

from store.backends.statements import ObjectStatements
from store.backends.tables import SHARD
from store.cache.leases import ObjectCache, nothing_owed
from store.config import StoreConfig
from store.engines import Engines, ShardHandle
from store.exceptions import (
    DataError,
    DuplicateKeyError,
    IdError,
    LimitError,
    ShardFullError,
    StoreError,
    brief,
)
from store.ids import encode_pinterest, makes_ids_again
from store.objects import ObjectService
from store.relations.service import RelationService
from store.routing import MAX_LOCAL_ID, Router
from store.specs import TypeSpec
from store.steps import Steps
from store.unique import Claim, UniqueKeys

__all__ = ["BulkCreates"]

#: Statement texts kept per object table, each for one (statement, shard, rows).
_TEXTS = 256
#: The name of an INSERT without RETURNING ends so (`BulkCreates._id_step`).
_PLAIN = "_plain"
_ONE: ColumnClause[Any] = literal_column("1")
_ZERO: ColumnClause[Any] = literal_column("0")


class _Texts:
    """Multi-row statements of one object table, compiled once per (backend, table, rows)."""

    def __init__(self, stmts: ObjectStatements) -> None:
        self._stmts = stmts
        self._templates: dict[tuple[str, int], str] = {}
        self._texts: dict[tuple[str, int, int], str] = {}

    def _template(self, name: str, n: int) -> str:
        sql = self._templates.get((name, n))
        if sql is not None:
            return sql
        s = self._stmts
        t, key, b = s.table, s.key, s.backend
        names = [f"p{i}" for i in range(n)]
        params: list[BindParameter[Any]] = [bindparam(p) for p in names]
        pending = (t.c.active == _ZERO, t.c.version == _ZERO)
        stmt: Any
        if name.startswith("insert"):
            extra = {"active": _ZERO, "version": _ZERO} if name.startswith("insert_pending") else {}
            stmt = insert(t).values([{"data": p, **extra} for p in params])
            if not name.endswith(_PLAIN):
                # Instagram IDs are not in insert order (the sequence wraps): the data says which is which.
                stmt = stmt.returning(key, t.c.data) if s.ids == "instagram" else stmt.returning(key)
        elif name == "activate":
            touch = {} if b.ts_now() is None else {"ts": b.ts_now()}
            stmt = update(t).where(key.in_(params), *pending).values(active=_ONE, version=_ONE, **touch)
        else:  # "remove": pending rows only (a row another call made live is never removed)
            stmt = delete(t).where(key.in_(params), *pending)
        sql, order = b.compile(stmt)
        if list(order) != names:
            raise AssertionError(f"{name}: compiled parameter order {order} is not {names}")
        self._templates[(name, n)] = sql
        return sql

    def sql(self, name: str, shard: int, n: int) -> str:
        """Statement ``name`` (insert, insert_pending, activate, remove; ``insert_plain`` and
        ``insert_pending_plain``: without RETURNING) of ``n`` rows on ``shard``."""
        text = self._texts.get((name, shard, n))
        if text is not None:
            return text
        sql = self._template(name, n)
        b = self._stmts.backend
        schema = b.statement_schema(shard)
        if schema is not None:
            sql = sql.replace(SHARD, b.sa_dialect.identifier_preparer.quote_identifier(schema))
        if len(self._texts) >= _TEXTS:
            self._texts.clear()  # (a bound on what is kept: sizes and shards vary)
        self._texts[(name, shard, n)] = sql
        return sql


class BulkCreates:
    """`Store.create_many`: checks every item, then writes each shard's rows in one statement."""

    def __init__(
        self,
        *,
        config: StoreConfig,
        router: Router,
        engines: Engines,
        objects: ObjectService,
        relations: RelationService,
        cache: ObjectCache | None,
        unique: UniqueKeys | None,
        steps: Steps,
    ) -> None:
        self._config = config
        self._router = router
        self._engines = engines
        self._objects = objects
        self._relations = relations
        self._cache = cache
        self._unique = unique
        self._steps = steps
        self._instagram = config.ids == "instagram"
        self._ids_again = makes_ids_again(config.ids)
        self._texts: dict[tuple[str, str], _Texts] = {}
        #: Per driver connection: `Backend.id_step` of its session (None: keys come back by RETURNING).
        self._id_steps: weakref.WeakKeyDictionary[Any, int | None] = weakref.WeakKeyDictionary()
        #: Told the shard before each batch's INSERT runs (tests count the statements); None: nobody.
        self.on_insert: Callable[[int, int], None] | None = None

    # -- checks ---------------------------------------------------------------------------

    def _items(self, items: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        if isinstance(items, dict | str | bytes | bytearray) or not isinstance(items, Iterable):
            raise DataError(f"items must be a list of dicts (one per object), got {type(items).__name__}")
        limit = self._config.max_ids
        if type(items) is list and len(items) <= limit and set(map(type, items)) <= {dict}:
            return list(items)  # (a list of dicts, the usual call: checked without a loop)
        out: list[dict[str, Any]] = []
        for i, item in enumerate(items):
            if len(out) >= limit:
                raise LimitError(
                    f"items holds more than {limit} objects, over limits.max_ids; split the call"
                )
            if not isinstance(item, dict):
                raise DataError(f"items[{i}] must be a dict (an object's data), got {type(item).__name__}")
            out.append(item)
        return out

    def _target(self, near: int | None, shard: int | None) -> int | None:
        """The one shard ``near``/``shard`` name (as `create` reads them), or None: spread."""
        if near is not None and shard is not None:
            raise IdError("give near= or shard=, not both")
        if near is not None:
            if self._instagram:
                if near == 0:
                    raise IdError("near=0 is no object's ID; pass the ID of the object to sit beside")
                return self._router.shard_of(near)
            return self._router.route(near)[0]
        if shard is not None:
            shards = self._router.shard_map.shards
            if type(shard) is not int or not 0 <= shard < shards:
                raise IdError(f"shard must be an int in 0..{shards - 1}, got {brief(shard)}")
            return shard
        return None

    def _claims(self, spec: TypeSpec, items: list[dict[str, Any]]) -> list[list[Claim]]:
        """Each item's unique values; `DuplicateKeyError` for a value two items hold."""
        unique = self._unique
        if unique is None or not unique.indexes(spec.name):
            return [[] for _item in items]
        out: list[list[Claim]] = []
        first: dict[Claim, int] = {}
        for i, item in enumerate(items):
            try:
                claims = unique.claims(spec.name, item)
            except DataError as exc:
                raise DataError(f"items[{i}]: {exc}") from None
            for c in claims:
                j = first.setdefault(c, i)
                if j != i:
                    raise DuplicateKeyError(
                        f"items[{i}]: {c.spec.field} {c.text!r} ({c.spec.name}) is also items[{j}]'s; "
                        "a value can be held by one object only: nothing was created",
                        key=c.spec.name,
                        value=c.text,
                        owner=0,
                        index=i,
                    )
            out.append(claims)
        return out

    # -- the plan ----------------------------------------------------------------------------

    def create_many(
        self, type_name: str, items: Iterable[dict[str, Any]], *, near: int | None, shard: int | None
    ) -> list[int]:
        """Create every item (see the module's text); their IDs in the order of ``items``."""
        spec = self._router.type(type_name)
        given = self._items(items)
        texts: list[str] = []
        encode = self._objects.repo.encode
        for i, item in enumerate(given):
            try:
                texts.append(encode(item))
            except DataError as exc:
                raise type(exc)(f"items[{i}]: {exc}") from None
        target = self._target(near, shard)
        claims = self._claims(spec, given)
        if not given:
            return []
        by_shard: dict[int, list[int]] = {}
        if target is not None:
            by_shard[target] = list(range(len(given)))
        else:
            for i in range(len(given)):
                by_shard.setdefault(self._router.pick_shard(), []).append(i)
        keyed = any(claims)
        ids: list[int] = [0] * len(given)
        keys: dict[int, list[tuple[int, int]]] = {}  # shard -> (item, row key) inserted
        try:
            for s, members in by_shard.items():
                chunk = self._config.id_chunk
                for k in range(0, len(members), chunk):
                    part = members[k : k + chunk]
                    got = self._steps(
                        "insert many",
                        lambda s=s, part=part: self._insert(spec, s, part, texts, pending=keyed),  # type: ignore[misc]
                    )
                    keys.setdefault(s, []).extend(got)
                    if self._instagram:
                        for i, key in got:
                            ids[i] = key
                    else:
                        # (`_insert` checked every key: 0..MAX_LOCAL_ID, the local id's bits)
                        base = encode_pinterest(s, spec.id, 0)
                        for i, key in got:
                            ids[i] = base | key
            if keyed:
                self._claim_all(spec, claims, ids, keys)
        except BaseException:
            self._undo(spec, keys, live=not keyed)
            raise
        if keyed:
            self._activate_all(spec, claims, ids, keys, texts, given)
        if keyed or self._ids_again:  # (as `ObjectService.create`: see `makes_ids_again`)
            self._created(spec, ids)
        self._steps.mark("created")
        return ids

    def _insert(
        self, spec: TypeSpec, shard: int, members: list[int], texts: list[str], *, pending: bool
    ) -> list[tuple[int, int]]:
        """One multi-row INSERT on ``shard``'s master (as the map is now): (item, row key) of each.

        Where the session's keys follow each other (`Backend.id_step`), the INSERT returns no rows:
        the keys are its ``lastrowid`` and those after it, by the step."""
        h = self._at(shard)
        name = "insert_pending" if pending else "insert"
        if self.on_insert is not None:
            self.on_insert(shard, len(members))
        step: int | None = None
        first = count = 0
        rows: list[Any] = []
        with h.connect() as conn:
            cur = conn.cursor()
            if not self._instagram:
                step = self._id_step(h, conn, cur)
            sql = self._sql(h, spec, name if step is None else name + _PLAIN, len(members))
            # (every item, in order, where they all go to one shard: ``members`` is 0..n-1)
            cur.execute(sql, texts if len(members) == len(texts) else [texts[i] for i in members])
            if step is None:
                rows = list(cur.fetchall())
            else:
                first, count = int(cur.lastrowid or 0), int(cur.rowcount)
            cur.close()
        got: list[int]
        if step is not None:
            if count != len(members) or first <= 0 or step <= 0:
                raise DataError(
                    f"the database made {count} rows (first key {first}, step {step}) for {len(members)} "
                    f"in {spec.table}"
                )
            got = list(range(first, first + count * step, step))  # (upwards: sorted)
        elif len(rows) != len(members):
            raise DataError(f"the database returned {len(rows)} keys for {len(members)} rows in {spec.table}")
        if self._instagram:
            # Matched by their data: rows of the same text are alike, so either may be either.
            waiting: dict[str, list[int]] = {}
            for i in reversed(members):
                waiting.setdefault(texts[i], []).append(i)
            return [(waiting[_text(text)].pop(), int(key)) for key, text in rows]
        if step is None:
            # An AUTO_INCREMENT (or rowid) statement numbers its rows upwards, in the order given.
            got = sorted(int(r[0]) for r in rows)
        if got and got[0] < 0:
            raise DataError(f"the database returned key {got[0]} for a row in {spec.table}")
        if got and got[-1] > MAX_LOCAL_ID:
            with contextlib.suppress(StoreError):
                for key in got:
                    self._objects.repo.remove(h, spec.table, key)
            raise ShardFullError(
                f"shard {shard} table {spec.table} has used all {MAX_LOCAL_ID} local ids; "
                "create the objects on another shard"
            )
        return list(zip(members, got, strict=True))

    def _claim_all(
        self,
        spec: TypeSpec,
        claims: list[list[Claim]],
        ids: list[int],
        keys: dict[int, list[tuple[int, int]]],
    ) -> None:
        """Claim every item's values in its new ID's name; all or none (the claims taken go back)."""
        unique = self._unique
        assert unique is not None
        taken: list[tuple[Claim, int]] = []
        try:
            for i, item_claims in enumerate(claims):
                for c in item_claims:
                    try:
                        unique.claim(c, ids[i], holders=self._objects)
                    except DuplicateKeyError as exc:
                        raise DuplicateKeyError(
                            f"items[{i}]: {exc}; nothing was created",
                            key=exc.key,
                            value=exc.value,
                            owner=exc.owner,
                            index=i,
                        ) from None
                    taken.append((c, ids[i]))
        except BaseException:
            for c, owner in taken:
                with contextlib.suppress(StoreError):
                    unique.release([c], owner)
            raise

    def _activate_all(
        self,
        spec: TypeSpec,
        claims: list[list[Claim]],
        ids: list[int],
        keys: dict[int, list[tuple[int, int]]],
        texts: list[str],
        items: list[dict[str, Any]],
    ) -> None:
        """Make every pending row live, one UPDATE per shard.

        A row abandoned meanwhile (a repair, or a takeover after a stall past the grace period)
        cannot go live: its claims are given back and that item is created again alone, as
        `create` starts over.
        """
        unique = self._unique
        assert unique is not None
        for s, got in keys.items():
            live = self._steps("activate many", lambda s=s, got=got: self._activate(spec, s, got))  # type: ignore[misc]
            for i, key in got:
                if key in live:
                    continue
                unique.release(claims[i], ids[i])
                with contextlib.suppress(StoreError):
                    self._steps("remove pending", lambda s=s, key=key: self._remove(spec, s, key))  # type: ignore[misc]
                ids[i] = self._objects.create(spec.name, items[i], near=None, shard=s)
        unique.invalidate([c for item_claims in claims for c in item_claims])

    def _activate(self, spec: TypeSpec, shard: int, got: list[tuple[int, int]]) -> set[int]:
        """Make ``got``'s pending rows live on ``shard``; the keys that went live (all, unless some
        were abandoned: then the rows are read to say which)."""
        h = self._at(shard)
        chunk = self._config.id_chunk
        row_keys = [key for _i, key in got]
        done = 0
        for k in range(0, len(row_keys), chunk):
            part = row_keys[k : k + chunk]
            done += h.write(self._sql(h, spec, "activate", len(part)), part)
        if done == len(row_keys):
            return set(row_keys)
        out: set[int] = set()
        for key in row_keys:
            state = self._objects.repo.state(h, spec.table, key)
            if state is not None and state[0]:
                out.add(key)
        return out

    def _undo(self, spec: TypeSpec, keys: dict[int, list[tuple[int, int]]], *, live: bool) -> None:
        """Best effort: remove the rows this call inserted (pending ones, or live ones no one was given)."""
        for s, got in keys.items():
            row_keys = [key for _i, key in got]

            def remove(s: int = s, row_keys: list[int] = row_keys) -> None:
                h = self._at(s)
                if live:
                    for key in row_keys:
                        self._objects.repo.remove(h, spec.table, key)
                else:
                    h.write(self._sql(h, spec, "remove", len(row_keys)), row_keys)

            with contextlib.suppress(StoreError):
                self._steps("remove pending", remove)

    # -- helpers ----------------------------------------------------------------------------

    def _created(self, spec: TypeSpec, ids: Sequence[int]) -> None:
        """A create is a write: drop whatever the caches hold under the new IDs (one call per cache,
        the two at once: memcached's reply is read after the lists')."""
        cache = self._cache
        finish = (
            nothing_owed
            if cache is None
            else cache.invalidate_begin([self._objects.key(i, spec) for i in ids])
        )
        try:
            if self._relations.lists is not None:
                names = [r.name for r in self._config.relations.values() if r.from_type == spec.name]
                self._relations.invalidate([(r, i) for i in ids for r in names])
        finally:
            finish()

    def _remove(self, spec: TypeSpec, shard: int, key: int) -> None:
        self._objects.repo.remove(self._at(shard), spec.table, key)

    def _id_step(self, h: ShardHandle, conn: Any, cur: Any) -> int | None:
        """`Backend.id_step` of ``conn``'s session, asked once per driver connection."""
        raw = getattr(conn, "raw", conn)
        try:
            return self._id_steps[raw]
        except KeyError:
            pass
        except TypeError:  # (a connection that takes no weak reference: asked each time)
            return h.backend.id_step(cur)
        step = self._id_steps[raw] = h.backend.id_step(cur)
        return step

    def _at(self, shard: int) -> ShardHandle:
        return self._engines.shard(shard, self._router.shard_map.master(shard))

    def _sql(self, h: ShardHandle, spec: TypeSpec, name: str, n: int) -> str:
        k = (h.backend.name, spec.table)
        texts = self._texts.get(k)
        if texts is None:
            texts = self._texts[k] = _Texts(self._objects.repo.statements(h, spec.table))
        return texts.sql(name, h.shard, n)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes | bytearray) else str(value)
