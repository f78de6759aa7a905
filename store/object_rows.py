"""Object rows: `ObjectRepository` creates, reads, updates and soft-deletes objects on one shard.

The repository knows shards, tables and local ids, never 64-bit IDs or the
map: routing and the object cache are `store.objects.ObjectService`'s. The
statements are SQLAlchemy Core, compiled once per (backend, table) and
specialised per shard (`store.backends.statements.ObjectStatements`), so a
call costs a dict look-up, not a statement build. `Versioned`, `Updater`
and `applied` (what an update makes of the old object) live here too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from store.backends.statements import ObjectStatements, int_array
from store.cache.leases import wall_ms
from store.engines import Cursor, ShardHandle
from store.exceptions import (
    BackendError,
    ConflictError,
    DataError,
    NotFound,
    NotSerializableError,
)
from store.serde import Serde

__all__ = ["ObjectRepository", "Updater", "Versioned", "applied"]

#: ``update`` takes either a dict of changes merged into the object, or a
#: function from the old object to the new one.
Updater = dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]]


_INSERT_ATTEMPTS = 5


def applied(changes: Updater, old: dict[str, Any], what: str) -> dict[str, Any]:
    """The object ``changes`` makes of ``old``: a dict merged in, or a function's whole new object."""
    if not callable(changes):
        return {**old, **changes}
    new = changes(old)
    if not isinstance(new, dict):
        raise NotSerializableError(
            f"the update function for {what} returned {type(new).__name__}; "
            "it must return the whole new object as a dict"
        )
    return new


class Versioned(NamedTuple):
    """An object and its version (`Store.get_with_version`): 1 when created, one more at each update."""

    data: dict[str, Any]
    version: int


