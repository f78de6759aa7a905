"""`floor:promised`: the hand-written floor, plus the store's write promises, written by hand.

What the plain floor leaves out and the store keeps, and nothing more, so
that the store's cost can be set against the same work done by hand:

- **The pair transaction.** A link, move or unlink writes the primary side
  (the relation declared with an inverse) in a transaction that holds the
  pair's key lock, writes the inverse side in a transaction of its own on
  the other shard while holding it, commits the inverse, then the primary.
  Where both shards are on one host (one connection per host per thread,
  as the floor has), one transaction writes both.
- **Exact counts.** A side that changed a row moves its list's count in
  ``relation_counts`` in the same transaction; `count_links` reads that row
  (cached in Redis as the floor caches counts), not ``COUNT(*)``.
- **The guarded insert.** A side's insert reads its ``from`` object's row in
  share mode in the same statement (``INSERT ... SELECT ... FROM <table>
  WHERE local_id = ? AND active = 1 LOCK IN SHARE MODE``): a link to a
  deleted object writes nothing, and a delete of the object waits for it.

Cache invalidation stays the floor's own: its keys deleted after each
commit. The store's versions, leases, staleness bound, unique keys and the
sweep of a deleted object's lists are not here (the mix does not measure
them apart).
"""

from __future__ import annotations

from typing import Any

from store.tools.mix.floor import Floor
from store.tools.mix.system import MixSchema

__all__ = ["PromisedFloor"]

_LOCAL = (1 << 36) - 1


class PromisedFloor(Floor):
    """The floor plus the pair transaction, exact counts and the guarded insert (module docstring)."""

    name = "floor:promised"

    def __init__(self, schema: MixSchema, *, memcached: list[str], redis_url: str) -> None:
        super().__init__(schema, memcached=memcached, redis_url=redis_url, prefix="mixpromised:")
        self._from_type = {r: f for r, (f, _t, _inv) in schema.relations.items()}
        for _r, (_f, t, inv) in schema.relations.items():
            if inv is not None:
                self._from_type.setdefault(inv, t)
        self._promised: dict[tuple[str, int, str], str] = {}

    @staticmethod
    def _shard(id_: int) -> int:
        """The shard an ID's row is on (a Pinterest ID's top bits)."""
        return id_ >> 46

    @staticmethod
    def _row_key(id_: int) -> int:
        """The object row's key of an ID (a Pinterest ID's local id)."""
        return id_ & _LOCAL

    def _lock_pair(self, cur: Any, relation: str, from_id: int, to_id: int) -> None:
        """Lock the pair's key in the primary's transaction: MariaDB's guarded insert (or delete)
        locks it itself, present or not (the gap where it would go)."""

    def _p_sql(self, what: str, shard: int, relation: str) -> str:
        key = (what, shard, relation)
        sql = self._promised.get(key)
        if sql is None:
            db = MixSchema.database(shard)
            rel = f"`{db}`.`{relation}`"
            counts = f"`{db}`.`{self._schema.counts_table}`"
            obj = f"`{db}`.`{self._schema.types[self._from_type[relation]][1]}`"
            guarded = (
                f"INSERT INTO {rel} (from_id, to_id, sequence) SELECT %s, %s, %s FROM {obj} "
                "WHERE local_id = %s AND active = 1 LOCK IN SHARE MODE"
            )
            sql = self._promised[key] = {
                "add": guarded.replace("INSERT INTO", "INSERT IGNORE INTO", 1),
                "put": guarded + " ON DUPLICATE KEY UPDATE sequence = VALUES(sequence)",
                "remove": f"DELETE FROM {rel} WHERE from_id = %s AND to_id = %s",
                "up": f"INSERT INTO {counts} (relation, from_id, n) VALUES (%s, %s, 1) "
                "ON DUPLICATE KEY UPDATE n = n + 1",
                "down": f"UPDATE {counts} SET n = n - 1 WHERE relation = %s AND from_id = %s",
                "count": f"SELECT n FROM {counts} WHERE relation = %s AND from_id = %s",
            }[what]
        return sql

    def _side(self, cur: Any, what: str, relation: str, from_id: int, to_id: int, sequence: int) -> bool:
        """Write one side and move its count if a row changed; True if the side holds the pair now
        (False: its object is gone, and the pair was not there)."""
        shard = self._shard(from_id)
        if what == "remove":
            cur.execute(self._p_sql("remove", shard, relation), (from_id, to_id))
            if cur.rowcount:
                cur.execute(self._p_sql("down", shard, relation), (relation, from_id))
            return True
        cur.execute(self._p_sql(what, shard, relation), (from_id, to_id, sequence, self._row_key(from_id)))
        # Rowcount: 1 inserted; 2 moved (ON DUPLICATE KEY UPDATE); 0 there already, or the object gone.
        if cur.rowcount == 1:
            cur.execute(self._p_sql("up", shard, relation), (relation, from_id))
            return True
        return cur.rowcount == 2 or self._has(cur, shard, relation, from_id, to_id)

    def _has(self, cur: Any, shard: int, relation: str, from_id: int, to_id: int) -> bool:
        cur.execute(self._q("has", shard, relation), (from_id, to_id))
        return cur.fetchone() is not None

    def _pair(self, what: str, relation: str, from_id: int, to_id: int, sequence: int = 0) -> None:
        inverse = self._inverse[relation]
        primary = self._cur(self._shard(from_id))
        other = None if inverse is None else self._cur(self._shard(to_id))
        one = other is None or other is primary
        primary.execute("BEGIN")
        try:
            self._lock_pair(primary, relation, from_id, to_id)
            ok = self._side(primary, what, relation, from_id, to_id, sequence)
            if ok and inverse is not None and other is not None:
                if one:
                    ok = self._side(primary, what, inverse, to_id, from_id, sequence)
                else:
                    other.execute("BEGIN")
                    try:
                        ok = self._side(other, what, inverse, to_id, from_id, sequence)
                        other.execute("COMMIT" if ok else "ROLLBACK")
                    except BaseException:
                        other.execute("ROLLBACK")
                        raise
            primary.execute("COMMIT" if ok else "ROLLBACK")
        except BaseException:
            primary.execute("ROLLBACK")
            raise
        sides = [(relation, from_id)] + ([] if inverse is None else [(inverse, to_id)])
        self._redis.delete(
            *[f"{self._p}l:{rel}:{f}" for rel, f in sides], *[f"{self._p}c:{rel}:{f}" for rel, f in sides]
        )

    def add_link(self, relation: str, from_id: int, to_id: int, sequence: int) -> None:
        """Both sides' guarded inserts and counts, the inverse under the primary's lock."""
        self._pair("add", relation, from_id, to_id, sequence)

    def update_link(self, relation: str, from_id: int, to_id: int, sequence: int) -> None:
        """Both sides' guarded upserts and counts, the inverse under the primary's lock."""
        self._pair("put", relation, from_id, to_id, sequence)

    def delete_link(self, relation: str, from_id: int, to_id: int) -> None:
        """Both sides' deletes and counts, the inverse under the primary's lock."""
        self._pair("remove", relation, from_id, to_id)

    def count_links(self, relation: str, from_id: int) -> int:
        """The list's counts row (kept exact by every write), cached in Redis."""
        key = f"{self._p}c:{relation}:{from_id}"
        v = self._redis.get(key)
        if v is not None:
            return int(v)
        shard = self._shard(from_id)
        cur = self._cur(shard)
        cur.execute(self._p_sql("count", shard, relation), (relation, from_id))
        row = cur.fetchone()
        n = 0 if row is None else int(row[0])
        self._redis.set(key, n, ex=self._ttl)
        return n
