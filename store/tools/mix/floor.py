"""The floor: the mix written by hand on PyMySQL, pymemcache and redis-py.

What a careful engineer writes without a library: SQL prebuilt per shard,
one PyMySQL connection per host per thread (a thread that ends leaves its
connections to the next one), objects cached aside in
memcached and first pages and counts in Redis, deleted on every write (no
leases, no staleness bound, no counts table, no transaction across a pair's
two rows, no cleanup of a deleted pin's lists).
"""

from __future__ import annotations

import contextlib
import threading
from array import array
from typing import Any

import orjson
import redis
from pymemcache.client.base import Client
from pymemcache.client.hash import HashClient

from store.tools.mix.dataset_db import raw_connection
from store.tools.mix.system import MixSchema, PageRows, flush_redis
from store.tools.mix.workload import PAGE

__all__ = ["Floor"]

_LOCAL = (1 << 36) - 1


class Floor:
    """The hand-written floor (see the module docstring)."""

    name = "floor"
    #: A page is the first ``limit`` rows with the gone pins left out (it is not filled up).
    fills_pages = False
    #: A fill can race a write and cache what the write replaced (no leases): the check
    #: reports such answers as stale, and holds the floor to its rows after a flush.
    fills_race_writes = True
    #: Opens a connection to a host's URL (the driver's own, outside the store).
    _connect = staticmethod(raw_connection)

    def __init__(
        self, schema: MixSchema, *, memcached: list[str], redis_url: str, prefix: str = "mixfloor:"
    ) -> None:
        self._schema = schema
        self._servers = memcached
        self._redis = redis.Redis.from_url(redis_url)
        self._redis_url = redis_url
        self._p = prefix
        self._local = threading.local()
        self._tables = {t: tb for _name, (t, tb) in schema.types.items()}
        self._type_ids = {tb: t for t, tb in self._tables.items()}
        self._inverse = {r: inv for r, (_f, _t, inv) in schema.relations.items()}
        self._sql: dict[tuple[str, int, str], str] = {}
        self._ttl = 3600
        self._all: list[Any] = []
        #: Thread ident -> its connections ("curs": cursor per host, "mc": memcached client).
        self._owned: dict[int | None, dict[str, Any]] = {}
        self._all_lock = threading.Lock()

    # -- connections and SQL -----------------------------------------------------

    def _mine(self) -> dict[str, Any]:
        """This thread's connections: a set of its own, adopted from a thread that has ended if any."""
        mine: dict[str, Any] | None = getattr(self._local, "mine", None)
        if mine is None:
            me = threading.get_ident()
            with self._all_lock:
                # A set under this thread's own ident is an ended thread's (idents are reused,
                # and this thread has none yet): its first. Left there, it would be replaced
                # below and its connections left open, unused, until the run's end.
                mine = self._owned.pop(me, None)
                if mine is None:
                    alive = {t.ident for t in threading.enumerate()}
                    for ident in list(self._owned):
                        if ident not in alive:
                            mine = self._owned.pop(ident)
                            break
                    else:
                        mine = {}
                self._owned[me] = mine
            self._local.mine = mine
        return mine

    def _cur(self, shard: int) -> Any:
        curs: dict[str, Any] = self._mine().setdefault("curs", {})
        host = self._schema.masters[shard]
        cur = curs.get(host)
        if cur is None:
            conn = self._connect(self._schema.hosts[host])
            with self._all_lock:
                self._all.append(conn)
            cur = curs[host] = conn.cursor()
        return cur

    def _mc(self) -> Any:
        mine = self._mine()
        mc = mine.get("mc")
        if mc is None:
            if len(self._servers) == 1:
                host, port = self._servers[0].rsplit(":", 1)
                mc = Client((host, int(port)), connect_timeout=1, timeout=1, no_delay=True)
            else:
                hosts = [(h, int(p)) for h, p in (s.rsplit(":", 1) for s in self._servers)]
                mc = HashClient(hosts, connect_timeout=1, timeout=1, no_delay=True)
            mine["mc"] = mc
            with self._all_lock:
                self._all.append(mc)
        return mc

    def _q(self, what: str, shard: int, name: str) -> str:
        key = (what, shard, name)
        sql = self._sql.get(key)
        if sql is None:
            t = f"`{MixSchema.database(shard)}`.`{name}`"
            sql = self._sql[key] = {
                "get": f"SELECT data FROM {t} WHERE local_id = %s AND active = 1",
                "lock": f"SELECT data FROM {t} WHERE local_id = %s AND active = 1 FOR UPDATE",
                "set": f"UPDATE {t} SET data = %s WHERE local_id = %s",
                "insert": f"INSERT INTO {t} (data) VALUES (%s)",
                "kill": f"UPDATE {t} SET active = 0 WHERE local_id = %s",
                "many": f"SELECT {(shard << 46) | (self._type_ids.get(name, 0) << 36)} + local_id, data "
                f"FROM {t} WHERE active = 1 AND local_id IN ",
                "page": f"SELECT to_id FROM {t} WHERE from_id = %s ORDER BY sequence, to_id LIMIT %s",
                "count": f"SELECT COUNT(*) FROM {t} WHERE from_id = %s",
                "add": f"INSERT IGNORE INTO {t} (from_id, to_id, sequence) VALUES (%s, %s, %s)",
                "upsert": f"INSERT INTO {t} (from_id, to_id, sequence) VALUES (%s, %s, %s) "
                "ON DUPLICATE KEY UPDATE sequence = VALUES(sequence)",
                "remove": f"DELETE FROM {t} WHERE from_id = %s AND to_id = %s",
                "has": f"SELECT 1 FROM {t} WHERE from_id = %s AND to_id = %s",
            }[what]
        return sql

    def _table(self, id_: int) -> str:
        return self._tables[(id_ >> 36) & 0x3FF]

    # -- objects -----------------------------------------------------------------

    def get_node(self, id_: int, type_name: str | None = None) -> dict[str, Any] | None:
        """memcached, else the row (and fill)."""
        key = f"{self._p}o:{id_}"
        mc = self._mc()
        v = mc.get(key)
        if v is not None:
            return dict(orjson.loads(v))
        shard = id_ >> 46
        cur = self._cur(shard)
        cur.execute(self._q("get", shard, self._table(id_)), (id_ & _LOCAL,))
        row = cur.fetchone()
        if row is None:
            return None
        mc.set(key, row[0], expire=self._ttl)
        return dict(orjson.loads(row[0]))

    def _get_many(self, ids: list[int]) -> dict[int, dict[str, Any]]:
        mc = self._mc()
        keys = {f"{self._p}o:{i}": i for i in ids}
        got = mc.get_many(list(keys)) if keys else {}
        out = {keys[k]: dict(orjson.loads(v)) for k, v in got.items()}
        missing = [i for k, i in keys.items() if k not in got]
        if not missing:
            return out
        by_host: dict[str, dict[tuple[int, str], list[int]]] = {}
        for i in missing:
            shard = i >> 46
            host = self._schema.masters[shard]
            by_host.setdefault(host, {}).setdefault((shard, self._table(i)), []).append(i & _LOCAL)
        fill: dict[str, bytes] = {}
        for groups in by_host.values():
            parts, params = [], []
            for (shard, table), locals_ in groups.items():
                parts.append(self._q("many", shard, table) + "(" + ", ".join(["%s"] * len(locals_)) + ")")
                params += locals_
            first = next(iter(groups))[0]
            cur = self._cur(first)
            cur.execute(" UNION ALL ".join(parts), params)
            for whole, text in cur.fetchall():
                id_ = int(whole)
                out[id_] = dict(orjson.loads(text))
                fill[f"{self._p}o:{id_}"] = text.encode() if isinstance(text, str) else text
        if fill:
            mc.set_many(fill, expire=self._ttl)
        return out

    def add_node(self, type_name: str, data: dict[str, Any], near: int) -> int:
        """One INSERT on ``near``'s shard."""
        shard = near >> 46
        type_id, table = self._schema.types[type_name]
        cur = self._cur(shard)
        cur.execute(self._q("insert", shard, table), (orjson.dumps(data).decode(),))
        return (shard << 46) | (type_id << 36) | int(cur.lastrowid)

    def update_node(self, id_: int, changes: dict[str, Any], type_name: str | None = None) -> None:
        """Read-modify-write under FOR UPDATE, then delete the cache entry."""
        shard = id_ >> 46
        table = self._table(id_)
        cur = self._cur(shard)
        cur.execute("BEGIN")
        try:
            cur.execute(self._q("lock", shard, table), (id_ & _LOCAL,))
            row = cur.fetchone()
            if row is not None:
                new = {**orjson.loads(row[0]), **changes}
                cur.execute(self._q("set", shard, table), (orjson.dumps(new).decode(), id_ & _LOCAL))
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        self._mc().delete(f"{self._p}o:{id_}", noreply=False)

    def delete_node(self, id_: int, type_name: str | None = None) -> None:
        """Mark inactive, delete the cache entry."""
        shard = id_ >> 46
        cur = self._cur(shard)
        cur.execute(self._q("kill", shard, self._table(id_)), (id_ & _LOCAL,))
        self._mc().delete(f"{self._p}o:{id_}", noreply=False)

    # -- lists -------------------------------------------------------------------

    def _ids(self, relation: str, from_id: int, limit: int) -> list[int]:
        # The first page of PAGE entries is cached (the only page the mix reads).
        key = f"{self._p}l:{relation}:{from_id}"
        if limit == PAGE:
            v: Any = self._redis.get(key)
            if v is not None:
                return list(array("q", v))
        shard = from_id >> 46
        cur = self._cur(shard)
        cur.execute(self._q("page", shard, relation), (from_id, limit))
        ids = [int(r[0]) for r in cur.fetchall()]
        if limit == PAGE:
            self._redis.set(key, array("q", ids).tobytes(), ex=self._ttl)
        return ids

    def board_page(self, board_id: int, limit: int) -> PageRows:
        """Redis for the ids, memcached (one batch) for the pins."""
        ids = self._ids("board_has_pins", board_id, limit)
        objs = self._get_many(ids)
        return [(i, objs[i]) for i in ids if i in objs]

    def link_ids(self, relation: str, from_id: int, limit: int) -> list[int]:
        """The first page's ids, cached in Redis."""
        return self._ids(relation, from_id, limit)

    def count_links(self, relation: str, from_id: int) -> int:
        """COUNT(*), cached in Redis."""
        key = f"{self._p}c:{relation}:{from_id}"
        v = self._redis.get(key)
        if v is not None:
            return int(v)
        shard = from_id >> 46
        cur = self._cur(shard)
        cur.execute(self._q("count", shard, relation), (from_id,))
        n = int(cur.fetchone()[0])
        self._redis.set(key, n, ex=self._ttl)
        return n

    def _both(self, what: str, relation: str, from_id: int, to_id: int, *args: int) -> None:
        inverse = self._inverse[relation]
        sides = [(relation, from_id, to_id)]
        if inverse is not None:
            sides.append((inverse, to_id, from_id))
        for rel, f, t in sides:
            shard = f >> 46
            self._cur(shard).execute(self._q(what, shard, rel), (f, t, *args))
        self._redis.delete(
            *[f"{self._p}l:{rel}:{f}" for rel, f, _t in sides],
            *[f"{self._p}c:{rel}:{f}" for rel, f, _t in sides],
        )

    def add_link(self, relation: str, from_id: int, to_id: int, sequence: int) -> None:
        """Two INSERT IGNOREs, one Redis DEL."""
        self._both("add", relation, from_id, to_id, sequence)

    def update_link(self, relation: str, from_id: int, to_id: int, sequence: int) -> None:
        """Two upserts, one Redis DEL."""
        self._both("upsert", relation, from_id, to_id, sequence)

    def delete_link(self, relation: str, from_id: int, to_id: int) -> None:
        """Two DELETEs, one Redis DEL."""
        self._both("remove", relation, from_id, to_id)

    def has_link(self, relation: str, from_id: int, to_id: int) -> bool:
        """One primary-key read."""
        shard = from_id >> 46
        cur = self._cur(shard)
        cur.execute(self._q("has", shard, relation), (from_id, to_id))
        return cur.fetchone() is not None

    # -- lifecycle ---------------------------------------------------------------

    def flush(self) -> None:
        """Drop the floor's Redis keys (memcached is flushed by the runner)."""
        flush_redis(self._redis_url, self._p)

    def close(self) -> None:
        """Close every connection the threads opened."""
        with self._all_lock:
            for c in self._all:
                with contextlib.suppress(Exception):
                    c.close()
            self._all.clear()
        self._redis.close()
