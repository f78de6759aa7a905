"""`floor:promised` on PostgreSQL (Instagram IDs): `store.tools.mix.promised`'s promises, by hand.

The same three promises as on MariaDB (the pair transaction, exact counts,
the guarded insert), in PostgreSQL's SQL on psycopg: the primary's
transaction takes the pair's advisory lock first (PostgreSQL locks nothing
for an absent row, where InnoDB's insert locks the gap), a guarded insert
reads its object's row ``FOR SHARE``, and an upsert says whether it
inserted (``xmax = 0``) so that only a new pair moves the count.
"""

from __future__ import annotations

import hashlib
from typing import Any

from store.tools.mix.pg import PgFloor, _t, shard_of
from store.tools.mix.promised import PromisedFloor
from store.tools.mix.system import MixSchema

__all__ = ["PgPromisedFloor"]


def _pair_key(relation: str, from_id: int, to_id: int) -> int:
    """A signed 64-bit advisory lock key for the pair."""
    digest = hashlib.blake2b(f"{relation}:{from_id}:{to_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class PgPromisedFloor(PromisedFloor, PgFloor):
    """`PromisedFloor` on PostgreSQL: its pair transaction, over `PgFloor`'s connections and reads."""

    name = "floor:promised"

    def __init__(self, schema: MixSchema, *, memcached: list[str], redis_url: str) -> None:
        super().__init__(schema, memcached=memcached, redis_url=redis_url)

    _shard = staticmethod(shard_of)

    @staticmethod
    def _row_key(id_: int) -> int:
        """An Instagram ID is its object row's key."""
        return id_

    def _lock_pair(self, cur: Any, relation: str, from_id: int, to_id: int) -> None:
        """The pair's advisory lock, to the end of the primary's transaction."""
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (_pair_key(relation, from_id, to_id),))

    def _p_sql(self, what: str, shard: int, relation: str) -> str:
        key = (what, shard, relation)
        sql = self._promised.get(key)
        if sql is None:
            rel, counts = _t(shard, relation), _t(shard, self._schema.counts_table)
            obj = _t(shard, self._schema.types[self._from_type[relation]][1])
            guarded = (
                f"INSERT INTO {rel} (from_id, to_id, sequence) SELECT %s, %s, %s FROM {obj} "
                "WHERE id = %s AND active = 1 FOR SHARE"
            )
            sql = self._promised[key] = {
                "add": guarded + " ON CONFLICT DO NOTHING",
                "put": guarded + " ON CONFLICT (from_id, to_id) DO UPDATE SET sequence = excluded.sequence "
                "RETURNING (xmax = 0)",
                "remove": f"DELETE FROM {rel} WHERE from_id = %s AND to_id = %s",
                "up": f"INSERT INTO {counts} AS c (relation, from_id, n) VALUES (%s, %s, 1) "
                "ON CONFLICT (relation, from_id) DO UPDATE SET n = c.n + 1",
                "down": f"UPDATE {counts} SET n = n - 1 WHERE relation = %s AND from_id = %s",
                "count": f"SELECT n FROM {counts} WHERE relation = %s AND from_id = %s",
            }[what]
        return sql

    def _side(self, cur: Any, what: str, relation: str, from_id: int, to_id: int, sequence: int) -> bool:
        """`PromisedFloor._side`: an upsert's row says whether it inserted (rowcount 1 either way)."""
        if what != "put":
            if what == "remove":
                return super()._side(cur, what, relation, from_id, to_id, sequence)
            shard = shard_of(from_id)
            cur.execute(self._p_sql("add", shard, relation), (from_id, to_id, sequence, from_id))
            if cur.rowcount == 1:
                cur.execute(self._p_sql("up", shard, relation), (relation, from_id))
                return True
            return self._has(cur, shard, relation, from_id, to_id)
        shard = shard_of(from_id)
        cur.execute(self._p_sql("put", shard, relation), (from_id, to_id, sequence, from_id))
        row = cur.fetchone()
        if row is None:  # its object gone: no row written
            return self._has(cur, shard, relation, from_id, to_id)
        if row[0]:
            cur.execute(self._p_sql("up", shard, relation), (relation, from_id))
        return True
