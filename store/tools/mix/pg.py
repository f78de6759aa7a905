"""The mix on PostgreSQL with Instagram IDs: its config, data set copies, truth, and the psycopg floor.

Each logical shard is a schema (``shard0042``) whose tables make their IDs
with the schema's ``next_id()``: a copy is loaded with ``INSERT ...
RETURNING id``, a thousand rows a statement, and removed again by its IDs.
An Instagram ID names its shard (bits 10-22) but not its type, so every
node operation is told the type (`store.tools.mix.system.System`).

The floor (`PgFloor`) is the MariaDB floor's design on psycopg: SQL prebuilt
per schema, one autocommit connection per host per thread, objects cached
aside in memcached and first pages and counts in Redis, deleted on every
write (no leases, no staleness bound, no counts table, no transaction
across a pair's two rows, no cleanup of a deleted pin's lists).
"""

from __future__ import annotations

import contextlib
import copy
from array import array
from collections.abc import Callable
from typing import Any

import orjson
from sqlalchemy.engine import make_url

from store.defaults import EMBEDDED
from store.ids import INSTAGRAM_EPOCH_MS
from store.tools.mix.dataset_db import Copy, connections
from store.tools.mix.floor import Floor
from store.tools.mix.system import MixSchema
from store.tools.mix.workload import PAGE, DataSet

__all__ = [
    "PgFloor",
    "PgTruth",
    "default_pg_config",
    "load_copy_pg",
    "pg_connection",
    "remove_copy_pg",
    "settle_pg",
    "shard_of",
]

_BATCH = 1000
_SEQ_STEP = 1000  # initial sequences: far below "now in microseconds", so new links go after


def shard_of(id_: int) -> int:
    """The shard bits (10-22) of an Instagram ID."""
    return (id_ >> 10) & 0x1FFF


def default_pg_config(url_a: str, url_b: str, *, shards: int = 64, cache: bool = True) -> dict[str, Any]:
    """The mix's PostgreSQL config: ``shards`` schema shards, half on host name A, half on B."""
    half = shards // 2
    config: dict[str, Any] = {
        "ids": "instagram",
        "instagram": {"epoch_ms": INSTAGRAM_EPOCH_MS},
        "shards": shards,
        "hosts": {"MixA": url_a, "MixB": url_b},
        "map": [
            {"range": [0, half - 1], "master": "MixA"},
            {"range": [half, shards - 1], "master": "MixB"},
        ],
        "types": copy.deepcopy(EMBEDDED["types"]),
        "relations": {name: dict(rel) for name, rel in EMBEDDED["relations"].items() if "inverse" in rel},
        "pool_size": 16,
    }
    if cache:
        config["cache"] = {
            "memcached": ["127.0.0.1:11211"],
            "redis": "redis://127.0.0.1:6379/0",
            "prefix": "mixpg:",
            "timeout_ms": 200,
            "connect_timeout_ms": 200,
        }
    return config


def pg_connection(url: str) -> Any:
    """A plain psycopg connection (autocommit, psycopg's own cursor) to the database of ``url``."""
    import psycopg

    u = make_url(url)
    return psycopg.connect(
        host=u.host or "127.0.0.1",
        port=u.port or 5432,
        user=u.username or "postgres",
        password=u.password or None,
        dbname=u.database,
        autocommit=True,
    )


def _t(shard: int, table: str) -> str:
    return f'"{MixSchema.schema(shard)}"."{table}"'


