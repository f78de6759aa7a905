"""The object repository: rows of JSON objects in per-shard tables.

It knows shards, tables and local ids, never 64-bit IDs or the map: the
`Store` facade routes, this module runs the SQL. The statements are SQLAlchemy
Core, compiled once per (backend, table) and specialised per shard
(`store.backends.statements.ObjectStatements`), so a call costs a dict
look-up, not a statement build.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from store.backends.statements import ObjectStatements
from store.engines import Cursor, ShardHandle
from store.exceptions import BackendError, DataError, NotFound, NotSerializableError
from store.serde import Serde

__all__ = ["ObjectRepository", "Updater"]

#: ``update`` takes either a dict of changes merged into the object, or a
#: function from the old object to the new one.
Updater = dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]]


_INSERT_ATTEMPTS = 5


class ObjectRepository:
    """Create, read, update and soft-delete objects on one shard at a time."""

    def __init__(self, *, serde: Serde, ids: str = "pinterest") -> None:
        self._serde = serde
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

    def decode(self, text: str | bytes) -> dict[str, Any]:
        """Deserialise stored JSON text."""
        return self._serde.loads(text)

    def encode(self, data: dict[str, Any]) -> str:
        """Validate and serialise ``data``; raises `DataError` before any I/O."""
        return self._serde.dumps(data)

    def insert(self, h: ShardHandle, table: str, text: str) -> int:
        """Insert one encoded object; return its new key (local id, or the whole Instagram ID)."""
        sql = self.sql(h, table)
        for attempt in range(1, _INSERT_ATTEMPTS + 1):
            try:
                with h.connect() as conn:
                    cur = conn.cursor()
                    cur.execute(sql["insert"], (text,))
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

    def remove(self, h: ShardHandle, table: str, local_id: int) -> None:
        """Hard-delete one row (used only to undo an insert that cannot get an ID)."""
        with h.connect() as conn:
            cur = conn.cursor()
            cur.execute(self.sql(h, table)["remove"], (local_id,))
            cur.close()

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
        selects: list[str] = []
        params: list[int] = []
        labels: list[tuple[int, str]] = []
        for i, (shard, table, local_ids) in enumerate(parts):
            labels.append((shard, table))
            selects.append(self.statements(h, table).select_many_for(shard, i, len(local_ids)))
            params.extend(local_ids)
        query = selects[0] if len(selects) == 1 else " UNION ALL ".join(selects)
        rows = h.read(query, params, one=False)
        return [(*labels[part], local_id, text) for part, local_id, text in rows]

    def update(
        self, h: ShardHandle, table: str, local_id: int, changes: Updater, *, what: str
    ) -> dict[str, Any]:
        """Read-modify-write one object under a row lock, in one transaction."""
        sql = self.sql(h, table)

        def txn(cur: Cursor) -> dict[str, Any]:
            cur.execute(sql["lock"], (local_id,))
            row = cur.fetchone()
            if row is None or not row[1]:
                raise NotFound(f"no live object {what}")
            old = self._serde.loads(row[0])
            if callable(changes):
                new = changes(old)
                if not isinstance(new, dict):
                    raise NotSerializableError(
                        f"the update function for {what} returned {type(new).__name__}; "
                        "it must return the whole new object as a dict"
                    )
            else:
                new = {**old, **changes}
            cur.execute(sql["update"], (self._serde.dumps(new), local_id))
            return new

        return h.transaction(txn)

    def delete(self, h: ShardHandle, table: str, local_id: int) -> bool:
        """Mark one object inactive; True if it was live."""
        with h.connect() as conn:
            cur = conn.cursor()
            cur.execute(self.sql(h, table)["delete"], (local_id,))
            changed = cur.rowcount
            cur.close()
        return bool(changed)