class ObjectRepository:
    """Create, read, update and soft-delete objects on one shard at a time."""

    def __init__(self, *, serde: Serde, ids: str = "pinterest") -> None:
        self._serde = serde
        #: Deserialise stored JSON text (the serde's own function: no wrapper call per object).
        self.decode: Callable[[str | bytes], dict[str, Any]] = serde.loads
        self._ids = ids
        self._stmts: dict[tuple[str, str], ObjectStatements] = {}
        self._sql: dict[tuple[str, int, str], dict[str, str]] = {}

    def statements(self, h: ShardHandle, table: str) -> ObjectStatements:
        """The compiled statements of ``table`` on ``h``'s backend."""
        key = (h.backend.name, table)
        stmts = self._stmts.get(key)
        if stmts is None:
            stmts = self._stmts[key] = ObjectStatements(h.backend, table, ids=self._ids)
        return stmts

    def sql(self, h: ShardHandle, table: str) -> dict[str, str]:
        """The statements of ``table`` on ``h``'s shard, by name (see `ObjectStatements`)."""
        key = (h.host, h.shard, table)
        sql = self._sql.get(key)
        if sql is None:
            sql = self._sql[key] = self.statements(h, table).for_shard(h.shard)
        return sql

    def encode(self, data: dict[str, Any]) -> str:
        """Validate and serialise ``data``; raises `DataError` before any I/O."""
        return self._serde.dumps(data)

    def insert(self, h: ShardHandle, table: str, text: str, *, pending: bool = False) -> int:
        """Insert one encoded object; return its new key (local id, or the whole Instagram ID).

        ``pending``: not live yet (`activate` makes it live), for a create whose unique keys
        are claimed in its new ID's name first.
        """
        sql = self.sql(h, table)["insert_pending" if pending else "insert"]
        for attempt in range(1, _INSERT_ATTEMPTS + 1):
            try:
                with h.connect() as conn:
                    cur = conn.cursor()
                    cur.execute(sql, (text,))
                    local_id = cur.fetchone()[0] if self._ids == "instagram" else cur.lastrowid
                    cur.close()
                break
            except BackendError as exc:
                # An ID the database made twice (a MariaDB shard made by an
                # earlier version, whose trigger used a sequence): the primary
                # key refused the row, nothing was written; make another.
                if self._ids != "instagram" or not exc.duplicate or attempt == _INSERT_ATTEMPTS:
                    raise
        if not local_id:
            raise DataError(f"the database returned no local id for the insert into {table}")
        return int(local_id)

    def activate(self, h: ShardHandle, table: str, local_id: int) -> bool:
        """Make a pending object live at version 1; False if it is no longer pending (abandoned)."""
        return h.write(self.sql(h, table)["activate"], (local_id,)) == 1

    def abandon(self, h: ShardHandle, table: str, local_id: int) -> bool:
        """Make a pending object unable ever to go live; False if it was not pending."""
        return h.write(self.sql(h, table)["abandon"], (local_id,)) == 1

    def state(self, h: ShardHandle, table: str, local_id: int) -> tuple[bool, int, str] | None:
        """(live, version, JSON text) of the row whatever its state (version 0: pending), or None."""
        row = h.read(self.sql(h, table)["state"], (local_id,), one=True)
        return None if row is None else (bool(row[0]), int(row[1]), str(row[2]))

    def remove(self, h: ShardHandle, table: str, local_id: int) -> None:
        """Hard-delete one row (used only to undo an insert that cannot get an ID)."""
        h.write(self.sql(h, table)["remove"], (local_id,))

    def get(self, h: ShardHandle, table: str, local_id: int) -> str | None:
        """The JSON text of the live object with ``local_id``, or None."""
        row = h.read(self.sql(h, table)["select"], (local_id,), one=True)
        return None if row is None else str(row[0])

    def get_many(
        self, h: ShardHandle, parts: Sequence[tuple[int, str, Sequence[int]]]
    ) -> list[tuple[int, str, int, str]]:
        """Live objects for several (shard, table, local ids) on one connection.

        On a server host the parts become one UNION ALL query, one round trip
        for the whole host; on SQLite ``parts`` hold one shard.
        Returns (shard, table, local_id, JSON text) for every live object found.
        """
        labels = [(shard, table) for shard, table, _ids in parts]
        return [(*labels[part], local_id, text) for part, local_id, text in self.get_many_rows(h, parts)]

    def get_many_rows(self, h: ShardHandle, parts: Sequence[tuple[int, str, Sequence[int]]]) -> list[Any]:
        """`get_many`'s rows as the database gives them: (part, local_id, JSON text), ``part`` the
        index in ``parts`` of the row's (shard, table)."""
        if h.backend.pipelines:
            # One prepared statement per shard, its keys one array (`ObjectStatements` select_any),
            # all in one request: a text that never changes, where a UNION ALL of IN lists would
            # be a new text (prepared, and planned, again) at nearly every call.
            statements = [
                (self.statements(h, table).for_shard(shard)["select_any"], (int_array(local_ids),))
                for shard, table, local_ids in parts
            ]
            answers = h.read_pipelined(statements)
            return [(part, key, text) for part, rows in enumerate(answers) for key, text in rows]
        selects: list[str] = []
        params: list[int] = []
        for i, (shard, table, local_ids) in enumerate(parts):
            selects.append(self.statements(h, table).select_many_for(shard, i, len(local_ids)))
            params.extend(local_ids)
        query = selects[0] if len(selects) == 1 else " UNION ALL ".join(selects)
        return h.read(query, params, one=False)  # type: ignore[no-any-return]

    def get_with_version(self, h: ShardHandle, table: str, local_id: int) -> tuple[str, int] | None:
        """The JSON text and version of the live object with ``local_id``, or None."""
        row = h.read(self.sql(h, table)["select_version"], (local_id,), one=True)
        return None if row is None else (str(row[0]), int(row[1]))

    def update(
        self,
        h: ShardHandle,
        table: str,
        local_id: int,
        changes: Updater,
        *,
        what: str,
        if_version: int | None = None,
        before_write: Callable[[dict[str, Any], dict[str, Any]], None] | None = None,
        logged: str = "",
        known: tuple[int, dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """Read-modify-write one object under a row lock, in one transaction.

        With ``if_version``, the object must be at that version when locked
        (else `ConflictError`, nothing written). ``before_write(old, new)``
        runs under the lock before the write; what it raises rolls back.
        ``logged``: the invalidation log entries the write commits with
        (`store.cache.follower`), where the host logs. ``known``: (version,
        new object) made from the object as read at that version: if it is
        still at that version, ``changes`` is not applied again.
        """
        sql = self.sql(h, table)
        log_sql = h.log_sql() if logged else None
        # A transaction run again after a deadlock or a lock wait timeout (`ShardHandle.transaction`)
        # finds the object at the version an earlier attempt made ``new`` from, unless another
        # writer committed meanwhile: ``changes`` is then not applied again (a function runs once
        # per change it makes, and sees again only an object that did change).
        made: list[tuple[int, dict[str, Any]]] = [] if known is None else [known]

        def txn(cur: Cursor) -> dict[str, Any]:
            cur.execute(sql["lock"], (local_id,))
            row = cur.fetchone()
            if row is None or not row[1]:
                raise NotFound(f"no live object {what}")
            if if_version is not None and int(row[2]) != if_version:
                raise ConflictError(
                    f"object {what} is at version {row[2]}, not {if_version}: it changed since it was "
                    "read; read it again (get_with_version) and retry",
                    expected=if_version,
                    actual=int(row[2]),
                )
            old = self._serde.loads(row[0])
            version = int(row[2])
            if made and made[0][0] == version:
                new = made[0][1]
            else:
                new = applied(changes, old, what)
                made[:] = [(version, new)]
            text = self._serde.dumps(new)  # refused data raises before any claim
            if before_write is not None:
                before_write(old, new)
            cur.defer(sql["update"], (text, local_id))  # goes with the COMMIT
            if log_sql is not None:
                cur.defer(log_sql, (wall_ms(), logged))
            return new

        return h.transaction(txn)

    def delete(self, h: ShardHandle, table: str, local_id: int, *, logged: str = "") -> bool:
        """Mark one object inactive; True if it was live (``logged``: as for `update`)."""
        log_sql = h.log_sql() if logged else None
        if log_sql is not None:

            def txn(cur: Cursor) -> bool:
                # The mark, its log row and the COMMIT: one request where the backend can.
                done = cur.commit_with(
                    [(self.sql(h, table)["delete"], (local_id,)), (log_sql, (wall_ms(), logged))]
                )
                return bool(done[0][0])

            return h.transaction(txn)
        return bool(h.write(self.sql(h, table)["delete"], (local_id,)))

    def delete_reading(
        self, h: ShardHandle, table: str, local_id: int, read: tuple[str, Sequence[Any]], *, logged: str = ""
    ) -> tuple[bool, list[Any]]:
        """`delete`, with ``read`` (a query and its parameters) run after the mark, under the mark's
        row lock, in the same request: (was it live, the query's rows).

        The mark, its log row, the read and the COMMIT are one request where the backend can:
        a query that must see every write the mark waited for (the lists a deleted object
        leaves) costs no round trip of its own.
        """
        statements: list[tuple[str, Sequence[Any]]] = [(self.sql(h, table)["delete"], (local_id,))]
        log_sql = h.log_sql() if logged else None
        if log_sql is not None:
            statements.append((log_sql, (wall_ms(), logged)))
        statements.append(read)

        def txn(cur: Cursor) -> tuple[bool, list[Any]]:
            rows: list[list[Any]] = []
            done = cur.commit_with(statements, rows=rows)
            return bool(done[0][0]), rows[-1]

        return h.transaction(txn)

    def delete_held(
        self,
        h: ShardHandle,
        table: str,
        local_id: int,
        *,
        logged: str = "",
        read: tuple[str, Sequence[Any]] | None = None,
    ) -> tuple[bool, dict[str, Any] | None, list[Any] | None]:
        """Mark one object inactive and read what it holds, under its row lock, in one transaction.

        (was it live, its data; None if there is no row; the rows of ``read``,
        None without one). A pending object (a create not finished) is
        abandoned instead, so it never goes live; a deleted one is left as
        it is, its data read all the same, so that a delete run again can
        finish releasing what it held. ``read`` (a query and its parameters)
        runs after the mark, under its row lock, in the COMMIT's request.
        """
        sql = self.sql(h, table)
        log_sql = h.log_sql() if logged else None

        def txn(cur: Cursor) -> tuple[bool, dict[str, Any] | None, list[Any] | None]:
            cur.execute(sql["lock"], (local_id,))
            row = cur.fetchone()
            if row is None:
                return False, None, None
            data = self._serde.loads(row[0])
            if row[1]:
                cur.defer(sql["delete"], (local_id,))
                if log_sql is not None:
                    cur.defer(log_sql, (wall_ms(), logged))
            elif not int(row[2]):
                cur.defer(sql["abandon"], (local_id,))
            if read is None:
                return bool(row[1]), data, None
            rows: list[list[Any]] = []
            cur.commit_with([read], rows=rows)
            return bool(row[1]), data, rows[0]

        return h.transaction(txn)