def load_copy_pg(
    schema: MixSchema, data: DataSet, shards: list[int], progress: Callable[[int], None] | None = None
) -> Copy:
    """Bulk-load a copy of ``data`` over ``shards`` (IDs made by each schema's next_id()); its IDs."""
    say = progress or (lambda _n: None)
    table = {name: tb for name, (_t, tb) in schema.types.items()}
    s = data.shape
    user_shard = [shards[u % len(shards)] for u in range(s.users)]
    board_shard = [user_shard[data.board_owner[b]] for b in range(s.boards)]
    pin_shard = [board_shard[data.pin_board[p]] for p in range(s.pins)]
    out = Copy([], [], [])
    with connections(schema, pg_connection) as cursor:

        def load(name: str, where: list[int], objects: Callable[[int], dict[str, Any]]) -> list[int]:
            by_shard: dict[int, list[int]] = {}
            for i, shard in enumerate(where):
                by_shard.setdefault(shard, []).append(i)
            ids = [0] * len(where)
            for shard, indices in by_shard.items():
                cur = cursor(shard)
                for k in range(0, len(indices), _BATCH):
                    part = indices[k : k + _BATCH]
                    texts = [orjson.dumps(objects(i)).decode() for i in part]
                    # In order: next_id() increases within a schema, so sorted IDs follow the rows.
                    cur.execute(
                        f"INSERT INTO {_t(shard, table[name])} (data) SELECT d FROM unnest(%s::text[]) "
                        "WITH ORDINALITY AS u(d, k) ORDER BY k RETURNING id",
                        (texts,),
                    )
                    for i, id_ in zip(part, sorted(int(r[0]) for r in cur.fetchall()), strict=True):
                        ids[i] = id_
                    say(len(part))
            return ids

        out.users = load("user", user_shard, data.user_data)
        out.boards = load("board", board_shard, data.board_data)
        out.pins = load("pin", pin_shard, data.pin_data)
        pairs: dict[str, list[tuple[int, int, int]]] = {}
        for b, own in enumerate(data.board_pins):
            for p in own:
                seq = (p + 1) * _SEQ_STEP
                pairs.setdefault("board_has_pins", []).append((out.boards[b], out.pins[p], seq))
                pairs.setdefault("pin_owned_by_board", []).append((out.pins[p], out.boards[b], seq))
        for u, liked in enumerate(data.user_likes):
            for i, p in enumerate(liked):
                seq = (i + 1) * _SEQ_STEP
                pairs.setdefault("users_likes_pins", []).append((out.users[u], out.pins[p], seq))
                pairs.setdefault("pin_liked_by_user", []).append((out.pins[p], out.users[u], seq))
        for relation, triples in pairs.items():
            by_shard: dict[int, list[tuple[int, int, int]]] = {}
            counts: dict[int, int] = {}
            for f, t, q in triples:
                by_shard.setdefault(shard_of(f), []).append((f, t, q))
                counts[f] = counts.get(f, 0) + 1
            for shard, part in by_shard.items():
                cur = cursor(shard)
                for i in range(0, len(part), _BATCH):
                    chunk = part[i : i + _BATCH]
                    cur.execute(
                        f"INSERT INTO {_t(shard, relation)} (from_id, to_id, sequence) "
                        "SELECT * FROM unnest(%s::bigint[], %s::bigint[], %s::bigint[])",
                        (
                            [f for f, _t2, _q in chunk],
                            [t for _f, t, _q in chunk],
                            [q for _f, _t2, q in chunk],
                        ),
                    )
                    say(len(chunk))
                mine = [(f, n) for f, n in counts.items() if shard_of(f) == shard]
                cur.execute(
                    f"INSERT INTO {_t(shard, schema.counts_table)} (relation, from_id, n) "
                    "SELECT %s, f, n FROM unnest(%s::bigint[], %s::bigint[]) AS u(f, n) "
                    "ON CONFLICT (relation, from_id) DO UPDATE SET n = excluded.n",
                    (relation, [f for f, _n in mine], [n for _f, n in mine]),
                )
    return out


def settle_pg(schema: MixSchema) -> None:
    """``VACUUM (ANALYZE)`` every table of the mix's shards, once every copy is loaded: the planner
    gets its statistics, and the vacuum and analysis the loads (and an earlier run's removals)
    call for run now, not in the middle of whichever system's phase autovacuum picks."""
    tables = [t for _id, t in schema.types.values()] + [*schema.relations, schema.counts_table]
    by_host: dict[str, list[int]] = {}
    for shard, host in schema.masters.items():
        by_host.setdefault(host, []).append(shard)
    for host, shards in by_host.items():
        conn = pg_connection(schema.hosts[host])
        try:
            for shard in shards:
                for table in tables:
                    conn.execute(f"VACUUM (ANALYZE) {_t(shard, table)}")
        finally:
            conn.close()


def remove_copy_pg(schema: MixSchema, copy: Copy) -> None:
    """Delete every row of the copy and the pins its run created, with their lists and counts."""
    by_type = {"user": copy.users, "board": copy.boards, "pin": copy.pins + copy.created}
    with connections(schema, pg_connection) as cursor:
        for name, ids in by_type.items():
            table = schema.types[name][1]
            by_shard: dict[int, list[int]] = {}
            for id_ in ids:
                by_shard.setdefault(shard_of(id_), []).append(id_)
            for shard, mine in by_shard.items():
                if shard not in schema.masters:
                    continue
                cur = cursor(shard)
                cur.execute(f"DELETE FROM {_t(shard, table)} WHERE id = ANY(%s)", (mine,))
                for relation, (from_type, _to, _inv) in schema.relations.items():
                    if from_type != name:
                        continue
                    cur.execute(f"DELETE FROM {_t(shard, relation)} WHERE from_id = ANY(%s)", (mine,))
                    cur.execute(
                        f"DELETE FROM {_t(shard, schema.counts_table)} "
                        "WHERE relation = %s AND from_id = ANY(%s)",
                        (relation, mine),
                    )


