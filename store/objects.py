"""The object repository: rows of JSON objects in per-shard tables.

It knows shards, tables and local ids, never 64-bit IDs or the map: the
`Store` facade routes, this module runs the SQL. SQL text is built once per
(shard, table) and kept, so a call costs a dict look-up, not a statement build.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from store.engines import Cursor, ShardHandle
from store.exceptions import BackendError, DataError, NotFound, NotSerializableError
from store.serde import Serde

__all__ = ["ObjectRepository", "Updater"]

#: ``update`` takes either a dict of changes merged into the object, or a
#: function from the old object to the new one.
Updater = dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]]


class _Sql:
    """The statements for one table of one shard."""

    __slots__ = ("delete", "insert", "lock", "remove", "select", "update")

    def __init__(self, h: ShardHandle, table: str, key: str) -> None:
        d = h.dialect
        t = h.table(table)
        p = d.param
        # Pinterest tables: local_id AUTO_INCREMENT, read back as lastrowid.
        # Instagram tables: id made by the database, read back with RETURNING.
        returning = " RETURNING id" if key == "id" else ""
        self.insert = f"INSERT INTO {t} (data) VALUES ({p}){returning}"
        self.select = f"SELECT data FROM {t} WHERE {key} = {p} AND active = 1"
        self.lock = f"SELECT data, active FROM {t} WHERE {key} = {p}{d.for_update}"
        self.update = f"UPDATE {t} SET data = {p}{d.touch_ts} WHERE {key} = {p}"
        self.delete = f"UPDATE {t} SET active = 0{d.touch_ts} WHERE {key} = {p} AND active = 1"
        self.remove = f"DELETE FROM {t} WHERE {key} = {p}"


_INSERT_ATTEMPTS = 5


def _duplicate_key(exc: BackendError) -> bool:
    orig = exc.orig
    code = orig.args[0] if orig is not None and orig.args else None
    return code == 1062 or getattr(orig, "sqlstate", None) == "23505"


class ObjectRepository:
    """Create, read, update and soft-delete objects on one shard at a time."""

    def __init__(self, *, serde: Serde, key: str = "local_id") -> None:
        self._serde = serde
        self._key = key
        self._sql: dict[tuple[str, int, str], _Sql] = {}

    def sql(self, h: ShardHandle, table: str) -> _Sql:
        """The cached statements for ``table`` on ``h``'s shard."""
        key = (h.host, h.shard, table)
        sql = self._sql.get(key)
        if sql is None:
            sql = self._sql[key] = _Sql(h, table, self._key)
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
                    cur.execute(sql.insert, (text,))
                    local_id = cur.fetchone()[0] if self._key == "id" else cur.lastrowid
                    cur.close()
                break
            except BackendError as exc:
                # An ID the database made twice (a MariaDB shard made by an
                # earlier version, whose trigger used a sequence): the primary
                # key refused the row, nothing was written; make another.
                if self._key != "id" or not _duplicate_key(exc) or attempt == _INSERT_ATTEMPTS:
                    raise
        if not local_id:
            raise DataError(f"the database returned no local id for the insert into {table}")
        return int(local_id)

    def remove(self, h: ShardHandle, table: str, local_id: int) -> None:
        """Hard-delete one row (used only to undo an insert that cannot get an ID)."""
        with h.connect() as conn:
            cur = conn.cursor()
            cur.execute(self.sql(h, table).remove, (local_id,))
            cur.close()

    def get(self, h: ShardHandle, table: str, local_id: int) -> str | None:
        """The JSON text of the live object with ``local_id``, or None."""
        row = h.read(self.sql(h, table).select, (local_id,), one=True)
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
            t = h.dialect.table(shard, table)
            labels.append((shard, table))
            selects.append(
                f"SELECT {i} AS part, {self._key}, data FROM {t} "
                f"WHERE active = 1 AND {self._key} IN ({h.dialect.params(len(local_ids))})"
            )
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
            cur.execute(sql.lock, (local_id,))
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
            cur.execute(sql.update, (self._serde.dumps(new), local_id))
            return new

        return h.transaction(txn)

    def delete(self, h: ShardHandle, table: str, local_id: int) -> bool:
        """Mark one object inactive; True if it was live."""
        with h.connect() as conn:
            cur = conn.cursor()
            cur.execute(self.sql(h, table).delete, (local_id,))
            changed = cur.rowcount
            cur.close()
        return bool(changed)