class PgTruth:
    """What the PostgreSQL schemas hold, read directly: the answers every system is checked against."""

    def __init__(self, schema: MixSchema) -> None:
        self._schema = schema
        self._stack = contextlib.ExitStack()
        self._cursor = self._stack.enter_context(connections(schema, pg_connection))

    def close(self) -> None:
        """Close the connections."""
        self._stack.close()

    def node(self, id_: int, type_name: str | None = None) -> dict[str, Any] | None:
        """The live object of type ``type_name``, or None."""
        shard = shard_of(id_)
        cur = self._cursor(shard)
        table = self._schema.types[type_name or "pin"][1]
        cur.execute(f"SELECT data FROM {_t(shard, table)} WHERE id = %s AND active = 1", (id_,))
        row = cur.fetchone()
        return None if row is None else dict(orjson.loads(row[0]))

    def rows(self, relation: str, from_id: int) -> list[int]:
        """Every to_id of the list, in (sequence, to_id) order."""
        shard = shard_of(from_id)
        cur = self._cursor(shard)
        cur.execute(
            f"SELECT to_id FROM {_t(shard, relation)} WHERE from_id = %s ORDER BY sequence, to_id", (from_id,)
        )
        return [int(r[0]) for r in cur.fetchall()]

    def live(self, ids: list[int], type_name: str | None = None) -> dict[int, dict[str, Any]]:
        """The live objects among ``ids``, all of type ``type_name``."""
        out: dict[int, dict[str, Any]] = {}
        for id_ in ids:
            obj = self.node(id_, type_name)
            if obj is not None:
                out[id_] = obj
        return out


class PgFloor(Floor):
    """The hand-written floor on psycopg (see the module docstring); its connection and cache
    plumbing, pages and the link writes that send the same statements are `Floor`'s."""

    _connect = staticmethod(pg_connection)

    def __init__(
        self, schema: MixSchema, *, memcached: list[str], redis_url: str, prefix: str = "mixpgfloor:"
    ) -> None:
        super().__init__(schema, memcached=memcached, redis_url=redis_url, prefix=prefix)
        self._by_name = {name: tb for name, (_t, tb) in schema.types.items()}
        self._pins = self._by_name[schema.relations["board_has_pins"][1]]

    # -- connections and SQL -----------------------------------------------------

    def _q(self, what: str, shard: int, name: str) -> str:
        key = (what, shard, name)
        sql = self._sql.get(key)
        if sql is None:
            t = _t(shard, name)
            sql = self._sql[key] = {
                "get": f"SELECT data FROM {t} WHERE id = %s AND active = 1",
                "lock": f"SELECT data FROM {t} WHERE id = %s AND active = 1 FOR UPDATE",
                "set": f"UPDATE {t} SET data = %s WHERE id = %s",
                "insert": f"INSERT INTO {t} (data) VALUES (%s) RETURNING id",
                "kill": f"UPDATE {t} SET active = 0 WHERE id = %s",
                "many": f"SELECT id, data FROM {t} WHERE active = 1 AND id IN ",
                "page": f"SELECT to_id FROM {t} WHERE from_id = %s ORDER BY sequence, to_id LIMIT %s",
                "count": f"SELECT COUNT(*) FROM {t} WHERE from_id = %s",
                "add": f"INSERT INTO {t} (from_id, to_id, sequence) VALUES (%s, %s, %s) "
                "ON CONFLICT DO NOTHING",
                "upsert": f"INSERT INTO {t} (from_id, to_id, sequence) VALUES (%s, %s, %s) "
                "ON CONFLICT (from_id, to_id) DO UPDATE SET sequence = excluded.sequence",
                "remove": f"DELETE FROM {t} WHERE from_id = %s AND to_id = %s",
                "has": f"SELECT 1 FROM {t} WHERE from_id = %s AND to_id = %s",
            }[what]
        return sql

    # -- objects -----------------------------------------------------------------

    def get_node(self, id_: int, type_name: str | None = None) -> dict[str, Any] | None:
        """memcached, else the row (and fill)."""
        key = f"{self._p}o:{id_}"
        mc = self._mc()
        v = mc.get(key)
        if v is not None:
            return dict(orjson.loads(v))
        shard = shard_of(id_)
        cur = self._cur(shard)
        cur.execute(self._q("get", shard, self._by_name[type_name or "pin"]), (id_,))
        row = cur.fetchone()
        if row is None:
            return None
        mc.set(key, row[0], expire=self._ttl)
        return dict(orjson.loads(row[0]))

    def _get_many(self, ids: list[int]) -> dict[int, dict[str, Any]]:
        """Pins by ID: memcached, the misses in one UNION ALL per host (and fill)."""
        mc = self._mc()
        keys = {f"{self._p}o:{i}": i for i in ids}
        got = mc.get_many(list(keys)) if keys else {}
        out = {keys[k]: dict(orjson.loads(v)) for k, v in got.items()}
        missing = [i for k, i in keys.items() if k not in got]
        if not missing:
            return out
        by_host: dict[str, dict[int, list[int]]] = {}
        for i in missing:
            shard = shard_of(i)
            by_host.setdefault(self._schema.masters[shard], {}).setdefault(shard, []).append(i)
        fill: dict[str, bytes] = {}
        for groups in by_host.values():
            parts, params = [], []
            for shard, mine in groups.items():
                parts.append(self._q("many", shard, self._pins) + "(" + ", ".join(["%s"] * len(mine)) + ")")
                params += mine
            cur = self._cur(next(iter(groups)))
            cur.execute(" UNION ALL ".join(parts), params)
            for id_, text in cur.fetchall():
                out[id_] = dict(orjson.loads(text))
                fill[f"{self._p}o:{id_}"] = text.encode()
        if fill:
            mc.set_many(fill, expire=self._ttl)
        return out

    def add_node(self, type_name: str, data: dict[str, Any], near: int) -> int:
        """One INSERT ... RETURNING id on ``near``'s shard."""
        shard = shard_of(near)
        cur = self._cur(shard)
        cur.execute(self._q("insert", shard, self._by_name[type_name]), (orjson.dumps(data).decode(),))
        return int(cur.fetchone()[0])

    def update_node(self, id_: int, changes: dict[str, Any], type_name: str | None = None) -> None:
        """Read-modify-write under FOR UPDATE, then delete the cache entry."""
        shard = shard_of(id_)
        table = self._by_name[type_name or "pin"]
        cur = self._cur(shard)
        cur.execute("BEGIN")
        try:
            cur.execute(self._q("lock", shard, table), (id_,))
            row = cur.fetchone()
            if row is not None:
                new = {**orjson.loads(row[0]), **changes}
                cur.execute(self._q("set", shard, table), (orjson.dumps(new).decode(), id_))
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        self._mc().delete(f"{self._p}o:{id_}", noreply=False)

    def delete_node(self, id_: int, type_name: str | None = None) -> None:
        """Mark inactive, delete the cache entry."""
        shard = shard_of(id_)
        cur = self._cur(shard)
        cur.execute(self._q("kill", shard, self._by_name[type_name or "pin"]), (id_,))
        self._mc().delete(f"{self._p}o:{id_}", noreply=False)

    # -- lists -------------------------------------------------------------------

    def _ids(self, relation: str, from_id: int, limit: int) -> list[int]:
        # The first page of PAGE entries is cached (the only page the mix reads).
        key = f"{self._p}l:{relation}:{from_id}"
        if limit == PAGE:
            v: Any = self._redis.get(key)
            if v is not None:
                return list(array("q", v))
        shard = shard_of(from_id)
        cur = self._cur(shard)
        cur.execute(self._q("page", shard, relation), (from_id, limit))
        ids = [int(r[0]) for r in cur.fetchall()]
        if limit == PAGE:
            self._redis.set(key, array("q", ids).tobytes(), ex=self._ttl)
        return ids

    def count_links(self, relation: str, from_id: int) -> int:
        """COUNT(*), cached in Redis."""
        key = f"{self._p}c:{relation}:{from_id}"
        v = self._redis.get(key)
        if v is not None:
            return int(v)
        shard = shard_of(from_id)
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
            shard = shard_of(f)
            self._cur(shard).execute(self._q(what, shard, rel), (f, t, *args))
        self._redis.delete(
            *[f"{self._p}l:{rel}:{f}" for rel, f, _t in sides],
            *[f"{self._p}c:{rel}:{f}" for rel, f, _t in sides],
        )

    def add_link(self, relation: str, from_id: int, to_id: int, sequence: int) -> None:
        """Two INSERT ... ON CONFLICT DO NOTHING, one Redis DEL."""
        self._both("add", relation, from_id, to_id, sequence)

    def has_link(self, relation: str, from_id: int, to_id: int) -> bool:
        """One primary-key read."""
        shard = shard_of(from_id)
        cur = self._cur(shard)
        cur.execute(self._q("has", shard, relation), (from_id, to_id))
        return cur.fetchone() is not None

    # -- lifecycle ---------------------------------------------------------------
